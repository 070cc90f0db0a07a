"""Scenarios authored by p2psync itself: the reverse direction of the interop check.

Every message here is built and signed by our own code (``RecordsWrite.create``,
``ProtocolsConfigure.create``, ``create_grant``, …); run through the reference harness, each
step must get the code written beside it, with the same CIDs our engine computes. Keys
derive from persona names and timestamps from a logical clock, so the files regenerate
byte-identical:

    python -m p2psync.conformance author --out interop/scenarios
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from p2psync.conformance.scenario import b64url_encode, expand_data_gen
from p2psync.dwn import permissions
from p2psync.dwn.did import Identity
from p2psync.dwn.encoding import message_cid
from p2psync.dwn.engine import Dwn
from p2psync.dwn.permission_grant import PermissionGrant
from p2psync.dwn.pipe import PipeSession
from p2psync.dwn.protocols import ProtocolsConfigure, ProtocolsQuery
from p2psync.dwn.records import create_records_delete, create_records_query, create_records_read
from p2psync.dwn.records_write import RecordsWrite
from p2psync.dwn.store import Store
from p2psync.dwn.timeutil import add_seconds

FORMAT = "p2psync-interop-scenario/1"
CLOCK_START = "2024-06-01T00:00:00.000000Z"
# Data larger than this travels as a dataGen spec, not inline, to keep the files small.
INLINE_DATA_LIMIT = 4096

Message = dict[str, Any]


def persona(name: str, method: str = "key", algorithm: str = "Ed25519") -> Identity:
    """A deterministic identity: the key (an Ed25519 seed, or an EC scalar for ``algorithm``
    secp256k1 or P-256) is sha256 of the persona's name."""
    return Identity.from_private_bytes(hashlib.sha256(f"p2psync-persona:{name}".encode()).digest(), method,
                                       algorithm)


class Builder:
    """Accumulates the steps of one scenario, with a logical clock for message timestamps."""

    def __init__(self, name: str, description: str, tags: list[str]) -> None:
        self.name, self.description, self.tags = name, description, tags
        self.steps: list[dict[str, Any]] = []
        self.personas: dict[str, dict[str, str]] = {}
        self._now = CLOCK_START
        self._seed = 0

    def who(self, name: str, method: str = "key", algorithm: str = "Ed25519") -> Identity:
        ident = persona(name, method, algorithm)
        self.personas[name] = {"did": ident.did, "method": f"did:{method}"}
        if algorithm != "Ed25519":
            self.personas[name]["algorithm"] = algorithm
        return ident

    def tick(self, seconds: int = 1) -> str:
        self._now = add_seconds(self._now, seconds)
        return self._now

    def data(self, size: int) -> tuple[bytes, dict[str, Any]]:
        """Deterministic data of ``size`` bytes and how a step carries it."""
        self._seed += 1
        raw = expand_data_gen(size, self._seed)
        if size <= INLINE_DATA_LIMIT:
            return raw, {"data": b64url_encode(raw)}
        return raw, {"dataGen": {"size": size, "seed": self._seed}}

    def step(self, tenant: Identity, message: Message, code: int, note: str, *, op: str = "process",
             carry: dict[str, Any] | None = None) -> None:
        step: dict[str, Any] = {"op": op, "tenant": tenant.did, "message": message}
        step.update(carry or {})
        step["expect"] = {"code": code, "cid": message_cid(message)}
        step["note"] = note
        self.steps.append(step)

    def doc(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "name": self.name,
            "description": self.description,
            "reference": "@tbd54566975/dwn-sdk-js@0.5.2",
            "authoredBy": "p2psync",
            "tags": self.tags,
            "personas": self.personas,
            "steps": self.steps,
        }


def _write(b: Builder, signer: Identity, size: int, **kw: Any) -> tuple[RecordsWrite, bytes, dict[str, Any]]:
    data, carry = b.data(size)
    ts = b.tick()
    kw.setdefault("data_format", "application/octet-stream")
    if kw.get("published"):
        kw.setdefault("date_published", ts)  # never the wall clock: files must regenerate identically
    w = RecordsWrite.create(signer=signer, data=data, message_timestamp=ts, date_created=ts, **kw)
    return w, data, carry


