"""Pure helpers around Records messages, as the reference's ``Records`` utility class has them.

dwn-sdk-js 0.5.2 keeps these in ``src/utils/records.ts`` (plus two from ``utils/filter.ts``):
the check that a delegated grant embedded in a message really is the grant its signature names,
the flattening of ``tags`` into ``tag.<name>`` index keys, and the conversion of a client's
``RecordsFilter`` into the filter the message store evaluates.

The JavaScript value rules these checks lean on (``===``, ``undefined`` versus ``null``,
string coercion, truthiness) are in :mod:`p2psync.dwn.js_values`.
"""

from __future__ import annotations

from typing import Any, Final

from p2psync.dwn import urls
from p2psync.dwn.encoding import message_cid
from p2psync.dwn.errors import DwnError
from p2psync.dwn.js_values import (
    JS_TYPE_ERROR,
    UNDEFINED,
    js_error,
    js_get,
    js_strict_equal,
    js_to_string,
    js_truthy,
)
from p2psync.dwn.jws import signer_did
from p2psync.dwn.permission_grant import PermissionGrant

__all__ = [
    "build_tag_indexes",
    "can_perform_delete_against_record",
    "construct_prefix_filter_as_range_filter",
    "convert_filter",
    "convert_range_criterion",
    "convert_tags_filter",
    "filter_includes_published_records",
    "filter_includes_unpublished_records",
    "get_parent_context_from_of_context_id",
    "is_records_write",
    "is_signed_by_author_delegate",
    "is_signed_by_owner_delegate",
    "is_starts_with_filter",
    "normalize_filter",
    "should_build_unpublished_author_filter",
    "should_build_unpublished_recipient_filter",
    "should_protocol_authorize",
    "validate_delegated_grant_referential_integrity",
]

#: ``dateSort`` values of a RecordsQuery that sort by ``datePublished`` (``DateSort`` enum).
PUBLISHED_DATE_SORTS: Final = frozenset({"publishedAscending", "publishedDescending"})

#: Appended to a prefix to make the exclusive upper bound of a prefix range
#: (``FilterUtility.constructPrefixFilterAsRangeFilter``): the largest BMP code unit.
PREFIX_RANGE_SENTINEL: Final = "\uffff"


# --------------------------------------------------------------------------- message shape


def is_records_write(message: dict[str, Any]) -> bool:
    """Whether ``message`` is a RecordsWrite (``Records.isRecordsWrite``)."""
    descriptor: dict[str, Any] = message["descriptor"]
    return descriptor.get("interface") == "Records" and descriptor.get("method") == "Write"


def is_signed_by_author_delegate(message: dict[str, Any]) -> bool:
    """Whether an author-delegate signed ``message`` (it carries ``authorDelegatedGrant``)."""
    authorization = message.get("authorization")
    return isinstance(authorization, dict) and "authorDelegatedGrant" in authorization


def is_signed_by_owner_delegate(message: dict[str, Any]) -> bool:
    """Whether an owner-delegate signed ``message`` (it carries ``ownerDelegatedGrant``)."""
    authorization = message.get("authorization")
    return isinstance(authorization, dict) and "ownerDelegatedGrant" in authorization


def get_parent_context_from_of_context_id(context_id: str | None) -> str | None:
    """The context ID of the parent: ``a/b/c`` -> ``a/b``; a root ``a`` -> ``""``.

    ``None`` stays ``None``. Assumes a well-formed ``a/b/c`` context ID, as the reference does.
    """
    if context_id is None:
        return None
    last = context_id.rfind("/")
    return "" if last == -1 else context_id[:last]


def should_protocol_authorize(signature_payload: dict[str, Any]) -> bool:
    """Whether the signer invokes a protocol role (``protocolRole`` in the payload)."""
    return "protocolRole" in signature_payload


def can_perform_delete_against_record(
    delete_message: dict[str, Any], newest_existing_message: dict[str, Any] | None
) -> bool:
    """Whether a RecordsDelete may act on a record whose newest message is the one given.

    Not when there is no record, when it is already deleted (unless this delete prunes), or
    when it is already pruned.
    """
    if newest_existing_message is None:
        return False
    if newest_existing_message["descriptor"].get("method") == "Delete":
        if delete_message["descriptor"].get("prune") is not True:
            return False
        if newest_existing_message["descriptor"].get("prune") is True:
            return False
    return True


# --------------------------------------------------------------------------- delegated grants


