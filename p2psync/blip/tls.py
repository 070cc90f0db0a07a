"""TLS under the WebSocket: a node's certificate, the contexts both roles use, and what a
connection exposes for channel binding.

Nothing here is written below TLS: Python's :mod:`ssl` (OpenSSL) does the protocol and
``cryptography`` makes the keys and certificates. Certificates are self-signed and are not
checked against any authority. A peer is authenticated one layer up instead — its ``hello``
proof signs the server certificate's hash (RFC 5929 ``tls-server-end-point``), so a relay that
terminates TLS on both sides cannot forward a proof — and, where the dialer knows it (an mDNS
advert, a configured pin), by the certificate's fingerprint before a byte of hello is sent.

``SSLKEYLOGFILE`` is honoured on both sides (Wireshark reads the file to decrypt a capture).
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import os
import re
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from p2psync.errors import HandshakeFailed

__all__ = [
    "CERTIFICATE_DAYS",
    "FINGERPRINT_RE",
    "TlsCertificate",
    "TlsPinMismatch",
    "channel_binding",
    "client_context",
    "fingerprint",
    "new_certificate",
]

#: How long a node's self-signed certificate is valid. Nobody checks it against a clock we
#: trust (peers pin the hash, not the dates), so it is long: rotating is the operator's call
#: (``p2psync tls rotate``), not the calendar's.
CERTIFICATE_DAYS: Final = 10 * 366
#: The prefix of a channel binding value: RFC 5929 §4, the hash of the server's certificate.
#: Our certificates are ECDSA P-256 signed with SHA-256, so the RFC's hash is SHA-256.
CHANNEL_BINDING_TYPE: Final = "tls-server-end-point"
#: What :func:`fingerprint` gives: 43 base64url characters.
FINGERPRINT_RE: Final = re.compile(r"[A-Za-z0-9_-]{43}")
#: Both roles speak TLS 1.3 only: every peer is ours, and 1.3 has no renegotiation and
#: encrypts the server's certificate.
MIN_TLS_VERSION: Final = ssl.TLSVersion.TLSv1_3


class TlsPinMismatch(HandshakeFailed):
    """The server's certificate is not the one the dialer was told to expect (an advert's or
    a configured fingerprint): nothing is sent, and trying again will not change it."""


def fingerprint(der: bytes) -> str:
    """A certificate's fingerprint: SHA-256 of its DER bytes, base64url without padding (43
    characters; what adverts carry and ``peers``/``status`` show)."""
    return base64.urlsafe_b64encode(hashlib.sha256(der).digest()).rstrip(b"=").decode("ascii")


def channel_binding(server_der: bytes | None) -> str | None:
    """The value a ``hello`` proof signs for a connection whose server certificate is
    ``server_der`` (``None`` on a plain connection)."""
    return None if server_der is None else f"{CHANNEL_BINDING_TYPE}:{fingerprint(server_der)}"


@dataclass(frozen=True)
class TlsCertificate:
    """A node's TLS key and self-signed certificate (PEM), as kept in its data directory."""

    cert_pem: bytes
    key_pem: bytes

    @property
    def der(self) -> bytes:
        return ssl.PEM_cert_to_DER_cert(self.cert_pem.decode("ascii"))

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.der)

    @classmethod
    def load(cls, directory: Path) -> TlsCertificate:
        """Read ``cert.pem`` and ``key.pem`` from ``directory``."""
        return cls((directory / "cert.pem").read_bytes(), (directory / "key.pem").read_bytes())

    def save(self, directory: Path) -> None:
        """Write both files (the key readable by the owner only), each atomically."""
        directory.mkdir(parents=True, exist_ok=True)
        for name, data, mode in (("key.pem", self.key_pem, 0o600), ("cert.pem", self.cert_pem, 0o644)):
            tmp = directory / f".{name}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, directory / name)

    def server_context(self) -> ssl.SSLContext:
        """The context a listening node wraps each accepted connection in."""
        ctx = _context(ssl.PROTOCOL_TLS_SERVER)
        # load_cert_chain reads files only; a private (0700) temporary directory holds them
        # for the instant it takes.
        with tempfile.TemporaryDirectory(prefix="p2psync-tls-") as tmp:
            self.save(Path(tmp))
            ctx.load_cert_chain(Path(tmp) / "cert.pem", Path(tmp) / "key.pem")
        return ctx


def new_certificate(common_name: str = "p2psync") -> TlsCertificate:
    """A fresh ECDSA P-256 key and a self-signed certificate for it."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))  # a peer's clock may be behind
        .not_valid_after(now + datetime.timedelta(days=CERTIFICATE_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return TlsCertificate(
        cert.public_bytes(serialization.Encoding.PEM),
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                          serialization.NoEncryption()),
    )


def client_context() -> ssl.SSLContext:
    """The context a dialing peer uses: TLS 1.3, no certificate authority — the server is
    authenticated by the hello proof over its certificate's hash (and a pin, when known)."""
    ctx = _context(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _context(protocol: ssl._SSLMethod) -> ssl.SSLContext:
    ctx = ssl.SSLContext(protocol)
    ctx.minimum_version = MIN_TLS_VERSION
    keylog = os.environ.get("SSLKEYLOGFILE")
    if keylog:
        ctx.keylog_filename = keylog
    return ctx
