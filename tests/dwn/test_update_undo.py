"""A later write of a record that sorts last keeps a compact undo instead of a SQLite session's
inverse changeset (``History._updated``, issue #17): the state it leaves is the one the session
path leaves, a message that sorts before it takes it back and processes it again as exactly as
a changeset would, and undoing refuses a row that is not as the write left it."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import apsw
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from p2psync.dwn.canonical import _UPDATED_RECORD, History
from p2psync.dwn.engine import Dwn
from p2psync.dwn.records import create_records_delete
from p2psync.dwn.records_write import RecordsWrite
from tests.dwn.test_replicated_run import ALICE, BOB, CAROL, World, dump, one_by_one, opened
from tests.replication.support import CHAT_DEFINITION, Step, snapshot

CLEAN = {"missing": [], "extra": [], "changed": [], "data": []}


def _sessions_only(monkeypatch: pytest.MonkeyPatch, dwn: Dwn) -> None:
    """Every later write takes the session path, as before the compact undo."""
    history = dwn.history
    monkeypatch.setattr(history, "_updated", lambda tenant, message, data, cid:
                        history._recorded(tenant, message, data, withheld=False))


def _without_undo(tables: dict[str, list[tuple[Any, ...]]], dwn: Dwn) -> dict[str, list[tuple[Any, ...]]]:
    """The dump less the archive's undo column (the two paths record their undo differently)."""
    columns = [str(row[1]) for row in dwn.store.conn.execute("PRAGMA table_info(archive)")]
    at = columns.index("undo")
    return {**tables, "archive": [row[:at] + row[at + 1:] for row in tables["archive"]]}


def _undos(dwn: Dwn, *, records: bool = False) -> list[bytes]:
    """The archive's undo records (``records``: of Records messages only), in archive order."""
    where = " WHERE record_id IS NOT NULL" if records else ""
    return [bytes(u) for (u,) in dwn.store.conn.execute(f"SELECT undo FROM archive{where} ORDER BY id")]


def record_world() -> tuple[World, list[Step]]:
    """Records of several authors and shapes, each updated a few times: with new data, with
    none (the previous data kept), a 0-byte record, a record under a role; returns the world
    and its updates."""
    w = World()
    updates: list[Step] = []
    note = w.write(BOB, b"note v0")
    plain = w.write(ALICE, b"plain v0", path=None, schema="https://p2psync.example/plain", data_format="text/plain")
    empty = w.write(CAROL, b"")
    thread = w.write(BOB, b"a thread", path="thread")
    ctx = thread.message["contextId"]
    w.write(BOB, b"role", path="thread/participant", recipient=CAROL.did, parent_context_id=ctx)
    chat = w.write(CAROL, b"hi", path="thread/chat", parent_context_id=ctx, protocol_role="thread/participant")
    for i in range(3):
        updates.append(note := w.update(note, BOB, f"note v{i + 1}".encode()))
        updates.append(plain := w.update(plain, ALICE, f"plain v{i + 1}".encode()))
        updates.append(thread := w.update(thread, BOB, f"thread v{i + 1}".encode()))
    updates.append(w.update(empty, CAROL, b"no longer empty"))
    updates.append(w.update(chat, CAROL, b"hi again"))  # not carol's to update: refused
    updates.append(republished(w, note))
    return w, updates


def republished(w: World, of: Step) -> Step:
    """A newer write of ``of``'s record that sends no data: the record keeps its data."""
    write = RecordsWrite.create_from(of.message, signer=BOB, published=True, message_timestamp=w.clock.tick())
    return w._add(Step(f"publish-{len(w.steps)}", write.message, None))


def test_updates_in_order_take_the_compact_undo_and_leave_what_a_session_leaves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    w, updates = record_world()
    with opened(tmp_path / "compact.db") as compact, opened(tmp_path / "session.db") as session:
        _sessions_only(monkeypatch, session)
        got = one_by_one(compact, w.steps)
        expected = one_by_one(session, w.steps)
        assert [r.kind for r in got] == [r.kind for r in expected]
        kinds = {s.name: r.kind for s, r in zip(w.steps, got, strict=True)}
        assert [kinds[u.name] for u in updates].count("Superseded") == 1  # the chat's, refused
        assert _without_undo(dump(compact.store), compact) == _without_undo(dump(session.store), session)
        # Every accepted update but the 0-byte record's (its initial write changes CID when
        # demoted) took the compact undo.
        compact_ones = len(updates) - 2
        assert compact.history.updates_compact == compact_ones
        assert sum(u.startswith(_UPDATED_RECORD) for u in _undos(compact)) == compact_ones
        assert session.history.updates_compact == 0
        assert compact.history.verify(ALICE.did) == CLEAN