def validate_delegated_grant_referential_integrity(
    message: dict[str, Any],
    signature_payload: dict[str, Any] | None,
    owner_signature_payload: dict[str, Any] | None = None,
) -> None:
    """Check the author- and owner-delegated grants a Records message embeds (400 on failure).

    For each of the two: the ``delegatedGrantId`` in the matching signature payload and the
    embedded grant exist together or not at all; the grant is ``delegated: true``; it is granted
    to the DID that made that signature; and its CID is the ``delegatedGrantId`` signed.
    """
    authorization = message.get("authorization")
    if not isinstance(authorization, dict):
        authorization = {}

    author_id_defined = signature_payload is not None and "delegatedGrantId" in signature_payload
    author_grant_defined = "authorDelegatedGrant" in authorization
    if author_id_defined != author_grant_defined:
        raise DwnError(
            "RecordsAuthorDelegatedGrantAndIdExistenceMismatch",
            "delegatedGrantId in message (author) signature and authorDelegatedGrant must both "
            f"exist or be undefined. delegatedGrantId in message (author) signature defined: "
            f"{_js_bool(author_id_defined)}, authorDelegatedGrant defined: "
            f"{_js_bool(author_grant_defined)}",
        )
    if author_grant_defined:
        assert signature_payload is not None  # implied by the existence check above
        grant_message = authorization["authorDelegatedGrant"]
        grant = PermissionGrant.parse(grant_message)
        if grant.delegated is not True:
            raise DwnError(
                "RecordsAuthorDelegatedGrantNotADelegatedGrant",
                "The owner delegated grant given is not a delegated grant.",
            )
        granted_to = js_get(js_get(grant_message, "descriptor"), "recipient")
        signer = signer_did(authorization["signature"])
        if not js_strict_equal(granted_to, signer):
            raise DwnError(
                "RecordsAuthorDelegatedGrantGrantedToAndOwnerSignatureMismatch",
                f"grantedTo {js_to_string(granted_to)} in author delegated grant must be the "
                f"same as the signer {signer} of the message signature.",
            )
        grant_cid = message_cid(grant_message)
        if not js_strict_equal(grant_cid, signature_payload["delegatedGrantId"]):
            raise DwnError(
                "RecordsAuthorDelegatedGrantCidMismatch",
                f"CID of the author delegated grant {grant_cid} must be the same as the "
                f"delegatedGrantId {signature_payload['delegatedGrantId']} in the message "
                "signature.",
            )

    owner_id_defined = (
        owner_signature_payload is not None and "delegatedGrantId" in owner_signature_payload
    )
    owner_grant_defined = "ownerDelegatedGrant" in authorization
    if owner_id_defined != owner_grant_defined:
        raise DwnError(
            "RecordsOwnerDelegatedGrantAndIdExistenceMismatch",
            "delegatedGrantId in owner signature and ownerDelegatedGrant must both exist or be "
            f"undefined. delegatedGrantId in owner signature defined: "
            f"{_js_bool(owner_id_defined)}, ownerDelegatedGrant defined: "
            f"{_js_bool(owner_grant_defined)}",
        )
    if owner_grant_defined:
        assert owner_signature_payload is not None
        grant_message = authorization["ownerDelegatedGrant"]
        grant = PermissionGrant.parse(grant_message)
        if grant.delegated is not True:
            raise DwnError(
                "RecordsOwnerDelegatedGrantNotADelegatedGrant",
                "The owner delegated grant given is not a delegated grant.",
            )
        granted_to = js_get(js_get(grant_message, "descriptor"), "recipient")
        signer = signer_did(authorization["ownerSignature"])
        if not js_strict_equal(granted_to, signer):
            raise DwnError(
                "RecordsOwnerDelegatedGrantGrantedToAndOwnerSignatureMismatch",
                f"grantedTo {js_to_string(granted_to)} in owner delegated grant must be the "
                f"same as the signer {signer} of the owner signature.",
            )
        grant_cid = message_cid(grant_message)
        if not js_strict_equal(grant_cid, owner_signature_payload["delegatedGrantId"]):
            raise DwnError(
                "RecordsOwnerDelegatedGrantCidMismatch",
                f"CID of the owner delegated grant {grant_cid} must be the same as the "
                f"delegatedGrantId {owner_signature_payload['delegatedGrantId']} in the owner "
                "signature.",
            )


# --------------------------------------------------------------------------- tags and filters


def build_tag_indexes(tags: dict[str, Any]) -> dict[str, Any]:
    """Index keys for a write's tags: ``{"a": 1}`` -> ``{"tag.a": 1}``.

    The ``tag.`` prefix keeps user tag names apart from first-class index keys.
    """
    return {f"tag.{name}": value for name, value in tags.items()}


def is_starts_with_filter(value: Any) -> bool:
    """Whether a tag filter is ``{"startsWith": "<prefix>"}`` (a string prefix)."""
    if value is None:
        # `'startsWith' in null` is a TypeError in the reference.
        raise js_error(JS_TYPE_ERROR, "Cannot use 'in' operator to search for 'startsWith' in null")
    return isinstance(value, dict) and isinstance(value.get("startsWith"), str)


def construct_prefix_filter_as_range_filter(prefix: Any) -> dict[str, Any]:
    """A range matching every string that starts with ``prefix``."""
    return {"gte": prefix, "lt": js_to_string(prefix) + PREFIX_RANGE_SENTINEL}


