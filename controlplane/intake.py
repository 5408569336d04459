"""The controller's intake: what hosts tell it over HTTP, and the accesses each tick feeds a policy.

The report API's threads hand records to :class:`ReportIntake`, which checks their host and
queues them; each tick drains the queue, observes every record's class, and routes the accesses
to their host's switch. :class:`SwitchAccesses` then gathers one switch's accesses for its
policy: the reported ones past the doorkeeper (``policy.min_accesses``), the hits the cache
table's counters show that no report explains, the hot-miss digests no host reported, and the
chunks a previous controller left on the switch.

Classes:
    RoutedReport: one reported access, with its host's policy id, switch and clamped time.
    Intake: what one tick drained: the records, the routed accesses, the accesses by switch.
    ReportIntake: the report queue, the hosts' routing, the chunks' KV classes and the HTTP
        routes of ``/v1/groups/<switch>``, ``/v1/sources`` and ``/v1/classes``.
    SwitchAccesses: one switch's accesses for its policy each tick.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, NamedTuple

from controlplane.chunksource import ChunkUnavailableError
from controlplane.configspec import DaemonConfig
from controlplane.drivers import ChunkId
from controlplane.errors import SwitchError
from controlplane.kvclasses import (
    ClassDeclarationError,
    ClassRegistry,
    StaticEntry,
    parse_declaration,
)
from controlplane.metrics import ControllerMetrics
from controlplane.policies import Access
from controlplane.reports import Handler, ReportRejectedError, Response
from controlplane.runtime import (
    MAX_TRACKED_KEYS,
    OBSERVER_HOST,
    HitAccount,
    KeyTable,
    SwitchRuntime,
    TickStep,
    TickSummary,
)
from kvcast import p4constants as c
from kvcast.kvclass import KvClass
from kvcast.kvp import padded_bytes
from kvcast.reports import AccessReport

__all__ = ["Intake", "ReportIntake", "RoutedReport", "SwitchAccesses"]

_LOG = logging.getLogger("controlplane.daemon")


class RoutedReport(NamedTuple):
    """One reported access on its way to a switch's policy.

    Attributes:
        report: the record.
        host_id: the policy's id of the reporting host.
        switch: the host's switch.
        time: the record's time, clamped to the tick's.
    """

    report: AccessReport
    host_id: int
    switch: str
    time: float


@dataclass
class Intake:
    """What one tick drained from the report queue.

    Attributes:
        reports: every record, ``stored`` ones included.
        routed: the accesses among them, routed to their switch.
        per_switch: the policy accesses of each switch (every switch has a list).
    """

    reports: list[AccessReport]
    routed: list[RoutedReport]
    per_switch: dict[str, list[Access]]


class ReportIntake:
    """Access reports and class declarations in: checked, queued, and routed each tick.

    The report API's threads call :meth:`submit_reports` and the class routes; the tick (the
    event loop) calls :meth:`drain`. The chunks' classes are kept under one lock for both.

    Args:
        config: the configuration.
        switches: the switches, by name.
        metrics: where to count.
        keys: the chunks the controller has heard of.
        clock: wall clock in Unix seconds.
    """

    def __init__(
        self,
        config: DaemonConfig,
        switches: Mapping[str, SwitchRuntime],
        metrics: ControllerMetrics,
        keys: KeyTable,
        clock: Callable[[], float],
    ) -> None:
        self._config = config
        self._switches = switches
        self._metrics = metrics
        self._keys = keys
        self._clock = clock
        self._hosts: dict[str | int, tuple[int, str]] = {}
        self._host_names: dict[str | int, str] = {}
        for h in config.hosts:
            self._hosts[h.name] = (h.id, h.switch)
            self._hosts[h.id] = (h.id, h.switch)
            self._host_names[h.name] = self._host_names[h.id] = h.name
        self._queue: collections.deque[AccessReport] = collections.deque()
        self._queue_lock = threading.Lock()
        # Chunks' classes: records (tick) and POST /v1/classes (HTTP threads) under one lock.
        self.classes = ClassRegistry(config.classes)
        self._classes_lock = threading.Lock()
        self._promoted_seen: collections.Counter[str] = collections.Counter()
        self._demoted_seen: collections.Counter[str] = collections.Counter()
        self._refused_seen = 0

    # ------------------------------------------------------------------ HTTP threads
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
            if self._config.hosts:
                for i, r in enumerate(reports):
                    if r.host not in self._hosts:
                        names = sorted(str(h.name) for h in self._config.hosts)
                        raise ReportRejectedError(
                            400,
                            f"reports[{i}].host: unknown host {r.host!r}; configured hosts: "
                            f"{', '.join(names)}",
                        )
            elif len(self._switches) > 1:
                raise ReportRejectedError(
                    400, "no hosts are configured, so reports cannot be routed to a switch"
                )
            with self._queue_lock:
                if len(self._queue) + len(reports) > self._config.report_api.max_queue:
                    raise ReportRejectedError(
                        503,
                        f"report queue full ({len(self._queue)} records waiting for the next "
                        "tick); retry later",
                    )
                self._queue.extend(reports)
        except ReportRejectedError as exc:
            self._metrics.report_requests.labels(str(exc.status)).inc()
            raise
        self._metrics.report_requests.labels("202").inc()
        self._metrics.reports.inc(len(reports))
        return len(reports)

    def queued(self) -> int:
        """How many records wait for the next tick (thread-safe)."""
        with self._queue_lock:
            return len(self._queue)

    def routes(self) -> dict[tuple[str, str], Handler]:
        """The HTTP routes of ``/v1/groups/<switch>``, ``/v1/sources`` and ``/v1/classes``."""
        return {**self._group_routes(), **self._source_routes(), **self._class_routes()}

    def _source_routes(self) -> dict[tuple[str, str], Handler]:
        """``GET /v1/sources``: each host's address and the tenants its port is bound to.

        What the switches vouch for (``bind_host``, ``tenant_binding``), for pool nodes: one
        started with ``--source-tenants-url`` refuses a GET naming a tenant its source address
        is not bound to (poolnode.tenants). ``"any"`` for a host configured ``tenants: any``.
        """
        doc = {
            "sources": {
                h.ip: "any" if h.tenants is None else sorted(h.tenants) for h in self._config.hosts
            }
        }

        def sources(_body: bytes) -> Response:
            return Response.json(HTTPStatus.OK, doc)

        return {("GET", "/v1/sources"): sources}

    def _group_routes(self) -> dict[tuple[str, str], Handler]:
        """``GET /v1/groups/<switch>``: the multicast groups of each switch, for pool nodes.

        A pool node started with ``--groups-url`` echoes only these groups (poolnode.groups).
        """
        routes: dict[tuple[str, str], Handler] = {}
        for name, rt in self._switches.items():

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
                self._metrics.class_declarations.labels("400").inc()
                return Response.json(HTTPStatus.BAD_REQUEST, {"error": str(exc)})
            now = self._clock()
            with self._classes_lock:
                for key in decl.keys:
                    self.classes.declare(decl.tenant, key, decl.kv_class, now, decl.ttl_s)
            self._metrics.class_declarations.labels("200").inc()
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

    # ------------------------------------------------------------------ the tick
    def drain(self, now: float) -> Intake:
        """Takes the queued records, updates the classes, and routes the accesses.

        Args:
            now: the tick's time.

        Returns:
            The records and the accesses by switch.
        """
        with self._queue_lock:
            reports = list(self._queue)
            self._queue.clear()
        per_switch: dict[str, list[Access]] = {name: [] for name in self._switches}
        skew = self._config.report_api.clock_skew_s
        routed: list[RoutedReport] = []
        with self._classes_lock:
            for r in reports:
                t = r.time
                if not r.stored and t > now + skew:
                    self._metrics.clock_skew.inc()
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
                routed.append(RoutedReport(r, host_id, switch, t))
            self._apply_classes(now)
        for r, host_id, switch, t in routed:
            self._keys.remember(r.key, r.tenant, r.size, t)
            rt_of = self._switches[switch]
            name = rt_of.count_class(r.key, "accesses")
            self._metrics.class_accesses.labels(switch, name).inc()
            if r.hit is True:
                rt_of.count_class(r.key, "hits")
                self._metrics.class_hits.labels(switch, name).inc()
            per_switch[switch].append(
                Access(
                    r.key,
                    r.tenant,
                    padded_bytes(r.size),
                    host_id,
                    t,
                    r.hit,
                    r.parent,
                    r.position,
                )
            )
        return Intake(reports, routed, per_switch)

    def switch_of(self, host: str | int) -> str:
        """The switch of a reporting host (the first switch when hosts are not configured)."""
        return self._hosts.get(host, (0, next(iter(self._switches))))[1]

    def host_name(self, host: str | int) -> str:
        """The configured name of a reporting host (its id or name as sent otherwise)."""
        return self._host_names.get(host, str(host))

    def static_chunks(self) -> tuple[dict[int, StaticEntry], dict[int, int | None]]:
        """The static chunks now and each one's parent (thread-safe)."""
        with self._classes_lock:
            static = self.classes.static()
            parents = {k: self.classes.parent(k) for k in static}
        return static, parents

    def class_status(self) -> dict[str, Any]:
        """The classes' figures for the status (thread-safe)."""
        with self._classes_lock:
            return {
                "static_chunks": len(self.classes.static()),
                "static_promotions": dict(self.classes.promoted),
                "static_demotions": dict(self.classes.demoted),
                "static_refused": self.classes.refused,
            }

    def _host_of(self, report: AccessReport) -> tuple[int, str]:
        found = self._hosts.get(report.host)
        if found is not None:
            return found
        # No hosts configured (checked at intake): one switch, ids by first sight. Only the tick
        # (the event loop) adds entries; the intake threads never read this map in this mode.
        switch = next(iter(self._switches))
        if isinstance(report.host, int):
            return report.host, switch
        hid = (1 << 30) + len(self._hosts)
        self._hosts[report.host] = (hid, switch)
        return hid, switch

    def _apply_classes(self, now: float) -> None:
        """Expires and promotes classes, and tells every policy of each change."""
        changes = self.classes.tick(now)
        for rt in self._switches.values():
            for key, kv_class in changes.items():
                rt.policy.set_kv_class(key, kv_class)
        m = self._metrics
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
        self._keys.remember(r.key, r.tenant, r.size, None)
        for rt in self._switches.values():
            rt.absent.pop(r.key, None)
        self._metrics.stored.inc()


