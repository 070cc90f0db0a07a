"""The maintained set digests (p2psync/state/setindex.py, schema 3 of p2psync/dwn/store.py).

Whatever changes the ``messages`` table — puts, deletes, rolled-back savepoints, the undo and
redo changesets of a warp, another connection — the folded ``set_digests`` must equal the
LtHash of the table computed from scratch, and a subscriber that applies the change feed (and
rebuilds when told to) must hold exactly the stored set.
"""

from __future__ import annotations

import random
from collections import defaultdict
from pathlib import Path
from typing import Any
from unittest.mock import patch

import apsw
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from p2psync.dwn.encoding import compute_cid
from p2psync.dwn.engine import Dwn
from p2psync.dwn.store import SCHEMA_VERSION, Store
from p2psync.errors import LocalMisuse
from p2psync.replication.lthash import ElementSum, LtHash, lthash_digest
from p2psync.state import setindex
from p2psync.state.committer import GroupCommitter
from p2psync.state.digest import store_digest
from p2psync.state.setindex import SetChange, SetDigest, SetIndex
from tests.replication.histories import canonical_order, generate
from tests.replication.support import admit_all, chat_world, process_all, undo_schema_7

TENANTS = ["did:example:alice", "did:example:bob"]
PROTOCOLS = [None, "https://example.com/a", "https://example.com/b"]
CIDS = [compute_cid({"n": i}) for i in range(12)]


# --------------------------------------------------------------------------- helpers


def scan(store: Store) -> dict[tuple[str, str], tuple[int, bytes]]:
    """Every non-empty (tenant, scope) set's (count, digest), from the messages table."""
    sets: dict[tuple[str, str], list[str]] = defaultdict(list)
    for did, protocol, cid in store.conn.execute(
        "SELECT t.did, m.protocol, m.cid FROM messages m JOIN tenants t ON t.id = m.tenant"
    ):
        sets[(did, "")].append(cid)
        if protocol:
            sets[(did, protocol)].append(cid)
    return {key: (len(cids), lthash_digest(cids)) for key, cids in sets.items()}


def folded(store: Store) -> dict[tuple[str, str], tuple[int, bytes]]:
    """The set_digests table as it stands (call after a catch_up)."""
    return {
        (did, scope): (int(count), LtHash.from_state(bytes(state)).digest())
        for did, scope, count, state in store.conn.execute(
            "SELECT t.did, d.scope, d.count, d.state FROM set_digests d JOIN tenants t ON t.id = d.tenant"
        )
    }


def assert_maintained(store: Store, index: SetIndex) -> None:
    index.catch_up()
    want = scan(store)
    assert folded(store) == want
    for (did, scope), (count, digest) in want.items():
        assert index.digest(did, scope or None) == SetDigest(count, digest)


class Mirror:
    """A subscriber: the stored sets as the change feed says, rebuilt from a scan on reset."""

    def __init__(self, index: SetIndex) -> None:
        self.index = index
        self.sets: dict[str, set[str]] = {}
        self.resets = 0
        index.subscribe(self.on_changes)

    def on_changes(self, changes: list[SetChange], reset: bool) -> None:
        if reset:
            self.resets += 1
            self.sets = {t: set(self.index.cids(t)) for t in self.index.store.tenants()}
            return
        for c in changes:
            held = self.sets.setdefault(c.tenant, set())
            if c.delta > 0:
                assert c.cid not in held, c
                held.add(c.cid)
            else:
                assert c.cid in held, c
                held.remove(c.cid)

    def assert_exact(self, store: Store) -> None:
        want = {t: set(store.messages.cids(t)) for t in store.tenants()}
        assert {t: s for t, s in self.sets.items() if s} == {t: s for t, s in want.items() if s}


def put(store: Store, tenant: str, cid: str, protocol: str | None) -> None:
    indexes: dict[str, Any] = {"interface": "Records", "method": "Write"}
    if protocol is not None:
        indexes["protocol"] = protocol
    store.messages.put(tenant, {"cid": cid}, indexes, cid=cid)


class _RollBack(Exception):
    pass


# --------------------------------------------------------------------------- properties


op = st.one_of(
    st.tuples(st.just("put"), st.sampled_from(TENANTS), st.sampled_from(CIDS), st.sampled_from(PROTOCOLS)),
    st.tuples(st.just("delete"), st.sampled_from(TENANTS), st.sampled_from(CIDS)),
    st.tuples(st.just("fold")),
    st.tuples(st.just("fold-other")),
)
ops = st.lists(
    st.one_of(op, st.tuples(st.just("rolled-back"), st.lists(op, max_size=5)),
              st.tuples(st.just("savepoint"), st.lists(op, max_size=5))),
    max_size=40,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops)
