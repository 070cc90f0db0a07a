"""Protocol-based checks of Records messages: the reference's ``ProtocolAuthorization``.

dwn-sdk-js 0.5.2 (``core/protocol-authorization.ts``) splits them in two:

* structure (:func:`validate_referential_integrity`, applied to every protocol RecordsWrite,
  the tenant's too, and refused with 400 by the handler): the type is declared and its schema
  and data format match, the protocol path follows the parent record, the context ID extends
  the parent's, a role record has a recipient who holds that role only once in its context,
  the data size is within ``$size``, the tags conform to ``$tags``;
* actions (:func:`authorize_write`, :func:`authorize_read`, :func:`authorize_delete`,
  :func:`authorize_query_or_subscribe`, refused with 401): some ``$actions`` rule of the rule
  set at the record's path allows this author to do this — as anyone, as the author or
  recipient of an ancestor record, as the recipient of this record, or by invoking a role
  (``protocolRole`` in the signature payload) that a role record gives them. Handlers call
  these only for non-tenant authors.

Rule sets are looked up the way JS reads nested object properties, including its quirks (a
path segment naming an ``Object.prototype`` member finds "something").
"""

from __future__ import annotations

from typing import Any, Final

from p2psync.dwn import permissions
from p2psync.dwn.errors import DwnError
from p2psync.dwn.generic_message import GenericMessage, Message, get_author
from p2psync.dwn.js_values import UNDEFINED, js_get, js_strict_equal, js_truthy
from p2psync.dwn.protocols import (
    ProtocolAction,
    ProtocolActor,
    TagsSchemaCompileError,
    compile_tags_validator,
)
from p2psync.dwn.records_util import (
    construct_prefix_filter_as_range_filter,
    get_parent_context_from_of_context_id,
)
from p2psync.dwn.records_write import (
    RecordsWrite,
    fetch_initial_records_write,
    get_initial_write,
)
from p2psync.dwn.store import Store

__all__ = [
    "authorize_delete",
    "authorize_query_or_subscribe",
    "authorize_read",
    "authorize_write",
    "fetch_protocol_definition",
    "get_rule_set_at_protocol_path",
    "validate_referential_integrity",
]

# Records messages other than RecordsWrite, parsed: RecordsRead/Query/Subscribe/Delete.
IncomingMessage = GenericMessage | RecordsWrite

# Status of a refused structure check: the RecordsWrite handler answers these with 400.
_BAD_REQUEST: Final = 400
# Status of a refused action: every handler answers these with 401.
_UNAUTHORIZED: Final = 401

# Names every JS object inherits from Object.prototype: `ruleSet["toString"]` is a function,
# so a protocol path segment with such a name finds "a rule set" with no rules in it.
_OBJECT_PROTOTYPE_MEMBERS: Final = frozenset(
    {
        "__defineGetter__", "__defineSetter__", "__lookupGetter__", "__lookupSetter__",
        "__proto__", "constructor", "hasOwnProperty", "isPrototypeOf",
        "propertyIsEnumerable", "toLocaleString", "toString", "valueOf",
    }
)


class _InheritedMember(dict[str, Any]):
    """Stands for a function or object JS finds on the prototype chain: truthy, no own rules."""

    def __bool__(self) -> bool:
        return True


_INHERITED: Final = _InheritedMember()


def _refuse(code: str, detail: str, status: int) -> DwnError:
    return DwnError(code, detail, status)


def _text(value: str | None) -> str:
    """A possibly absent DID or URI in a detail, as the reference's template strings show it."""
    return "undefined" if value is None else value


# --------------------------------------------------------------------------- lookups


