"""N-to-1 incast: N GPU hosts fetch the same hot prefix, without and with the switch.

Modes (one emulated cluster, measured side by side in one run):

- ``a`` pool-unicast: every host asks the pool for the whole prefix itself; the pool sends it N
  times through its one link.
- ``b`` pool-multicast: one host asks the pool once naming a multicast group; the switch
  replicates the pool's single stream to the N hosts.
- ``c`` sram-multicast: the prefix is in switch SRAM; one host's GETs name the group and the
  switch answers every member from SRAM.
- ``d`` sram-unicast: the prefix is in switch SRAM; every host asks the switch for each fragment.

The pool node is ``python -m poolnode`` in the pool's namespace: with ``--pool-backend mooncake``
(the default where ``mooncake_master`` is installed, which ``make setup`` does) it starts
``mooncake_master`` there and serves the prefix from Mooncake Store; ``memory`` keeps it in the
pool node's own memory.

Per point it records every host's completion time (from a common start instant to a complete,
CRC-checked and content-verified tensor), the pool node's egress bytes (its interface counter)
and the switch's counters; it writes a per-host CSV, a summary CSV and a PNG plot.

Run: ``python -m experiments.incast`` (root; Mininet). ``--help`` lists the sweep parameters.

Classes:
    Mode: one way of fetching.
    PointResult: the outcome of one (mode, N, prefix size) point.

Functions:
    run_point: one point on a running cluster.
    run_sweep: the whole sweep on one cluster.
    main: command line.
"""

from __future__ import annotations

import argparse
import json
import select
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from finsy.proto import p4r

from emulation.network import Cluster
from emulation.switches import BMv2Switch, P4Switch, RefSwitch, default_switch_class
from emulation.topo import SERVICE_IP, ClusterSpec, LinkSpec
from experiments.output import pyplot, write_csv
from hostagent.ports import AGENT_PORT
from kvcast import p4constants as c
from poolnode.mooncake import find_master_binary

TENANT = 7
SEED = 20261122
RESULTS = Path("results/incast")


@dataclass(frozen=True)
class Mode:
    """One way of fetching the prefix.

    Attributes:
        name: ``a``..``d``.
        label: what it is.
        sram: the prefix is loaded into switch SRAM first.
        group: one leader fetches for a multicast group; the others follow.
        via: where GETs are answered: ``pool`` (NOCACHE, the pool owner) or ``switch`` (SRAM).
    """

    name: str
    label: str
    sram: bool
    group: bool
    via: str


MODES = {
    "a": Mode("a", "pool-unicast", sram=False, group=False, via="pool"),
    "b": Mode("b", "pool-multicast", sram=False, group=True, via="pool"),
    "c": Mode("c", "sram-multicast", sram=True, group=True, via="switch"),
    "d": Mode("d", "sram-unicast", sram=True, group=False, via="switch"),
}


@dataclass
class PointResult:
    """One (mode, N, prefix size) point."""

    mode: str
    n: int
    nbytes: int
    hosts: list[dict[str, Any]] = field(default_factory=list)
    pool_tx_bytes: int = 0
    counters: dict[str, int] = field(default_factory=dict)

    @property
    def times(self) -> list[float]:
        """Completion times of hosts that ended verified."""
        return sorted(h["completion_s"] for h in self.hosts if h.get("ok") and h.get("verified"))

    @property
    def all_ok(self) -> bool:
        """Every host ended with a verified prefix."""
        return len(self.times) == self.n

    def summary(self) -> dict[str, Any]:
        """The point's summary row."""
        t = self.times
        p99 = t[min(len(t) - 1, int(round(0.99 * (len(t) - 1))))] if t else float("nan")
        return {
            "mode": self.mode,
            "label": MODES[self.mode].label,
            "n": self.n,
            "prefix_bytes": self.nbytes,
            "ok_hosts": len(t),
            "p50_s": statistics.median(t) if t else float("nan"),
            "p99_s": p99,
            "max_s": t[-1] if t else float("nan"),
            "pool_tx_bytes": self.pool_tx_bytes,
            "pool_tx_over_prefix": round(self.pool_tx_bytes / self.nbytes, 3),
            **{f"sw_{k}": v for k, v in self.counters.items()},
        }


