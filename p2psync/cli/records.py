"""A record's lifecycle from the command line: ``update``, ``delete`` and ``show`` (docs/cli.md).

``update`` and ``delete`` author messages with the engine's own functions
(:meth:`RecordsWrite.create_from`, :func:`create_records_delete`) and process them as a local
write is; ``show`` reads the record's history from the archive
(:func:`p2psync.state.records.record_history`).
"""

from __future__ import annotations

import argparse
import json
from typing import Any, Final

from p2psync.cli.common import EXIT_OK, CliError, authored, check_reply, open_node, print_json, read_data
from p2psync.dwn.did import Identity
from p2psync.dwn.encoding import message_cid
from p2psync.dwn.engine import Dwn
from p2psync.dwn.generic_message import get_newest_message
from p2psync.dwn.records import create_records_delete
from p2psync.dwn.records_write import RecordsWrite
from p2psync.dwn.timeutil import format_epoch_ns, now_timestamp, parse_timestamp
from p2psync.state.records import STATUS_TEXT, RecordHistory, record_history

__all__ = ["cmd_delete", "cmd_show", "cmd_update", "parse_tags", "show_lines"]

#: The DWN's timestamps have microseconds: the least step that makes a message newer.
_ONE_MICROSECOND_NS: Final = 1_000


def parse_tags(values: list[str] | None) -> dict[str, Any] | None:
    """``--tag k=v`` (a string) and ``--tag k:=JSON`` (a number, boolean or list), or None."""
    if not values:
        return None
    tags: dict[str, Any] = {}
    for item in values:
        if ":=" in item and item.index(":=") + 1 == item.index("="):  # the first separator is :=
            key, _, raw = item.partition(":=")
            try:
                value = json.loads(raw)
            except ValueError:
                raise CliError(f"--tag {item}: {raw!r} is not JSON (use k=v for a string)") from None
            if not isinstance(value, (str, int, float, bool, list)):
                raise CliError(f"--tag {item}: a tag is a string, number, boolean or list")
        elif "=" in item:
            key, _, value = item.partition("=")
        else:
            raise CliError(f"--tag {item}: expected KEY=VALUE (a string) or KEY:=JSON")
        if not key:
            raise CliError(f"--tag {item}: the tag has no name")
        tags[key] = value
    return tags


def _after(timestamp: str) -> str:
    """Now, or just after ``timestamp`` when this device's clock is behind it: an update or a
    delete must be newer than the write it replaces, or the DWN refuses it (409)."""
    now = now_timestamp()
    if now > timestamp:
        return now
    return format_epoch_ns(parse_timestamp(timestamp) + _ONE_MICROSECOND_NS)


def _history_or_fail(dwn: Dwn, tenant: str, record_id: str) -> RecordHistory:
    history = record_history(dwn.store, tenant, record_id)
    if history is None:
        raise CliError(f"no record {record_id} in this store (tenant {tenant}); "
                       "`p2psync query --include-deleted` lists the records it holds")
    return history


def _live_newest(dwn: Dwn, tenant: str, record_id: str) -> dict[str, Any]:
    """The write in force of a live record, or a one-line error saying why there is none."""
    history = _history_or_fail(dwn, tenant, record_id)
    if history.state == "deleted":
        raise CliError(f"record {record_id} was deleted by {history.in_force}; a deleted record cannot "
                       "be updated (write a new one)")
    if history.state != "live":
        raise CliError(f"record {record_id} is {history.state} here ({history.pruned_by or 'no write in force'});"
                       " see `p2psync show`")
    messages, _ = dwn.store.messages.query(tenant, [{"interface": "Records", "method": "Write",
                                                     "recordId": record_id}])
    newest = get_newest_message(messages)
    if newest is None:  # the history said live: only a concurrent delete gets here
        raise CliError(f"record {record_id} has no write in force; see `p2psync show {record_id}`")
    return newest


def cmd_update(args: argparse.Namespace) -> int:
    tags = parse_tags(args.tag)
    data = None if args.keep_data else read_data(args)
    identity, dwn = open_node(args)
    tenant = args.tenant or identity.did
    try:
        newest = _live_newest(dwn, tenant, args.record_id)
        update = _author_update(identity, newest, data, tags, args)
        reply = dwn.process_message(tenant, update.message, data)
        check_reply(reply, "update")
    finally:
        dwn.close()
    out = {
        "recordId": update.record_id,
        "messageCid": message_cid(update.message),
        "replaces": message_cid({k: v for k, v in newest.items() if k != "encodedData"}),
        "dataCid": update.descriptor["dataCid"],
        "dataSize": update.descriptor["dataSize"],
        "dateModified": update.descriptor["messageTimestamp"],
        "status": reply.code,
    }
    print_json(out)
    return EXIT_OK


