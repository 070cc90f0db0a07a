"""The replication commands as a person uses them: serve, sync, status, grant sync, store digest,
and init --import-key for the same tenant on a second device (issue #5 point 9).

The serving node is a real ``p2psync serve`` process on 127.0.0.1 (port 0, the URL read from
its output); the syncing node runs ``p2psync.cli.main`` in this process, with real stores.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from p2psync.cli import main
from p2psync.demo import NOTES_PROTOCOL
from p2psync.dwn.did import Identity
from p2psync.dwn.engine import Dwn
from p2psync.dwn.records_write import RecordsWrite
from p2psync.dwn.store import Store
from p2psync.state.digest import cids_digest, store_digest

# Bounded waits on a child process (not timing assertions): generous for a loaded 2-core box.
STARTUP_DEADLINE = 30.0
EXIT_DEADLINE = 20.0
BIG = 45_000  # above the 30,000-byte inline limit: travels by getAttachment


def run(capsys: pytest.CaptureFixture[str], home: Path, *argv: str) -> tuple[int, str, str]:
    code = main(["--home", str(home), *argv])
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys: pytest.CaptureFixture[str], home: Path, *argv: str) -> Any:
    code, out, err = run(capsys, home, *argv)
    assert code == 0, err
    return json.loads(out)


@dataclass
class Served:
    proc: subprocess.Popen[str]
    url: str
    did: str
    store_id: str
    fingerprint: str | None = None  # of its TLS certificate, when it serves wss://


def _line_reader(proc: subprocess.Popen[str]) -> queue.Queue[str]:
    """The child's stdout lines, read by a thread (a pipe has no readline with a timeout)."""
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put("")  # end of output

    threading.Thread(target=pump, daemon=True).start()
    return lines


def _next_line(lines: queue.Queue[str], deadline: float) -> str:
    try:
        line = lines.get(timeout=max(deadline - time.monotonic(), 0.001))
    except queue.Empty:
        raise AssertionError("p2psync serve printed nothing in time") from None
    if not line:
        raise AssertionError("p2psync serve exited before printing its URL")
    return line


