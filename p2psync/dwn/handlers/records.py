"""Records interface handlers: Write, Delete, Read, Query — the reference's rules, in order.

Each handler follows the reference's sequence of checks and its choice of status code per
stage (parse → 400, authenticate/authorize → 401, conflicts → 409), because a replica that
answers differently from the reference diverges from it.
"""

from __future__ import annotations

from typing import Any

from p2psync.dwn import grant_authorization, permissions, protocol_authorization, records_util
from p2psync.dwn.authentication import authenticate
from p2psync.dwn.datacid import data_cid as compute_data_cid
from p2psync.dwn.encoding import b64url_decode, data_b64url, json_compact, message_cid, message_json
from p2psync.dwn.errors import DwnError
from p2psync.dwn.generic_message import (
    GenericMessage,
    Message,
    get_newest_message,
    is_newer,
    is_older,
    validate_signature_structure,
)
from p2psync.dwn.permission_grant import PermissionGrant
from p2psync.dwn.records_write import (
    RecordsWrite,
    fetch_initial_records_write,
    fetch_initial_records_write_message,
    is_initial_write,
    verify_equality_of_immutable_properties,
)
from p2psync.dwn.reply import HandlerContext, Reply, reply_from_error
from p2psync.dwn.store import Store, StoredMessage
from p2psync.dwn.timeutil import validate_timestamp
from p2psync.dwn.urls import validate_protocol_url_normalized, validate_schema_url_normalized

# Data up to this size is stored inline in the message (encodedData); larger data goes to
# the data store. The reference's DwnConstant.maxDataSizeAllowedToBeEncoded.
MAX_DATA_SIZE_ENCODED = 30_000

# What a handler stage turns into its reply code. The reference wraps each stage in a
# try/catch that also catches JavaScript TypeErrors (a missing property deep in a message
# that its schema allows to be absent); KeyError/TypeError/… are their Python counterparts.
STAGE_ERRORS = (DwnError, KeyError, TypeError, IndexError, AttributeError, ValueError)

# Error codes for which a failing RecordsWrite answers 400 once it reached storage.
_WRITE_STORAGE_400 = frozenset(
    {
        "RecordsWriteMissingEncodedDataInPrevious",
        "RecordsWriteMissingDataInPrevious",
        "RecordsWriteNotAllowedAfterDelete",
        "RecordsWriteDataCidMismatch",
        "RecordsWriteDataSizeMismatch",
    }
)


def _did(value: str | None) -> str:
    """A DID that authentication has already established (so never None here)."""
    if value is None:
        raise DwnError("AuthenticateJwsMissing", "Missing JWS.", 401)
    return value


# --------------------------------------------------------------------------- parsing


def parse_signed_records_message(message: Message) -> GenericMessage:
    """Parse a RecordsRead / RecordsDelete: signature structure, delegation, timestamp."""
    payload = None
    if "authorization" in message:
        payload = validate_signature_structure(message["authorization"]["signature"], message["descriptor"])
    records_util.validate_delegated_grant_referential_integrity(message, payload)
    validate_timestamp(message["descriptor"]["messageTimestamp"])
    return GenericMessage(message)


def parse_records_query(message: Message) -> GenericMessage:
    d = message["descriptor"]
    flt = d["filter"]
    if flt.get("published") is False and d.get("dateSort") in ("publishedAscending", "publishedDescending"):
        raise DwnError(
            "RecordsQueryParseFilterPublishedSortInvalid",
            f"queries must not filter for `published:false` and sort by {d.get('dateSort')}",
        )
    payload = None
    if "authorization" in message:
        payload = validate_signature_structure(message["authorization"]["signature"], d)
    records_util.validate_delegated_grant_referential_integrity(message, payload)
    if payload is not None and "protocolRole" in payload and "protocolPath" not in flt:
        raise DwnError(
            "RecordsQueryFilterMissingRequiredProperties",
            "Role-authorized queries must include `protocolPath` in the filter",
        )
    if "protocol" in flt:
        validate_protocol_url_normalized(flt["protocol"])
    if "schema" in flt:
        validate_schema_url_normalized(flt["schema"])
    validate_timestamp(d["messageTimestamp"])
    return GenericMessage(message)