def _author_update(identity: Identity, newest: dict[str, Any], data: bytes | None, tags: dict[str, Any] | None,
                   args: argparse.Namespace) -> RecordsWrite:
    """A newer write of the record: the immutable properties of its writes (protocol, path,
    schema, context, recipient, dateCreated) kept, the rest given or kept from ``newest``."""
    source = {k: v for k, v in newest.items() if k != "encodedData"}
    kept_tags = tags if tags is not None else source["descriptor"].get("tags")
    write: RecordsWrite = authored(lambda: RecordsWrite.create_from(
        source,
        signer=identity,
        data=data,
        data_format=args.data_format,
        published=args.published,
        message_timestamp=_after(str(source["descriptor"]["messageTimestamp"])),
        tags=kept_tags,
    ))
    return write


def cmd_delete(args: argparse.Namespace) -> int:
    identity, dwn = open_node(args)
    tenant = args.tenant or identity.did
    try:
        history = _history_or_fail(dwn, tenant, args.record_id)
        if history.state == "deleted" and not args.prune:
            raise CliError(f"record {args.record_id} is already deleted (by {history.in_force})")
        if history.state in ("pruned", "absent"):
            raise CliError(f"record {args.record_id} is {history.state} here; nothing to delete")
        latest = max(e.timestamp for e in history.entries)
        message = authored(lambda: create_records_delete(record_id=args.record_id, signer=identity,
                                                         prune=args.prune, message_timestamp=_after(latest)))
        reply = dwn.process_message(tenant, message)
        check_reply(reply, "delete")
        pruned = 0
        if args.prune:
            after = record_history(dwn.store, tenant, args.record_id)
            pruned = after.pruned_descendants if after is not None else 0
    finally:
        dwn.close()
    out: dict[str, Any] = {"recordId": args.record_id, "messageCid": message_cid(message), "prune": args.prune,
                           "status": reply.code}
    if args.prune:
        out["prunedDescendants"] = pruned
    print_json(out)
    return EXIT_OK


def _origin(origin: str | None) -> str:
    return "here" if origin is None else f"from store {origin}"


def show_lines(history: RecordHistory) -> list[str]:
    """``show`` for a person: what the record is and its state, then one line a message."""
    d = history.descriptor
    what = " ".join(x for x in (d.get("protocol"), d.get("protocolPath")) if x) or d.get("schema") or "no protocol"
    lines = [f"record {history.record_id} ({what}; {d.get('dataFormat', '?')})"]
    if history.state == "live":
        lines.append(f"live: in force {history.in_force}")
    elif history.state == "deleted":
        lines.append(f"deleted by {history.in_force}")
    elif history.state == "pruned":
        lines.append(f"pruned by {history.pruned_by} (an ancestor's delete with prune)")
    else:
        lines.append("no write in force (every write was refused)")
    if history.pruned_descendants:
        lines.append(f"its delete pruned {history.pruned_descendants} descendant record(s)")
    lines.append(f"history ({len(history.entries)} message(s), oldest first; origin 'here': written in "
                 f"this store {history.here}):")
    for e in history.entries:
        if e.kind == "RecordsWrite":
            what = ("initial write" if e.initial else "update") + f" {e.data_size:>9} B"
        else:
            what = "delete, prune" if e.prune else "delete"
        who = "" if e.author == history.tenant else f"  author {e.author}"
        status = STATUS_TEXT[e.status] + (f" {e.by}" if e.by else "")
        if e.conflict:
            status += " (another store's newer write won)"
        lines.append(f"  {e.timestamp}  {e.cid}  {what}  {_origin(e.origin)}{who}  -> {status}")
    conflicts = history.conflicts
    if conflicts:
        lines.append(f"{len(conflicts)} write(s) lost to another store's newer write (newest wins; a DWN write names "
                     "no parent, so a concurrent update and a later edit there look alike); the archive keeps them")
    return lines


def cmd_show(args: argparse.Namespace) -> int:
    identity, dwn = open_node(args)
    tenant = args.tenant or identity.did
    try:
        history = _history_or_fail(dwn, tenant, args.record_id)
    finally:
        dwn.close()
    if args.json:
        print_json(history.to_json())
    else:
        print("\n".join(show_lines(history)))
    return EXIT_OK
