"""``hello``: mutual proof of DID control (replication-profiles.md §3).

Each peer sends a Hello with a fresh nonce; each answers the other's with a General JWS whose
payload binds both DIDs, both storeIds, both nonces and, over TLS, the channel: the server
certificate's hash (RFC 5929 ``tls-server-end-point``), as each side saw it. A relay that
terminates TLS on both sides shows each side a different certificate, so neither accepts the
proof it forwards (``HelloChannelMismatch``). Sans-I/O: build, parse, prove, verify.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from typing import Any, Final

from p2psync.dwn.did import Identity, resolve
from p2psync.dwn.encoding import b64url_decode, b64url_encode
from p2psync.dwn.errors import DwnError
from p2psync.dwn.jws import sign_payload, verify
from p2psync.replication.wire import HELLO_NONCE_BYTES, PROFILE_VERSION, SUBPROTOCOL, refuse

__all__ = [
    "HELLO_PURPOSE", "OFFERED_CAPABILITIES", "REVS", "ROLE_RECORDS", "WIDE_WINDOW", "Hello", "HelloChannelMismatch",
    "HelloProofInvalid",
    "make_proof", "new_hello", "verify_proof",
]

#: Domain separation of hello proofs (§3): no DWN authorization payload carries it.
HELLO_PURPOSE: Final = "p2psync-hello/1"
#: ``agent`` text limit (§3).
MAX_AGENT_CHARS: Final = 256
#: The capability of the batched `revs` profile (§8.4): a peer that offers it answers `revs`,
#: and a source sends `revs` only to a peer whose hello offers it (else one `rev` per message).
REVS: Final = "revs"
#: The capability of a wider BLIP flow-control window (§15): a peer that offers it takes up to
#: 1,000,000 unacknowledged bytes of one message (blip/wire.py ``WIDE_UNACKED_BYTES``), and
#: sends that many only to a peer whose hello offers it too (else BLIP's 128,000).
WIDE_WINDOW: Final = "wideWindow"
#: The capability of the ``RoleRecords`` ref of `getDependencies` (§10.2): a peer that offers it
#: answers the ref, and a subset sink asks it only of a source whose hello offers it (an older
#: source refuses the whole request, ``400 DependencyRefInvalid``).
ROLE_RECORDS: Final = "roleRecords"
#: What p2psync offers by default.
OFFERED_CAPABILITIES: Final = (REVS, WIDE_WINDOW, ROLE_RECORDS)
#: Capabilities kept from a hello; more are ignored (ours: far above the one defined).
MAX_CAPABILITIES: Final = 32
_UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_PAYLOAD_MEMBERS: Final = frozenset(
    ("purpose", "subprotocol", "signer", "signerStoreId", "signerNonce", "peer", "peerStoreId", "peerNonce")
)


class HelloProofInvalid(Exception):
    """The other peer's proof failed a check of §3 (the connection closes: 401)."""

    name = "HelloProofInvalid"


class HelloChannelMismatch(HelloProofInvalid):
    """The proof is the other peer's, over both hellos, but for another TLS channel (or for a
    plain one where ours is TLS, or the reverse): something in between relays the connection."""

    name = "HelloChannelMismatch"


@dataclass(frozen=True)
class Hello:
    """One peer's hello request body."""

    did: str
    store_id: str
    nonce: bytes
    agent: str | None = None
    #: where the sender's node listens: ``(port, tls)``, on the address the connection comes
    #: from (§3 ``listen``); None: it does not serve (a one-shot sync), or did not say
    listen: tuple[int, bool] | None = None
    #: optional features the sender offers (§3, §15); unknown ones are kept and ignored
    capabilities: tuple[str, ...] = ()

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "version": PROFILE_VERSION, "did": self.did, "storeId": self.store_id, "nonce": self.nonce
        }
        if self.agent is not None:
            out["agent"] = self.agent
        if self.listen is not None:
            out["listen"] = {"port": self.listen[0], "tls": self.listen[1]}
        if self.capabilities:
            out["capabilities"] = list(self.capabilities)
        return out

    @classmethod
    def from_wire(cls, obj: Any) -> Hello:
        """Parse a received hello; ``400 HelloInvalid`` / ``HelloVersionUnsupported``."""
        if not isinstance(obj, dict):
            refuse(400, "HelloInvalid", "hello body must be a map")
        version = obj.get("version")
        if type(version) is not int or version < 0:
            refuse(400, "HelloInvalid", "version must be an unsigned integer")
        if version != PROFILE_VERSION:
            refuse(400, "HelloVersionUnsupported", f"version {version}", versions=[PROFILE_VERSION])
        did, store_id, nonce, agent = obj.get("did"), obj.get("storeId"), obj.get("nonce"), obj.get("agent")
        if not isinstance(did, str) or not resolve(did):
            refuse(400, "HelloInvalid", "did must be a resolvable did:key or did:jwk")
        if not isinstance(store_id, str) or _UUID_RE.fullmatch(store_id) is None:
            refuse(400, "HelloInvalid", "storeId must be a lower-case hyphenated UUID")
        if not isinstance(nonce, bytes) or len(nonce) != HELLO_NONCE_BYTES:
            refuse(400, "HelloInvalid", f"nonce must be {HELLO_NONCE_BYTES} bytes")
        if agent is not None and (not isinstance(agent, str) or len(agent) > MAX_AGENT_CHARS):
            refuse(400, "HelloInvalid", "agent must be text of at most 256 characters")
        caps = obj.get("capabilities")
        if caps is not None and (not isinstance(caps, list) or not all(isinstance(c, str) for c in caps)):
            refuse(400, "HelloInvalid", "capabilities must be an array of text")
        capabilities = tuple(caps[:MAX_CAPABILITIES]) if caps is not None else ()
        return cls(did, store_id, nonce, agent, _listen(obj.get("listen")), capabilities)


