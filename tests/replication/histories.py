"""Generated multi-writer histories: what the devices of one tenant accepted from their users
while they were apart, and now and then synced.

A history is seeded (:func:`generate`): the same seed gives the same messages, byte for byte
(seeded Ed25519 keys, deterministic signatures, a logical clock). Two or three devices of
alice's DWN each run our engine over an in-memory store. alice (the owner), bob and carol act
on a device with ``process_message``, as they would locally; a message the device accepts
(202/204) joins the history, a refused one is dropped. Now and then two devices sync (each
processes what the other knows, in canonical order), so later actions build on what came from
elsewhere, and devices that did not sync act on stale state: concurrent updates of one record,
two deletes of it, writes under a parent or a grant another device deleted, a role record
re-created on one device while the other still holds the old one.

The forum protocol (:func:`forum_definition`): threads by anyone; a thread's author hands out
participant roles; participants chat; a chat's author reacts under it; anyone replies to a
thread; memos by the owner or under a permission grant; notes by anyone in version 1 of the
definition, by the owner only in version 2 (a re-configuration that narrows who may write).

The devices' stores stay open after generation: the order-independence test fetches
dependencies from them too (each holds a subset of the history in its own state).
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final

from p2psync.dwn import permissions
from p2psync.dwn.did import Identity
from p2psync.dwn.engine import Dwn
from p2psync.dwn.permission_grant import PermissionGrant
from p2psync.dwn.protocols import ProtocolsConfigure
from p2psync.dwn.records import create_records_delete, create_records_query
from p2psync.dwn.records_write import RecordsWrite
from p2psync.dwn.store import Store
from p2psync.dwn.timeutil import format_epoch_ns, parse_timestamp
from tests.replication.support import Step, seeded

FORUM: Final = "https://p2psync.example/histories/forum"
#: Where a history's clock starts; each generation step is one second.
EPOCH: Final = "2031-03-01T00:00:00.000000Z"
#: Owner queries (the devices' views, the oracle's answers) are made at this time, after
#: every message of every history.
QUERY_AT: Final = "2099-01-01T00:00:00.000000Z"
#: The reference keeps data above this many bytes out of line (its
#: DwnConstant.maxDataSizeAllowedToBeEncoded); one write in LARGE_ONE_IN carries more.
INLINE_DATA_MAX: Final = 30_000
LARGE_ONE_IN: Final = 20
#: How many messages a history holds (accepted somewhere), at least and at most. A permutation
#: of 30 messages costs about 20 ms through the closure loop.
MIN_MESSAGES: Final = 20
MAX_MESSAGES: Final = 30
#: Generation steps before giving up on reaching the size (refused attempts are steps too).
MAX_STEPS: Final = 400

#: What users do, with relative weights, per mix. "sync" exchanges two devices' messages.
#: ``full`` is everything; ``calm`` only creates and updates (concurrent ones too), which
#: newest-wins settles in any order even under 0.5.2's rules: a control.
MIXES: Final = {
    "full": {
        "thread": 3, "reply": 2, "participant": 3, "chat": 4, "reaction": 2, "note": 2, "memo": 3,
        "update": 3, "concurrent-update": 2, "delete": 2, "double-delete": 1, "prune": 1, "unrole": 2,
        "configure": 1, "grant": 1, "revoke": 1, "grant-delete": 1, "sync": 4,
    },
    "calm": {"thread": 3, "reply": 2, "note": 3, "update": 4, "concurrent-update": 3, "sync": 3},
}

#: The shapes the generated histories are meant to contain (see :func:`features`); the
#: order-independence test checks that its histories cover every one.
FEATURES: Final = (
    "concurrent-updates",  # two devices updated one record before they synced
    "equal-timestamps",  # two messages of one record with the same messageTimestamp
    "two-deletes",  # one record deleted twice (on two devices)
    "prune-with-children",  # a pruning delete of a record with children
    "child-then-parent-deleted",  # a child written before its parent's delete
    "role-recreated",  # a participant role deleted, then another for the same recipient
    "reconfigured-narrower",  # version 2 installed after version 1
    "note-then-narrowed",  # bob's or carol's note written before a version 2 configure
    "grant",
    "write-under-grant",
    "revocation",
    "grant-deleted",
    "large-data",
)


def forum_definition(version: int) -> dict[str, Any]:
    """The forum protocol; version 2 lets only the owner write notes."""
    notes: dict[str, Any] = {"$actions": [{"who": "anyone", "can": ["create", "update"]}]} if version == 1 else {}
    return {
        "protocol": FORUM,
        "published": True,
        "types": {t: {} for t in ("note", "memo", "thread", "participant", "chat", "reaction", "reply")},
        "structure": {
            "note": notes,
            "memo": {},  # the owner, or a grantee
            "thread": {
                "$actions": [{"who": "anyone", "can": ["create", "update"]}],
                "participant": {"$role": True, "$actions": [{"who": "author", "of": "thread", "can": ["create"]}]},
                "chat": {
                    "$actions": [{"role": "thread/participant", "can": ["create", "update"]}],
                    "reaction": {"$actions": [{"who": "author", "of": "thread/chat", "can": ["create", "update"]}]},
                },
                "reply": {"$actions": [{"who": "anyone", "can": ["create"]}]},
            },
        },
    }


@dataclass(frozen=True)
class Cast:
    """alice owns the tenant; bob (a did:jwk) and carol write into it."""

    alice: Identity
    bob: Identity
    carol: Identity

    @classmethod
    def for_history(cls, mix: str, seed: int) -> Cast:
        # A tenant of its own per history, so one reference process can hold them all.
        return cls(seeded(f"oi-{mix}{seed}-alice"), seeded("oi-bob", "jwk"), seeded("oi-carol"))

    def name(self, who: Identity) -> str:
        return {self.alice.did: "alice", self.bob.did: "bob", self.carol.did: "carol"}[who.did]


@dataclass(frozen=True)
class Authored:
    """A message a device accepted: what its user did (a name of :data:`MIXES`), where, by whom."""

    step: Step
    op: str
    device: str
    author: str

    @property
    def cid(self) -> str:
        return self.step.cid

    @property
    def message(self) -> dict[str, Any]:
        return self.step.message

    @property
    def timestamp(self) -> str:
        return str(self.step.message["descriptor"]["messageTimestamp"])


def canonical_order(steps: Iterable[Step]) -> list[Step]:
    """The issue's canonical order: messageTimestamp, then message CID (string order)."""
    return sorted(steps, key=lambda s: (str(s.message["descriptor"]["messageTimestamp"]), s.cid))


