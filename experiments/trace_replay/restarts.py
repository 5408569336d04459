"""Faults a trace replay injects in the middle of a run, and what followed them.

Each watcher is a thread that kills one component at a set time (SIGKILL: a crash) and records,
in seconds since the kill, how the system came back.

Classes:
    SwitchRestart: the switch process killed and started again, empty.
    PoolRestart: the pool node killed and started again.
    MasterRestart: the pool node's ``mooncake_master`` killed (the node restarts it).
    ControllerRestart: the controller daemon killed and started again (optionally mid-load).

Functions:
    cache_entries: entries in the switch's cache table.
    sram_writes: WRITEs the switch has stored into SRAM.
    restart_outcome: a restart's outcome from the watcher's events and the agents' rows.
"""

from __future__ import annotations

import os
import queue
import signal
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from experiments.trace_replay.processes import ControllerProcess, PoolProcess, controller_metrics
from kvcast import p4constants as c
from kvcast.reports import ReportClient

if TYPE_CHECKING:
    from emulation.network import Cluster


class _RestartWatcher:
    """A thread that kills one component at a set time and records what followed.

    Subclasses implement :meth:`_run`, filling ``events`` (seconds since the kill, and ``error``
    when something did not come back); :meth:`join` returns them.
    """

    thread_name = "restart"

    def __init__(self) -> None:
        self.events: dict[str, Any] = {}
        self._thread: threading.Thread | None = None

    def start(self, at: float) -> None:
        """Restarts the component at wall-clock time ``at`` (in a thread)."""
        self._thread = threading.Thread(
            target=self._run, args=(at,), name=self.thread_name, daemon=True
        )
        self._thread.start()

    def join(self, timeout: float | None = None) -> dict[str, Any]:
        """Waits for the watcher; returns the events."""
        if self._thread is not None:
            self._thread.join(timeout)
        return dict(self.events)

    def _run(self, at: float) -> None:
        raise NotImplementedError


class SwitchRestart(_RestartWatcher):
    """Kills the switch process in the middle of a run and watches the controller bring it back.

    At ``t0 + after_s`` the switch process is killed (SIGKILL) and started again, empty, on the
    same ports and P4Runtime address (:meth:`P4Switch.restart`); nobody re-programs it but the
    controller daemon. The thread then polls the daemon's status API and records, in seconds
    since the kill: when the daemon saw the switch go (``detect_s``), when the new process
    listened (``up_s``), when the daemon had a new session on it, i.e. pipeline and base state
    re-pushed (``resync_s``), and when it held again at least as many chunks as before the kill
    (``reloaded_s``).

    Args:
        cluster: the running cluster.
        status: the daemon's report client (its ``GET /v1/status``).
        switch: the switch's name in the daemon's configuration.
        timeout: how long the watcher waits for the recovery.
    """

    thread_name = "switch-restart"

    def __init__(
        self, cluster: Cluster, status: ReportClient, switch: str = "s1", timeout: float = 60.0
    ) -> None:
        super().__init__()
        self.cluster = cluster
        self.status = status
        self.switch = switch
        self.timeout = timeout

    def _sw(self) -> dict[str, Any]:
        code, doc = self.status.status()
        sw: dict[str, Any] = doc.get("switches", {}).get(self.switch, {}) if code == 200 else {}
        return sw

    def _run(self, at: float) -> None:
        timeout = self.timeout
        ev = self.events
        try:
            time.sleep(max(0.0, at - time.time()))
            before = self._sw()
            gen0 = int(before.get("generation", 0))
            ev["resident_before"] = int(before.get("resident_chunks", 0))
            self.cluster.switch.kill()
            killed = time.time()  # the process is gone: nothing it sends is after this
            ev["killed_at"] = killed

            def start_again() -> None:
                try:
                    self.cluster.switch.start_again(install=False)
                    ev["up_s"] = time.time() - killed
                except Exception as exc:  # noqa: BLE001 - recorded
                    ev["error"] = f"switch did not start again: {exc!r}"

            # The daemon's view is polled while the new process starts, so that it is seen
            # noticing the loss whenever it does.
            starter = threading.Thread(target=start_again, name="switch-start", daemon=True)
            starter.start()
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and "error" not in ev:
                sw = self._sw()
                now = time.time() - killed
                if "detect_s" not in ev and (
                    sw.get("state") != "ready" or int(sw.get("generation", 0)) > gen0
                ):
                    ev["detect_s"] = now
                if "resync_s" not in ev and sw.get("state") == "ready":
                    if int(sw.get("generation", 0)) > gen0:
                        ev["resync_s"] = now
                        ev["generation"] = int(sw["generation"])
                if "resync_s" in ev and int(sw.get("resident_chunks", 0)) >= ev["resident_before"]:
                    ev["reloaded_s"] = now
                    ev["resident_after"] = int(sw.get("resident_chunks", 0))
                    break
                time.sleep(0.02)
            else:
                ev.setdefault("error", f"not recovered within {timeout} s")
            starter.join(timeout)
        except Exception as exc:  # noqa: BLE001 - recorded in the run's outcome, never lost
            ev["error"] = f"restart failed: {exc!r}"


