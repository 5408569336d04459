"""What the controller holds of each switch and of the chunks it has heard of.

Constants:
    OBSERVER_HOST: the policy host id of accesses no host reported (counters, digests).
    MAX_TRACKED_KEYS: the bound of every per-key table the daemon keeps.

Classes:
    KeyInfo: one chunk the controller has heard of (tenant, length, last report).
    KeyTable: those chunks, least recently heard of dropped first.
    HitAccount: counter-derived hits of one loaded chunk.
    TickSummary: what one tick did on one switch.
    TickStep: the base of a tick's steps (intake of a switch's accesses, apply): what they share.
    SwitchRuntime: one switch: its client and drivers, its policy, and what the controller
        tracks of it; it installs the configured base state on each session (a private driver)
        and keeps its gauges.

Functions:
"""

from __future__ import annotations

import collections
import logging
from dataclasses import dataclass, field
from typing import Any

from controlplane.admission import ReuseAdmission
from controlplane.chunksource import ChunkSource
from controlplane.configspec import DaemonConfig, SwitchSpec
from controlplane.drivers import (
    ChunkId,
    EpochClock,
    ForwardingDriver,
    FragmentLoader,
    HostEndpoint,
    HotMiss,
    MulticastDriver,
    PoolNode,
    PoolOwnerDriver,
    Route,
    SketchDriver,
    StatsDriver,
)
from controlplane.drivers.cache_table import ACTION_HIT
from controlplane.metrics import ControllerMetrics
from controlplane.p4rt import SessionInfo, SwitchClient, SwitchConfig
from controlplane.policies import Access, CachePolicy, make_policy
from controlplane.push import PushPlan, PushPlanner
from kvcast import p4constants as c
from kvcast.fabric import FabricPlan
from kvcast.kvclass import KV_CLASS_NAMES

__all__ = [
    "MAX_TRACKED_KEYS",
    "OBSERVER_HOST",
    "HitAccount",
    "KeyInfo",
    "KeyTable",
    "SwitchRuntime",
    "TickStep",
    "TickSummary",
]

_LOG = logging.getLogger("controlplane.daemon")

OBSERVER_HOST = -1
"""Policy host id of accesses that only the switch saw (hit counters, digests, adoption)."""

MAX_TRACKED_KEYS = 1 << 20
"""The bound of every per-key table the daemon keeps (keys, doorkeeper, reuse, pushes)."""


@dataclass
class KeyInfo:
    """One chunk the controller has heard of.

    Attributes:
        tenant: its tenant.
        nbytes: its exact length, None when only the SRAM footprint is known.
        last_report: when a host last reported using it.
    """

    tenant: int
    nbytes: int | None
    last_report: float = float("-inf")


class KeyTable:
    """The chunks the controller has heard of, the least recently heard of dropped first.

    Args:
        max_keys: how many it keeps.
    """

    def __init__(self, max_keys: int = MAX_TRACKED_KEYS) -> None:
        self._keys: collections.OrderedDict[int, KeyInfo] = collections.OrderedDict()
        self._max_keys = max_keys

    def __len__(self) -> int:
        return len(self._keys)

    def get(self, key: int) -> KeyInfo | None:
        """What is known of ``key`` (None: nothing)."""
        return self._keys.get(key)

    def remember(self, key: int, tenant: int, nbytes: int | None, reported: float | None) -> None:
        """Notes ``key``'s tenant, its length when known, and a report's time when given."""
        info = self._keys.get(key)
        if info is None:
            info = KeyInfo(tenant, nbytes)
            self._keys[key] = info
            if len(self._keys) > self._max_keys:
                self._keys.popitem(last=False)
        else:
            self._keys.move_to_end(key)
            info.tenant = tenant
            if nbytes is not None:
                info.nbytes = nbytes
        if reported is not None:
            info.last_report = max(info.last_report, reported)


@dataclass
class HitAccount:
    """Counter-derived hits of one loaded chunk (one load: one epoch)."""

    epoch: int
    frags_now: int = 0  # fragments served, as read this tick
    frags_lagged: int = 0  # as read the tick before (reports had a tick to arrive)
    reported: int = 0  # hit=True reports for this load
    emitted: int = 0  # fetches already turned into observer accesses


@dataclass
class TickSummary:
    """What one tick did on one switch.

    Attributes:
        switch: the switch.
        accesses: accesses recorded in the policy, by source.
        admitted: admissions the policy decided.
        evicted: evictions the policy decided, by action.
        loaded: chunks loaded into SRAM.
        unloaded: chunks removed from SRAM, by action.
        skipped: admissions not loaded, by reason.
        errors: switch errors met.
        applied: whether decisions were applied (False: dry run, or switch not ready).
    """

    switch: str
    accesses: dict[str, int] = field(default_factory=dict)
    admitted: int = 0
    evicted: dict[str, int] = field(default_factory=dict)
    loaded: int = 0
    unloaded: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)
    errors: int = 0
    applied: bool = False


