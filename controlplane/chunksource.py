"""Where the controller gets the bytes of the chunks it loads into switch SRAM: the DRAM pool.

A policy names the chunks worth SRAM; their bytes live in the DRAM pool. Two sources:

* :class:`KvpChunkSource` asks the pool node that owns the key (the same consistent-hash ring
  the switch's ``pool_owner`` table holds) directly over KVP: the host agent's
  :class:`~kvcast.fetch.FetchClient` with ``NOCACHE`` GETs, every fragment CRC-checked. It is
  what the daemon uses: it needs nothing from the pool but the port every pool node serves
  anyway. A chunk's length, when the controller only knows its key (a hot-miss digest, an entry
  adopted from the switch), is read from the pool's DATA headers (``frag_count`` of fragment 0,
  ``payload_len`` of the last fragment).
* :class:`BackendChunkSource` reads a :class:`~kvcast.backend.PoolBackend` in this process
  (a Mooncake client, or the in-memory backend of tests).

Both answer :meth:`ChunkSource.ensure` for a DEMOTEd chunk: the chunk must stay in (or return
to) the DRAM pool. A backend can write it back; KVP has no PUT, so the KVP source can only
confirm that the pool still holds it and raises :class:`ChunkUnavailableError` when it does not
(the daemon counts that as a demotion the pool could not take).

Classes:
    ChunkUnavailableError: the pool could not provide a chunk now (unreachable, timeout).
    ChunkNotFoundError: the pool does not hold the chunk (it was deleted: forget it).
    ChunkSource: the interface (read, size, ensure, close).
    KvpChunkSource: NOCACHE GETs to the key's pool node.
    BackendChunkSource: a PoolBackend in this process.
"""

from __future__ import annotations

import abc
import asyncio
import random
import select
import socket
import time
from collections.abc import Callable
from typing import Any

from controlplane.errors import ConfigError, ControlPlaneError
from kvcast import p4constants as c
from kvcast.backend import PoolBackend, PoolBackendError
from kvcast.fetch import FetchClient, FetchError, RecomputeReason
from kvcast.wire import KvpHeader, WireError, get_message

__all__ = [
    "Address",
    "BackendChunkSource",
    "ChunkNotFoundError",
    "ChunkSource",
    "ChunkUnavailableError",
    "KvpChunkSource",
]

Address = tuple[str, int]


class ChunkUnavailableError(ControlPlaneError):
    """The pool could not provide the chunk now (unreachable, timed out, failed); retry later."""


class ChunkNotFoundError(ChunkUnavailableError):
    """The pool does not hold the chunk: it was deleted, so no policy should keep it."""


class ChunkSource(abc.ABC):
    """Chunk bytes from the DRAM pool."""

    @abc.abstractmethod
    async def read(self, tenant: int, key: int, nbytes: int | None = None) -> bytes:
        """A chunk's bytes.

        Args:
            tenant: tenant id.
            key: chunk key.
            nbytes: its length when known (None: ask the pool first).

        Returns:
            The bytes.

        Raises:
            ChunkNotFoundError: the pool does not hold it.
            ChunkUnavailableError: the pool could not be read now.
        """

    @abc.abstractmethod
    async def size(self, tenant: int, key: int) -> int:
        """A chunk's length in bytes.

        Raises:
            ChunkNotFoundError: the pool does not hold it.
            ChunkUnavailableError: the pool could not be asked now.
        """

    @abc.abstractmethod
    async def ensure(self, tenant: int, key: int, data: bytes | None) -> bool:
        """Makes sure the pool holds a chunk the switch no longer caches (a DEMOTE).

        Args:
            tenant: tenant id.
            key: chunk key.
            data: its bytes if the caller has them (to write back), else None.

        Returns:
            True if it had to be written back, False if the pool held it.

        Raises:
            ChunkUnavailableError: the pool does not hold it and it cannot be written back.
        """

    def close(self) -> None:  # noqa: B027 - optional hook
        """Releases resources."""