class SwitchAccesses(TickStep):
    """One switch's accesses for its policy each tick, from the reports and the switch itself.

    Args: those of :class:`~controlplane.runtime.TickStep` (the chunk source gives the length
    of a chunk a digest names that no report did).
    """

    async def collect(
        self,
        rt: SwitchRuntime,
        now: float,
        reported: list[Access],
        ready: bool,
        summary: TickSummary,
    ) -> list[Access]:
        """The tick's accesses of one switch, oldest first, counted in ``summary``.

        Args:
            rt: the switch.
            now: the tick's time.
            reported: the accesses its hosts reported.
            ready: whether the switch is READY (its hit counters are read only then).
            summary: the tick's summary of the switch.

        Returns:
            The accesses to record in the policy.
        """
        m = self._metrics
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
        return merged

    def _doorkeeper(self, rt: SwitchRuntime, reported: list[Access]) -> list[Access]:
        """Holds reported accesses of a chunk back until it has ``policy.min_accesses``.

        A static chunk passes at once: its reuse is declared, or was measured by the class rule.
        """
        for a in reported:
            rt.admission.observe(a.key)
        setting = self._config.policy.min_accesses
        need = rt.admission.threshold() if setting == "auto" else setting
        self._metrics.min_accesses.labels(rt.name).set(need)
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
            if len(rt.passed) > MAX_TRACKED_KEYS:
                rt.passed.popitem(last=False)
        while len(rt.held) > MAX_TRACKED_KEYS:
            rt.held.popitem(last=False)
        if held_now:
            self._metrics.held.labels(rt.name).inc(held_now)
        return out

    async def _counter_accesses(self, rt: SwitchRuntime, now: float) -> list[Access]:
        counts = await rt.stats.cache_hits()
        out: list[Access] = []
        cap = self._config.sketch.threshold
        for chunk, entry in rt.loader.resident().items():
            account = rt.hits.get(chunk)
            if account is None or account.epoch != entry.epoch:
                account = rt.hits[chunk] = HitAccount(entry.epoch)
            packets = counts.get(chunk, 0)
            account.frags_lagged, account.frags_now = account.frags_now, packets
            fetches = account.frags_lagged // max(1, entry.frag_count)
            unexplained = fetches - account.reported - account.emitted
            if unexplained <= 0:
                continue
            account.emitted += unexplained
            self._metrics.hits.labels(rt.name, "counter").inc(unexplained)
            size = entry.frag_count * c.FRAG_BYTES
            for _ in range(min(unexplained, cap)):
                out.append(Access(chunk.key, chunk.tenant, size, OBSERVER_HOST, now, True))
        for chunk in [ch for ch in rt.hits if rt.loader.entry(ch) is None]:
            del rt.hits[chunk]
        return out

    async def _digest_accesses(self, rt: SwitchRuntime, now: float) -> list[Access]:
        out: list[Access] = []
        window = self._config.sketch.window_s
        cap = self._config.sketch.threshold
        while rt.digests:
            miss = rt.digests.popleft()
            info = self._keys.get(miss.key)
            if info is not None and info.last_report >= now - window:
                self._metrics.digests.labels(rt.name, "explained").inc()
                continue
            self._metrics.digests.labels(rt.name, "unexplained").inc()
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
            self._keys.remember(miss.key, miss.tenant, nbytes, None)
            self._metrics.misses.labels(rt.name, "digest").inc()
            for _ in range(max(1, min(miss.estimate, cap))):
                out.append(
                    Access(miss.key, miss.tenant, padded_bytes(nbytes), OBSERVER_HOST, now, False)
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
            self._keys.remember(chunk.key, chunk.tenant, info.nbytes if info else None, None)
            size = entry.frag_count * c.FRAG_BYTES
            out.append(Access(chunk.key, chunk.tenant, size, OBSERVER_HOST, now, None))
            _LOG.info(
                "adopted cache entry",
                extra={"event": "adopt", "switch": rt.name, "chunk": str(chunk)},
            )
        return out