# --------------------------------------------------------------------------- storage


def _is_initial(stored: StoredMessage) -> bool:
    told = stored.initial_write
    return is_initial_write(stored.message) if told is None else told


def _initial_write(stored: list[StoredMessage]) -> Message:
    """The record's initial write among its stored messages (``get_initial_write``, read off
    their indexes)."""
    for s in stored:
        if _is_initial(s):
            return s.message
    raise DwnError("RecordsWriteGetInitialWriteNotFound", "Initial write is not found.")


def delete_all_older_messages_but_keep_initial_write(
    store: Store, tenant: str, existing: list[StoredMessage], newest: Message
) -> None:
    """Prune what a newer message supersedes; the initial write stays, demoted from latest."""
    deleted: list[str] = []
    for stored in existing:
        message, cid = stored.message, stored.cid
        if not is_older(message, newest):
            continue
        _delete_from_data_store_if_needed(store, tenant, message, newest)
        if not _is_initial(stored):
            store.messages.delete(tenant, cid)
            deleted.append(cid)
            continue
        if "encodedData" not in message and stored.indexes.get("isLatestBaseState") is False:
            continue  # demoted already (by an earlier write): the demotion would leave it as it is
        demoted = {k: v for k, v in message.items() if k != "encodedData"}
        indexes = RecordsWrite(demoted).construct_indexes(False)
        if message.get("encodedData") == "":
            # A 0-byte record's stored CID holds its empty data; the demoted one's does not.
            store.messages.delete(tenant, cid)
            store.messages.put(tenant, demoted, indexes)
        else:
            store.messages.demote(tenant, cid, demoted, indexes)
    store.events.delete_events_by_cid(tenant, deleted)


def _delete_from_data_store_if_needed(store: Store, tenant: str, message: Message, newest: Message) -> None:
    d = message["descriptor"]
    if d.get("method") != "Write" or d["dataSize"] <= MAX_DATA_SIZE_ENCODED:
        return
    if d["dataCid"] == newest["descriptor"].get("dataCid"):
        return
    store.data.delete(tenant, message["recordId"], d["dataCid"])


def purge_record_descendants(store: Store, tenant: str, record_id: str) -> None:
    """Hard-delete every descendant of a record (a pruning RecordsDelete)."""
    children, _ = store.messages.query(tenant, [{"interface": "Records", "parentId": record_id}])
    by_record: dict[str, list[Message]] = {}
    for m in children:
        rid = m["recordId"] if m["descriptor"]["method"] == "Write" else m["descriptor"]["recordId"]
        by_record.setdefault(rid, []).append(m)
    for rid in by_record:
        purge_record_descendants(store, tenant, rid)
    for msgs in by_record.values():
        writes = [m for m in msgs if m["descriptor"]["method"] == "Write"]
        newest = get_newest_message(writes)
        if newest is not None:
            store.data.delete(tenant, newest["recordId"], newest["descriptor"]["dataCid"])
        cids = [message_cid(m) for m in msgs]
        store.events.delete_events_by_cid(tenant, cids)
        for c in cids:
            store.messages.delete(tenant, c)


def can_perform_delete_against_record(delete: Message, newest: Message | None) -> bool:
    if newest is None:
        return False
    if newest["descriptor"]["method"] == "Delete":
        if delete["descriptor"].get("prune") is not True:
            return False
        if newest["descriptor"].get("prune") is True:
            return False
    return True


# --------------------------------------------------------------------------- RecordsWrite


