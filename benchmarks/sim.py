"""Benchmark: the whole conversation trace through the cluster model on 1,024 hosts (target 60 s).

Each line is one full simulation of the Mooncake trace (12,031 requests) on 1,024 GPU hosts
and 16 pool nodes with the kvcast fabric (miss coalescing, multicast, SRAM under the ``kvcast``
policy): its wall time, the ratio of that time to the 60 s budget, and the model's work
(flows, max-min component solves, policy observations). Configurations: Llama-3-8B (64 MiB
blocks: nothing fits the SRAM) and the small model with int4 KV (1.6 MiB blocks: the SRAM path,
WRITE loads and evictions are exercised); full runs add the trace sped up 100x (more concurrent
flows per max-min solve). ``--quick`` runs the first configuration only, still on the whole
trace.

Functions:
    run: the suite entry point (prints ``bench sim ...`` lines).
"""

from __future__ import annotations

import time

from benchmarks import bench_line
from experiments.sim.cluster import ClusterSim
from experiments.sim.cluster_config import ClusterConfig
from experiments.sim.hardware import MODELS
from experiments.sim.workloads import load_trace
from experiments.traces import default_trace_path

__all__ = ["run"]

BUDGET_S = 60.0
HOSTS = 1024


def run(quick: bool = False) -> list[str]:
    """Simulate the whole trace at 1,024 hosts and time it.

    Args:
        quick: one configuration instead of three.

    Returns:
        The printed ``bench sim`` lines (none when the trace is not found).
    """
    if default_trace_path() is None:
        print("# no trace: data/traces/ is missing and KVCAST_TRACE unset; skipping", flush=True)
        return []
    cases = [("llama3-8b", 1.0), ("small-kv4", 1.0), ("llama3-8b", 100.0)]
    if quick:
        cases = cases[:1]
    lines = []
    for model, speedup in cases:
        t0 = time.perf_counter()
        w = load_trace(hosts=HOSTS, speedup=speedup)
        r = ClusterSim(ClusterConfig(hosts=HOSTS, model=MODELS[model], fabric="kvcast"), w).run()
        wall = time.perf_counter() - t0
        line = bench_line(
            "sim",
            workload=w.name,
            requests=r.requests,
            hosts=HOSTS,
            model=model,
            fabric="kvcast",
            flows=r.flows,
            solves=r.solves,
            net_refs=r.net_refs,
            wall_s=round(wall, 2),
            ratio_to_60s=round(wall / BUDGET_S, 3),
        )
        print(line, flush=True)
        lines.append(line)
    return lines
