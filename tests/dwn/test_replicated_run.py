"""A run of replicated initial writes applied together (``Dwn.apply_replicated_run``, issue #17)
leaves the store exactly as applying each alone does, answers each the same, stops before the
first message that is not one of them, and rolls back whole when a message stores anything
but its own row."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from p2psync.dwn.canonical import History
from p2psync.dwn.did import Identity
from p2psync.dwn.engine import Dwn
from p2psync.dwn.protocols import ProtocolsConfigure
from p2psync.dwn.records_write import RecordsWrite
from p2psync.dwn.replicated import MIN_RUN, RunEntry
from p2psync.dwn.replication_types import ReplicationApplyResult
from p2psync.dwn.store import Store
from tests.replication.support import CHAT, CHAT_DEFINITION, Clock, Step, seeded, snapshot

ALICE, BOB, CAROL = seeded("run-alice"), seeded("run-bob", "jwk"), seeded("run-carol")

# Every table a replicated apply writes, whole (ids, undo records and footprint keys included).
_TABLES = {
    "messages": "SELECT * FROM messages ORDER BY id",
    "events": "SELECT tenant, position, cid, indexes FROM events ORDER BY tenant, position",
    "archive": "SELECT * FROM archive ORDER BY id",
    "archive_keys": "SELECT * FROM archive_keys ORDER BY row, key",
    "set_journal": "SELECT tenant, protocol, cid, delta FROM set_journal ORDER BY seq",
    "tenants": "SELECT did, next_position, active FROM tenants ORDER BY id",
    "tenant_usage": "SELECT * FROM tenant_usage ORDER BY tenant",
    "data": "SELECT tenant, record_id, data_cid, size, bytes FROM data ORDER BY id",
}


def dump(store: Store) -> dict[str, list[tuple[Any, ...]]]:
    return {name: [tuple(row) for row in store.conn.execute(sql)] for name, sql in _TABLES.items()}


class World:
    """alice's DWN: the chat protocol, then records by several authors, one second apart."""

    def __init__(self) -> None:
        self.clock = Clock("2031-02-01T00:00:00.000000Z")
        self.steps: list[Step] = []
        self.configure(CHAT_DEFINITION)

    def configure(self, definition: dict[str, Any]) -> Step:
        message = ProtocolsConfigure.create(definition=definition, signer=ALICE, message_timestamp=self.clock.tick())
        return self._add(Step(f"configure-{len(self.steps)}", message.message))

    def write(self, signer: Identity, data: bytes = b"hello", *, path: str | None = "note", sent: bool = True,
              **kw: Any) -> Step:
        """A new record; ``sent=False``: its initial write travels without its data."""
        now = self.clock.tick()
        extra = {"protocol": CHAT, "protocol_path": path} if path is not None else {}
        write = RecordsWrite.create(signer=signer, data=data, message_timestamp=now, date_created=now, **extra, **kw)
        return self._add(Step(f"write-{len(self.steps)}", write.message, data if sent else None))

    def update(self, of: Step, signer: Identity, data: bytes = b"again") -> Step:
        write = RecordsWrite.create_from(of.message, signer=signer, data=data, message_timestamp=self.clock.tick())
        return self._add(Step(f"update-{len(self.steps)}", write.message, data))

    def _add(self, step: Step) -> Step:
        self.steps.append(step)
        return step


def answers(results: Sequence[ReplicationApplyResult]) -> list[Any]:
    """Results as JSON, less what differs between two stores (their log's streamId, epoch)."""
    out = []
    for result in results:
        answer = result.to_json()
        if "position" in answer:
            answer["position"] = {k: v for k, v in answer["position"].items() if k not in ("streamId", "epoch")}
        out.append(answer)
    return out


def entry(step: Step) -> RunEntry:
    e = step.entry
    return RunEntry(e.message, e.data, e.cid, e.encoded)


@contextmanager
def opened(path: Path) -> Iterator[Dwn]:
    dwn = Dwn(Store(path))
    try:
        yield dwn
    finally:
        dwn.close()


