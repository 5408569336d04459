"""Q3: eviction. What value is left in an evicted chunk, and is demoting better than dropping?

Part ``sram``: every online policy of the registry runs as the switch's SRAM policy (small
model with int4 KV, budgets of one and four Tofino-1 pipes, loads instant so that only the
policy's choices count). For each eviction, the *value left* is the number of network accesses
to that chunk after the eviction up to and including its next admission (or to the end): each
of them would have been an SRAM hit had the chunk stayed. The policy labels each eviction DEMOTE
(value left, by its own residual estimate) or DROP; reported per label: how many, the share with
value left (precision of DEMOTE, regret of DROP), mean value left, and the share of all value
left that DEMOTE caught (recall). For the SRAM, demoting costs nothing: the switch caches pool
chunks, so a demoted chunk is still in the pool.

Part ``demote``: where demotion costs bytes. A bounded pool (LRU per node) behind hosts with
HBM and DRAM caches, on 64 hosts so that host caches do evict; what happens to a block leaving
a host's last tier (``pool_write``):

* ``none``: dropped (there is no pool; every miss is recomputed);
* ``demote``: written to the pool (if absent) when it leaves the host;
* ``demote-value``: written only when the ``kvcast`` policy's residual-value estimator (fed every
  block reference) says at least ``demote_threshold`` (about one access per half-life) is left;
* ``through``: every computed block is written at prefill (Mooncake), evictions drop.

Reported: recompute (GPU seconds, tokens), pool write bytes (the cost), pool hits, TTFT, and
the value left in host evictions (share re-accessed later by any host, by the same host).

Run: ``python -m experiments.q3_eviction`` (``--quick`` for a smoke run). Writes
``q3_sram.csv``, ``q3_demote.csv`` and ``q3_eviction.png`` under ``--out`` (default
``results/q3``) and prints ``result q3 ...`` lines.

Functions:
    value_left: future hits lost per SRAM eviction.
    host_value_left: later re-accesses of blocks that left a host.
    main: command line (:func:`~experiments.sim.report.tables_main`).
"""

from __future__ import annotations

import argparse
import bisect
import sys
from pathlib import Path
from typing import Any

from controlplane.policies import available_policies
from experiments.sim.cluster import ClusterSim
from experiments.sim.cluster_config import ClusterConfig
from experiments.sim.cluster_result import SimResult
from experiments.sim.hardware import MODELS
from experiments.sim.report import Tables, describe, pyplot, result_line, save_figure, tables_main
from experiments.sim.workloads import SimWorkload, make_workload

__all__ = ["host_value_left", "main", "value_left"]

MIB = 1 << 20
DEFAULT_OUT = Path("results/q3")
POOL_MODES = ("none", "demote", "demote-value", "through")


def value_left(r: SimResult) -> list[int]:
    """Future SRAM hits lost by each eviction of a run recorded with ``record_streams``.

    Args:
        r: the run.

    Returns:
        One count per entry of ``r.sram_evictions``: accesses to the chunk after the eviction,
        up to and including its next admission (all later accesses when never re-admitted).
    """
    accesses: dict[int, list[int]] = {}
    for i, (_, key) in enumerate(r.net_stream):
        accesses.setdefault(key, []).append(i)
    admissions: dict[int, list[int]] = {}
    for i, key in r.sram_admissions:
        admissions.setdefault(key, []).append(i)
    out = []
    for ev in r.sram_evictions:
        adm = admissions.get(ev.key, [])
        j = bisect.bisect_right(adm, ev.index)
        end = adm[j] if j < len(adm) else len(r.net_stream)
        acc = accesses.get(ev.key, [])
        out.append(bisect.bisect_right(acc, end) - bisect.bisect_right(acc, ev.index))
    return out


