"""Mooncake Store as a pool backend: ``MooncakeBackend``, a ``PoolBackend`` over its client.

One store client per process, ``protocol="tcp"`` and the peer-to-peer handshake
(``metadata_server="P2PHANDSHAKE"``), so no etcd or HTTP metadata server is needed. The pool node
serves its chunks from one; an agent reads a lone miss through one (the "direct" path of
``kvcast.fetch``). The master it talks to is started by ``poolnode.mooncake.MooncakeMaster``.

Data moves with the store's pointer calls (``put_from``, ``batch_put_from``, ``get_into``) so a
chunk is copied once between the store and the caller's buffer.

Static chunks (``kvcast.kvclass``) are put with a soft pin: the ``ReplicateConfig`` of the
batched put has ``soft_pin_action = SoftPinAction.ENABLE`` (and ``soft_pin_ttl_ms`` when given),
and the master evicts soft-pinned objects only when nothing unpinned is left to evict
(``mooncake_master --allow_evict_soft_pinned_objects``, default true; a pin without a TTL lasts
the master's ``--default_kv_soft_pin_ttl``, 30 minutes by default). A static put of an object
that exists already (put as transient) is an upsert with the pin, so the pin is never lost to
"already exists". Transient chunks are put as before, unpinned. Mooncake answers with integer
status codes; this module turns them into ``None``/``False`` for a missing object and into a
``PoolBackendError`` naming the code otherwise.

Classes:
    MooncakeBackend: ``PoolBackend`` over ``mooncake.store.MooncakeDistributedStore``.
    MooncakeUnavailableError: the package or the master binary is not installed.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from kvcast.backend import BytesLike, PoolBackend, PoolBackendError, check_name
from kvcast.kvclass import KvClass

PACKAGE = "mooncake-transfer-engine-non-cuda"

# Mooncake's ErrorCode values (mooncake-store/include/types.h).
OBJECT_NOT_FOUND = -704
OBJECT_ALREADY_EXISTS = -705
ERROR_NAMES = {
    -200: "NO_AVAILABLE_HANDLE (pool out of space)",
    -600: "INVALID_PARAMS",
    -703: "REPLICA_IS_NOT_READY",
    -704: "OBJECT_NOT_FOUND",
    -705: "OBJECT_ALREADY_EXISTS",
    -706: "OBJECT_HAS_LEASE",
    -707: "LEASE_EXPIRED",
    -800: "TRANSFER_FAIL",
    -900: "RPC_FAIL (master unreachable?)",
    -901: "RPC_TIMEOUT",
}
_LOG = logging.getLogger(__name__)


class MooncakeUnavailableError(ImportError):
    """The Mooncake package or its ``mooncake_master`` binary is not installed."""


def _describe(code: int) -> str:
    return f"{code} ({ERROR_NAMES.get(code, 'see mooncake-store/include/types.h')})"


def _check_reachable(master_addr: str, timeout_s: float = 2.0) -> None:
    """Fails fast when nothing listens at the master's address.

    The store's own ``setup`` retries for about 90 s before it reports an unreachable master.
    """
    host, _, port = master_addr.rpartition(":")
    if not host or not port.isdigit():
        raise PoolBackendError(f"master address {master_addr!r} is not host:port")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            pass
    except OSError as exc:
        raise PoolBackendError(
            f"mooncake_master is not reachable at {master_addr} ({exc}): start it "
            "(poolnode.mooncake.MooncakeMaster or `mooncake_master --rpc_port=...`) first"
        ) from exc


def _address(buf: BytesLike) -> tuple[np.ndarray[Any, np.dtype[np.uint8]], int]:
    """A uint8 array over ``buf`` (kept alive by the caller) and its data address."""
    arr = np.frombuffer(buf, dtype=np.uint8)
    return arr, int(arr.ctypes.data)


class MooncakeBackend(PoolBackend):
    """Chunks in Mooncake Store, one object per ``(tenant, key)``.

    Objects are named ``"{prefix}/{tenant:04x}/{key:016x}"``. The client mounts
    ``global_segment_size`` bytes of this process's DRAM into the pool (0 for a client that only
    reads and writes through others' segments).

    Args:
        master_addr: ``host:port`` of ``mooncake_master``.
        local_hostname: this client's address for transfers (loopback in tests).
        metadata_server: ``"P2PHANDSHAKE"`` or the master's HTTP metadata URL.
        global_segment_size: DRAM this client contributes to the pool, in bytes.
        local_buffer_size: the client's staging buffer, in bytes.
        protocol: transfer protocol; ``"tcp"`` on machines without RDMA.
        device_name: RDMA devices (empty for TCP).
        prefix: object name prefix, to share one store between deployments.
        static_pin_ttl_ms: the soft pin's TTL of static chunks (None: the master's default).

    Raises:
        MooncakeUnavailableError: the Mooncake package is not installed.
        PoolBackendError: the store client could not be set up (master unreachable?).
    """

    def __init__(
        self,
        master_addr: str,
        local_hostname: str = "127.0.0.1",
        metadata_server: str = "P2PHANDSHAKE",
        global_segment_size: int = 256 << 20,
        local_buffer_size: int = 64 << 20,
        protocol: str = "tcp",
        device_name: str = "",
        prefix: str = "kvcast",
        static_pin_ttl_ms: int | None = None,
    ) -> None:
        try:
            from mooncake.store import MooncakeDistributedStore, ReplicateConfig, SoftPinAction
        except ImportError as exc:
            raise MooncakeUnavailableError(
                f"Mooncake Store is not importable ({exc}): pip install {PACKAGE} (Debian also "
                "needs libibverbs1, libnl-3-200 and libnl-route-3-200)"
            ) from exc
        self.prefix = prefix
        self.master_addr = master_addr
        if static_pin_ttl_ms is not None and static_pin_ttl_ms <= 0:
            raise ValueError(f"static_pin_ttl_ms must be positive, got {static_pin_ttl_ms}")
        self._pinned: Any = ReplicateConfig()
        self._pinned.soft_pin_action = SoftPinAction.ENABLE
        if static_pin_ttl_ms is not None:
            self._pinned.soft_pin_ttl_ms = static_pin_ttl_ms
        _check_reachable(master_addr)
        self._store: Any = MooncakeDistributedStore()
        rc = self._store.setup(
            local_hostname,
            metadata_server,
            global_segment_size,
            local_buffer_size,
            protocol,
            device_name,
            master_addr,
        )
        if rc != 0:
            raise PoolBackendError(
                f"Mooncake store setup failed with {_describe(rc)}: is mooncake_master running "
                f"at {master_addr} and is {local_hostname} an address of this host?"
            )
        self._closed = False

    def name(self, tenant: int, key: int) -> str:
        """The Mooncake object name of a chunk."""
        return f"{self.prefix}/{tenant:04x}/{key:016x}"

    def size(self, tenant: int, key: int) -> int | None:  # noqa: D102
        rc = int(self._store.get_size(self.name(tenant, key)))
        if rc == OBJECT_NOT_FOUND:
            return None
        if rc < 0:
            raise PoolBackendError(f"Mooncake get_size({tenant}, {key:#x}) failed: {_describe(rc)}")
        return rc

    def get_into(self, tenant: int, key: int, dst: memoryview) -> int | None:  # noqa: D102
        if dst.readonly:
            raise ValueError("get_into needs a writable buffer")
        arr, addr = _address(dst)
        rc = int(self._store.get_into(self.name(tenant, key), addr, len(arr)))
        if rc == OBJECT_NOT_FOUND:
            return None
        if rc == -600:
            raise ValueError(f"buffer of {len(arr)} bytes is too small for chunk {key:#x}")
        if rc < 0:
            raise PoolBackendError(f"Mooncake get_into({tenant}, {key:#x}) failed: {_describe(rc)}")
        return rc

    def get(self, tenant: int, key: int) -> bytes | None:  # noqa: D102
        for _ in range(2):  # the object may be replaced between get_size and get_into
            size = self.size(tenant, key)
            if size is None:
                return None
            buf = bytearray(size)
            try:
                n = self.get_into(tenant, key, memoryview(buf))
            except ValueError:
                continue
            return None if n is None else bytes(buf[:n])
        raise PoolBackendError(f"chunk {key:#x} of tenant {tenant} kept changing size")

    def put(  # noqa: D102
        self, tenant: int, key: int, data: BytesLike, *, kv_class: KvClass = KvClass.TRANSIENT
    ) -> None:
        self.put_many([(tenant, key, data)], kv_class=kv_class)

    @property
    def static_config(self) -> Any:
        """The ``ReplicateConfig`` static chunks are put with (soft pin on)."""
        return self._pinned

    def put_many(
        self,
        items: Iterable[tuple[int, int, BytesLike]],
        *,
        kv_class: KvClass = KvClass.TRANSIENT,
    ) -> None:
        """Stores several chunks with one ``batch_put_from`` (soft-pinned when static).

        Args:
            items: ``(tenant, key, data)`` triples.
            kv_class: their class; static chunks are put with :attr:`static_config`, and those
                that exist already are upserted with it (one ``batch_upsert_from``).

        Raises:
            ValueError: an empty chunk or a name that does not fit the wire fields.
            PoolBackendError: a chunk could not be stored; the message lists which and why.
        """
        names: list[str] = []
        arrays: list[np.ndarray[Any, np.dtype[np.uint8]]] = []
        ptrs: list[int] = []
        sizes: list[int] = []
        for tenant, key, data in items:
            check_name(tenant, key)
            arr, addr = _address(data)
            if arr.size == 0:
                raise ValueError(f"chunk {key:#x} of tenant {tenant} is empty")
            names.append(self.name(tenant, key))
            arrays.append(arr)
            ptrs.append(addr)
            sizes.append(int(arr.size))
        if not names:
            return
        if kv_class is KvClass.STATIC:
            pin = self._pinned
            codes = [int(rc) for rc in self._store.batch_put_from(names, ptrs, sizes, pin)]
            again = [i for i, rc in enumerate(codes) if rc == OBJECT_ALREADY_EXISTS]
            if again:
                upserted = self._store.batch_upsert_from(
                    [names[i] for i in again],
                    [ptrs[i] for i in again],
                    [sizes[i] for i in again],
                    pin,
                )
                for i, rc in zip(again, upserted, strict=True):
                    codes[i] = int(rc)
        else:
            codes = [int(rc) for rc in self._store.batch_put_from(names, ptrs, sizes)]
        failed = [
            f"{n}: {_describe(rc)}"
            for n, rc in zip(names, codes, strict=True)
            if rc not in (0, OBJECT_ALREADY_EXISTS)
        ]
        if failed:
            raise PoolBackendError("Mooncake batch_put_from failed for " + "; ".join(failed))

    def contains(self, tenant: int, key: int) -> bool:  # noqa: D102
        rc = int(self._store.is_exist(self.name(tenant, key)))
        if rc < 0:
            raise PoolBackendError(f"Mooncake is_exist({tenant}, {key:#x}) failed: {_describe(rc)}")
        return rc == 1

    def contains_many(self, tenant: int, keys: Sequence[int]) -> list[bool]:
        """Whether each chunk is stored: one ``batch_is_exist`` (one master RPC) for all."""
        if not keys:
            return []
        names = [self.name(tenant, k) for k in keys]
        codes = [int(rc) for rc in self._store.batch_is_exist(names)]
        bad = [(k, rc) for k, rc in zip(keys, codes, strict=True) if rc < 0]
        if bad or len(codes) != len(keys):
            what = ", ".join(f"{k:#x}: {_describe(rc)}" for k, rc in bad) or "wrong length"
            raise PoolBackendError(f"Mooncake batch_is_exist failed ({what})")
        return [rc == 1 for rc in codes]

    def delete(self, tenant: int, key: int) -> bool:  # noqa: D102
        # force: a read grants the object a lease (default 10 s) that would refuse the removal.
        rc = int(self._store.remove(self.name(tenant, key), True))
        if rc == OBJECT_NOT_FOUND:
            return False
        if rc < 0:
            raise PoolBackendError(f"Mooncake remove({tenant}, {key:#x}) failed: {_describe(rc)}")
        return True

    def close(self) -> None:
        """Closes the store client (unmounts its segment). Safe to call twice."""
        if not self._closed:
            self._closed = True
            self._store.close()
