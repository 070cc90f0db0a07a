"""Replicated apply through the closure loop: a shuffled 10,000-message scenario.

    .venv/bin/python tests/bench/bench_replicated_apply.py [--messages 10000] [--seed 1]

A source store processes an authored chat scenario in order (protocol, threads, context role
records, role-invoked chats, reactions, thread updates, notes with updates and deletes,
grants and grant-authorized notes, some large records). A fresh replica then admits every
message in a shuffled order through ``ClosureAdmitter``, fetching what is missing from the
source (``LocalStoreFetcher``). For comparison, a second replica admits the source's event log
in log order. Prints: passes per closure (distribution), fetches, and messages admitted per
second (closure roots per wall-clock second), and checks that both replicas equal the source.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from p2psync.dwn import permissions  # noqa: E402
from p2psync.dwn.did import Identity  # noqa: E402
from p2psync.dwn.engine import Dwn  # noqa: E402
from p2psync.dwn.protocols import ProtocolsConfigure  # noqa: E402
from p2psync.dwn.records import create_records_delete  # noqa: E402
from p2psync.dwn.records_write import RecordsWrite  # noqa: E402
from p2psync.dwn.replication_types import DependencyRef, ReplicationApplyResult  # noqa: E402
from p2psync.dwn.store import Store  # noqa: E402
from p2psync.dwn.timeutil import add_seconds  # noqa: E402
from p2psync.replication.closure import ClosureAdmitter, ClosureOutcome, ReplicationEntry  # noqa: E402
from p2psync.state.local import LocalApplier, LocalStoreFetcher, reconcile  # noqa: E402
from tests.bench.bench_engine import verify_rate  # noqa: E402
from tests.replication.support import CHAT, CHAT_DEFINITION, Clock, seeded, snapshot  # noqa: E402

Message = dict[str, Any]


def author(messages: int, seed: int, protocols: int) -> tuple[str, list[ReplicationEntry]]:
    """Exactly ``messages`` messages, each accepted when processed in order.

    Records are spread over ``protocols`` copies of the chat protocol (one app each).
    """
    rng = random.Random(seed)
    alice = seeded("alice")
    people = [
        seeded(n, "jwk" if i % 2 else "key") for i, n in enumerate(("bob", "carol", "dave", "erin", "frank", "gus"))
    ]
    clock = Clock("2031-01-01T00:00:00.000000Z")
    out: list[ReplicationEntry] = []

    def add(message: Message, data: bytes | None = None) -> None:
        out.append(ReplicationEntry(message, data))

    uris = [CHAT] + [f"{CHAT}-{i}" for i in range(1, protocols)]

    def write(signer: Identity, path: str, size: int = 0, protocol: str = CHAT, **kw: Any) -> RecordsWrite:
        now = clock.tick()
        data = rng.randbytes(size or rng.randint(200, 1024))
        w = RecordsWrite.create(
            signer=signer,
            data=data,
            protocol=protocol,
            protocol_path=path,
            message_timestamp=now,
            date_created=now,
            **kw,
        )
        add(w.message, data)
        return w

    for uri in uris:
        definition = {**CHAT_DEFINITION, "protocol": uri}
        add(ProtocolsConfigure.create(definition=definition, signer=alice, message_timestamp=clock.tick()).message)
    grants: dict[str, str] = {}
    for person in people[:3]:
        granted = clock.tick()
        grant, data = permissions.create_grant(
            signer=alice,
            granted_to=person.did,
            date_granted=granted,
            date_expires=add_seconds(granted, 10**8),
            scope={"interface": "Records", "method": "Write", "protocol": CHAT},
        )
        add(grant.message, data)
        grants[person.did] = grant.record_id
    threads: list[tuple[RecordsWrite, Identity, list[Identity]]] = []
    chats: list[tuple[RecordsWrite, Identity]] = []
    notes: list[tuple[RecordsWrite, Identity]] = []
    while len(out) < messages:
        roll = rng.random()
        if roll < 0.08 or not threads:
            owner = rng.choice(people)
            uri = rng.choice(uris)
            thread = write(owner, "thread", protocol=uri)
            ctx = thread.message["contextId"]
            members = rng.sample([p for p in people if p is not owner], 2)
            for m in members:
                if len(out) < messages:
                    write(owner, "thread/participant", 64, protocol=uri, recipient=m.did, parent_context_id=ctx)
            threads.append((thread, owner, members))
        elif roll < 0.45:
            thread, _, members = rng.choice(threads)
            who = rng.choice(members)
            chat = write(
                who,
                "thread/chat",
                protocol=thread.descriptor["protocol"],
                parent_context_id=thread.message["contextId"],
                protocol_role="thread/participant",
            )
            chats.append((chat, who))
        elif roll < 0.65 and chats:
            chat, who = rng.choice(chats)
            protocol = chat.descriptor["protocol"]
            write(who, "thread/chat/reaction", 32, protocol=protocol, parent_context_id=chat.message["contextId"])
        elif roll < 0.72:
            thread, owner, _ = rng.choice(threads)
            now = clock.tick()
            data = rng.randbytes(rng.randint(200, 1024))
            add(RecordsWrite.create_from(thread.message, signer=owner, data=data, message_timestamp=now).message, data)
        elif roll < 0.85:
            who = rng.choice(people)
            size = 40_000 if rng.random() < 0.02 else 0  # some above the inline limit
            notes.append((write(who, "note", size, protocol=rng.choice(uris)), who))
        elif roll < 0.92 and notes:
            i = rng.randrange(len(notes))
            note, who = notes[i]
            now = clock.tick()
            if rng.random() < 0.5:
                data = rng.randbytes(300)
                update = RecordsWrite.create_from(note.message, signer=who, data=data, message_timestamp=now)
                add(update.message, data)
            else:  # publish without sending the data again
                update = RecordsWrite.create_from(note.message, signer=who, published=True, message_timestamp=now)
                add(update.message)
            notes[i] = (update, who)  # the next update builds on this one
        elif roll < 0.95 and notes:
            note, _ = notes.pop(rng.randrange(len(notes)))
            add(create_records_delete(record_id=note.record_id, signer=alice, message_timestamp=clock.tick()))
        else:
            who = rng.choice(people[:3])
            now = clock.tick()
            data = rng.randbytes(500)
            w = RecordsWrite.create(
                signer=who,
                data=data,
                protocol=CHAT,
                protocol_path="note",
                message_timestamp=now,
                date_created=now,
                permission_grant_id=grants[who.did],
            )
            add(w.message, data)
    return alice.did, out[:messages]


class Timed:
    """The local applier and fetcher, with the time spent in each."""

    def __init__(self, replica: Dwn, source: Store) -> None:
        self.applier, self.fetcher = LocalApplier(replica), LocalStoreFetcher(source)
        self.apply_s = self.fetch_s = 0.0
        self.applies = 0

    async def apply(self, tenant: str, entry: ReplicationEntry) -> ReplicationApplyResult:
        t = time.perf_counter()
        try:
            return await self.applier.apply(tenant, entry)
        finally:
            self.apply_s += time.perf_counter() - t
            self.applies += 1

    async def fetch(self, tenant: str, refs: Sequence[DependencyRef]) -> list[list[ReplicationEntry]]:
        t = time.perf_counter()
        try:
            return await self.fetcher.fetch(tenant, refs)
        finally:
            self.fetch_s += time.perf_counter() - t


async def admit(timed: Timed, tenant: str, entries: list[ReplicationEntry]) -> list[ClosureOutcome]:
    outcomes = [await ClosureAdmitter(tenant, e).admit(timed, timed) for e in entries]
    retry = [e for e, o in zip(entries, outcomes, strict=True) if o.status == "deferred"]
    for e in retry:  # what a later sync would do
        outcomes.append(await ClosureAdmitter(tenant, e).admit(timed, timed))
    return outcomes


def distribution(values: list[int]) -> str:
    counts = Counter(values)
    total = len(values)
    cells = [f"{k}: {counts[k]} ({100 * counts[k] / total:.1f}%)" for k in sorted(counts)]
    return ", ".join(cells)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--protocols", type=int, default=50, help="protocols the records are spread over")
    args = parser.parse_args()

    verifies = verify_rate()
    print(f"yardstick: Ed25519 verify {verifies:,.0f}/s on one core now (V); rates below also as a fraction of V")
    t0 = time.perf_counter()
    tenant, entries = author(args.messages, args.seed, args.protocols)
    print(f"authored {len(entries)} messages over {args.protocols} protocols in {time.perf_counter() - t0:.1f} s")
    with tempfile.TemporaryDirectory() as tmp:
        source = Dwn(Store(Path(tmp) / "source.db"))
        t0 = time.perf_counter()
        refused: Counter[str] = Counter()
        for e in entries:
            reply = source.process_message(tenant, e.message, e.data)
            if reply.code not in (202, 204):
                refused[reply.detail.split(":")[0]] += 1
        ingest = time.perf_counter() - t0
        rate = len(entries) / ingest
        print(f"source, in order: {rate:,.0f} msgs/s = {rate / verifies:.3f} V ({ingest:.1f} s);"
              f" refused: {dict(refused)}")

        shuffled = list(entries)
        random.Random(args.seed).shuffle(shuffled)
        replica = Dwn(Store(Path(tmp) / "replica.db"))
        timed = Timed(replica, source.store)
        t0 = time.perf_counter()
        outcomes = trio.run(admit, timed, tenant, shuffled)
        shuffled_s = time.perf_counter() - t0
        first = outcomes[: len(shuffled)]
        final = {o.root_cid: o for o in outcomes}
        statuses = Counter(o.status for o in final.values())
        applies = sum(len(o.admitted) for o in first)
        rate = len(shuffled) / shuffled_s
        print(f"shuffled, closure loop: {rate:,.0f} msgs admitted/s = {rate / verifies:.3f} V ({shuffled_s:.1f} s)")
        print(f"  outcomes (after one retry of the deferred): {dict(statuses)}")
        print(f"  passes per closure: {distribution([o.passes for o in first])}")
        print(f"  fetch requests per closure: {distribution([o.fetch_requests for o in first])}")
        refs, fetched = sum(o.refs_fetched for o in first), sum(o.entries_fetched for o in first)
        print(f"  refs fetched: {refs}, entries fetched: {fetched}")
        print(f"  messages admitted inside closures (roots and dependencies): {applies}")
        loop_s = shuffled_s - timed.apply_s - timed.fetch_s
        print(
            f"  time: engine apply {timed.apply_s:.1f} s ({timed.applies} applies,"
            f" {1000 * timed.apply_s / timed.applies:.2f} ms each), fetch {timed.fetch_s:.1f} s,"
            f" closure loop itself {loop_s:.2f} s ({1e6 * loop_s / len(shuffled):.0f} µs a root)"
        )
        same = snapshot(replica.store, tenant) == snapshot(source.store, tenant)
        history = replica.history
        print(f"  canonical placement: {history.warps} warps (messages that sorted before admitted ones),"
              f" {history.replayed} messages processed again in them")
        print(f"  replica == source: {same}")

        in_order = Dwn(Store(Path(tmp) / "in-order.db"))
        t0 = time.perf_counter()
        report = trio.run(reconcile, source.store, in_order, tenant)
        log_s = time.perf_counter() - t0
        print(
            f"source log order, closure loop: {len(report.outcomes) / log_s:,.0f} msgs admitted/s"
            f" = {len(report.outcomes) / log_s / verifies:.3f} V"
            f" ({len(report.outcomes)} log entries, {log_s:.1f} s); passes: {distribution(report.passes)}"
        )
        print(f"  canonical placement: {in_order.history.warps} warps, {in_order.history.replayed} messages"
              f" processed again in them; the source, processing in authored order: {source.history.warps} warps")
        print(f"  replica == source: {snapshot(in_order.store, tenant) == snapshot(source.store, tenant)}")
        if not same:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