class PoolRestart(_RestartWatcher):
    """Kills the pool node in the middle of a run and starts it again at once.

    Records the seconds from the kill until the new process listens (``up_s``); the agents'
    rows give when the pool answered again (:func:`restart_outcome`).

    Args:
        pool: the pool node's process.
    """

    thread_name = "pool-restart"

    def __init__(self, pool: PoolProcess) -> None:
        super().__init__()
        self.pool = pool

    def _run(self, at: float) -> None:
        ev = self.events
        try:
            time.sleep(max(0.0, at - time.time()))
            self.pool.kill()
            killed = time.time()
            ev["killed_at"] = killed
            self.pool.start()
            ev["up_s"] = time.time() - killed
        except Exception as exc:  # noqa: BLE001 - recorded in the run's outcome, never lost
            ev["error"] = f"pool restart failed: {exc!r}"


class MasterRestart(_RestartWatcher):
    """Kills the pool node's ``mooncake_master`` in the middle of a run; the node restarts it.

    Nothing but the pool node's own supervisor (``python -m poolnode``, ``MooncakeMaster.
    supervise``) brings the master back and puts the node's chunks back into the new store.
    Records, in seconds since the kill: when the node reported the master up again with its
    chunks put back (``up_s``), the master's downtime as the node measured it (``down_s``) and
    the chunks put back (``reput``); the agents' rows give the rest (:func:`restart_outcome`).

    Args:
        pool: the pool node's process (started with ``--backend mooncake --start-master``).
        timeout: how long to wait for the node's report.
    """

    thread_name = "master-restart"

    def __init__(self, pool: PoolProcess, timeout: float = 60.0) -> None:
        super().__init__()
        self.pool = pool
        self.timeout = timeout

    def _run(self, at: float) -> None:
        ev = self.events
        try:
            time.sleep(max(0.0, at - time.time()))
            pid = self.pool.master_pid
            if pid is None:
                ev["error"] = "the pool node reported no mooncake_master pid"
                return
            os.kill(pid, signal.SIGKILL)
            killed = time.time()
            ev["killed_at"] = killed
            try:
                seen, line = self.pool.master_restarts.get(timeout=self.timeout)
            except queue.Empty:
                ev["error"] = f"master not restarted within {self.timeout} s"
                return
            ev["up_s"] = seen - killed
            fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
            ev["down_s"] = float(fields.get("down_s", "nan"))
            ev["reput"] = int(fields.get("reput", "0"))
            if "not put back" in line:
                ev["error"] = line
        except Exception as exc:  # noqa: BLE001 - recorded in the run's outcome, never lost
            ev["error"] = f"master restart failed: {exc!r}"