def _pool_tx_bytes(cluster: Cluster) -> int:
    """Bytes the pool nodes have sent: what the switch's ports facing them have received.

    Read in the root namespace (the switch's end of each veth pair), so no node shell is
    involved; a veth pair delivers every frame one end sends to the other.
    """
    total = 0
    for pool in cluster.pools():
        node = cluster.host(pool.name)
        switch_intf = node.defaultIntf().link.intf2.name
        total += int(Path(f"/sys/class/net/{switch_intf}/statistics/rx_bytes").read_text())
    return total


def _event_counters(cluster: Cluster) -> dict[int, int]:
    return cluster.client.counters(c.COUNTER_INGRESS_STATS_KVP_EVENT_COUNTER)


_EVENT_NAMES = {
    c.EV_GET_HIT: "get_hit",
    c.EV_GET_MISS: "get_miss",
    c.EV_GET_BYPASS: "get_bypass",
    c.EV_DATA_MCAST: "data_mcast",
    c.EV_DATA_UNICAST: "data_unicast",
}


WINDOW = 32  # GETs each agent keeps outstanding
POOL_FRAGS_PER_DATA = 5  # what a pool node packs into one DATA at a 1500-byte MTU


def get_timeouts(mode: Mode, n: int, pool_mbit: float | None) -> tuple[float, float]:
    """First and largest GET timeout for the agents of one point.

    A GET's reply waits behind everything already queued on the pool link; a timeout shorter
    than that drain time retransmits GETs whose replies are merely queued, and the duplicates
    congest the link further. TCP avoids this with an RTT estimate; the agents are given the
    drain time of the bytes that can be in flight (every requester's window) instead, so mode
    (a) is measured without spurious retransmissions and the relief is the traffic's, not a
    collapse's.

    Args:
        mode: the point's mode.
        n: hosts fetching.
        pool_mbit: pool link rate (None: unshaped).

    Returns:
        (first timeout, largest timeout) in seconds.
    """
    if mode.via == "switch" or pool_mbit is None:
        return 0.1, 1.0
    requesters = 1 if mode.group else n
    in_flight = requesters * WINDOW * POOL_FRAGS_PER_DATA * (c.FRAG_BYTES + c.KVP_HDR_BYTES)
    first = max(0.1, 2.5 * in_flight * 8 / (pool_mbit * 1e6))
    return first, 4 * first


def _agent_cmd(
    mode: Mode,
    role: str,
    key: int,
    nbytes: int,
    group: int,
    pool_ip: str,
    timeout: float,
    timeouts: tuple[float, float],
) -> list[str]:
    if mode.group:
        agent_mode = role
    else:
        agent_mode = "unicast-switch" if mode.via == "switch" else "unicast-pool"
    cmd = [
        sys.executable,
        "-m",
        "hostagent.agent",
        "fetch",
        "--tenant",
        str(TENANT),
        "--key",
        hex(key),
        "--nbytes",
        str(nbytes),
        "--service",
        SERVICE_IP,
        "--pool",
        pool_ip,
        "--mode",
        agent_mode,
        "--start-at",
        "stdin",
        "--timeout",
        str(timeout),
        "--verify-seed",
        str(SEED),
        "--bind-port",
        str(AGENT_PORT),
        "--window",
        str(WINDOW),
        "--get-timeout",
        f"{timeouts[0]:.3f}",
        "--max-get-timeout",
        f"{timeouts[1]:.3f}",
        # A follower repairs only when the stream has stalled longer than the leader's longest
        # GET timeout, or it would take a leader's retry for the end of the stream.
        "--stall",
        f"{max(0.5, 1.2 * timeouts[1]):.3f}",
    ]
    if mode.group:
        cmd += ["--group", str(group), "--via", mode.via]
    return cmd


