"""What one run of the cluster model measured.

Classes:
    SramEviction: one eviction decision of the switch's cache policy.
    SimResult: what one run of :class:`~experiments.sim.cluster.ClusterSim` measured, with
        ``row()`` for CSV.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from experiments.sim.cluster_config import POOL, SRAM, TIERS, ClusterConfig

__all__ = ["SimResult", "SramEviction"]


@dataclass(frozen=True, slots=True)
class SramEviction:
    """One eviction by the switch's cache policy.

    Attributes:
        time: when.
        index: position in the network access stream of the access that caused it.
        key: the chunk.
        demote: True for DEMOTE (the policy says value is left), False for DROP.
        residual: the policy's residual-value estimate.
    """

    time: float
    index: int
    key: int
    demote: bool
    residual: float


@dataclass
class SimResult:
    """What one run measured. Bytes are payload bytes unless named ``wire``.

    Attributes:
        config: the run's configuration.
        workload: workload name.
        requests: requests served.
        block_refs: block references.
        tier_refs: references served per tier (hbm, dram, sram, pool).
        tier_bytes: bytes served per tier.
        computed_blocks: blocks recomputed.
        recompute_tokens: prompt tokens prefilled.
        gpu_busy_s: GPU prefill seconds, all hosts.
        pool_egress_bytes: bytes the pool nodes sent (a multicast stream once, repairs included).
        pool_wire_bytes: the same on the wire (headers and framing included).
        unicast_pool_bytes: what the pool would have sent had every pool-served block been
            sent to each requester separately.
        coalesced_joins: requests that joined a stream already on its way.
        repair_bytes: bytes fetched by joiners for what they missed of a stream.
        net_refs: network accesses (SRAM or pool) the policy observed.
        sram_hit_bytes: bytes served from SRAM.
        admissions: SRAM loads.
        evictions: SRAM evictions.
        demotes: evictions the policy marked DEMOTE.
        write_packets: SRAM WRITE packets (every fragment, every pipe).
        load_wait_s: summed time from admission to loaded, over admissions (CPU-port queue).
        table_writes: cache-table writes (inserts and deletes).
        digests: hot-miss digests (exact per-window miss counts against the threshold).
        group_updates: multicast-group updates for coalesced streams.
        control_bytes: control-channel bytes (WRITE frames and messages, table writes,
            digests, group updates).
        pool_write_bytes: bytes written to the pool (write-through or demotion).
        pool_evictions: blocks the bounded pool evicted.
        host_evictions: blocks that left a host's last cache tier.
        host_demotions: host evictions written to the pool.
        hbm_to_dram: HBM victims moved down to DRAM (``exclusive``).
        dram_to_hbm: DRAM hits copied or moved up to HBM.
        fetch_s: per request (in workload order), arrival to all prefix KV present.
        ttft_s: per request (in workload order), arrival to first token (fetch, GPU queue,
            prefill).
        measured_from: requests before this index (the workload's warm-up) are left out of
            :meth:`fetch_stat` and :meth:`ttft_stat`.
        tier_time_s: per tier, summed over requests, time from arrival until that tier's part
            of the fetch was done.
        critical_s: per tier, summed fetch time of requests whose last part came from it.
        sram_evictions: every eviction decision (for value-left analysis).
        sram_admissions: (index in ``net_stream``, key) of every SRAM admission.
        net_stream: (time, key) of every network access, in order.
        host_evicted: (time, host, key) of every host eviction.
        flows: flows started.
        solves: max-min component solves.
        sim_end_s: simulated time when the last flow ended.
        wall_s: wall-clock time of the run.
    """

    config: ClusterConfig
    workload: str
    requests: int = 0
    block_refs: int = 0
    tier_refs: list[int] = field(default_factory=lambda: [0, 0, 0, 0])
    tier_bytes: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0, 0.0])
    computed_blocks: int = 0
    recompute_tokens: int = 0
    gpu_busy_s: float = 0.0
    pool_egress_bytes: float = 0.0
    pool_wire_bytes: float = 0.0
    unicast_pool_bytes: float = 0.0
    coalesced_joins: int = 0
    repair_bytes: float = 0.0
    net_refs: int = 0
    sram_hit_bytes: float = 0.0
    admissions: int = 0
    evictions: int = 0
    demotes: int = 0
    write_packets: int = 0
    load_wait_s: float = 0.0
    table_writes: int = 0
    digests: int = 0
    group_updates: int = 0
    control_bytes: float = 0.0
    pool_write_bytes: float = 0.0
    pool_evictions: int = 0
    host_evictions: int = 0
    host_demotions: int = 0
    hbm_to_dram: int = 0
    dram_to_hbm: int = 0
    fetch_s: np.ndarray = field(default_factory=lambda: np.zeros(0))
    ttft_s: np.ndarray = field(default_factory=lambda: np.zeros(0))
    measured_from: int = 0
    tier_time_s: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0, 0.0])
    critical_s: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0, 0.0])
    sram_evictions: list[SramEviction] = field(default_factory=list)
    sram_admissions: list[tuple[int, int]] = field(default_factory=list)
    net_stream: list[tuple[float, int]] = field(default_factory=list)
    host_evicted: list[tuple[float, int, int]] = field(default_factory=list)
    flows: int = 0
    solves: int = 0
    sim_end_s: float = 0.0
    wall_s: float = 0.0

    @property
    def net_bytes(self) -> float:
        """Bytes fetched over the network (SRAM and pool)."""
        return self.tier_bytes[SRAM] + self.tier_bytes[POOL]

    @property
    def sram_byte_hit(self) -> float:
        """Share of network-fetched bytes served from SRAM."""
        return self.sram_hit_bytes / self.net_bytes if self.net_bytes else 0.0

    def fetch_stat(self, q: float) -> float:
        """A percentile (0-100) of fetch time, or the mean for ``q < 0`` (warm-up left out)."""
        return _stat(self.fetch_s[self.measured_from :], q)

    def ttft_stat(self, q: float) -> float:
        """A percentile (0-100) of TTFT, or the mean for ``q < 0`` (warm-up left out)."""
        return _stat(self.ttft_s[self.measured_from :], q)

    def row(self) -> dict[str, Any]:
        """Scalar fields for a CSV row (configuration first, then measurements)."""
        cfg = self.config
        return {
            "workload": self.workload,
            "fabric": cfg.fabric,
            "policy": cfg.policy if cfg.uses_sram else "-",
            "model": cfg.model.name,
            "chunk_bytes": cfg.chunk_bytes,
            "sram_bytes": cfg.sram_budget if cfg.uses_sram else 0,
            "hosts": cfg.hosts,
            "pools": cfg.pools,
            "host_gbps": cfg.host_gbps,
            "pool_gbps": cfg.pool_gbps,
            "tier_rule": cfg.tier_rule,
            "pool_write": cfg.pool_write,
            "requests": self.requests,
            "block_refs": self.block_refs,
            **{f"{name}_refs": self.tier_refs[i] for i, name in enumerate(TIERS)},
            "computed_blocks": self.computed_blocks,
            **{f"{name}_bytes": self.tier_bytes[i] for i, name in enumerate(TIERS)},
            "pool_egress_bytes": self.pool_egress_bytes,
            "pool_wire_bytes": self.pool_wire_bytes,
            "unicast_pool_bytes": self.unicast_pool_bytes,
            "coalesced_joins": self.coalesced_joins,
            "repair_bytes": self.repair_bytes,
            "net_refs": self.net_refs,
            "sram_byte_hit": round(self.sram_byte_hit, 6),
            "admissions": self.admissions,
            "evictions": self.evictions,
            "demotes": self.demotes,
            "write_packets": self.write_packets,
            "load_wait_mean_s": self.load_wait_s / self.admissions if self.admissions else 0.0,
            "table_writes": self.table_writes,
            "digests": self.digests,
            "group_updates": self.group_updates,
            "control_bytes": self.control_bytes,
            "pool_write_bytes": self.pool_write_bytes,
            "pool_evictions": self.pool_evictions,
            "host_evictions": self.host_evictions,
            "host_demotions": self.host_demotions,
            "hbm_to_dram": self.hbm_to_dram,
            "dram_to_hbm": self.dram_to_hbm,
            "recompute_tokens": self.recompute_tokens,
            "gpu_busy_s": round(self.gpu_busy_s, 6),
            "fetch_mean_s": self.fetch_stat(-1),
            "fetch_p50_s": self.fetch_stat(50),
            "fetch_p99_s": self.fetch_stat(99),
            "ttft_mean_s": self.ttft_stat(-1),
            "ttft_p50_s": self.ttft_stat(50),
            "ttft_p99_s": self.ttft_stat(99),
            **{f"{name}_time_s": self.tier_time_s[i] for i, name in enumerate(TIERS)},
            **{f"{name}_critical_s": self.critical_s[i] for i, name in enumerate(TIERS)},
            "flows": self.flows,
            "solves": self.solves,
            "sim_end_s": self.sim_end_s,
            "wall_s": round(self.wall_s, 3),
        }


def _stat(a: np.ndarray, q: float) -> float:
    if a.size == 0:
        return math.nan
    return float(a.mean()) if q < 0 else float(np.percentile(a, q))