def records_lifecycle() -> dict[str, Any]:
    b = Builder("p2psync-authored-records", "Records authored by p2psync: sizes across the inline and "
                "chunking limits, both DID methods, updates, reads, queries, deletes.", ["records", "p2psync-authored"])
    alice, bob = b.who("alice", "key"), b.who("bob", "jwk")
    written = []
    for size in (0, 1, 30_000, 30_001, 262_144, 262_145, 1_048_576):
        w, _, carry = _write(b, alice, size, schema="https://p2psync.example/schemas/blob")
        b.step(alice, w.message, 202, f"initial write of {size} bytes", carry=carry)
        written.append(w)
    for w in written[:3]:
        read = create_records_read(signer=alice, filter={"recordId": w.record_id}, message_timestamp=b.tick())
        b.step(alice, read, 200, "owner reads it back")
    query = create_records_query(signer=alice, filter={"schema": "https://p2psync.example/schemas/blob"},
                                 date_sort="createdDescending", message_timestamp=b.tick())
    b.step(alice, query, 200, "owner queries all, newest first", op="query")
    # A did:jwk author writing to its own DWN, then an update and a stale update.
    w, _, carry = _write(b, bob, 100, data_format="text/plain", published=True)
    b.step(bob, w.message, 202, "did:jwk author, own DWN", carry=carry)
    data2, carry2 = b.data(64)
    newer = RecordsWrite.create_from(w.message, signer=bob, data=data2, message_timestamp=b.tick(2))
    stale = RecordsWrite.create_from(w.message, signer=bob, data=data2, message_timestamp=b.tick(-1))
    b.step(bob, newer.message, 202, "newer update wins", carry=carry2)
    b.step(bob, stale.message, 409, "older update conflicts", carry=carry2)
    b.step(bob, newer.message, 409, "replay conflicts", carry=carry2)
    read = create_records_read(filter={"recordId": w.record_id}, message_timestamp=b.tick(3))
    b.step(bob, read, 200, "anyone reads a published record")
    # Without data: 204, then the same with data conflicts.
    w, data, carry = _write(b, alice, 500)
    b.step(alice, w.message, 204, "initial write without data")
    b.step(alice, w.message, 409, "same message with its data", carry=carry)
    # Deletes.
    target = written[1]
    delete = create_records_delete(record_id=target.record_id, signer=alice, message_timestamp=b.tick())
    b.step(alice, delete, 202, "owner deletes")
    b.step(alice, delete, 404, "replayed delete")
    read = create_records_read(signer=alice, filter={"recordId": target.record_id}, message_timestamp=b.tick())
    b.step(alice, read, 404, "deleted record reads 404")
    # Someone else may not write into alice's DWN without a protocol or grant.
    w, _, carry = _write(b, bob, 10)
    b.step(alice, w.message, 401, "foreign author, no protocol", carry=carry)
    return b.doc()


CHAT_PROTOCOL: dict[str, Any] = {
    "protocol": "https://p2psync.example/protocols/chat",
    "published": True,
    "types": {
        "thread": {"schema": "https://p2psync.example/schemas/thread", "dataFormats": ["application/json"]},
        "participant": {"schema": "https://p2psync.example/schemas/participant", "dataFormats": ["application/json"]},
        "message": {"schema": "https://p2psync.example/schemas/message", "dataFormats": ["application/json"]},
    },
    "structure": {
        "thread": {
            "$actions": [{"who": "anyone", "can": ["create"]}],
            "participant": {
                "$role": True,
                "$actions": [{"who": "author", "of": "thread", "can": ["create"]}],
            },
            "message": {
                "$size": {"max": 1000},
                "$tags": {"$requiredTags": ["lang"], "lang": {"type": "string", "enum": ["en", "fr"]}},
                "$actions": [
                    {"role": "thread/participant", "can": ["create", "read", "query", "subscribe"]},
                    {"who": "author", "of": "thread", "can": ["read"]},
                ],
            },
        }
    },
}