def run_point(
    cluster: Cluster, mode: Mode, n: int, nbytes: int, key: int, group: int, timeout: float = 60.0
) -> PointResult:
    """Measures one point on a running cluster.

    Args:
        cluster: the running cluster (pool node serving ``key``).
        mode: how to fetch.
        n: GPU hosts fetching.
        nbytes: prefix size.
        key: chunk key the pool holds.
        group: a multicast group id not used before in this run.
        timeout: seconds an agent may take.

    Returns:
        The point's result.
    """
    client = cluster.client
    if mode.sram:
        client.load_chunk(TENANT, key, _synthetic(key, nbytes), slot_base=0, epoch=group)
    else:
        try:
            client.delete(c.TABLE_INGRESS_CACHE_CACHE_TABLE, {"tenant": TENANT, "key": key})
        except Exception as exc:  # noqa: BLE001 - absent is fine
            if not getattr(exc, "not_found", False):
                raise
    hosts = cluster.hosts()[:n]
    if mode.group:
        cluster.add_group(group, [h.name for h in hosts])
    pool_ip = cluster.pools()[0].ip
    tx0, ev0 = _pool_tx_bytes(cluster), _event_counters(cluster)
    result = PointResult(mode.name, n, nbytes)
    procs = []
    for i, h in enumerate(hosts):
        role = "leader" if i == 0 else "follower"
        cmd = _agent_cmd(
            mode,
            role,
            key,
            nbytes,
            group,
            pool_ip,
            timeout,
            get_timeouts(mode, n, cluster.spec.pool_link.bw_mbit),
        )
        procs.append(
            (
                h.name,
                cluster.host(h.name).popen(
                    cmd,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                ),
            )
        )
    _wait_ready([p for _, p in procs], timeout=60.0)
    # Followers first, so that they listen before the leader's first GET.
    start_at = time.time() + 0.3
    for _name, proc in reversed(procs):
        if proc.stdin is not None:
            proc.stdin.write(f"{start_at:.6f}\n")
            proc.stdin.flush()
    for name, proc in procs:
        try:
            out, err = proc.communicate(timeout=timeout + 30)
        except subprocess.TimeoutExpired:  # a hung agent is a failed host, not a crash
            proc.kill()
            out, err = proc.communicate()
        row: dict[str, Any] = {"host": name, "ok": False, "error": err.strip()[-300:]}
        for line in out.splitlines():
            if line.startswith("{"):
                row = {"host": name, **json.loads(line)}
        result.hosts.append(row)
    result.pool_tx_bytes = _pool_tx_bytes(cluster) - tx0
    ev1 = _event_counters(cluster)
    result.counters = {name: ev1.get(i, 0) - ev0.get(i, 0) for i, name in _EVENT_NAMES.items()}
    if mode.group:
        client.multicast_group(group, [], update=p4r.Update.DELETE)
    return result


def _wait_ready(procs: list[subprocess.Popen[str]], timeout: float) -> None:
    """Waits until every agent has printed ``agent ready`` (socket bound, imports done)."""
    pending = {p.stderr.fileno(): p for p in procs if p.stderr is not None}
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        ready, _, _ = select.select(list(pending), [], [], 0.5)
        for fd in ready:
            proc = pending[fd]
            line = proc.stderr.readline() if proc.stderr is not None else ""
            if not line or line.startswith("agent ready"):
                del pending[fd]  # ready, or exited (its error shows in its result)


def _synthetic(key: int, nbytes: int) -> bytes:
    from hostagent.synthetic import synthetic_chunk

    return synthetic_chunk(TENANT, key, nbytes, SEED)


