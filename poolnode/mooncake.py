"""Mooncake Store as the DRAM pool: a ``PoolBackend`` over it and a ``mooncake_master`` manager.

Mooncake Store (PyPI ``mooncake-transfer-engine-non-cuda``) keeps objects in DRAM segments that
its clients mount; ``mooncake_master`` is its only service and holds the metadata. kvcast starts
the master itself (``MooncakeMaster``, a subprocess on loopback) and opens one store client per
pool node (``MooncakeBackend``) with ``protocol="tcp"`` and the peer-to-peer handshake
(``metadata_server="P2PHANDSHAKE"``), so no etcd or HTTP metadata server is needed.

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

A master that dies loses its metadata (which objects exist, where), not the segments' bytes'
owners: ``MooncakeMaster.supervise`` starts it again on the same address, and the store clients
reconnect on their own (the first call after the restart fails with RPC_FAIL, the next ones
work: tried with mooncake-transfer-engine-non-cuda's client against a new master on the same
port), so the caller only has to put its objects back (``python -m poolnode`` re-puts its
preloaded chunks).

Classes:
    MooncakeMaster: starts, health-checks, supervises (restarts) and stops a ``mooncake_master``
        process (no orphans).
    MooncakeBackend: ``PoolBackend`` over ``mooncake.store.MooncakeDistributedStore``.
    MooncakeUnavailableError: the package or the master binary is not installed.
    MasterStartError: ``mooncake_master`` did not come up.

Functions:
    find_master_binary: where the installed ``mooncake_master`` is, if anywhere.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import importlib.util
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import TracebackType
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
_PR_SET_PDEATHSIG = 1

_LOG = logging.getLogger(__name__)


class MooncakeUnavailableError(ImportError):
    """The Mooncake package or its ``mooncake_master`` binary is not installed."""


class MasterStartError(RuntimeError):
    """``mooncake_master`` exited or did not listen in time; the message holds its log tail."""


def _describe(code: int) -> str:
    return f"{code} ({ERROR_NAMES.get(code, 'see mooncake-store/include/types.h')})"


def find_master_binary() -> str | None:
    """The path of the installed ``mooncake_master``, or ``None``.

    The binary that the Mooncake wheel ships inside its package is preferred (the
    ``mooncake_master`` console script only ``exec``s it); then any ``mooncake_master`` on PATH.
    """
    spec = importlib.util.find_spec("mooncake")
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            candidate = Path(location) / "mooncake_master"
            if candidate.is_file():
                return str(candidate)
    return shutil.which("mooncake_master")


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Asks Linux to SIGTERM the child when the process that started it dies."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class MooncakeMaster:
    """A ``mooncake_master`` subprocess on loopback, stopped on ``stop()``, exit or error.

    The master gets free TCP ports for its RPC service and its metrics/admin server (bound to
    ``host``), writes its log to a file, and receives SIGTERM if this process dies (Linux
    ``PR_SET_PDEATHSIG``); ``stop()`` also runs at interpreter exit.

    Args:
        binary: path of ``mooncake_master``; default: ``find_master_binary()``.
        host: address the master binds and clients dial.
        rpc_port: RPC port; 0 picks a free one.
        extra_args: more ``--flag=value`` arguments (e.g. ``--default_kv_lease_ttl=1000``).
        log_path: where the master's output goes; default: a temporary file.
        start_timeout_s: how long to wait for the RPC port.

    Raises:
        MooncakeUnavailableError: no ``mooncake_master`` was found.
    """

    def __init__(
        self,
        binary: str | None = None,
        host: str = "127.0.0.1",
        rpc_port: int = 0,
        extra_args: Sequence[str] = (),
        log_path: str | None = None,
        start_timeout_s: float = 15.0,
    ) -> None:
        found = binary or find_master_binary()
        if found is None:
            raise MooncakeUnavailableError(
                f"mooncake_master not found: pip install {PACKAGE} (Debian also needs "
                "libibverbs1, libnl-3-200 and libnl-route-3-200)"
            )
        self.binary = found
        self.host = host
        self.rpc_port = rpc_port
        self._requested_port = rpc_port
        self.extra_args = list(extra_args)
        self.start_timeout_s = start_timeout_s
        self._own_log = log_path is None
        self.log_path = log_path or ""
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._watch: threading.Thread | None = None
        self.restarts = 0
        """Times the supervisor started the master again."""

    @property
    def address(self) -> str:
        """``host:rpc_port``, the ``master_server_addr`` store clients dial."""
        return f"{self.host}:{self.rpc_port}"

    @property
    def pid(self) -> int | None:
        """The master's process id while it runs."""
        return self._proc.pid if self._proc is not None else None

    def running(self) -> bool:
        """Whether the master process is alive."""
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> MooncakeMaster:
        """Starts the master and waits until its RPC port accepts connections.

        A port taken between choosing and binding it is retried with fresh ports (three tries).

        Returns:
            ``self``.

        Raises:
            MasterStartError: the master exited or did not listen within ``start_timeout_s``;
                the message holds the tail of its log. No process is left behind.
        """
        with self._lock:
            if self.running():
                return self
            fixed = self._requested_port
            last: MasterStartError | None = None
            for _ in range(1 if fixed else 3):
                try:
                    self._start_once(fixed or _free_port(self.host))
                    atexit.register(self.stop)
                    return self
                except MasterStartError as exc:
                    last = exc
            assert last is not None
            raise last

    def _start_once(self, rpc_port: int) -> None:
        if self._own_log:
            if self.log_path:  # the log of a failed earlier attempt
                with contextlib.suppress(OSError):
                    os.unlink(self.log_path)
            fd, self.log_path = tempfile.mkstemp(prefix="mooncake_master.", suffix=".log")
            os.close(fd)
        metrics_port = _free_port(self.host)
        argv = [
            self.binary,
            f"--rpc_port={rpc_port}",
            f"--rpc_address={self.host}",
            f"--metrics_port={metrics_port}",
            f"--metrics_host={self.host}",
            "--enable_metric_reporting=false",
            *self.extra_args,
        ]
        with open(self.log_path, "wb") as log:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
            )
        self._proc = proc
        self.rpc_port = rpc_port
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                break
            try:
                with socket.create_connection((self.host, rpc_port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        why = (
            f"exited with status {proc.returncode}"
            if proc.poll() is not None
            else f"did not listen on {self.host}:{rpc_port} within {self.start_timeout_s} s"
        )
        self._terminate()
        raise MasterStartError(
            f"mooncake_master {why}; command: {' '.join(argv)}; log {self.log_path}:\n"
            f"{self.log_tail()}"
        )

    def supervise(
        self,
        on_down: Callable[[], None] | None = None,
        on_restart: Callable[[float], None] | None = None,
        poll_s: float = 0.05,
    ) -> MooncakeMaster:
        """Watches the master and starts it again, on the same address, whenever it dies.

        A thread polls the process every ``poll_s``. When it has exited (crash, SIGKILL),
        ``on_down()`` is called, a new master is started on the same host and RPC port (the
        clients dial that address; a failed start is tried again at the next poll), and
        ``on_restart(down_s)`` is called with the seconds from noticing the death to the new
        master listening. The new master has no metadata: putting the objects back is the
        caller's (``on_restart``). ``stop()`` ends the supervision before it stops the master.

        Args:
            on_down: called (in the supervisor's thread) when the master is found dead.
            on_restart: called (in that thread) once a new master listens.
            poll_s: seconds between checks.

        Returns:
            ``self``.

        Raises:
            MasterStartError: the master is not running (start it first).
        """
        with self._lock:
            if not self.running():
                raise MasterStartError("supervise() needs a running master: call start() first")
            if self._watch is None:
                self._stopping.clear()
                self._watch = threading.Thread(
                    target=self._supervise,
                    args=(on_down, on_restart, poll_s),
                    name="mooncake-master-supervisor",
                    daemon=True,
                )
                self._watch.start()
        return self

    def _supervise(
        self,
        on_down: Callable[[], None] | None,
        on_restart: Callable[[float], None] | None,
        poll_s: float,
    ) -> None:
        # The supervisor's thread starts every later master, so it must outlive them: Linux
        # delivers PR_SET_PDEATHSIG when the thread that forked the child ends.
        down_since: float | None = None
        while not self._stopping.wait(poll_s):
            with self._lock:
                if self._stopping.is_set():
                    return
                proc = self._proc
                if proc is not None and proc.poll() is None:
                    continue
                if down_since is None:
                    down_since = time.monotonic()
                    status = None if proc is None else proc.returncode
                    _LOG.warning("mooncake_master %s exited (status %s)", self.address, status)
                    if on_down is not None:
                        try:
                            on_down()
                        except Exception:  # a callback's failure must not end the supervision
                            _LOG.exception("mooncake_master on_down callback failed")
                self._proc = None
                try:
                    self._start_once(self.rpc_port)
                except MasterStartError as exc:
                    _LOG.error("mooncake_master did not start again (tried again): %s", exc)
                    continue
                down_s = time.monotonic() - down_since
                down_since = None
                self.restarts += 1
                _LOG.warning("mooncake_master %s started again in %.2f s", self.address, down_s)
            if on_restart is not None:
                try:
                    on_restart(down_s)
                except Exception:
                    _LOG.exception("mooncake_master on_restart callback failed")

    def log_tail(self, lines: int = 20) -> str:
        """The last ``lines`` lines of the master's log."""
        try:
            text = Path(self.log_path).read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def _terminate(self, timeout_s: float = 5.0) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._proc = None

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stops the master (SIGTERM, then SIGKILL after ``timeout_s``) and reaps it.

        Safe to call more than once and when the master never started. A supervision
        (``supervise``) ends first, so the master is not started again.
        """
        self._stopping.set()
        watch, self._watch = self._watch, None
        if watch is not None and watch is not threading.current_thread():
            watch.join(timeout_s + self.start_timeout_s)
        with self._lock:
            self._terminate(timeout_s)
            atexit.unregister(self.stop)
            if self._own_log and self.log_path:
                with contextlib.suppress(OSError):
                    os.unlink(self.log_path)
                self.log_path = ""

    def __enter__(self) -> MooncakeMaster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


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
