"""Trace replay: the Mooncake conversation trace on the emulated cluster, switch cache on vs off.

The driver: one run (cache on or off) on a running cluster, both runs on one cluster, the
outputs and the command line (the package's docstring describes the experiment).

Classes:
    RunResult: one run's per-request rows, pool counters and controller metrics.

Functions:
    run_replay: one run (cache on or off) on a running cluster.
    run_experiment: both runs on one cluster.
    comparison: cache-on against cache-off.
    write_outputs: CSVs and the plot.
    parse_params: ``NAME=VALUE`` policy parameters.
    main: command line.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from experiments.output import pyplot, write_csv
from experiments.trace_replay.agent import agent_main
from experiments.trace_replay.plan import (
    DEFAULT_BLOCK_BYTES,
    SEED,
    TENANT,
    ReplayRequest,
    distinct_blocks,
    plan_requests,
)
from experiments.trace_replay.processes import (
    REPO,
    ControllerSettings,
    ManagementNetwork,
    PoolProcess,
    controller_config,
    controller_metrics,
    free_port,
    read_counter,
    running_controller,
)
from experiments.trace_replay.restarts import (
    ControllerRestart,
    MasterRestart,
    PoolRestart,
    SwitchRestart,
    restart_outcome,
)
from kvcast import p4constants as c
from kvcast.kvp import frag_count

if TYPE_CHECKING:
    from emulation.network import Cluster
    from emulation.switches import P4Switch

RESULTS = Path("results/trace_replay")


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


def run_replay(
    cluster: Cluster,
    mgmt: ManagementNetwork,
    requests: Sequence[ReplayRequest],
    *,
    cache_on: bool,
    speedup: float,
    block_bytes: int,
    controller: ControllerSettings | None = None,
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
        controller: the controller's policy and pacing (None: the defaults).
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
    report_port, metrics_port = free_port(), free_port()
    run_dir = workdir / name
    run_dir.mkdir(parents=True, exist_ok=True)
    settings = controller or ControllerSettings()
    config = controller_config(
        cluster,
        mgmt,
        cache_on=cache_on,
        report_port=report_port,
        metrics_port=metrics_port,
        **asdict(settings),
    )
    pool = cluster.pools()[0]
    hosts = cluster.hosts()
    lines: queue.Queue[tuple[str, str]] = queue.Queue()
    with (
        running_controller(config, run_dir, report_port) as daemon,
        contextlib.ExitStack() as stack,
    ):
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
        tx0 = read_counter(cluster, pool.name, cluster.host(pool.name).defaultIntf().name)
        mg0 = read_counter(cluster, pool.name, "mgmt0")
        t0 = time.time() + 1.0
        first = requests[0].time if requests else 0.0
        progress(f"  {name}: {len(requests)} requests over {len(hosts)} hosts")
        restart: SwitchRestart | ControllerRestart | PoolRestart | MasterRestart | None = None
        if restart_switch_after_s is not None:
            restart = SwitchRestart(cluster, daemon.status)
            restart.start(t0 + restart_switch_after_s)
        elif restart_controller_after_s is not None:
            address = cluster.switch.process.address if cluster.switch.process else ""
            frags = frag_count(block_bytes) if kill_controller_during_load else None
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
        time.sleep(2 * settings.tick_s)  # the last reports reach a tick
        result.pool_tx_bytes = (
            read_counter(cluster, pool.name, cluster.host(pool.name).defaultIntf().name) - tx0
        )
        result.pool_mgmt_tx_bytes = read_counter(cluster, pool.name, "mgmt0") - mg0
        result.controller = controller_metrics(metrics_port)
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
    controller: ControllerSettings | None = None,
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
        controller: the controller's policy and pacing in both runs (None: the defaults).
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
            # The pool node checks each GET's tenant against its sender's binding: the hosts'
            # as the switch binds them, and the controller's chunk reads (over the management
            # network, from the root side of the pool's link) for any tenant.
            reader = f"{mgmt.root_ip[pool.name]}=any"
            pool_cmd += [*cluster.source_tenants(), "--source-tenants", reader]
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
                    controller=controller,
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
        controller = ControllerSettings(
            policy=args.policy,
            policy_params=parse_params(args.policy_param),
            min_accesses=args.min_accesses,
            tick_s=args.tick,
            max_loads_per_tick=args.max_loads_per_tick,
            sram_budget_bytes=args.sram_budget,
        )
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
        controller=controller,
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