class Device:
    """One device of alice's DWN: our engine over an in-memory store, and what it knows."""

    def __init__(self, name: str, owner: Identity, skew: int) -> None:
        self.name = name
        self.owner = owner
        self.skew = skew  # seconds this device's clock is off
        self.store = Store(":memory:")
        self.dwn = Dwn(self.store)
        # Every message of the history offered here (by a sync: accepted or not), to pass on.
        self.known: dict[str, Step] = {}

    def offer(self, step: Step, *, authored: bool = False) -> bool:
        """Process ``step``; a user's message the device refuses never happened."""
        reply = self.dwn.process_message(self.owner.did, step.message, step.data)
        accepted = reply.code in (202, 204)
        if accepted or not authored:
            self.known[step.cid] = step
        return accepted

    def live(self, path: str, protocol: str = FORUM, **flt: Any) -> list[dict[str, Any]]:
        """The newest write of every live record of ``path`` here, as the owner queries them
        (without ``encodedData`` and ``initialWrite``)."""
        query = create_records_query(
            signer=self.owner, filter={"protocol": protocol, "protocolPath": path, **flt}, message_timestamp=QUERY_AT
        )
        reply = self.dwn.process_message(self.owner.did, query)
        assert reply.code == 200, (reply.code, reply.detail)
        return [{k: v for k, v in e.items() if k not in ("encodedData", "initialWrite")} for e in reply.entries or []]

    def protocol_version(self) -> int | None:
        """Which forum definition is installed here (None: none yet)."""
        tid = self.store.tenant_id(self.owner.did, create=False)
        if tid is None:
            return None
        versions = [s for s in self.known.values() if s.message["descriptor"].get("interface") == "Protocols"
                    and self.store.messages.get(self.owner.did, s.cid)]
        if not versions:
            return None
        newest = canonical_order(versions)[-1]
        return 1 if newest.message["descriptor"]["definition"]["structure"]["note"] else 2

    def close(self) -> None:
        self.dwn.close()


