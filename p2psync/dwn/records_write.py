"""RecordsWrite: parsing with the reference's integrity checks, authoring, and indexes.

A record is a chain of writes sharing one ``recordId``. The first (the *initial write*) has
``recordId == CID(descriptor + {author})``; later writes may change only the data, the
publication state, ``dataFormat`` and ``tags``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from p2psync.dwn import jws, memo, records_util, urls
from p2psync.dwn.datacid import data_cid as compute_data_cid
from p2psync.dwn.did import Identity
from p2psync.dwn.encoding import DescriptorEncoding, compute_cid, message_cid
from p2psync.dwn.errors import DwnError
from p2psync.dwn.generic_message import (
    Message,
    check_signature_structure,
    get_author,
    get_newest_message,
    get_signer,
)
from p2psync.dwn.store import Store
from p2psync.dwn.timeutil import now_timestamp, validate_timestamp

# Descriptor properties a later write may change; every other one is fixed by the initial write.
MUTABLE_DESCRIPTOR_PROPERTIES = frozenset(
    {"dataCid", "dataSize", "dataFormat", "datePublished", "published", "messageTimestamp", "tags"}
)


def get_entry_id(author: str | None, descriptor: dict[str, Any]) -> str:
    """CID of the descriptor with the author added: the ``recordId`` of an initial write."""
    if author is None:
        raise DwnError("RecordsWriteGetEntryIdUndefinedAuthor", "Property `author` is needed to compute entry ID.")
    return compute_cid({**descriptor, "author": author})


def is_initial_write(message: Message) -> bool:
    """Whether ``message`` is the initial RecordsWrite of its record."""
    d = message["descriptor"]
    if d.get("interface") != "Records" or d.get("method") != "Write":
        return False
    author = get_author(message)
    if author is not None and memo.of(message) is not None:
        # The message being processed: its handler derives the same entry id from the same encoding.
        return descriptor_encoding(message).cid_with("author", author) == message.get("recordId")
    return get_entry_id(author, d) == message.get("recordId")


def descriptor_encoding(message: Message) -> DescriptorEncoding:
    """The encoding of ``message["descriptor"]``; made once for the message being processed."""
    descriptor = message["descriptor"]
    held = memo.of(message)
    if held is None:
        return DescriptorEncoding(descriptor)
    encoding: DescriptorEncoding | None = held.descriptor_encoding
    if encoding is None or encoding.descriptor is not descriptor:
        encoding = held.descriptor_encoding = DescriptorEncoding(descriptor)
    return encoding


def get_initial_write(messages: Sequence[Message]) -> Message:
    for m in messages:
        if is_initial_write(m):
            return m
    raise DwnError("RecordsWriteGetInitialWriteNotFound", "Initial write is not found.")


def verify_equality_of_immutable_properties(existing: Message, new: Message) -> None:
    """A later write may not change what the initial write fixed (400)."""
    old_d, new_d = existing["descriptor"], new["descriptor"]
    for name in dict.fromkeys([*old_d, *new_d]):
        if name in MUTABLE_DESCRIPTOR_PROPERTIES:
            continue
        old_v, new_v = old_d.get(name, _ABSENT), new_d.get(name, _ABSENT)
        if not _js_strict_equal(old_v, new_v):
            raise DwnError(
                "RecordsWriteImmutablePropertyChanged",
                f"{name} is an immutable property: cannot change '{_js(old_v)}' to '{_js(new_v)}'",
            )


_ABSENT = object()


def _js_strict_equal(a: Any, b: Any) -> bool:
    # JS `===`: objects compare by identity, so two descriptor objects are never equal.
    if isinstance(a, dict | list) or isinstance(b, dict | list):
        return False
    if type(a) is bool or type(b) is bool:
        return type(a) is type(b) and a == b
    return bool(a == b) and (a is _ABSENT) == (b is _ABSENT)


def _js(v: Any) -> str:
    return "undefined" if v is _ABSENT else str(v)


def fetch_newest_records_write(store: Store, tenant: str, record_id: str) -> Message:
    """The newest RecordsWrite of a record (404-class error when there is none)."""
    messages, _ = store.messages.query(
        tenant, [{"interface": "Records", "method": "Write", "recordId": record_id}]
    )
    newest = get_newest_message(messages)
    if newest is None:
        raise DwnError("RecordsWriteGetNewestWriteRecordNotFound", "record not found")
    return newest


def fetch_initial_records_write_message(store: Store, tenant: str, record_id: str) -> Message | None:
    messages, _ = store.messages.query(tenant, [{"entryId": record_id}])
    return messages[0] if messages else None


def fetch_initial_records_write(store: Store, tenant: str, record_id: str) -> RecordsWrite | None:
    message = fetch_initial_records_write_message(store, tenant, record_id)
    return None if message is None else RecordsWrite.parse(message)


class RecordsWrite:
    """A parsed RecordsWrite, mirroring the reference's class of the same name."""

    def __init__(self, message: Message, signature_payload: dict[str, Any] | None = None) -> None:
        self.message = message
        authorization = message.get("authorization")
        self.author: str | None = None
        self.signer: str | None = None
        self.signature_payload: dict[str, Any] | None = None
        self.owner: str | None = None
        self.owner_signature_payload: dict[str, Any] | None = None
        self.owner_signature_signer: str | None = None
        if authorization is not None:
            self.author = get_author(message)
            self.signer = get_signer(message)
            self.signature_payload = signature_payload or jws.decode_payload(authorization["signature"])
            owner_sig = authorization.get("ownerSignature")
            if owner_sig is not None:
                self.owner_signature_signer = jws.signer_did(owner_sig)
                owner_grant = authorization.get("ownerDelegatedGrant")
                self.owner = get_signer(owner_grant) if owner_grant is not None else self.owner_signature_signer
                self.owner_signature_payload = jws.decode_payload(owner_sig)
        attestation = message.get("attestation")
        self.attesters = [jws.signer_did({"signatures": [s]}) for s in attestation["signatures"]] if attestation else []
        self._entry_id: str | None = None
        self._cid: str | None = None
        # Set by parse(): the descriptor's encoding, reused for entry_id and cid.
        self._descriptor_encoding: DescriptorEncoding | None = None

    # -- derived -------------------------------------------------------------------------

    @property
    def descriptor(self) -> dict[str, Any]:
        return self.message["descriptor"]  # type: ignore[no-any-return]

    @property
    def record_id(self) -> str:
        return self.message["recordId"]  # type: ignore[no-any-return]

    @property
    def entry_id(self) -> str:
        if self._entry_id is None:
            encoding = self._descriptor_encoding
            if encoding is not None and self.author is not None and encoding.descriptor is self.descriptor:
                self._entry_id = encoding.cid_with("author", self.author)
            else:
                self._entry_id = get_entry_id(self.author, self.descriptor)
        return self._entry_id

    @property
    def is_initial_write(self) -> bool:
        return self.entry_id == self.message.get("recordId")

    @property
    def is_signed_by_author_delegate(self) -> bool:
        return "authorDelegatedGrant" in self.message.get("authorization", {})

    @property
    def is_signed_by_owner_delegate(self) -> bool:
        return "ownerDelegatedGrant" in self.message.get("authorization", {})

    @property
    def cid(self) -> str:
        if self._cid is None:
            encoding = self._descriptor_encoding
            self._cid = message_cid(self.message) if encoding is None else encoding.message_cid(self.message)
        return self._cid

    # -- parsing -------------------------------------------------------------------------

    @classmethod
    def parse(cls, message: Message) -> RecordsWrite:
        """Structure and integrity checks of the reference's ``RecordsWrite.parse`` (400s)."""
        authorization = message["authorization"]
        # The descriptor is encoded once for its CID, the entry id and the message CID.
        encoding = descriptor_encoding(message)
        payload = check_signature_structure(
            authorization["signature"], lambda: encoding.cid, "RecordsWriteSignaturePayload"
        )
        if "ownerSignature" in authorization:
            check_signature_structure(authorization["ownerSignature"], lambda: encoding.cid)
        _validate_attestation_integrity(message, encoding)
        write = cls(message, payload)
        write._descriptor_encoding = encoding
        write._validate_integrity()
        return write

    def _validate_integrity(self) -> None:
        d = self.descriptor
        message = self.message
        if self.is_initial_write:
            if d["messageTimestamp"] != d["dateCreated"]:
                raise DwnError(
                    "RecordsWriteValidateIntegrityDateCreatedMismatch",
                    f"messageTimestamp {d['messageTimestamp']} must match dateCreated {d['dateCreated']}"
                    " for the initial write",
                )
            if "protocol" in d and "parentId" not in d and message.get("contextId") != self.entry_id:
                raise DwnError(
                    "RecordsWriteValidateIntegrityContextIdMismatch",
                    f"contextId in message: {message.get('contextId')} does not match deterministic"
                    f" contextId: {self.entry_id}",
                )
        payload = self.signature_payload or {}
        if message.get("recordId") != payload.get("recordId"):
            raise DwnError(
                "RecordsWriteValidateIntegrityRecordIdUnauthorized",
                f"recordId in message {message.get('recordId')} does not match recordId in authorization:"
                f" {payload.get('recordId')}",
            )
        if message.get("contextId") != payload.get("contextId"):
            raise DwnError(
                "RecordsWriteValidateIntegrityContextIdNotInSignerSignaturePayload",
                f"contextId in message {message.get('contextId')} does not match contextId in authorization:"
                f" {payload.get('contextId')}",
            )
        records_util.validate_delegated_grant_referential_integrity(
            message, payload, self.owner_signature_payload
        )
        if "attestationCid" in payload:
            expected = compute_cid(message.get("attestation"))
            if payload["attestationCid"] != expected:
                raise DwnError(
                    "RecordsWriteValidateIntegrityAttestationMismatch",
                    f"CID {expected} of attestation property in message does not match attestationCid in"
                    f" authorization: {payload['attestationCid']}",
                )
        if "encryptionCid" in payload:
            expected = compute_cid(message.get("encryption"))
            if payload["encryptionCid"] != expected:
                raise DwnError(
                    "RecordsWriteValidateIntegrityEncryptionCidMismatch",
                    f"CID {expected} of encryption property in message does not match encryptionCid in"
                    f" authorization: {payload['encryptionCid']}",
                )
        if "protocol" in d:
            urls.validate_protocol_url_normalized(d["protocol"])
        if "schema" in d:
            urls.validate_schema_url_normalized(d["schema"])
        validate_timestamp(d["messageTimestamp"])
        validate_timestamp(d["dateCreated"])
        if d.get("datePublished"):
            validate_timestamp(d["datePublished"])

    # -- indexes -------------------------------------------------------------------------

    def construct_indexes(self, is_latest_base_state: bool) -> dict[str, Any]:
        """The key-values the message store indexes this write under."""
        d = self.descriptor
        indexes: dict[str, Any] = {k: v for k, v in d.items() if k not in ("tags", "published")}
        indexes["isLatestBaseState"] = is_latest_base_state
        indexes["published"] = bool(d.get("published"))
        indexes["author"] = self.author
        indexes["recordId"] = self.message["recordId"]
        indexes["entryId"] = self.entry_id
        tags = d.get("tags")
        if tags is not None and is_latest_base_state:
            indexes.update(records_util.build_tag_indexes(tags))
        if self.attesters:
            indexes["attester"] = self.attesters[0]
        if "contextId" in self.message:
            indexes["contextId"] = self.message["contextId"]
        return indexes

    # -- authoring -----------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        *,
        signer: Identity,
        data: bytes | None = None,
        data_cid: str | None = None,
        data_size: int | None = None,
        data_format: str = "application/octet-stream",
        protocol: str | None = None,
        protocol_path: str | None = None,
        recipient: str | None = None,
        schema: str | None = None,
        tags: dict[str, Any] | None = None,
        parent_context_id: str | None = None,
        record_id: str | None = None,
        date_created: str | None = None,
        message_timestamp: str | None = None,
        published: bool | None = None,
        date_published: str | None = None,
        permission_grant_id: str | None = None,
        protocol_role: str | None = None,
        delegated_grant: Message | None = None,
        attestation_signers: Sequence[Identity] = (),
    ) -> RecordsWrite:
        """Author and sign a RecordsWrite the way the reference's ``RecordsWrite.create`` does."""
        if (protocol is None) != (protocol_path is None):
            raise DwnError(
                "RecordsWriteCreateProtocolAndProtocolPathMutuallyInclusive",
                "`protocol` and `protocolPath` must both be defined or undefined at the same time",
            )
        if (data is None) == (data_cid is None):
            raise DwnError(
                "RecordsWriteCreateDataAndDataCidMutuallyExclusive",
                "one and only one parameter between `data` and `dataCid` is required",
            )
        if (data_cid is None) != (data_size is None):
            raise DwnError(
                "RecordsWriteCreateDataCidAndDataSizeMutuallyInclusive",
                "`dataCid` and `dataSize` must both be defined or undefined at the same time",
            )
        if data is not None:
            data_cid, data_size = compute_data_cid(data), len(data)
        now = now_timestamp()
        parent_id = None
        if parent_context_id:
            parent_id = [s for s in parent_context_id.split("/") if s][-1]
        candidates: list[tuple[str, Any]] = [
            ("interface", "Records"),
            ("method", "Write"),
            ("protocol", urls.normalize_protocol_url(protocol) if protocol is not None else None),
            ("protocolPath", protocol_path),
            ("recipient", recipient),
            ("schema", urls.normalize_schema_url(schema) if schema is not None else None),
            ("tags", tags),
            ("parentId", parent_id),
            ("dataCid", data_cid),
            ("dataSize", data_size),
            ("dateCreated", date_created or now),
            ("messageTimestamp", message_timestamp or now),
            ("published", published),
            ("datePublished", date_published if date_published is not None else (now if published else None)),
            ("dataFormat", data_format),
        ]
        descriptor = {k: v for k, v in candidates if v is not None}
        message: Message = {}
        if record_id is not None:
            message["recordId"] = record_id
        message["descriptor"] = descriptor
        descriptor_cid = compute_cid(descriptor)
        if attestation_signers:
            message["attestation"] = _multi_sign({"descriptorCid": descriptor_cid}, attestation_signers)
        write = cls(message)
        write._sign(
            signer,
            descriptor_cid,
            parent_context_id,
            permission_grant_id=permission_grant_id,
            protocol_role=protocol_role,
            delegated_grant=delegated_grant,
        )
        return write

    def _sign(
        self,
        signer: Identity,
        descriptor_cid: str,
        parent_context_id: str | None,
        *,
        permission_grant_id: str | None,
        protocol_role: str | None,
        delegated_grant: Message | None,
    ) -> None:
        message = self.message
        delegated_grant_id = None
        if delegated_grant is not None:
            delegated_grant_id = message_cid(delegated_grant)
            author = get_signer(delegated_grant)
        else:
            author = signer.did
        if "recordId" not in message:
            # keep recordId ahead of descriptor, as the reference's object literal does
            self.message = message = {"recordId": get_entry_id(author, self.descriptor), **message}
        if "protocol" in self.descriptor:
            rid = message["recordId"]
            message["contextId"] = f"{parent_context_id}/{rid}" if parent_context_id else rid
        payload_items: list[tuple[str, Any]] = [
            ("recordId", message["recordId"]),
            ("descriptorCid", descriptor_cid),
            ("contextId", message.get("contextId")),
            ("attestationCid", compute_cid(message["attestation"]) if "attestation" in message else None),
            ("encryptionCid", compute_cid(message["encryption"]) if "encryption" in message else None),
            ("delegatedGrantId", delegated_grant_id),
            ("permissionGrantId", permission_grant_id),
            ("protocolRole", protocol_role),
        ]
        payload = {k: v for k, v in payload_items if v is not None}
        authorization: dict[str, Any] = {"signature": jws.sign_payload(payload, signer)}
        if delegated_grant is not None:
            authorization["authorDelegatedGrant"] = delegated_grant
        message["authorization"] = authorization
        self.signature_payload = payload
        self.author = author
        self.signer = signer.did
        self._entry_id = None
        self._cid = None

    def sign_as_owner(self, signer: Identity) -> None:
        """Add the tenant's owner signature, so a record authored elsewhere can be stored here."""
        payload = {"descriptorCid": compute_cid(self.descriptor)}
        self.message["authorization"]["ownerSignature"] = jws.sign_payload(payload, signer)
        self.owner = self.owner_signature_signer = signer.did
        self.owner_signature_payload = payload

    @classmethod
    def create_from(
        cls,
        source: Message,
        *,
        signer: Identity,
        data: bytes | None = None,
        data_format: str | None = None,
        published: bool | None = None,
        date_published: str | None = None,
        message_timestamp: str | None = None,
        tags: dict[str, Any] | None = None,
        protocol_role: str | None = None,
        delegated_grant: Message | None = None,
    ) -> RecordsWrite:
        """A newer write of the same record (the reference's ``createFrom``; ``tags`` are not carried)."""
        src = RecordsWrite.parse(source)
        sd = source["descriptor"]
        now = now_timestamp()
        if published is None:
            published = True if date_published else sd.get("published")
        if not date_published and published:
            date_published = sd.get("datePublished") if sd.get("published") else now
        context_id = source.get("contextId")
        parent_context = None
        if context_id is not None:
            parent_context = "/".join(context_id.split("/")[:-1])
        return cls.create(
            signer=signer,
            recipient=sd.get("recipient"),
            record_id=source["recordId"],
            date_created=sd["dateCreated"],
            protocol=sd.get("protocol"),
            protocol_path=sd.get("protocolPath"),
            schema=sd.get("schema"),
            parent_context_id=parent_context,
            message_timestamp=message_timestamp or now,
            published=published,
            date_published=date_published,
            tags=tags,
            data=data,
            data_cid=None if data is not None else sd["dataCid"],
            data_size=None if data is not None else sd["dataSize"],
            data_format=data_format or sd["dataFormat"],
            protocol_role=protocol_role or (src.signature_payload or {}).get("protocolRole"),
            delegated_grant=delegated_grant,
        )


