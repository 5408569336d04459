"""The processes and plumbing of a trace replay's cluster.

Classes:
    ControllerSettings: the controller's policy and pacing for a replay.
    ManagementNetwork: veth pairs from each node's namespace to the root namespace.
    ControllerProcess: the controller daemon as a process, restartable.
    PoolProcess: the pool node's server in its namespace, restartable.

Functions:
    read_counter: a node's interface counter.
    free_port: a free loopback TCP port.
    controller_config: the daemon's configuration for one run.
    running_controller: the daemon as a context (started, READY, stopped).
    controller_metrics: the daemon's metrics the replay records.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvcast import p4constants as c
from kvcast import procs
from kvcast.reports import ReportClient

if TYPE_CHECKING:
    from emulation.network import Cluster

CONTROLLER_ELECTION_ID = 20
MGMT_PREFIX = "10.254"
REPO = Path(__file__).resolve().parents[2]


def _sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


class ManagementNetwork:
    """A veth pair from each named node's namespace to the root namespace.

    Node ``i`` (in the order given) gets ``10.254.(i+1).2/24`` on ``mgmt0`` inside its namespace,
    and the root namespace ``10.254.(i+1).1/24`` on ``kvm-<node>``. Control traffic (reports,
    the controller's chunk reads) uses it, so the emulated data plane carries only KVP.

    Args:
        cluster: the running cluster.
        nodes: node names (hosts and pool nodes).
    """

    def __init__(self, cluster: Cluster, nodes: Sequence[str]) -> None:
        self._cluster = cluster
        self.root_ip: dict[str, str] = {}
        self.node_ip: dict[str, str] = {}
        self._links: list[str] = []
        for i, name in enumerate(nodes, start=1):
            if i > 250:
                raise ValueError("at most 250 nodes on the management network")
            self.root_ip[name] = f"{MGMT_PREFIX}.{i}.1"
            self.node_ip[name] = f"{MGMT_PREFIX}.{i}.2"

    def __enter__(self) -> ManagementNetwork:
        try:
            for name in self.root_ip:
                link = f"kvm-{name}"[:15]
                subprocess.run(["ip", "link", "del", link], capture_output=True)
                node = self._cluster.host(name)
                _sh("ip", "link", "add", link, "type", "veth", "peer", "name", "mgmt0",
                    "netns", str(node.pid))  # fmt: skip
                self._links.append(link)
                _sh("ip", "addr", "add", f"{self.root_ip[name]}/24", "dev", link)
                _sh("ip", "link", "set", link, "up")
                node.cmd(f"ip addr add {self.node_ip[name]}/24 dev mgmt0 && ip link set mgmt0 up")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for link in self._links:
            subprocess.run(["ip", "link", "del", link], capture_output=True)
        self._links.clear()


def read_counter(cluster: Cluster, node: str, intf: str, which: str = "tx_bytes") -> int:
    """Interface ``intf``'s counter ``which`` (``/sys/class/net/.../statistics``) on ``node``."""
    out = cluster.host(node).cmd(f"cat /sys/class/net/{intf}/statistics/{which}")
    return int(out.strip() or 0)


def free_port() -> int:
    """A TCP port free on the loopback now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class ControllerSettings:
    """The controller's policy and pacing for a replay (:func:`controller_config`'s knobs).

    Attributes:
        policy: policy name.
        policy_params: its parameters.
        min_accesses: reports of a chunk before the policy hears of it, or ``"auto"``.
        tick_s: tick period.
        max_loads_per_tick: admissions applied per tick.
        sram_budget_bytes: SRAM budget, or None for all of it.
    """

    policy: str = "kvcast"
    policy_params: dict[str, Any] = field(default_factory=dict)
    min_accesses: int | str = "auto"
    tick_s: float = 0.5
    max_loads_per_tick: int = 64
    sram_budget_bytes: int | None = None


def controller_config(
    cluster: Cluster,
    mgmt: ManagementNetwork,
    *,
    cache_on: bool,
    report_port: int,
    metrics_port: int,
    policy: str,
    tick_s: float,
    max_loads_per_tick: int,
    sram_budget_bytes: int | None,
    policy_params: dict[str, Any] | None = None,
    min_accesses: int | str = "auto",
) -> dict[str, Any]:
    """The daemon's configuration for one run (a mapping to dump as YAML).

    Args:
        cluster: the running cluster.
        mgmt: its management network.
        cache_on: apply decisions (False: dry run, the policy admits nothing).
        report_port: report API port (bound on every address: hosts reach it over mgmt).
        metrics_port: metrics port (loopback).
        policy: policy name.
        tick_s: tick period.
        max_loads_per_tick: admissions applied per tick.
        sram_budget_bytes: SRAM budget, or None for all of it.
        policy_params: the policy's parameters.
        min_accesses: reports of a chunk before the policy hears of it, or ``"auto"``.

    Returns:
        The configuration.
    """
    from emulation.targets import BMV2_JSON_PATH
    from emulation.topo import SWITCH_MAC

    switch = cluster.switch
    assert switch.process is not None
    sw: dict[str, Any] = {
        "name": "s1",
        "address": switch.process.address,
        "election_id": CONTROLLER_ELECTION_ID,
        "router_mac": SWITCH_MAC,
    }
    if switch.kind == "bmv2":
        sw["device_config"] = str(BMV2_JSON_PATH)
    tenants = cluster.spec.tenants
    doc: dict[str, Any] = {
        "switches": [sw],
        "pools": [
            {
                "name": p.name,
                "ip": p.ip,
                "mac": p.mac,
                "port": p.port,
                "fetch_address": f"{mgmt.node_ip[p.name]}:{c.KVP_UDP_PORT}",
            }
            for p in cluster.pools()
        ],
        "hosts": [
            {
                "name": h.name,
                "id": h.port,
                "ip": h.ip,
                "mac": h.mac,
                "port": h.port,
                # The cluster's binding: the controller needs it named ("any" is explicit).
                "tenants": "any" if tenants is None else list(tenants),
            }
            for h in cluster.hosts()
        ],
        "policy": {
            "name": policy,
            "params": dict(policy_params or {}),
            "dry_run": not cache_on,
            "min_accesses": min_accesses,
        },
        "tick_s": tick_s,
        "sketch": {"window_s": max(5.0, 10 * tick_s)},
        "metrics": {"listen": f"127.0.0.1:{metrics_port}"},
        "report_api": {"listen": f"0.0.0.0:{report_port}"},
        "max_loads_per_tick": max_loads_per_tick,
        "log_level": "INFO",
    }
    if sram_budget_bytes is not None:
        doc["sram_budget_bytes"] = sram_budget_bytes
    return doc


class ControllerProcess:
    """The controller daemon as a process (``python -m controlplane run``), restartable.

    Args:
        config: the daemon's configuration (a mapping, dumped as YAML).
        workdir: where its config and log go.
        report_port: its report API port (the status is read there).
    """

    def __init__(self, config: dict[str, Any], workdir: Path, report_port: int) -> None:
        import yaml

        self.config_path = workdir / "controller.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.log_path = workdir / "controller.log"
        self.status = ReportClient(f"http://127.0.0.1:{report_port}", timeout_s=1.0)
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        """Starts the daemon (its log is appended to)."""
        with self.log_path.open("a") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "controlplane", "run", "--config", str(self.config_path)],
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.starts += 1

    def wait_ready(self, timeout: float = 60.0, after_generation: int = 0) -> dict[str, Any]:
        """Waits until the daemon reports switch s1 READY (in a session past the given one).

        The status's figures are those of the daemon's last tick, its state is live: a tick
        that ends while a session re-installs reports the new generation with what was resident
        before that session's adoption. So the wait is for a status taken after the session's
        re-install (``synced_generation``), whose figures count what it adopted or reloaded.

        Returns:
            The switch's status.

        Raises:
            RuntimeError: the daemon exited or was not ready in time (its log's tail).
        """
        deadline = time.monotonic() + timeout
        while True:
            code, doc = self.status.status()
            sw = doc.get("switches", {}).get("s1", {}) if code == 200 else {}
            synced = int(sw.get("synced_generation", 0))
            if sw.get("state") == "ready" and synced > after_generation:
                return dict(sw)
            if self.proc is None or self.proc.poll() is not None or time.monotonic() > deadline:
                tail = self.log_path.read_text(errors="replace")[-2000:]
                exit_code = self.proc.poll() if self.proc else None
                raise RuntimeError(
                    f"controller not ready (exit {exit_code}, state {sw.get('state')}); its "
                    f"log ends:\n{tail}"
                )
            time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL: a crash (nothing flushed, no goodbye to the switch)."""
        procs.kill(self.proc)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 30 s."""
        procs.stop(self.proc, 30)


@contextlib.contextmanager
def running_controller(
    config: dict[str, Any], workdir: Path, report_port: int
) -> Iterator[ControllerProcess]:
    """Runs the daemon as a process; yields it once its switch is READY."""
    daemon = ControllerProcess(config, workdir, report_port)
    daemon.start()
    try:
        daemon.wait_ready()
        yield daemon
    finally:
        daemon.stop()


def controller_metrics(port: int) -> dict[str, float]:
    """The daemon's loads, evictions, decisions, reports, skips and write errors (``/metrics``)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            name = s.name.removeprefix("kvcast_controller_")
            if name == "loads_total":
                out["loads"] = s.value
            elif name == "load_bytes_total":
                out["load_bytes"] = s.value
            elif name == "evictions_total":
                out[f"evictions_{s.labels['action']}"] = s.value
            elif name == "decisions_total":
                out[f"decisions_{s.labels['kind']}"] = s.value
            elif name == "reports_received_total":
                out["reports"] = s.value
            elif name == "load_skipped_total":
                out[f"skipped_{s.labels['reason']}"] = s.value
            elif name == "write_errors_total":
                out["write_errors"] = s.value
    return out


class PoolProcess:
    """The pool node's server in its namespace, restartable (it preloads its blocks each start).

    Args:
        cluster: the running cluster.
        node: the pool node's name.
        cmd: its command (``python -m poolnode ...``).
    """

    def __init__(self, cluster: Cluster, node: str, cmd: list[str]) -> None:
        self.cluster, self.node, self.cmd = cluster, node, cmd
        self.proc: subprocess.Popen[str] | None = None
        self.master_pid: int | None = None
        """The pid of the ``mooncake_master`` the node started (``poolnode master pid=``)."""
        self.master_restarts: queue.Queue[tuple[float, str]] = queue.Queue()
        """(time seen, line) of each ``poolnode master restarted`` line."""

    def start(self, timeout: float = 120.0) -> None:
        """Starts it and waits for ``poolnode listening``; its later lines are watched."""
        self.master_pid = None
        self.proc = self.cluster.host(self.node).popen(
            self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=str(REPO)
        )
        proc = self.proc
        assert proc.stdout is not None
        deadline = time.monotonic() + timeout
        seen: list[str] = []
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError(f"pool node exited before listening: {''.join(seen[-5:])}")
            seen.append(line)
            if line.startswith("poolnode listening"):
                break
        else:
            raise RuntimeError(f"pool node not listening within {timeout} s")
        threading.Thread(target=self._watch, args=(proc,), daemon=True).start()

    def _watch(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in iter(proc.stdout.readline, ""):
            if line.startswith("poolnode master pid="):
                self.master_pid = int(line.split("=", 1)[1].split()[0])
            elif line.startswith("poolnode master restarted"):
                self.master_restarts.put((time.time(), line.strip()))

    def kill(self) -> None:
        """SIGKILL: a crash."""
        procs.kill(self.proc)

    def close(self) -> None:
        """Stops it (SIGTERM, then SIGKILL after 5 s)."""
        procs.stop(self.proc, 5)