@dataclass
class History:
    """A generated message set, in authoring order, with the devices that accepted it."""

    mix: str
    seed: int
    cast: Cast
    authored: list[Authored]
    devices: list[Device]
    attempts: int = 0
    refused: Counter[str] = field(default_factory=Counter)

    @property
    def tenant(self) -> str:
        return self.cast.alice.did

    @property
    def steps(self) -> list[Step]:
        return [a.step for a in self.authored]

    def by_cid(self) -> dict[str, Authored]:
        return {a.cid: a for a in self.authored}

    def describe(self, cid: str) -> str:
        """One line for a message of this history: what it is, who wrote it where, when."""
        a = self.by_cid().get(cid)
        if a is None:
            return f"{cid[-10:]} (not in the history)"
        d = a.message["descriptor"]
        what = d.get("protocolPath") or d.get("interface")
        if d.get("method") == "Delete":
            what = f"delete{' (prune)' if d.get('prune') else ''} of {str(d['recordId'])[-8:]}"
        elif d.get("method") == "Write":
            what = f"{what} {str(a.message['recordId'])[-8:]}"
        return f"{cid[-10:]} {a.op}: {what} by {a.author} on {a.device} at {a.timestamp[11:23]}"

    def close(self) -> None:
        for device in self.devices:
            device.close()


