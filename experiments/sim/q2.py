"""Q2: tiers (GPU HBM, host DRAM, the remote pool, switch SRAM): when does a chunk move?

The cluster model has four places a block's KV can come from, fastest first: the host's HBM
prefix cache (no transfer), its DRAM (PCIe to HBM), the switch SRAM (over the host's NIC, one
``FRAG_BYTES`` fragment per packet) and the DRAM pool (over the pool node's and the host's NIC,
jumbo frames), else the block is recomputed. Movement rules compared (``tier_rule``):

* ``hbm-only``: a block used is kept in HBM (LRU); HBM victims are dropped.
* ``inclusive``: a block used is kept in HBM and in DRAM (both LRU); DRAM hits are copied up.
* ``exclusive``: a block used moves to HBM; HBM victims move down to DRAM (LRU); DRAM hits move
  up.

Every run writes computed blocks through to the pool (Mooncake's behaviour) and lets the
switch's ``kvcast`` policy promote chunks to SRAM (on distinct-host reuse per byte, with
hysteresis); a chunk leaves SRAM when the policy evicts it (the pool still has it). Hosts,
routing and DRAM size change which tier serves: the trace is replayed on 64 and 1,024 hosts
with random and conversation-affinity routing, the agentic workload on the same host counts,
each with 16 GiB of HBM and 32 or 256 GiB of DRAM per host for the prefix cache.

Reported per run: the share of block references and of bytes each tier served, and the share
of fetch time: ``time`` sums, per tier, the time from arrival until that tier's part of a
request was done; ``critical`` gives each request's whole fetch time to the tier that finished
last. Also the moves (DRAM to HBM, HBM to DRAM, host evictions), fetch time and TTFT.

Run: ``python -m experiments.q2_tiers`` (``--quick`` for a smoke run). Writes ``q2_tiers.csv``
and ``q2_tiers.png`` under ``--out`` (default ``results/q2``) and prints ``result q2 ...``.

Functions:
    main: command line (:func:`~experiments.sim.report.tables_main`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from experiments.sim.cluster import ClusterSim
from experiments.sim.cluster_config import TIER_RULES, TIERS, ClusterConfig
from experiments.sim.hardware import MODELS
from experiments.sim.report import Tables, describe, pyplot, result_line, save_figure, tables_main
from experiments.sim.workloads import make_workload

__all__ = ["main"]

DEFAULT_OUT = Path("results/q2")
_KINDS = ("hbm", "dram", "sram", "pool", "recompute")


def _variants(args: argparse.Namespace) -> list[tuple[str, str, int]]:
    """(workload, host mapping, hosts) triples."""
    out = []
    for hosts in (int(h) for h in args.hosts.split(",")):
        for wname in args.workloads.split(","):
            mappings = args.mappings.split(",") if wname == "conversation" else ["-"]
            out += [(wname, m, hosts) for m in mappings]
    return out


def _simulate(args: argparse.Namespace, lines: list[str]) -> Tables:
    """Replays each workload, routing and host count for each model, DRAM size and tier rule."""
    rows: list[dict[str, Any]] = []
    models = args.models.split(",")
    rules = args.rules.split(",")
    first = True
    for wname, mapping, hosts in _variants(args):
        w = make_workload(
            wname,
            hosts=hosts,
            quick=args.quick,
            mapping=mapping if mapping != "-" else "random",
            trace=args.trace,
        )
        grid = [
            (mname, dram, rule)
            for mname in models
            for dram in (float(d) for d in args.dram_gib.split(","))
            for rule in rules
        ]
        for mname, dram, rule in grid:
            cfg = ClusterConfig(
                hosts=hosts,
                model=MODELS[mname],
                tier_rule=rule,
                hbm_cache_gib=args.hbm_gib,
                dram_cache_gib=dram,
                fabric="kvcast",
                policy="kvcast",
            )
            if first:
                print(f"# q2: {describe(cfg)}", flush=True)
                first = False
            r = ClusterSim(cfg, w).run()
            refs = [*r.tier_refs, r.computed_blocks]
            total_refs = sum(refs) or 1
            tier_time = sum(r.tier_time_s) or 1.0
            crit = sum(r.critical_s) or 1.0
            net_bytes = sum(r.tier_bytes) or 1.0
            fields: dict[str, Any] = {
                "workload": wname,
                "mapping": mapping,
                "hosts": hosts,
                "model": mname,
                "dram_gib": dram,
                "rule": rule,
                **{f"refs_{k}": refs[i] / total_refs for i, k in enumerate(_KINDS)},
                **{f"bytes_{k}": r.tier_bytes[i] / net_bytes for i, k in enumerate(TIERS)},
                **{f"time_{k}": r.tier_time_s[i] / tier_time for i, k in enumerate(TIERS)},
                **{f"critical_{k}": r.critical_s[i] / crit for i, k in enumerate(TIERS)},
                "dram_to_hbm": r.dram_to_hbm,
                "hbm_to_dram": r.hbm_to_dram,
                "host_evictions": r.host_evictions,
                "sram_admissions": r.admissions,
                "fetch_mean_s": r.fetch_stat(-1),
                "ttft_mean_s": r.ttft_stat(-1),
                "ttft_p99_s": r.ttft_stat(99),
                "gpu_busy_s": r.gpu_busy_s,
            }
            lines.append(result_line("q2", **fields))
            rows.append({**fields, **r.row()})
    return {"q2_tiers.csv": rows}


def _figures(tables: Tables, out: Path) -> list[Path]:
    png = out / "q2_tiers.png"
    _plot(tables["q2_tiers.csv"], png)
    return [png]


def _plot(rows: list[dict[str, Any]], path: Path) -> None:
    plt = pyplot()
    labels = [
        f"{r['workload'][:4]}{'' if r['mapping'] == '-' else '/' + r['mapping'][:4]} "
        f"{r['hosts']}h {r['model']} D{r['dram_gib']:g} {r['rule']}"
        for r in rows
    ]
    fig, axes = plt.subplots(1, 2, figsize=(15, 0.32 * len(rows) + 2.5), squeeze=False)
    colors = {"hbm": "C2", "dram": "C0", "sram": "C3", "pool": "C1", "recompute": "0.6"}
    for ax, prefix, kinds, title in (
        (axes[0][0], "refs_", _KINDS, "block references served by"),
        (axes[0][1], "critical_", TIERS, "fetch time (critical tier)"),
    ):
        left = [0.0] * len(rows)
        for k in kinds:
            vals = [100 * r[prefix + k] for r in rows]
            ax.barh(labels, vals, left=left, color=colors[k], label=k)
            left = [a + b for a, b in zip(left, vals, strict=True)]
        ax.set(xlabel="%", title=f"Q2: {title}")
        ax.invert_yaxis()
        ax.legend(fontsize=8, loc="lower right")
        ax.tick_params(axis="y", labelsize=7)
    axes[0][1].set_yticklabels([])
    save_figure(fig, path)


def _add_args(ap: argparse.ArgumentParser) -> None:
    """Q2's own options (beside ``--out``, ``--quick`` and ``--trace``)."""
    ap.add_argument("--workloads", default="conversation,agentic")
    ap.add_argument("--mappings", default="random,affinity", help="trace host mappings")
    ap.add_argument("--hosts", default="64,1024", help="comma-separated cluster sizes")
    ap.add_argument("--models", default="llama3-8b,small-kv4")
    ap.add_argument("--rules", default=",".join(TIER_RULES))
    ap.add_argument("--hbm-gib", type=float, default=16.0, help="HBM prefix cache per host")
    ap.add_argument("--dram-gib", default="32,256", help="DRAM prefix cache per host (GiB)")


main = tables_main("q2_tiers", __doc__, DEFAULT_OUT, _add_args, _simulate, _figures)


if __name__ == "__main__":
    sys.exit(main())