def convert_range_criterion(criterion: Any) -> dict[str, Any] | None:
    """``{from, to}`` (from inclusive, to exclusive) as a store range ``{gte, lt}``.

    ``None`` when neither bound is given.
    """
    if not isinstance(criterion, dict):
        return None  # a non-object has neither bound in JS either
    has_from, has_to = "from" in criterion, "to" in criterion
    if has_from and has_to:
        return {"gte": criterion["from"], "lt": criterion["to"]}
    if has_to:
        return {"lt": criterion["to"]}
    if has_from:
        return {"gte": criterion["from"]}
    return None


def convert_tags_filter(tags: dict[str, Any]) -> dict[str, Any]:
    """Tag filters as store filters on ``tag.<name>``; a ``startsWith`` becomes a range."""
    converted: dict[str, Any] = {}
    for name, value in tags.items():
        if is_starts_with_filter(value):
            converted[f"tag.{name}"] = construct_prefix_filter_as_range_filter(value["startsWith"])
        else:
            converted[f"tag.{name}"] = value
    return converted


def convert_filter(records_filter: dict[str, Any], date_sort: str | None = None) -> dict[str, Any]:
    """A client's RecordsFilter as the filter the message store evaluates (``convertFilter``).

    Tags become ``tag.*`` keys; ``dateCreated``/``datePublished``/``dateUpdated`` ranges become
    ``{gte, lt}`` ranges (``dateUpdated`` on ``messageTimestamp``); a ``datePublished`` range or
    a sort by publication date restricts to published records; ``contextId`` matches as a
    prefix; an empty ``author`` or ``recipient`` list is dropped.
    """
    converted: dict[str, Any] = {k: v for k, v in records_filter.items() if k != "tags"}
    if "tags" in records_filter:
        converted.update(convert_tags_filter(records_filter["tags"]))

    # The reference tests these with truthiness; each is an object there, hence truthy.
    date_created = records_filter.get("dateCreated")
    if js_truthy(date_created):
        range_filter = convert_range_criterion(date_created)
        if range_filter is not None:
            converted["dateCreated"] = range_filter

    date_published = records_filter.get("datePublished")
    if js_truthy(date_published):
        range_filter = convert_range_criterion(date_published)
        if range_filter is not None:
            converted["published"] = True
            converted["datePublished"] = range_filter

    if converted.get("published") is not True and date_sort in PUBLISHED_DATE_SORTS:
        converted["published"] = True

    date_updated = records_filter.get("dateUpdated")
    if js_truthy(date_updated):
        range_filter = convert_range_criterion(date_updated)
        if range_filter is not None:
            converted["messageTimestamp"] = range_filter
            converted.pop("dateUpdated", None)

    context_id = records_filter.get("contextId")
    if js_truthy(context_id):
        converted["contextId"] = construct_prefix_filter_as_range_filter(context_id)

    # An empty one-of list can match nothing; the reference drops it instead.
    for key in ("author", "recipient"):
        if converted.get(key) == []:
            del converted[key]
    return converted


def normalize_filter(records_filter: dict[str, Any]) -> dict[str, Any]:
    """A copy of the filter with ``protocol`` and ``schema`` URLs normalized."""
    normalized = dict(records_filter)
    if isinstance(normalized.get("protocol"), str):
        normalized["protocol"] = urls.normalize_protocol_url(normalized["protocol"])
    if isinstance(normalized.get("schema"), str):
        normalized["schema"] = urls.normalize_schema_url(normalized["schema"])
    _reject_nested_null(list(normalized.values()))
    return normalized


def _reject_nested_null(values: list[Any]) -> None:
    # The reference's removeUndefinedProperties recurses into every `typeof 'object'` value,
    # arrays included, and calls Object.keys on it, which throws for null.
    for item in values:
        if item is None:
            raise js_error(JS_TYPE_ERROR, "Cannot convert undefined or null to object")
        if isinstance(item, dict):
            _reject_nested_null(list(item.values()))
        elif isinstance(item, list):
            _reject_nested_null(item)


def filter_includes_published_records(records_filter: dict[str, Any]) -> bool:
    """Whether the filter can match published records."""
    return "datePublished" in records_filter or records_filter.get("published") is not False


def filter_includes_unpublished_records(records_filter: dict[str, Any]) -> bool:
    """Whether the filter can match unpublished records."""
    if "datePublished" not in records_filter and "published" not in records_filter:
        return True
    return records_filter.get("published", UNDEFINED) is False


def should_build_unpublished_recipient_filter(
    records_filter: dict[str, Any], recipient: str
) -> bool:
    """Whether a query by ``recipient`` should also look at unpublished records sent to them."""
    return _filter_admits(records_filter.get("recipient", UNDEFINED), recipient)


def should_build_unpublished_author_filter(records_filter: dict[str, Any], author: str) -> bool:
    """Whether a query by ``author`` should also look at the unpublished records they wrote."""
    return _filter_admits(records_filter.get("author", UNDEFINED), author)


def _filter_admits(value: Any, did: str) -> bool:
    if isinstance(value, list):
        return len(value) == 0 or any(js_strict_equal(v, did) for v in value)
    return value is UNDEFINED or js_strict_equal(value, did)


def _js_bool(flag: bool) -> str:
    return "true" if flag else "false"