def cache_entries(address: str, device_id: int = 1) -> int:
    """Entries in the switch's cache table, read without arbitration (a read needs none)."""
    import grpc
    from finsy.proto import p4r, p4r_grpc

    from emulation.targets import load_p4info

    (table_id,) = (
        t.preamble.id
        for t in load_p4info().tables
        if t.preamble.name == c.TABLE_INGRESS_CACHE_CACHE_TABLE
    )
    request = p4r.ReadRequest(device_id=device_id)
    request.entities.add().table_entry.table_id = table_id
    with grpc.insecure_channel(address) as channel:
        replies = p4r_grpc.P4RuntimeStub(channel).Read(request, timeout=10)
        return sum(len(r.entities) for r in replies)


def sram_writes(address: str, device_id: int = 1) -> int:
    """WRITEs the switch has stored into SRAM (its KVP event counter ``EV_WRITE``).

    Read without arbitration (a read needs none).
    """
    import grpc
    from finsy.proto import p4r, p4r_grpc

    from emulation.targets import load_p4info

    (counter_id,) = (
        t.preamble.id
        for t in load_p4info().counters
        if t.preamble.name == c.COUNTER_INGRESS_STATS_KVP_EVENT_COUNTER
    )
    request = p4r.ReadRequest(device_id=device_id)
    entry = request.entities.add().counter_entry
    entry.counter_id = counter_id
    entry.index.index = c.EV_WRITE
    with grpc.insecure_channel(address) as channel:
        for reply in p4r_grpc.P4RuntimeStub(channel).Read(request, timeout=10):
            for entity in reply.entities:
                return int(entity.counter_entry.data.packet_count)
    return 0


class ControllerRestart(_RestartWatcher):
    """Kills the controller daemon in the middle of a run and starts it again at once.

    The switch keeps its pipeline, tables and SRAM meanwhile. The new daemon must adopt what
    the old one left (no chunk reloaded, no duplicate) and reconcile its tables (no orphan entry,
    no stale slot). Records, in seconds since the kill: when the new daemon had a session on the
    switch (``resync_s``); the chunks resident before the kill and after (``resident_before``,
    ``resident_after``); the cache table's entries then (``switch_entries``) and the orphans
    among them (``orphans``: entries the daemon does not hold, must be 0); and the daemon's
    loads in its first session (``reloads``, from its metrics; adoption loads nothing).

    With ``during_load_frags`` (the fragments of every block) the daemon is killed while it is
    writing a block into SRAM: from ``at`` on, the switch's count of stored WRITEs is polled,
    and the kill comes when it is not a multiple of a block's fragments (a load is half done).
    ``writes_at_kill`` and ``partial_frags`` (WRITEs of the interrupted load that reached SRAM,
    read once the dead daemon's last packets are through) record it.

    Args:
        daemon: the running daemon.
        switch_address: the switch's P4Runtime address.
        metrics_port: the daemon's metrics port.
        during_load_frags: kill in the middle of a load of blocks of this many fragments
            (None: at ``at``, whatever the daemon is doing).
        load_wait_s: how long to wait for a load in progress before giving up (an error).
    """

    thread_name = "controller-restart"

    def __init__(
        self,
        daemon: ControllerProcess,
        switch_address: str,
        metrics_port: int,
        during_load_frags: int | None = None,
        load_wait_s: float = 20.0,
    ) -> None:
        super().__init__()
        self.daemon = daemon
        self.switch_address = switch_address
        self.metrics_port = metrics_port
        self.during_load_frags = during_load_frags
        self.load_wait_s = load_wait_s

    def _wait_for_a_load(self) -> bool:
        """Freezes the daemon (SIGSTOP) in the middle of a load; False if none is seen in time.

        A count of stored WRITEs that is not a multiple of a block's fragments shows a load in
        progress, but the daemon may finish the block between that read and a kill. So the
        daemon is stopped first, its last packets are let through, and the count read again:
        still partial, the load is interrupted for sure (the caller kills the stopped daemon);
        a whole number of blocks, it goes on (SIGCONT) and the watch starts over.
        """
        frags = self.during_load_frags
        assert frags is not None
        proc = self.daemon.proc
        if proc is None:
            return False
        deadline = time.monotonic() + self.load_wait_s
        while time.monotonic() < deadline:
            if sram_writes(self.switch_address) % frags:
                os.kill(proc.pid, signal.SIGSTOP)
                time.sleep(0.2)  # what it sent before it stopped is through the switch
                if sram_writes(self.switch_address) % frags:
                    return True
                os.kill(proc.pid, signal.SIGCONT)
            time.sleep(0.002)
        return False

    def _run(self, at: float) -> None:
        ev = self.events
        try:
            time.sleep(max(0.0, at - time.time()))
            code, doc = self.daemon.status.status()
            before = doc.get("switches", {}).get("s1", {}) if code == 200 else {}
            ev["resident_before"] = int(before.get("resident_chunks", 0))
            if self.during_load_frags is not None and not self._wait_for_a_load():
                ev["error"] = f"no load in progress seen within {self.load_wait_s} s"
                return
            self.daemon.kill()
            killed = time.time()
            ev["killed_at"] = killed
            if self.during_load_frags is not None:
                time.sleep(0.2)  # the dead daemon's last PacketOuts, if any, are through
                writes = sram_writes(self.switch_address)
                ev["writes_at_kill"] = writes
                ev["partial_frags"] = writes % self.during_load_frags
            ev["switch_entries_at_kill"] = cache_entries(self.switch_address)
            self.daemon.start()
            sw = self.daemon.wait_ready()
            ev["resync_s"] = time.time() - killed
            ev["resident_after"] = int(sw.get("resident_chunks", 0))
            entries = cache_entries(self.switch_address)
            ev["switch_entries"] = entries
            ev["orphans"] = max(0, entries - ev["resident_after"])
            ev["reloads"] = int(controller_metrics(self.metrics_port).get("loads", 0))
        except Exception as exc:  # noqa: BLE001 - recorded in the run's outcome, never lost
            ev["error"] = f"controller restart failed: {exc!r}"


