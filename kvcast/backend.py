"""Storage behind a DRAM pool node: the ``PoolBackend`` interface and an in-memory backend.

A chunk is named by ``(tenant, key)`` (16-bit tenant, 64-bit chunk key, as on the wire) and holds
one chunk's bytes. Keys are content hashes: a key always names the same bytes, so a ``put`` of an
existing key may keep the stored copy.

Every put names the chunks' KV class (``kvcast.kvclass``; transient by default): under pressure
a backend drops transient chunks before static ones. Mooncake Store soft-pins static objects
(``kvcast.mooncake``); ``InMemoryBackend`` with a ``capacity_bytes`` evicts its least recently
used transient chunk first, and a static one only when no transient chunk is left.

Classes:
    PoolBackend: abstract interface (get, put, contains, delete; size, get_into, put_many).
    InMemoryBackend: a dict-backed backend for unit tests and single-process demos, optionally
        bounded, with class-aware eviction.
    ClassFigures: what a bounded in-memory backend holds and evicted, for one class.
    PoolBackendError: the backend failed (unreachable, out of space); the operation may be
        retried later.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kvcast.kvclass import KvClass

BytesLike = bytes | bytearray | memoryview
"""What ``PoolBackend.put`` accepts."""

MAX_TENANT = 0xFFFF
MAX_KEY = (1 << 64) - 1


class PoolBackendError(RuntimeError):
    """The storage backend failed; the message says which operation and why."""


def check_name(tenant: int, key: int) -> None:
    """Checks that ``(tenant, key)`` fit the wire fields.

    Args:
        tenant: tenant id.
        key: chunk key.

    Raises:
        ValueError: ``tenant`` is not a 16-bit or ``key`` not a 64-bit unsigned integer.
    """
    if not 0 <= tenant <= MAX_TENANT:
        raise ValueError(f"tenant {tenant} is not a 16-bit unsigned integer")
    if not 0 <= key <= MAX_KEY:
        raise ValueError(f"key {key} is not a 64-bit unsigned integer")


class PoolBackend(ABC):
    """Where a pool node keeps chunks.

    ``InMemoryBackend`` may be called from several threads; the pool-node server calls its
    backend from one thread only.
    """

    @abstractmethod
    def get(self, tenant: int, key: int) -> bytes | None:
        """A chunk's bytes.

        Args:
            tenant: tenant id.
            key: chunk key.

        Returns:
            The bytes, or ``None`` when the chunk is not stored.

        Raises:
            PoolBackendError: the backend failed.
        """

    @abstractmethod
    def put(
        self, tenant: int, key: int, data: BytesLike, *, kv_class: KvClass = KvClass.TRANSIENT
    ) -> None:
        """Stores a chunk.

        Args:
            tenant: tenant id.
            key: chunk key.
            data: the chunk's bytes (any contiguous buffer; not empty).
            kv_class: its class: static chunks are kept over transient ones under pressure.

        Raises:
            ValueError: ``data`` is empty or the name does not fit the wire fields.
            PoolBackendError: the backend failed (e.g. out of space).
        """

    @abstractmethod
    def contains(self, tenant: int, key: int) -> bool:
        """Whether a chunk is stored.

        Raises:
            PoolBackendError: the backend failed.
        """

    def contains_many(self, tenant: int, keys: Sequence[int]) -> list[bool]:
        """Whether each of several chunks is stored (one batched query where the backend has one).

        Args:
            tenant: tenant id.
            keys: chunk keys.

        Returns:
            One flag per key, in order.

        Raises:
            PoolBackendError: the backend failed.
        """
        return [self.contains(tenant, k) for k in keys]

    @abstractmethod
    def delete(self, tenant: int, key: int) -> bool:
        """Removes a chunk.

        Returns:
            Whether it was stored.

        Raises:
            PoolBackendError: the backend failed.
        """

    def put_many(
        self,
        items: Iterable[tuple[int, int, BytesLike]],
        *,
        kv_class: KvClass = KvClass.TRANSIENT,
    ) -> None:
        """Stores several chunks of one class (one batched call where the backend has one).

        Args:
            items: ``(tenant, key, data)`` triples.
            kv_class: their class.

        Raises:
            ValueError: an empty chunk or a name that does not fit the wire fields.
            PoolBackendError: a chunk could not be stored.
        """
        for tenant, key, data in items:
            self.put(tenant, key, data, kv_class=kv_class)

    def size(self, tenant: int, key: int) -> int | None:
        """A chunk's length in bytes, or ``None`` when it is not stored.

        Raises:
            PoolBackendError: the backend failed.
        """
        data = self.get(tenant, key)
        return None if data is None else len(data)

    def get_into(self, tenant: int, key: int, dst: memoryview) -> int | None:
        """Reads a chunk into ``dst`` without an intermediate copy where the backend can.

        Args:
            tenant: tenant id.
            key: chunk key.
            dst: a writable byte buffer at least as long as the chunk.

        Returns:
            Bytes written, or ``None`` when the chunk is not stored.

        Raises:
            ValueError: ``dst`` is shorter than the chunk.
            PoolBackendError: the backend failed.
        """
        data = self.get(tenant, key)
        if data is None:
            return None
        if len(data) > len(dst):
            raise ValueError(f"buffer of {len(dst)} bytes for a chunk of {len(data)}")
        dst[: len(data)] = data
        return len(data)

    def close(self) -> None:  # noqa: B027 - optional hook, most backends hold nothing
        """Releases the backend's resources."""


