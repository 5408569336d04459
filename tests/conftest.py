"""Fixtures shared by test packages.

``data_path`` runs a test once on the native data path (kvcast._native) and once on the
pure-Python fallback: modules that use it say ``pytestmark = pytest.mark.usefixtures("data_path")``.
``pool_server`` serves the requesting module's ``backend`` fixture (often one that
:func:`backend_holding` fills) on a free local port; a module that needs other server options
defines its own.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import pytest

from kvcast.backend import InMemoryBackend
from kvcast.native import native
from poolnode.server import PoolServer


@pytest.fixture(params=["native", "python"])
def data_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Selects the data path through ``KVCAST_NATIVE`` for the test's clients and servers."""
    if request.param == "native" and native is None:
        pytest.skip("kvcast._native not built (make setup compiles it with gcc and python3-dev)")
    monkeypatch.setenv("KVCAST_NATIVE", "1" if request.param == "native" else "0")
    return str(request.param)


def backend_holding(tenant: int, chunks: Mapping[int, bytes]) -> InMemoryBackend:
    """An unbounded in-memory pool backend holding ``chunks`` (key -> bytes) of ``tenant``."""
    backend = InMemoryBackend()
    for key, data in chunks.items():
        backend.put(tenant, key, data)
    return backend


@pytest.fixture
def pool_server(backend: InMemoryBackend) -> Iterator[PoolServer]:
    """A pool server on a free local port in front of the module's ``backend`` fixture."""
    with PoolServer(backend, "127.0.0.1", 0) as srv:
        yield srv
