"""Carrying out a reconcile plan: ``Peer.fetch_messages`` and ``p2psync repair`` on a real plan.

Three replicas are made by the engine from subsets of one chat story and exported under their
storeIds; the plan comes from the real reconcile on the shared SparkSession. The replica T
lacks part of the chat (a reply and its parent among it), a delete, and a record whose data is
larger than the inline limit, all held by A; and one note held only by C. T is repaired from A
(a real ``Peer`` on 127.0.0.1 port 0): everything A holds arrives, C's note is reported not
found at A, and T then holds exactly what A holds.
"""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from pyspark.sql import SparkSession

from p2psync.cli import main
from p2psync.cli.home import Home
from p2psync.dwn.did import Identity
from p2psync.dwn.engine import Dwn
from p2psync.dwn.store import Store, copy_store_files
from p2psync.peer.peer import Peer
from p2psync.pipeline.export import export_store
from p2psync.pipeline.reconcile import read_repair_items, reconcile
from p2psync.state.copies import store_id
from p2psync.state.digest import store_digest
from tests.peer.support import served
from tests.replication.support import ChatWorld, chat_world, process_all

BIG = 45_000  # above the 30,000-byte inline limit: the data travels by getAttachment
#: Bounded wait for the serving thread to report its port (not a timing assertion).
START_DEADLINE = 30.0

A_STEPS = ["protocol", "thread", "participant", "chat", "reaction", "note", "note-update", "note-delete", "big"]
C_STEPS = ["protocol", "thread", "only-c"]
T_STEPS = ["protocol", "thread", "note"]
#: What T lacks and A holds (note-update is pruned at A by the delete; A never had only-c).
FROM_A = {"participant", "chat", "reaction", "note-delete", "big"}