# ------------------------------------------------------------------------------ KVP
class KvpChunkSource(ChunkSource):
    """Reads chunks from the key's pool node with NOCACHE GETs (``FetchClient``).

    Args:
        locate: ``(tenant, key) -> (host, port)`` of the pool node to ask.
        timeout_s: bound on one read or size probe.
        get_timeout_s: first timeout of a GET (doubled per retry).
        window: GETs outstanding per read.

    Raises:
        ConfigError: a non-positive timeout or window.
    """

    def __init__(
        self,
        locate: Callable[[int, int], Address],
        *,
        timeout_s: float = 5.0,
        get_timeout_s: float = 0.05,
        window: int = 32,
    ) -> None:
        if timeout_s <= 0 or get_timeout_s <= 0 or window < 1:
            raise ConfigError("timeout_s and get_timeout_s must be > 0 and window >= 1")
        self._locate = locate
        self._timeout_s = timeout_s
        self._get_timeout_s = get_timeout_s
        self._window = window

    async def read(self, tenant: int, key: int, nbytes: int | None = None) -> bytes:  # noqa: D102
        if nbytes is None:
            nbytes = await self.size(tenant, key)
        addr = self._locate(tenant, key)
        return await asyncio.to_thread(self._read_blocking, addr, tenant, key, nbytes)

    async def size(self, tenant: int, key: int) -> int:  # noqa: D102
        addr = self._locate(tenant, key)
        return await asyncio.to_thread(self._size_blocking, addr, tenant, key)

    async def ensure(self, tenant: int, key: int, data: bytes | None) -> bool:  # noqa: D102
        try:
            await self.size(tenant, key)
        except ChunkNotFoundError:
            raise ChunkNotFoundError(
                f"chunk {tenant}:{key:#x} is no longer in the DRAM pool and KVP has no PUT to "
                "return it; configure a backend chunk source to write demoted chunks back"
            ) from None
        return False

    # ------------------------------------------------------------------ blocking parts
    def _read_blocking(self, addr: Address, tenant: int, key: int, nbytes: int) -> bytes:
        dst = bytearray(nbytes)
        try:
            with FetchClient(
                None,
                addr,
                window=self._window,
                timeout_s=self._get_timeout_s,
                max_timeout_s=max(self._get_timeout_s, 0.5),
                max_retries=4,
                deadline_s=self._timeout_s,
            ) as client:
                report = client.fetch(tenant, key, dst, nbytes)
        except (FetchError, OSError) as exc:
            raise ChunkUnavailableError(
                f"cannot read chunk {tenant}:{key:#x} ({nbytes} B) from {addr[0]}:{addr[1]}: {exc}"
            ) from exc
        if report.ok:
            return bytes(dst)
        if report.reason is RecomputeReason.NOT_FOUND:
            raise ChunkNotFoundError(f"pool {addr[0]}:{addr[1]} has no chunk {tenant}:{key:#x}")
        if report.reason is RecomputeReason.REFUSED:
            raise ChunkUnavailableError(
                f"pool {addr[0]}:{addr[1]} refused the GETs of chunk {tenant}:{key:#x} "
                f"({nbytes} B): most likely it holds the chunk with another length (reports "
                "disagree with the pool); its length is probed again"
            )
        raise ChunkUnavailableError(
            f"reading chunk {tenant}:{key:#x} from {addr[0]}:{addr[1]} failed: "
            f"{report.reason.value} after {report.gets_sent} GETs in {report.duration_s:.2f} s"
        )

    def _size_blocking(self, addr: Address, tenant: int, key: int) -> int:
        deadline = time.monotonic() + self._timeout_s
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            first = self._probe(sock, addr, tenant, key, 0, deadline)
            if first.frag_count <= 1:
                return first.payload_len
            last = self._probe(sock, addr, tenant, key, first.frag_count - 1, deadline)
            return (first.frag_count - 1) * c.FRAG_BYTES + last.payload_len

    def _probe(
        self, sock: socket.socket, addr: Address, tenant: int, key: int, frag: int, deadline: float
    ) -> KvpHeader:
        """One fragment's DATA header (retrying on silence), or the NACK's meaning."""
        wait = self._get_timeout_s
        while time.monotonic() < deadline:
            req_id = random.getrandbits(32)
            msg = get_message(tenant, key, frag, req_id=req_id, flags=c.KVP_FLAG_NOCACHE)
            try:
                sock.sendto(msg, addr)
            except OSError as exc:
                raise ChunkUnavailableError(
                    f"cannot reach pool {addr[0]}:{addr[1]}: {exc}"
                ) from exc
            until = min(deadline, time.monotonic() + wait)
            while (left := until - time.monotonic()) > 0:
                ready, _, _ = select.select([sock], [], [], left)
                if not ready:
                    break
                try:
                    raw = sock.recv(65535)
                    hdr = KvpHeader.unpack(raw)
                except (OSError, WireError):
                    continue
                if hdr.req_id != req_id or hdr.key != key or hdr.tenant != tenant:
                    continue
                if hdr.op == c.KVP_OP_NACK:
                    if hdr.status == c.KVP_STATUS_NOT_FOUND:
                        raise ChunkNotFoundError(
                            f"pool {addr[0]}:{addr[1]} has no chunk {tenant}:{key:#x}"
                        )
                    raise ChunkUnavailableError(
                        f"pool {addr[0]}:{addr[1]} refused chunk {tenant}:{key:#x} "
                        f"(NACK status {hdr.status})"
                    )
                if hdr.op == c.KVP_OP_DATA and hdr.frag_idx == frag and hdr.frag_count > 0:
                    return hdr
            wait = min(wait * 2, 0.5)
        raise ChunkUnavailableError(
            f"pool {addr[0]}:{addr[1]} did not answer for chunk {tenant}:{key:#x} within "
            f"{self._timeout_s} s"
        )


# ------------------------------------------------------------------------------ backend
class BackendChunkSource(ChunkSource):
    """Reads (and writes back demoted) chunks through a PoolBackend in this process.

    Args:
        backend: the pool's storage (Mooncake client or in-memory).
    """

    def __init__(self, backend: PoolBackend) -> None:
        self._backend = backend

    async def read(self, tenant: int, key: int, nbytes: int | None = None) -> bytes:  # noqa: D102
        data = await self._call(self._backend.get, tenant, key)
        if data is None:
            raise ChunkNotFoundError(f"the pool backend has no chunk {tenant}:{key:#x}")
        return bytes(data)

    async def size(self, tenant: int, key: int) -> int:  # noqa: D102
        n = await self._call(self._backend.size, tenant, key)
        if n is None:
            raise ChunkNotFoundError(f"the pool backend has no chunk {tenant}:{key:#x}")
        return int(n)

    async def ensure(self, tenant: int, key: int, data: bytes | None) -> bool:  # noqa: D102
        if await self._call(self._backend.contains, tenant, key):
            return False
        if data is None:
            raise ChunkNotFoundError(
                f"chunk {tenant}:{key:#x} is not in the pool and its bytes are unknown"
            )
        await self._call(self._backend.put, tenant, key, data)
        return True

    @staticmethod
    async def _call(fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return await asyncio.to_thread(fn, *args)
        except PoolBackendError as exc:
            raise ChunkUnavailableError(f"pool backend failed: {exc}") from exc