def test_any_puts_deletes_and_rollbacks_keep_the_digests_true(script: list[tuple[Any, ...]]) -> None:
    """Random puts and deletes, some inside savepoints that roll back and some inside ones that
    commit, folded now and then by this index and by another one on the same connection (as
    another process would): the folded digests equal a scan, and the feed's subscriber holds
    exactly the stored set."""
    store = Store(":memory:")
    for tenant in TENANTS:
        # Made outside the savepoints: Store caches a tenant's row id, and would keep one
        # whose row a savepoint rolled back (a limit of Store.tenant_id, not of the journal).
        store.tenant_id(tenant)
    index, other = SetIndex(store), SetIndex(store)
    mirror = Mirror(index)

    def run(step: tuple[Any, ...]) -> None:
        kind = step[0]
        if kind == "put":
            put(store, step[1], step[2], step[3])
        elif kind == "delete":
            store.messages.delete(step[1], step[2])
        elif kind == "fold":
            index.catch_up()
        elif kind == "fold-other":
            other.catch_up()
        elif kind == "savepoint":
            with store.transaction():
                for inner in step[1]:
                    run(inner)
        else:
            try:
                with store.transaction():
                    for inner in step[1]:
                        run(inner)
                    raise _RollBack
            except _RollBack:
                pass

    for step in script:
        run(step)
    assert_maintained(store, index)
    mirror.assert_exact(store)
    other.catch_up()
    assert folded(store) == scan(store)
    store.close()


def test_folds_whose_sums_fill_up_keep_the_digests_true() -> None:
    """The same property with sums of two elements (ElementSum.CAPACITY is 65,534): a fold
    settles a full sum into its scopes and starts another."""
    with patch.object(ElementSum, "CAPACITY", 2):
        test_any_puts_deletes_and_rollbacks_keep_the_digests_true()


# --------------------------------------------------------------------------- the journal


def test_a_rolled_back_transaction_leaves_no_journal_rows() -> None:
    store = Store(":memory:")
    index = SetIndex(store)
    put(store, TENANTS[0], CIDS[0], None)
    assert index.pending() == 1
    with pytest.raises(_RollBack), store.transaction():
        put(store, TENANTS[0], CIDS[1], PROTOCOLS[1])
        store.messages.delete(TENANTS[0], CIDS[0])
        assert index.pending() == 3
        raise _RollBack
    assert index.pending() == 1
    put(store, TENANTS[0], CIDS[0], None)  # already stored: INSERT OR IGNORE inserts nothing
    assert index.pending() == 1
    assert index.catch_up() == [SetChange(TENANTS[0], None, CIDS[0], 1)]
    assert index.pending() == 0
    assert_maintained(store, index)


def test_applying_a_changeset_fires_the_triggers() -> None:
    """A warp takes the state back with SQLite session changesets (canonical.py): applying one
    must journal its row changes like any other write, and undoing them must too."""
    store = Store(":memory:")
    index = SetIndex(store)
    put(store, TENANTS[0], CIDS[0], None)
    index.catch_up()
    session = apsw.Session(store.conn, "main")
    session.attach("messages")
    put(store, TENANTS[0], CIDS[1], PROTOCOLS[1])
    store.messages.delete(TENANTS[0], CIDS[0])
    changes = session.changeset()
    session.close()
    assert index.catch_up() == [
        SetChange(TENANTS[0], PROTOCOLS[1], CIDS[1], 1), SetChange(TENANTS[0], None, CIDS[0], -1)
    ]
    apsw.Changeset.apply(apsw.Changeset.invert(changes), store.conn)
    assert sorted(index.catch_up(), key=lambda c: c.cid) == sorted(
        [SetChange(TENANTS[0], PROTOCOLS[1], CIDS[1], -1), SetChange(TENANTS[0], None, CIDS[0], 1)],
        key=lambda c: c.cid,
    )
    assert store.messages.cids(TENANTS[0]) == [CIDS[0]]
    apsw.Changeset.apply(changes, store.conn)
    assert_maintained(store, index)
    assert index.digest(TENANTS[0], PROTOCOLS[1]) == SetDigest(1, lthash_digest([CIDS[1]]))
    assert index.protocols(TENANTS[0]) == [PROTOCOLS[1]] and index.protocols(TENANTS[1]) == []


