"""Fixtures shared by the host agent's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kvcast.backend import PoolBackend
from tests.poolnode.conftest import MOONCAKE_MISSING


@pytest.fixture(scope="module")
def mooncake_store() -> Iterator[PoolBackend]:
    """A Mooncake Store client with its own segment, on a mooncake_master of its own."""
    if MOONCAKE_MISSING:
        pytest.skip(MOONCAKE_MISSING)
    from kvcast.mooncake import MooncakeBackend
    from poolnode.mooncake import MooncakeMaster

    with MooncakeMaster() as master:
        backend = MooncakeBackend(
            master.address, global_segment_size=32 << 20, local_buffer_size=8 << 20
        )
        yield backend
        backend.close()
