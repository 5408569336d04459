"""What one run of the cluster model is given: its knobs, and the names they take.

Classes:
    ClusterConfig: every knob of one run of :class:`~experiments.sim.cluster.ClusterSim`,
        with the defaults the experiments use.

Constants:
    FABRICS: what the switch does per fabric name.
    TIER_RULES, POOL_WRITES: allowed values of those knobs.
    TIERS: tier names by index (hbm, dram, sram, pool); HBM, DRAM, SRAM, POOL are the indices.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from experiments.sim.hardware import H100, MODELS, GpuSpec, KVModel, SwitchSpec, WireFormat, tofino1

__all__ = [
    "DRAM",
    "FABRICS",
    "HBM",
    "POOL",
    "POOL_WRITES",
    "SRAM",
    "TIERS",
    "TIER_RULES",
    "ClusterConfig",
]

HBM, DRAM, SRAM, POOL = 0, 1, 2, 3
TIERS = ("hbm", "dram", "sram", "pool")

FABRICS: dict[str, tuple[bool, bool]] = {
    "unicast": (False, False),
    "multicast": (True, False),
    "kvcast": (True, True),
    "sram": (False, True),
}
"""fabric -> (coalesce pool misses and multicast them, cache chunks in switch SRAM).

``unicast`` is today's pool (every host pulls its own copy), ``multicast`` adds miss coalescing
and multicast, ``kvcast`` adds the SRAM cache, ``sram`` is SRAM without coalescing."""

TIER_RULES = ("inclusive", "exclusive", "hbm-only")
POOL_WRITES = ("through", "demote", "demote-value", "none")


@dataclass(frozen=True)
class ClusterConfig:
    """One run's knobs.

    Attributes:
        hosts: GPU hosts.
        hosts_per_rack: hosts per leaf switch.
        pools: DRAM pool nodes.
        host_gbps: host NIC rate.
        pool_gbps: pool node NIC rate.
        rack_oversub: leaf oversubscription (1: non-blocking, rack links not modelled).
        pcie_gbytes: host DRAM to HBM bandwidth in GB/s (H100 PCIe Gen5 x16: 64 GB/s peak;
            50 assumed achievable).
        hbm_cache_gib: HBM per host set aside for the prefix cache.
        dram_cache_gib: host DRAM per host for the prefix cache.
        pool_gib: DRAM per pool node (None: unbounded, the pool never evicts).
        fabric: a key of :data:`FABRICS`.
        policy: registered cache-policy name (for fabrics with SRAM).
        policy_params: extra policy constructor parameters.
        sram_bytes: SRAM budget (None: the switch's per-pipe SRAM).
        tier_rule: one of :data:`TIER_RULES`.
        pool_write: one of :data:`POOL_WRITES`.
        demote_threshold: residual value at which ``demote-value`` writes a victim to the pool.
        model: KV model (chunk size, prefill cost).
        gpu: GPU prefill throughput.
        switch: the caching switch.
        wire: framing on the cluster's links.
        block_tokens: tokens per block.
        pool_latency_s: fixed latency of a pool fetch (request, DRAM read, first byte).
        sram_latency_s: fixed latency of a switch-served fetch (one round trip to the switch).
        extra_hop_s: latency added to every network fetch when the switch does anything
            beyond forwarding (an off-path appliance); 0 when it is the pool leaf.
        digest_window_s: the control plane's sketch window.
        pipeline_limit: model the switch pipeline's packet rate for SRAM-served fragments.
        instant_load: SRAM loads take no time (the policy-only view); by default loads queue
            behind each other on the CPU port, each taking ``SwitchSpec.load_s``.
    """

    hosts: int = 1024
    hosts_per_rack: int = 32
    pools: int = 16
    host_gbps: float = 200.0
    pool_gbps: float = 200.0
    rack_oversub: float = 1.0
    pcie_gbytes: float = 50.0
    hbm_cache_gib: float = 16.0
    dram_cache_gib: float = 256.0
    pool_gib: float | None = None
    fabric: str = "kvcast"
    policy: str = "kvcast"
    policy_params: Mapping[str, Any] = field(default_factory=dict)
    sram_bytes: int | None = None
    tier_rule: str = "inclusive"
    pool_write: str = "through"
    demote_threshold: float = 1.0
    model: KVModel = MODELS["llama3-8b"]
    gpu: GpuSpec = H100
    switch: SwitchSpec = field(default_factory=tofino1)
    wire: WireFormat = WireFormat()
    block_tokens: int = 512
    pool_latency_s: float = 50e-6
    sram_latency_s: float = 5e-6
    extra_hop_s: float = 0.0
    digest_window_s: float = 1.0
    pipeline_limit: bool = True
    instant_load: bool = False

    def __post_init__(self) -> None:
        if self.fabric not in FABRICS:
            raise ValueError(f"unknown fabric {self.fabric!r}; known: {', '.join(FABRICS)}")
        if self.tier_rule not in TIER_RULES:
            raise ValueError(f"unknown tier rule {self.tier_rule!r}; known: {TIER_RULES}")
        if self.pool_write not in POOL_WRITES:
            raise ValueError(f"unknown pool write rule {self.pool_write!r}; known: {POOL_WRITES}")
        if self.hosts <= 0 or self.pools <= 0 or self.hosts_per_rack <= 0:
            raise ValueError("hosts, pools and hosts_per_rack must be positive")

    @property
    def chunk_bytes(self) -> int:
        """Bytes of one block's KV."""
        return self.model.chunk_bytes(self.block_tokens)

    @property
    def sram_budget(self) -> int:
        """SRAM budget in bytes."""
        return self.switch.sram_bytes if self.sram_bytes is None else self.sram_bytes

    @property
    def coalesce(self) -> bool:
        """Whether pool misses are coalesced and multicast."""
        return FABRICS[self.fabric][0]

    @property
    def uses_sram(self) -> bool:
        """Whether the switch caches chunks."""
        return FABRICS[self.fabric][1]

    def with_(self, **changes: Any) -> ClusterConfig:
        """A copy with some fields changed."""
        return replace(self, **changes)
