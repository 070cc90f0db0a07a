"""A tenant's row id is cached by the store; a tenant made inside a transaction that rolls back
(a refused message's savepoint, a failed group commit) must not leave a cached id that no row
has any more, or every later write of that tenant fails its foreign key."""

from __future__ import annotations

from pathlib import Path

import pytest

from p2psync.dwn.engine import Dwn
from p2psync.dwn.store import Store
from tests.replication.support import chat_world


class Abandoned(Exception):
    pass


def test_the_committers_rollback_forgets_a_tenant_made_in_its_batch(tmp_path: Path) -> None:
    w = chat_world()
    replica = Dwn(Store(tmp_path / "replica.db"))
    replica.store.conn.execute("BEGIN IMMEDIATE")  # how the group committer opens a batch
    for step in w.ordered():
        replica.apply_replicated_message(w.tenant, step.message, step.data)
    replica.store.rollback()  # its COMMIT failed
    assert replica.store.tenant_id(w.tenant, create=False) is None
    for step in w.ordered():
        replica.apply_replicated_message(w.tenant, step.message, step.data)
    assert replica.store.conn.execute("SELECT count(*) FROM messages").fetchone()[0] > 0


@pytest.mark.parametrize("nested", [False, True], ids=["transaction", "savepoint"])
def test_a_tenant_made_in_a_rolled_back_transaction_is_not_remembered(tmp_path: Path, nested: bool) -> None:
    w = chat_world()
    replica = Dwn(Store(tmp_path / "replica.db"))
    first = w.ordered()[0]
    with replica.store.transaction():
        replica.store.conn.execute("SELECT 1")  # the outer transaction is open either way
        try:
            if nested:
                with replica.store.transaction():  # a savepoint: the handler's own scope
                    replica.apply_replicated_message(w.tenant, first.message, first.data)
                    raise Abandoned
            else:
                raise Abandoned
        except Abandoned:
            pass
    if not nested:
        # The whole transaction goes: what a failed group commit does.
        with pytest.raises(Abandoned), replica.store.transaction():
            replica.apply_replicated_message(w.tenant, first.message, first.data)
            raise Abandoned
    assert replica.store.tenant_id(w.tenant, create=False) is None
    for step in w.ordered():
        replica.apply_replicated_message(w.tenant, step.message, step.data)
    assert replica.store.tenant_id(w.tenant, create=False) is not None
    held = replica.store.conn.execute("SELECT count(*) FROM messages").fetchone()[0]
    assert held > 0