def handle_records_write(
    ctx: HandlerContext, tenant: str, message: Message, data: bytes | None, withheld: bool = False
) -> Reply:
    """``withheld``: an initial write without data is still the record's latest state (a
    canonical replay of a record whose data went before it arrived; p2psync/dwn/canonical.py)."""
    store = ctx.store
    try:
        write = RecordsWrite.parse(message)
        if "protocol" in message["descriptor"]:
            protocol_authorization.validate_referential_integrity(tenant, write, store)
    except STAGE_ERRORS as e:
        return reply_from_error(e, 400)
    try:
        authenticate(message.get("authorization"))
        _authorize_records_write(tenant, write, store)
    except STAGE_ERRORS as e:
        return reply_from_error(e, 401)

    rows = store.messages.query_stored(tenant, [{"interface": "Records", "recordId": message["recordId"]}])
    existing = [row.message for row in rows]
    new_is_initial = write.is_initial_write
    if not new_is_initial:
        try:
            initial = _initial_write(rows)
            verify_equality_of_immutable_properties(initial, message)
        except STAGE_ERRORS as e:
            return reply_from_error(e, 400)

    newest_existing = get_newest_message(existing)
    if newest_existing is not None and not is_newer(message, newest_existing):
        return Reply(409, "Conflict")

    try:
        with store.transaction():
            if newest_existing is not None and newest_existing["descriptor"]["method"] == "Delete":
                raise DwnError(
                    "RecordsWriteNotAllowedAfterDelete", "RecordsWrite is not allowed after a RecordsDelete."
                )
            permissions.validate_revocation_protocol_tag(tenant, store, message)
            is_latest_base_state = False
            stored: Message = message
            body_json = None
            if data is not None:
                stored = _process_with_data(store, tenant, message, data)
                body_json = _inline_data_body_json(message, stored)
                is_latest_base_state = True
            elif not new_is_initial:
                assert newest_existing is not None
                stored = _process_without_data(store, tenant, message, newest_existing)
                is_latest_base_state = True
            elif withheld:
                is_latest_base_state = True
            indexes = write.construct_indexes(is_latest_base_state)
            cid = write.cid
            # A 0-byte record is stored with `encodedData: ""`, which the reference keeps
            # inside the CID it stores the message under; any other data leaves it unchanged.
            indexes_json = json_compact(indexes)
            store.messages.put(
                tenant, stored, indexes, None if stored.get("encodedData") == "" else cid, indexes_json, body_json
            )
            store.events.append(tenant, cid, indexes, indexes_json)
            delete_all_older_messages_but_keep_initial_write(store, tenant, rows, message)
    except DwnError as e:
        if e.code in _WRITE_STORAGE_400 or e.code.startswith(("PermissionsProtocolValidate", "SchemaValidator")):
            return reply_from_error(e, 400)
        raise
    if new_is_initial and data is None and not withheld:
        return Reply(204, "No Content")
    return Reply(202, "Accepted")


def _validate_data_integrity(
    expected_cid: str, expected_size: int, actual_cid: str | None, actual_size: int | None
) -> None:
    if expected_cid != actual_cid:
        raise DwnError(
            "RecordsWriteDataCidMismatch",
            f"actual data CID {actual_cid} does not match dataCid in descriptor: {expected_cid}",
        )
    if expected_size != actual_size:
        raise DwnError(
            "RecordsWriteDataSizeMismatch",
            f"actual data size {actual_size} bytes does not match dataSize in descriptor: {expected_size}",
        )


def _process_with_data(store: Store, tenant: str, message: Message, data: bytes) -> Message:
    d = message["descriptor"]
    actual_cid = compute_data_cid(data)
    if d["dataSize"] <= MAX_DATA_SIZE_ENCODED:
        _validate_data_integrity(d["dataCid"], d["dataSize"], actual_cid, len(data))
        if d.get("protocol") == permissions.PERMISSIONS_PROTOCOL_URI:
            permissions.validate_schema(message, data)
        return {**message, "encodedData": data_b64url(data)}
    # Large data: validated before it is kept, so a mismatch leaves nothing behind.
    _validate_data_integrity(d["dataCid"], d["dataSize"], actual_cid, len(data))
    store.data.put(tenant, message["recordId"], d["dataCid"], data)
    return message


def _inline_data_body_json(message: Message, stored: Message) -> str | None:
    """``json_compact(stored)`` when ``_process_with_data`` only appended ``encodedData``.

    The base64url text needs no JSON escaping, so it is spliced onto the message's JSON
    instead of being escaped character by character (half the bytes of a 1 KiB record).
    """
    if stored is message or not message or "encodedData" in message:
        return None
    return f'{message_json(message)[:-1]},"encodedData":"{stored["encodedData"]}"}}'