def test_a_late_update_takes_back_the_later_ones_and_ends_canonical(tmp_path: Path) -> None:
    w = World()
    v = [w.write(BOB, b"v0")]
    for i in range(5):
        v.append(w.update(v[-1], BOB, f"v{i + 1}".encode()))
    late = v[2]
    arrived = [s for s in w.steps if s is not late] + [late]
    with opened(tmp_path / "canonical.db") as canonical, opened(tmp_path / "late.db") as dwn:
        one_by_one(canonical, w.steps)
        results = one_by_one(dwn, arrived)
        history: History = dwn.history
        # v1, v3, v4, v5 sorted last when they came; the warp processed v2 at its place and
        # v3, v4, v5 again after it, each with a compact undo too
        assert history.updates_compact == 8
        assert history.warps == 1 and history.fallbacks == 0
        assert results[-1].kind != "Applied"  # v5 supersedes it at its place
        assert snapshot(dwn.store, ALICE.did) == snapshot(canonical.store, ALICE.did)
        assert history.verify(ALICE.did) == CLEAN


def test_a_late_delete_takes_back_updates_and_puts_superseded_rows_back(tmp_path: Path) -> None:
    """A delete sorting between a record's updates: the warp undoes the later updates (putting
    back the rows they deleted), deletes the record at its place, and the updates after it are
    refused there."""
    w = World()
    first = w.write(BOB, b"v0")
    u1 = w.update(first, BOB, b"v1")
    delete = Step("delete", create_records_delete(record_id=first.message["recordId"], signer=ALICE,
                                                  message_timestamp=w.clock.tick()))
    w.steps.append(delete)
    u2 = w.update(u1, BOB, b"v2")
    u3 = w.update(u2, BOB, b"v3")
    arrived = [w.steps[0], first, u1, u2, u3, delete]
    with opened(tmp_path / "canonical.db") as canonical, opened(tmp_path / "late.db") as dwn:
        one_by_one(canonical, w.steps)
        one_by_one(dwn, arrived)
        history: History = dwn.history
        assert history.updates_compact == 3 and history.warps == 1 and history.fallbacks == 0
        assert snapshot(dwn.store, ALICE.did) == snapshot(canonical.store, ALICE.did)
        assert history.verify(ALICE.did) == CLEAN


def test_a_late_definition_takes_back_updates_of_its_records(tmp_path: Path) -> None:
    """What the updates read (their protocol's definition) changes under them: they are taken
    back with their compact undo and processed again, with no fallback to everything."""
    w = World()
    replaced = w.configure({**CHAT_DEFINITION, "published": False})
    notes = [w.write(BOB if i % 2 else CAROL, f"note {i}".encode()) for i in range(3)]
    updates = [w.update(n, BOB if i % 2 else CAROL, f"note {i} again".encode()) for i, n in enumerate(notes)]
    with opened(tmp_path / "canonical.db") as canonical, opened(tmp_path / "late.db") as dwn:
        one_by_one(canonical, w.steps)
        one_by_one(dwn, [w.steps[0], *notes, *updates])
        assert dwn.history.updates_compact == 3
        assert [r.kind for r in one_by_one(dwn, [replaced])] == ["Applied"]
        assert dwn.history.warps >= 1 and dwn.history.fallbacks == 0
        assert snapshot(dwn.store, ALICE.did) == snapshot(canonical.store, ALICE.did)
        assert dwn.history.verify(ALICE.did) == CLEAN


def _compact_undo_of(dwn: Dwn, step: Step) -> bytes:
    (undo,) = dwn.store.conn.execute("SELECT undo FROM archive WHERE cid=?", (step.cid,)).fetchone()
    assert bytes(undo).startswith(_UPDATED_RECORD)
    return bytes(undo)[len(_UPDATED_RECORD):]


@pytest.mark.parametrize("tamper", ["new row", "demoted row", "superseded row back"])
def test_undoing_refuses_rows_the_write_did_not_leave(tmp_path: Path, tamper: str) -> None:
    w = World()
    first = w.write(BOB, b"v0")
    u1 = w.update(first, BOB, b"v1")
    u2 = w.update(u1, BOB, b"v2")
    # u1 demoted the initial write (u2 found it so already); u2 deleted u1's row.
    undone = u1 if tamper == "demoted row" else u2
    with opened(tmp_path / "s.db") as dwn:
        one_by_one(dwn, w.steps[: w.steps.index(undone) + 1])
        conn, tid = dwn.store.conn, dwn.store._tid(ALICE.did)
        undo = _compact_undo_of(dwn, undone)
        conn.execute("BEGIN IMMEDIATE")
        if tamper == "new row":
            conn.execute("UPDATE messages SET indexes = indexes || ' ' WHERE cid=?", (u2.cid,))
        elif tamper == "demoted row":
            conn.execute("UPDATE messages SET body = body || ' ' WHERE cid=?", (first.cid,))
        else:
            # u1's row, which u2 deleted, is already there again (by a message the warp did not take).
            row = dwn.store.conn.execute("SELECT body FROM archive WHERE cid=?", (u1.cid,)).fetchone()
            conn.execute("INSERT INTO messages(tenant, cid, body, indexes) VALUES(?,?,?,'{}')", (tid, u1.cid, row[0]))
        with pytest.raises(apsw.AbortError):
            dwn.history._undo_update(tid, undo, set())
        conn.execute("ROLLBACK")


