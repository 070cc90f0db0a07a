"""The hello's optional ``listen`` member (replication-profiles.md §3): where the sender's node
serves, so that a node it dials can prompt it when that node comes back."""

from __future__ import annotations

from typing import Any

import pytest

from p2psync.replication.hello import Hello, new_hello
from p2psync.replication.wire import PeerError

DID = "did:key:z6MkiDzSfpZLNed5MPwASSP6u15AXtXaM9yu6uR6ZwTk8P5t"
STORE = "6b1f0c3a-52d4-4e8b-a1c7-3d9e2f4b5a60"


def test_listen_round_trips_and_is_absent_by_default() -> None:
    hello = new_hello(DID, STORE, "p2psync/test", (4984, True))
    wire = hello.to_wire()
    assert wire["listen"] == {"port": 4984, "tls": True}
    assert Hello.from_wire(wire) == hello
    plain = new_hello(DID, STORE)
    assert "listen" not in plain.to_wire() and Hello.from_wire(plain.to_wire()).listen is None


@pytest.mark.parametrize("listen", [4984, {"port": 0, "tls": True}, {"port": 70000, "tls": False},
                                    {"port": "4984", "tls": True}, {"port": 4984}, {"port": True, "tls": True}])
def test_a_malformed_listen_is_hello_invalid(listen: Any) -> None:
    wire = new_hello(DID, STORE).to_wire()
    wire["listen"] = listen
    with pytest.raises(PeerError) as refused:
        Hello.from_wire(wire)
    assert (refused.value.code, refused.value.name) == (400, "HelloInvalid")