def fetch_protocol_definition(tenant: str, protocol_uri: str, store: Store) -> dict[str, Any]:
    """The definition of ``protocol_uri`` configured in ``tenant``'s DWN.

    The built-in permissions protocol is never stored; its definition is a constant.
    """
    builtin = permissions.builtin_protocol_definition(protocol_uri)
    if builtin is not None:
        return builtin
    cids = store.messages.query_cids(
        tenant, [{"interface": "Protocols", "method": "Configure", "protocol": protocol_uri}]
    )
    definition = _DEFINITIONS.get(cids[0]) if cids else None
    if definition is None:
        configure = store.messages.get(tenant, cids[0]) if cids else None
        if configure is None:
            raise _refuse(
                "ProtocolAuthorizationProtocolNotFound",
                f"unable to find protocol definition for {_text(protocol_uri)}",
                _BAD_REQUEST,
            )
        definition = configure["descriptor"]["definition"]
        _DEFINITIONS[cids[0]] = definition
        if len(_DEFINITIONS) > _DEFINITION_CACHE_SIZE:
            _DEFINITIONS.pop(next(iter(_DEFINITIONS)))
    return definition


# Parsed definitions by the CID of their ProtocolsConfigure: a CID fixes its content, so the
# cache needs no invalidation; a write looks its definition up twice, as the reference does.
# Callers only read definitions.
_DEFINITION_CACHE_SIZE = 256
_DEFINITIONS: dict[str, dict[str, Any]] = {}


def _js_member(node: Any, key: str) -> Any:
    """``node[key]`` for a rule-set lookup, with JS's inherited members."""
    if isinstance(node, dict) and not isinstance(node, _InheritedMember) and key in node:
        return node[key]
    if key in _OBJECT_PROTOTYPE_MEMBERS:
        return _INHERITED
    return UNDEFINED


def get_rule_set_at_protocol_path(protocol_path: str, definition: dict[str, Any]) -> Any:
    """The rule set at ``a/b/c`` in the definition's structure, or ``UNDEFINED``."""
    current: Any = definition["structure"]
    for segment in protocol_path.split("/"):
        current = _js_member(current, segment)
        if current is UNDEFINED:
            return UNDEFINED
    return current


def _get_rule_set(protocol_path: str, definition: dict[str, Any], status: int) -> Any:
    rule_set = get_rule_set_at_protocol_path(protocol_path, definition)
    if rule_set is UNDEFINED:
        raise _refuse(
            "ProtocolAuthorizationMissingRuleSet",
            f"No rule set defined for protocolPath {protocol_path}",
            status,
        )
    return rule_set


def _rule_member(rule_set: Any, key: str) -> Any:
    """A ``$`` member of a rule set (``UNDEFINED`` for the stand-in of an inherited member)."""
    if isinstance(rule_set, dict) and not isinstance(rule_set, _InheritedMember):
        return rule_set.get(key, UNDEFINED)
    return UNDEFINED


def _fetch_initial_write(tenant: str, record_id: str, store: Store) -> Message | None:
    messages, _ = store.messages.query(
        tenant, [{"interface": "Records", "method": "Write", "recordId": record_id}]
    )
    if not messages:
        return None
    return get_initial_write(messages)


def _construct_record_chain(
    tenant: str, descendant_record_id: str | None, store: Store
) -> list[Message]:
    """Initial writes from the root record down to ``descendant_record_id`` (inclusive)."""
    if descendant_record_id is None:
        return []
    chain: list[Message] = []
    current: str | None = descendant_record_id
    while current is not None:
        initial = _fetch_initial_write(tenant, current, store)
        if initial is None:
            # Parents are checked when a record is written, so this means a broken store.
            raise _refuse(
                "ProtocolAuthorizationParentNotFoundConstructingRecordChain",
                f"Unexpected error that should never trigger: no parent found with ID {current} "
                "when constructing record chain.",
                _UNAUTHORIZED,
            )
        chain.append(initial)
        current = initial["descriptor"].get("parentId")
    chain.reverse()
    return chain


# --------------------------------------------------------------------------- structure