def _process_without_data(store: Store, tenant: str, message: Message, newest_existing: Message) -> Message:
    d = message["descriptor"]
    nd = newest_existing["descriptor"]
    _validate_data_integrity(d["dataCid"], d["dataSize"], nd.get("dataCid"), nd.get("dataSize"))
    if d["dataSize"] <= MAX_DATA_SIZE_ENCODED:
        if "encodedData" not in newest_existing:
            raise DwnError(
                "RecordsWriteMissingEncodedDataInPrevious",
                "No dataStream was provided and unable to get data from previous message",
            )
        return {**message, "encodedData": newest_existing["encodedData"]}
    if store.data.size(tenant, newest_existing["recordId"], d["dataCid"]) is None:
        raise DwnError(
            "RecordsWriteMissingDataInPrevious",
            "No dataStream was provided and unable to get data from previous message",
        )
    return message


def _authorize_records_write(tenant: str, write: RecordsWrite, store: Store) -> None:
    if write.owner is not None and write.owner != tenant:
        raise DwnError(
            "RecordsWriteOwnerAndTenantMismatch",
            f"Owner {write.owner} must be the same as tenant {tenant} when specified.",
        )
    if write.is_signed_by_author_delegate:
        grant = PermissionGrant.parse(write.message["authorization"]["authorDelegatedGrant"])
        grant_authorization.authorize_records_write(
            write.message, _did(write.author), _did(write.signer), grant, store
        )
    if write.is_signed_by_owner_delegate:
        grant = PermissionGrant.parse(write.message["authorization"]["ownerDelegatedGrant"])
        grant_authorization.authorize_records_write(
            write.message, _did(write.owner), _did(write.owner_signature_signer), grant, store
        )
    payload = write.signature_payload or {}
    if write.owner is not None or write.author == tenant:
        return
    if write.author is not None and "permissionGrantId" in payload:
        grant = permissions.fetch_grant(tenant, store, payload["permissionGrantId"])
        grant_authorization.authorize_records_write(write.message, tenant, write.author, grant, store)
    elif "protocol" in write.descriptor:
        protocol_authorization.authorize_write(tenant, write, store)
    else:
        raise DwnError("RecordsWriteAuthorizationFailed", "message failed authorization")


# --------------------------------------------------------------------------- RecordsDelete


def handle_records_delete(ctx: HandlerContext, tenant: str, message: Message) -> Reply:
    store = ctx.store
    try:
        delete = parse_signed_records_message(message)
    except STAGE_ERRORS as e:
        return reply_from_error(e, 400)
    try:
        authenticate(message.get("authorization"))
    except STAGE_ERRORS as e:
        return reply_from_error(e, 401)
    record_id = message["descriptor"]["recordId"]
    existing, _ = store.messages.query(tenant, [{"interface": "Records", "recordId": record_id}])
    newest = get_newest_message(existing)
    if not can_perform_delete_against_record(message, newest):
        return Reply(404, "Not Found")
    assert newest is not None
    if not is_newer(message, newest):
        return Reply(409, "Conflict")
    try:
        initial = fetch_initial_records_write(store, tenant, record_id)
        if initial is None:
            raise DwnError("RecordsDeleteAuthorizationFailed", "initial write of the record not found")
        _authorize_records_delete(tenant, delete, initial, store)
    except STAGE_ERRORS as e:
        return reply_from_error(e, 401)
    with store.transaction():
        _perform_records_delete(store, tenant, message)
    return Reply(202, "Accepted")


def _authorize_records_delete(tenant: str, delete: GenericMessage, initial: RecordsWrite, store: Store) -> None:
    if delete.is_signed_by_author_delegate:
        grant = PermissionGrant.parse(delete.message["authorization"]["authorDelegatedGrant"])
        grant_authorization.authorize_records_delete(
            delete.message, initial.message, _did(delete.author), _did(delete.signer), grant, store
        )
    if delete.author == tenant:
        return
    if "protocol" in initial.descriptor:
        protocol_authorization.authorize_delete(tenant, delete, initial, store)
    else:
        raise DwnError("RecordsDeleteAuthorizationFailed", "RecordsDelete message failed authorization")