def one_by_one(dwn: Dwn, steps: Sequence[Step]) -> list[ReplicationApplyResult]:
    conn = dwn.store.conn
    conn.execute("BEGIN IMMEDIATE")
    results = [dwn.apply_replicated_message(ALICE.did, s.entry.message, s.data, cid=s.cid, encoded=s.entry.encoded)
               for s in steps]
    conn.execute("COMMIT")
    return results


def in_runs(dwn: Dwn, steps: Sequence[Step]) -> tuple[list[ReplicationApplyResult], list[int]]:
    """What the store service does with a batch: a run where one can start, else one alone.
    Returns the results and the length of each run taken."""
    conn = dwn.store.conn
    conn.execute("BEGIN IMMEDIATE")
    results: list[ReplicationApplyResult] = []
    runs: list[int] = []
    i = 0
    while i < len(steps):
        ran = dwn.apply_replicated_run(ALICE.did, [entry(s) for s in steps[i:]])
        if ran:
            runs.append(len(ran))
            results.extend(ran)
            i += len(ran)
            continue
        s = steps[i]
        results.append(dwn.apply_replicated_message(ALICE.did, s.entry.message, s.data, cid=s.cid,
                                                    encoded=s.entry.encoded))
        i += 1
    conn.execute("COMMIT")
    return results, runs


def mixed_world() -> World:
    """Initial writes of new records (with data, without, by the tenant and by others, roles
    and their holders), broken by what a run must not take: an update, a 0-byte record, data
    kept out of line, a write its author may not make, a replayed message."""
    w = World()
    w.write(BOB)
    w.write(CAROL, b"x" * 900)
    w.write(ALICE, path=None, schema="https://p2psync.example/plain", data_format="text/plain")
    w.write(BOB, b"gone", sent=False)  # ancestry only: 204
    first = w.write(CAROL, b"first")
    w.update(first, CAROL)
    w.write(BOB, b"")  # a 0-byte record: stored under another CID
    w.write(BOB, b"y" * 40_000)  # data kept out of line
    thread = w.write(BOB, b"a thread", path="thread")
    ctx = thread.message["contextId"]
    w.write(BOB, b"role", path="thread/participant", recipient=CAROL.did, parent_context_id=ctx)
    w.write(CAROL, b"hi", path="thread/chat", parent_context_id=ctx, protocol_role="thread/participant")
    w.write(CAROL, b"not hers to give", path="thread/participant", recipient=ALICE.did, parent_context_id=ctx)
    w.write(ALICE)
    w.write(BOB)
    w.write(CAROL)
    w.steps.append(w.steps[-2])  # the same message again
    w.write(ALICE)
    w.write(BOB)
    return w


def test_runs_leave_the_store_as_one_by_one_and_answer_the_same(tmp_path: Path) -> None:
    w = mixed_world()
    with opened(tmp_path / "alone.db") as alone, opened(tmp_path / "runs.db") as together:
        expected = one_by_one(alone, w.steps)
        got, runs = in_runs(together, w.steps)
        assert answers(got) == answers(expected)
        assert dump(together.store) == dump(alone.store)
        # The runs were taken (not every message alone), and stopped where they must.
        assert sum(runs) >= 8 and all(n >= MIN_RUN for n in runs), runs
        assert {r.kind for r in expected} >= {"Applied", "Duplicate"}
        assert together.history.verify(ALICE.did) == {"missing": [], "extra": [], "changed": [], "data": []}


def test_a_run_stops_before_an_update_and_takes_nothing_that_is_held(tmp_path: Path) -> None:
    w = World()
    a, b = w.write(BOB), w.write(BOB)
    c = w.update(a, BOB)
    d, e = w.write(CAROL), w.write(CAROL)
    with opened(tmp_path / "s.db") as dwn:
        one_by_one(dwn, [w.steps[0]])  # the tenant exists
        dwn.store.conn.execute("BEGIN IMMEDIATE")
        ran = dwn.apply_replicated_run(ALICE.did, [entry(s) for s in (a, b, c, d, e)])
        assert [r.kind for r in ran] == ["Applied", "Applied"]
        # Held already: no run takes them again (each alone answers Duplicate).
        assert dwn.apply_replicated_run(ALICE.did, [entry(s) for s in (a, b)]) == []
        dwn.store.conn.execute("COMMIT")