def validate_referential_integrity(tenant: str, write: RecordsWrite, store: Store) -> None:
    """Structure checks of a protocol RecordsWrite (400 on failure), the tenant's included."""
    descriptor = write.descriptor
    definition = fetch_protocol_definition(tenant, descriptor["protocol"], store)
    _verify_type(write.message, definition["types"])
    _verify_protocol_path_and_context_id(tenant, write, store)
    rule_set = _get_rule_set(descriptor["protocolPath"], definition, _BAD_REQUEST)
    _verify_as_role_record_if_needed(tenant, write, rule_set, store)
    _verify_size_limit(write, rule_set)
    _verify_tags_if_needed(write, rule_set)


def _type_name(protocol_path: str) -> str:
    return protocol_path.split("/")[-1]


def _verify_type(message: Message, types: dict[str, Any]) -> None:
    descriptor = message["descriptor"]
    type_name = _type_name(descriptor["protocolPath"])
    if type_name not in types:
        raise _refuse(
            "ProtocolAuthorizationInvalidType",
            f"record with type {type_name} not allowed in protocol",
            _BAD_REQUEST,
        )
    protocol_type = types[type_name]
    expected_schema = protocol_type.get("schema")
    if expected_schema is not None and expected_schema != descriptor.get("schema"):
        raise _refuse(
            "ProtocolAuthorizationInvalidSchema",
            f"type '{type_name}' must have schema '{expected_schema}', instead has "
            f"'{descriptor.get('schema', 'undefined')}'",
            _BAD_REQUEST,
        )
    data_formats = protocol_type.get("dataFormats")
    if data_formats is not None and descriptor.get("dataFormat") not in data_formats:
        raise _refuse(
            "ProtocolAuthorizationIncorrectDataFormat",
            f"type '{type_name}' must have data format in ({','.join(data_formats)}), instead "
            f"has '{descriptor.get('dataFormat')}'",
            _BAD_REQUEST,
        )


def _verify_protocol_path_and_context_id(tenant: str, write: RecordsWrite, store: Store) -> None:
    descriptor = write.descriptor
    declared_path = descriptor["protocolPath"]
    type_name = _type_name(declared_path)
    parent_id = descriptor.get("parentId")
    if parent_id is None:
        if declared_path != type_name:
            raise _refuse(
                "ProtocolAuthorizationParentlessIncorrectProtocolPath",
                f"Declared protocol path '{declared_path}' is not valid for records with no "
                "parent'.",
                _BAD_REQUEST,
            )
        return
    # Only the parent's latest state counts: a deleted parent takes no children.
    parents, _ = store.messages.query(
        tenant,
        [
            {
                "isLatestBaseState": True,
                "interface": "Records",
                "method": "Write",
                "protocol": descriptor["protocol"],
                "recordId": parent_id,
            }
        ],
    )
    parent = parents[0] if parents else None
    parent_path = parent["descriptor"].get("protocolPath") if parent is not None else None
    # The reference builds `${parentProtocolPath}/${type}`, which reads "undefined/..." when
    # there is no parent and never matches a declared path (letters and slashes only).
    if parent is None or parent_path is None or f"{parent_path}/{type_name}" != declared_path:
        raise _refuse(
            "ProtocolAuthorizationIncorrectProtocolPath",
            f"Could not find matching parent record to verify declared protocol path "
            f"'{declared_path}'.",
            _BAD_REQUEST,
        )
    expected_context = f"{parent.get('contextId', 'undefined')}/{write.message['recordId']}"
    actual_context = write.message.get("contextId")
    if actual_context != expected_context:
        raise _refuse(
            "ProtocolAuthorizationIncorrectContextId",
            f"Declared contextId '{actual_context}' is not the same as expected: "
            f"'{expected_context}'.",
            _BAD_REQUEST,
        )