def _listen(value: Any) -> tuple[int, bool] | None:
    """A hello's ``listen`` member: ``{"port": 1..65535, "tls": bool}``, or absent."""
    if value is None:
        return None
    port = value.get("port") if isinstance(value, dict) else None
    tls = value.get("tls") if isinstance(value, dict) else None
    if type(port) is not int or not 0 < port < 65536 or not isinstance(tls, bool):
        refuse(400, "HelloInvalid", "listen must be a map of port (1-65535) and tls (a boolean)")
    return port, tls


def new_hello(
    did: str,
    store_id: str,
    agent: str | None = None,
    listen: tuple[int, bool] | None = None,
    capabilities: tuple[str, ...] = OFFERED_CAPABILITIES,
) -> Hello:
    """Our hello, with a fresh nonce from the CSPRNG, offering ``capabilities`` (§15)."""
    return Hello(did, store_id, secrets.token_bytes(HELLO_NONCE_BYTES), agent, listen, capabilities)


def _payload(signer: Hello, peer: Hello, channel: str | None) -> dict[str, str]:
    payload = {
        "purpose": HELLO_PURPOSE,
        "subprotocol": SUBPROTOCOL,
        "signer": signer.did,
        "signerStoreId": signer.store_id,
        "signerNonce": b64url_encode(signer.nonce),
        "peer": peer.did,
        "peerStoreId": peer.store_id,
        "peerNonce": b64url_encode(peer.nonce),
    }
    if channel is not None:
        payload["channel"] = channel
    return payload


def make_proof(identity: Identity, mine: Hello, theirs: Hello, channel: str | None = None) -> dict[str, Any]:
    """Our reply to ``theirs``: a JWS by ``identity`` over both hellos and the connection's
    ``channel`` binding (:func:`p2psync.blip.tls.channel_binding`; None on plain ``ws://``).
    A peer's identity is Ed25519: the proof is EdDSA (§3)."""
    if identity.algorithm != "Ed25519":
        raise ValueError(f"a peer proves its hello with an Ed25519 identity, not {identity.algorithm}")
    return sign_payload(_payload(mine, theirs, channel), identity)


def verify_proof(proof: Any, mine: Hello, theirs: Hello, channel: str | None = None) -> None:
    """Check the other peer's proof over our nonce and the channel as we see it (§3 checks
    1-5); raise ``HelloProofInvalid`` (``HelloChannelMismatch`` when only the channel differs)."""
    try:
        if not isinstance(proof, dict) or not isinstance(proof.get("payload"), str):
            raise HelloProofInvalid("proof must be a General JWS")
        signatures = proof.get("signatures")
        if not isinstance(signatures, list) or len(signatures) != 1 or not isinstance(signatures[0], dict):
            raise HelloProofInvalid("exactly one signature is required")
        protected = signatures[0].get("protected")
        if not isinstance(protected, str):
            raise HelloProofInvalid("protected header missing")
        header = json.loads(b64url_decode(protected))
        if not isinstance(header, dict) or header.get("alg") != "EdDSA" or not isinstance(header.get("kid"), str):
            raise HelloProofInvalid("protected header must carry alg EdDSA and a kid")
        kid: str = header["kid"]
        if kid.split("#", 1)[0] != theirs.did:
            raise HelloProofInvalid("kid is not a key of the hello's DID")
        if not any(m.id == kid for m in resolve(theirs.did)):
            raise HelloProofInvalid("kid is not a verification method of the DID")
        verify(proof)  # the signature over the signed bytes, with the key the kid names
        payload = json.loads(b64url_decode(proof["payload"]).decode("utf-8"))
    except HelloProofInvalid:
        raise
    except (DwnError, ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise HelloProofInvalid(f"proof does not verify: {exc}") from exc
    if not isinstance(payload, dict) or set(payload) - {"channel"} != _PAYLOAD_MEMBERS:
        raise HelloProofInvalid("payload must have exactly the eight hello members and an optional channel")
    if payload != _payload(theirs, mine, channel):
        signed = payload.pop("channel", None)
        if payload == _payload(theirs, mine, None):
            raise HelloChannelMismatch(f"the proof is for channel {signed or 'plain'}, this connection is "
                                       f"{channel or 'plain'}")
        raise HelloProofInvalid("payload does not match the two hellos")
