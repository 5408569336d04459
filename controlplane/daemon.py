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
   the plan; with hosts that have an ``engine_url``, first sends the registered static
   prefixes (``POST /v1/static``) to their engines (``controlplane.pusher``: one completions
   request per engine, one multicast group per order, on a thread pool; the next tick collects
   and counts the answers), whose bytes come off what the chunk plan may use;
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

The daemon is a thin composition: :class:`~controlplane.intake.ReportIntake` (the report and
class API, routing), :class:`~controlplane.intake.SwitchAccesses` (each switch's accesses),
the policy, :class:`~controlplane.apply.DecisionApplier` (the writes),
:class:`~controlplane.pusher.EnginePusher` (the engine pushes),
:class:`~controlplane.metrics.ControllerMetrics` and, on a leaf-spine fabric,
:class:`~controlplane.fabric.FabricTrees` (every multicast group one tree across the switches;
spine and link failover, ``/v1/fabric/links``); each switch is a
:class:`~controlplane.runtime.SwitchRuntime`. It logs under ``controlplane.daemon``.

Classes:
    Controller: the daemon (start, tick, stop, report intake, push planning, status).

Functions:
    serve: run a controller until SIGTERM/SIGINT.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from typing import Any

from prometheus_client.exposition import CONTENT_TYPE_LATEST

from controlplane.apply import DecisionApplier
from controlplane.chunksource import ChunkSource, ChunkUnavailableError, KvpChunkSource
from controlplane.configspec import DaemonConfig
from controlplane.drivers import ConsistentHashRing, MulticastDriver
from controlplane.errors import ControlPlaneError, SwitchUnavailableError
from controlplane.fabric import LINKS_PATH, FabricTrees
from controlplane.intake import ReportIntake, RoutedReport, SwitchAccesses
from controlplane.metrics import ControllerMetrics
from controlplane.p4rt import SwitchFleet
from controlplane.policies import Access
from controlplane.push import PushCandidate, PushHost
from controlplane.pusher import EnginePusher
from controlplane.reports import HttpApi, Response, report_routes
from controlplane.runtime import KeyTable, SwitchRuntime, TickSummary
from kvcast import p4constants as c
from kvcast.reports import AccessReport

__all__ = ["Controller", "serve"]

_LOG = logging.getLogger("controlplane.daemon")


def _addr(address: tuple[str, int] | None) -> str | None:
    return f"{address[0]}:{address[1]}" if address is not None else None


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
        plan = config.fabric_plan()
        self.switches = {
            s.name: SwitchRuntime(s, config, self.metrics, plan) for s in config.switches
        }
        # On a leaf-spine fabric every multicast group is one tree across the switches.
        self.fabric = FabricTrees(plan, self.switches, self.metrics) if plan is not None else None
        self.fleet = SwitchFleet(rt.client for rt in self.switches.values())
        self._source = chunk_source or self._kvp_source()
        self._keys = KeyTable()
        self.intake = ReportIntake(config, self.switches, self.metrics, self._keys, clock)
        self._accesses = SwitchAccesses(config, self.metrics, self._keys, self._source)
        self._applier = DecisionApplier(config, self.metrics, self._keys, self._source)
        # Engine pushes only where a host names its engine.
        self.pusher: EnginePusher | None = (
            EnginePusher(config, self.metrics)
            if any(h.engine_url is not None for h in config.hosts)
            else None
        )
        self._tasks: list[asyncio.Task[None]] = []
        self._report_api: HttpApi | None = None
        self._metrics_api: HttpApi | None = None
        self._status: dict[str, Any] = {"started": False}
        for setting, name in config.unisolated():
            self.metrics.unisolated.labels(setting, name).set(1)
        self._started_at = 0.0
        self._tick_lock = asyncio.Lock()
        self._ticks = 0

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
            {
                **report_routes(self),
                **self.intake.routes(),
                **(self.pusher.routes() if self.pusher is not None else {}),
                **(
                    self.fabric.routes(asyncio.get_running_loop())
                    if self.fabric is not None
                    else {}
                ),
            },
            max_body_bytes=api.max_body_bytes,
            name="report-api",
            restricted={("POST", LINKS_PATH): frozenset(api.operators)},
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
            if self.fabric is not None:
                await self.fabric.start()
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
        if self.fabric is not None:
            await self.fabric.stop()
        await self.fleet.stop()
        for api in (self._report_api, self._metrics_api):
            if api is not None:
                api.stop()
        self._report_api = self._metrics_api = None
        if self.pusher is not None:
            self.pusher.close()
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
        """Queues validated records for the next tick (the report API's sink).

        See :meth:`~controlplane.intake.ReportIntake.submit_reports`, which it delegates to.
        """
        return self.intake.submit_reports(reports)

    def status(self) -> Mapping[str, Any]:
        """The status as of the last tick, with live connection states (thread-safe)."""
        out = dict(self._status)
        out["switches"] = {
            name: {**sw, "state": self.switches[name].client.state.value}
            for name, sw in dict(out.get("switches", {})).items()
        }
        out["queued_reports"] = self.intake.queued()
        return out

    def _note_holders(
        self, reports: Sequence[AccessReport], routed: Sequence[RoutedReport]
    ) -> dict[str, int]:
        """Notes who holds what for the push planners; returns each switch's pulled bytes."""
        pulls = dict.fromkeys(self.switches, 0)
        planners = {n: rt.push for n, rt in self.switches.items() if rt.push is not None}
        for r in reports:
            host = self.intake.host_name(r.host)
            if self.pusher is not None:
                self.pusher.saw(host)
            planner = planners.get(self.intake.switch_of(r.host))
            if r.stored and planner is not None:
                planner.note_held(r.key, host)
        for r, _hid, switch, _t in routed:
            if r.hit is False:
                pulls[switch] += r.size  # read from the pool
            planner = planners.get(switch)
            if planner is not None:
                planner.note_held(r.key, self.intake.host_name(r.host))
        return pulls

    async def _push_prefixes(self, pusher: EnginePusher, pulls: dict[str, int], now: float) -> None:
        """Collects finished pushes, then plans and sends each switch's engine pushes.

        Their bytes are added to ``pulls``: the chunk plan gets what they left of the budget.
        """
        for switch, group in pusher.collect(now):
            try:
                await self._groups(switch).delete_group(group)
            except ControlPlaneError as exc:
                _LOG.warning(
                    "push group %d not deleted on %s: %s",
                    group,
                    switch,
                    exc,
                    extra={"event": "push_group_error", "switch": switch},
                )
        for name, rt in self.switches.items():
            plan = pusher.plan(name, pulls[name], now)
            for order in plan.orders:
                hosts = pusher.admit(name, order)
                if not hosts:
                    continue
                group, created = 0, False
                if len(hosts) > 1:
                    try:
                        if not rt.client.is_ready:
                            raise SwitchUnavailableError(name, "not ready")
                        groups = self._groups(name)
                        found = groups.group_of(hosts)
                        created = found is None
                        if found is None:
                            found = await groups.create_group(hosts)
                        group = found
                    except ControlPlaneError as exc:
                        pusher.cancel(name, order, hosts)  # planned again next tick
                        _LOG.warning(
                            "push of %016x deferred: no multicast group on %s: %s",
                            order.key,
                            name,
                            exc,
                            extra={"event": "push_group_error", "switch": name},
                        )
                        continue
                if pusher.send(name, order, hosts, group, created):
                    pulls[name] += order.pool_bytes
                elif created:
                    with contextlib.suppress(ControlPlaneError):  # made for nothing
                        await self._groups(name).delete_group(group)

    def _groups(self, switch: str) -> MulticastDriver | FabricTrees:
        """Where a group of ``switch``'s hosts is made: the fabric's trees, or the switch."""
        return self.fabric if self.fabric is not None else self.switches[switch].multicast

    def _plan_pushes(self, pulls: Mapping[str, int], now: float) -> None:
        """Plans and counts each switch's pushes of static chunks."""
        planners = {n: rt.push for n, rt in self.switches.items() if rt.push is not None}
        if not planners:
            return
        static, parents = self.intake.static_chunks()
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

    # ------------------------------------------------------------------ the tick
    async def tick(self) -> dict[str, TickSummary]:
        """Runs one decision tick on every switch.

        Returns:
            What it did, by switch.
        """
        async with self._tick_lock:
            started = time.perf_counter()
            now = self._clock()
            batch = self.intake.drain(now)
            per_switch = batch.per_switch
            pulls = self._note_holders(batch.reports, batch.routed)
            if self.pusher is not None:
                await self._push_prefixes(self.pusher, pulls, now)
            self._plan_pushes(pulls, now)
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
        ready = rt.client.is_ready
        merged = await self._accesses.collect(rt, now, reported, ready, summary)
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
            await self._applier.apply(rt, decision, now, summary)
        rt.update_gauges()
        rt.last_tick = summary
        return summary

    def _refresh_status(self) -> None:
        switches: dict[str, Any] = {}
        for name, rt in self.switches.items():
            stats = rt.loader.allocator.stats()
            resident = rt.resident_bytes_by_class()
            switches[name] = {
                "address": rt.spec.address,
                "generation": rt.client.generation,
                "synced_generation": rt.client.synced_generation,
                "last_error": str(rt.client.last_error) if rt.client.last_error else None,
                "resident_chunks": len(rt.loader.resident()),
                "policy_resident_chunks": len(rt.policy.resident_keys()),
                "sram_used_bytes": stats.used * c.FRAG_BYTES,
                "sram_budget_bytes": self.config.sram_budget_bytes,
                "fragmentation": round(stats.fragmentation, 4),
                "multicast_groups": len(rt.multicast.groups()),
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
        self._status = {
            "started": True,
            "started_at": self._started_at,
            "uptime_s": round(self._clock() - self._started_at, 3),
            "ticks": self._ticks,
            "policy": self.config.policy.name,
            "dry_run": self.config.policy.dry_run,
            "tick_s": self.config.tick_s,
            "tracked_keys": len(self._keys),
            # Explicit opt-outs of isolation in the configuration (logged at load too).
            "unisolated": [
                {"setting": setting, "name": name} for setting, name in self.config.unisolated()
            ],
            **self.intake.class_status(),
            "push_engines": None
            if self.pusher is None
            else {
                "prefixes": len(self.pusher.registry),
                "inflight": self.pusher.inflight(),
                "waiting": self.pusher.waiting(),
            },
            "switches": switches,
            "fabric": None if self.fabric is None else self.fabric.status(),
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