def host_value_left(r: SimResult, w: SimWorkload) -> tuple[float, float]:
    """Value left in blocks that left a host's caches.

    Args:
        r: a run recorded with ``record_streams``.
        w: its workload.

    Returns:
        (share of host evictions whose block some host used again later, share the same host
        used again later); (0, 0) without evictions.
    """
    if not r.host_evicted:
        return 0.0, 0.0
    times: dict[int, list[float]] = {}
    by_host: dict[tuple[int, int], list[float]] = {}
    for req in w.requests:
        for key in req.blocks:
            times.setdefault(key, []).append(req.time)
            by_host.setdefault((req.host, key), []).append(req.time)
    any_host = same_host = 0
    for t, h, key in r.host_evicted:
        ts = times.get(key, [])
        any_host += bisect.bisect_right(ts, t) < len(ts)
        hs = by_host.get((h, key), [])
        same_host += bisect.bisect_right(hs, t) < len(hs)
    n = len(r.host_evicted)
    return any_host / n, same_host / n


def _sram_part(args: argparse.Namespace, lines: list[str]) -> list[dict[str, Any]]:
    model = MODELS[args.model]
    rows: list[dict[str, Any]] = []
    budgets = [int(float(b) * MIB) for b in args.budgets.split(",")]
    for wname in args.workloads.split(","):
        w = make_workload(wname, hosts=args.hosts, quick=args.quick, trace=args.trace)
        for budget in budgets:
            for pol in available_policies(include_offline=False):
                cfg = ClusterConfig(
                    hosts=args.hosts,
                    model=model,
                    fabric="kvcast",
                    policy=pol,
                    sram_bytes=budget,
                    instant_load=True,
                )
                r = ClusterSim(cfg, w, record_streams=True).run()
                left = value_left(r)
                stats: dict[str, Any] = {}
                for label, want in (("demote", True), ("drop", False)):
                    vals = [
                        v for v, ev in zip(left, r.sram_evictions, strict=True) if ev.demote == want
                    ]
                    stats[f"{label}s"] = len(vals)
                    stats[f"{label}_reused"] = sum(v > 0 for v in vals) / len(vals) if vals else 0.0
                    stats[f"{label}_value_mean"] = sum(vals) / len(vals) if vals else 0.0
                    stats[f"{label}_value"] = sum(vals)
                total = sum(left)
                fields: dict[str, Any] = {
                    "part": "sram",
                    "workload": w.name,
                    "policy": pol,
                    "budget": budget,
                    "evictions": len(left),
                    "value_left_hits": total,
                    "value_left_bytes": total * cfg.chunk_bytes,
                    "value_left_per_eviction": total / len(left) if left else 0.0,
                    "demote_recall": stats["demote_value"] / total if total else 0.0,
                    "demote_precision": stats["demote_reused"],
                    "drop_regret": stats["drop_reused"],
                    **{k: v for k, v in stats.items() if k not in ("demote_value", "drop_value")},
                    "sram_hits": r.tier_refs[2],
                    "byte_hit": r.sram_byte_hit,
                }
                lines.append(result_line("q3", **fields))
                rows.append(fields)
    return rows


