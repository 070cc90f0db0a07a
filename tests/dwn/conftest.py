"""Fixtures for engine tests: real SQLite stores under tmp_path and real Ed25519 identities."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from p2psync.dwn.did import Identity
from p2psync.dwn.engine import Dwn
from p2psync.dwn.store import Store


@pytest.fixture
def dwn(tmp_path: Path) -> Iterator[Dwn]:
    engine = Dwn(Store(tmp_path / "store.db"))
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def alice() -> Identity:
    return Identity.generate("key")


@pytest.fixture(scope="session")
def bob() -> Identity:
    return Identity.generate("jwk")


@pytest.fixture(scope="session")
def carol() -> Identity:
    return Identity.generate("key")
