"""The controller daemon: accesses in, cache decisions out, applied to every switch's SRAM.

One :class:`Controller` per process drives a :class:`~controlplane.p4rt.SwitchFleet`. For each
switch it registers the drivers (forwarding, pool owner, multicast, the configured base state,
sketch, stats, fragment loader), keeps one cache policy (``make_policy`` by name, its budget the
switch's SRAM) and, every ``tick_s``:

1. collects the accesses since the last tick:

   * host agents' reports from the HTTP API (``POST /v1/reports``), which carry the host,
     whether the switch served the chunk, and its place in the prefix chain (records of chunks
     a host put into the pool, ``event: stored``, are not accesses: they give the chunk's length
     and clear an earlier "the pool does not have it");
   * the cache table's direct counters, read each tick: fragments the switch served that no
     report accounts for become ``hit=True`` accesses of an unknown host (reports explain
     counter hits one tick late, so that a report in flight is not counted twice);
   * hot-miss digests (the switch's count-min sketch): a digest for a key that no host reported
     during the last sketch window becomes ``estimate`` (at most ``threshold``) ``hit=False``
     accesses of an unknown host; the others are counted only;
   * chunks a previous controller left on the switch (adopted by the loader), recorded once as
     one access each so that the policy can decide to keep them;

2. updates the chunks' classes (``controlplane.kvclasses``: a record's declared ``class``,
   ``POST /v1/classes``, the static-detection rule) and tells each policy of every change, so
   that static chunks stay in SRAM before transient ones; then records the accesses in the
   policy and takes its decision (``on_tick``);
3. with ``push.budget_bytes_per_tick``, plans which static chunks to push to which hosts of the
   switch (``controlplane.push``: every host of the chunk's tenant that holds no copy, prefix
   order, paced so that pushes take only the pool-link bytes the tick's pulls left) and counts
   the plan; the data-plane push itself is not built;
4. applies the decision, evictions first: an evicted chunk's entry is deleted and its slots freed; a
   DEMOTE also makes sure the DRAM pool still holds the chunk (``ChunkSource.ensure``), and is
   logged and counted either way; then every chunk the policy holds resident but the switch does
   not is loaded (bytes read from the DRAM pool, WRITEs in the safe order), skipping what does
   not fit now (it is tried again next tick) and, for a while (``max(30 s, 10 ticks)``, or until
   a host fetches it again), what the pool no longer has. A chunk on the switch that the policy
   does not hold is evicted: the switch ends every tick holding exactly the policy's resident
   set (up to loads that did not fit or failed).

On start the P4Runtime layer reads the switch back: the loader adopts the cache entries a
previous controller left (no reload, no duplicate), every table driver reconciles its table to
the configured state (orphans deleted), and after a switch restart the loader reloads every
chunk it has bytes for. With ``policy.dry_run`` the policy runs and its decisions are counted
and logged, but the cache is never changed.

Library code here never exits the process; :func:`serve` stops cleanly on SIGTERM or SIGINT.

Constants:
    OBSERVER_HOST: the policy host id of accesses no host reported (counters, digests).

Classes:
    ControllerMetrics: the Prometheus metrics, in a registry of their own.
    JsonFormatter: one JSON object per log line.
    SwitchRuntime: one switch: client, drivers, policy, and what the controller tracks of it.
    TickSummary: what one tick did on one switch.
    Controller: the daemon (start, tick, stop, report intake, status).

Functions:
    configure_logging: JSON-lines logging on a stream.
    serve: run a controller until SIGTERM/SIGINT.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime
import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from http import HTTPStatus
from typing import IO, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from controlplane.admission import ReuseAdmission
from controlplane.chunksource import (
    ChunkNotFoundError,
    ChunkSource,
    ChunkUnavailableError,
    KvpChunkSource,
)
from controlplane.config import DaemonConfig, SwitchSpec
from controlplane.drivers import (
    ChunkId,
    ConsistentHashRing,
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
from controlplane.errors import (
    AllocationError,
    ConfigError,
    ControlPlaneError,
    FragmentLoadError,
    NotInstalledError,
    SwitchError,
)
from controlplane.kvclasses import ClassDeclarationError, ClassRegistry, parse_declaration
from controlplane.p4rt import SessionInfo, SwitchClient, SwitchConfig, SwitchFleet
from controlplane.policies import Access, CachePolicy, Decision, EvictAction, make_policy
from controlplane.push import PushCandidate, PushHost, PushPlan, PushPlanner
from controlplane.reports import (
    Handler,
    HttpApi,
    ReportRejectedError,
    Response,
    report_routes,
)
from kvcast import p4constants as c
from kvcast.fabric import FabricPlan
from kvcast.kvclass import KV_CLASS_NAMES, KvClass
from kvcast.reports import AccessReport

__all__ = [
    "OBSERVER_HOST",
    "Controller",
    "ControllerMetrics",
    "JsonFormatter",
    "SwitchRuntime",
    "TickSummary",
    "configure_logging",
    "serve",
]

_LOG = logging.getLogger("controlplane.daemon")

OBSERVER_HOST = -1
"""Policy host id of accesses that only the switch saw (hit counters, digests, adoption)."""

_MAX_TRACKED_KEYS = 1 << 20


def _addr(address: tuple[str, int] | None) -> str | None:
    return f"{address[0]}:{address[1]}" if address is not None else None


def _footprint(nbytes: int) -> int:
    """SRAM bytes a chunk occupies: whole fragment slots."""
    return -(-nbytes // c.FRAG_BYTES) * c.FRAG_BYTES


# ------------------------------------------------------------------------------ metrics
class ControllerMetrics:
    """The daemon's Prometheus metrics (names start with ``kvcast_controller_``).

    Args:
        registry: where they are registered (a new registry by default, so several
            controllers can live in one process).
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        p = "kvcast_controller_"
        self.loads = Counter(p + "loads", "Chunks loaded into switch SRAM", ["switch"], registry=r)
        self.load_bytes = Counter(
            p + "load_bytes", "Chunk bytes written into switch SRAM", ["switch"], registry=r
        )
        self.load_skipped = Counter(
            p + "load_skipped",
            "Admissions not loaded this tick (no_fit, not_in_pool, pool_unavailable, deferred)",
            ["switch", "reason"],
            registry=r,
        )
        self.evictions = Counter(
            p + "evictions", "Chunks evicted from switch SRAM", ["switch", "action"], registry=r
        )
        self.decisions = Counter(
            p + "decisions",
            "Policy decisions, applied or not (dry run): admit, drop, demote",
            ["switch", "kind"],
            registry=r,
        )
        self.demotions_unreturned = Counter(
            p + "demotions_unreturned",
            "DEMOTEd chunks the DRAM pool no longer holds and that could not be written back",
            ["switch"],
            registry=r,
        )
        self.hits = Counter(
            p + "hits", "Switch hits learnt (report or counter)", ["switch", "source"], registry=r
        )
        self.misses = Counter(
            p + "misses",
            "Switch misses learnt (report or digest)",
            ["switch", "source"],
            registry=r,
        )
        self.accesses = Counter(
            p + "accesses", "Accesses fed to the policy", ["switch", "source"], registry=r
        )
        self.held = Counter(
            p + "accesses_held",
            "Reported accesses held back until their chunk has policy.min_accesses",
            ["switch"],
            registry=r,
        )
        self.digests = Counter(
            p + "digests",
            "Hot-miss digests received (explained: a host reported the key this window)",
            ["switch", "kind"],
            registry=r,
        )
        self.reports = Counter(
            p + "reports_received", "Access records accepted by the report API", registry=r
        )
        self.min_accesses = Gauge(
            p + "min_accesses",
            "Reported uses a chunk needs before the policy hears of it (policy.min_accesses, "
            "or the learned bar with auto)",
            ["switch"],
            registry=r,
        )
        self.stored = Counter(
            p + "chunks_stored_reported",
            "Chunks hosts reported putting into the DRAM pool (event=stored records)",
            registry=r,
        )
        self.report_requests = Counter(
            p + "report_requests", "Report API requests by HTTP status", ["code"], registry=r
        )
        self.clock_skew = Counter(
            p + "report_clock_skew",
            "Records with a time in the future beyond clock_skew_s (clamped to now)",
            registry=r,
        )
        self.write_errors = Counter(
            p + "write_errors", "Failed switch writes and loads", ["switch"], registry=r
        )
        self.lost = Counter(
            p + "chunks_lost",
            "Adopted chunks the switch lost (restart) whose bytes the controller never had",
            ["switch"],
            registry=r,
        )
        self.connected = Gauge(
            p + "switch_connected", "1 when the switch is READY (primary, synced)", ["switch"],
            registry=r,
        )  # fmt: skip
        self.sram_used = Gauge(
            p + "sram_used_bytes", "SRAM bytes in use (fragment slots)", ["switch"], registry=r
        )
        self.sram_budget = Gauge(
            p + "sram_budget_bytes", "SRAM bytes the policy may fill", ["switch"], registry=r
        )
        self.resident = Gauge(
            p + "resident_chunks", "Chunks cached in switch SRAM", ["switch"], registry=r
        )
        self.policy_resident = Gauge(
            p + "policy_resident_chunks", "Chunks the policy holds resident", ["switch"], registry=r
        )
        self.class_accesses = Counter(
            p + "class_accesses",
            "Reported accesses by the chunk's KV class (static, transient)",
            ["switch", "class"],
            registry=r,
        )
        self.class_hits = Counter(
            p + "class_hits",
            "Reported switch hits by the chunk's KV class",
            ["switch", "class"],
            registry=r,
        )
        self.class_evictions = Counter(
            p + "class_evictions",
            "Chunks evicted from switch SRAM by KV class",
            ["switch", "class"],
            registry=r,
        )
        self.class_load_bytes = Counter(
            p + "class_load_bytes",
            "Chunk bytes written into switch SRAM by KV class",
            ["switch", "class"],
            registry=r,
        )
        self.class_resident_bytes = Gauge(
            p + "class_resident_bytes",
            "SRAM bytes of cached chunks by KV class",
            ["switch", "class"],
            registry=r,
        )
        self.static_promotions = Counter(
            p + "static_promotions",
            "Chunks that became static (declared, detected, prefix of a static chunk)",
            ["reason"],
            registry=r,
        )
        self.static_demotions = Counter(
            p + "static_demotions",
            "Static chunks that went back to transient (declaration expired or revoked, "
            "detection lapsed, no static chunk below a prefix)",
            ["reason"],
            registry=r,
        )
        self.static_chunks = Gauge(p + "static_chunks", "Chunks static now", registry=r)
        self.static_refused = Counter(
            p + "static_refused",
            "Promotions refused because classes.max_keys chunks are static already",
            registry=r,
        )
        self.class_declarations = Counter(
            p + "class_declarations",
            "POST /v1/classes requests by HTTP status",
            ["code"],
            registry=r,
        )
        self.push_orders = Counter(
            p + "push_orders", "Static chunks planned for a push (one copy each)", ["switch"],
            registry=r,
        )  # fmt: skip
        self.push_bytes = Counter(
            p + "push_pool_bytes",
            "Pool-link bytes of planned pushes (one multicast copy per chunk)",
            ["switch"],
            registry=r,
        )
        self.push_unicast_bytes = Counter(
            p + "push_unicast_bytes",
            "Pool-link bytes the planned pushes would cost as one unicast per host",
            ["switch"],
            registry=r,
        )
        self.push_deliveries = Counter(
            p + "push_deliveries", "Host copies of planned pushes", ["switch"], registry=r
        )
        self.push_waiting = Counter(
            p + "push_waiting",
            "Static chunks not pushed this tick: deferred (budget spent, behind their parent) "
            "or too_large (above the whole per-tick budget)",
            ["switch", "reason"],
            registry=r,
        )
        self.ticks = Counter(p + "ticks", "Decision ticks run", registry=r)
        self.tick_seconds = Histogram(
            p + "tick_seconds",
            "Duration of a decision tick",
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r,
        )

    def exposition(self) -> bytes:
        """The metrics in Prometheus' text format."""
        return generate_latest(self.registry)