def _demote_part(args: argparse.Namespace, lines: list[str]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    pool_sizes: list[float | None] = [
        None if p == "inf" else float(p) for p in args.pool_gib.split(",")
    ]
    for wname in args.workloads.split(","):
        w = make_workload(wname, hosts=args.demote_hosts, quick=args.quick, trace=args.trace)
        for pool_gib in pool_sizes:
            for mode in POOL_MODES:
                cfg = ClusterConfig(
                    hosts=args.demote_hosts,
                    model=MODELS["llama3-8b"],
                    fabric="multicast",
                    hbm_cache_gib=args.hbm_gib,
                    dram_cache_gib=args.dram_gib,
                    pool_gib=pool_gib,
                    pool_write=mode,
                )
                if not rows:
                    print(f"# q3 demote part: {describe(cfg)}", flush=True)
                r = ClusterSim(cfg, w, record_streams=True).run()
                any_host, same_host = host_value_left(r, w)
                fields: dict[str, Any] = {
                    "part": "demote",
                    "workload": w.name,
                    "pool_gib": "inf" if pool_gib is None else pool_gib,
                    "pool_write": mode,
                    "recompute_gpu_s": r.gpu_busy_s,
                    "recompute_tokens": r.recompute_tokens,
                    "pool_hits": r.tier_refs[3],
                    "pool_write_bytes": r.pool_write_bytes,
                    "pool_evictions": r.pool_evictions,
                    "host_evictions": r.host_evictions,
                    "host_demotions": r.host_demotions,
                    "evicted_reused_any_host": any_host,
                    "evicted_reused_same_host": same_host,
                    "ttft_mean_s": r.ttft_stat(-1),
                    "ttft_p99_s": r.ttft_stat(99),
                }
                lines.append(result_line("q3", **fields))
                rows.append({**fields, **r.row()})
    return rows


def _simulate(args: argparse.Namespace, lines: list[str]) -> Tables:
    """The parts in ``args.parts`` (``sram``, ``demote``), a table each."""
    tables: Tables = {}
    if "sram" in args.parts:
        tables["q3_sram.csv"] = _sram_part(args, lines)
    if "demote" in args.parts:
        tables["q3_demote.csv"] = _demote_part(args, lines)
    return tables


def _figures(tables: Tables, out: Path) -> list[Path]:
    png = out / "q3_eviction.png"
    _plot(tables.get("q3_sram.csv", []), tables.get("q3_demote.csv", []), png)
    return [png]


def _plot(sram: list[dict[str, Any]], demote: list[dict[str, Any]], path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))
    labels = [f"{r['workload'][:5]} {r['budget'] // MIB}M {r['policy']}" for r in sram]
    x = range(len(sram))
    axes[0].bar([i - 0.2 for i in x], [r["demote_value_mean"] for r in sram], 0.4, label="DEMOTE")
    axes[0].bar([i + 0.2 for i in x], [r["drop_value_mean"] for r in sram], 0.4, label="DROP")
    axes[0].set_xticks(list(x), labels, rotation=70, fontsize=7)
    axes[0].set(ylabel="future hits lost per eviction", title="SRAM: value left, by label")
    axes[0].legend(fontsize=8)
    keys = sorted(
        {(r["workload"], str(r["pool_gib"])) for r in demote},
        key=lambda k: (k[0], float(k[1])),  # "inf" sorts last
    )
    width = 0.8 / max(1, len(POOL_MODES))
    for j, mode in enumerate(POOL_MODES):
        gpu = []
        wr = []
        for wname, pool in keys:
            match = [r for r in demote if (r["workload"], str(r["pool_gib"])) == (wname, pool)]
            sel = [r for r in match if r["pool_write"] == mode]
            gpu.append(sel[0]["recompute_gpu_s"] if sel else 0.0)
            wr.append(sel[0]["pool_write_bytes"] / 2**40 if sel else 0.0)
        xs = [i + (j - 1.5) * width for i in range(len(keys))]
        axes[1].bar(xs, gpu, width, label=mode)
        axes[2].bar(xs, wr, width, label=mode)
    ticks = [f"{wname[:5]} pool {pool} GiB/node" for wname, pool in keys]
    for ax in axes[1:]:
        ax.set_xticks(range(len(keys)), ticks, rotation=20, fontsize=7)
        ax.legend(fontsize=8)
    axes[1].set(ylabel="GPU prefill seconds (all hosts)", title="demote vs drop: recompute")
    axes[2].set(ylabel="TiB written to the pool", title="demote vs drop: cost")
    save_figure(fig, path)


def _add_args(ap: argparse.ArgumentParser) -> None:
    """Q3's own options (beside ``--out``, ``--quick`` and ``--trace``)."""
    ap.add_argument("--parts", default="sram,demote")
    ap.add_argument("--workloads", default="conversation,agentic")
    ap.add_argument("--model", default="small-kv4", choices=sorted(MODELS), help="SRAM part")
    ap.add_argument("--budgets", default="4,16", help="SRAM budgets in MiB (SRAM part)")
    ap.add_argument("--hosts", type=int, default=1024, help="hosts (SRAM part)")
    ap.add_argument("--demote-hosts", type=int, default=64, help="hosts (demote part)")
    ap.add_argument("--hbm-gib", type=float, default=16.0, help="HBM cache (demote part)")
    ap.add_argument("--dram-gib", type=float, default=64.0, help="DRAM cache (demote part)")
    ap.add_argument("--pool-gib", default="64,256,inf", help="DRAM per pool node, inf = unbounded")


main = tables_main("q3_eviction", __doc__, DEFAULT_OUT, _add_args, _simulate, _figures)


if __name__ == "__main__":
    sys.exit(main())
