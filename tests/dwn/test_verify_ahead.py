"""Signatures verified ahead on another thread (issue #17): only ever for exactly the bytes.

The engine stays the authority: an acceptance found ahead is taken only by a verify of the very
same key, signature and signing input; anything else (a refusal, nothing found, another key,
another signature) is verified inline as before.
"""

from __future__ import annotations

import pickle
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from p2psync.dwn import authentication, ed25519, jws
from p2psync.dwn.ahead import SignatureProcess, SignatureWorker, read_frame, signature_entries
from p2psync.dwn.encoding import b64url_decode, b64url_encode
from p2psync.dwn.engine import Dwn
from p2psync.dwn.errors import DwnError
from p2psync.dwn.records_write import RecordsWrite
from p2psync.dwn.store import Store
from tests.replication.support import Clock, seeded

ALICE = seeded("ahead-alice")
BOB = seeded("ahead-bob")
SIGNING_INPUT = b"eyJraWQiOiJ4In0.eyJuIjoxfQ"


@pytest.fixture(autouse=True)
def empty_memo() -> Iterator[None]:
    ed25519.AHEAD.clear()
    jws._verify_entry.cache_clear()  # the engine's own cache of verdicts (a hit asks nothing)
    yield
    ed25519.AHEAD.clear()


def _raw(identity: Any, message: bytes = SIGNING_INPUT) -> tuple[bytes, bytes]:
    """(public key, signature of ``message``) of ``identity``."""
    key = identity.private_key.public_key().public_bytes_raw()
    return key, identity.private_key.sign(message)


def _write(i: int, clock: Clock, signer: Any = ALICE) -> tuple[dict[str, Any], bytes]:
    now = clock.tick()
    data = f"note {i}".encode()
    write = RecordsWrite.create(signer=signer, data=data, schema="https://p2psync.example/note",
                                data_format="text/plain", message_timestamp=now, date_created=now)
    return write.message, data


def test_an_acceptance_is_taken_once_and_only_for_its_own_bytes() -> None:
    key, signature = _raw(ALICE)
    assert ed25519.AHEAD.verify(key, signature, SIGNING_INPUT) is ed25519.Outcome.ACCEPT
    other = bytearray(SIGNING_INPUT)
    other[-1] ^= 1
    assert not ed25519.AHEAD.take(key, signature, bytes(other))
    assert ed25519.AHEAD.take(key, signature, SIGNING_INPUT)
    assert not ed25519.AHEAD.take(key, signature, SIGNING_INPUT)  # used up: the next is inline


def test_the_same_signing_input_under_another_key_is_refused_after_one_was_verified_ahead() -> None:
    alice_key, alice_signature = _raw(ALICE)
    bob_key, _ = _raw(BOB)
    assert ed25519.AHEAD.verify(alice_key, alice_signature, SIGNING_INPUT) is ed25519.Outcome.ACCEPT
    # Alice's signature presented under Bob's key: the acceptance is not Bob's to take.
    assert ed25519.engine_outcome(bob_key, alice_signature, SIGNING_INPUT)[0] is not ed25519.Outcome.ACCEPT
    assert ed25519.AHEAD.taken == 0
    assert ed25519.engine_outcome(alice_key, alice_signature, SIGNING_INPUT)[0] is ed25519.Outcome.ACCEPT
    assert ed25519.AHEAD.taken == 1


def test_a_refusal_is_not_kept_and_the_engine_gives_its_own_answer() -> None:
    key, signature = _raw(ALICE)
    forged = signature[:-1] + bytes([signature[-1] ^ 1])
    assert ed25519.AHEAD.verify(key, forged, SIGNING_INPUT) is not ed25519.Outcome.ACCEPT
    assert ed25519.AHEAD.kept == 0
    assert ed25519.engine_outcome(key, forged, SIGNING_INPUT) == ed25519.outcome(key, forged, SIGNING_INPUT)
    # The genuine signature verified ahead does not make a forged one over the same input pass.
    assert ed25519.AHEAD.verify(key, signature, SIGNING_INPUT) is ed25519.Outcome.ACCEPT
    assert ed25519.engine_outcome(key, forged, SIGNING_INPUT)[0] is not ed25519.Outcome.ACCEPT


def test_the_memo_is_bounded_oldest_first() -> None:
    memo = ed25519.Ahead(3)
    key, _ = _raw(ALICE)
    inputs = [f"input {i}".encode() for i in range(5)]
    for message in inputs:
        memo.verify(key, ALICE.private_key.sign(message), message)
    assert memo.kept == 5 and memo.dropped == 2
    assert not memo.take(key, ALICE.private_key.sign(inputs[0]), inputs[0])
    assert memo.take(key, ALICE.private_key.sign(inputs[4]), inputs[4])