def protocols_and_roles() -> dict[str, Any]:
    b = Builder("p2psync-authored-protocols", "A chat protocol configured by p2psync, with a context role, "
                "$size, $tags and $actions, exercised by records p2psync authored.", ["protocols", "p2psync-authored"])
    alice, bob, carol = b.who("alice"), b.who("bob", "jwk"), b.who("carol")
    proto = CHAT_PROTOCOL["protocol"]
    configure = ProtocolsConfigure.create(definition=CHAT_PROTOCOL, signer=alice, message_timestamp=b.tick()).message
    b.step(alice, configure, 202, "owner installs the chat protocol")
    query = ProtocolsQuery.create(filter={"protocol": proto}, message_timestamp=b.tick()).message
    b.step(alice, query, 200, "anyone queries the published protocol", op="query")

    def json_data(value: Any) -> tuple[bytes, dict[str, Any]]:
        raw = json.dumps(value).encode()
        return raw, {"data": b64url_encode(raw)}

    raw, carry = json_data({"title": "field trip"})
    ts = b.tick()
    thread = RecordsWrite.create(signer=bob, data=raw, data_format="application/json", protocol=proto,
                                 protocol_path="thread", schema="https://p2psync.example/schemas/thread",
                                 message_timestamp=ts, date_created=ts)
    b.step(alice, thread.message, 202, "anyone may start a thread", carry=carry)
    raw, carry = json_data({"who": "carol"})
    ts = b.tick()
    role = RecordsWrite.create(signer=bob, data=raw, data_format="application/json", protocol=proto,
                               protocol_path="thread/participant", schema="https://p2psync.example/schemas/participant",
                               parent_context_id=thread.message["contextId"], recipient=carol.did,
                               message_timestamp=ts, date_created=ts)
    b.step(alice, role.message, 202, "thread author adds carol as participant (role record)", carry=carry)
    ts = b.tick()
    no_recipient = RecordsWrite.create(signer=bob, data=raw, data_format="application/json", protocol=proto,
                                       protocol_path="thread/participant",
                                       schema="https://p2psync.example/schemas/participant",
                                       parent_context_id=thread.message["contextId"], message_timestamp=ts,
                                       date_created=ts)
    b.step(alice, no_recipient.message, 400, "a role record needs a recipient", carry=carry)

    def chat(signer: Identity, text: str, lang: str = "en", role_path: str | None = "thread/participant",
             pad: int = 0) -> tuple[RecordsWrite, dict[str, Any]]:
        raw, carry = json_data({"text": text, "pad": "x" * pad})
        ts = b.tick()
        w = RecordsWrite.create(signer=signer, data=raw, data_format="application/json", protocol=proto,
                                protocol_path="thread/message", schema="https://p2psync.example/schemas/message",
                                parent_context_id=thread.message["contextId"], tags={"lang": lang},
                                protocol_role=role_path, message_timestamp=ts, date_created=ts)
        return w, carry

    w, carry = chat(carol, "hello")
    b.step(alice, w.message, 202, "participant writes with the role", carry=carry)
    w2, carry2 = chat(carol, "bonjour", lang="de")
    b.step(alice, w2.message, 400, "tag outside its enum", carry=carry2)
    w3, carry3 = chat(carol, "long", pad=2000)
    b.step(alice, w3.message, 400, "$size max exceeded", carry=carry3)
    w4, carry4 = chat(bob, "not a participant")
    b.step(alice, w4.message, 401, "thread author is not a participant: role refused", carry=carry4)
    w5, carry5 = chat(alice, "owner bypasses $actions", role_path=None)
    b.step(alice, w5.message, 202, "tenant skips $actions", carry=carry5)
    w6, carry6 = chat(alice, "but not structure", lang="xx", role_path=None)
    b.step(alice, w6.message, 400, "tenant still meets $tags", carry=carry6)
    read = create_records_read(signer=carol, filter={"recordId": w.record_id}, protocol_role="thread/participant",
                               message_timestamp=b.tick())
    b.step(alice, read, 200, "participant reads a message")
    read = create_records_read(signer=bob, filter={"recordId": w.record_id}, message_timestamp=b.tick())
    b.step(alice, read, 200, "thread author reads a message ($actions author of thread)")
    query = create_records_query(signer=carol, filter={"protocol": proto, "protocolPath": "thread/message",
                                                       "contextId": thread.message["contextId"]},
                                 protocol_role="thread/participant", message_timestamp=b.tick())
    b.step(alice, query, 200, "participant queries the thread's messages", op="query")
    stranger = b.who("dave")
    read = create_records_read(signer=stranger, filter={"recordId": w.record_id}, message_timestamp=b.tick())
    b.step(alice, read, 401, "a stranger reads nothing")
    return b.doc()