def _verify_as_role_record_if_needed(
    tenant: str, write: RecordsWrite, rule_set: Any, store: Store
) -> None:
    """A role record names its holder as recipient, once per parent context."""
    if not js_truthy(_rule_member(rule_set, "$role")):
        return
    descriptor = write.descriptor
    recipient = descriptor.get("recipient")
    if recipient is None:
        raise _refuse(
            "ProtocolAuthorizationRoleMissingRecipient",
            "Role records must have a recipient",
            _BAD_REQUEST,
        )
    protocol_path = descriptor["protocolPath"]
    flt: dict[str, Any] = {
        "interface": "Records",
        "method": "Write",
        "isLatestBaseState": True,
        "protocol": descriptor["protocol"],
        "protocolPath": protocol_path,
        "recipient": recipient,
    }
    parent_context = get_parent_context_from_of_context_id(write.message.get("contextId"))
    if parent_context:
        flt["contextId"] = construct_prefix_filter_as_range_filter(parent_context)
    matches, _ = store.messages.query(tenant, [flt])
    if any(m.get("recordId") != write.message.get("recordId") for m in matches):
        raise _refuse(
            "ProtocolAuthorizationDuplicateRoleRecipient",
            f"DID '{recipient}' is already recipient of a role record at protocol path "
            f"'{protocol_path} under the parent context {parent_context}.",
            _BAD_REQUEST,
        )


def _verify_size_limit(write: RecordsWrite, rule_set: Any) -> None:
    size = _rule_member(rule_set, "$size")
    limits = size if isinstance(size, dict) else {}
    minimum = limits.get("min", 0)
    maximum = limits.get("max")
    data_size = write.descriptor["dataSize"]
    if data_size < minimum:
        raise _refuse(
            "ProtocolAuthorizationMinSizeInvalid",
            f"data size {data_size} is less than allowed {minimum}",
            _BAD_REQUEST,
        )
    if maximum is not None and data_size > maximum:
        raise _refuse(
            "ProtocolAuthorizationMaxSizeInvalid",
            f"data size {data_size} is more than allowed {maximum}",
            _BAD_REQUEST,
        )


def _verify_tags_if_needed(write: RecordsWrite, rule_set: Any) -> None:
    tags_rule = _rule_member(rule_set, "$tags")
    if tags_rule is UNDEFINED:
        return
    descriptor = write.descriptor
    tags = descriptor.get("tags", {})
    where = f"{descriptor['protocol']}/{descriptor['protocolPath']}/$tags"
    try:
        errors = compile_tags_validator(tags_rule)(tags)
    except TagsSchemaCompileError as exc:
        # The reference lets AJV's compile error escape as a plain Error: still a 400 there.
        raise _refuse(
            "ProtocolAuthorizationTagsSchemaCompileFailed", str(exc), _BAD_REQUEST
        ) from None
    if errors:
        raise _refuse(
            "ProtocolAuthorizationTagsInvalidSchema",
            "tags schema validation error: " + ", ".join(f"{where}{e}" for e in errors[:1]),
            _BAD_REQUEST,
        )


# --------------------------------------------------------------------------- actions


def authorize_write(tenant: str, write: RecordsWrite, store: Store) -> None:
    """Whether a non-tenant may write this protocol record (401 when not)."""
    descriptor = write.descriptor
    existing_initial = _fetch_initial_write(tenant, write.message["recordId"], store)
    if existing_initial is None:
        chain = _construct_record_chain(tenant, descriptor.get("parentId"), store)
    else:
        chain = _construct_record_chain(tenant, write.message["recordId"], store)
    definition = fetch_protocol_definition(tenant, descriptor["protocol"], store)
    rule_set = _get_rule_set(descriptor["protocolPath"], definition, _UNAUTHORIZED)
    _verify_invoked_role(
        tenant, write, descriptor["protocol"], write.message.get("contextId"), definition, store
    )
    _authorize_against_allowed_actions(tenant, write, rule_set, chain, store)


