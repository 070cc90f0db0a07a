"""Writes protocol/examples/recon-vectors.json (protocol/anti-entropy.md §8).

    .venv/bin/python tests/replication/make_recon_vectors.py

Keys (id, check, sign bits) of fixed CIDs under two coders, index sequences, two sketches with
their estimator lanes, and three whole exchanges (equal, one difference, a larger one) as the
hex of every request and reply body. tests/replication/test_recon.py checks the file against
the code; another implementation checks its own code against the file.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from p2psync.replication.lthash import lthash_digest  # noqa: E402
from p2psync.replication.recon import MemorySet, Reconciliation, answer, pack_symbols  # noqa: E402
from p2psync.replication.riblt import Coder, Sketch, symbol_indexes  # noqa: E402
from p2psync.replication.wire import decode_body, encode_body  # noqa: E402

OUT = ROOT / "protocol" / "examples" / "recon-vectors.json"
CIDS = [
    "bafyreigdmqpykrgxyaxtlafqpqhzrb7qy2rh75nldvfd4tucqmqqme5yje",
    "bafyreib6nfqjnbfafxz3krvpvtqpcpelsmkbcfxj5mlfw3uwdrccudbe4q",
    "bafyreihxgfpbpqjy3g3fryczoxzchcn2dkfcfxjjtalnydbwxb4uglz6c4",
    "bafyreie7lyhrvwpa4oxrfzuxbfoemzcuezcn4zy74z6t6imztzbgrekybe",
]


def many(prefix: str, n: int) -> list[str]:
    return [f"bafyrei{prefix}{i:06d}" for i in range(n)]


def exchange(initiator: list[str], responder: list[str]) -> dict[str, Any]:
    mine = MemorySet(Coder(), initiator, 64, lthash_digest(initiator))
    theirs = MemorySet(Coder(), responder, 64, lthash_digest(responder))
    recon = Reconciliation(mine)
    request: dict[str, Any] | None = recon.opening()
    messages = []
    while request is not None:
        raw = encode_body(request)
        reply = encode_body(answer(decode_body(raw), lambda _c: theirs))
        messages.append({"request": raw.hex(), "reply": reply.hex()})
        request = recon.receive(decode_body(reply))
    assert recon.result is not None
    coder = Coder()
    return {
        "initiator": initiator, "responder": responder, "messages": messages,
        "initiatorOnly": sorted(f"{coder.key(c).id:016x}" for c in set(initiator) - set(responder)),
        "responderOnly": sorted(f"{coder.key(c).id:016x}" for c in set(responder) - set(initiator)),
    }


def main() -> None:
    salted = Coder(2, bytes(range(16)))
    keys = []
    for coder in (Coder(), salted):
        for c in CIDS:
            k = coder.key(c)
            keys.append({"cid": c, "width": coder.width, "salt": coder.salt.hex(),
                         "id": f"{k.id:0{2 * coder.width}x}", "check": f"{k.check:08x}", "signs": k.signs.hex()})
    indexes = [{"id": f"{Coder().key(c).id:016x}", "limit": 1000,
                "indexes": list(symbol_indexes(Coder().key(c).id, 1000))} for c in CIDS]
    sketches = []
    for cids, size in ((CIDS, 8), (many("s", 50), 16)):
        sketch = Sketch(Coder(), size)
        sketch.add_cids(cids)
        sketches.append({"cids": cids, "size": size, "symbols": pack_symbols(sketch.range(0, size), 8).hex(),
                         "lanes": bytes(b for lane in sketch.estimator.lanes() for b in lane.to_bytes(2, "big")).hex()})
    common = many("c", 40)
    exchanges = [
        exchange(common, list(reversed(common))),
        exchange(common + CIDS[:1], common),
        exchange(common + many("a", 6), common + many("b", 5)),
    ]
    doc = {
        "description": "p2psync anti-entropy golden vectors (protocol/anti-entropy.md §8)",
        "keys": keys, "indexes": indexes, "sketches": sketches, "exchanges": exchanges,
    }
    OUT.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