def grants() -> dict[str, Any]:
    b = Builder("p2psync-authored-grants", "Permission grants, their use and revocation, authored by p2psync.",
                ["permissions", "p2psync-authored"])
    alice, bob = b.who("alice"), b.who("bob", "jwk")
    proto = "https://p2psync.example/protocols/notes"
    configure = ProtocolsConfigure.create(definition={
        "protocol": proto, "published": False,
        "types": {"note": {"dataFormats": ["text/plain"]}},
        "structure": {"note": {}},
    }, signer=alice, message_timestamp=b.tick()).message
    b.step(alice, configure, 202, "owner installs a private notes protocol")
    granted = b.tick()
    grant, grant_data = permissions.create_grant(
        signer=alice, granted_to=bob.did, date_granted=granted, date_expires=add_seconds(granted, 3600),
        scope={"interface": "Records", "method": "Write", "protocol": proto})
    b.step(alice, grant.message, 202, "alice grants bob Records/Write on notes",
           carry={"data": b64url_encode(grant_data)})
    read_grant, read_grant_data = permissions.create_grant(
        signer=alice, granted_to=bob.did, date_granted=b.tick(), date_expires=add_seconds(granted, 3600),
        scope={"interface": "Records", "method": "Read", "protocol": proto})
    b.step(alice, read_grant.message, 202, "alice grants bob Records/Read on notes",
           carry={"data": b64url_encode(read_grant_data)})

    def note(text: str, grant_id: str | None) -> tuple[RecordsWrite, dict[str, Any]]:
        raw = text.encode()
        ts = b.tick()
        w = RecordsWrite.create(signer=bob, data=raw, data_format="text/plain", protocol=proto, protocol_path="note",
                                permission_grant_id=grant_id, message_timestamp=ts, date_created=ts)
        return w, {"data": b64url_encode(raw)}

    w, carry = note("with grant", grant.record_id)
    b.step(alice, w.message, 202, "bob writes under the grant", carry=carry)
    w_no, carry_no = note("without grant", None)
    b.step(alice, w_no.message, 401, "bob without the grant", carry=carry_no)
    w_wrong, carry_wrong = note("wrong grant", read_grant.record_id)
    b.step(alice, w_wrong.message, 401, "a Read grant does not authorize a write", carry=carry_wrong)
    read = create_records_read(signer=bob, filter={"recordId": w.record_id},
                               permission_grant_id=read_grant.record_id, message_timestamp=b.tick())
    b.step(alice, read, 200, "bob reads with the read grant")
    signed_before = note("signed before revocation", grant.record_id)
    revocation, revocation_data = permissions.create_revocation(
        signer=alice, grant=PermissionGrant.parse(permissions.with_encoded_data(grant.message, grant_data)),
        date_revoked=b.tick())
    b.step(alice, revocation.message, 202, "alice revokes the write grant",
           carry={"data": b64url_encode(revocation_data)})
    b.step(alice, signed_before[0].message, 202, "a write signed before the revocation still counts",
           carry=signed_before[1])
    after, carry_after = note("signed after revocation", grant.record_id)
    b.step(alice, after.message, 401, "a write signed after the revocation is refused", carry=carry_after)
    return b.doc()


