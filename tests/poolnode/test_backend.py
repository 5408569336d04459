"""PoolBackend contract, run against every backend present (in-memory always, Mooncake when
installed)."""

from __future__ import annotations

import itertools
import os

import pytest

from poolnode.backend import InMemoryBackend, PoolBackend

BACKENDS = ["memory", "mooncake"]
_keys = itertools.count(0x1000)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> PoolBackend:
    if request.param == "memory":
        return InMemoryBackend()
    mooncake: PoolBackend = request.getfixturevalue("mooncake_backend")
    return mooncake


def fresh_key() -> int:
    return next(_keys) | (os.getpid() << 32)


def test_put_then_get_returns_the_bytes(backend: PoolBackend) -> None:
    key, data = fresh_key(), os.urandom(3000)
    backend.put(3, key, data)
    assert backend.get(3, key) == data


def test_get_of_an_unknown_chunk_is_none(backend: PoolBackend) -> None:
    assert backend.get(3, fresh_key()) is None


def test_tenants_do_not_share_keys(backend: PoolBackend) -> None:
    key = fresh_key()
    backend.put(1, key, b"one")
    assert backend.get(2, key) is None


def test_contains_follows_put_and_delete(backend: PoolBackend) -> None:
    key = fresh_key()
    assert not backend.contains(3, key)
    backend.put(3, key, b"x" * 10)
    assert backend.contains(3, key)
    assert backend.delete(3, key)
    assert not backend.contains(3, key)


def test_delete_of_an_unknown_chunk_is_false(backend: PoolBackend) -> None:
    assert backend.delete(3, fresh_key()) is False


def test_delete_right_after_a_read_succeeds(backend: PoolBackend) -> None:
    key = fresh_key()
    backend.put(3, key, b"leased")
    assert backend.get(3, key) == b"leased"
    assert backend.delete(3, key)


def test_size_is_the_chunk_length(backend: PoolBackend) -> None:
    key = fresh_key()
    backend.put(3, key, bytes(777))
    assert backend.size(3, key) == 777
    assert backend.size(3, fresh_key()) is None


def test_get_into_fills_a_caller_buffer(backend: PoolBackend) -> None:
    key, data = fresh_key(), os.urandom(1000)
    backend.put(3, key, data)
    buf = bytearray(1500)
    assert backend.get_into(3, key, memoryview(buf)) == 1000
    assert bytes(buf[:1000]) == data


def test_get_into_a_short_buffer_is_refused(backend: PoolBackend) -> None:
    key = fresh_key()
    backend.put(3, key, bytes(1000))
    with pytest.raises(ValueError, match="buffer"):
        backend.get_into(3, key, memoryview(bytearray(10)))


def test_put_accepts_bytearray_and_memoryview(backend: PoolBackend) -> None:
    k1, k2 = fresh_key(), fresh_key()
    backend.put(3, k1, bytearray(b"abc"))
    backend.put(3, k2, memoryview(b"xyzw")[1:])
    assert backend.get(3, k1) == b"abc"
    assert backend.get(3, k2) == b"yzw"


def test_put_many_stores_every_chunk(backend: PoolBackend) -> None:
    items = [(4, fresh_key(), os.urandom(100 + i)) for i in range(5)]
    backend.put_many(items)
    assert all(backend.get(t, k) == d for t, k, d in items)


def test_empty_chunk_is_refused(backend: PoolBackend) -> None:
    with pytest.raises(ValueError, match="empty"):
        backend.put(3, fresh_key(), b"")


def test_tenant_beyond_16_bits_is_refused(backend: PoolBackend) -> None:
    with pytest.raises(ValueError, match="16-bit"):
        backend.put(1 << 16, 1, b"x")