def run_sweep(
    spec: ClusterSpec,
    switch_cls: type[P4Switch],
    modes: Sequence[str],
    ns: Sequence[int],
    sizes: Sequence[int],
    repeats: int,
    progress: Callable[[str], None] = print,
    pool_backend: str = "memory",
) -> list[PointResult]:
    """Runs every (size, N, mode) point on one cluster.

    Args:
        spec: the cluster (``spec.n_hosts`` >= max of ``ns``).
        switch_cls: switch node class.
        modes: mode names.
        ns: host counts.
        sizes: prefix sizes in bytes.
        repeats: runs per point.
        progress: where progress lines go.
        pool_backend: ``"memory"``, or ``"mooncake"``: the pool node starts ``mooncake_master``
            in its namespace and serves the prefix from Mooncake Store (``python -m poolnode
            --start-master``).

    Returns:
        Every point's result.

    Raises:
        RuntimeError: the pool node did not start (its log's tail is in the message).
    """
    results: list[PointResult] = []
    points = [(s, n, m, r) for s in sizes for n in ns for m in modes for r in range(repeats)]
    keys = {s: 0x5EED0000 + i for i, s in enumerate(sizes)}
    preload = [arg for s in sizes for arg in ("--preload", f"{TENANT}:{keys[s]}:{s}:{SEED}")]
    with Cluster(spec, switch_cls) as cluster:
        pool = cluster.pools()[0]
        pool_cmd = [sys.executable, "-m", "poolnode", "--port", str(c.KVP_UDP_PORT), *preload]
        if pool_backend == "mooncake":
            pool_cmd += ["--backend", "mooncake", "--start-master", "--segment-mib", "64"]
        else:
            pool_cmd += ["--backend", "memory"]
        with cluster.serve(pool.name, pool_cmd, "poolnode listening"):
            progress(f"pool node ({pool_backend}) ready")
            t0 = time.time()
            for done, (size, n, m, rep) in enumerate(points, 1):
                res = run_point(cluster, MODES[m], n, size, keys[size], group=100 + done)
                results.append(res)
                s = res.summary()
                progress(
                    f"[{done:3d}/{len(points)}] {time.time() - t0:6.1f}s mode={m} "
                    f"({MODES[m].label}) N={n} prefix={size // 1024}KiB rep={rep} "
                    f"max={s['max_s']:.3f}s p50={s['p50_s']:.3f}s "
                    f"pool_tx={s['pool_tx_over_prefix']:.2f}x ok={s['ok_hosts']}/{n}"
                )
    return results


