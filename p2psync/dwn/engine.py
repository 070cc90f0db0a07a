"""The local DWN: ``Dwn.process_message`` routes a message to its handler, as the reference does.

Order of checks, as in the reference's ``Dwn.processMessage``: the tenant gate (401), the
message's ``interface``/``method`` (400), its JSON schema (400), then the method handler.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import apsw

from p2psync.dwn import memo, replicated, schemas
from p2psync.dwn.canonical import History, is_stateful
from p2psync.dwn.encoding import in_dag_cbor_order
from p2psync.dwn.errors import DwnError
from p2psync.dwn.handlers import messages_handlers, protocols, records
from p2psync.dwn.replication_types import ReplicationApplyResult
from p2psync.dwn.reply import HandlerContext, Reply, reply_from_error
from p2psync.dwn.store import Store

log = logging.getLogger(__name__)

TenantGate = Callable[[str], bool]


def _handlers() -> dict[str, Callable[..., Reply]]:
    return {
        "RecordsWrite": records.handle_records_write,
        "RecordsDelete": records.handle_records_delete,
        "RecordsRead": records.handle_records_read,
        "RecordsQuery": records.handle_records_query,
        "ProtocolsConfigure": protocols.handle_protocols_configure,
        "ProtocolsQuery": protocols.handle_protocols_query,
        "RecordsSubscribe": messages_handlers.handle_records_subscribe,
        "MessagesQuery": messages_handlers.handle_messages_query,
        "MessagesRead": messages_handlers.handle_messages_read,
        "MessagesSubscribe": messages_handlers.handle_messages_subscribe,
    }


class Dwn:
    """A DWN over one :class:`Store`. Every tenant is active unless ``tenant_gate`` says no."""

    def __init__(self, store: Store, tenant_gate: TenantGate | None = None) -> None:
        self.store = store
        self.tenant_gate = tenant_gate
        self.ctx = HandlerContext(store)
        self._handlers = _handlers()
        self.history = History(store, self._reference)
        self._adopt_unarchived()
        listed = self.history.list_superseded_definitions()
        if listed:
            log.info("listed %d superseded protocol definition(s) in the log for replication", listed)

    def _adopt_unarchived(self) -> None:
        """A store written before the archive existed: archive its messages and replay them."""
        conn = self.store.conn
        if conn.execute("SELECT 1 FROM archive LIMIT 1").fetchone() is not None:
            return
        if conn.execute("SELECT 1 FROM messages LIMIT 1").fetchone() is None:
            return
        for tenant in self.store.tenants():
            adopted = self.history.adopt(tenant)
            log.info("archived %d message(s) of %s and rebuilt its state in canonical order", adopted, tenant)

    @classmethod
    def open(cls, path: str | Path) -> Dwn:
        return cls(Store(path))

    def close(self) -> None:
        self.store.close()

    def validate_tenant(self, tenant: str) -> Reply | None:
        if self.tenant_gate is not None and not self.tenant_gate(tenant):
            return Reply(401, f"DID {tenant} is not an active tenant.")
        return None

    @staticmethod
    def validate_message_integrity(message: Any) -> Reply | None:
        descriptor = message.get("descriptor") if isinstance(message, dict) else None
        interface = descriptor.get("interface") if isinstance(descriptor, dict) else None
        method = descriptor.get("method") if isinstance(descriptor, dict) else None
        if interface is None or method is None:
            return Reply(
                400,
                f"Both interface and method must be present, interface: {_js(interface)}, method: {_js(method)}",
            )
        try:
            schemas.validate(f"{interface}{method}", message)
        except DwnError as e:
            return reply_from_error(e, 400)
        return None

    def apply_replicated_message(
        self, tenant: str, message: Any, data: bytes | None = None, *, cid: str | None = None,
        encoded: bytes | None = None,
    ) -> ReplicationApplyResult:
        """Apply a message that came from another replica; see :mod:`p2psync.dwn.replicated`.

        ``cid``: the message's CID when the caller has already computed it from this very
        object (never a CID taken from the wire); ``encoded``: the DAG-CBOR it computed it from.
        """
        return replicated.apply_replicated_message(self, tenant, in_dag_cbor_order(message), data, cid=cid,
                                                   encoded=encoded)

    def apply_replicated_run(
        self, tenant: str, entries: Sequence[replicated.RunEntry]
    ) -> list[ReplicationApplyResult]:
        """Apply the leading run of initial writes of ``entries`` together, inside the caller's
        write transaction; see :func:`p2psync.dwn.replicated.apply_replicated_run`."""
        return replicated.apply_replicated_run(self, tenant, entries)

    def process_message(self, tenant: str, message: Any, data: bytes | None = None) -> Reply:
        """Process one message (with its data for a RecordsWrite) and answer like the reference.

        A message that changes state and is accepted is admitted into the tenant's history at
        its canonical place (p2psync/dwn/canonical.py); the answer is the reference's against
        the current state either way.
        """
        if is_stateful(message):
            # Stored as the wire carries it (DAG-CBOR key order): authored here or received,
            # a message is the same text in every replica.
            message = in_dag_cbor_order(message)
        with memo.processing(message):
            return self._process_message(tenant, message, data)

    def _process_message(self, tenant: str, message: Any, data: bytes | None) -> Reply:
        early = self.validate_tenant(tenant) or self.validate_message_integrity(message)
        if early is not None:
            return early
        if is_stateful(message):
            try:
                return self.history.author(tenant, message, data)
            except DwnError as e:
                return reply_from_error(e, e.status if e.status >= 400 else 400)
            except apsw.BusyError:
                return self._busy()
        return self._reference(tenant, message, data, False)

    def _busy(self) -> Reply:
        """Another connection held the store's write lock past this one's busy timeout."""
        return Reply(503, f"StoreBusy: another process held the store's write lock for {self.store.busy_timeout:g} s;"
                          " try again")

    def _reference(self, tenant: str, message: Any, data: bytes | None, withheld: bool) -> Reply:
        """The reference's processing of one message, nothing more (the history calls this).

        Every message reaching it passed :meth:`validate_message_integrity` already: a local
        write and a replicated one on arrival, an archived one when it was admitted (the
        schema check is a function of the message alone). Checking again cost a second
        schema walk per apply (issue #17).
        """
        early = self.validate_tenant(tenant)
        if early is not None:
            return early
        d = message["descriptor"]
        key = f"{d['interface']}{d['method']}"
        handler = self._handlers.get(key)
        if handler is None:
            return Reply(501, f"MethodNotImplemented: {key} is not supported by this node")
        try:
            if key == "RecordsWrite":
                return handler(self.ctx, tenant, message, data, withheld)
            return handler(self.ctx, tenant, message)
        except DwnError as e:
            # A DwnError the reference would let escape; keep the node alive and say why.
            log.warning("unhandled %s while processing %s: %s", e.code, key, e)
            return reply_from_error(e, e.status if e.status >= 400 else 500)
        except apsw.BusyError:
            # Not a bug: another process's writer kept the lock too long (a write inside a
            # Store.transaction() holds it already; a read on its own may still have to wait).
            return self._busy()
        except Exception as e:  # a bug here must not take the node down, nor reach a peer raw
            log.exception("internal error while processing %s", key)
            return Reply(500, f"InternalError: {type(e).__name__}")


def _js(value: Any) -> str:
    return "undefined" if value is None else str(value)
