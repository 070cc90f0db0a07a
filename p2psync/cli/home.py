"""A node's data directory: its identity (private key) and its store.

Default location: ``$P2PSYNC_HOME``, else the platform's user data directory.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from p2psync.dwn.did import Identity

IDENTITY_FILE = "identity.json"
STORE_FILE = "store.db"


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

    def load_identity(self) -> Identity:
        try:
            data = json.loads(self.identity_path.read_text())
            return Identity.from_jwk(data)
        except FileNotFoundError:
            raise HomeError(f"no identity in {self.path}; run `p2psync init` first") from None
        except (ValueError, KeyError, TypeError) as exc:
            raise HomeError(f"{self.identity_path} is not a valid identity file: {exc}") from exc