def restart_outcome(rows: Sequence[dict[str, Any]], events: dict[str, Any]) -> dict[str, Any]:
    """A switch restart's outcome from the watcher's events and the agents' rows.

    Returns:
        The events, plus: ``hits_return_s`` (kill to the end of the first request started
        after it that was served a whole block from switch SRAM; None if none was), the
        requests in flight between the kill and then (``requests_in_outage``), their blocks
        that failed (``failed_blocks``, each recomputed, never wrong), fell back to the pool
        and their retries, and the run's blocks that arrived with a wrong byte
        (``wrong_bytes``, a stale or foreign slot served; must be 0); ``pool_return_s``: kill
        to the end of the first request started after it that the pool served a fragment of.
        For a pool node or its master (``up_s`` without ``resync_s``) the outage lasts until
        the later of the hits' return and ``up_s``.
    """
    out = dict(events)
    killed = events.get("killed_at")
    if killed is None:
        return out
    after = [r for r in rows if r["t_start"] >= killed]
    hits = [r["t_done"] for r in after if r["blocks_hit"]]
    back = min(hits) if hits else None
    out["hits_return_s"] = None if back is None else back - killed
    end = back
    if "up_s" in events and "resync_s" not in events:  # a pool node or its master: the outage
        end = max(back or killed, killed + events["up_s"])  # lasts until the pool is back
    window = [r for r in rows if r["t_done"] >= killed and (end is None or r["t_start"] <= end)]
    out["requests_in_outage"] = len(window)
    out["failed_blocks"] = sum(r["failed"] for r in window)
    out["fell_back"] = sum(r["fell_back"] for r in window)
    out["retries"] = sum(r["retries"] for r in window)
    out["wrong_bytes"] = sum(r["wrong_bytes"] for r in rows)
    served = [r["t_done"] for r in after if r["frags_pool"] and not r["failed"]]
    out["pool_return_s"] = min(served) - killed if served else None
    return out
