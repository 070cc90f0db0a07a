"""The writers: users acting on one device (peer) of the tenant, locally, with ``process_message``.

``basic`` ops create notes and update records the device holds. ``full`` adds what makes
replicated apply order-dependent (docs/replication-apply.md): a chat protocol configured and
re-configured, threads and participant roles, chats written under a role, deletes and prunes,
permission grants, writes under a grant and revocations — authored by the tenant (alice) and
two other users (bob, carol) whose messages land in alice's DWN.

Every message a device accepts (202/204) is remembered as :class:`Authored`: the union of
those is what the canonical state is computed from.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any, Final

from p2psync.dwn import permissions
from p2psync.dwn.did import Identity
from p2psync.dwn.encoding import message_cid
from p2psync.dwn.permission_grant import PermissionGrant
from p2psync.dwn.protocols import ProtocolsConfigure
from p2psync.dwn.records import create_records_delete
from p2psync.dwn.records_write import RecordsWrite
from p2psync.dwn.timeutil import add_seconds
from p2psync.replication.wire import INLINE_DATA_MAX
from p2psync.sim.world import SimPeer, seeded_identity

__all__ = ["OPS", "Authored", "Cast", "Writer"]

OPS: Final = ("basic", "full")
NOTE: Final = "https://p2psync.example/sim/note"
CHAT: Final = "https://p2psync.example/sim/chat"
#: One write in this many carries data above the inline limit (fetched with getAttachment).
LARGE_DATA_ONE_IN: Final = 25


def chat_definition(version: int, member: bool | None = None) -> dict[str, Any]:
    """The chat protocol; version 2 narrows who may write notes (a protocol change).

    ``member`` (the ``--scopes mixed`` writers only): a top-level ``member`` path, a plain one
    (False) or a ``$role`` whose holders may read chats (True), so a re-configure can turn
    records already written into roles; with it, participants may read their thread's chats.
    """
    note_actions = [{"who": "anyone", "can": ["create", "update"]}] if version == 1 else []
    chat_actions: list[dict[str, Any]] = [{"role": "thread/participant", "can": ["create", "update"]}]
    structure: dict[str, Any] = {
        "note": {"$actions": note_actions} if note_actions else {},
        "memo": {},  # the owner only, or by grant
        "thread": {
            "$actions": [{"who": "anyone", "can": ["create", "update"]}],
            "participant": {
                "$role": True,
                "$actions": [{"who": "author", "of": "thread", "can": ["create"]}],
            },
            "chat": {"$actions": chat_actions},
        },
    }
    types: dict[str, Any] = {"thread": {}, "participant": {}, "chat": {}, "note": {}, "memo": {}}
    if member is not None:
        types["member"] = {}
        structure["member"] = {"$role": True} if member else {}
        chat_actions[0]["can"] = ["create", "update", "read", "query", "subscribe"]
        if member:
            chat_actions.append({"role": "member", "can": ["read", "query", "subscribe"]})
    return {"protocol": CHAT, "published": True, "types": types, "structure": structure}


@dataclass(frozen=True)
class Authored:
    """A message some device accepted from its user."""

    cid: str
    message: dict[str, Any]
    data: bytes | None
    peer: str
    step: int
    op: str
    indexes: dict[str, Any] = field(default_factory=dict, compare=False)  # as the device logged it

    @property
    def timestamp(self) -> str:
        return str(self.message["descriptor"]["messageTimestamp"])


@dataclass(frozen=True)
class Cast:
    """The users: alice owns the tenant; bob and carol write into it."""

    alice: Identity
    bob: Identity
    carol: Identity

    @classmethod
    def seeded(cls) -> Cast:
        return cls(seeded_identity("sim-alice"), seeded_identity("sim-bob"), seeded_identity("sim-carol"))

    def by_did(self, did: str) -> Identity | None:
        for who in (self.alice, self.bob, self.carol):
            if who.did == did:
                return who
        return None


class Writer:
    """Picks and performs one user action on a peer (see the module doc)."""

    def __init__(self, rng: random.Random, cast: Cast, ops: str, *, members: bool = False) -> None:
        if ops not in OPS:
            raise ValueError(f"ops must be one of {OPS}")
        self.rng = rng
        self.cast = cast
        self.ops = ops
        #: ``--scopes mixed``: configures with a `member` path (a role or not) and member records
        self.members = members
        self.authored: dict[str, Authored] = {}
        self.grants: list[Authored] = []
        self.attempts = 0
        self.refused = 0
        self.counts: dict[str, int] = {}

    # -- choosing ------------------------------------------------------------------------------

    def act(self, peer: SimPeer, step: int) -> str:
        """Do one action on ``peer``; returns a line for the trace."""
        basic = [("create", 5), ("update", 4)]
        full = [("configure", 1), ("thread", 3), ("participant", 2), ("chat", 3), ("delete", 2), ("prune", 1),
                ("grant", 1), ("memo", 1), ("revoke", 1)]
        table = basic + full if self.ops == "full" else basic
        if self.members and self.ops == "full":
            table = [*table, ("member", 2)]
        op = self.rng.choices([o for o, _ in table], [w for _, w in table])[0]
        return self.perform(peer, op, step)

    def perform(self, peer: SimPeer, op: str, step: int) -> str:
        """Do ``op`` on ``peer`` (a name of :meth:`act`'s table); returns a line for the trace."""
        built = getattr(self, f"_{op}")(peer)
        if built is None:
            return f"{op}: nothing to do"
        message, data, signer = built
        self.attempts += 1
        reply = peer.dwn.process_message(peer.tenant, message, data)
        cid = message_cid(message)
        if reply.code not in (202, 204):
            self.refused += 1
            return f"{op} by {signer} refused {reply.code} {str(reply.detail)[:60]}"
        self.counts[op] = self.counts.get(op, 0) + 1
        authored = Authored(cid, message, data, peer.name, step, op, self._indexes(peer, cid))
        self.authored.setdefault(cid, authored)
        if op == "grant":
            self.grants.append(authored)
        return f"{op} by {signer} accepted {cid[-10:]}"

    def _indexes(self, peer: SimPeer, cid: str) -> dict[str, Any]:
        """The index key-values ``peer`` logged the message under (a delete's name its record's
        protocol, path and context, which the message alone does not)."""
        row = peer.store.conn.execute("SELECT indexes FROM events WHERE cid=? ORDER BY id DESC LIMIT 1",
                                      (cid,)).fetchone()
        return {} if row is None else dict(json.loads(row[0]))

    def _now(self, peer: SimPeer) -> str:
        return peer.clock.timestamp(peer.skew)

    def _data(self) -> bytes:
        if self.rng.randrange(LARGE_DATA_ONE_IN) == 0:
            return bytes([self.rng.randrange(256)]) * (INLINE_DATA_MAX + 1 + self.rng.randrange(4000))
        return self.rng.randbytes(self.rng.randrange(1, 120))

    # -- what the device holds ------------------------------------------------------------------

    def _records(self, peer: SimPeer, path: str | None = None) -> list[dict[str, Any]]:
        """The newest write of each live record ``peer`` holds (of ``path``; None: any)."""
        tid = peer.store.tenant_id(peer.tenant, create=False)
        if tid is None:
            return []
        newest: dict[str, dict[str, Any]] = {}
        deleted: set[str] = set()
        sql = "SELECT method, body FROM messages WHERE tenant=? AND interface='Records' ORDER BY id"
        for method, body in peer.store.conn.execute(sql, (tid,)):
            message: dict[str, Any] = json.loads(body)
            message.pop("encodedData", None)
            rid = str(message.get("recordId") or message["descriptor"].get("recordId"))
            if method == "Delete":
                deleted.add(rid)
                continue
            if method != "Write":
                continue
            ts = message["descriptor"]["messageTimestamp"]
            have = newest.get(rid)
            if have is None or ts > have["descriptor"]["messageTimestamp"]:
                newest[rid] = message
        out = [m for r, m in sorted(newest.items()) if r not in deleted]
        if path is not None:
            out = [m for m in out if m["descriptor"].get("protocolPath") == path]
        return out

    def _pick(self, peer: SimPeer, path: str | None = None) -> dict[str, Any] | None:
        records = self._records(peer, path)
        return self.rng.choice(records) if records else None

    # -- basic ops ------------------------------------------------------------------------------

    def _create(self, peer: SimPeer) -> tuple[dict[str, Any], bytes | None, str]:
        now, data = self._now(peer), self._data()
        write = RecordsWrite.create(signer=self.cast.alice, data=data, schema=NOTE, data_format="text/plain",
                                    message_timestamp=now, date_created=now)
        return write.message, data, "alice"

    def _update(self, peer: SimPeer) -> tuple[dict[str, Any], bytes | None, str] | None:
        source = self._pick(peer)
        if source is None:
            return None
        d = source["descriptor"]
        if d.get("protocolPath") in ("thread/participant", "member") or \
                d.get("protocol") == permissions.PERMISSIONS_PROTOCOL_URI:
            return None  # role and permission records are not edited in place here
        author = self._author(peer, source)
        if author is None:
            return None
        data = self._data()
        write = RecordsWrite.create_from(source, signer=author, data=data, message_timestamp=self._later(peer, d))
        return write.message, data, self._name(author)

    def _later(self, peer: SimPeer, descriptor: dict[str, Any]) -> str:
        """Now on this device, or just after the record's newest write when the clock is behind it."""
        now = self._now(peer)
        newest = str(descriptor["messageTimestamp"])
        return now if now > newest else add_seconds(newest, 1)

    def _author(self, peer: SimPeer, message: dict[str, Any]) -> Identity | None:
        """Who wrote the record (its initial write's author, as the store indexes it)."""
        row = peer.store.conn.execute(
            "SELECT author FROM messages WHERE record_id=? AND method='Write' ORDER BY id LIMIT 1",
            (message["recordId"],),
        ).fetchone()
        return self.cast.by_did(str(row[0])) if row is not None and row[0] else None

    def _name(self, who: Identity) -> str:
        return {self.cast.alice.did: "alice", self.cast.bob.did: "bob", self.cast.carol.did: "carol"}[who.did]

    # -- full ops -------------------------------------------------------------------------------

    def _configure(self, peer: SimPeer) -> tuple[dict[str, Any], bytes | None, str]:
        version = self.rng.choice((1, 1, 2))
        member = self.rng.random() < 0.5 if self.members else None
        return self.configure(peer, version, member), None, "alice"

    def configure(self, peer: SimPeer, version: int, member: bool | None) -> dict[str, Any]:
        """A ProtocolsConfigure of the chat protocol by alice, now on ``peer``."""
        return ProtocolsConfigure.create(definition=chat_definition(version, member), signer=self.cast.alice,
                                         message_timestamp=self._now(peer)).message

    def _thread(self, peer: SimPeer) -> tuple[dict[str, Any], bytes | None, str]:
        now, data = self._now(peer), self._data()
        write = RecordsWrite.create(signer=self.cast.bob, data=data, protocol=CHAT, protocol_path="thread",
                                    message_timestamp=now, date_created=now)
        return write.message, data, "bob"

    def _participant(self, peer: SimPeer) -> tuple[dict[str, Any], bytes | None, str] | None:
        thread = self._pick(peer, "thread")
        if thread is None:
            return None
        now = self._now(peer)
        write = RecordsWrite.create(signer=self.cast.bob, data=b"role", protocol=CHAT,
                                    protocol_path="thread/participant", recipient=self.cast.carol.did,
                                    parent_context_id=thread["contextId"], message_timestamp=now, date_created=now)
        return write.message, b"role", "bob"

    def _chat(self, peer: SimPeer) -> tuple[dict[str, Any], bytes | None, str] | None:
        thread = self._pick(peer, "thread")
        if thread is None:
            return None
        now, data = self._now(peer), self._data()
        write = RecordsWrite.create(signer=self.cast.carol, data=data, protocol=CHAT, protocol_path="thread/chat",
                                    parent_context_id=thread["contextId"], protocol_role="thread/participant",
                                    message_timestamp=now, date_created=now)
        return write.message, data, "carol"

    def _delete(self, peer: SimPeer, *, prune: bool = False) -> tuple[dict[str, Any], bytes | None, str] | None:
        record = self._pick(peer, "thread" if prune else None)
        if record is None:
            return None
        delete = create_records_delete(record_id=str(record["recordId"]), signer=self.cast.alice, prune=prune,
                                       message_timestamp=self._later(peer, record["descriptor"]))
        return delete, None, "alice"

    def _prune(self, peer: SimPeer) -> tuple[dict[str, Any], bytes | None, str] | None:
        return self._delete(peer, prune=True)

    def _member(self, peer: SimPeer) -> tuple[dict[str, Any], bytes | None, str]:
        now = self._now(peer)
        recipient = self.rng.choice((self.cast.bob, self.cast.carol))
        write = RecordsWrite.create(signer=self.cast.alice, data=b"member", protocol=CHAT, protocol_path="member",
                                    recipient=recipient.did, message_timestamp=now, date_created=now)
        return write.message, b"member", "alice"

    def _grant(self, peer: SimPeer) -> tuple[dict[str, Any], bytes | None, str]:
        now = self._now(peer)
        grant, data = permissions.create_grant(
            signer=self.cast.alice, granted_to=self.cast.bob.did, date_granted=now,
            date_expires=add_seconds(now, 365 * 24 * 3600),
            scope={"interface": "Records", "method": "Write", "protocol": CHAT},
        )
        return grant.message, data, "alice"

    def _memo(self, peer: SimPeer) -> tuple[dict[str, Any], bytes | None, str] | None:
        if not self.grants:
            return None
        grant = self.rng.choice(self.grants)
        now, data = self._now(peer), self._data()
        write = RecordsWrite.create(signer=self.cast.bob, data=data, protocol=CHAT, protocol_path="memo",
                                    permission_grant_id=str(grant.message["recordId"]), message_timestamp=now,
                                    date_created=now)
        return write.message, data, "bob"

    def _revoke(self, peer: SimPeer) -> tuple[dict[str, Any], bytes | None, str] | None:
        if not self.grants:
            return None
        grant = self.rng.choice(self.grants)
        assert grant.data is not None
        parsed = PermissionGrant.parse(permissions.with_encoded_data(grant.message, grant.data))
        revocation, data = permissions.create_revocation(signer=self.cast.alice, grant=parsed,
                                                         date_revoked=self._now(peer))
        return revocation.message, data, "alice"