def _multi_sign(payload: dict[str, Any], signers: Sequence[Identity]) -> dict[str, Any]:
    jws_obj = jws.sign_payload(payload, signers[0])
    for s in signers[1:]:
        jws_obj["signatures"].extend(jws.sign_payload(payload, s)["signatures"])
    return jws_obj


def _validate_attestation_integrity(message: Message, encoding: DescriptorEncoding | None = None) -> None:
    attestation = message.get("attestation")
    if attestation is None:
        return
    if len(attestation["signatures"]) != 1:
        raise DwnError(
            "RecordsWriteAttestationIntegrityMoreThanOneSignature",
            f"Currently implementation only supports 1 attester, but got {len(attestation['signatures'])}",
        )
    payload = jws.decode_payload(attestation)
    expected = encoding.cid if encoding is not None else compute_cid(message["descriptor"])
    if payload.get("descriptorCid") != expected:
        raise DwnError(
            "RecordsWriteAttestationIntegrityDescriptorCidMismatch",
            f"descriptorCid {payload.get('descriptorCid')} does not match expected descriptorCid {expected}",
        )
    if len(payload) > 1:
        raise DwnError(
            "RecordsWriteAttestationIntegrityInvalidPayloadProperty",
            f"Only 'descriptorCid' is allowed in attestation payload, but got {len(payload)} properties.",
        )
