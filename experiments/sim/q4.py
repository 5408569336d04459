"""Q4: overheads against benefits. At what scale does the in-network pool pay off, and where not?

Part ``burst``: synchronized consumers (:func:`~experiments.sim.workloads.burst_workload`):
each burst, N distinct hosts of 1,024 ask for one shared prefix of 4 blocks (plus one unique
block each). Around a base point (Llama-3-8B, 100 Gb/s hosts and pool nodes, arrivals at the
same instant, each prefix used by one burst, one Tofino-1 pipe of SRAM), one factor changes at a
time: link speeds, arrival jitter, reuse (bursts per prefix), chunk size (the small model with
int4 KV), SRAM size, an extra hop. For each, N runs from 1 to 256 under three fabrics:
``unicast`` (every host pulls its copy), ``multicast`` (miss coalescing + multicast) and
``kvcast`` (that plus SRAM under the ``kvcast`` policy).

Benefit: mean fetch time relief T_unicast / T_fabric, TTFT, pool egress bytes saved.
Overhead: control-channel bytes and operations (SRAM WRITE packets through the CPU port, table
writes, hot-miss digests, multicast-group updates), the SRAM load time, the extra hop's latency.
A point *pays in time* when the relief is at least 1.05, *pays in bytes* when the pool bytes
saved exceed the control bytes spent. The break-even N is the smallest N from which every
larger N pays; ``never`` when none does. The analytic reference for multicast: a prefix of P
blocks with at most k on one pool node takes P x S / host rate to arrive with multicast and
N x k x S / pool rate with unicast when that pool link is the bottleneck, so multicast can only
gain once N > (P / k) x pool_gbps / host_gbps (``analytic_n_above``).

Part ``trace``: the whole conversation trace on 1,024 hosts with each fabric, for Llama-3-8B
and the int4 small model, at the trace's own arrival rate and sped up 100x, with control
operations per second next to the savings.

Run: ``python -m experiments.q4_breakeven`` (``--quick`` for a smoke run). Writes
``q4_burst.csv``, ``q4_breakeven.csv``, ``q4_trace.csv``, ``q4_breakeven.png`` and
``q4_trace.png`` under ``--out`` (default ``results/q4``); prints ``result q4 ...`` lines.

Classes:
    Scenario: one point of the one-factor-at-a-time design.

Functions:
    breakeven: the smallest N from which every larger N pays.
    main: command line (:func:`~experiments.sim.report.tables_main`).

Constants:
    SCENARIOS: the scenarios, base first.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiments.sim.cluster import ClusterSim
from experiments.sim.cluster_config import ClusterConfig
from experiments.sim.cluster_result import SimResult
from experiments.sim.hardware import MODELS
from experiments.sim.report import Tables, describe, pyplot, result_line, save_figure, tables_main
from experiments.sim.workloads import burst_workload, make_workload
from experiments.traces import mix64

__all__ = ["SCENARIOS", "Scenario", "breakeven", "main"]

MIB = 1 << 20
DEFAULT_OUT = Path("results/q4")
FABRIC_NAMES = ("unicast", "multicast", "kvcast")
TIME_GAIN = 1.05


@dataclass(frozen=True)
class Scenario:
    """One point of the design.

    Attributes:
        name: label.
        model: KV model preset.
        host_gbps: host NIC rate.
        pool_gbps: pool NIC rate.
        jitter_s: spread of a burst's arrivals.
        reuse: bursts per prefix.
        sram_mib: SRAM budget.
        extra_hop_s: latency added by an off-path switch.
    """

    name: str
    model: str = "llama3-8b"
    host_gbps: float = 100.0
    pool_gbps: float = 100.0
    jitter_s: float = 0.0
    reuse: int = 1
    sram_mib: float = 4.0
    extra_hop_s: float = 0.0


SCENARIOS = (
    Scenario("base"),
    Scenario("pool400", pool_gbps=400.0),
    Scenario("host400", host_gbps=400.0),
    Scenario("jitter10ms", jitter_s=0.01),
    Scenario("jitter1s", jitter_s=1.0),
    Scenario("reuse8", reuse=8),
    Scenario("kv4", model="small-kv4"),
    Scenario("kv4-reuse8", model="small-kv4", reuse=8),
    Scenario("kv4-sram64M-reuse8", model="small-kv4", reuse=8, sram_mib=64.0),
    Scenario("kv4-jitter1s-reuse8", model="small-kv4", jitter_s=1.0, reuse=8),
    Scenario("kv4-hop10us", model="small-kv4", extra_hop_s=10e-6),
)

_PREFIX_BLOCKS = 4
_BURSTS = 8


def breakeven(ns: Sequence[int], pays: Sequence[bool]) -> int | None:
    """The smallest N from which every larger N pays.

    Args:
        ns: N values, increasing.
        pays: whether each pays.

    Returns:
        That N, or None when the largest N does not pay.
    """
    best: int | None = None
    for n, ok in zip(reversed(ns), reversed(pays), strict=True):
        if not ok:
            break
        best = n
    return best


def _config(sc: Scenario, fabric: str) -> ClusterConfig:
    return ClusterConfig(
        model=MODELS[sc.model],
        host_gbps=sc.host_gbps,
        pool_gbps=sc.pool_gbps,
        fabric=fabric,
        sram_bytes=int(sc.sram_mib * MIB),
        extra_hop_s=sc.extra_hop_s,
    )


def _burst_part(
    args: argparse.Namespace, lines: list[str]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    ns = [int(n) for n in args.ns.split(",")]
    names = set(args.scenarios.split(",")) if args.scenarios else None
    scenarios = [s for s in SCENARIOS if names is None or s.name in names]
    rows: list[dict[str, Any]] = []
    summary: list[dict[str, Any]] = []
    print(f"# q4 burst part: {describe(_config(SCENARIOS[0], 'kvcast'))}", flush=True)
    for sc in scenarios:
        per_fabric: dict[str, list[tuple[int, bool, bool]]] = {f: [] for f in FABRIC_NAMES}
        analytic = float("nan")
        for n in ns:
            bursts = _BURSTS if sc.reuse > 1 else max(2, _BURSTS // 2)
            w = burst_workload(
                consumers=n,
                prefix_blocks=_PREFIX_BLOCKS,
                bursts=bursts,
                hosts=1024,
                gap_s=1.0,
                jitter_s=sc.jitter_s,
                prefixes=max(1, bursts // sc.reuse),
            )
            res: dict[str, SimResult] = {
                f: ClusterSim(_config(sc, f), w).run() for f in FABRIC_NAMES
            }
            pools = res["unicast"].config.pools
            prefix = w.requests[0].blocks[:_PREFIX_BLOCKS]
            k_max = max(sum(mix64(k) % pools == p for k in prefix) for p in range(pools))
            analytic = len(prefix) / k_max * sc.pool_gbps / sc.host_gbps
            uni = res["unicast"]
            for fabric, r in res.items():
                relief = uni.fetch_stat(-1) / r.fetch_stat(-1) if r.fetch_stat(-1) > 0 else 1.0
                saved = uni.pool_egress_bytes - r.pool_egress_bytes
                duration = max(r.sim_end_s, 1e-9)
                fields: dict[str, Any] = {
                    "scenario": sc.name,
                    "n": n,
                    "fabric": fabric,
                    "relief": relief,
                    "p99_relief": uni.fetch_stat(99) / r.fetch_stat(99)
                    if r.fetch_stat(99) > 0
                    else 1.0,
                    "ttft_relief": uni.ttft_stat(-1) / r.ttft_stat(-1),
                    "fetch_mean_s": r.fetch_stat(-1),
                    "pool_egress_bytes": r.pool_egress_bytes,
                    "pool_saved_bytes": saved,
                    "control_bytes": r.control_bytes,
                    "control_ops_per_s": (r.table_writes + r.digests + r.group_updates) / duration,
                    "write_packets": r.write_packets,
                    "sram_byte_hit": r.sram_byte_hit,
                    "pays_time": "yes" if relief >= TIME_GAIN else "no",
                    "pays_bytes": "yes" if saved > r.control_bytes else "no",
                }
                if fabric != "unicast":
                    per_fabric[fabric].append((n, relief >= TIME_GAIN, saved > r.control_bytes))
                lines.append(result_line("q4", part="burst", **fields))
                rows.append({**fields, **sc.__dict__, **r.row(), "scenario": sc.name})
        for fabric in FABRIC_NAMES[1:]:
            pts = per_fabric[fabric]
            t_n = breakeven([p[0] for p in pts], [p[1] for p in pts])
            b_n = breakeven([p[0] for p in pts], [p[2] for p in pts])
            fields = {
                "scenario": sc.name,
                "fabric": fabric,
                "breakeven_n_time": t_n if t_n is not None else "never",
                "breakeven_n_bytes": b_n if b_n is not None else "never",
                "analytic_n_above": analytic,
            }
            lines.append(result_line("q4", part="breakeven", **fields))
            summary.append(fields)
    return rows, summary


def _trace_part(args: argparse.Namespace, lines: list[str]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for speedup in (float(s) for s in args.speedups.split(",")):
        w = make_workload(
            "conversation", hosts=1024, quick=args.quick, speedup=speedup, trace=args.trace
        )
        for mname in args.models.split(","):
            res = {
                f: ClusterSim(ClusterConfig(model=MODELS[mname], fabric=f), w).run()
                for f in FABRIC_NAMES
            }
            uni = res["unicast"]
            for fabric, r in res.items():
                duration = max(r.sim_end_s, 1e-9)
                fields: dict[str, Any] = {
                    "speedup": speedup,
                    "model": mname,
                    "fabric": fabric,
                    "pool_saved": (uni.pool_egress_bytes - r.pool_egress_bytes)
                    / uni.pool_egress_bytes
                    if uni.pool_egress_bytes
                    else 0.0,
                    "fetch_relief": uni.fetch_stat(-1) / r.fetch_stat(-1),
                    "fetch_p99_relief": uni.fetch_stat(99) / r.fetch_stat(99),
                    "ttft_mean_s": r.ttft_stat(-1),
                    "ttft_p99_s": r.ttft_stat(99),
                    "coalesced_joins": r.coalesced_joins,
                    "sram_byte_hit": r.sram_byte_hit,
                    "control_bytes": r.control_bytes,
                    "write_packets_per_s": r.write_packets / duration,
                    "control_ops_per_s": (r.table_writes + r.digests + r.group_updates) / duration,
                    "pool_egress_gbps": 8 * r.pool_egress_bytes / duration / 1e9,
                }
                lines.append(result_line("q4", part="trace", **fields))
                rows.append({**fields, **r.row()})
    return rows


def _simulate(args: argparse.Namespace, lines: list[str]) -> Tables:
    """The parts in ``args.parts`` (``burst``: the break-even, ``trace``).

    The defaults that depend on ``--quick`` are filled in first.
    """
    if args.ns is None:
        args.ns = "1,4,16" if args.quick else "1,2,4,8,16,32,64,128,256"
    if args.scenarios is None:
        args.scenarios = "base,kv4-reuse8" if args.quick else ""
    if args.speedups is None:
        args.speedups = "1" if args.quick else "1,100"
    tables: Tables = {}
    if "burst" in args.parts:
        tables["q4_burst.csv"], tables["q4_breakeven.csv"] = _burst_part(args, lines)
    if "trace" in args.parts:
        tables["q4_trace.csv"] = _trace_part(args, lines)
    return tables


def _figures(tables: Tables, out: Path) -> list[Path]:
    written = []
    if "q4_burst.csv" in tables:
        _plot_burst(tables["q4_burst.csv"], out / "q4_breakeven.png")
        written.append(out / "q4_breakeven.png")
    if "q4_trace.csv" in tables:
        _plot_trace(tables["q4_trace.csv"], out / "q4_trace.png")
        written.append(out / "q4_trace.png")
    return written


def _plot_burst(rows: list[dict[str, Any]], path: Path) -> None:
    plt = pyplot()
    names = list(dict.fromkeys(r["scenario"] for r in rows))
    cols = min(5, len(names))
    nrows = -(-len(names) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(3.6 * cols, 3.2 * nrows), squeeze=False)
    for k, name in enumerate(names):
        ax = axes[k // cols][k % cols]
        for fabric, style in (("multicast", "o-"), ("kvcast", "s--")):
            pts = sorted(
                (r["n"], r["relief"])
                for r in rows
                if r["scenario"] == name and r["fabric"] == fabric
            )
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=fabric, ms=4)
        ax.axhline(TIME_GAIN, color="grey", lw=0.8, ls=":")
        ax.set(xscale="log", yscale="log", title=name, xlabel="N consumers")
        ax.grid(True, which="both", alpha=0.3)
        if k % cols == 0:
            ax.set_ylabel("fetch time relief vs unicast")
        ax.legend(fontsize=7)
    for k in range(len(names), nrows * cols):
        axes[k // cols][k % cols].axis("off")
    fig.suptitle("Q4: when does the in-network pool pay? (dotted: 1.05)")
    save_figure(fig, path)


def _plot_trace(rows: list[dict[str, Any]], path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    labels = [f"{r['model']} x{r['speedup']:g} {r['fabric']}" for r in rows]
    axes[0].barh(labels, [100 * r["pool_saved"] for r in rows], color="C1")
    axes[0].set(xlabel="pool egress saved vs unicast (%)", title="trace, 1,024 hosts")
    axes[1].barh(labels, [r["ttft_mean_s"] for r in rows], color="C0")
    axes[1].set(xlabel="mean TTFT (s)", title="trace, 1,024 hosts")
    axes[1].set_yticklabels([])
    for ax in axes:
        ax.invert_yaxis()
        ax.tick_params(axis="y", labelsize=7)
    save_figure(fig, path)


def _add_args(ap: argparse.ArgumentParser) -> None:
    """Q4's own options (beside ``--out``, ``--quick`` and ``--trace``)."""
    ap.add_argument("--parts", default="burst,trace")
    ap.add_argument("--ns", help="consumer counts (default 1,2,4,...,256; quick: 1,4,16)")
    ap.add_argument("--scenarios", help="comma-separated names (default: all; quick: two)")
    ap.add_argument("--models", default="llama3-8b,small-kv4", help="trace part")
    ap.add_argument("--speedups", help="trace part (default 1,100; quick: 1)")


main = tables_main("q4_breakeven", __doc__, DEFAULT_OUT, _add_args, _simulate, _figures)


if __name__ == "__main__":
    sys.exit(main())