class _Generator:
    """The users' actions (see the module doc); every method returns the messages it authored,
    each with the device to offer it to, or nothing when there is nothing to do."""

    def __init__(self, mix: str, seed: int) -> None:
        self.ops = MIXES[mix]
        self.rng = random.Random(f"order-independence:{mix}:{seed}")
        self.cast = Cast.for_history(mix, seed)
        count = self.rng.choice((2, 2, 3))
        self.devices = [Device(f"d{i}", self.cast.alice, self.rng.choice((-1, 0, 0, 1))) for i in range(count)]
        self.history = History(mix, seed, self.cast, [], self.devices)
        self.clock = 0  # seconds since EPOCH
        self.authors: dict[str, Identity] = {}  # recordId -> who wrote its initial write
        self.unroled: set[str] = set()  # threads a participant role was removed from

    # -- plumbing -------------------------------------------------------------------------------

    def now(self, device: Device, plus_ms: int = 0) -> str:
        ns = parse_timestamp(EPOCH) + (self.clock + device.skew) * 1_000_000_000 + plus_ms * 1_000_000
        return format_epoch_ns(ns)

    def later(self, device: Device, newest: str) -> str:
        """Now on ``device``, or just after ``newest`` when its clock is behind it."""
        now = self.now(device)
        return now if now > newest else format_epoch_ns(parse_timestamp(newest) + 1_000_000)

    def data(self) -> bytes:
        if self.rng.randrange(LARGE_ONE_IN) == 0:
            return self.rng.randbytes(INLINE_DATA_MAX + 1 + self.rng.randrange(3000))
        return self.rng.randbytes(self.rng.randrange(1, 80))

    def offer(self, device: Device, op: str, signer: Identity, message: dict[str, Any], data: bytes | None) -> bool:
        step = Step(f"{op}@{device.name}", message, data)
        self.history.attempts += 1
        if not device.offer(step, authored=True):
            self.history.refused[op] += 1
            return False
        if all(a.cid != step.cid for a in self.history.authored):
            # Two devices deleting a record at the same instant author the same message: the
            # history is a set.
            self.history.authored.append(Authored(step, op, device.name, self.cast.name(signer)))
        record_id = message.get("recordId")
        if isinstance(record_id, str):
            self.authors.setdefault(record_id, signer)
        return True

    def pick(self, device: Device, paths: Iterable[str]) -> dict[str, Any] | None:
        records = [r for p in paths for r in device.live(p)]
        return self.rng.choice(records) if records else None

    def shared(self, paths: Iterable[str]) -> tuple[Device, Device, str] | None:
        """Two devices and a record live on both."""
        a, b = self.rng.sample(self.devices, 2)
        ids_a = {r["recordId"] for p in paths for r in a.live(p)}
        ids_b = {r["recordId"] for p in paths for r in b.live(p)}
        common = sorted(ids_a & ids_b)
        return (a, b, self.rng.choice(common)) if common else None

    def newest(self, device: Device, record_id: str) -> dict[str, Any] | None:
        for path in ("note", "memo", "thread", "thread/participant", "thread/chat", "thread/chat/reaction",
                     "thread/reply"):
            for r in device.live(path, recordId=record_id):
                return r
        grants = device.live(permissions.GRANT_PATH, permissions.PERMISSIONS_PROTOCOL_URI, recordId=record_id)
        return grants[0] if grants else None

    def sync(self, a: Device, b: Device) -> None:
        """Each device processes what the other knows and it does not, in canonical order."""
        for source, target in ((a, b), (b, a)):
            for step in canonical_order(s for c, s in source.known.items() if c not in target.known):
                target.offer(step)

    # -- the run --------------------------------------------------------------------------------

    def run(self) -> History:
        first = self.devices[0]
        configure = ProtocolsConfigure.create(definition=forum_definition(1), signer=self.cast.alice,
                                              message_timestamp=self.now(first))
        assert self.offer(first, "configure", self.cast.alice, configure.message, None)
        for other in self.devices[1:]:
            self.sync(first, other)
        target = self.rng.randint(MIN_MESSAGES, MAX_MESSAGES)
        names = list(self.ops)
        weights = [self.ops[n] for n in names]
        for _ in range(MAX_STEPS):
            if len(self.history.authored) >= target:
                break
            # Mostly a second per step; sometimes two actions in the same second.
            self.clock += self.rng.choice((0, 1, 1, 1, 2))
            op = self.rng.choices(names, weights)[0]
            act: Callable[[], None] = getattr(self, "op_" + op.replace("-", "_"))
            act()
        return self.history

    # -- ops ------------------------------------------------------------------------------------

    def device(self) -> Device:
        return self.rng.choice(self.devices)

    def op_sync(self) -> None:
        a, b = self.rng.sample(self.devices, 2)
        self.sync(a, b)

    def write(self, device: Device, op: str, signer: Identity, path: str, **kw: Any) -> bool:
        now, data = self.now(device), self.data()
        write = RecordsWrite.create(signer=signer, data=data, protocol=FORUM, protocol_path=path,
                                    message_timestamp=now, date_created=now, **kw)
        return self.offer(device, op, signer, write.message, data)

    def op_thread(self) -> None:
        self.write(self.device(), "thread", self.rng.choice((self.cast.bob, self.cast.carol)), "thread")

    def op_reply(self) -> None:
        device = self.device()
        thread = self.pick(device, ["thread"])
        if thread is not None:
            signer = self.rng.choice((self.cast.bob, self.cast.carol))
            self.write(device, "reply", signer, "thread/reply", parent_context_id=thread["contextId"])

    def op_note(self) -> None:
        self.write(self.device(), "note", self.rng.choice((self.cast.alice, self.cast.bob, self.cast.carol)), "note")

    def op_participant(self) -> None:
        """The thread's author makes the other writer a participant (again, after an unrole)."""
        device = self.device()
        threads = device.live("thread")
        again = [t for t in threads if t["recordId"] in self.unroled]
        if not threads:
            return
        thread = self.rng.choice(again if again and self.rng.random() < 0.6 else threads)
        author = self.authors[thread["recordId"]]
        other = self.cast.carol if author.did == self.cast.bob.did else self.cast.bob
        self.write(device, "participant", author, "thread/participant", recipient=other.did,
                   parent_context_id=thread["contextId"])

    def op_chat(self) -> None:
        device = self.device()
        roles = device.live("thread/participant")
        if not roles:
            return
        role = self.rng.choice(roles)
        recipient = role["descriptor"]["recipient"]
        signer = self.cast.bob if recipient == self.cast.bob.did else self.cast.carol
        thread_context = "/".join(str(role["contextId"]).split("/")[:-1])
        self.write(device, "chat", signer, "thread/chat", parent_context_id=thread_context,
                   protocol_role="thread/participant")

    def op_reaction(self) -> None:
        device = self.device()
        chat = self.pick(device, ["thread/chat"])
        if chat is not None:
            self.write(device, "reaction", self.authors[chat["recordId"]], "thread/chat/reaction",
                       parent_context_id=chat["contextId"])

    def op_memo(self) -> None:
        device = self.device()
        grants = [g for g in self.history.authored if g.op == "grant"]
        if grants and self.rng.random() < 0.7:
            grant = self.rng.choice(grants)  # maybe revoked or deleted here: then refused
            self.write(device, "memo", self.cast.bob, "memo", permission_grant_id=str(grant.message["recordId"]))
        else:
            self.write(device, "memo", self.cast.alice, "memo")

    def update(self, device: Device, op: str, record_id: str, at: str | None = None) -> bool:
        newest = self.newest(device, record_id)
        if newest is None:
            return False
        author = self.authors[record_id]
        data = self.data()
        timestamp = at or self.later(device, newest["descriptor"]["messageTimestamp"])
        write = RecordsWrite.create_from(newest, signer=author, data=data, message_timestamp=timestamp)
        return self.offer(device, op, author, write.message, data)

    def updatable(self, record: dict[str, Any]) -> bool:
        # Role records are not edited here; bob's memos would need the grant again.
        path = record["descriptor"].get("protocolPath")
        return path != "thread/participant" and not (path == "memo" and self.authors[record["recordId"]].did
                                                     != self.cast.alice.did)

    def op_update(self) -> None:
        device = self.device()
        paths = ("note", "memo", "thread", "thread/chat", "thread/chat/reaction", "thread/reply")
        records = [r for p in paths for r in device.live(p) if self.updatable(r)]
        if records:
            self.update(device, "update", self.rng.choice(records)["recordId"])

    def op_concurrent_update(self) -> None:
        """Two devices update one record before they sync: at the same time, or a moment apart."""
        found = self.shared(("note", "thread", "thread/chat", "thread/reply"))
        if found is None:
            return
        a, b, record_id = found
        newest = max(str(r["descriptor"]["messageTimestamp"]) for d in (a, b)
                     for r in [self.newest(d, record_id)] if r is not None)
        at = self.later(a, newest)
        apart = self.rng.choice((0, 0, 1, 400))  # milliseconds
        self.update(a, "concurrent-update", record_id, at)
        self.update(b, "concurrent-update", record_id, format_epoch_ns(parse_timestamp(at) + apart * 1_000_000))

    def delete(self, device: Device, op: str, record: dict[str, Any], prune: bool, at: str | None = None) -> bool:
        timestamp = at or self.later(device, record["descriptor"]["messageTimestamp"])
        delete = create_records_delete(record_id=str(record["recordId"]), signer=self.cast.alice, prune=prune,
                                       message_timestamp=timestamp)
        return self.offer(device, op, self.cast.alice, delete, None)

    def op_delete(self) -> None:
        device = self.device()
        record = self.pick(device, ("note", "memo", "thread", "thread/chat", "thread/reply", "thread/chat/reaction"))
        if record is not None:
            self.delete(device, "delete", record, prune=False)

    def op_double_delete(self) -> None:
        """Two devices delete one record before they sync (pruning or not, each its own way)."""
        found = self.shared(("note", "thread", "thread/chat", "thread/reply"))
        if found is None:
            return
        a, b, record_id = found
        ra, rb = self.newest(a, record_id), self.newest(b, record_id)
        assert ra is not None and rb is not None
        newest = max(str(ra["descriptor"]["messageTimestamp"]), str(rb["descriptor"]["messageTimestamp"]))
        at = self.later(a, newest)
        self.delete(a, "double-delete", ra, prune=self.rng.random() < 0.3, at=at)
        second = at if self.rng.random() < 0.5 else format_epoch_ns(parse_timestamp(at) + 700_000_000)
        self.delete(b, "double-delete", rb, prune=self.rng.random() < 0.3, at=second)

    def op_prune(self) -> None:
        """alice prunes a thread or a chat, preferably one with children here."""
        device = self.device()
        candidates = device.live("thread") + device.live("thread/chat")
        with_children = [r for r in candidates if any(device.live(p, parentId=r["recordId"]) for p in
                                                      ("thread/participant", "thread/chat", "thread/reply",
                                                       "thread/chat/reaction"))]
        pool = with_children or candidates
        if pool:
            self.delete(device, "prune", self.rng.choice(pool), prune=True)

    def op_unrole(self) -> None:
        device = self.device()
        role = self.pick(device, ["thread/participant"])
        if role is not None and self.delete(device, "unrole", role, prune=False):
            self.unroled.add(str(role["descriptor"]["parentId"]))

    def op_configure(self) -> None:
        device = self.device()
        version = 2 if device.protocol_version() == 1 and self.rng.random() < 0.7 else 1
        configure = ProtocolsConfigure.create(definition=forum_definition(version), signer=self.cast.alice,
                                              message_timestamp=self.now(device))
        self.offer(device, "configure", self.cast.alice, configure.message, None)

    def op_grant(self) -> None:
        device = self.device()
        now = self.now(device)
        grant, data = permissions.create_grant(
            signer=self.cast.alice, granted_to=self.cast.bob.did, date_granted=now,
            date_expires=format_epoch_ns(parse_timestamp(now) + 365 * 86_400 * 1_000_000_000),
            scope={"interface": "Records", "method": "Write", "protocol": FORUM},
        )
        self.offer(device, "grant", self.cast.alice, grant.message, data)

    def live_grant(self, device: Device) -> Authored | None:
        live = {g["recordId"] for g in device.live(permissions.GRANT_PATH, permissions.PERMISSIONS_PROTOCOL_URI)}
        grants = [a for a in self.history.authored if a.op == "grant" and a.message["recordId"] in live]
        return self.rng.choice(grants) if grants else None

    def op_revoke(self) -> None:
        device = self.device()
        grant = self.live_grant(device)
        if grant is None or grant.step.data is None:
            return
        parsed = PermissionGrant.parse(permissions.with_encoded_data(grant.message, grant.step.data))
        revocation, data = permissions.create_revocation(signer=self.cast.alice, grant=parsed,
                                                         date_revoked=self.now(device))
        self.offer(device, "revoke", self.cast.alice, revocation.message, data)

    def op_grant_delete(self) -> None:
        device = self.device()
        grant = self.live_grant(device)
        if grant is not None:
            newest = self.newest(device, str(grant.message["recordId"]))
            if newest is not None:
                self.delete(device, "grant-delete", newest, prune=self.rng.random() < 0.5)