def _perform_records_delete(store: Store, tenant: str, message: Message) -> None:
    record_id = message["descriptor"]["recordId"]
    rows = store.messages.query_stored(tenant, [{"interface": "Records", "recordId": record_id}])
    newest = get_newest_message(row.message for row in rows)
    if not can_perform_delete_against_record(message, newest):
        return
    delete = GenericMessage(message)
    initial = _initial_write(rows)
    indexes = construct_delete_indexes(delete, initial)
    store.messages.put(tenant, message, indexes)
    store.events.append(tenant, message_cid(message), indexes)
    if message["descriptor"].get("prune"):
        purge_record_descendants(store, tenant, record_id)
    delete_all_older_messages_but_keep_initial_write(store, tenant, rows, message)


def construct_delete_indexes(delete: GenericMessage, initial: Message) -> dict[str, Any]:
    d = initial["descriptor"]
    indexes: dict[str, Any] = {"isLatestBaseState": True}
    for key in ("protocol", "protocolPath", "recipient", "schema", "parentId", "dateCreated"):
        if key in d:
            indexes[key] = d[key]
    if "contextId" in initial:
        indexes["contextId"] = initial["contextId"]
    if delete.author is not None:
        indexes["author"] = delete.author
    indexes.update(delete.message["descriptor"])
    return indexes


# --------------------------------------------------------------------------- RecordsRead


def handle_records_read(ctx: HandlerContext, tenant: str, message: Message) -> Reply:
    store = ctx.store
    try:
        read = parse_signed_records_message(message)
    except STAGE_ERRORS as e:
        return reply_from_error(e, 400)
    try:
        if read.author is not None:
            authenticate(message.get("authorization"))
    except STAGE_ERRORS as e:
        return reply_from_error(e, 401)
    query = {
        "interface": "Records",
        "isLatestBaseState": True,
        **records_util.convert_filter(message["descriptor"]["filter"]),
    }
    found, _ = store.messages.query(tenant, [query])
    if not found:
        return Reply(404, "Not Found")
    if len(found) > 1:
        return reply_from_error(
            DwnError("RecordsReadReturnedMultiple", "Multiple records exist for the RecordsRead filter"), 400
        )
    matched = found[0]
    if matched["descriptor"]["method"] == "Delete":
        initial_message = fetch_initial_records_write_message(store, tenant, matched["descriptor"]["recordId"])
        if initial_message is None:
            return reply_from_error(
                DwnError("RecordsReadInitialWriteNotFound", "Initial write for deleted record not found"), 400
            )
        try:
            _authorize_records_read(tenant, read, RecordsWrite.parse(initial_message), store)
        except STAGE_ERRORS as e:
            return reply_from_error(e, 401)
        return Reply(404, "Not Found", entry={"recordsDelete": matched, "initialWrite": initial_message})

    try:
        _authorize_records_read(tenant, read, RecordsWrite.parse(matched), store)
    except STAGE_ERRORS as e:
        return reply_from_error(e, 401)
    if "encodedData" in matched:
        data = b64url_decode(matched.pop("encodedData"))
    else:
        stored = store.data.get(tenant, matched["recordId"], matched["descriptor"]["dataCid"])
        if stored is None:
            return Reply(404, "Not Found")
        data = stored
    entry: dict[str, Any] = {"recordsWrite": matched}
    if not is_initial_write(matched):
        initial_found, _ = store.messages.query(
            tenant, [{"recordId": matched["recordId"], "isLatestBaseState": False, "method": "Write"}]
        )
        if initial_found:
            initial_found[0].pop("encodedData", None)
            entry["initialWrite"] = initial_found[0]
    return Reply(200, "OK", entry=entry, data=data)


