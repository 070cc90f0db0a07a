"""Commands on this node's own data directory and store: ``init``, ``whoami``, ``protocol
install``, ``write``, ``read``, ``query`` and ``store digest``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Final

from p2psync.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    CliError,
    authored,
    check_reply,
    home_of,
    open_node,
    open_store,
    print_json,
    read_data,
)
from p2psync.cli.home import HomeError
from p2psync.cli.records import parse_tags
from p2psync.dwn.did import Identity
from p2psync.dwn.encoding import message_cid
from p2psync.dwn.engine import Dwn
from p2psync.dwn.errors import DwnError
from p2psync.dwn.protocols import ProtocolsConfigure
from p2psync.dwn.records import ALL_RECORDS_FILTER, create_records_query, create_records_read
from p2psync.dwn.records_write import RecordsWrite
from p2psync.dwn.store import Store
from p2psync.state.digest import store_digest
from p2psync.state.records import removed_records

__all__ = [
    "cmd_init", "cmd_protocol_install", "cmd_query", "cmd_read", "cmd_store_digest", "cmd_store_verify", "cmd_whoami",
    "cmd_tls_rotate", "cmd_tls_show", "cmd_write",
]


def cmd_init(args: argparse.Namespace) -> int:
    home = home_of(args)
    if args.import_key:
        expected = "the identity.json of `p2psync init`: a JSON Web Key with kty, crv, x and d"
        try:
            identity = Identity.from_jwk(json.loads(Path(args.import_key).read_text()))
        except OSError as exc:
            raise CliError(f"cannot read {args.import_key}: {exc.strerror or exc}") from None
        except KeyError as exc:
            raise CliError(f"{args.import_key} is not an identity file (no member {exc.args[0]!r}); "
                           f"expected {expected}") from None
        except (ValueError, TypeError, AttributeError) as exc:
            raise CliError(f"{args.import_key} is not an identity file ({exc}); expected {expected}") from None
        if identity.algorithm != "Ed25519":
            raise CliError(f"{args.import_key} holds a {identity.algorithm} key; a node's identity is Ed25519 "
                           "(it proves its hellos with EdDSA)")
    else:
        identity = Identity.generate(args.did_method)
    try:
        home.init(identity)
    except HomeError as exc:
        raise CliError(str(exc)) from None
    Store(home.store_path).close()
    print(f"initialised {home.path}")
    print(f"did: {identity.did}")
    print(f"tls: {home.tls_certificate(create=False).fingerprint}")
    return EXIT_OK


def cmd_tls_show(args: argparse.Namespace) -> int:
    home = home_of(args)
    try:
        certificate = home.tls_certificate(create=False)
    except HomeError as exc:
        raise CliError(str(exc)) from None
    shown = {"fingerprint": certificate.fingerprint, "certificate": str(home.tls_path / "cert.pem")}
    if args.json:
        print_json(shown)
    else:
        print(f"fingerprint: {shown['fingerprint']}")
        print(f"certificate: {shown['certificate']}")
    return EXIT_OK


def cmd_tls_rotate(args: argparse.Namespace) -> int:
    home = home_of(args)
    if not home.exists():
        raise CliError(f"no identity in {home.path}; run `p2psync init` first")
    try:
        old: str | None = home.tls_certificate(create=False).fingerprint
    except HomeError:
        old = None
    new = home.rotate_tls().fingerprint
    print(f"new certificate: {new}" + (f" (was {old})" if old else ""))
    print("restart `p2psync serve` to use it; peers that pin the old fingerprint need the new one")
    return EXIT_OK


def cmd_whoami(args: argparse.Namespace) -> int:
    identity, dwn = open_node(args)
    dwn.close()
    print(identity.did)
    return EXIT_OK


#: What a protocol definition must hold before the engine looks at it (the reference's schema
#: says the rest, with its own error codes).
_DEFINITION_MEMBERS: Final = {"protocol": str, "published": bool, "types": dict, "structure": dict}


def _protocol_definition(path: str) -> dict[str, Any]:
    """The JSON object in ``path`` with the members of a protocol definition, or a one-line error."""
    try:
        definition = json.loads(Path(path).read_text())
    except OSError as exc:
        raise CliError(f"cannot read protocol definition {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise CliError(f"protocol definition {path} is not JSON: {exc}") from None
    if not isinstance(definition, dict):
        raise CliError(f"protocol definition {path} must be a JSON object with protocol, published, types and "
                       "structure (see docs/examples)")
    for member, kind in _DEFINITION_MEMBERS.items():
        if not isinstance(definition.get(member), kind):
            what = "missing" if member not in definition else f"not a JSON {_JSON_KIND[kind]}"
            raise CliError(f"protocol definition {path}: `{member}` is {what} (a definition has protocol, "
                           "published, types and structure)")
    return definition


_JSON_KIND: Final = {str: "string", bool: "boolean", dict: "object"}


def cmd_protocol_install(args: argparse.Namespace) -> int:
    definition = _protocol_definition(args.file)
    identity, dwn = open_node(args)
    try:
        try:
            message = ProtocolsConfigure.create(definition=definition, signer=identity).message
        except (DwnError, KeyError, TypeError, ValueError) as exc:
            raise CliError(f"invalid protocol definition {args.file}: {exc}") from None
        reply = dwn.process_message(identity.did, message)
        check_reply(reply, "protocol install")
    finally:
        dwn.close()
    print(f"installed {definition.get('protocol')} ({reply.code})")
    return EXIT_OK


def _protocol_flags(args: argparse.Namespace) -> None:
    """``--protocol`` and ``--protocol-path`` go together (the DWN rule for writes and queries)."""
    if (args.protocol is None) != (args.protocol_path is None):
        given, missing = ("--protocol", "--protocol-path") if args.protocol_path is None else (
            "--protocol-path", "--protocol")
        raise CliError(f"{given} needs {missing} too (a protocol record is named by both)")


def cmd_write(args: argparse.Namespace) -> int:
    _protocol_flags(args)
    tags = parse_tags(args.tag)
    data = read_data(args)
    identity, dwn = open_node(args)
    try:
        write = authored(lambda: RecordsWrite.create(
            signer=identity,
            data=data,
            data_format=args.data_format,
            schema=args.schema,
            protocol=args.protocol,
            protocol_path=args.protocol_path,
            parent_context_id=args.parent_context_id,
            recipient=args.recipient,
            published=True if args.published else None,
            tags=tags,
        ))
        reply = dwn.process_message(args.tenant or identity.did, write.message, data)
        check_reply(reply, "write")
    finally:
        dwn.close()
    out = {
        "recordId": write.record_id,
        "messageCid": message_cid(write.message),
        "dataCid": write.descriptor["dataCid"],
        "dataSize": len(data),
        "status": reply.code,
    }
    if "contextId" in write.message:
        out["contextId"] = write.message["contextId"]
    print_json(out)
    return EXIT_OK


def cmd_read(args: argparse.Namespace) -> int:
    identity, dwn = open_node(args)
    try:
        message = authored(lambda: create_records_read(signer=identity, filter={"recordId": args.record_id}))
        reply = dwn.process_message(args.tenant or identity.did, message)
        check_reply(reply, "read")
    finally:
        dwn.close()
    assert reply.data is not None
    if args.out:
        Path(args.out).write_bytes(reply.data)
        print(f"wrote {len(reply.data)} bytes to {args.out}")
    else:
        sys.stdout.buffer.write(reply.data)
        sys.stdout.buffer.flush()
    return EXIT_OK


def cmd_query(args: argparse.Namespace) -> int:
    if args.protocol_path is not None and args.protocol is None:
        raise CliError("--protocol-path needs --protocol too (a path means nothing outside its protocol)")
    flt: dict[str, Any] = {}
    for key, value in (("protocol", args.protocol), ("protocolPath", args.protocol_path), ("schema", args.schema),
                       ("contextId", args.context_id), ("recipient", args.recipient)):
        if value is not None:
            flt[key] = value
    identity, dwn = open_node(args)
    try:
        message = authored(lambda: create_records_query(signer=identity, filter=flt or ALL_RECORDS_FILTER))
        reply = dwn.process_message(args.tenant or identity.did, message)
        check_reply(reply, "query")
    finally:
        dwn.close()
    rows = []
    for e in reply.entries or []:
        d = e["descriptor"]
        stored = {k: v for k, v in e.items() if k not in ("encodedData", "initialWrite")}
        rows.append({"recordId": e["recordId"], "messageCid": message_cid(stored), "dataSize": d["dataSize"],
                     "dataFormat": d["dataFormat"], "protocolPath": d.get("protocolPath"),
                     "dateCreated": d["dateCreated"]})
    if args.include_deleted:
        store = open_store(args, must_exist=True)
        try:
            removed = removed_records(store, args.tenant or identity.did, flt)
        finally:
            store.close()
        for gone in removed:
            d = gone.descriptor
            rows.append({"recordId": gone.record_id, "state": gone.state, "by": gone.by, "at": gone.at,
                         "dataFormat": d.get("dataFormat"), "protocolPath": d.get("protocolPath"),
                         "dateCreated": d.get("dateCreated")})
    if args.json:
        print_json(rows)
    else:
        for r in rows:
            if "state" in r:
                print(f"{r['recordId']}  {r['state'] + ' ' + str(r['at'] or ''):<38} {r['protocolPath'] or '-'}")
            else:
                print(f"{r['recordId']}  {r['dataSize']:>9} B  {r['dataFormat']:<28} {r['protocolPath'] or '-'}")
        n_gone = sum(1 for r in rows if "state" in r)
        print(f"{len(rows) - n_gone} record(s)" + (f", {n_gone} deleted or pruned" if args.include_deleted else ""))
    return EXIT_OK


def cmd_store_verify(args: argparse.Namespace) -> int:
    """Check that the state is the canonical state of the archive (docs/replication-apply.md)."""
    store = open_store(args, must_exist=True)
    try:
        dwn = Dwn(store)
        tenants = [args.tenant] if args.tenant else store.tenants()
        report = {tenant: dwn.history.verify(tenant) for tenant in tenants}
    finally:
        store.close()
    bad = {t: r for t, r in report.items() if any(r.values())}
    if args.json:
        print_json(report)
    else:
        for tenant, r in report.items():
            if not any(r.values()):
                print(f"{tenant}: the state is the canonical state of its archive")
            else:
                print(f"{tenant}: differs from a replay of its archive: " + ", ".join(
                    f"{len(v)} {k}" for k, v in r.items() if v))
    return EXIT_OK if not bad else EXIT_FAILED


def cmd_store_digest(args: argparse.Namespace) -> int:
    store = open_store(args, must_exist=True)
    try:
        digest = store_digest(store, args.tenant)
    finally:
        store.close()
    print_json(digest)
    return EXIT_OK
