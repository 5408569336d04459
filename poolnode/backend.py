"""Storage behind a DRAM pool node: the ``PoolBackend`` interface and an in-memory backend.

A chunk is named by ``(tenant, key)`` (16-bit tenant, 64-bit chunk key, as on the wire) and holds
one chunk's bytes. Keys are content hashes: a key always names the same bytes, so a ``put`` of an
existing key may keep the stored copy.

Classes:
    PoolBackend: abstract interface (get, put, contains, delete; size, get_into, put_many).
    InMemoryBackend: a dict-backed backend for unit tests and single-process demos.
    PoolBackendError: the backend failed (unreachable, out of space); the operation may be
        retried later.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence

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
    def put(self, tenant: int, key: int, data: BytesLike) -> None:
        """Stores a chunk.

        Args:
            tenant: tenant id.
            key: chunk key.
            data: the chunk's bytes (any contiguous buffer; not empty).

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

    def put_many(self, items: Iterable[tuple[int, int, BytesLike]]) -> None:
        """Stores several chunks (one batched call where the backend has one).

        Args:
            items: ``(tenant, key, data)`` triples.

        Raises:
            ValueError: an empty chunk or a name that does not fit the wire fields.
            PoolBackendError: a chunk could not be stored.
        """
        for tenant, key, data in items:
            self.put(tenant, key, data)

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


class InMemoryBackend(PoolBackend):
    """Chunks in a Python dict: for unit tests and single-process demos."""

    def __init__(self) -> None:
        self._data: dict[tuple[int, int], bytes] = {}
        self._lock = threading.Lock()

    def get(self, tenant: int, key: int) -> bytes | None:  # noqa: D102
        return self._data.get((tenant, key))

    def put(self, tenant: int, key: int, data: BytesLike) -> None:  # noqa: D102
        check_name(tenant, key)
        blob = bytes(data)
        if not blob:
            raise ValueError("a chunk cannot be empty")
        with self._lock:
            self._data[(tenant, key)] = blob

    def contains(self, tenant: int, key: int) -> bool:  # noqa: D102
        return (tenant, key) in self._data

    def delete(self, tenant: int, key: int) -> bool:  # noqa: D102
        with self._lock:
            return self._data.pop((tenant, key), None) is not None

    def __len__(self) -> int:
        return len(self._data)