def _authorize_records_read(tenant: str, read: GenericMessage, matched: RecordsWrite, store: Store) -> None:
    if read.is_signed_by_author_delegate:
        grant = PermissionGrant.parse(read.message["authorization"]["authorDelegatedGrant"])
        grant_authorization.authorize_records_read(
            read.message, matched.message, _did(read.author), _did(read.signer), grant, store
        )
    d = matched.descriptor
    payload = read.signature_payload or {}
    if read.author == tenant:
        return
    if d.get("published") is True:
        return
    if read.author is not None and read.author in (d.get("recipient"), matched.author):
        return
    if read.author is not None and "permissionGrantId" in payload:
        grant = permissions.fetch_grant(tenant, store, payload["permissionGrantId"])
        grant_authorization.authorize_records_read(read.message, matched.message, tenant, read.author, grant, store)
    elif "protocol" in d:
        protocol_authorization.authorize_read(tenant, read, matched, store)
    else:
        raise DwnError("RecordsReadAuthorizationFailed", "message failed authorization")


# --------------------------------------------------------------------------- RecordsQuery

_DATE_SORTS = {
    "createdAscending": {"dateCreated": 1},
    "createdDescending": {"dateCreated": -1},
    "publishedAscending": {"datePublished": 1},
    "publishedDescending": {"datePublished": -1},
}


def _includes_published(flt: dict[str, Any]) -> bool:
    return "datePublished" in flt or flt.get("published") is not False


def _includes_unpublished(flt: dict[str, Any]) -> bool:
    if "datePublished" not in flt and "published" not in flt:
        return True
    return flt.get("published") is False


def _filter_admits(flt: dict[str, Any], prop: str, did: str) -> bool:
    value = flt.get(prop)
    if isinstance(value, list):
        return len(value) == 0 or did in value
    return value is None or value == did


def handle_records_query(ctx: HandlerContext, tenant: str, message: Message) -> Reply:
    store = ctx.store
    try:
        query = parse_records_query(message)
    except STAGE_ERRORS as e:
        return reply_from_error(e, 400)
    d = message["descriptor"]
    flt = d["filter"]
    date_sort = d.get("dateSort")
    sort = _DATE_SORTS.get(date_sort, {"dateCreated": 1}) if isinstance(date_sort, str) else {"dateCreated": 1}
    pagination = d.get("pagination")
    base = records_util.convert_filter(flt, date_sort)

    def with_base(**extra: Any) -> dict[str, Any]:
        return {**base, "interface": "Records", "method": "Write", **extra}

    if _includes_published(flt) and query.author is None:
        entries, cursor = store.messages.query(
            tenant, [with_base(published=True, isLatestBaseState=True)], sort, pagination
        )
    else:
        try:
            authenticate(message.get("authorization"))
            _authorize_records_query(tenant, query, store)
        except STAGE_ERRORS as e:
            return reply_from_error(e, 401)
        author = query.author
        assert author is not None
        if author == tenant:
            entries, cursor = store.messages.query(tenant, [with_base(isLatestBaseState=True)], sort, pagination)
        else:
            filters: list[dict[str, Any]] = []
            if _includes_published(flt):
                filters.append(with_base(published=True, isLatestBaseState=True))
            if _includes_unpublished(flt):
                if _filter_admits(flt, "author", author):
                    filters.append({**base, "author": author, "interface": "Records", "method": "Write",
                                    "isLatestBaseState": True, "published": False})
                if "protocolRole" in (query.signature_payload or {}):
                    filters.append(with_base(isLatestBaseState=True, published=False))
                if _filter_admits(flt, "recipient", author):
                    filters.append(with_base(recipient=author, isLatestBaseState=True, published=False))
            entries, cursor = store.messages.query(tenant, filters, sort, pagination)

    for entry in entries:
        if not is_initial_write(entry):
            initial_found, _ = store.messages.query(
                tenant, [{"recordId": entry["recordId"], "isLatestBaseState": False, "method": "Write"}]
            )
            if initial_found:
                initial_found[0].pop("encodedData", None)
                entry["initialWrite"] = initial_found[0]
    return Reply(200, "OK", entries=entries, cursor=cursor)


def _authorize_records_query(tenant: str, query: GenericMessage, store: Store) -> None:
    if query.is_signed_by_author_delegate:
        grant = PermissionGrant.parse(query.message["authorization"]["authorDelegatedGrant"])
        grant_authorization.authorize_records_query_or_subscribe(
            query.message, _did(query.author), _did(query.signer), grant, store
        )
    if "protocolRole" in (query.signature_payload or {}):
        protocol_authorization.authorize_query_or_subscribe(tenant, query, store)