def test_what_the_engine_verified_first_is_not_verified_again() -> None:
    memo = ed25519.Ahead(8)
    key, signature = _raw(ALICE)
    assert not memo.take(key, signature, SIGNING_INPUT)  # nothing expected: not noted
    assert memo.verify(key, signature, SIGNING_INPUT) is ed25519.Outcome.ACCEPT
    memo.clear()
    memo.expect(1)  # a worker has it queued, but the engine gets there first
    assert not memo.take(key, signature, SIGNING_INPUT)
    assert memo.verify(key, signature, SIGNING_INPUT) is None
    assert memo.late == 1 and memo.kept == 0


def test_a_message_verified_ahead_is_applied_without_a_second_verify(tmp_path: Any) -> None:
    clock = Clock()
    message, data = _write(0, clock)
    assert authentication.verify_ahead(message) == 1
    dwn = Dwn(Store(tmp_path / "s.db"))
    result = dwn.apply_replicated_message(ALICE.did, message, data)
    assert result.kind == "Applied"
    assert ed25519.AHEAD.taken == 1


def _with_signature(message: dict[str, Any], signature: dict[str, Any]) -> dict[str, Any]:
    return {**message, "authorization": {**message["authorization"], "signature": signature}}


def test_forged_messages_are_refused_even_when_their_genuine_twin_was_verified_ahead(tmp_path: Any) -> None:
    clock = Clock()
    genuine, data = _write(0, clock)
    jws_ = genuine["authorization"]["signature"]
    entry = jws_["signatures"][0]
    signature = b64url_decode(entry["signature"])
    # The same signing input with another signature, and the same signature under Bob's header.
    flipped_bytes = signature[:-1] + bytes([signature[-1] ^ 1])
    flipped = {**jws_, "signatures": [{**entry, "signature": b64url_encode(flipped_bytes)}]}
    bob_header = jws.sign_payload({"x": 1}, BOB)["signatures"][0]["protected"]
    as_bob = {**jws_, "signatures": [{**entry, "protected": bob_header}]}
    assert authentication.verify_ahead(genuine) == 1
    for forged in (flipped, as_bob):
        assert authentication.verify_ahead(_with_signature(genuine, forged)) == 0
        with pytest.raises(DwnError) as info:
            jws.verify(forged)
        assert info.value.status == 401
    dwn = Dwn(Store(tmp_path / "s.db"))
    for forged in (flipped, as_bob):
        assert dwn.apply_replicated_message(ALICE.did, _with_signature(genuine, forged), data).kind == "Invalid"
    assert dwn.apply_replicated_message(ALICE.did, genuine, data).kind == "Applied"
    assert ed25519.AHEAD.taken == 1


def test_the_worker_verifies_batches_and_its_thread_ends_when_idle() -> None:
    clock = Clock()
    messages = [_write(i, clock)[0] for i in range(6)]
    worker = SignatureWorker(idle=0.01)
    assert worker.submit(messages[:3]) and worker.submit(messages[3:])
    assert worker.wait_idle(30)
    assert worker.verified == 6 and ed25519.AHEAD.kept == 6
    for message in messages:
        jws.verify(message["authorization"]["signature"])
    assert ed25519.AHEAD.taken == 6
    _wait_for_no_worker_thread()
    assert worker.submit([_write(6, clock)[0]]) and worker.wait_idle(30)
    assert worker.started == 2 and ed25519.AHEAD.kept == 7


def test_the_worker_takes_no_more_than_it_may_hold() -> None:
    clock = Clock()
    worker = SignatureWorker(max_pending=0)
    assert not worker.submit([_write(0, clock)[0]])
    assert worker.skipped == 1 and worker.started == 0


def test_the_worker_ignores_what_it_cannot_read() -> None:
    worker = SignatureWorker()
    assert worker.submit([{}, {"authorization": "x"}, {"authorization": {"signature": {"payload": 1}}},
                          {"authorization": {"signature": {"payload": "e30", "signatures": [{"protected": "!"}]}}}])
    assert worker.wait_idle(30)
    assert worker.verified == 4 and ed25519.AHEAD.kept == 0


def _wait_for_no_worker_thread() -> None:
    for thread in threading.enumerate():
        if thread.name == "p2psync-verify-ahead":
            thread.join(30)