# ------------------------------------------------------------------------------ logging
_STANDARD_ATTRS = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON object: time, level, logger, message, and its extras.

    ``_LOG.info("loaded", extra={"event": "load", "switch": "s1"})`` gives
    ``{"ts": "...", "level": "INFO", "logger": "...", "msg": "loaded", "event": "load",
    "switch": "s1"}``.
    """

    def format(self, record: logging.LogRecord) -> str:  # noqa: D102
        doc: dict[str, Any] = {
            "ts": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD_ATTRS and not key.startswith("_"):
                doc[key] = value
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def configure_logging(level: str = "INFO", stream: IO[str] | None = None) -> logging.Handler:
    """Sends every log record to ``stream`` (stderr) as JSON lines.

    Args:
        level: the root level name.
        stream: where lines go.

    Returns:
        The installed handler (remove it to undo).
    """
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    return handler


# ------------------------------------------------------------------------------ state
@dataclass
class _KeyInfo:
    tenant: int
    nbytes: int | None  # exact length, None when only the SRAM footprint is known
    last_report: float = float("-inf")


@dataclass
class _HitAccount:
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
            plan = cfg.fabric_plan()
            if plan is not None:
                await self._fabric_routes(plan)
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

    async def _fabric_routes(self, plan: FabricPlan) -> None:
        """A fabric switch's routes to the nodes off its ports, and its trusted fabric ports.

        Each route's destination MAC is the next switch's router MAC (kvcast.fabric decides
        which spine); a fabric port has the pool role: it may bring in what a switch of the
        fabric forwards (GETs checked at their edge, DATA, NACKs), never a WRITE.
        """
        rt = self._rt
        cfg = rt.config
        spec = rt.spec
        nodes = [(h.name, h.ip) for h in cfg.hosts] + [(p.name, p.ip) for p in cfg.pools]
        for name, ip in nodes:
            port, via = plan.next_hop(spec.name, name)
            if via is not None:
                next_mac = cfg.switch(via).router_mac
                await rt.forwarding.add_route(Route(f"{ip}/32", port, spec.router_mac, next_mac))
        for port in plan.fabric_ports(spec.name):
            await rt.forwarding.set_port_role(port, c.PORT_ROLE_POOL)


class SwitchRuntime:
    """One switch: its client and drivers, its policy, and what the controller tracks of it.

    Args:
        spec: the switch.
        config: the whole configuration.
        metrics: where to count.
    """

    def __init__(self, spec: SwitchSpec, config: DaemonConfig, metrics: ControllerMetrics):
        self.spec = spec
        self.config = config
        self.metrics = metrics
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
        self.hits: dict[ChunkId, _HitAccount] = {}
        self.digests: collections.deque[HotMiss] = collections.deque(maxlen=65536)
        self.adopted: set[ChunkId] = set()
        self.demoted: collections.deque[dict[str, Any]] = collections.deque(maxlen=64)
        self.absent: dict[int, float] = {}  # key -> when to ask the pool for it again
        # The doorkeeper (policy.min_accesses): accesses held back, and keys let through.
        self.held: collections.OrderedDict[int, list[Access]] = collections.OrderedDict()
        self.passed: collections.OrderedDict[int, None] = collections.OrderedDict()
        # What the reports say about reuse (the bar of min_accesses: auto).
        self.admission = ReuseAdmission(max_keys=_MAX_TRACKED_KEYS)
        self.last_tick: TickSummary | None = None
        # The push plan of the switch's hosts (its multicast group), when configured.
        self.push: PushPlanner | None = (
            PushPlanner(config.push_budget_bytes, _MAX_TRACKED_KEYS)
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

    @property
    def name(self) -> str:
        """The switch's name."""
        return self.spec.name

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