def build(path: Path, w: ChatWorld, names: list[str]) -> str:
    """A store holding ``names`` (processed in story order); returns its storeId."""
    store = Store(path)
    try:
        process_all(Dwn(store), w.tenant, [s for s in w.ordered() if s.name in names])
        return store_id(store)
    finally:
        store.close()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, spark: SparkSession) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("repair")
    w = chat_world()
    w.write("big", w.bob, "note", bytes(range(256)) * (BIG // 256) + b"!" * (BIG % 256))
    w.write("only-c", w.bob, "note", b"a note only C has")
    ids = {name: build(root / f"{name}.db", w, steps) for name, steps in (("a", A_STEPS), ("c", C_STEPS),
                                                                          ("t", T_STEPS))}
    for name in ids:
        export_store(root / f"{name}.db", root / f"{name}-export")  # replica id: the storeId
    plan = root / "plan"
    reconcile(spark, [root / f"{n}-export" for n in ids], plan)
    return {"root": root, "w": w, "ids": ids, "plan": plan}


def fresh_t(world: dict[str, Any], tmp_path: Path) -> Path:
    """A byte copy of T as exported (same storeId, so the plan's rows for T are its rows)."""
    path = tmp_path / "t.db"
    copy_store_files(world["root"] / "t.db", path)
    return path


def names(w: ChatWorld, cids: Any) -> set[str]:
    by_cid = {s.cid: n for n, s in w.steps.items()}
    return {by_cid[c] for c in cids}


async def test_repair_from_the_plan_makes_the_replica_equal_to_its_source(
    world: dict[str, Any], tmp_path: Path
) -> None:
    w: ChatWorld = world["w"]
    items = read_repair_items(world["plan"], world["ids"]["t"])
    assert names(w, (i.message_cid for i in items)) == FROM_A | {"only-c"}
    a, t = Store(world["root"] / "a.db"), Store(fresh_t(world, tmp_path))
    try:
        async with served(Peer(a, w.alice)) as url:
            summary = await Peer(t, w.alice).fetch_messages(url, tenant=w.tenant, cids=items)
            again = await Peer(t, w.alice).fetch_messages(url, tenant=w.tenant, cids=items)
        statuses = {o.cid: o.status for o in summary.outcomes}
        assert names(w, [c for c, s in statuses.items() if s == "applied"]) == FROM_A
        assert [(o.status, o.code) for o in summary.outcomes if o.cid == w.steps["only-c"].cid] == [
            ("not_found", "MessageNotFound")
        ]
        assert summary.stats.attachments_fetched == 1  # the big record's data
        assert store_digest(t, w.tenant) == store_digest(a, w.tenant)
        big = w.steps["big"].message
        assert t.data.get(w.tenant, big["recordId"], big["descriptor"]["dataCid"]) == w.steps["big"].data
        # Twice: nothing applied, C's note still not found at A.
        assert again.counts() == {"present": len(FROM_A), "not_found": 1} and again.stored == 0
    finally:
        a.close()
        t.close()


@contextmanager
def serving(store_path: Path, identity: Identity) -> Iterator[str]:
    """A real Peer on 127.0.0.1 port 0 in a thread of its own (the CLI runs its own trio loop)."""
    ready: queue.Queue[tuple[int, trio.lowlevel.TrioToken, trio.CancelScope] | BaseException] = queue.Queue()

    async def serve() -> None:
        store = Store(store_path)
        try:
            with trio.CancelScope() as scope:
                async with trio.open_nursery() as nursery:
                    server = await nursery.start(Peer(store, identity).serve, "127.0.0.1", 0)
                    ready.put((server.port, trio.lowlevel.current_trio_token(), scope))
        finally:
            store.close()

    def run() -> None:
        try:
            trio.run(serve)
        except BaseException as exc:  # reported to the test, which would otherwise wait
            ready.put(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    got = ready.get(timeout=START_DEADLINE)
    if isinstance(got, BaseException):
        raise got
    port, token, scope = got
    try:
        yield f"ws://127.0.0.1:{port}/_p2psync"
    finally:
        trio.from_thread.run_sync(scope.cancel, trio_token=token)
        thread.join(START_DEADLINE)


def test_cli_repair(world: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    w: ChatWorld = world["w"]
    home = tmp_path / "home"
    Home(home).init(w.alice)  # the node repairing is the tenant's own
    t_path = fresh_t(world, tmp_path)
    plan = str(world["plan"])
    base = ["--home", str(home), "repair", "--plan", plan, "--store", str(t_path)]
    with serving(world["root"] / "a.db", w.alice) as url:
        # Every row for T (any source): C's note is not at A, so the exit code says incomplete.
        code = main([*base, "--peer", url, "--json", "--progress"])
        out, err = capsys.readouterr()
        assert code == 3, err
        report = json.loads(out)
        assert report["replica"] == world["ids"]["t"]  # the store's storeId, as export named it
        assert report["counts"] == {"applied": len(FROM_A), "not_found": 1}
        assert report["reasons"] == {"not_found MessageNotFound": 1}
        assert "p2psync: 1 message(s) not repaired: 1 not_found MessageNotFound" in err
        assert "repair: 100%" in err and f"{len(FROM_A) + 1}/{len(FROM_A) + 1}" in err  # the progress bar
        # Only the rows A is the source of: all held now, nothing fetched, exit 0.
        code = main([*base, "--peer", url, "--source", world["ids"]["a"]])
        out, err = capsys.readouterr()
        assert code == 0, err
        assert f"tenant {w.tenant}: {len(FROM_A)} message(s): {len(FROM_A)} present" in out
        # A replica the plan does not know: one line, exit 1.
        code = main([*base, "--peer", url, "--replica", "nobody"])
        out, err = capsys.readouterr()
        assert code == 1 and err.startswith("p2psync: ReplicaNotInPlan: replica nobody") and err.count("\n") == 1
    t = Store(t_path)
    a = Store(world["root"] / "a.db")
    try:
        assert store_digest(t, w.tenant) == store_digest(a, w.tenant)
    finally:
        t.close()
        a.close()
    # The peer is gone: one line, exit 1.
    code = main([*base, "--peer", url])
    _, err = capsys.readouterr()
    assert code == 1 and err.startswith("p2psync: cannot connect to ") and err.count("\n") == 1