@contextmanager
def serving(home: Path, stop: signal.Signals = signal.SIGTERM, *flags: str) -> Iterator[Served]:
    """``p2psync --home HOME serve --port 0 FLAGS`` in a child process; stopped with ``stop``,
    which must end it cleanly (exit 0, 'stopped')."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "p2psync", "--home", str(home), "serve", "--port", "0", *flags],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    lines = _line_reader(proc)
    try:
        deadline = time.monotonic() + STARTUP_DEADLINE
        first = _next_line(lines, deadline)
        match = re.fullmatch(r"serving (wss?://127\.0\.0\.1:(\d+)/_p2psync)\n", first)
        assert match is not None and int(match[2]) > 0, first
        fingerprint = None
        if match[1].startswith("wss://"):
            fingerprint = _next_line(lines, deadline).removeprefix("tls: ").strip()
        did = _next_line(lines, deadline).removeprefix("did: ").strip()
        sid = _next_line(lines, deadline).removeprefix("storeId: ").strip()
        yield Served(proc, match[1], did, sid, fingerprint)
    finally:
        if proc.poll() is None:
            proc.send_signal(stop)
        try:
            proc.wait(timeout=EXIT_DEADLINE)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise AssertionError(f"p2psync serve ignored {stop.name}") from None
    assert proc.stderr is not None
    err = proc.stderr.read()
    rest = []
    while (line := _next_line_or_end(lines)) is not None:
        rest.append(line)
    assert proc.returncode == 0, err
    assert f"stopped ({stop.name})\n" in rest
    assert "Traceback" not in err


def _next_line_or_end(lines: queue.Queue[str]) -> str | None:
    line = lines.get(timeout=EXIT_DEADLINE)
    return line or None


def two_devices(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Path, Path, str]:
    """Homes a and b holding the same identity (b imported a's key file)."""
    a, b = tmp_path / "a", tmp_path / "b"
    assert run(capsys, a, "init")[0] == 0
    assert run(capsys, b, "init", "--import-key", str(a / "identity.json"))[0] == 0
    did = run(capsys, a, "whoami")[1].strip()
    return a, b, did


def write_notes(capsys: pytest.CaptureFixture[str], home: Path, tmp_path: Path, tag: str, n: int) -> list[str]:
    """n plain notes and one protocol note with data above the inline limit; their recordIds."""
    ids = []
    for i in range(n):
        out = run_json(capsys, home, "write", "--data", f"{tag} note {i}", "--data-format", "text/plain")
        ids.append(out["recordId"])
    big = tmp_path / f"{tag}.bin"
    big.write_bytes(os.urandom(BIG))
    proto = tmp_path / "notes.json"
    proto.write_text(json.dumps(NOTES_PROTOCOL))
    assert run(capsys, home, "protocol", "install", str(proto))[0] == 0
    out = run_json(capsys, home, "write", "--file", str(big), "--protocol", NOTES_PROTOCOL["protocol"],
                   "--protocol-path", "note", "--schema", NOTES_PROTOCOL["types"]["note"]["schema"],
                   "--data-format", "text/plain")
    return [*ids, out["recordId"]]


def digest(capsys: pytest.CaptureFixture[str], home: Path, *argv: str) -> dict[str, Any]:
    out: dict[str, Any] = run_json(capsys, home, "store", "digest", *argv)
    return out


def free_port() -> int:
    """A port nobody listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


# --------------------------------------------------------------------------- second device


def test_import_key_is_the_same_tenant_with_its_own_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b, did = two_devices(tmp_path, capsys)
    assert run(capsys, b, "whoami")[1].strip() == did
    sa, sb = run_json(capsys, a, "status", "--json"), run_json(capsys, b, "status", "--json")
    # One tenant, two replicas: each store names itself, so checkpoints never mix them up.
    assert sa["storeId"] != sb["storeId"] and sa["links"] == sb["links"] == []
    assert run_json(capsys, a, "status", "--json")["storeId"] == sa["storeId"]  # stable
    code, out, _ = run(capsys, a, "status")
    assert code == 0 and "no links yet" in out

    # A key file without the private key cannot make a device of the tenant.
    public = tmp_path / "public.json"
    jwk = json.loads((a / "identity.json").read_text())
    public.write_text(json.dumps({k: v for k, v in jwk.items() if k != "d"}))
    code, _, err = run(capsys, tmp_path / "c", "init", "--import-key", str(public))
    assert code == 1 and "is not an identity file (no member 'd')" in err


# --------------------------------------------------------------------------- pull end to end


def test_second_device_pulls_and_replicas_match(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b, did = two_devices(tmp_path, capsys)
    written = write_notes(capsys, a, tmp_path, "a", 12)
    before = digest(capsys, a)
    assert list(before) == [did] and before[did]["messages"] == len(written) + 1  # + ProtocolsConfigure
    assert digest(capsys, b) == {}

    with serving(a) as served:
        assert served.did == did
        code, out, err = run(capsys, b, "sync", served.url, "--pull", "--json", "--progress", "--verbose")
        assert code == 0, err
        # --verbose: state changes, each on a line of its own (the bar is lifted around it)
        # each with the time it happened
        assert any(re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} p2psync: link ", line) and "-> live" in line
                   for line in re.split(r"[\r\n]", err))
        summary = json.loads(out)  # stdout holds the JSON object and nothing else
        assert summary["tenant"] == did
        assert summary["remote"] == f"{did}?storeId={served.store_id}"
        assert summary["pull"]["revs_received"] > 0 and summary["pull"]["attachments_fetched"] == 1
        assert "push" not in summary
        assert " msg" in err  # the forced progress bar went to stderr

        assert digest(capsys, b) == digest(capsys, a) == before
        assert digest(capsys, b, "--tenant", did) == before

        status = run_json(capsys, b, "status", "--json")
        [link] = status["links"]
        assert (link["tenantDid"], link["remoteEndpoint"]) == (did, summary["remote"])
        assert link["scope"] == {"kind": "global"} and link["failureCount"] == 0 and "lastSuccessAt" in link
        assert link["frontier"]["pull"] is not None and link["frontier"]["pull"] >= len(written)
        assert link["frontier"]["pull"] == int(link["pull"]["contiguousAppliedToken"]["position"])
        code, out, _ = run(capsys, b, "status")
        assert code == 0 and f"pull: applied through position {link['frontier']['pull']}" in out
        # The serving side has no link of its own; it shows the checkpoint copy it keeps for b.
        served_status = run_json(capsys, a, "status", "--json")
        assert served_status["links"] == [] and served_status["storeId"] == served.store_id
        [copy] = served_status["copies"]
        assert copy["peer"] == did and copy["frontier"]["pull"] == link["frontier"]["pull"]
        code, out, _ = run(capsys, a, "status")
        assert code == 0 and f"pull position {link['frontier']['pull']}" in out

        # Again, human summary: resumed from the checkpoint, nothing moves.
        code, out, err = run(capsys, b, "sync", served.url)
        assert code == 0, err
        assert "pulled 0 message(s)" in out and f"position {link['frontier']['pull']}" in out
        assert err == ""  # no bar when stderr is not a terminal

        # A new write on a arrives with the next sync, and only it.
        run_json(capsys, a, "write", "--data", "late", "--data-format", "text/plain")
        code, out, err = run(capsys, b, "sync", served.url, "--json")
        assert code == 0, err
        assert json.loads(out)["pull"]["revs_applied"] == 1
        assert digest(capsys, b) == digest(capsys, a) != before


def test_sync_over_tls_with_the_pinned_certificate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b, did = two_devices(tmp_path, capsys)
    write_notes(capsys, a, tmp_path, "a", 3)
    code, out, _ = run(capsys, a, "tls", "show", "--json")
    assert code == 0
    shown = json.loads(out)
    with serving(a, signal.SIGTERM, "--tls") as served:
        assert served.url.startswith("wss://") and served.fingerprint == shown["fingerprint"]
        code, out, err = run(capsys, b, "sync", served.url, "--pin", shown["fingerprint"], "--json")
        assert code == 0, err
        assert digest(capsys, b) == digest(capsys, a)
        assert run(capsys, tmp_path / "c", "init")[0] == 0
        wrong = run_json(capsys, tmp_path / "c", "tls", "show", "--json")
        code, _, err = run(capsys, b, "sync", served.url, "--pin", wrong["fingerprint"])
        assert code == 1 and err.count("\n") == 1 and f"is {shown['fingerprint']}, not the pinned" in err
        code, _, err = run(capsys, b, "sync", served.url.replace("wss://", "ws://"))
        assert code == 1 and err.count("\n") == 1 and "does the peer serve wss://" in err
        status = run_json(capsys, a, "status", "--json")
        assert status["node"]["fingerprint"] == shown["fingerprint"]
    # A rotated certificate is a new fingerprint; the old pin no longer matches.
    code, out, _ = run(capsys, a, "tls", "rotate")
    assert code == 0 and f"(was {shown['fingerprint']})" in out
    assert run_json(capsys, a, "tls", "show", "--json")["fingerprint"] != shown["fingerprint"]


def test_plain_ws_beyond_loopback_needs_insecure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "a"
    assert run(capsys, home, "init")[0] == 0
    for argv, says in (
        (["sync", "ws://192.0.2.7:4984/_p2psync"], "is plain ws:// to another host"),
        (["diff", "ws://192.0.2.7:4984/_p2psync"], "is plain ws:// to another host"),
        (["sync", "wss://192.0.2.7:4984/_p2psync", "--pin", "short"], "is not a certificate fingerprint"),
        (["sync", "ws://127.0.0.1:4984/_p2psync", "--pin", "A" * 43], "--pin needs a wss:// URL"),
        (["serve", "--host", "0.0.0.0", "--no-tls", "--port", "0"], "listen.tls: plain ws:// on 0.0.0.0"),
    ):
        code, _, err = run(capsys, home, *argv)
        assert code == 1 and err.count("\n") == 1 and says in err and "Traceback" not in err, (argv, err)


# --------------------------------------------------------------------------- refusals


def test_sync_refusals_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, other = tmp_path / "a", tmp_path / "other"
    assert run(capsys, a, "init")[0] == 0
    assert run(capsys, other, "init")[0] == 0
    tenant = run(capsys, a, "whoami")[1].strip()
    write_notes(capsys, a, tmp_path, "a", 2)

    with serving(a, stop=signal.SIGINT) as served:
        # Another DID may not read a's tenant: the peer's 403, with its code and name.
        code, out, err = run(capsys, other, "sync", served.url, "--tenant", tenant)
        assert code == 1 and out == ""
        assert err.startswith("p2psync: ") and err.count("\n") == 1 and "Traceback" not in err
        assert "403 SyncNotAuthorized" in err
        assert digest(capsys, other) == {}

    code, _, err = run(capsys, other, "sync", f"ws://127.0.0.1:{free_port()}/_p2psync")
    assert code == 1 and "cannot connect" in err and "Connection refused" in err and err.count("\n") == 1

    code, _, err = run(capsys, other, "sync", "http://127.0.0.1:1/")
    assert code == 1 and "is not a wss:// or ws:// URL" in err

    code, _, err = run(capsys, other, "sync", "ws://127.0.0.1:1/", "--tenant", "alice")
    assert code == 1 and "is not a DID" in err

    code, _, err = run(capsys, tmp_path / "nobody", "sync", "ws://127.0.0.1:1/")
    assert code == 1 and "run `p2psync init` first" in err
    code, _, err = run(capsys, tmp_path / "nobody", "status")
    assert code == 1 and "no store at" in err


def test_serve_refuses_a_port_in_use(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "a"
    assert run(capsys, home, "init")[0] == 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        code, _, err = run(capsys, home, "serve", "--port", str(s.getsockname()[1]))
    assert code == 1 and "cannot listen on 127.0.0.1:" in err and err.count("\n") == 1


# --------------------------------------------------------------------------- digest


def _plain_writes(signer: Identity, n: int) -> list[tuple[dict[str, Any], bytes]]:
    out = []
    for i in range(n):
        data = f"record {i}".encode()
        out.append((RecordsWrite.create(signer=signer, data=data, data_format="text/plain").message, data))
    return out


def _store_with(path: Path, tenant: str, writes: list[tuple[dict[str, Any], bytes]]) -> None:
    store = Store(path)
    dwn = Dwn(store)
    for message, data in writes:
        assert dwn.process_message(tenant, message, data).code == 202
    store.close()


def test_digest_ignores_write_order(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    alice, bob = Identity.generate(), Identity.generate()
    writes = _plain_writes(alice, 20)
    shuffled = writes[:]
    random.Random(5).shuffle(shuffled)
    assert shuffled != writes
    _store_with(tmp_path / "x.db", alice.did, writes)
    _store_with(tmp_path / "y.db", alice.did, shuffled[::-1])
    _store_with(tmp_path / "z.db", alice.did, writes[1:])  # one message short
    _store_with(tmp_path / "z.db", bob.did, _plain_writes(bob, 3))

    home = tmp_path / "unused-home"  # digest reads only the store given
    x = digest(capsys, home, "--store", str(tmp_path / "x.db"))
    y = digest(capsys, home, "--store", str(tmp_path / "y.db"))
    z = digest(capsys, home, "--store", str(tmp_path / "z.db"))
    assert x == y and list(x) == [alice.did] and x[alice.did]["messages"] == 20
    assert z[alice.did]["messages"] == 19 and z[alice.did]["digest"] != x[alice.did]["digest"]
    assert z[bob.did]["messages"] == 3 and list(z) == sorted(z)  # tenants in DID order
    assert digest(capsys, home, "--store", str(tmp_path / "z.db"), "--tenant", bob.did) == {bob.did: z[bob.did]}
    assert digest(capsys, home, "--store", str(tmp_path / "x.db"), "--tenant", bob.did) == {}

    code, _, err = run(capsys, home, "store", "digest", "--store", str(tmp_path / "missing.db"))
    assert code == 1 and "no store at" in err and not (tmp_path / "missing.db").exists()


def test_digest_is_the_documented_lthash(tmp_path: Path) -> None:
    """docs/cli.md: the digest is LtHash16 of the tenant's CIDs, which anyone can compute from
    the spec with hashlib alone (written out here, not taken from p2psync)."""
    alice = Identity.generate()
    _store_with(tmp_path / "x.db", alice.did, _plain_writes(alice, 7))
    store = Store(tmp_path / "x.db")
    cids = store.messages.cids(alice.did)
    ours = store_digest(store)[alice.did]["digest"]
    store.close()
    lanes = [0] * 1024
    for cid in reversed(cids):
        element = hashlib.shake_256(b"p2psync-lthash-v1\x00" + cid.encode("ascii")).digest(2048)
        lanes = [(a + int.from_bytes(element[2 * i:2 * i + 2], "little")) % 65536 for i, a in enumerate(lanes)]
    by_hand = hashlib.sha256(b"".join(lane.to_bytes(2, "little") for lane in lanes)).hexdigest()
    assert by_hand == ours == cids_digest(reversed(cids))
    assert ours != cids_digest(cids[:-1])


# --------------------------------------------------------------------------- push and both


def test_push_then_both(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b, did = two_devices(tmp_path, capsys)
    write_notes(capsys, a, tmp_path, "a", 3)
    for i in range(5):
        run_json(capsys, b, "write", "--data", f"b only {i}", "--data-format", "text/plain")
    only_a, only_b = digest(capsys, a)[did]["messages"], digest(capsys, b)[did]["messages"]

    with serving(a) as served:
        code, out, err = run(capsys, b, "sync", served.url, "--push", "--json")
        assert code == 0, err
        summary = json.loads(out)
        assert summary["push"]["revs_sent"] == only_b and "pull" not in summary
        assert digest(capsys, a)[did]["messages"] == only_a + only_b  # a now holds b's too
        assert digest(capsys, b)[did]["messages"] == only_b

        code, out, err = run(capsys, b, "sync", served.url, "--both")
        assert code == 0, err
        assert "pulled" in out and "pushed" in out
        assert digest(capsys, a) == digest(capsys, b)

        run_json(capsys, a, "write", "--data", "new on a", "--data-format", "text/plain")
        run_json(capsys, b, "write", "--data", "new on b", "--data-format", "text/plain")
        code, out, err = run(capsys, b, "sync", served.url, "--both", "--json")
        assert code == 0, err
        summary = json.loads(out)
        assert summary["pull"]["revs_applied"] == 1 and summary["push"]["revs_sent"] == 1
        assert digest(capsys, a) == digest(capsys, b)
        assert digest(capsys, a)[did]["messages"] == only_a + only_b + 2


# --------------------------------------------------------------------------- grant sync


def test_grant_sync_lets_another_node_pull(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, other = tmp_path / "a", tmp_path / "other"
    assert run(capsys, a, "init")[0] == 0
    assert run(capsys, other, "init")[0] == 0
    tenant = run(capsys, a, "whoami")[1].strip()
    grantee = run(capsys, other, "whoami")[1].strip()
    write_notes(capsys, a, tmp_path, "a", 3)

    code, _, err = run(capsys, a, "grant", "sync", "bob")
    assert code == 1 and "is not a DID" in err
    code, _, err = run(capsys, a, "grant", "sync", grantee, "--expires", "tomorrow")
    assert code == 1 and "is not a DWN timestamp" in err
    code, _, err = run(capsys, a, "grant", "sync", grantee, "--expires", "2000-01-01T00:00:00.000000Z")
    assert code == 1 and "SyncGrantExpiryInvalid" in err
    assert digest(capsys, a)[tenant]["messages"] == 5  # nothing stored by the refusals

    granted = run_json(capsys, a, "grant", "sync", grantee, "--expires", "2100-01-01T00:00:00.000000Z")
    assert (granted["grantor"], granted["grantee"]) == (tenant, grantee)
    assert [r["status"] for r in granted["records"]] == [202, 202]
    assert digest(capsys, a)[tenant]["messages"] == 5 + 2

    with serving(a) as served:
        code, out, err = run(capsys, other, "sync", served.url, "--tenant", tenant, "--json")
        assert code == 0, err
        assert json.loads(out)["tenant"] == tenant
        # A grant for all of the tenant's messages gives the grantee a whole replica.
        assert digest(capsys, other, "--tenant", tenant) == digest(capsys, a)


# --------------------------------------------------------------------------- continuous


def _wait_for(check: Any, what: str, deadline: float = STARTUP_DEADLINE) -> None:
    """Poll ``check()`` until true (a bounded wait for another process, not a timing test)."""
    end = time.monotonic() + deadline
    while not check():
        if time.monotonic() > end:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.05)


def test_continuous_sync_follows_new_writes_until_stopped(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    a, b, did = two_devices(tmp_path, capsys)
    write_notes(capsys, a, tmp_path, "a", 3)

    def same() -> bool:
        return digest(capsys, a) == digest(capsys, b)

    with serving(a) as served:
        proc = subprocess.Popen(
            [sys.executable, "-m", "p2psync", "--home", str(b), "sync", served.url, "--continuous", "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        failure: AssertionError | None = None
        try:
            _wait_for(same, "the first catch-up")
            run_json(capsys, a, "write", "--data", "written while connected", "--data-format", "text/plain")
            assert not same()
            _wait_for(same, "the live write to arrive")
        except AssertionError as exc:
            failure = exc
        finally:
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=EXIT_DEADLINE)
        if failure is not None:  # say what the sync process said, not only that we gave up
            raise AssertionError(f"{failure}; the sync process wrote: {err[-4000:]}") from failure
        assert proc.returncode == 0, err
        stopped = json.loads(out)
        assert stopped["stopped"] is True and stopped["pull"]["messages"] >= 1
    [link] = run_json(capsys, b, "status", "--json")["links"]
    assert link["tenantDid"] == did and link["frontier"]["pull"] is not None


def test_retries_are_logged_with_the_time_and_the_url(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "a"
    assert run(capsys, home, "init")[0] == 0
    url = f"ws://127.0.0.1:{free_port()}/_p2psync"
    code, _, err = run(capsys, home, "sync", url, "-v")
    assert code == 1 and err.splitlines()[-1].startswith(f"p2psync: cannot connect to {url}")
    retries = [line for line in err.splitlines() if " p2psync: sync with " in line]
    assert retries and all(re.match(rf"\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{{3}} p2psync: sync with {re.escape(url)}: ",
                                     line) for line in retries), err
