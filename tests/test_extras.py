"""A sync-only install (no ``pipeline`` extra) gets one clear line from the pipeline commands."""

from __future__ import annotations

import builtins
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from p2psync.cli import main
from p2psync.cli.extras import missing_pipeline_module


def test_only_the_pipelines_modules_get_the_advice() -> None:
    advice = missing_pipeline_module(ModuleNotFoundError("no", name="pyspark.sql"))
    assert advice is not None and "pip install 'p2psync[pipeline]'" in advice and "'pyspark'" in advice
    assert missing_pipeline_module(ModuleNotFoundError("no", name="yaml")) is None
    assert missing_pipeline_module(ImportError("not a missing module")) is None


def test_export_without_pyarrow_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "node"
    assert main(["--home", str(home), "init"]) == 0
    real_import = builtins.__import__

    def without_pyarrow(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.split(".")[0] == "pyarrow":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real_import(name, *args, **kwargs)

    # Forget what imported pyarrow already, so the command imports it (and fails) afresh.
    for cached in [m for m in sys.modules if m.startswith(("pyarrow", "p2psync.pipeline.export",
                                                           "p2psync.pipeline.formats"))]:
        monkeypatch.delitem(sys.modules, cached)
    monkeypatch.setattr(builtins, "__import__", without_pyarrow)
    code = main(["--home", str(home), "export", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code != 0
    assert "PipelineNotInstalled" in err and "p2psync[pipeline]" in err


def test_every_command_module_loads_without_the_pipeline_extra() -> None:
    """The CLI imports its modules at the top; none of them may need Spark, pyarrow, pandas or
    matplotlib to load (a fresh interpreter, with those modules made unimportable)."""
    blocker = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in {'pyspark', 'pyarrow', 'pandas', 'matplotlib'}:\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import p2psync.cli, p2psync.node, p2psync.demo, p2psync.conformance, p2psync.discovery\n"
        "p2psync.cli.build_parser()\n"
    )
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-c", blocker], cwd=root, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_make_demo_installs_only_what_the_demo_needs(tmp_path: Path) -> None:
    """On a fresh machine `make demo` installs p2psync alone (~85 MB), not the test and Spark
    stack (~1 GB); `make test` adds the extras. Read from make's dry run in a bare copy."""
    root = Path(__file__).resolve().parent.parent
    for name in ("Makefile", "pyproject.toml", "interop/package.json", "interop/package-lock.json"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes((root / name).read_bytes())

    def planned(target: str) -> str:
        done = subprocess.run(["make", "-n", target], cwd=tmp_path, capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        return done.stdout

    demo = planned("demo")
    assert "pip install -q -e ." in demo and "-m p2psync demo" in demo
    assert "[test]" not in demo and "[pipeline]" not in demo and "npm" not in demo
    assert "pip install -q -e '.[test]'" in planned("test")
