"""Fixtures: a real mooncake_master and Mooncake store clients, where the package is installed."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest

from kvcast.mooncake import MooncakeBackend
from poolnode.mooncake import MooncakeMaster, find_master_binary

MOONCAKE_MISSING = (
    "mooncake-transfer-engine-non-cuda not installed"
    if importlib.util.find_spec("mooncake") is None
    else "mooncake_master binary not found"
    if find_master_binary() is None
    else ""
)
needs_mooncake = pytest.mark.skipif(bool(MOONCAKE_MISSING), reason=MOONCAKE_MISSING)


@pytest.fixture(scope="session")
def mooncake_master() -> Iterator[MooncakeMaster]:
    if MOONCAKE_MISSING:
        pytest.skip(MOONCAKE_MISSING)
    with MooncakeMaster() as master:
        yield master


@pytest.fixture(scope="session")
def mooncake_backend(mooncake_master: MooncakeMaster) -> Iterator[MooncakeBackend]:
    backend = MooncakeBackend(
        mooncake_master.address, global_segment_size=64 << 20, local_buffer_size=16 << 20
    )
    yield backend
    backend.close()