def test_changes_that_cancel_out_within_a_fold_are_left_out() -> None:
    store = Store(":memory:")
    index = SetIndex(store)
    put(store, TENANTS[0], CIDS[0], None)
    store.messages.delete(TENANTS[0], CIDS[0])
    put(store, TENANTS[1], CIDS[1], None)
    assert index.catch_up() == [SetChange(TENANTS[1], None, CIDS[1], 1)]
    assert index.digest(TENANTS[0]) == SetDigest(0, lthash_digest([]))
    assert index.catch_up() == []  # nothing new: no write transaction either
    assert index.folds == 1


def test_an_empty_protocol_is_not_a_scope() -> None:
    index = SetIndex(Store(":memory:"))
    with pytest.raises(LocalMisuse):
        index.digest(TENANTS[0], "")
    with pytest.raises(LocalMisuse):
        index.cids(TENANTS[0], "")


# --------------------------------------------------------------------------- open transactions


async def test_no_fold_inside_the_committers_open_transaction(tmp_path: Path) -> None:
    """The group committer keeps a write transaction open across writes: what it wrote may still
    roll back, so nothing is folded (and no subscriber told) until it commits; a digest asked
    meanwhile still counts what the connection sees."""
    store = Store(tmp_path / "s.db")
    index = SetIndex(store)
    mirror = Mirror(index)
    index.catch_up()
    committer = GroupCommitter(store)
    _, batch = committer.run(lambda: put(store, TENANTS[0], CIDS[0], PROTOCOLS[1]))
    assert store.conn.in_transaction
    assert index.catch_up() == [] and mirror.sets == {}
    assert index.digest(TENANTS[0]) == SetDigest(1, lthash_digest([CIDS[0]]))
    assert index.digest(TENANTS[0], PROTOCOLS[1]) == SetDigest(1, lthash_digest([CIDS[0]]))
    assert index.digest(TENANTS[0], PROTOCOLS[2]).count == 0
    await committer.durable(batch)
    assert index.catch_up() == [SetChange(TENANTS[0], PROTOCOLS[1], CIDS[0], 1)]
    mirror.assert_exact(store)
    assert_maintained(store, index)
    with trio.fail_after(5):
        await trio.lowlevel.checkpoint()


async def test_the_committer_folds_after_each_commit(tmp_path: Path) -> None:
    """``committer.after_commit(index.catch_up)``: each batch is folded as soon as it is
    committed, before another batch opens, and subscribers hear of nothing uncommitted."""
    store = Store(tmp_path / "s.db")
    index = SetIndex(store)
    mirror = Mirror(index)
    committer = GroupCommitter(store, max_writes=4)
    seen_in_batch: list[int] = []

    def check() -> None:
        assert not store.conn.in_transaction
        seen_in_batch.append(index.pending())

    committer.after_commit(check)
    committer.after_commit(index.catch_up)

    async def writer(i: int) -> None:
        await committer.write(lambda: put(store, TENANTS[i % 2], CIDS[i], PROTOCOLS[i % 3]))

    async with trio.open_nursery() as nursery:
        for i in range(10):
            nursery.start_soon(writer, i)
    assert committer.commits >= 3 and len(seen_in_batch) == committer.commits
    assert index.pending() == 0 and index.folds == committer.commits
    mirror.assert_exact(store)
    assert_maintained(store, index)