def ecdsa_signers() -> dict[str, Any]:
    b = Builder("p2psync-authored-ecdsa", "Messages signed with ECDSA by p2psync: secp256k1 (ES256K) under "
                "did:key and did:jwk, P-256 (ES256) under did:jwk; owners, a protocol's anyone-can-create, a "
                "foreign author refused, a signature moved to another signer's message refused.",
                ["records", "protocols", "signatures", "p2psync-authored"])
    carol = b.who("carol-k1", "key", "secp256k1")
    dave = b.who("dave-k1", "jwk", "secp256k1")
    erin = b.who("erin-p256", "jwk", "P-256")
    written = []
    for signer, size in ((carol, 0), (carol, 100), (carol, 31_000), (dave, 10), (erin, 2_000)):
        w, _, carry = _write(b, signer, size, schema="https://p2psync.example/schemas/ecdsa")
        b.step(signer, w.message, 202, f"{signer.algorithm} {signer.did[:7]} owner writes {size} bytes", carry=carry)
        written.append(w)
    data2, carry2 = b.data(50)
    update = RecordsWrite.create_from(written[4].message, signer=erin, data=data2, message_timestamp=b.tick())
    b.step(erin, update.message, 202, "P-256 owner updates its record", carry=carry2)
    read = create_records_read(signer=carol, filter={"recordId": written[1].record_id}, message_timestamp=b.tick())
    b.step(carol, read, 200, "secp256k1 did:key owner reads it back")
    query = create_records_query(signer=dave, filter={"schema": "https://p2psync.example/schemas/ecdsa"},
                                 message_timestamp=b.tick())
    b.step(dave, query, 200, "secp256k1 did:jwk owner queries", op="query")
    delete = create_records_delete(record_id=written[0].record_id, signer=carol, message_timestamp=b.tick())
    b.step(carol, delete, 202, "secp256k1 owner deletes its 0-byte record")
    w, _, carry = _write(b, erin, 10)
    b.step(carol, w.message, 401, "a P-256 author may not write into carol's DWN without a protocol", carry=carry)
    configure = ProtocolsConfigure.create(definition=CHAT_PROTOCOL, signer=carol, message_timestamp=b.tick()).message
    b.step(carol, configure, 202, "secp256k1 owner installs the chat protocol")
    raw = json.dumps({"title": "curves"}).encode()
    ts = b.tick()
    thread = RecordsWrite.create(signer=erin, data=raw, data_format="application/json",
                                 protocol=CHAT_PROTOCOL["protocol"], protocol_path="thread",
                                 schema="https://p2psync.example/schemas/thread", message_timestamp=ts, date_created=ts)
    b.step(carol, thread.message, 202, "a P-256 author starts a thread (anyone may)",
           carry={"data": b64url_encode(raw)})
    # dave's signature on carol's message: the kid still names carol's key, the signature is dave's.
    w, _, carry = _write(b, carol, 20)
    forged = json.loads(json.dumps(w.message))
    theirs = RecordsWrite.create(signer=dave, data=b"x", message_timestamp=b.tick(), date_created=b.tick(0))
    forged["authorization"]["signature"]["signatures"][0]["signature"] = (
        theirs.message["authorization"]["signature"]["signatures"][0]["signature"])
    b.step(carol, forged, 401, "another signer's signature under carol's kid", carry=carry)
    return b.doc()


BUILDERS: list[Callable[[], dict[str, Any]]] = [records_lifecycle, protocols_and_roles, grants, ecdsa_signers]


def record_engine_answers(doc: dict[str, Any]) -> None:
    """Fill each step's ``expect`` with what our engine answers (data hashes, query entries).

    The code written beside each step is what its author claims; the engine must agree, or
    the scenario is not written. The reference is then held to the same answers by the suite.
    """
    with tempfile.TemporaryDirectory() as tmp:
        dwn = Dwn(Store(Path(tmp) / "author.db"))
        session = PipeSession(dwn)
        try:
            for i, step in enumerate(doc["steps"]):
                request = {k: step[k] for k in ("op", "tenant", "message")}
                if "data" in step:
                    request["data"] = step["data"]
                elif "dataGen" in step:
                    request["data"] = b64url_encode(expand_data_gen(**step["dataGen"]))
                reply = session.handle_line(json.dumps(request))
                expect = step["expect"]
                if reply["status"]["code"] != expect["code"]:
                    raise AssertionError(
                        f"{doc['name']} step {i} ({step['note']}): claimed {expect['code']}, "
                        f"engine answered {reply['status']}"
                    )
                for key in ("data_sha256", "entries"):
                    if key in reply:
                        expect[key] = reply[key]
        finally:
            dwn.close()


def write_scenarios(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for build in BUILDERS:
        doc = build()
        record_engine_answers(doc)
        path = out / f"{doc['name']}.json"
        path.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
        paths.append(path)
    return paths
