"""The simulator judges scoped peers by the scope rules restated from the spec
(:func:`p2psync.sim.check.in_intent`, :func:`~p2psync.sim.check.listed_without_roles`), not by
the code under test (:meth:`SyncScope.matches`, :meth:`SyncScope.lists`), so a slip in that code
cannot shrink what the judge expects along with what is sent. The two must still agree: a
difference is a slip on one side, found here on generated scopes and messages rather than by a
seed that happens to write the right message.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from p2psync.dwn.encoding import message_cid
from p2psync.dwn.permissions import PERMISSIONS_PROTOCOL_URI
from p2psync.replication.scope import ListingFacts, SyncScope
from p2psync.sim.check import in_intent, listed_without_roles
from p2psync.sim.writers import CHAT

OTHER = "http://other.example/protocol"
PATHS = ["thread", "thread/chat", "thread/chat/reaction", "thread/participant", "member", "threads"]
_A, _B, _C = (message_cid({"n": i}) for i in range(3))
CONTEXTS = [_A, f"{_A}/{_B}", f"{_A}/{_B}/{_C}", _B, f"{_B}/{_A}"]


@st.composite
def _scopes(draw: st.DrawFn) -> SyncScope:
    kind = draw(st.sampled_from(["global", "protocol", "subset"]))
    if kind == "global":
        return SyncScope.global_scope()
    protocol = draw(st.sampled_from([CHAT, PERMISSIONS_PROTOCOL_URI]))
    if kind == "protocol":
        return SyncScope.for_protocol(protocol)
    paths = draw(st.lists(st.sampled_from(PATHS), max_size=3))
    contexts = draw(st.lists(st.sampled_from(CONTEXTS), max_size=2))
    return SyncScope.subset(protocol, paths, contexts)


@st.composite
def _indexes(draw: st.DrawFn) -> dict[str, Any]:
    """Index key-values as a store logs them (a delete's are its record's): a record of a
    protocol always has a protocolPath."""
    interface, method = draw(st.sampled_from([("Records", "Write"), ("Records", "Delete"), ("Protocols", "Configure"),
                                              ("Messages", "Query"), ("Records", "Query")]))
    out: dict[str, Any] = {"interface": interface, "method": method}
    protocol = draw(st.sampled_from([CHAT, OTHER, PERMISSIONS_PROTOCOL_URI, None]))
    if protocol is not None:
        out["protocol"] = protocol
    if interface == "Records" and protocol is not None:  # a protocol's record has a path, and a context
        out["protocolPath"] = draw(st.sampled_from(PATHS))
        context = draw(st.sampled_from([*CONTEXTS, None]))
        if context is not None:
            out["contextId"] = context
    return out


@settings(max_examples=3000, deadline=None)
@given(_scopes(), _indexes())
def test_the_judges_rules_agree_with_the_code(scope: SyncScope, indexes: dict[str, Any]) -> None:
    assert in_intent(scope, indexes) == scope.matches(indexes), (scope, indexes)
    assert listed_without_roles(scope, indexes) == scope.lists(ListingFacts.of(indexes)), (scope, indexes)


def test_the_judge_expects_what_only_the_spec_lists() -> None:
    """Each rule of the effective listing has a message only it lists, so a rule dropped on
    either side shows up above."""
    subset = SyncScope.subset(CHAT, ["thread/chat"], [_A])
    delete_of_thread = {"interface": "Records", "method": "Delete", "protocol": CHAT, "protocolPath": "thread",
                        "contextId": _A}
    grant = {"interface": "Records", "method": "Write", "protocol": PERMISSIONS_PROTOCOL_URI,
             "protocolPath": "grant", "contextId": _B}
    configure = {"interface": "Protocols", "method": "Configure", "protocol": CHAT}
    for rule in (delete_of_thread, grant, configure):
        assert not in_intent(subset, rule) and listed_without_roles(subset, rule), rule
    not_listed = {**delete_of_thread, "method": "Write"}
    assert not listed_without_roles(subset, not_listed)