def authorize_read(
    tenant: str, read: GenericMessage, newest_write: RecordsWrite, store: Store
) -> None:
    """Whether a non-tenant may read the record whose newest write is given (401 when not)."""
    descriptor = newest_write.descriptor
    chain = _construct_record_chain(tenant, newest_write.message["recordId"], store)
    definition = fetch_protocol_definition(tenant, descriptor["protocol"], store)
    rule_set = _get_rule_set(descriptor["protocolPath"], definition, _UNAUTHORIZED)
    _verify_invoked_role(
        tenant,
        read,
        descriptor["protocol"],
        newest_write.message.get("contextId"),
        definition,
        store,
    )
    _authorize_against_allowed_actions(tenant, read, rule_set, chain, store)


def authorize_query_or_subscribe(tenant: str, query: GenericMessage, store: Store) -> None:
    """Whether a role-invoking RecordsQuery/RecordsSubscribe is allowed (401 when not)."""
    flt = query.message["descriptor"]["filter"]
    # Both are present: the handler calls this only for a role-invoking query, and parsing
    # such a query requires `protocolPath` (the query schema ties it to `protocol`).
    protocol: str = flt.get("protocol")
    protocol_path: str = flt.get("protocolPath")
    definition = fetch_protocol_definition(tenant, protocol, store)
    rule_set = _get_rule_set(protocol_path, definition, _UNAUTHORIZED)
    _verify_invoked_role(tenant, query, protocol, flt.get("contextId"), definition, store)
    _authorize_against_allowed_actions(tenant, query, rule_set, [], store)


def authorize_delete(
    tenant: str, delete: GenericMessage, write: RecordsWrite, store: Store
) -> None:
    """Whether a non-tenant may delete (or prune) the record ``write`` belongs to."""
    descriptor = write.descriptor
    chain = _construct_record_chain(tenant, delete.message["descriptor"]["recordId"], store)
    definition = fetch_protocol_definition(tenant, descriptor["protocol"], store)
    rule_set = _get_rule_set(descriptor["protocolPath"], definition, _UNAUTHORIZED)
    _verify_invoked_role(
        tenant, delete, descriptor["protocol"], write.message.get("contextId"), definition, store
    )
    _authorize_against_allowed_actions(tenant, delete, rule_set, chain, store)


def _verify_invoked_role(
    tenant: str,
    incoming: IncomingMessage,
    protocol_uri: str,
    context_id: str | None,
    definition: dict[str, Any],
    store: Store,
) -> None:
    """When the signer invokes ``protocolRole``, they must hold that role in this context."""
    protocol_role = (incoming.signature_payload or {}).get("protocolRole")
    if protocol_role is None:
        return
    role_rule_set = get_rule_set_at_protocol_path(protocol_role, definition)
    if role_rule_set is UNDEFINED or not js_truthy(_rule_member(role_rule_set, "$role")):
        raise _refuse(
            "ProtocolAuthorizationNotARole",
            f"Protocol path {protocol_role} does not match role record type.",
            _UNAUTHORIZED,
        )
    flt: dict[str, Any] = {
        "interface": "Records",
        "method": "Write",
        "protocol": protocol_uri,
        "protocolPath": protocol_role,
        "recipient": incoming.author,
        "isLatestBaseState": True,
    }
    ancestor_segments = len(protocol_role.split("/")) - 1
    if context_id is None and ancestor_segments > 0:
        raise _refuse(
            "ProtocolAuthorizationMissingContextId",
            "Could not verify role because contextId is missing.",
            _UNAUTHORIZED,
        )
    if ancestor_segments > 0:
        # A context role `thread/participant` is held in the context of its thread: match the
        # role record's contextId against the first segments of this message's context.
        assert context_id is not None
        prefix = "/".join(context_id.split("/")[:ancestor_segments])
        flt["contextId"] = construct_prefix_filter_as_range_filter(prefix)
    matches, _ = store.messages.query(tenant, [flt])
    if not matches:
        raise _refuse(
            "ProtocolAuthorizationMatchingRoleRecordNotFound",
            f"No matching role record found for protocol path {protocol_role}",
            _UNAUTHORIZED,
        )


