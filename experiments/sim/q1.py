"""Q1: the pool is small, which prefixes are worth it? Selection policies in the cluster model.

Every policy registered in :mod:`controlplane.policies` (``available_policies()``: the kvcast
policy, LRU, LFU, the NetCache-style sketch and the offline optimum ``belady``) runs as the
switch's SRAM policy in the cluster model, at SRAM budgets from one Tofino-1 pipe
(``hardware.tofino1().sram_bytes``) up.
The metric is the one that matters in the cluster: pool egress bytes saved and fetch time saved
relative to the same fabric without SRAM (miss coalescing and multicast only), next to the
byte hit ratio of network accesses. The policy sees only what reaches the network (blocks the
host's own HBM/DRAM does not hold), in arrival order, with hit flags, parents and positions.

Two load models: ``instant`` (loads take no time: the policy-only view, where ``belady`` is the
exact optimum of SRAM hits for equal-size chunks) and ``queue`` (an admitted chunk is served
only once its WRITE packets went through the CPU port, loads queue one after another: what a
real controller can do). ``ratio_to_opt`` is always the pool bytes a policy saved over those
``belady`` saved under instant loads at the same budget; ``belady`` runs only under instant
loads (its foresight is about hits, not about the CPU port's queue).

512-token blocks are 64 MiB for Llama-3-8B and 6 MiB for the small model: neither fits a pipe
(3-4 MiB). The default model is the small model with int4 KV (1.6 MiB per block), the largest chunk
of which a Tofino-1 pipe holds one (two at the 4 MiB estimated before the program
was compiled); larger budgets are marked ``fits_tofino1=no``
(hypothetical: a future switch or switch-attached memory).

Run: ``python -m experiments.q1_selection`` (``--quick`` for a smoke run). Writes
``q1_selection.csv`` and ``q1_selection.png`` under ``--out`` (default ``results/q1``) and
prints ``result q1 ...`` lines.

Functions:
    main: command line (:func:`~experiments.sim.report.tables_main`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from controlplane.policies import available_policies
from experiments.sim.cluster import ClusterSim
from experiments.sim.cluster_config import ClusterConfig
from experiments.sim.cluster_result import SimResult
from experiments.sim.hardware import MODELS, tofino1
from experiments.sim.report import Tables, describe, pyplot, result_line, save_figure, tables_main
from experiments.sim.workloads import WORKLOADS, make_workload

__all__ = ["main"]

MIB = 1 << 20
DEFAULT_OUT = Path("results/q1")


def _saved(base: float, value: float) -> float:
    return (base - value) / base if base else 0.0


def _simulate(args: argparse.Namespace, lines: list[str]) -> Tables:
    """Replays each workload unicast, multicast and with each policy and SRAM budget."""
    model = MODELS[args.model]
    base = ClusterConfig(hosts=args.hosts, model=model)
    policies = args.policies.split(",") if args.policies else list(available_policies())
    budgets = [int(float(b) * MIB) for b in args.budgets.split(",")]
    print(f"# q1: {describe(base)}", flush=True)
    print(f"# policies {policies}; budgets {budgets} B; load models {args.load}", flush=True)
    rows: list[dict[str, Any]] = []
    for wname in args.workloads.split(","):
        w = make_workload(
            wname, hosts=args.hosts, quick=args.quick, speedup=args.speedup, trace=args.trace
        )
        print(f"# {w.name}: {len(w.requests)} requests; {w.description}", flush=True)
        uni = ClusterSim(base.with_(fabric="unicast"), w).run()
        mc = ClusterSim(base.with_(fabric="multicast"), w).run()
        for label, r in (("none-unicast", uni), ("none-multicast", mc)):
            rows.append({"load": "-", "label": label, "budget_bytes": 0, **r.row()})
            lines.append(
                result_line(
                    "q1",
                    workload=w.name,
                    policy=label,
                    budget=0,
                    pool_egress_bytes=r.pool_egress_bytes,
                    fetch_mean_s=r.fetch_stat(-1),
                    ttft_mean_s=r.ttft_stat(-1),
                )
            )
        future = ClusterSim.network_stream(base, w) if "belady" in policies else None
        opt_saved: dict[int, float] = {}
        loads = sorted(args.load.split(","), key=lambda x: x != "instant")  # optimum first
        for load in loads:
            for budget in budgets:
                results: dict[str, SimResult] = {}
                for pol in policies:
                    if pol == "belady" and load != "instant":
                        continue  # its foresight is about hits, not about the CPU port's queue
                    cfg = base.with_(
                        fabric="kvcast",
                        policy=pol,
                        sram_bytes=budget,
                        instant_load=load == "instant",
                    )
                    results[pol] = ClusterSim(cfg, w, future=future).run()
                if "belady" in results:
                    opt_saved[budget] = mc.pool_egress_bytes - results["belady"].pool_egress_bytes
                for pol, r in results.items():
                    saved = mc.pool_egress_bytes - r.pool_egress_bytes
                    best = opt_saved.get(budget, 0.0)
                    ratio = saved / best if best > 0 else float("nan")
                    fields: dict[str, Any] = {
                        "workload": w.name,
                        "load": load,
                        "policy": pol,
                        "budget": budget,
                        "fits_tofino1": "yes" if budget <= base.switch.sram_bytes else "no",
                        "byte_hit": r.sram_byte_hit,
                        "pool_saved": _saved(mc.pool_egress_bytes, r.pool_egress_bytes),
                        "pool_saved_vs_unicast": _saved(uni.pool_egress_bytes, r.pool_egress_bytes),
                        "fetch_saved": _saved(mc.fetch_stat(-1), r.fetch_stat(-1)),
                        "fetch_p99_saved": _saved(mc.fetch_stat(99), r.fetch_stat(99)),
                        "ttft_saved": _saved(mc.ttft_stat(-1), r.ttft_stat(-1)),
                        "ratio_to_opt": ratio,
                        "admissions": r.admissions,
                        "write_packets": r.write_packets,
                        "load_wait_mean_s": r.load_wait_s / r.admissions if r.admissions else 0.0,
                    }
                    lines.append(result_line("q1", **fields))
                    rows.append(
                        {"label": pol, "budget_bytes": budget, **fields, **r.row(), "load": load}
                    )
    return {"q1_selection.csv": rows}


def _figures(tables: Tables, out: Path) -> list[Path]:
    png = out / "q1_selection.png"
    _plot(tables["q1_selection.csv"], png, tofino1().sram_bytes)
    return [png]


def _plot(rows: list[dict[str, Any]], path: Path, tofino_bytes: int) -> None:
    plt = pyplot()
    runs = [r for r in rows if r["load"] != "-"]
    keys = sorted({(r["workload"], r["load"]) for r in runs})
    if not keys:
        return
    fig, axes = plt.subplots(2, len(keys), figsize=(4.6 * len(keys), 7.5), squeeze=False)
    for col, (wname, load) in enumerate(keys):
        sel = [r for r in runs if r["workload"] == wname and r["load"] == load]
        for pol in sorted({r["policy"] for r in sel}):
            pts = sorted((r["budget"] / MIB, r) for r in sel if r["policy"] == pol)
            xs = [p[0] for p in pts]
            style = "k--" if pol == "belady" else "o-"
            axes[0][col].plot(xs, [100 * p[1]["pool_saved"] for p in pts], style, label=pol)
            axes[1][col].plot(xs, [100 * p[1]["fetch_saved"] for p in pts], style, label=pol)
        budgets = sorted({r["budget"] / MIB for r in sel})
        for ax in axes[:, col]:
            ax.axvline(tofino_bytes / MIB, color="grey", lw=0.8, ls=":")
            ax.set_xscale("log")
            ax.set_xticks(budgets, [f"{b:g}" for b in budgets])
            ax.minorticks_off()
            ax.grid(True, alpha=0.3)
        axes[0][col].set(title=f"{wname} ({load} load)", ylabel="pool egress saved (%)")
        axes[1][col].set(xlabel="SRAM budget (MiB; dotted: one Tofino-1 pipe)")
        axes[1][col].set(ylabel="mean fetch time saved (%)")
        axes[0][col].legend(fontsize=7)
    fig.suptitle("Q1: SRAM selection policies vs multicast-only, in the cluster model")
    save_figure(fig, path)


def _add_args(ap: argparse.ArgumentParser) -> None:
    """Q1's own options (beside ``--out``, ``--quick`` and ``--trace``)."""
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--policies", default="", help="comma-separated (default: every registered)")
    ap.add_argument("--budgets", default="4,16,64", help="SRAM budgets in MiB")
    ap.add_argument("--model", default="small-kv4", choices=sorted(MODELS))
    ap.add_argument("--hosts", type=int, default=1024)
    ap.add_argument("--speedup", type=float, default=1.0, help="divide arrival times by this")
    ap.add_argument("--load", default="queue,instant", help="SRAM load models to run")


main = tables_main("q1_selection", __doc__, DEFAULT_OUT, _add_args, _simulate, _figures)


if __name__ == "__main__":
    sys.exit(main())