class TickStep:
    """A step of the tick, with what every step reads.

    Args:
        config: the configuration.
        metrics: where to count.
        keys: the chunks the controller has heard of (their tenant and length).
        source: where chunk bytes and lengths come from (and where DEMOTEd chunks go back).
    """

    def __init__(
        self,
        config: DaemonConfig,
        metrics: ControllerMetrics,
        keys: KeyTable,
        source: ChunkSource,
    ) -> None:
        self._config = config
        self._metrics = metrics
        self._keys = keys
        self._source = source


class _BaseState:
    """A driver that installs the configured base state: routes, pool owners, replica hosts.

    Registered after the forwarding, pool-owner and multicast drivers, so each session first
    reconciles their tables to what they hold and then (re)states the configuration; writing an
    entry the driver already holds sends nothing.
    """

    def __init__(self, rt: SwitchRuntime) -> None:
        self._rt = rt

    async def reinstall(self, session: SessionInfo) -> None:
        rt = self._rt
        cfg = rt.config
        spec = rt.spec
        if spec.program_forwarding:
            for host in cfg.hosts_of(spec.name):
                await rt.forwarding.add_route(
                    Route(f"{host.ip}/32", host.port, spec.router_mac, host.mac)
                )
                await rt.forwarding.add_l2(host.mac, host.port)
                await rt.forwarding.bind_host(host.port, host.ip, host.tenants)
            for pool in cfg.pools_of(spec.name):
                assert pool.mac is not None and pool.port is not None  # checked by the config
                await rt.forwarding.add_route(
                    Route(f"{pool.ip}/32", pool.port, spec.router_mac, pool.mac)
                )
                await rt.forwarding.add_l2(pool.mac, pool.port)
                await rt.forwarding.set_port_role(pool.port, c.PORT_ROLE_POOL)
            if rt.plan is not None:
                await rt.fabric_routes()
            if spec.deny_unknown_ports:
                await rt.forwarding.deny_unknown_ports(True)
        # Tofino: every pipe stores each WRITE, which comes back in on the pipe's fan-out port.
        for port in spec.fanout_ports:
            await rt.forwarding.set_port_role(port, c.PORT_ROLE_FANOUT)
        await rt.pool_owner.set_nodes(PoolNode(p.name, p.ip) for p in cfg.pools)
        await rt.multicast.set_write_fanout(spec.fanout_ports)
        for host in cfg.hosts_of(spec.name):
            await rt.multicast.add_host(
                HostEndpoint(host.name, host.port, host.mac, host.ip, host.udp_port)
            )
        _LOG.info(
            "base state installed",
            extra={
                "event": "session",
                "switch": spec.name,
                "generation": session.generation,
                "pipeline_pushed": session.pipeline_pushed,
                "cache_entries": len(rt.loader.resident()),
            },
        )