def test_a_run_needs_everything_here_to_sort_before_it(tmp_path: Path) -> None:
    w = World()
    early, late = w.write(BOB), w.write(BOB)
    later, latest = w.write(CAROL), w.write(CAROL)
    with opened(tmp_path / "s.db") as dwn:
        one_by_one(dwn, [w.steps[0], later])
        dwn.store.conn.execute("BEGIN IMMEDIATE")
        assert dwn.apply_replicated_run(ALICE.did, [entry(early), entry(late)]) == []  # `later` sorts after
        assert [r.kind for r in dwn.apply_replicated_run(ALICE.did, [entry(latest), entry(w.write(ALICE))])] == \
            ["Applied", "Applied"]
        dwn.store.conn.execute("COMMIT")


def test_a_message_that_stores_more_than_its_row_rolls_the_run_back_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = World()
    steps = [w.write(BOB) for _ in range(4)]
    with opened(tmp_path / "s.db") as dwn:
        one_by_one(dwn, w.steps[:1])
        before = dump(dwn.store)
        process = dwn.history._process
        seen: list[str] = []

        def process_and_write_more(tenant: str, message: Any, data: bytes | None, withheld: bool) -> Any:
            reply = process(tenant, message, data, withheld)
            seen.append(message["recordId"])
            if len(seen) == 3:  # the third also leaves a row of its own making
                dwn.store.conn.execute("INSERT INTO meta(key, value) VALUES('stray', 'row')")
            return reply

        monkeypatch.setattr(dwn.history, "_process", process_and_write_more)
        dwn.store.conn.execute("BEGIN IMMEDIATE")
        assert dwn.apply_replicated_run(ALICE.did, [entry(s) for s in steps]) == []
        dwn.store.conn.execute("COMMIT")
        assert len(seen) == 3
        assert dump(dwn.store) == before
        assert dwn.store.conn.execute("SELECT count(*) FROM meta WHERE key='stray'").fetchone()[0] == 0


def test_a_message_sorting_before_a_run_warps_over_it_with_its_undo_records(tmp_path: Path) -> None:
    """The run's archive rows carry the cheap undo of an appended write: a definition that
    sorts before them and changes what they read takes them back and processes them again,
    without falling back to processing everything."""
    w = World()
    replaced = w.configure({**CHAT_DEFINITION, "published": False})
    notes = [w.write(BOB if i % 2 else CAROL, f"note {i}".encode()) for i in range(6)]
    with opened(tmp_path / "canonical.db") as canonical, opened(tmp_path / "runs.db") as dwn:
        one_by_one(canonical, w.steps)
        one_by_one(dwn, w.steps[:1])
        _, runs = in_runs(dwn, notes)
        assert runs == [6]
        assert [r.kind for r in one_by_one(dwn, [replaced])] == ["Applied"]
        history: History = dwn.history
        assert history.warps >= 1 and history.fallbacks == 0
        assert snapshot(dwn.store, ALICE.did) == snapshot(canonical.store, ALICE.did)
        assert dwn.history.verify(ALICE.did) == {"missing": [], "extra": [], "changed": [], "data": []}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(min_value=0, max_value=len(mixed_world().steps) - 1), min_size=1, max_size=24))
def test_any_batch_of_messages_ends_as_one_by_one(tmp_path_factory: pytest.TempPathFactory, picks: list[int]) -> None:
    """Whatever a batch holds (in any order, repeated, out of canonical order), runs and the
    messages between them leave the store as applying each alone does."""
    w = mixed_world()
    steps = [w.steps[0]] + [w.steps[i] for i in picks]
    tmp = tmp_path_factory.mktemp("batch")
    with opened(tmp / "alone.db") as alone, opened(tmp / "runs.db") as together:
        expected = one_by_one(alone, steps)
        got, _ = in_runs(together, steps)
        assert answers(got) == answers(expected)
        assert dump(together.store) == dump(alone.store)