def _actions_seeking_a_rule_match(
    tenant: str, incoming: IncomingMessage, store: Store
) -> list[str]:
    """The actions any of which, allowed by a rule, would authorize ``incoming``."""
    descriptor = incoming.message["descriptor"]
    method = descriptor.get("method")
    if method == "Delete":
        initial = fetch_initial_records_write(store, tenant, descriptor["recordId"])
        if initial is None:
            return []
        by_record_author = incoming.author == initial.author
        if descriptor.get("prune") is True:
            return [ProtocolAction.CO_PRUNE] + ([ProtocolAction.PRUNE] if by_record_author else [])
        return [ProtocolAction.CO_DELETE] + ([ProtocolAction.DELETE] if by_record_author else [])
    if method == "Query":
        return [ProtocolAction.QUERY]
    if method == "Read":
        return [ProtocolAction.READ]
    if method == "Subscribe":
        return [ProtocolAction.SUBSCRIBE]
    if method == "Write":
        assert isinstance(incoming, RecordsWrite)
        if incoming.is_initial_write:
            return [ProtocolAction.CREATE]
        initial = fetch_initial_records_write(store, tenant, incoming.message["recordId"])
        if initial is None:
            return []
        if incoming.author == initial.author:
            return [ProtocolAction.CO_UPDATE, ProtocolAction.UPDATE]
        return [ProtocolAction.CO_UPDATE]
    return []


def _authorize_against_allowed_actions(
    tenant: str,
    incoming: IncomingMessage,
    rule_set: Any,
    chain: list[Message],
    store: Store,
) -> None:
    """Find an ``$actions`` rule that allows this author this action, or refuse (401)."""
    method = incoming.message["descriptor"].get("method")
    actions = _actions_seeking_a_rule_match(tenant, incoming, store)
    author = incoming.author
    rules = _rule_member(rule_set, "$actions")
    if rules is UNDEFINED:
        raise _refuse(
            "ProtocolAuthorizationActionRulesNotFound",
            f"no action rule defined for Records{method}, {_text(author)} is unauthorized",
            _UNAUTHORIZED,
        )
    invoked_role = (incoming.signature_payload or {}).get("protocolRole", UNDEFINED)
    for rule in rules:
        can = js_get(rule, "can")
        if not (isinstance(can, list) and any(a in actions for a in can)):
            continue
        who = js_get(rule, "who")
        if js_strict_equal(who, ProtocolActor.ANYONE):
            return
        if author is None:
            continue
        if invoked_role is not UNDEFINED:
            # An invoked role is only honoured by a rule for that very role.
            if js_strict_equal(js_get(rule, "role"), invoked_role):
                return
            continue
        of = js_get(rule, "of")
        if js_strict_equal(who, ProtocolActor.RECIPIENT) and of is UNDEFINED:
            # "The recipient of this record": for a write, the incoming one; otherwise (a
            # co-delete or co-prune) the record being deleted, the last of the chain.
            if method == "Write":
                target = incoming.message
            elif chain:
                target = chain[-1]
            else:
                raise _refuse(
                    "TypeError",
                    "Cannot read properties of undefined (reading 'descriptor')",
                    _UNAUTHORIZED,
                )
            if target["descriptor"].get("recipient") == author:
                return
            continue
        if _check_actor(author, who, of, chain):
            return
    raise _refuse(
        "ProtocolAuthorizationActionNotAllowed",
        f"Inbound message action Records{method} by author {_text(author)} not allowed.",
        _UNAUTHORIZED,
    )


def _check_actor(author: str, who: Any, of: Any, chain: list[Message]) -> bool:
    """``who: author|recipient, of: path``: the author or recipient of that ancestor."""
    ancestor = next(
        (m for m in chain if js_strict_equal(m["descriptor"].get("protocolPath", UNDEFINED), of)),
        None,
    )
    if ancestor is None:
        return False
    if js_strict_equal(who, ProtocolActor.RECIPIENT):
        return bool(author == ancestor["descriptor"].get("recipient"))
    # The chain holds stored initial writes, parsed when they were accepted.
    return author == get_author(ancestor)
