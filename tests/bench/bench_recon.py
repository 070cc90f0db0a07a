"""Set reconciliation through the real ``reconcile`` code, two in-process sets.

    .venv/bin/python tests/bench/bench_recon.py --n 1000000 --d 100 [--seed 1] [--runs 1]

Two sets of ``--n`` message CIDs (dag-cbor CIDv1 strings, as stored) that differ in ``--d``
(half only on each side) are reconciled by :class:`p2psync.replication.recon.Reconciliation`
against :func:`p2psync.replication.recon.answer`, the bodies CBOR-encoded and decoded as on the
wire. One line per run on stdout:

    recon: n=N d=D round_trips=R bytes=B seconds=S exact=yes|no

``bytes`` is every byte both sides sent for the reconciliation as BLIP messages: frame header,
properties (``Profile: reconcile`` on requests), CBOR body and the 4-byte CRC of each single-frame
message (WebSocket framing, 2–4 bytes a message, is not counted; nor are the messages fetched
afterwards). ``seconds`` is the exchange only; building the two sketches (what a replica keeps
up to date as messages come and go) is printed on stderr with the estimate, and the exchange's
time in Ed25519 verifications (the yardstick, measured in the same run): machines of this kind
differ 2–3× in speed, bytes and round trips not at all.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from p2psync.dwn.encoding import cid_from_digest  # noqa: E402
from p2psync.peer.anti_entropy import message_bytes  # noqa: E402
from p2psync.replication.lthash import LtHash  # noqa: E402
from p2psync.replication.recon import PROFILE, MemorySet, Reconciliation, answer  # noqa: E402
from p2psync.replication.riblt import Coder, Sketch  # noqa: E402
from p2psync.replication.wire import decode_body, encode_body  # noqa: E402
from tests.bench.bench_engine import verify_rate  # noqa: E402

DAG_CBOR = 0x71
#: What a replica keeps: the first 2^15 symbols (decodes ~16,000 differences without a scan).
SKETCH_SIZE = 1 << 15
#: The yardstick, measured at start (Ed25519 verifications per second on one core).
VERIFIES = 1.0


def make_cids(n: int, rng: random.Random) -> list[str]:
    return [cid_from_digest(DAG_CBOR, rng.randbytes(32)) for _ in range(n)]


def run(n: int, d: int, seed: int) -> str:
    rng = random.Random(seed)
    started = time.perf_counter()
    cids = make_cids(n + d - d // 2, rng)
    common, a_only, b_only = cids[: n - d // 2], cids[n - d // 2 : n], cids[n:]
    coder = Coder()
    base = Sketch(coder, SKETCH_SIZE)
    base.add_cids(common)
    base_hash = LtHash()
    base_hash.update(common, ())
    sides = []
    for extra in (a_only, b_only):
        sketch = base.copy()
        sketch.add_cids(extra)
        h = base_hash.copy()
        h.update(extra, ())
        sides.append(MemorySet(coder, common + extra, SKETCH_SIZE, h.digest(), sketch=sketch))
    initiator, responder = sides
    print(f"# built two sketches of {n:,} in {time.perf_counter() - started:.1f} s", file=sys.stderr)

    started = time.perf_counter()
    recon = Reconciliation(initiator)
    request: dict[str, object] | None = recon.opening()
    total = 0
    while request is not None:
        raw = encode_body(request)
        total += message_bytes({"Profile": PROFILE}, raw)
        reply = encode_body(answer(decode_body(raw), lambda _coder: responder))
        total += message_bytes({}, reply)
        request = recon.receive(decode_body(reply))
    seconds = time.perf_counter() - started
    result = recon.result
    assert result is not None
    exact = (sorted(result.remote_only) == sorted(coder.key(c).id for c in b_only)
             and sorted(result.local_only) == sorted(coder.key(c).id for c in a_only))
    print(f"# estimate {result.estimate} symbols {result.symbols}; the exchange took "
          f"{seconds * VERIFIES:,.0f} Ed25519-verify-times of CPU (V = {VERIFIES:,.0f}/s)", file=sys.stderr)
    return (f"recon: n={n} d={d} round_trips={result.round_trips} bytes={total} "
            f"seconds={seconds:.4f} exact={'yes' if exact else 'no'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--d", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--runs", type=int, default=1, help="runs with seeds seed, seed+1, …")
    args = parser.parse_args()
    if args.d > 2 * args.n:
        parser.error("--d is at most 2 × --n")
    global VERIFIES
    VERIFIES = verify_rate()
    print(f"# yardstick: Ed25519 verify {VERIFIES:,.0f}/s on one core now (V)", file=sys.stderr)
    for k in range(args.runs):
        print(run(args.n, args.d, args.seed + k), flush=True)


if __name__ == "__main__":
    main()