class SwitchRuntime:
    """One switch: its client and drivers, its policy, and what the controller tracks of it.

    Args:
        spec: the switch.
        config: the whole configuration.
        metrics: where to count.
        plan: the fabric's plan, shared by every switch of the fabric (which spines are in
            service is its state), or None without a fabric.
    """

    def __init__(
        self,
        spec: SwitchSpec,
        config: DaemonConfig,
        metrics: ControllerMetrics,
        plan: FabricPlan | None = None,
    ):
        self.spec = spec
        self.config = config
        self.metrics = metrics
        self.plan = plan
        self.client = SwitchClient(
            SwitchConfig(
                name=spec.name,
                address=spec.address,
                p4info=spec.p4info,
                device_config=spec.device_config or b"",
                target=spec.target,
                device_id=spec.device_id,
                election_id=spec.election_id,
            )
        )
        client = self.client
        self.forwarding = ForwardingDriver(client)
        self.pool_owner = PoolOwnerDriver(client)
        self.multicast = MulticastDriver(client)
        self.sketch = SketchDriver(client, config.sketch.threshold)
        self.stats = StatsDriver(client)
        epoch_bits = client.schema.actions[ACTION_HIT].params["epoch"].bitwidth
        self.loader = FragmentLoader(
            client,
            clock=EpochClock(bits=epoch_bits, state_file=spec.epoch_state_file),
            on_lost=self._on_lost,
            ack_ports=spec.fanout_ports or None,
        )
        for driver in (
            self.forwarding,
            self.pool_owner,
            self.multicast,
            _BaseState(self),
            self.sketch,
            self.stats,
            self.loader,
        ):
            client.add_driver(driver)
        self.policy: CachePolicy = make_policy(
            config.policy.name, capacity_bytes=config.sram_budget_bytes, **config.policy.params
        )
        self.data: dict[ChunkId, bytes] = {}
        self.hits: dict[ChunkId, HitAccount] = {}
        self.digests: collections.deque[HotMiss] = collections.deque(maxlen=65536)
        self.adopted: set[ChunkId] = set()
        self.demoted: collections.deque[dict[str, Any]] = collections.deque(maxlen=64)
        self.absent: dict[int, float] = {}  # key -> when to ask the pool for it again
        # The doorkeeper (policy.min_accesses): accesses held back, and keys let through.
        self.held: collections.OrderedDict[int, list[Access]] = collections.OrderedDict()
        self.passed: collections.OrderedDict[int, None] = collections.OrderedDict()
        # What the reports say about reuse (the bar of min_accesses: auto).
        self.admission = ReuseAdmission(max_keys=MAX_TRACKED_KEYS)
        self.last_tick: TickSummary | None = None
        # The push plan of the switch's hosts (its multicast group), when configured.
        self.push: PushPlanner | None = (
            PushPlanner(config.push_budget_bytes, MAX_TRACKED_KEYS)
            if config.push_budget_bytes > 0
            else None
        )
        self.last_push: PushPlan | None = None
        # The policy's figures per KV class (status): accesses, hits, evictions, load_bytes.
        self.class_figures: dict[str, dict[str, int]] = {
            name: dict.fromkeys(("accesses", "hits", "evictions", "load_bytes"), 0)
            for name in KV_CLASS_NAMES
        }
        metrics.connected.labels(spec.name).set_function(lambda: float(self.client.is_ready))
        metrics.sram_budget.labels(spec.name).set(config.sram_budget_bytes)
        metrics.multicast_groups.labels(spec.name).set_function(
            lambda: float(len(self.multicast.groups()))
        )

    @property
    def name(self) -> str:
        """The switch's name."""
        return self.spec.name

    async def fabric_routes(self) -> None:
        """A fabric switch's routes to the nodes off its ports, and its trusted fabric ports.

        Each route's destination MAC is the next switch's router MAC (:attr:`plan` decides
        which spine, among those in service); a route that changed is one MODIFY, never an
        entry-less moment. A fabric port has the pool role: it may bring in what a switch of
        the fabric forwards (GETs checked at their edge, DATA, NACKs), never a WRITE.

        Raises:
            SwitchError: a write failed.
        """
        plan = self.plan
        if plan is None or not self.spec.program_forwarding:
            return
        cfg = self.config
        nodes = [(h.name, h.ip) for h in cfg.hosts] + [(p.name, p.ip) for p in cfg.pools]
        for name, ip in nodes:
            port, via = plan.next_hop(self.name, name)
            if via is not None:
                next_mac = cfg.switch(via).router_mac
                await self.forwarding.add_route(
                    Route(f"{ip}/32", port, self.spec.router_mac, next_mac)
                )
        for port in plan.fabric_ports(self.name):
            await self.forwarding.set_port_role(port, c.PORT_ROLE_POOL)

    def count_class(self, key: int, figure: str, n: int = 1) -> str:
        """Adds ``n`` to one per-class figure of ``key``'s class; returns the class name."""
        name = self.policy.kv_class(key).value
        self.class_figures[name][figure] += n
        return name

    def _on_lost(self, chunk: ChunkId) -> None:
        self.metrics.lost.labels(self.name).inc()
        self.hits.pop(chunk, None)
        _LOG.warning(
            "adopted chunk lost with the switch's SRAM; it is reloaded from the pool if wanted",
            extra={"event": "lost", "switch": self.name, "chunk": str(chunk)},
        )

    async def collect_digests(self) -> None:
        """Queues every hot-miss digest for the next tick (runs until cancelled)."""
        async for miss in self.stats.hot_misses():
            self.digests.append(miss)

    def resident_bytes_by_class(self) -> dict[str, int]:
        """SRAM bytes (whole fragment slots) of the chunks on the switch, by KV class."""
        out = dict.fromkeys(KV_CLASS_NAMES, 0)
        for chunk, entry in self.loader.resident().items():
            out[self.policy.kv_class(chunk.key).value] += entry.frag_count * c.FRAG_BYTES
        return out

    def update_gauges(self) -> None:
        """Sets the switch's SRAM, residency and per-class gauges."""
        m = self.metrics
        stats = self.loader.allocator.stats()
        m.sram_used.labels(self.name).set(stats.used * c.FRAG_BYTES)
        m.resident.labels(self.name).set(len(self.loader.resident()))
        m.policy_resident.labels(self.name).set(len(self.policy.resident_keys()))
        for name, nbytes in self.resident_bytes_by_class().items():
            m.class_resident_bytes.labels(self.name, name).set(nbytes)
