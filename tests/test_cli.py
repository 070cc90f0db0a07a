"""The command line as a person uses it: init, protocol install, write, read, query, demo."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from p2psync.cli import main
from p2psync.demo import NOTES_PROTOCOL
from p2psync.dwn.did import Identity


def run(capsys: pytest.CaptureFixture[str], home: Path, *argv: str) -> tuple[int, str, str]:
    code = main(["--home", str(home), *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_author_and_inspect_by_hand(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "node"
    code, out, _ = run(capsys, home, "init")
    assert code == 0 and "did:key:" in out
    assert (home / "identity.json").stat().st_mode & 0o777 == 0o600
    code, did, _ = run(capsys, home, "whoami")
    assert code == 0 and did.strip().startswith("did:key:")

    proto_file = tmp_path / "notes.json"
    proto_file.write_text(json.dumps(NOTES_PROTOCOL))
    assert run(capsys, home, "protocol", "install", str(proto_file))[0] == 0

    code, out, _ = run(capsys, home, "write", "--data", "plain note", "--data-format", "text/plain")
    assert code == 0
    plain = json.loads(out)
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(45_000))
    code, out, _ = run(capsys, home, "write", "--file", str(big), "--protocol", NOTES_PROTOCOL["protocol"],
                       "--protocol-path", "note", "--schema", NOTES_PROTOCOL["types"]["note"]["schema"],
                       "--data-format", "text/plain")
    assert code == 0, out
    note = json.loads(out)
    assert note["dataSize"] == 45_000 and "contextId" in note

    copy = tmp_path / "copy.bin"
    assert run(capsys, home, "read", note["recordId"], "--out", str(copy))[0] == 0
    assert copy.read_bytes() == big.read_bytes()

    code, out, _ = run(capsys, home, "query", "--json", "--protocol", NOTES_PROTOCOL["protocol"])
    assert code == 0
    assert [r["recordId"] for r in json.loads(out)] == [note["recordId"]]
    code, out, _ = run(capsys, home, "query", "--schema", "nothing-here")
    assert code == 0 and "0 record(s)" in out
    assert plain["status"] == 202


def test_errors_are_one_line_without_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "empty"
    code, _, err = run(capsys, home, "read", "bafyreinothing")
    assert code == 1
    assert err.count("\n") == 1 and "run `p2psync init` first" in err and "Traceback" not in err

    assert run(capsys, home, "init")[0] == 0
    code, _, err = run(capsys, home, "init")
    assert code == 1 and "already holds an identity" in err

    # A write the engine refuses names the reference's code.
    code, _, err = run(capsys, home, "write", "--data", "x", "--protocol", "https://nowhere.example/p",
                       "--protocol-path", "a")
    assert code == 1 and "refused (400)" in err and "Traceback" not in err

    code, _, err = run(capsys, home, "protocol", "install", str(tmp_path / "missing.json"))
    assert code == 1 and "cannot read protocol definition" in err


def test_import_key_gives_the_same_tenant(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    assert run(capsys, a, "init", "--did-method", "jwk")[0] == 0
    assert run(capsys, b, "init", "--import-key", str(a / "identity.json"))[0] == 0
    assert run(capsys, a, "whoami")[1] == run(capsys, b, "whoami")[1]


def test_import_key_refuses_an_ecdsa_identity(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An author may sign with secp256k1; a node may not: it proves its hellos with EdDSA."""
    key = tmp_path / "k1.json"
    key.write_text(json.dumps(Identity.generate("key", "secp256k1").to_jwk()))
    code, _, err = run(capsys, tmp_path / "home", "init", "--import-key", str(key))
    assert code == 1 and "secp256k1" in err and "Ed25519" in err
    assert not (tmp_path / "home" / "identity.json").exists()


def _demo_digests(stdout: str) -> dict[str, str]:
    digests = {}
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) == 5 and parts[2] == "messages" and parts[3] == "digest":
            digests[parts[0]] = parts[4]
    return digests


def test_demo_runs_as_the_readme_says() -> None:
    """Three nodes find each other over mDNS (in a private network namespace the demo makes for
    itself), the laptop writes, the others receive; all end with the same digest."""
    proc = subprocess.run([sys.executable, "-m", "p2psync", "demo"], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "private network namespace" in proc.stdout
    digests = _demo_digests(proc.stdout)
    assert set(digests) == {"laptop", "phone", "desktop"} and len(set(digests.values())) == 1
    assert "sha256 matches" in proc.stdout and "all nodes converged" in proc.stdout
    assert "202/202 messages" in proc.stdout  # the receivers' progress, shown as it happened


def test_demo_without_a_namespace_binds_discovery_to_loopback() -> None:
    """The fallback for machines without user namespaces, run inside one we make here (so that,
    as everywhere in these tests, no multicast leaves a private namespace)."""
    script = "ip link set lo up multicast on && exec env P2PSYNC_DEMO_NAMESPACE=0 \"$0\" -m p2psync demo"
    proc = subprocess.run(["unshare", "-rn", "sh", "-c", script, sys.executable], capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "discovery tied to the loopback device" in proc.stdout
    digests = _demo_digests(proc.stdout)
    assert len(digests) == 3 and len(set(digests.values())) == 1