def test_a_worker_process_keeps_exactly_what_the_engine_would_accept(tmp_path: Any) -> None:
    """The process runs the engine's own verify on the engine's own bytes: a genuine message is
    taken, its forged twins (a flipped signature bit, the signature under another key's header)
    are refused by the engine however their genuine twin was found ahead."""
    clock = Clock()
    genuine = [_write(i, clock) for i in range(5)]
    twin, twin_data = _write(5, clock)
    jws_ = twin["authorization"]["signature"]
    entry = jws_["signatures"][0]
    signature = b64url_decode(entry["signature"])
    flipped_text = b64url_encode(signature[:-1] + bytes([signature[-1] ^ 1]))
    bob_header = jws.sign_payload({"x": 1}, BOB)["signatures"][0]["protected"]
    flipped = {**jws_, "signatures": [{**entry, "signature": flipped_text}]}
    as_bob = {**jws_, "signatures": [{**entry, "protected": bob_header}]}
    forged = [_with_signature(twin, flipped), _with_signature(twin, as_bob)]
    worker = SignatureProcess(idle=5)
    try:
        assert worker.submit([m for m, _ in genuine] + [twin] + forged)
        assert worker.wait_idle(60)
        assert worker.verified == 8 and ed25519.AHEAD.kept == 6  # the forged ones are not kept
        dwn = Dwn(Store(tmp_path / "s.db"))
        for message, data in genuine:
            assert dwn.apply_replicated_message(ALICE.did, message, data).kind == "Applied"
        assert ed25519.AHEAD.taken == 5
        for message in forged:
            assert dwn.apply_replicated_message(ALICE.did, message, twin_data).kind == "Invalid"
        assert dwn.apply_replicated_message(ALICE.did, twin, twin_data).kind == "Applied"
        assert ed25519.AHEAD.taken == 6
        dwn.close()
    finally:
        worker.close()
    assert worker.worker_cpu > 0


def test_a_worker_process_ends_when_idle_and_starts_again() -> None:
    clock = Clock()
    worker = SignatureProcess(idle=0.2)
    try:
        assert worker.submit([_write(0, clock)[0], {}, {"authorization": "x"}]) and worker.wait_idle(60)
        assert worker.verified == 3 and ed25519.AHEAD.kept == 1
        for _ in range(300):  # the worker exits after 0.2 s without a batch
            if worker._process is None:
                break
            time.sleep(0.05)
        assert worker._process is None and ed25519.AHEAD.pending == 0
        assert worker.submit([_write(1, clock)[0]]) and worker.wait_idle(60)
        assert worker.started == 2 and ed25519.AHEAD.kept == 2
    finally:
        worker.close()


def test_a_worker_process_that_dies_gives_back_what_it_had(tmp_path: Any) -> None:
    """A batch lost with its worker is verified inline; nothing waits for it."""
    clock = Clock()
    worker = SignatureProcess(idle=30)
    messages = [_write(i, clock) for i in range(3)]
    assert worker.submit([messages[0][0]]) and worker.wait_idle(60)
    process = worker._process
    assert process is not None
    process.kill()
    process.wait()
    worker.submit([m for m, _ in messages[1:]])  # sent to a dead worker, or refused: either way inline
    for _ in range(300):
        if ed25519.AHEAD.pending == 0 and worker._process is None:
            break
        time.sleep(0.05)
    assert ed25519.AHEAD.pending == 0
    dwn = Dwn(Store(tmp_path / "s.db"))
    assert [dwn.apply_replicated_message(ALICE.did, m, d).kind for m, d in messages] == ["Applied"] * 3
    dwn.close()
    worker.close()


def test_a_worker_process_answers_batches_sent_back_to_back() -> None:
    """Frames that reach the worker in one read are all answered at once, not one per later
    arrival (its reads are unbuffered, so none waits unseen behind another)."""
    clock = Clock()
    batches = [[signature_entries(_write(2 * b + i, clock)[0]) for i in range(2)] for b in range(3)]
    frames = b""
    for batch in batches:
        body = pickle.dumps(batch)
        frames += struct.pack(">I", len(body)) + body
    worker = subprocess.Popen([sys.executable, "-m", "p2psync.dwn.ahead", "120", "8"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
    watchdog = threading.Timer(30, worker.kill)  # a stuck worker ends the reads below
    watchdog.start()
    try:
        assert worker.stdin is not None and worker.stdout is not None
        worker.stdin.write(frames)  # three frames in one write
        answered = 0
        while answered < 6:
            answer = read_frame(worker.stdout)
            assert answer is not None, f"only {answered} of 6 answered"
            count, found, _ = answer
            assert len(found) == count
            answered += count
    finally:
        watchdog.cancel()
        worker.kill()
        worker.wait()
