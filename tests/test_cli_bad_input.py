"""Every ``p2psync`` command, fed bad arguments or files, exits non-zero with one line on
stderr and no traceback (issue #16). The list of commands is read from the parser itself, so
a new command without a row here fails the test."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from p2psync.cli import build_parser, main


def commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    groups = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not groups:
        yield path
        return
    for name, sub in groups[0].choices.items():
        yield from commands(sub, (*path, name))


ALL = sorted(commands(build_parser()))


def bad_inputs(tmp: Path) -> dict[tuple[str, ...], list[list[str]]]:
    """Per command, argument lists that must fail in one line (the data directory is empty)."""
    (tmp / "list.json").write_text("[1, 2]")
    (tmp / "no-types.json").write_text(json.dumps({"protocol": "https://x.org/p", "published": True,
                                                   "structure": {}}))
    (tmp / "jwk.json").write_text(json.dumps({"kty": "OKP", "crv": "Ed25519", "x": "abc"}))
    (tmp / "not-json").write_text("{nope")
    missing = str(tmp / "missing" / "x")
    return {
        ("demo",): [["--peers", "3"]],
        ("init",): [["--import-key", missing], ["--import-key", str(tmp / "jwk.json")],
                    ["--import-key", str(tmp / "list.json")], ["--import-key", str(tmp / "not-json")],
                    ["--did-method", "web"]],
        ("whoami",): [[]],
        ("protocol", "install"): [[missing], [str(tmp / "not-json")], [str(tmp / "list.json")],
                                  [str(tmp / "no-types.json")]],
        ("write",): [["--data", "x"], ["--protocol", "https://x.org/p", "--data", "x"], ["--tag", "=x", "--data", "x"],
                     ["--data", "x", "--file", missing]],
        ("read",): [["junk"]],
        ("update",): [["junk", "--data", "x"], ["junk", "--tag", "no-value", "--data", "x"],
                      ["junk", "--tag", "n:=nope", "--data", "x"], ["junk", "--published", "--unpublished"]],
        ("delete",): [["junk"], ["junk", "--prune"]],
        ("show",): [["junk"], ["junk", "--json"]],
        ("query",): [[], ["--protocol-path", "note"]],
        ("serve",): [[], ["--port", "99999"], ["--host", "no such host!"], ["--config", missing]],
        ("peers",): [["--wait", "soon"]],
        ("sync",): [["ftp://x/"], ["ws://192.0.2.1:1/"], ["wss://127.0.0.1:1/", "--pin", "short"], ["--pull"],
                    ["ws://127.0.0.1:1/", "--path-prefix", "note"],
                    ["ws://127.0.0.1:1/", "--protocol", "https://x.org/p", "--context-prefix", "note"]],
        ("diff",): [["ftp://x/"], ["ws://192.0.2.1:1/"]],
        ("repair",): [["--plan", missing, "--peer", "ws://127.0.0.1:1/"], ["--plan", missing, "--peer", "ftp://x"]],
        ("status",): [[]],
        ("grant", "sync"): [["not-a-did"]],
        ("store", "digest"): [[]],
        ("store", "verify"): [[]],
        ("tls", "show"): [[]],
        ("tls", "rotate"): [[]],
        ("dwn", "pipe"): [[], ["--store"]],
        ("blip", "echo"): [["--port", "many"]],
        ("sim",): [["--peers", "0"], ["--seeds", "none"]],
        ("export",): [[]],
        ("pipeline", "reconcile"): [[missing]],
        ("pipeline", "fanout"): [[missing, missing]],
        ("pipeline", "audit"): [[missing]],
    }


def test_every_command_has_bad_inputs(tmp_path: Path) -> None:
    assert sorted(bad_inputs(tmp_path)) == ALL


@pytest.mark.parametrize("command", ALL, ids=" ".join)
def test_bad_input_is_one_line_without_a_traceback(
    command: tuple[str, ...], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    for argv in [["--no-such-flag"], *bad_inputs(tmp_path)[command]]:
        try:
            code = main(["--home", str(home), *command, *argv])
        except SystemExit as exc:  # argparse's own refusals
            code = exc.code if isinstance(exc.code, int) else 1
        out, err = capsys.readouterr()
        shown = f"{' '.join(command)} {argv}: {err!r}"
        assert code != 0, shown
        assert "Traceback" not in err and err.count("\n") == 1 and err.startswith("p2psync"), shown


def test_a_pinned_fingerprint_may_begin_with_a_dash(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A base64url fingerprint starts with "-" once in 64 certificates; `--pin -…` must still
    read as the option's value (argparse alone refuses it: "expected one argument"); the sync
    then fails later, for want of an identity, not on its arguments."""
    fingerprint = "-" + "A" * 42
    with pytest.raises(SystemExit):
        build_parser().parse_args(["sync", "wss://127.0.0.1:9/_p2psync", "--pin", fingerprint])
    capsys.readouterr()
    code = main(["--home", str(tmp_path / "d"), "sync", "wss://127.0.0.1:9/_p2psync", "--pin", fingerprint])
    err = capsys.readouterr().err
    assert code != 2 and "expected one argument" not in err, err
