"""PoolBackend contract, run against every backend present (in-memory always, Mooncake when
installed)."""

from __future__ import annotations

import itertools
import os

import pytest

from kvcast.backend import ClassFigures, InMemoryBackend, PoolBackend, PoolBackendError
from kvcast.kvclass import KvClass

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


# ---------------------------------------------------------------------- KV classes
def test_put_many_takes_a_class(backend: PoolBackend) -> None:
    items = [(3, fresh_key(), os.urandom(64)) for _ in range(3)]
    backend.put_many(items, kv_class=KvClass.STATIC)
    assert all(backend.get(t, k) == d for t, k, d in items)


def test_a_full_pool_evicts_transient_chunks_before_static_ones() -> None:
    pool = InMemoryBackend(capacity_bytes=1000)
    pool.put(1, 1, bytes(300), kv_class=KvClass.STATIC)  # the oldest
    pool.put(1, 2, bytes(300))
    pool.put(1, 3, bytes(300))
    pool.get(1, 2)  # 3 is now the least recently used transient chunk
    pool.put(1, 4, bytes(300))
    assert [pool.contains(1, k) for k in (1, 2, 3, 4)] == [True, True, False, True]
    pool.put(1, 5, bytes(600))  # needs both remaining transient chunks' room
    assert [pool.contains(1, k) for k in (1, 2, 4, 5)] == [True, False, False, True]
    figures = pool.class_figures()
    assert figures[KvClass.TRANSIENT] == ClassFigures(1, 600, 3, 900)
    assert figures[KvClass.STATIC] == ClassFigures(1, 300, 0, 0)


def test_static_chunks_go_only_when_no_transient_one_is_left() -> None:
    pool = InMemoryBackend(capacity_bytes=1000)
    pool.put(1, 1, bytes(400), kv_class=KvClass.STATIC)
    pool.put(1, 2, bytes(400), kv_class=KvClass.STATIC)
    pool.put(1, 3, bytes(400), kv_class=KvClass.STATIC)
    assert [pool.contains(1, k) for k in (1, 2, 3)] == [False, True, True]
    assert pool.class_figures()[KvClass.STATIC].evictions == 1
    assert pool.used_bytes == 800


def test_a_static_chunk_put_again_as_transient_stays_static() -> None:
    pool = InMemoryBackend(capacity_bytes=1000)
    pool.put(1, 1, bytes(10), kv_class=KvClass.STATIC)
    pool.put(1, 1, bytes(10))
    assert pool.kv_class(1, 1) is KvClass.STATIC
    pool.put(1, 2, bytes(10))
    pool.put(1, 2, bytes(10), kv_class=KvClass.STATIC)
    assert pool.kv_class(1, 2) is KvClass.STATIC and len(pool) == 2
    assert pool.class_figures()[KvClass.STATIC] == ClassFigures(2, 20, 0, 0)


def test_a_chunk_larger_than_the_pool_is_refused_and_nothing_is_evicted() -> None:
    pool = InMemoryBackend(capacity_bytes=100)
    pool.put(1, 1, bytes(50))
    with pytest.raises(PoolBackendError, match="exceeds the pool's capacity"):
        pool.put(1, 2, bytes(101))
    assert pool.contains(1, 1) and not pool.contains(1, 2)
    with pytest.raises(ValueError, match="capacity_bytes"):
        InMemoryBackend(capacity_bytes=0)


def test_an_unbounded_pool_never_evicts() -> None:
    pool = InMemoryBackend()
    for k in range(100):
        pool.put(1, k, bytes(1000))
    assert len(pool) == 100 and pool.class_figures()[KvClass.TRANSIENT].evictions == 0
    assert pool.delete(1, 5) and pool.used_bytes == 99_000
