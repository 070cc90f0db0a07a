"""No request makes the protocol object raise: every one is answered (a reply or a refusal).

Hypothesis throws arbitrary profiles, properties and bodies (random bytes, and CBOR maps of
plausible shapes) at a passive ReplicationProtocol after a real hello; each must end as a
SendReply or a SendError with a 4xx/5xx code, and the store must stay as it was.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import cbor2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from p2psync.replication.effects import SendError, SendReply
from p2psync.replication.protocol import ALL_PROFILES
from p2psync.replication.scope import SyncScope
from tests.replication.test_protocol_pump import ALICE, Side, Wire, greeted_pair, run

PROFILES = st.sampled_from([*ALL_PROFILES, "bogus", ""])
TEXT = st.text(max_size=12)
PROPERTY_VALUES = st.one_of(TEXT, st.sampled_from(["0", "1", "7", "true", "false", "-1", "01", "99999999999999999999"]))
PROPERTIES = st.dictionaries(st.sampled_from(["collection", "position", "messageCid", "dataCid", "batch",
                                              "continuous", "rev", "error"]), PROPERTY_VALUES, max_size=5)
CBOR_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**64), 2**64), TEXT, st.binary(max_size=40)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(
        st.sampled_from(["collections", "tenant", "scope", "checkpointId", "grants", "since", "items", "streamId",
                         "epoch", "through", "refs", "nonce", "message", "data", "dataSize", "pull", "push",
                         "version", "did", "storeId"]), inner, max_size=5)),
    max_leaves=12,
)
BODIES = st.one_of(st.binary(max_size=64), CBOR_VALUES.map(lambda v: cbor2.dumps(v)))


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Wire, Side, Side, int]:
    tmp_path: Path = tmp_path_factory.mktemp("hostile")
    wire, laptop, phone = greeted_pair(tmp_path, 6, 7)
    index, _ = run(wire, phone.proto.open_collection(ALICE.did, SyncScope.global_scope(), "cp-hostile"))
    count = laptop.store.scalar("SELECT COUNT(*) FROM messages")
    return wire, laptop, phone, int(count)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(profile=PROFILES, properties=PROPERTIES, body=BODIES)
def test_every_request_is_answered_and_nothing_raises(
    pair: tuple[Wire, Side, Side, int], profile: str, properties: dict[str, str], body: bytes
) -> None:
    wire, laptop, _, count = pair
    answers: list[Any] = []
    wire.rids += 1
    rid = wire.rids
    laptop.proto.receive_request(rid, profile, properties, body)
    while outputs := laptop.proto.outputs():
        for out in outputs:
            if isinstance(out, SendReply | SendError) and out.rid == rid:
                answers.append(out)
            elif hasattr(out, "request"):
                wire.store(laptop, out)  # type: ignore[arg-type]
    # A feed the request started may still want to talk to the phone: let the pair settle.
    wire.pump()
    if profile == "norev":
        assert answers == [] or all(isinstance(a, SendError) for a in answers)
        return
    assert len(answers) == 1, (profile, properties, body)
    answer = answers[0]
    if isinstance(answer, SendError):
        assert 400 <= answer.error.code < 600 and answer.error.code != 500, answer.error
    assert laptop.store.scalar("SELECT COUNT(*) FROM messages") == count
