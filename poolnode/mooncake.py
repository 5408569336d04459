"""Mooncake Store's service for the DRAM pool: starting and supervising ``mooncake_master``.

Mooncake Store (PyPI ``mooncake-transfer-engine-non-cuda``) keeps objects in DRAM segments that
its clients mount; ``mooncake_master`` is its only service and holds the metadata. kvcast starts
the master itself (``MooncakeMaster``, a subprocess on loopback); the pool node and agents open
store clients with ``kvcast.mooncake.MooncakeBackend``.

A master that dies loses its metadata (which objects exist, where), not the segments' bytes'
owners: ``MooncakeMaster.supervise`` starts it again on the same address, and the store clients
reconnect on their own (the first call after the restart fails with RPC_FAIL, the next ones
work: tried with mooncake-transfer-engine-non-cuda's client against a new master on the same
port), so the caller only has to put its objects back (``python -m poolnode`` re-puts its
preloaded chunks).

Classes:
    MooncakeMaster: starts, health-checks, supervises (restarts) and stops a ``mooncake_master``
        process (no orphans).
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
from collections.abc import Callable, Sequence
from pathlib import Path

from kvcast.lifecycle import Service
from kvcast.mooncake import PACKAGE, MooncakeUnavailableError

_PR_SET_PDEATHSIG = 1

_LOG = logging.getLogger(__name__)


class MasterStartError(RuntimeError):
    """``mooncake_master`` exited or did not listen in time; the message holds its log tail."""


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


class MooncakeMaster(Service):
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