@dataclass(slots=True)
class ClassFigures:
    """A bounded in-memory backend's figures for one KV class.

    Attributes:
        chunks: chunks held.
        bytes: bytes held.
        evictions: chunks evicted to make room.
        evicted_bytes: bytes evicted.
    """

    chunks: int = 0
    bytes: int = 0
    evictions: int = 0
    evicted_bytes: int = 0


class InMemoryBackend(PoolBackend):
    """Chunks in a Python dict: for unit tests and single-process demos.

    Args:
        capacity_bytes: the most chunk bytes held (None: unbounded). A put that does not fit
            evicts the least recently used (put or read) transient chunk first, then, only when
            no transient chunk is left, the least recently used static one.

    Raises:
        ValueError: a capacity that is not positive.
    """

    def __init__(self, capacity_bytes: int | None = None) -> None:
        if capacity_bytes is not None and capacity_bytes <= 0:
            raise ValueError(f"capacity_bytes must be positive or None, got {capacity_bytes}")
        self._capacity = capacity_bytes
        self._data: dict[tuple[int, int], bytes] = {}
        # Recency per class, least recent first (only kept when bounded).
        self._lru: dict[KvClass, OrderedDict[tuple[int, int], None]] = {
            k: OrderedDict() for k in KvClass
        }
        self._class: dict[tuple[int, int], KvClass] = {}
        self._figures = {k: ClassFigures() for k in KvClass}
        self._lock = threading.Lock()

    def get(self, tenant: int, key: int) -> bytes | None:  # noqa: D102
        name = (tenant, key)
        data = self._data.get(name)
        if data is not None and self._capacity is not None:
            with self._lock:
                kv_class = self._class.get(name)
                if kv_class is not None and name in self._lru[kv_class]:
                    self._lru[kv_class].move_to_end(name)
        return data

    def put(  # noqa: D102
        self, tenant: int, key: int, data: BytesLike, *, kv_class: KvClass = KvClass.TRANSIENT
    ) -> None:
        check_name(tenant, key)
        blob = bytes(data)
        if not blob:
            raise ValueError("a chunk cannot be empty")
        name = (tenant, key)
        with self._lock:
            old = self._class.get(name)
            if old is KvClass.STATIC:
                kv_class = KvClass.STATIC  # the same bytes: a static chunk stays static
            if old is not None:
                self._drop(name)
            if self._capacity is not None:
                if len(blob) > self._capacity:
                    raise PoolBackendError(
                        f"chunk {key:#x} of {len(blob)} bytes exceeds the pool's capacity "
                        f"({self._capacity} bytes)"
                    )
                self._make_room(len(blob))
            self._data[name] = blob
            self._class[name] = kv_class
            self._lru[kv_class][name] = None
            fig = self._figures[kv_class]
            fig.chunks += 1
            fig.bytes += len(blob)

    def contains(self, tenant: int, key: int) -> bool:  # noqa: D102
        return (tenant, key) in self._data

    def delete(self, tenant: int, key: int) -> bool:  # noqa: D102
        with self._lock:
            if (tenant, key) not in self._data:
                return False
            self._drop((tenant, key))
            return True

    def kv_class(self, tenant: int, key: int) -> KvClass | None:
        """The class a chunk was stored with (None: not stored)."""
        return self._class.get((tenant, key))

    def class_figures(self) -> dict[KvClass, ClassFigures]:
        """What is held and what was evicted, per class (copies)."""
        with self._lock:
            return {
                k: ClassFigures(f.chunks, f.bytes, f.evictions, f.evicted_bytes)
                for k, f in self._figures.items()
            }

    @property
    def used_bytes(self) -> int:
        """Bytes of chunks held."""
        return sum(f.bytes for f in self._figures.values())

    def __len__(self) -> int:
        return len(self._data)

    def _drop(self, name: tuple[int, int]) -> int:
        """Forgets a held chunk (under the lock); returns its length."""
        blob = self._data.pop(name)
        kv_class = self._class.pop(name)
        self._lru[kv_class].pop(name, None)
        fig = self._figures[kv_class]
        fig.chunks -= 1
        fig.bytes -= len(blob)
        return len(blob)

    def _make_room(self, nbytes: int) -> None:
        """Evicts transient chunks, then static ones, least recent first, until ``nbytes`` fit."""
        assert self._capacity is not None
        for kv_class in (KvClass.TRANSIENT, KvClass.STATIC):
            lru = self._lru[kv_class]
            while lru and self.used_bytes + nbytes > self._capacity:
                name = next(iter(lru))
                size = self._drop(name)
                fig = self._figures[kv_class]
                fig.evictions += 1
                fig.evicted_bytes += size