async def test_a_node_folds_once_enough_rows_wait_and_every_answer_is_exact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``committer.after_commit(index.catch_up_if_due)``: commits leave their rows in the journal
    until FOLD_BATCH wait (or another connection folded); a digest asked in between folds first."""
    monkeypatch.setattr(setindex, "FOLD_BATCH", 5)
    store = Store(tmp_path / "s.db")
    index = SetIndex(store)
    mirror = Mirror(index)
    committer = GroupCommitter(store, max_writes=2)
    committer.after_commit(index.catch_up_if_due)
    await committer.write(lambda: put(store, TENANTS[0], CIDS[0], PROTOCOLS[1]))
    assert index.folds == 1 and index.pending() == 0  # the fresh subscriber's first fold
    for i in range(1, 4):
        await committer.write(lambda i=i: put(store, TENANTS[i % 2], CIDS[i], PROTOCOLS[i % 3]))
    assert index.folds == 1 and index.pending() == 3  # fewer than 5 wait: nothing folded
    assert index.digest(TENANTS[1]) == SetDigest(2, lthash_digest([CIDS[1], CIDS[3]]))
    assert index.folds == 2 and index.pending() == 0  # the digest folded first
    mirror.assert_exact(store)
    for i in range(4, 9):
        await committer.write(lambda i=i: put(store, TENANTS[i % 2], CIDS[i], PROTOCOLS[i % 3]))
    assert index.folds == 3 and index.pending() == 0  # the fifth row made it due
    mirror.assert_exact(store)
    await committer.write(lambda: put(store, TENANTS[0], CIDS[9], None))
    other = SetIndex(Store(tmp_path / "s.db"))
    other.catch_up()  # another connection folded: this one catches up at its next commit
    await committer.write(lambda: store.messages.delete(TENANTS[0], CIDS[9]))
    assert index.folds == 4
    mirror.assert_exact(store)
    assert_maintained(store, index)


def test_a_busy_store_still_answers(tmp_path: Path) -> None:
    """Another connection holds the write lock (a node mid-batch): the digest is answered from
    the folded state plus the journal rows not folded yet."""
    a, b = Store(tmp_path / "s.db"), Store(tmp_path / "s.db")
    index = SetIndex(a)
    put(a, TENANTS[0], CIDS[0], None)
    b.conn.execute("BEGIN IMMEDIATE")
    put(b, TENANTS[0], CIDS[1], None)  # not committed: a sees only CIDS[0]
    a.conn.set_busy_timeout(10)
    assert index.digest(TENANTS[0]) == SetDigest(1, lthash_digest([CIDS[0]]))
    assert index.pending() == 1 and index.folds == 0
    b.conn.execute("COMMIT")
    assert index.digest(TENANTS[0]) == SetDigest(2, lthash_digest(CIDS[:2]))
    assert index.pending() == 0
    a.close()
    b.close()


def test_a_failed_callback_rolls_the_fold_back_and_resets_everyone() -> None:
    store = Store(":memory:")
    index = SetIndex(store)
    mirror = Mirror(index)
    index.catch_up()
    calls: list[bool] = []

    def fails(changes: list[SetChange], reset: bool) -> None:
        calls.append(reset)
        if len(calls) == 2:
            raise RuntimeError("a subscriber's bug")

    index.subscribe(fails)
    index.catch_up()
    put(store, TENANTS[0], CIDS[0], None)
    with pytest.raises(RuntimeError):
        index.catch_up()
    assert index.pending() == 1  # the fold was rolled back
    resets = mirror.resets
    index.catch_up()
    assert calls == [True, False, True] and mirror.resets == resets + 1
    mirror.assert_exact(store)
    assert_maintained(store, index)


# --------------------------------------------------------------------------- two connections


def test_two_connections_fold_one_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process's fold (the CLI's ``store digest`` beside a node): the node's index still
    hears of the changes from the rows kept after folding; only when those are gone does it
    reset its subscribers."""
    a, b = Store(tmp_path / "s.db"), Store(tmp_path / "s.db")
    index_a, index_b = SetIndex(a), SetIndex(b)
    mirror_a, mirror_b = Mirror(index_a), Mirror(index_b)
    index_a.catch_up()
    index_b.catch_up()
    assert mirror_a.resets == mirror_b.resets == 1  # a subscriber's first fold builds its state

    put(a, TENANTS[0], CIDS[0], PROTOCOLS[1])
    put(a, TENANTS[1], CIDS[1], None)
    assert index_b.catch_up() == [SetChange(TENANTS[0], PROTOCOLS[1], CIDS[0], 1),
                                  SetChange(TENANTS[1], None, CIDS[1], 1)]
    a.messages.delete(TENANTS[1], CIDS[1])
    # a's index folds the delete and hears of the two puts b folded, without a reset
    assert index_a.catch_up() == [SetChange(TENANTS[0], PROTOCOLS[1], CIDS[0], 1)]
    assert mirror_a.resets == 1
    mirror_a.assert_exact(a)
    index_b.catch_up()
    assert mirror_b.resets == 1
    mirror_b.assert_exact(b)
    assert index_a.digest(TENANTS[0]) == index_b.digest(TENANTS[0]) == SetDigest(1, lthash_digest([CIDS[0]]))

    # rows b folded are pruned before a sees them: a resets
    monkeypatch.setattr(setindex, "JOURNAL_RETAIN", 1)
    for cid in CIDS[2:6]:
        put(b, TENANTS[0], cid, PROTOCOLS[2])
    index_b.catch_up()
    index_a.catch_up()
    assert mirror_a.resets == 2 and mirror_b.resets == 1
    mirror_a.assert_exact(a)
    mirror_b.assert_exact(b)
    assert_maintained(a, index_a)
    assert_maintained(b, index_b)
    a.close()
    b.close()


