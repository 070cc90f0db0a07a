"""A node's data directory: its identity (private key) and its store.

Default location: ``$P2PSYNC_HOME``, else the platform's user data directory.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from p2psync.blip.tls import TlsCertificate, new_certificate
from p2psync.dwn.did import Identity

IDENTITY_FILE = "identity.json"
STORE_FILE = "store.db"
#: The node's TLS key and self-signed certificate (``key.pem``, ``cert.pem``).
TLS_DIR = "tls"


class HomeError(Exception):
    """The data directory is missing, unreadable or already initialised."""


def default_home() -> Path:
    env = os.environ.get("P2PSYNC_HOME")
    return Path(env) if env else Path(platformdirs.user_data_dir("p2psync"))


@dataclass(frozen=True)
class Home:
    path: Path

    @property
    def identity_path(self) -> Path:
        return self.path / IDENTITY_FILE

    @property
    def store_path(self) -> Path:
        return self.path / STORE_FILE

    @property
    def tls_path(self) -> Path:
        return self.path / TLS_DIR

    def tls_certificate(self, *, create: bool = True) -> TlsCertificate:
        """The node's TLS certificate; made when missing and ``create`` (a data directory from
        before TLS), else :class:`HomeError`."""
        try:
            return TlsCertificate.load(self.tls_path)
        except FileNotFoundError:
            if not create:
                raise HomeError(f"no TLS certificate in {self.tls_path}; `p2psync tls rotate` makes one") from None
        except OSError as exc:
            raise HomeError(f"cannot read the TLS certificate in {self.tls_path}: {exc.strerror or exc}") from None
        return self.rotate_tls()

    def rotate_tls(self) -> TlsCertificate:
        """A new key and certificate in place of the old (peers pinning the old fingerprint must
        be told the new one; an advert carries it by itself)."""
        certificate = new_certificate()
        certificate.save(self.tls_path)
        return certificate

    def exists(self) -> bool:
        return self.identity_path.exists()

    def init(self, identity: Identity) -> None:
        """Write the identity (private key, mode 0600); refuse to overwrite one."""
        if self.exists():
            raise HomeError(f"{self.path} already holds an identity ({self.load_identity().did})")
        self.path.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.identity_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(identity.to_jwk(), f, indent=2)
            f.write("\n")
        self.rotate_tls()

    def load_identity(self) -> Identity:
        try:
            data = json.loads(self.identity_path.read_text())
            return Identity.from_jwk(data)
        except FileNotFoundError:
            raise HomeError(f"no identity in {self.path}; run `p2psync init` first") from None
        except (ValueError, KeyError, TypeError) as exc:
            raise HomeError(f"{self.identity_path} is not a valid identity file: {exc}") from exc