def write_outputs(results: list[PointResult], out: Path) -> dict[str, Path]:
    """Writes hosts.csv, summary.csv and incast.png into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {"hosts": out / "hosts.csv", "summary": out / "summary.csv", "plot": out / "incast.png"}
    host_rows = [
        {"mode": r.mode, "n": r.n, "prefix_bytes": r.nbytes, **h} for r in results for h in r.hosts
    ]
    write_csv(paths["hosts"], host_rows)
    write_csv(paths["summary"], [r.summary() for r in results])
    _plot(results, paths["plot"])
    return paths


def _plot(results: list[PointResult], path: Path) -> None:
    plt = pyplot()
    sizes = sorted({r.nbytes for r in results})
    fig, axes = plt.subplots(len(sizes), 2, figsize=(11, 3.8 * len(sizes)), squeeze=False)
    for row, size in enumerate(sizes):
        for m in MODES:
            # Repeats give several points per N: group them, never compare their summaries.
            pts = [(r.n, r.summary()) for r in results if r.nbytes == size and r.mode == m]
            if not pts:
                continue
            by_n: dict[int, list[dict[str, Any]]] = {}
            for n, s in pts:
                by_n.setdefault(n, []).append(s)
            ns = sorted(by_n)
            axes[row][0].plot(
                ns,
                [statistics.median(x["max_s"] for x in by_n[n]) for n in ns],
                marker="o",
                label=f"({m}) {MODES[m].label}",
            )
            axes[row][1].plot(
                ns,
                [statistics.median(x["pool_tx_over_prefix"] for x in by_n[n]) for n in ns],
                marker="o",
                label=f"({m}) {MODES[m].label}",
            )
        axes[row][0].set(
            xscale="log",
            yscale="log",
            xlabel="N hosts",
            ylabel="time until all N hold the prefix (s)",
            title=f"prefix {size // 1024} KiB: completion",
        )
        axes[row][1].set(
            xscale="log",
            xlabel="N hosts",
            ylabel="pool egress / prefix bytes",
            title=f"prefix {size // 1024} KiB: pool egress",
        )
        for ax in axes[row]:
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def relief_table(results: list[PointResult]) -> list[dict[str, Any]]:
    """Relief ratios T_a(N)/T_x(N) (makespan medians) per prefix size and N."""
    rows = []
    for size in sorted({r.nbytes for r in results}):
        for n in sorted({r.n for r in results}):
            t: dict[str, float] = {}
            for m in MODES:
                vals = [
                    r.summary()["max_s"]
                    for r in results
                    if r.nbytes == size and r.n == n and r.mode == m and r.all_ok
                ]
                if vals:
                    t[m] = statistics.median(vals)
            row: dict[str, Any] = {
                "prefix_kib": size // 1024,
                "n": n,
                **{f"T_{m}": round(v, 4) for m, v in t.items()},
            }
            for m in "bcd":
                if "a" in t and m in t:
                    row[f"a/{m}"] = round(t["a"] / t[m], 2)
            rows.append(row)
    return rows


def _print_table(rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    cols: list[str] = []
    for r in rows:
        cols += [k for k in r if k not in cols]
    widths = {k: max(len(k), *(len(str(r.get(k, ""))) for r in rows)) for k in cols}
    print("  ".join(k.rjust(widths[k]) for k in cols))
    for r in rows:
        print("  ".join(str(r.get(k, "")).rjust(widths[k]) for k in cols))


def main(argv: list[str] | None = None) -> int:
    """Command line: runs the sweep, prints the relief table, writes CSVs and the plot."""
    ap = argparse.ArgumentParser(
        prog="python -m experiments.incast", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--hosts", default="1,2,4,8,16", help="comma-separated N values")
    ap.add_argument("--modes", default="abcd")
    ap.add_argument("--prefix-kib", default="256", help="comma-separated prefix sizes in KiB")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--pool-mbit", type=float, default=2.0, help="pool link rate (see docs)")
    ap.add_argument("--host-mbit", type=float, default=20.0, help="GPU host link rate")
    ap.add_argument("--switch", choices=["auto", "refswitch", "bmv2"], default="auto")
    ap.add_argument(
        "--pool-backend",
        choices=["auto", "mooncake", "memory"],
        default="auto",
        help="the pool node's store: Mooncake Store (auto: where mooncake_master is installed)",
    )
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    ns = [int(x) for x in args.hosts.split(",")]
    sizes = [int(x) * 1024 for x in args.prefix_kib.split(",")]
    if max(sizes) > c.NUM_FRAG_SLOTS * c.FRAG_BYTES:
        ap.error(f"a prefix must fit switch SRAM ({c.NUM_FRAG_SLOTS * c.FRAG_BYTES} bytes)")
    switch_cls: type[P4Switch] = {
        "auto": default_switch_class(),
        "refswitch": RefSwitch,
        "bmv2": BMv2Switch,
    }[args.switch]
    spec = ClusterSpec(
        n_hosts=max(ns),
        n_pools=1,
        host_link=LinkSpec(bw_mbit=args.host_mbit),
        pool_link=LinkSpec(bw_mbit=args.pool_mbit),
    )
    pool_backend = args.pool_backend
    if pool_backend == "auto":
        pool_backend = "mooncake" if find_master_binary() else "memory"
    print(
        f"incast: switch={switch_cls.kind} pool={pool_backend} N={ns} prefix={args.prefix_kib} KiB "
        f"modes={args.modes} pool link {args.pool_mbit} Mbit/s, host links "
        f"{args.host_mbit} Mbit/s, FRAG_BYTES={c.FRAG_BYTES}",
        flush=True,
    )
    results = run_sweep(
        spec,
        switch_cls,
        list(args.modes),
        ns,
        sizes,
        args.repeats,
        progress=lambda s: print(s, flush=True),
        pool_backend=pool_backend,
    )
    paths = write_outputs(results, args.out)
    print()
    _print_table(relief_table(results))
    for r in results:
        s = r.summary()
        print(
            f"result incast mode={r.mode} n={r.n} prefix_bytes={r.nbytes} "
            f"max_s={s['max_s']:.4f} p50_s={s['p50_s']:.4f} p99_s={s['p99_s']:.4f} "
            f"pool_tx_over_prefix={s['pool_tx_over_prefix']} ok={s['ok_hosts']}/{r.n}"
        )
    print(f"wrote {paths['hosts']}, {paths['summary']}, {paths['plot']}")
    return 0 if all(r.all_ok for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
