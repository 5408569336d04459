"""Trace replay: the Mooncake conversation trace on the emulated cluster, switch cache on vs off.

The first ``--max-requests`` requests of ``conversation_trace.jsonl`` (from ``--start``) are
replayed onto an emulated cluster (:class:`emulation.network.Cluster`: one switch, BMv2 where
installed or the reference target, ``--hosts`` GPU hosts, one DRAM pool node) twice:

* ``cache-off``: the controller runs its policy in dry-run mode: it takes the same reports and
  decides, but never writes the switch cache (the policy admitting nothing), so every block
  comes from the pool;
* ``cache-on``: the controller applies its decisions: chunks it picks are loaded into switch
  SRAM, and hosts' GETs hit there.

How the replay maps the trace:

* **Blocks.** Each trace ``hash_id`` (a 512-token block) becomes a 64-bit key (BLAKE2b of the
  id) of ``--block-bytes`` synthetic bytes (``kvcast.synthetic``; 2 KiB by default: the
  2 MiB of BMv2 fragment SRAM, ``NUM_FRAG_SLOTS * FRAG_BYTES``, then holds 1,024 blocks, where
  real 512-token blocks of an 8B model are 64 MiB). The pool node preloads every block of the
  slice (as if each request's prefill had stored its blocks).
* **Hosts.** The trace names none; each request goes to a host drawn uniformly at random
  (``--seed``), a load balancer that is not prefix-aware, as in the policy evaluation
  (``experiments.policies.workloads.load_mooncake_trace``).
* **What a host fetches.** A request's leading blocks that an earlier request of the slice
  already used are its reusable prefix: the host's agent fetches them (switch first, the pool
  behind it on a miss, the pool directly as the last resort), checking every fragment's CRC and
  the whole block against its synthetic bytes. The blocks from the first never-seen one on are
  computed by prefill, not fetched. The agent reports every block of the request to the
  controller (``POST /v1/reports``: fetched ones with ``hit`` = all fragments came from switch
  SRAM, computed ones with ``hit`` null), with parent and position.
* **Time.** Request ``i`` is dispatched at ``t0 + (ts_i - ts_first) / speedup``; each host's
  agent serves its requests in order (a busy host queues them).

The controller is the real daemon (``python -m controlplane run``), a process in the root
namespace talking P4Runtime to the switch with election id 20, above the Cluster's own client
(10), so it becomes primary; it pushes its pipeline and installs routes, pool owners and replica
destinations itself. Agents and the controller talk over a management network: one veth pair
per node between its namespace and the root namespace (10.254.N.0/24), outside the emulated data
plane; the controller also reads chunk bytes from the pool node over it (NOCACHE GETs).

Measured per run: the pool node's data-plane egress bytes (its interface counter), its
management egress (the controller's chunk loads), per-request fetch time, blocks and fragments
served by the switch, and the controller's loads and evictions. Written: ``requests.csv``,
``summary.csv`` and ``trace_replay.png`` under ``--out``, and ``result trace_replay ...`` lines.

Run: ``python -m experiments.trace_replay`` (root; Mininet). ``--help`` lists the parameters.
``python -m experiments.trace_replay agent ...`` is the per-host agent the replay starts.

Classes:
    ReplayRequest: one request as replayed (host, blocks fetched, blocks computed).
    RunResult: one run's per-request rows, pool counters and controller metrics.
    ManagementNetwork: veth pairs from each node's namespace to the root namespace.

Functions:
    block_key: the chunk key of a trace block.
    plan_requests: a slice of a trace as replay requests.
    run_replay: one run (cache on or off) on a running cluster.
    run_experiment: both runs on one cluster.
    write_outputs: CSVs and the plot.
    agent_main: the per-host agent.
    main: command line.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import hashlib
import json
import os
import queue
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from controlplane.reports import AccessReport, ReportClient
from experiments.output import pyplot, write_csv
from kvcast import p4constants as c
from kvcast.kvp import DEFAULT_MTU

if TYPE_CHECKING:
    from emulation.network import Cluster
    from emulation.switches import P4Switch

TENANT = 9
SEED = 20261123
RESULTS = Path("results/trace_replay")
CONTROLLER_ELECTION_ID = 20
MGMT_PREFIX = "10.254"
REPORT_PORT = 9109
METRICS_PORT = 9108
DEFAULT_BLOCK_BYTES = 2048
REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------ planning
def block_key(hash_id: int) -> int:
    """The 64-bit chunk key of trace block ``hash_id`` (BLAKE2b-64, spread over pool buckets)."""
    digest = hashlib.blake2b(f"kvcast-trace/{hash_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


@dataclass(frozen=True)
class ReplayRequest:
    """One request as replayed.

    Attributes:
        index: position in the replayed slice (0 first).
        time: arrival time in the trace, seconds.
        host: index of the GPU host serving it (0-based).
        fetch: keys of its reusable prefix, fetched by the host's agent.
        computed: keys of the rest, computed by prefill (reported, not fetched).
    """

    index: int
    time: float
    host: int
    fetch: tuple[int, ...]
    computed: tuple[int, ...]


def plan_requests(
    path: Path, *, max_requests: int, start: int = 0, hosts: int = 8, seed: int = 0
) -> list[ReplayRequest]:
    """Reads a slice of a Mooncake-format trace as replay requests.

    Hosts are assigned uniformly at random with ``seed`` over the whole file prefix read (so a
    slice's hosts do not depend on where it starts). A request fetches its leading blocks that
    an earlier request of the slice used; the rest are computed.

    Args:
        path: the ``.jsonl`` trace.
        max_requests: requests in the slice.
        start: index of the first request of the slice.
        hosts: GPU hosts to spread requests over.
        seed: seed of the host assignment.

    Returns:
        The requests, in arrival order.

    Raises:
        ValueError: a bad slice or host count.
        TraceFormatError: a malformed trace line.
        OSError: the trace cannot be read.
    """
    from experiments.policies.workloads import load_mooncake_trace

    if max_requests < 1 or start < 0 or hosts < 1:
        raise ValueError(f"need max_requests >= 1, start >= 0, hosts >= 1; got {max_requests}, "
                         f"{start}, {hosts}")  # fmt: skip
    workload = load_mooncake_trace(path, hosts=hosts, seed=seed, limit=start + max_requests)
    seen: set[int] = set()
    out: list[ReplayRequest] = []
    for i, req in enumerate(workload.requests[start:]):
        keys = [block_key(h) for h in req.blocks]
        n = 0
        while n < len(keys) and keys[n] in seen:
            n += 1
        out.append(ReplayRequest(i, req.time, req.host, tuple(keys[:n]), tuple(keys[n:])))
        seen.update(keys)
    return out


def distinct_blocks(requests: Sequence[ReplayRequest]) -> list[int]:
    """Every key of the slice, once, in first-use order."""
    return list(dict.fromkeys(k for r in requests for k in (*r.fetch, *r.computed)))


# ------------------------------------------------------------------------------ agent
def agent_main(argv: Sequence[str]) -> int:
    """The per-host agent: one JSON request per stdin line, one JSON result per stdout line.

    Each input line is ``{"req": i, "at": epoch, "fetch": [hex keys], "computed": [hex]}``.
    The agent fetches the ``fetch`` blocks in order (switch first, the pool behind it, then the
    pool directly), verifies each against its synthetic bytes, reports every block to the
    controller and prints ``{"req", "host", "ok", "fetch_s", "blocks", ...}``. It prints
    ``agent ready`` on stderr once its socket is bound, and exits at end of input.

    Args:
        argv: the agent's arguments (see ``--help``).

    Returns:
        0 at end of input; 2 when it could not start.
    """
    ap = argparse.ArgumentParser(prog="python -m experiments.trace_replay agent")
    ap.add_argument("--name", required=True, help="host name (as configured in the controller)")
    ap.add_argument("--service", required=True, help="switch VIP")
    ap.add_argument("--pool", required=True, help="pool node data-plane address (last resort)")
    ap.add_argument("--report-url", required=True, help="controller report API base URL")
    ap.add_argument("--tenant", type=int, default=TENANT)
    ap.add_argument("--block-bytes", type=int, default=DEFAULT_BLOCK_BYTES)
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--get-timeout", type=float, default=0.2)
    ap.add_argument("--max-get-timeout", type=float, default=1.0)
    ap.add_argument("--deadline", type=float, default=30.0)
    ap.add_argument("--mtu", type=int, default=DEFAULT_MTU, help="IP MTU of the host's link")
    args = ap.parse_args(argv)

    import torch

    from hostagent.fetch import FetchClient
    from kvcast.synthetic import synthetic_chunk

    try:
        client = FetchClient(
            (args.service, c.KVP_UDP_PORT),
            (args.pool, c.KVP_UDP_PORT),
            timeout_s=args.get_timeout,
            max_timeout_s=max(args.get_timeout, args.max_get_timeout),
            max_retries=3,
            deadline_s=args.deadline,
            mtu=args.mtu,
        )
    except (OSError, ValueError) as exc:
        print(f"agent {args.name}: cannot start: {exc}", file=sys.stderr, flush=True)
        return 2
    reporter = ReportClient(args.report_url, timeout_s=5.0)
    dst = torch.empty(args.block_bytes, dtype=torch.uint8)
    frag_count = -(-args.block_bytes // c.FRAG_BYTES)
    print(f"agent ready {args.name}", file=sys.stderr, flush=True)
    with client:
        for line in sys.stdin:
            if not line.strip():
                continue
            job = json.loads(line)
            fetch = [int(k, 16) for k in job["fetch"]]
            computed = [int(k, 16) for k in job["computed"]]
            time.sleep(max(0.0, float(job["at"]) - time.time()))
            t_start = time.time()
            reports: list[AccessReport] = []
            row: dict[str, Any] = {
                "req": job["req"],
                "host": args.name,
                "at": job["at"],
                "t_start": t_start,
                "fetched": len(fetch),
                "computed": len(computed),
                "blocks_hit": 0,
                "frags_hit": 0,
                "frags_pool": 0,
                "failed": 0,
                "wrong_bytes": 0,
                "retries": 0,
                "fell_back": 0,
            }
            parent: int | None = None
            for pos, key in enumerate(fetch):
                report = client.fetch(args.tenant, key, dst, args.block_bytes)
                hit = report.ok and report.frags_hit == frag_count
                row["blocks_hit"] += int(hit)
                row["frags_hit"] += report.frags_hit
                row["frags_pool"] += report.frags_pool
                row["retries"] += report.retries
                row["fell_back"] += int(report.fell_back)
                if not report.ok:
                    row["failed"] += 1
                elif dst.numpy().tobytes() != synthetic_chunk(
                    args.tenant, key, args.block_bytes, args.seed
                ):
                    row["wrong_bytes"] += 1
                reports.append(
                    AccessReport(
                        args.tenant, key, args.block_bytes, args.name, time.time(), hit, parent, pos
                    )
                )
                parent = key
            t_done = time.time()
            for pos, key in enumerate(computed, start=len(fetch)):
                reports.append(
                    AccessReport(
                        args.tenant, key, args.block_bytes, args.name, t_done, None, parent, pos
                    )
                )
                parent = key
            code, answer = reporter.post(reports)
            row.update(
                t_done=t_done,
                fetch_s=t_done - t_start,
                queued_s=max(0.0, t_start - float(job["at"])),
                ok=row["failed"] == 0 and row["wrong_bytes"] == 0,
                report_code=code,
                report_error=answer.get("error", ""),
            )
            print(json.dumps(row), flush=True)
    return 0


# ------------------------------------------------------------------------------ management net
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


# ------------------------------------------------------------------------------ one run
@dataclass
class RunResult:
    """One replay run.

    Attributes:
        name: ``cache-on`` or ``cache-off``.
        rows: one row per request (the agent's JSON plus the request's index and host).
        pool_tx_bytes: the pool node's data-plane egress during the run (interface counter).
        pool_mgmt_tx_bytes: its management egress (the controller reading chunks to load).
        controller: the controller's metrics at the end (``kvcast_controller_*`` samples).
        wall_s: seconds from the first dispatch to the last result.
        missing: requests whose agent gave no result.
        restart: what a switch restart in the middle of the run did (empty: none), see
            :func:`restart_outcome`.
    """

    name: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    pool_tx_bytes: int = 0
    pool_mgmt_tx_bytes: int = 0
    controller: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0
    missing: int = 0
    restart: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """The run's summary row."""
        rows = self.rows
        fetched = sum(r["fetched"] for r in rows)
        frags_hit = sum(r["frags_hit"] for r in rows)
        frags = frags_hit + sum(r["frags_pool"] for r in rows)
        times = sorted(r["fetch_s"] for r in rows if r["fetched"])
        m = self.controller

        def q(p: float) -> float:
            return times[min(len(times) - 1, int(round(p * (len(times) - 1))))] if times else 0.0

        return {
            "run": self.name,
            "requests": len(rows),
            "missing": self.missing,
            "requests_ok": sum(1 for r in rows if r["ok"]),
            "blocks_fetched": fetched,
            "blocks_computed": sum(r["computed"] for r in rows),
            "blocks_hit": sum(r["blocks_hit"] for r in rows),
            "frag_hit_ratio": round(frags_hit / frags, 4) if frags else 0.0,
            "failed_blocks": sum(r["failed"] for r in rows),
            "wrong_bytes": sum(r["wrong_bytes"] for r in rows),
            "retries": sum(r["retries"] for r in rows),
            "pool_tx_bytes": self.pool_tx_bytes,
            "pool_mgmt_tx_bytes": self.pool_mgmt_tx_bytes,
            "fetch_s_total": round(sum(times), 4),
            "fetch_s_mean": round(statistics.fmean(times), 5) if times else 0.0,
            "fetch_s_p50": round(q(0.5), 5),
            "fetch_s_p99": round(q(0.99), 5),
            "queued_s_mean": round(statistics.fmean(r["queued_s"] for r in rows), 5)
            if rows
            else 0.0,
            "loads": int(m.get("loads", 0)),
            "load_bytes": int(m.get("load_bytes", 0)),
            "evictions_drop": int(m.get("evictions_drop", 0)),
            "evictions_demote": int(m.get("evictions_demote", 0)),
            "decided_admit": int(m.get("decisions_admit", 0)),
            "loads_skipped": int(sum(v for k, v in m.items() if k.startswith("skipped_"))),
            "write_errors": int(m.get("write_errors", 0)),
            "reports": int(m.get("reports", 0)),
            "wall_s": round(self.wall_s, 2),
            **{
                f"restart_{k}": round(v, 3) if isinstance(v, float) else v
                for k, v in self.restart.items()
                if k != "killed_at"
            },
        }


def _read_counter(cluster: Cluster, node: str, intf: str, which: str = "tx_bytes") -> int:
    out = cluster.host(node).cmd(f"cat /sys/class/net/{intf}/statistics/{which}")
    return int(out.strip() or 0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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

        Returns:
            The switch's status.

        Raises:
            RuntimeError: the daemon exited or was not ready in time (its log's tail).
        """
        deadline = time.monotonic() + timeout
        while True:
            code, doc = self.status.status()
            sw = doc.get("switches", {}).get("s1", {}) if code == 200 else {}
            if sw.get("state") == "ready" and int(sw.get("generation", 0)) > after_generation:
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
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 30 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@contextlib.contextmanager
def _controller(
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


def _metrics(port: int) -> dict[str, float]:
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


def _read_lines(
    stream: Any,
    sink: queue.Queue[tuple[str, str]],
    tag: str,
    tail: collections.deque[str] | None = None,
) -> None:
    for line in iter(stream.readline, ""):
        sink.put((tag, line))
        if tail is not None:
            tail.append(line)
    sink.put((tag, ""))


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
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        """Stops it (SIGTERM, then SIGKILL)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


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
        frags = self.during_load_frags
        assert frags is not None
        deadline = time.monotonic() + self.load_wait_s
        while time.monotonic() < deadline:
            if sram_writes(self.switch_address) % frags:
                return True
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
            ev["reloads"] = int(_metrics(self.metrics_port).get("loads", 0))
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


def run_replay(
    cluster: Cluster,
    mgmt: ManagementNetwork,
    requests: Sequence[ReplayRequest],
    *,
    cache_on: bool,
    speedup: float,
    block_bytes: int,
    policy: str = "kvcast",
    policy_params: dict[str, Any] | None = None,
    min_accesses: int | str = "auto",
    tick_s: float = 0.5,
    max_loads_per_tick: int = 64,
    sram_budget_bytes: int | None = None,
    workdir: Path,
    progress: Callable[[str], None] = print,
    restart_switch_after_s: float | None = None,
    restart_controller_after_s: float | None = None,
    pool_node: PoolProcess | None = None,
    restart_pool_after_s: float | None = None,
    restart_master_after_s: float | None = None,
    kill_controller_during_load: bool = False,
) -> RunResult:
    """One replay run on a running cluster whose pool node holds every block.

    Args:
        cluster: the running cluster.
        mgmt: its management network (every host and pool node on it).
        requests: the planned requests.
        cache_on: whether the controller applies its decisions.
        speedup: trace time over replay time.
        block_bytes: bytes per block.
        policy: controller policy name.
        policy_params: its parameters.
        min_accesses: reports of a chunk before the policy hears of it, or ``"auto"``.
        tick_s: controller tick period.
        max_loads_per_tick: controller admissions per tick.
        sram_budget_bytes: SRAM budget (None: all of it).
        workdir: where the controller's config and log go.
        progress: where progress lines go.
        restart_switch_after_s: kill and restart the switch this long after the first
            dispatch (:class:`SwitchRestart`); None: no restart.
        restart_controller_after_s: kill and restart the controller daemon this long after
            the first dispatch (:class:`ControllerRestart`); None: no restart.
        pool_node: the pool node's process (needed to restart it).
        restart_pool_after_s: kill and restart the pool node this long after the first
            dispatch (:class:`PoolRestart`); None: no restart.
        restart_master_after_s: kill the pool node's ``mooncake_master`` this long after the
            first dispatch (:class:`MasterRestart`; the node must run Mooncake); None: no
            restart.
        kill_controller_during_load: with ``restart_controller_after_s``, kill the daemon at
            the first moment after it that a block is half written into SRAM.

    Returns:
        The run's result.
    """
    from emulation.topo import SERVICE_IP

    name = "cache-on" if cache_on else "cache-off"
    result = RunResult(name)
    report_port, metrics_port = _free_port(), _free_port()
    run_dir = workdir / name
    run_dir.mkdir(parents=True, exist_ok=True)
    config = controller_config(
        cluster,
        mgmt,
        cache_on=cache_on,
        report_port=report_port,
        metrics_port=metrics_port,
        policy=policy,
        tick_s=tick_s,
        max_loads_per_tick=max_loads_per_tick,
        sram_budget_bytes=sram_budget_bytes,
        policy_params=policy_params,
        min_accesses=min_accesses,
    )
    pool = cluster.pools()[0]
    hosts = cluster.hosts()
    lines: queue.Queue[tuple[str, str]] = queue.Queue()
    with _controller(config, run_dir, report_port) as daemon, contextlib.ExitStack() as stack:
        agents: dict[str, subprocess.Popen[str]] = {}
        err_tails: dict[str, collections.deque[str]] = {}
        for h in hosts:
            cmd = [
                sys.executable, "-m", "experiments.trace_replay", "agent",
                "--name", h.name, "--service", SERVICE_IP, "--pool", pool.ip,
                "--report-url", f"http://{mgmt.root_ip[h.name]}:{report_port}",
                "--block-bytes", str(block_bytes), "--mtu", str(cluster.spec.mtu),
            ]  # fmt: skip
            proc = stack.enter_context(
                cluster.popen(
                    h.name,
                    cmd,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    cwd=str(REPO),
                )
            )
            agents[h.name] = proc
            err_tails[h.name] = collections.deque(maxlen=20)
            for tag, stream in (("out", proc.stdout), ("err", proc.stderr)):
                tail = err_tails[h.name] if tag == "err" else None
                threading.Thread(
                    target=_read_lines,
                    args=(stream, lines, f"{h.name}:{tag}", tail),
                    daemon=True,
                ).start()
        ready: set[str] = set()
        deadline = time.monotonic() + 120
        while len(ready) < len(agents):
            try:
                tag, line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise RuntimeError(f"agents not ready: {sorted(set(agents) - ready)}") from None
            host, kind = tag.split(":")
            if kind == "err" and line.startswith("agent ready"):
                ready.add(host)
            elif kind == "err" and (not line or "cannot start" in line):
                raise RuntimeError(f"agent {host} failed to start: {line.strip()}")
        tx0 = _read_counter(cluster, pool.name, cluster.host(pool.name).defaultIntf().name)
        mg0 = _read_counter(cluster, pool.name, "mgmt0")
        t0 = time.time() + 1.0
        first = requests[0].time if requests else 0.0
        progress(f"  {name}: {len(requests)} requests over {len(hosts)} hosts")
        restart: SwitchRestart | ControllerRestart | PoolRestart | MasterRestart | None = None
        if restart_switch_after_s is not None:
            restart = SwitchRestart(cluster, daemon.status)
            restart.start(t0 + restart_switch_after_s)
        elif restart_controller_after_s is not None:
            address = cluster.switch.process.address if cluster.switch.process else ""
            frags = -(-block_bytes // c.FRAG_BYTES) if kill_controller_during_load else None
            restart = ControllerRestart(daemon, address, metrics_port, during_load_frags=frags)
            restart.start(t0 + restart_controller_after_s)
        elif restart_pool_after_s is not None:
            if pool_node is None:
                raise ValueError("restart_pool_after_s needs the pool node's process")
            restart = PoolRestart(pool_node)
            restart.start(t0 + restart_pool_after_s)
        elif restart_master_after_s is not None:
            if pool_node is None:
                raise ValueError("restart_master_after_s needs the pool node's process")
            restart = MasterRestart(pool_node)
            restart.start(t0 + restart_master_after_s)
        for req in requests:
            at = t0 + (req.time - first) / speedup
            time.sleep(max(0.0, at - time.time() - 0.05))
            job = {
                "req": req.index,
                "at": at,
                "fetch": [f"{k:#x}" for k in req.fetch],
                "computed": [f"{k:#x}" for k in req.computed],
            }
            agent = hosts[req.host].name
            stdin = agents[agent].stdin
            assert stdin is not None
            try:
                stdin.write(json.dumps(job) + "\n")
                stdin.flush()
            except BrokenPipeError:
                time.sleep(0.2)  # its last words reach the tail
                said = "".join(err_tails[agent]).strip()[-2000:]
                raise RuntimeError(f"agent {agent} exited in the run: {said}") from None
        for proc in agents.values():
            assert proc.stdin is not None
            proc.stdin.close()
        by_index = {r.index: r for r in requests}
        open_streams = len(agents)
        done = 0
        deadline = time.monotonic() + 600
        last = time.time()
        while open_streams and time.monotonic() < deadline:
            try:
                tag, line = lines.get(timeout=5)
            except queue.Empty:
                continue
            host, kind = tag.split(":")
            if kind != "out":
                continue
            if not line:
                open_streams -= 1
                continue
            if not line.startswith("{"):
                continue
            row = json.loads(line)
            req = by_index[row["req"]]
            row["index"] = req.index
            row["trace_time"] = req.time
            result.rows.append(row)
            last = max(last, row["t_done"])
            done += 1
            if done % 100 == 0:
                progress(f"  {name}: {done}/{len(requests)} done")
        result.wall_s = last - t0
        if restart is not None:
            result.restart = restart.join(timeout=90)
            progress(f"  {name}: restart {result.restart}")
        time.sleep(2 * tick_s)  # the last reports reach a tick
        result.pool_tx_bytes = (
            _read_counter(cluster, pool.name, cluster.host(pool.name).defaultIntf().name) - tx0
        )
        result.pool_mgmt_tx_bytes = _read_counter(cluster, pool.name, "mgmt0") - mg0
        result.controller = _metrics(metrics_port)
    result.rows.sort(key=lambda r: r["index"])
    result.missing = len(requests) - len(result.rows)
    if result.restart:
        result.restart = restart_outcome(result.rows, result.restart)
    return result


def run_experiment(
    requests: Sequence[ReplayRequest],
    *,
    switch_cls: type[P4Switch] | None = None,
    hosts: int,
    block_bytes: int,
    speedup: float,
    pool_mbit: float | None = 2.0,
    host_mbit: float | None = 20.0,
    policy: str = "kvcast",
    policy_params: dict[str, Any] | None = None,
    min_accesses: int | str = "auto",
    tick_s: float = 0.5,
    max_loads_per_tick: int = 64,
    sram_budget_bytes: int | None = None,
    runs: Sequence[str] = ("cache-off", "cache-on"),
    progress: Callable[[str], None] = print,
    restart_switch_after_s: float | None = None,
    restart_controller_after_s: float | None = None,
    restart_pool_after_s: float | None = None,
    restart_master_after_s: float | None = None,
    pool_backend: str = "memory",
    kill_controller_during_load: bool = False,
) -> dict[str, RunResult]:
    """Both runs on one emulated cluster (cache off first: it leaves the switch cache empty).

    Args:
        requests: the planned requests.
        switch_cls: switch node class (default: BMv2 where installed, else the reference).
        hosts: GPU hosts.
        block_bytes: bytes per block.
        speedup: trace time over replay time.
        pool_mbit: pool link rate (None: unshaped).
        host_mbit: host link rate (None: unshaped).
        policy: controller policy.
        policy_params: its parameters.
        min_accesses: reports of a chunk before the policy hears of it, or ``"auto"``.
        tick_s: controller tick period.
        max_loads_per_tick: controller admissions per tick.
        sram_budget_bytes: SRAM budget (None: all).
        runs: which runs, in order.
        progress: where progress lines go.
        restart_switch_after_s: in the cache-on run, kill and restart the switch this long
            after its first dispatch (None: never).
        restart_controller_after_s: the same for the controller daemon.
        restart_pool_after_s: the same for the pool node.
        restart_master_after_s: the same for the pool node's ``mooncake_master``.
        pool_backend: the pool node's store: ``memory``, or ``mooncake`` (Mooncake Store, its
            master started and supervised by the node; read per GET, no chunk cache).
        kill_controller_during_load: the controller restart kills the daemon in the middle of
            a load (:class:`ControllerRestart`).

    Returns:
        The results by run name.

    Raises:
        ValueError: a block larger than the switch SRAM.
    """
    from emulation.network import Cluster
    from emulation.topo import ClusterSpec, LinkSpec

    if block_bytes > c.NUM_FRAG_SLOTS * c.FRAG_BYTES:
        raise ValueError(f"a block must fit switch SRAM ({c.NUM_FRAG_SLOTS * c.FRAG_BYTES} B)")
    spec = ClusterSpec(
        n_hosts=hosts,
        n_pools=1,
        host_link=LinkSpec(bw_mbit=host_mbit),
        pool_link=LinkSpec(bw_mbit=pool_mbit),
        tenants=(TENANT,),
    )
    blocks = distinct_blocks(requests)
    results: dict[str, RunResult] = {}
    with (
        tempfile.TemporaryDirectory(prefix="kvcast-trace-replay-") as tmp,
        Cluster(spec, switch_cls) as cluster,
    ):
        workdir = Path(tmp)
        pool = cluster.pools()[0]
        names = [h.name for h in cluster.hosts()] + [pool.name]
        if pool_backend not in ("memory", "mooncake"):
            raise ValueError(f"pool_backend must be memory or mooncake, got {pool_backend!r}")
        store = ["--start-master", "--segment-mib", "64"] if pool_backend == "mooncake" else []
        pool_cmd = [
            sys.executable, "-m", "poolnode", "--backend", pool_backend, *store,
            "--port", str(c.KVP_UDP_PORT), "--cache-mib", "0", "--mtu", str(spec.mtu),
            *[a for k in blocks for a in ("--preload", f"{TENANT}:{k:#x}:{block_bytes}:{SEED}")],
        ]  # fmt: skip
        pool_node = PoolProcess(cluster, pool.name, pool_cmd)
        with ManagementNetwork(cluster, names) as mgmt, contextlib.closing(pool_node):
            pool_node.start()
            progress(
                f"trace_replay: switch={cluster.switch_cls.kind} hosts={hosts} "
                f"requests={len(requests)} blocks={len(blocks)} block_bytes={block_bytes} "
                f"speedup={speedup} pool link {pool_mbit} Mbit/s, host links {host_mbit} Mbit/s"
            )
            for name in runs:
                results[name] = run_replay(
                    cluster,
                    mgmt,
                    requests,
                    cache_on=name == "cache-on",
                    speedup=speedup,
                    block_bytes=block_bytes,
                    policy=policy,
                    policy_params=policy_params,
                    min_accesses=min_accesses,
                    tick_s=tick_s,
                    max_loads_per_tick=max_loads_per_tick,
                    sram_budget_bytes=sram_budget_bytes,
                    workdir=workdir,
                    progress=progress,
                    restart_switch_after_s=restart_switch_after_s if name == "cache-on" else None,
                    restart_controller_after_s=(
                        restart_controller_after_s if name == "cache-on" else None
                    ),
                    pool_node=pool_node,
                    restart_pool_after_s=restart_pool_after_s if name == "cache-on" else None,
                    restart_master_after_s=(restart_master_after_s if name == "cache-on" else None),
                    kill_controller_during_load=kill_controller_during_load,
                )
    return results


def _wait_for_line(proc: subprocess.Popen[str], prefix: str, timeout: float) -> None:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    seen: list[str] = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"process exited before {prefix!r}: {''.join(seen[-5:])}")
        seen.append(line)
        if line.startswith(prefix):
            # Keep draining so the process never blocks on a full pipe.
            threading.Thread(target=lambda: proc.stdout and proc.stdout.read(), daemon=True).start()
            return
    raise RuntimeError(f"no {prefix!r} within {timeout} s")


# ------------------------------------------------------------------------------ outputs
def comparison(results: dict[str, RunResult]) -> dict[str, Any]:
    """Cache-on against cache-off: pool bytes and fetch time saved."""
    on, off = results["cache-on"].summary(), results["cache-off"].summary()
    saved = off["pool_tx_bytes"] - on["pool_tx_bytes"]
    total_on = on["pool_tx_bytes"] + on["pool_mgmt_tx_bytes"]
    return {
        "pool_tx_off": off["pool_tx_bytes"],
        "pool_tx_on": on["pool_tx_bytes"],
        "pool_tx_saved_bytes": saved,
        "pool_tx_ratio": round(on["pool_tx_bytes"] / off["pool_tx_bytes"], 4)
        if off["pool_tx_bytes"]
        else 0.0,
        "pool_tx_on_with_loads": total_on,
        "pool_total_ratio": round(total_on / off["pool_tx_bytes"], 4)
        if off["pool_tx_bytes"]
        else 0.0,
        "fetch_s_saved": round(off["fetch_s_total"] - on["fetch_s_total"], 4),
        "fetch_s_mean_off": off["fetch_s_mean"],
        "fetch_s_mean_on": on["fetch_s_mean"],
        "blocks_hit_on": on["blocks_hit"],
        "blocks_fetched": on["blocks_fetched"],
    }


def write_outputs(results: dict[str, RunResult], out: Path) -> dict[str, Path]:
    """Writes requests.csv, summary.csv and trace_replay.png into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "requests": out / "requests.csv",
        "summary": out / "summary.csv",
        "plot": out / "trace_replay.png",
    }
    write_csv(paths["requests"], [{"run": n, **row} for n, r in results.items() for row in r.rows])
    write_csv(paths["summary"], [r.summary() for r in results.values()])
    _plot(results, paths["plot"])
    return paths


def _plot(results: dict[str, RunResult], path: Path) -> None:
    plt = pyplot()
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(16, 4.4))
    for name, r in results.items():
        xs = [row["index"] for row in r.rows]
        per_frag = r.pool_tx_bytes / max(1, sum(row["frags_pool"] for row in r.rows))
        acc, ys = 0.0, []
        for row in r.rows:
            acc += row["frags_pool"] * per_frag / 1e6
            ys.append(acc)
        ax1.plot(xs, ys, label=f"{name} ({r.pool_tx_bytes / 1e6:.2f} MB)")
        times = sorted(row["fetch_s"] * 1e3 for row in r.rows if row["fetched"])
        if times:
            ax2.plot(times, [(i + 1) / len(times) for i in range(len(times))], label=name)
    names = list(results)
    data = [results[n].pool_tx_bytes / 1e6 for n in names]
    loads = [results[n].pool_mgmt_tx_bytes / 1e6 for n in names]
    ax3.bar(names, data, label="to hosts (data plane)")
    ax3.bar(names, loads, bottom=data, label="to the controller (SRAM loads)")
    ax1.set(
        xlabel="request",
        ylabel="pool egress to hosts (MB, cumulative)",
        title="pool egress to hosts (pool fragments x bytes/fragment)",
    )
    ax2.set(xscale="log", xlabel="prefix fetch time per request (ms)", ylabel="CDF")
    ax2.set_title("fetch time of requests with a reusable prefix")
    ax3.set(ylabel="pool egress (MB)", title="pool egress by destination")
    for ax in (ax1, ax2, ax3):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_params(items: Sequence[str]) -> dict[str, Any]:
    """``NAME=VALUE`` strings (values parsed as YAML scalars) as a mapping.

    Raises:
        ValueError: an item without ``=``.
    """
    import yaml

    out: dict[str, Any] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ValueError(f"policy parameter {item!r} is not NAME=VALUE")
        out[name] = yaml.safe_load(value)
    return out


def _result_line(fields: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in fields.items())


# ------------------------------------------------------------------------------ CLI
def main(argv: Sequence[str] | None = None) -> int:
    """Command line: plan, replay (cache off, then on), write outputs, print result lines."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["agent"]:
        return agent_main(argv[1:])
    from experiments.traces import default_trace_path

    ap = argparse.ArgumentParser(
        prog="python -m experiments.trace_replay", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--trace", type=Path, default=default_trace_path())
    ap.add_argument("--start", type=int, default=0, help="index of the first request")
    ap.add_argument("--max-requests", type=int, default=400)
    ap.add_argument("--speedup", type=float, default=4.0, help="trace time / replay time")
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--block-bytes", type=int, default=DEFAULT_BLOCK_BYTES)
    ap.add_argument("--pool-mbit", type=float, default=2.0, help="pool link rate")
    ap.add_argument("--host-mbit", type=float, default=20.0, help="GPU host link rate")
    ap.add_argument("--policy", default="kvcast")
    ap.add_argument(
        "--policy-param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a policy parameter (YAML value), repeatable, e.g. hysteresis=1.0",
    )
    ap.add_argument(
        "--min-accesses",
        type=lambda v: v if v == "auto" else int(v),
        default="auto",
        help="reports of a chunk before the controller's policy hears of it (2: reused only; "
        "auto: learned from the reports)",
    )
    ap.add_argument("--tick", type=float, default=0.5, help="controller tick period, s")
    ap.add_argument("--max-loads-per-tick", type=int, default=64)
    ap.add_argument("--sram-budget", type=int, help="SRAM budget in bytes (default: all)")
    ap.add_argument("--seed", type=int, default=0, help="host assignment seed")
    ap.add_argument("--runs", default="cache-off,cache-on")
    ap.add_argument("--switch", choices=["auto", "refswitch", "bmv2"], default="auto")
    ap.add_argument(
        "--restart-switch-after",
        type=float,
        metavar="S",
        help="kill and restart the switch S seconds into the cache-on run (the controller "
        "must re-program it)",
    )
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    if args.trace is None:
        ap.error("no trace: data/traces/ is missing; pass --trace FILE")
    runs = [r.strip() for r in args.runs.split(",") if r.strip()]
    if not runs or any(r not in ("cache-off", "cache-on") for r in runs):
        ap.error("--runs takes cache-off and/or cache-on")
    if os.geteuid() != 0:
        ap.error("the emulated cluster needs root (Mininet)")
    try:
        policy_params = parse_params(args.policy_param)
    except ValueError as exc:
        ap.error(str(exc))
    from emulation.switches import BMv2Switch, RefSwitch, default_switch_class

    switch_cls = {"auto": default_switch_class(), "refswitch": RefSwitch, "bmv2": BMv2Switch}[
        args.switch
    ]
    requests = plan_requests(
        args.trace, max_requests=args.max_requests, start=args.start, hosts=args.hosts,
        seed=args.seed,
    )  # fmt: skip
    results = run_experiment(
        requests,
        switch_cls=switch_cls,
        hosts=args.hosts,
        block_bytes=args.block_bytes,
        speedup=args.speedup,
        pool_mbit=args.pool_mbit,
        host_mbit=args.host_mbit,
        policy=args.policy,
        policy_params=policy_params,
        min_accesses=args.min_accesses,
        tick_s=args.tick,
        max_loads_per_tick=args.max_loads_per_tick,
        sram_budget_bytes=args.sram_budget,
        runs=runs,
        progress=lambda s: print(s, flush=True),
        restart_switch_after_s=args.restart_switch_after,
    )
    paths = write_outputs(results, args.out)
    for r in results.values():
        print("result trace_replay " + _result_line(r.summary()))
    if "cache-on" in results and "cache-off" in results:
        print("result trace_replay run=comparison " + _result_line(comparison(results)))
    print(f"wrote {paths['requests']}, {paths['summary']}, {paths['plot']}")
    ok = all(
        s["missing"] == 0 and s["wrong_bytes"] == 0 for s in (r.summary() for r in results.values())
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