class _StopApplying(Exception):  # noqa: N818 - internal control flow
    """The switch failed a write: stop applying this tick, retry next tick."""


# ------------------------------------------------------------------------------ controller
class Controller:
    """The controller daemon.

    Args:
        config: the configuration.
        chunk_source: where chunk bytes come from (default: KVP GETs to each key's pool node,
            at the pools' ``fetch_address``).
        clock: wall clock in Unix seconds (the time base of reports and the policy).
        metrics: the metrics (a fresh registry by default).

    Raises:
        ConfigError: the P4Info or device config cannot be read, or the policy is invalid.
    """

    def __init__(
        self,
        config: DaemonConfig,
        *,
        chunk_source: ChunkSource | None = None,
        clock: Callable[[], float] = time.time,
        metrics: ControllerMetrics | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics or ControllerMetrics()
        self._clock = clock
        self.switches = {s.name: SwitchRuntime(s, config, self.metrics) for s in config.switches}
        self.fleet = SwitchFleet(rt.client for rt in self.switches.values())
        self._source = chunk_source or self._kvp_source()
        self._hosts: dict[str | int, tuple[int, str]] = {}
        self._host_names: dict[str | int, str] = {}
        for h in config.hosts:
            self._hosts[h.name] = (h.id, h.switch)
            self._hosts[h.id] = (h.id, h.switch)
            self._host_names[h.name] = self._host_names[h.id] = h.name
        self._queue: collections.deque[AccessReport] = collections.deque()
        self._queue_lock = threading.Lock()
        self._keys: collections.OrderedDict[int, _KeyInfo] = collections.OrderedDict()
        self._tasks: list[asyncio.Task[None]] = []
        self._report_api: HttpApi | None = None
        self._metrics_api: HttpApi | None = None
        self._status: dict[str, Any] = {"started": False}
        self._started_at = 0.0
        self._tick_lock = asyncio.Lock()
        self._ticks = 0
        self._absent_backoff_s = max(30.0, 10 * config.tick_s)
        # Chunks' classes: records (tick) and POST /v1/classes (HTTP threads) under one lock.
        self.classes = ClassRegistry(config.classes)
        self._classes_lock = threading.Lock()
        self._promoted_seen: collections.Counter[str] = collections.Counter()
        self._demoted_seen: collections.Counter[str] = collections.Counter()
        self._refused_seen = 0

    def _kvp_source(self) -> KvpChunkSource:
        ring = ConsistentHashRing(c.POOL_BUCKETS)
        pools = {p.name: p for p in self.config.pools}
        for name in pools:
            ring.add(name)

        def locate(_tenant: int, key: int) -> tuple[str, int]:
            owner = ring.owner(key & (c.POOL_BUCKETS - 1))
            if owner is None:
                raise ChunkUnavailableError("no pool nodes are configured (pools: [])")
            pool = pools[owner]
            return pool.fetch_host, pool.fetch_port

        return KvpChunkSource(locate, timeout_s=self.config.chunk_timeout_s)

    def _group_routes(self) -> dict[tuple[str, str], Handler]:
        """``GET /v1/groups/<switch>``: the multicast groups of each switch, for pool nodes.

        A pool node started with ``--groups-url`` echoes only these groups (poolnode.groups).
        """
        routes: dict[tuple[str, str], Handler] = {}
        for name, rt in self.switches.items():

            def groups(_body: bytes, rt: SwitchRuntime = rt) -> Response:
                held = rt.multicast.groups()
                return Response.json(
                    HTTPStatus.OK,
                    {
                        "switch": rt.name,
                        "groups": sorted(held),
                        "members": {str(g): sorted(m) for g, m in sorted(held.items())},
                    },
                )

            routes[("GET", f"/v1/groups/{name}")] = groups
        return routes

    def _class_routes(self) -> dict[tuple[str, str], Handler]:
        """``POST /v1/classes`` declares chunks' classes; ``GET /v1/classes`` lists the static."""

        def declare(body: bytes) -> Response:
            try:
                decl = parse_declaration(body)
            except ClassDeclarationError as exc:
                self.metrics.class_declarations.labels("400").inc()
                return Response.json(HTTPStatus.BAD_REQUEST, {"error": str(exc)})
            now = self._clock()
            with self._classes_lock:
                for key in decl.keys:
                    self.classes.declare(decl.tenant, key, decl.kv_class, now, decl.ttl_s)
            self.metrics.class_declarations.labels("200").inc()
            return Response.json(
                HTTPStatus.OK, {"declared": len(decl.keys), "class": decl.kv_class.value}
            )

        def listing(_body: bytes) -> Response:
            with self._classes_lock:
                static = self.classes.static()
            return Response.json(
                HTTPStatus.OK,
                {
                    "static": [
                        {
                            "tenant": e.tenant,
                            "key": f"{k:#x}",
                            "reason": e.reason,
                            "since": e.since,
                            "until": e.until,
                        }
                        for k, e in sorted(static.items())
                    ]
                },
            )

        return {("POST", "/v1/classes"): declare, ("GET", "/v1/classes"): listing}

    # ------------------------------------------------------------------ lifecycle
    @property
    def report_address(self) -> tuple[str, int] | None:
        """Where the report API listens (None before start)."""
        return self._report_api.address if self._report_api is not None else None

    @property
    def metrics_address(self) -> tuple[str, int] | None:
        """Where the metrics endpoint listens (None before start or when disabled)."""
        return self._metrics_api.address if self._metrics_api is not None else None

    async def start(self) -> None:
        """Starts the HTTP endpoints, the switch sessions and the tick loop.

        Switches that are not reachable yet do not stop the start: the layer keeps
        reconnecting and ``switch_connected`` says which are ready.

        Raises:
            ControlPlaneError: an endpoint cannot listen on its address.
        """
        api = self.config.report_api
        self._report_api = HttpApi(
            api.listen.host,
            api.listen.port,
            {**report_routes(self), **self._group_routes(), **self._class_routes()},
            max_body_bytes=api.max_body_bytes,
            name="report-api",
        )
        self._report_api.start()
        try:
            if self.config.metrics is not None:
                m = self.config.metrics
                self._metrics_api = HttpApi(
                    m.host,
                    m.port,
                    {("GET", "/metrics"): self._metrics_route},
                    name="metrics",
                )
                self._metrics_api.start()
            self._started_at = self._clock()
            await self.fleet.start()
            for rt in self.switches.values():
                self._tasks.append(
                    asyncio.create_task(rt.collect_digests(), name=f"{rt.name}-digests")
                )
                self._tasks.append(
                    asyncio.create_task(
                        rt.sketch.run(self.config.sketch.window_s), name=f"{rt.name}-sketch"
                    )
                )
            self._tasks.append(asyncio.create_task(self._tick_loop(), name="ticks"))
        except BaseException:
            await self.stop()
            raise
        self._refresh_status()
        _LOG.info(
            "controller started",
            extra={
                "event": "start",
                "report_api": _addr(self.report_address),
                "metrics": _addr(self.metrics_address),
                "switches": [s.name for s in self.config.switches],
                "policy": self.config.policy.name,
                "dry_run": self.config.policy.dry_run,
            },
        )

    async def wait_ready(self, timeout: float | None = None) -> None:
        """Waits until every switch is READY.

        Raises:
            SwitchUnavailableError: one is not READY in time.
        """
        await self.fleet.wait_ready(timeout)

    async def stop(self) -> None:
        """Stops the tick loop, the switch sessions and the endpoints (idempotent)."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.fleet.stop()
        for api in (self._report_api, self._metrics_api):
            if api is not None:
                api.stop()
        self._report_api = self._metrics_api = None
        self._source.close()
        _LOG.info("controller stopped", extra={"event": "stop"})

    async def _tick_loop(self) -> None:
        period = self.config.tick_s
        while True:
            await asyncio.sleep(period)
            try:
                await self.tick()
            except Exception:  # noqa: BLE001 - the loop must outlive any one tick
                _LOG.exception("tick failed", extra={"event": "tick_error"})

    def _metrics_route(self, _body: bytes) -> Response:
        return Response(200, self.metrics.exposition(), CONTENT_TYPE_LATEST)

    # ------------------------------------------------------------------ report intake
    def submit_reports(self, reports: Sequence[AccessReport]) -> int:
        """Queues validated records for the next tick (thread-safe; the report API calls it).

        Args:
            reports: records from one request.

        Returns:
            How many were queued.

        Raises:
            ReportRejectedError: a record names a host that is not configured (400; when hosts are
                configured), or the queue is full (503).
        """
        try:
            if self.config.hosts:
                for i, r in enumerate(reports):
                    if r.host not in self._hosts:
                        names = sorted(str(h.name) for h in self.config.hosts)
                        raise ReportRejectedError(
                            400,
                            f"reports[{i}].host: unknown host {r.host!r}; configured hosts: "
                            f"{', '.join(names)}",
                        )
            elif len(self.switches) > 1:
                raise ReportRejectedError(
                    400, "no hosts are configured, so reports cannot be routed to a switch"
                )
            with self._queue_lock:
                if len(self._queue) + len(reports) > self.config.report_api.max_queue:
                    raise ReportRejectedError(
                        503,
                        f"report queue full ({len(self._queue)} records waiting for the next "
                        "tick); retry later",
                    )
                self._queue.extend(reports)
        except ReportRejectedError as exc:
            self.metrics.report_requests.labels(str(exc.status)).inc()
            raise
        self.metrics.report_requests.labels("202").inc()
        self.metrics.reports.inc(len(reports))
        return len(reports)

    def status(self) -> Mapping[str, Any]:
        """The status as of the last tick, with live connection states (thread-safe)."""
        out = dict(self._status)
        out["switches"] = {
            name: {**sw, "state": self.switches[name].client.state.value}
            for name, sw in dict(out.get("switches", {})).items()
        }
        with self._queue_lock:
            out["queued_reports"] = len(self._queue)
        return out

    def _host_of(self, report: AccessReport) -> tuple[int, str]:
        found = self._hosts.get(report.host)
        if found is not None:
            return found
        # No hosts configured (checked at intake): one switch, ids by first sight. Only the tick
        # (the event loop) adds entries; the intake threads never read this map in this mode.
        switch = next(iter(self.switches))
        if isinstance(report.host, int):
            return report.host, switch
        hid = (1 << 30) + len(self._hosts)
        self._hosts[report.host] = (hid, switch)
        return hid, switch

    def _plan_pushes(
        self,
        reports: Sequence[AccessReport],
        routed: Sequence[tuple[AccessReport, int, str, float]],
        now: float,
    ) -> None:
        """Notes who holds what, then plans and counts each switch's pushes."""
        planners = {n: rt.push for n, rt in self.switches.items() if rt.push is not None}
        if not planners:
            return
        pulls = dict.fromkeys(planners, 0)
        for r in reports:
            if not r.stored:
                continue
            switch = self._hosts.get(r.host, (0, next(iter(self.switches))))[1]
            planner = planners.get(switch)
            if planner is not None:
                planner.note_held(r.key, self._host_names.get(r.host, str(r.host)))
        for r, _hid, switch, _t in routed:
            planner = planners.get(switch)
            if planner is None:
                continue
            planner.note_held(r.key, self._host_names.get(r.host, str(r.host)))
            if r.hit is False:
                pulls[switch] += r.size  # read from the pool
        with self._classes_lock:
            static = self.classes.static()
            parents = {k: self.classes.parent(k) for k in static}
        candidates: list[PushCandidate] = []
        for key, entry in static.items():
            info = self._keys.get(key)
            if info is None or info.nbytes is None:
                continue
            depth, k = 0, parents.get(key)
            while k is not None and depth < 4096:
                depth += 1
                k = parents.get(k) if k in parents else None
            candidates.append(PushCandidate(entry.tenant, key, info.nbytes, parents[key], depth))
        m = self.metrics
        for name, planner in planners.items():
            hosts = [PushHost(h.name, h.tenants) for h in self.config.hosts_of(name)]
            plan = planner.plan(candidates, hosts, pull_bytes=pulls[name])
            self.switches[name].last_push = plan
            if plan.orders:
                m.push_orders.labels(name).inc(len(plan.orders))
                m.push_bytes.labels(name).inc(plan.pool_bytes)
                m.push_unicast_bytes.labels(name).inc(plan.unicast_bytes)
                m.push_deliveries.labels(name).inc(plan.deliveries)
                _LOG.info(
                    "push planned",
                    extra={
                        "event": "push_plan",
                        "switch": name,
                        "chunks": len(plan.orders),
                        "pool_bytes": plan.pool_bytes,
                        "unicast_bytes": plan.unicast_bytes,
                        "at": now,
                    },
                )
            if plan.deferred:
                m.push_waiting.labels(name, "deferred").inc(plan.deferred)
            if plan.too_large:
                m.push_waiting.labels(name, "too_large").inc(plan.too_large)

    def _apply_classes(self, now: float) -> None:
        """Expires and promotes classes, and tells every policy of each change."""
        changes = self.classes.tick(now)
        for rt in self.switches.values():
            for key, kv_class in changes.items():
                rt.policy.set_kv_class(key, kv_class)
        m = self.metrics
        for seen, counts, counter in (
            (self._promoted_seen, self.classes.promoted, m.static_promotions),
            (self._demoted_seen, self.classes.demoted, m.static_demotions),
        ):
            for reason, n in counts.items():
                if n > seen[reason]:
                    counter.labels(reason).inc(n - seen[reason])
                    seen[reason] = n
        m.static_chunks.set(len(self.classes.static()))
        if self.classes.refused > self._refused_seen:
            m.static_refused.inc(self.classes.refused - self._refused_seen)
            self._refused_seen = self.classes.refused
        if changes:
            _LOG.info(
                "kv classes changed",
                extra={
                    "event": "classes",
                    "static": sum(1 for k in changes.values() if k is KvClass.STATIC),
                    "transient": sum(1 for k in changes.values() if k is KvClass.TRANSIENT),
                },
            )

    def _stored(self, r: AccessReport) -> None:
        """A host put a chunk into the pool: its length is known and the pool holds it again."""
        self._remember(r.key, r.tenant, r.size, None)
        for rt in self.switches.values():
            rt.absent.pop(r.key, None)
        self.metrics.stored.inc()

    def _remember(self, key: int, tenant: int, nbytes: int | None, reported: float | None) -> None:
        info = self._keys.get(key)
        if info is None:
            info = _KeyInfo(tenant, nbytes)
            self._keys[key] = info
            if len(self._keys) > _MAX_TRACKED_KEYS:
                self._keys.popitem(last=False)
        else:
            self._keys.move_to_end(key)
            info.tenant = tenant
            if nbytes is not None:
                info.nbytes = nbytes
        if reported is not None:
            info.last_report = max(info.last_report, reported)

    # ------------------------------------------------------------------ the tick
    async def tick(self) -> dict[str, TickSummary]:
        """Runs one decision tick on every switch.

        Returns:
            What it did, by switch.
        """
        async with self._tick_lock:
            started = time.perf_counter()
            now = self._clock()
            with self._queue_lock:
                reports = list(self._queue)
                self._queue.clear()
            per_switch: dict[str, list[Access]] = {name: [] for name in self.switches}
            skew = self.config.report_api.clock_skew_s
            routed: list[tuple[AccessReport, int, str, float]] = []
            with self._classes_lock:
                for r in reports:
                    t = r.time
                    if not r.stored and t > now + skew:
                        self.metrics.clock_skew.inc()
                    t = min(t, now)
                    self.classes.observe(
                        r.tenant,
                        r.key,
                        t,
                        parent=r.parent,
                        declared=r.kv_class,
                        use=not r.stored,
                    )
                    if r.stored:
                        self._stored(r)
                        continue
                    host_id, switch = self._host_of(r)
                    routed.append((r, host_id, switch, t))
                self._apply_classes(now)
            for r, host_id, switch, t in routed:
                self._remember(r.key, r.tenant, r.size, t)
                rt_of = self.switches[switch]
                name = rt_of.count_class(r.key, "accesses")
                self.metrics.class_accesses.labels(switch, name).inc()
                if r.hit is True:
                    rt_of.count_class(r.key, "hits")
                    self.metrics.class_hits.labels(switch, name).inc()
                per_switch[switch].append(
                    Access(
                        r.key,
                        r.tenant,
                        _footprint(r.size),
                        host_id,
                        t,
                        r.hit,
                        r.parent,
                        r.position,
                    )
                )
            self._plan_pushes(reports, routed, now)
            names = list(self.switches)
            results = await asyncio.gather(
                *(self._tick_switch(self.switches[n], now, per_switch[n]) for n in names),
                return_exceptions=True,
            )
            summaries: dict[str, TickSummary] = {}
            for name, result in zip(names, results, strict=True):
                if isinstance(result, TickSummary):
                    summaries[name] = result
                    continue
                if not isinstance(result, Exception):  # CancelledError, KeyboardInterrupt
                    raise result
                # One switch's failure (a policy bug, an unexpected error) must not stop the
                # others; the next tick starts again from the policy's and the switch's state.
                _LOG.error(
                    "tick failed on %s: %r",
                    name,
                    result,
                    exc_info=result,
                    extra={"event": "tick_error", "switch": name},
                )
                summaries[name] = TickSummary(name, errors=1)
            self._ticks += 1
            self.metrics.ticks.inc()
            self.metrics.tick_seconds.observe(time.perf_counter() - started)
            self._refresh_status()
            return summaries

    async def _tick_switch(
        self, rt: SwitchRuntime, now: float, reported: list[Access]
    ) -> TickSummary:
        summary = TickSummary(rt.name)
        m = self.metrics
        accesses: dict[str, list[Access]] = {"report": self._doorkeeper(rt, reported)}
        for a in reported:
            if a.hit is not None:
                rt.absent.pop(a.key, None)  # a host just fetched it: the pool may have it again
            if a.hit is True:
                m.hits.labels(rt.name, "report").inc()
                account = rt.hits.get(ChunkId(a.tenant, a.key))
                if account is not None:
                    account.reported += 1
            elif a.hit is False:
                m.misses.labels(rt.name, "report").inc()
        ready = rt.client.is_ready
        if ready:
            try:
                accesses["counter"] = await self._counter_accesses(rt, now)
            except SwitchError as exc:
                summary.errors += 1
                _LOG.info("hit counters not read: %s", exc, extra={"switch": rt.name})
        accesses["digest"] = await self._digest_accesses(rt, now)
        accesses["adopted"] = self._adoption_accesses(rt, now)
        merged = sorted((a for group in accesses.values() for a in group), key=lambda a: a.time)
        for source, group in accesses.items():
            if group:
                summary.accesses[source] = len(group)
                m.accesses.labels(rt.name, source).inc(len(group))
        rt.policy.record_many(merged)
        decision = rt.policy.on_tick(now)
        summary.admitted = len(decision.admit)
        if decision.admit:
            m.decisions.labels(rt.name, "admit").inc(len(decision.admit))
        for ev in decision.evict:
            summary.evicted[ev.action.value] = summary.evicted.get(ev.action.value, 0) + 1
            m.decisions.labels(rt.name, ev.action.value).inc()
        if decision.admit or decision.evict:
            _LOG.info(
                "policy decision",
                extra={
                    "event": "decision",
                    "switch": rt.name,
                    "admit": len(decision.admit),
                    "evict": len(decision.evict),
                    "dry_run": self.config.policy.dry_run,
                },
            )
        if not self.config.policy.dry_run and ready:
            try:
                await self._apply(rt, decision, now, summary)
                summary.applied = True
            except _StopApplying:
                summary.errors += 1
        self._update_gauges(rt)
        rt.last_tick = summary
        return summary

    def _doorkeeper(self, rt: SwitchRuntime, reported: list[Access]) -> list[Access]:
        """Holds reported accesses of a chunk back until it has ``policy.min_accesses``.

        A static chunk passes at once: its reuse is declared, or was measured by the class rule.
        """
        for a in reported:
            rt.admission.observe(a.key)
        setting = self.config.policy.min_accesses
        need = rt.admission.threshold() if setting == "auto" else setting
        self.metrics.min_accesses.labels(rt.name).set(need)
        if need <= 1:
            return reported
        out: list[Access] = []
        held_now = 0
        static = rt.policy.static_keys()
        for a in reported:
            if a.key in rt.passed or a.key in static:
                if a.key in rt.passed:
                    rt.passed.move_to_end(a.key)
                out.append(a)
                continue
            held = rt.held.pop(a.key, [])
            held.append(a)
            if len(held) < need:
                rt.held[a.key] = held
                held_now += 1
                continue
            out.extend(held)
            rt.passed[a.key] = None
            if len(rt.passed) > _MAX_TRACKED_KEYS:
                rt.passed.popitem(last=False)
        while len(rt.held) > _MAX_TRACKED_KEYS:
            rt.held.popitem(last=False)
        if held_now:
            self.metrics.held.labels(rt.name).inc(held_now)
        return out

    async def _counter_accesses(self, rt: SwitchRuntime, now: float) -> list[Access]:
        counts = await rt.stats.cache_hits()
        out: list[Access] = []
        cap = self.config.sketch.threshold
        for chunk, entry in rt.loader.resident().items():
            account = rt.hits.get(chunk)
            if account is None or account.epoch != entry.epoch:
                account = rt.hits[chunk] = _HitAccount(entry.epoch)
            packets = counts.get(chunk, 0)
            account.frags_lagged, account.frags_now = account.frags_now, packets
            fetches = account.frags_lagged // max(1, entry.frag_count)
            unexplained = fetches - account.reported - account.emitted
            if unexplained <= 0:
                continue
            account.emitted += unexplained
            self.metrics.hits.labels(rt.name, "counter").inc(unexplained)
            size = entry.frag_count * c.FRAG_BYTES
            for _ in range(min(unexplained, cap)):
                out.append(Access(chunk.key, chunk.tenant, size, OBSERVER_HOST, now, True))
        for chunk in [ch for ch in rt.hits if rt.loader.entry(ch) is None]:
            del rt.hits[chunk]
        return out

    async def _digest_accesses(self, rt: SwitchRuntime, now: float) -> list[Access]:
        out: list[Access] = []
        window = self.config.sketch.window_s
        cap = self.config.sketch.threshold
        while rt.digests:
            miss = rt.digests.popleft()
            info = self._keys.get(miss.key)
            if info is not None and info.last_report >= now - window:
                self.metrics.digests.labels(rt.name, "explained").inc()
                continue
            self.metrics.digests.labels(rt.name, "unexplained").inc()
            nbytes = info.nbytes if info is not None else None
            if nbytes is None:
                try:
                    nbytes = await self._source.size(miss.tenant, miss.key)
                except ChunkUnavailableError as exc:
                    _LOG.info(
                        "hot miss ignored: %s",
                        exc,
                        extra={"event": "digest", "switch": rt.name, "key": f"{miss.key:#x}"},
                    )
                    continue
            self._remember(miss.key, miss.tenant, nbytes, None)
            self.metrics.misses.labels(rt.name, "digest").inc()
            for _ in range(max(1, min(miss.estimate, cap))):
                out.append(
                    Access(miss.key, miss.tenant, _footprint(nbytes), OBSERVER_HOST, now, False)
                )
        return out

    def _adoption_accesses(self, rt: SwitchRuntime, now: float) -> list[Access]:
        out: list[Access] = []
        resident = rt.policy.resident_keys()
        for chunk, entry in rt.loader.resident().items():
            if chunk in rt.adopted or chunk.key in resident or chunk in rt.data:
                continue
            rt.adopted.add(chunk)
            info = self._keys.get(chunk.key)
            self._remember(chunk.key, chunk.tenant, info.nbytes if info else None, None)
            size = entry.frag_count * c.FRAG_BYTES
            out.append(Access(chunk.key, chunk.tenant, size, OBSERVER_HOST, now, None))
            _LOG.info(
                "adopted cache entry",
                extra={"event": "adopt", "switch": rt.name, "chunk": str(chunk)},
            )
        return out

    # ------------------------------------------------------------------ applying
    async def _apply(
        self, rt: SwitchRuntime, decision: Decision, now: float, summary: TickSummary
    ) -> None:
        loaded = rt.loader.resident()
        by_key = {chunk.key: chunk for chunk in loaded}
        for ev in decision.evict:
            chunk = by_key.get(ev.key)
            if chunk is not None:
                await self._unload(rt, chunk, ev.action, ev.residual, summary)
        wanted = rt.policy.resident_keys()
        for chunk in list(rt.loader.resident()):
            if chunk.key not in wanted:
                await self._unload(rt, chunk, EvictAction.DROP, 0.0, summary)
        loaded_keys = {chunk.key for chunk in rt.loader.resident()}
        order = [a.key for a in decision.admit]
        order += sorted(wanted - set(order))
        budget = self.config.max_loads_per_tick
        for key in order:
            if key in loaded_keys or key not in wanted:
                continue
            if budget == 0:
                self._skip(rt, summary, "deferred")
                continue
            if rt.absent.get(key, now) > now:
                continue  # the pool did not have it lately
            budget -= 1
            await self._load(rt, key, now, summary)

    def _skip(self, rt: SwitchRuntime, summary: TickSummary, reason: str) -> None:
        summary.skipped[reason] = summary.skipped.get(reason, 0) + 1
        self.metrics.load_skipped.labels(rt.name, reason).inc()

    async def _unload(
        self,
        rt: SwitchRuntime,
        chunk: ChunkId,
        action: EvictAction,
        residual: float,
        summary: TickSummary,
    ) -> None:
        try:
            await rt.loader.evict(chunk)
        except NotInstalledError:
            return
        except ControlPlaneError as exc:
            self.metrics.write_errors.labels(rt.name).inc()
            _LOG.warning(
                "eviction failed: %s", exc, extra={"event": "evict_error", "switch": rt.name}
            )
            raise _StopApplying from exc
        data = rt.data.pop(chunk, None)
        rt.hits.pop(chunk, None)
        rt.adopted.discard(chunk)
        summary.unloaded[action.value] = summary.unloaded.get(action.value, 0) + 1
        self.metrics.evictions.labels(rt.name, action.value).inc()
        self.metrics.class_evictions.labels(rt.name, rt.count_class(chunk.key, "evictions")).inc()
        record: dict[str, Any] = {
            "event": "evict",
            "switch": rt.name,
            "chunk": str(chunk),
            "action": action.value,
            "residual": round(residual, 4),
        }
        if action is EvictAction.DEMOTE:
            try:
                record["written_back"] = await self._source.ensure(chunk.tenant, chunk.key, data)
                record["in_pool"] = True
            except ChunkUnavailableError as exc:
                record["in_pool"] = False
                record["error"] = str(exc)
                self.metrics.demotions_unreturned.labels(rt.name).inc()
            rt.demoted.append(record)
        _LOG.info("chunk evicted", extra=record)

    async def _load(self, rt: SwitchRuntime, key: int, now: float, summary: TickSummary) -> None:
        """Loads one chunk the policy holds resident, or says in ``summary`` why not."""
        info = self._keys.get(key)
        if info is None:
            self._skip(rt, summary, "unknown_key")
            return
        tenant = info.tenant
        frags = -(-info.nbytes // c.FRAG_BYTES) if info.nbytes is not None else None
        stats = rt.loader.allocator.stats()
        if stats.ranges >= stats.max_ranges or (frags is not None and stats.largest_free < frags):
            self._skip(rt, summary, "no_fit")
            return
        try:
            data = await self._source.read(tenant, key, info.nbytes)
        except ChunkNotFoundError as exc:
            self._skip(rt, summary, "not_in_pool")
            rt.absent[key] = now + self._absent_backoff_s
            _LOG.info(
                "chunk not in the pool; not tried again for %.0f s: %s",
                self._absent_backoff_s,
                exc,
                extra={"event": "load", "switch": rt.name, "key": f"{key:#x}"},
            )
            return
        except ChunkUnavailableError as exc:
            self._skip(rt, summary, "pool_unavailable")
            _LOG.info("chunk not read: %s", exc, extra={"event": "load", "switch": rt.name})
            if info.nbytes is not None and "another length" in str(exc):
                info.nbytes = None  # probed again next time
            return
        info.nbytes = len(data)
        try:
            entry = await rt.loader.load(tenant, key, data)
        except AllocationError:
            self._skip(rt, summary, "no_fit")
            return
        except (FragmentLoadError, SwitchError) as exc:
            self.metrics.write_errors.labels(rt.name).inc()
            _LOG.warning("load failed: %s", exc, extra={"event": "load_error", "switch": rt.name})
            raise _StopApplying from exc
        except ConfigError as exc:  # resident with other bytes, or too many fragments
            self._skip(rt, summary, "rejected")
            _LOG.warning("load refused: %s", exc, extra={"event": "load", "switch": rt.name})
            return
        rt.data[entry.chunk] = data
        rt.hits[entry.chunk] = _HitAccount(entry.epoch)
        summary.loaded += 1
        self.metrics.loads.labels(rt.name).inc()
        self.metrics.load_bytes.labels(rt.name).inc(len(data))
        name = rt.count_class(key, "load_bytes", len(data))
        self.metrics.class_load_bytes.labels(rt.name, name).inc(len(data))
        _LOG.debug(
            "chunk loaded",
            extra={
                "event": "load",
                "switch": rt.name,
                "chunk": str(entry.chunk),
                "slot_base": entry.slot_base,
                "frag_count": entry.frag_count,
                "epoch": entry.epoch,
            },
        )

    # ------------------------------------------------------------------ status
    def _update_gauges(self, rt: SwitchRuntime) -> None:
        stats = rt.loader.allocator.stats()
        self.metrics.sram_used.labels(rt.name).set(stats.used * c.FRAG_BYTES)
        self.metrics.resident.labels(rt.name).set(len(rt.loader.resident()))
        self.metrics.policy_resident.labels(rt.name).set(len(rt.policy.resident_keys()))
        for name, nbytes in self._resident_by_class(rt).items():
            self.metrics.class_resident_bytes.labels(rt.name, name).set(nbytes)

    @staticmethod
    def _resident_by_class(rt: SwitchRuntime) -> dict[str, int]:
        """SRAM bytes (whole fragment slots) of the chunks on the switch, by class."""
        out = dict.fromkeys(KV_CLASS_NAMES, 0)
        for chunk, entry in rt.loader.resident().items():
            out[rt.policy.kv_class(chunk.key).value] += entry.frag_count * c.FRAG_BYTES
        return out

    def _refresh_status(self) -> None:
        switches: dict[str, Any] = {}
        for name, rt in self.switches.items():
            stats = rt.loader.allocator.stats()
            resident = self._resident_by_class(rt)
            switches[name] = {
                "address": rt.spec.address,
                "generation": rt.client.generation,
                "last_error": str(rt.client.last_error) if rt.client.last_error else None,
                "resident_chunks": len(rt.loader.resident()),
                "policy_resident_chunks": len(rt.policy.resident_keys()),
                "sram_used_bytes": stats.used * c.FRAG_BYTES,
                "sram_budget_bytes": self.config.sram_budget_bytes,
                "fragmentation": round(stats.fragmentation, 4),
                "last_tick": asdict(rt.last_tick) if rt.last_tick else None,
                "recent_demotions": list(rt.demoted)[-8:],
                "classes": {
                    name: {**figures, "resident_bytes": resident[name]}
                    for name, figures in rt.class_figures.items()
                },
                "last_push": None
                if rt.last_push is None
                else {
                    "chunks": len(rt.last_push.orders),
                    "pool_bytes": rt.last_push.pool_bytes,
                    "unicast_bytes": rt.last_push.unicast_bytes,
                    "deliveries": rt.last_push.deliveries,
                    "budget_bytes": rt.last_push.budget_bytes,
                    "deferred": rt.last_push.deferred,
                    "too_large": rt.last_push.too_large,
                },
            }
        with self._classes_lock:
            static_chunks = len(self.classes.static())
            promoted, demoted = dict(self.classes.promoted), dict(self.classes.demoted)
            refused = self.classes.refused
        self._status = {
            "started": True,
            "started_at": self._started_at,
            "uptime_s": round(self._clock() - self._started_at, 3),
            "ticks": self._ticks,
            "policy": self.config.policy.name,
            "dry_run": self.config.policy.dry_run,
            "tick_s": self.config.tick_s,
            "tracked_keys": len(self._keys),
            "static_chunks": static_chunks,
            "static_promotions": promoted,
            "static_demotions": demoted,
            "static_refused": refused,
            "switches": switches,
        }


# ------------------------------------------------------------------------------ serving
async def serve(
    config: DaemonConfig,
    *,
    stop: asyncio.Event | None = None,
    ready: Callable[[Controller], None] | None = None,
) -> None:
    """Runs a controller until SIGTERM or SIGINT (or ``stop`` is set), then stops it cleanly.

    Args:
        config: the configuration.
        stop: an event that also stops it (tests).
        ready: called once the controller has started.

    Raises:
        ControlPlaneError: the controller could not start (bad files, address in use).
    """
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop.set)
            installed.append(sig)
    try:
        controller = Controller(config)
        await controller.start()
        try:
            if ready is not None:
                ready(controller)
            await stop.wait()
            _LOG.info("stopping", extra={"event": "signal"})
        finally:
            await controller.stop()
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