def generate(seed: int, mix: str = "full") -> History:
    """The history of ``seed`` in ``mix`` (close it when done: its devices' stores stay open)."""
    return _Generator(mix, seed).run()


def features(history: History) -> set[str]:
    """Which :data:`FEATURES` a history contains, read from its messages."""
    found: set[str] = set()
    writes: dict[str, list[Authored]] = defaultdict(list)
    deletes: dict[str, list[Authored]] = defaultdict(list)
    for a in history.authored:
        d = a.message["descriptor"]
        if d.get("method") == "Write":
            writes[str(a.message["recordId"])].append(a)
            if d.get("dataSize", 0) > INLINE_DATA_MAX:
                found.add("large-data")
        elif d.get("method") == "Delete":
            deletes[str(d["recordId"])].append(a)
    for record_id, ws in writes.items():
        if sum(w.op == "concurrent-update" for w in ws) >= 2:
            found.add("concurrent-updates")
        stamps = Counter(m.timestamp for m in ws + deletes.get(record_id, []))
        if any(n > 1 for n in stamps.values()):
            found.add("equal-timestamps")
    for record_id, ds in deletes.items():
        if len(ds) > 1:
            found.add("two-deletes")
        children = [w for ws in writes.values() for w in ws if w.message["descriptor"].get("parentId") == record_id]
        if children and any(d.message["descriptor"].get("prune") for d in ds):
            found.add("prune-with-children")
        if any(c.timestamp < d.timestamp for c in children for d in ds):
            found.add("child-then-parent-deleted")
    roles: dict[tuple[str, str], list[Authored]] = defaultdict(list)
    for ws in writes.values():
        w = ws[0]
        d = w.message["descriptor"]
        if d.get("protocolPath") == "thread/participant":
            roles[(str(d["parentId"]), str(d["recipient"]))].append(w)
    for rs in roles.values():
        removed = [d.timestamp for r in rs for d in deletes.get(str(r.message["recordId"]), [])]
        if any(r.timestamp > t for r in rs for t in removed):
            found.add("role-recreated")
    configures = [a for a in history.authored if a.op == "configure"]
    narrower = [c.timestamp for c in configures if not c.message["descriptor"]["definition"]["structure"]["note"]]
    wider = [c.timestamp for c in configures if c.message["descriptor"]["definition"]["structure"]["note"]]
    if any(w < n for w in wider for n in narrower):
        found.add("reconfigured-narrower")
    if any(a.op == "note" and a.author != "alice" and a.timestamp < t for a in history.authored for t in narrower):
        found.add("note-then-narrowed")
    ops = Counter(a.op for a in history.authored)
    if ops["grant"]:
        found.add("grant")
    if ops["revoke"]:
        found.add("revocation")
    if ops["grant-delete"]:
        found.add("grant-deleted")
    if any(a.op == "memo" and a.author == "bob" for a in history.authored):
        found.add("write-under-grant")
    return found