def test_undoing_an_update_puts_back_exactly_what_it_changed(tmp_path: Path) -> None:
    w = World()
    first = w.write(BOB, b"v0")
    u1 = w.update(first, BOB, b"v1")
    u2 = w.update(u1, BOB, b"v2")
    with opened(tmp_path / "s.db") as dwn:
        one_by_one(dwn, w.steps[:-1])
        messages = "SELECT * FROM messages ORDER BY id"
        before = dwn.store.conn.execute(messages).fetchall()
        one_by_one(dwn, [u2])
        conn, tid = dwn.store.conn, dwn.store._tid(ALICE.did)
        touched: set[str] = set()
        conn.execute("BEGIN IMMEDIATE")
        dwn.history._undo_update(tid, _compact_undo_of(dwn, u2), touched)
        assert conn.execute(messages).fetchall() == before  # ids, wire forms and all
        assert touched == {u2.cid, u1.cid}
        conn.execute("ROLLBACK")


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.randoms(use_true_random=False), st.integers(min_value=1, max_value=4))
def test_updates_in_any_order_end_canonical(
    tmp_path_factory: pytest.TempPathFactory, rnd: random.Random, records: int
) -> None:
    """Records updated a few times each, arriving in any order, one by one: the state is the
    canonical one, whichever updates took the compact undo and were taken back."""
    w = World()
    for r in range(records):
        step = w.write(BOB if r % 2 else CAROL, f"r{r} v0".encode())
        for i in range(rnd.randint(1, 4)):
            step = w.update(step, BOB if r % 2 else CAROL, f"r{r} v{i + 1}".encode())
    pending = [w.steps[0], *rnd.sample(w.steps[1:], len(w.steps) - 1)]
    tmp = tmp_path_factory.mktemp("orders")
    with opened(tmp / "canonical.db") as canonical, opened(tmp / "shuffled.db") as dwn:
        one_by_one(canonical, w.steps)
        while pending:  # an update that came before its record's initial write waits for it
            results = one_by_one(dwn, pending)
            waiting = [s for s, r in zip(pending, results, strict=True) if r.kind == "Incomplete"]
            assert len(waiting) < len(pending)
            pending = waiting
        assert dwn.history.fallbacks == 0
        assert snapshot(dwn.store, ALICE.did) == snapshot(canonical.store, ALICE.did)
        assert dwn.history.verify(ALICE.did) == CLEAN


def test_a_catch_up_of_updated_records_warps_with_compact_undos(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a device catching up receives for a record updated since: its initial write without
    data (the source superseded it), then its latest write. The latest write warps (the initial
    write is processed again as the record's state without data), and the warp's processing
    takes compact undos too; the store ends as the session path leaves it."""
    w = World()
    arrived: list[Step] = [w.steps[0]]
    for i in range(4):
        first = w.write(BOB if i % 2 else CAROL, f"r{i} v0".encode(), sent=False)
        latest = w.update(first, BOB if i % 2 else CAROL, f"r{i} v1".encode())
        arrived += [first, latest]
    with opened(tmp_path / "compact.db") as compact, opened(tmp_path / "session.db") as session:
        history = session.history
        monkeypatch.setattr(history, "_again", lambda tenant, message, row, withheld:
                            history._recorded(tenant, message, row.data, withheld=withheld))
        _sessions_only(monkeypatch, session)
        got, expected = one_by_one(compact, arrived), one_by_one(session, arrived)
        assert [r.kind for r in got] == [r.kind for r in expected] == ["Applied"] * len(arrived)
        assert compact.history.warps == 4 and compact.history.fallbacks == 0
        assert _without_undo(dump(compact.store), compact) == _without_undo(dump(session.store), session)
        # Every record's undo in the archive is a compact one: no session was needed.
        assert all(u[:1] == b"\x00" for u in _undos(compact, records=True))
        assert any(u.startswith((b"T", b"P")) for u in _undos(session, records=True))  # changesets there
        assert compact.history.verify(ALICE.did) == CLEAN