# --------------------------------------------------------------------------- migration


def downgrade_to_schema_2(store: Store) -> None:
    """What a schema-2 store holds: no journal, no triggers, no digests."""
    conn = store.conn
    for trigger in ("set_journal_insert", "set_journal_delete", "set_journal_update"):
        conn.execute(f"DROP TRIGGER {trigger}")
    conn.execute("DROP TABLE set_journal")
    conn.execute("DROP TABLE set_digests")
    conn.execute("DELETE FROM meta WHERE key IN (?, ?)", (setindex.FLOOR_KEY, setindex.PRUNED_KEY))
    undo_schema_7(conn)
    conn.execute("PRAGMA user_version=2")


def test_a_schema_2_store_gets_its_digests(tmp_path: Path) -> None:
    w = chat_world()
    path = tmp_path / "old.db"
    old = Dwn(Store(path))
    process_all(old, w.tenant, w.ordered())
    downgrade_to_schema_2(old.store)
    want = scan(old.store)
    messages = old.store.messages.count(w.tenant)
    old.close()

    reopened = Store(path)
    assert reopened.scalar("PRAGMA user_version") == SCHEMA_VERSION == 10
    index = SetIndex(reopened)
    assert index.pending() == messages  # every stored message journaled once, folded on first use
    assert index.digest(w.tenant) == SetDigest(*want[(w.tenant, "")])
    assert folded(reopened) == want and index.pending() == 0
    assert index.digests() == {w.tenant: SetDigest(messages, want[(w.tenant, "")][1])}
    # the triggers are in place: a new message is journaled
    dwn = Dwn(reopened)
    extra = w.write("late note", w.bob, "note", b"late")
    assert dwn.process_message(w.tenant, extra.message, b"late").code == 202
    assert_maintained(reopened, index)
    dwn.close()


def test_a_schema_1_store_rebuilt_on_open_gets_its_digests(tmp_path: Path) -> None:
    """Opening a schema-1 store archives its messages and rebuilds the state (deleting and
    storing every message again, canonical.py's adopt): the journal nets that out."""
    w = chat_world()
    path = tmp_path / "older.db"
    old = Dwn(Store(path))
    process_all(old, w.tenant, w.ordered())
    downgrade_to_schema_2(old.store)
    old.store.conn.execute("DROP TABLE archive")
    old.store.conn.execute("DROP TABLE archive_keys")
    old.store.conn.execute("PRAGMA user_version=1")
    want = scan(old.store)
    old.close()
    reopened = Dwn(Store(path))
    assert reopened.history.count(w.tenant) > 0  # adopted
    index = SetIndex(reopened.store)
    assert index.pending() > len(want)  # the rebuild's deletes and puts, journaled
    assert_maintained(reopened.store, index)
    assert scan(reopened.store) == want
    reopened.close()


# --------------------------------------------------------------------------- warps


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
async def test_shuffled_admission_with_warps_keeps_the_digest(seed: int) -> None:
    """A generated multi-writer history admitted in a shuffled order through the closure loop:
    messages that sort before admitted ones warp (undo changesets, then processing again),
    folded at random moments in between. The maintained digest equals a scan all along, and
    at the end equals the digest of a store that processed the history in canonical order."""
    history = generate(seed)
    try:
        tenant = history.tenant
        order = canonical_order(history.steps)
        source = Dwn(Store(":memory:"))
        for step in order:
            source.process_message(tenant, step.message, step.data)
        shuffled = order[:]
        rnd = random.Random(f"setindex:{seed}")
        rnd.shuffle(shuffled)
        replica = Dwn(Store(":memory:"))
        index = SetIndex(replica.store)
        mirror = Mirror(index)
        apply = replica.apply_replicated_message

        def apply_then_fold(*args: Any, **kw: Any) -> Any:
            result = apply(*args, **kw)
            if rnd.random() < 0.5:
                index.catch_up()
            return result

        replica.apply_replicated_message = apply_then_fold  # type: ignore[method-assign]
        await admit_all(replica, tenant, shuffled, source.store)
        assert replica.history.warps > 0
        assert_maintained(replica.store, index)
        mirror.assert_exact(replica.store)
        assert store_digest(replica.store) == store_digest(source.store)
        assert mirror.resets == 1
        replica.close()
        source.close()
    finally:
        history.close()
