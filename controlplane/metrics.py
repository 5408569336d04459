"""The controller daemon's Prometheus metrics.

Classes:
    ControllerMetrics: every ``kvcast_controller_*`` metric, in a registry of its own; the
        daemon's objects (intake, apply, the switch runtimes) count into it.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["ControllerMetrics"]


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

        def counter(name: str, doc: str, *labels: str) -> Counter:
            return Counter(p + name, doc, list(labels), registry=r)

        def gauge(name: str, doc: str, *labels: str) -> Gauge:
            return Gauge(p + name, doc, list(labels), registry=r)

        self.loads = counter("loads", "Chunks loaded into switch SRAM", "switch")
        self.load_bytes = counter("load_bytes", "Chunk bytes written into switch SRAM", "switch")
        self.load_skipped = counter(
            "load_skipped",
            "Admissions not loaded this tick (no_fit, not_in_pool, pool_unavailable, deferred)",
            "switch",
            "reason",
        )
        self.evictions = counter("evictions", "Chunks evicted from switch SRAM", "switch", "action")
        self.decisions = counter(
            "decisions",
            "Policy decisions, applied or not (dry run): admit, drop, demote",
            "switch",
            "kind",
        )
        self.demotions_unreturned = counter(
            "demotions_unreturned",
            "DEMOTEd chunks the DRAM pool no longer holds and that could not be written back",
            "switch",
        )
        self.hits = counter("hits", "Switch hits learnt (report or counter)", "switch", "source")
        self.misses = counter(
            "misses", "Switch misses learnt (report or digest)", "switch", "source"
        )
        self.accesses = counter("accesses", "Accesses fed to the policy", "switch", "source")
        self.held = counter(
            "accesses_held",
            "Reported accesses held back until their chunk has policy.min_accesses",
            "switch",
        )
        self.digests = counter(
            "digests",
            "Hot-miss digests received (explained: a host reported the key this window)",
            "switch",
            "kind",
        )
        self.reports = counter("reports_received", "Access records accepted by the report API")
        self.min_accesses = gauge(
            "min_accesses",
            "Reported uses a chunk needs before the policy hears of it (policy.min_accesses, "
            "or the learned bar with auto)",
            "switch",
        )
        self.stored = counter(
            "chunks_stored_reported",
            "Chunks hosts reported putting into the DRAM pool (event=stored records)",
        )
        self.report_requests = counter(
            "report_requests", "Report API requests by HTTP status", "code"
        )
        self.clock_skew = counter(
            "report_clock_skew",
            "Records with a time in the future beyond clock_skew_s (clamped to now)",
        )
        self.write_errors = counter("write_errors", "Failed switch writes and loads", "switch")
        self.lost = counter(
            "chunks_lost",
            "Adopted chunks the switch lost (restart) whose bytes the controller never had",
            "switch",
        )
        self.connected = gauge(
            "switch_connected", "1 when the switch is READY (primary, synced)", "switch"
        )
        self.sram_used = gauge("sram_used_bytes", "SRAM bytes in use (fragment slots)", "switch")
        self.sram_budget = gauge("sram_budget_bytes", "SRAM bytes the policy may fill", "switch")
        self.resident = gauge("resident_chunks", "Chunks cached in switch SRAM", "switch")
        self.policy_resident = gauge(
            "policy_resident_chunks", "Chunks the policy holds resident", "switch"
        )
        self.class_accesses = counter(
            "class_accesses",
            "Reported accesses by the chunk's KV class (static, transient)",
            "switch",
            "class",
        )
        self.class_hits = counter(
            "class_hits", "Reported switch hits by the chunk's KV class", "switch", "class"
        )
        self.class_evictions = counter(
            "class_evictions", "Chunks evicted from switch SRAM by KV class", "switch", "class"
        )
        self.class_load_bytes = counter(
            "class_load_bytes",
            "Chunk bytes written into switch SRAM by KV class",
            "switch",
            "class",
        )
        self.class_resident_bytes = gauge(
            "class_resident_bytes", "SRAM bytes of cached chunks by KV class", "switch", "class"
        )
        self.static_promotions = counter(
            "static_promotions",
            "Chunks that became static (declared, detected, prefix of a static chunk)",
            "reason",
        )
        self.static_demotions = counter(
            "static_demotions",
            "Static chunks that went back to transient (declaration expired or revoked, "
            "detection lapsed, no static chunk below a prefix)",
            "reason",
        )
        self.static_chunks = gauge("static_chunks", "Chunks static now")
        self.static_refused = counter(
            "static_refused",
            "Promotions refused because classes.max_keys chunks are static already",
        )
        self.class_declarations = counter(
            "class_declarations", "POST /v1/classes requests by HTTP status", "code"
        )
        self.push_orders = counter(
            "push_orders", "Static chunks planned for a push (one copy each)", "switch"
        )
        self.push_bytes = counter(
            "push_pool_bytes",
            "Pool-link bytes of planned pushes (one multicast copy per chunk)",
            "switch",
        )
        self.push_unicast_bytes = counter(
            "push_unicast_bytes",
            "Pool-link bytes the planned pushes would cost as one unicast per host",
            "switch",
        )
        self.push_deliveries = counter("push_deliveries", "Host copies of planned pushes", "switch")
        self.push_waiting = counter(
            "push_waiting",
            "Static chunks not pushed this tick: deferred (budget spent, behind their parent) "
            "or too_large (above the whole per-tick budget)",
            "switch",
            "reason",
        )
        self.push_requests = counter(
            "push_requests",
            "Completions requests that push a static prefix into a host's engine: sent, "
            "succeeded, failed (an error, a timeout, a non-2xx answer; tried again later) "
            "or refused (the host is not bound to the prefix's tenant; never sent)",
            "switch",
            "outcome",
        )
        self.push_prefix_bytes = counter(
            "push_prefix_pool_bytes",
            "Pool-link bytes of the static prefixes sent to engines (one copy per order)",
            "switch",
        )
        self.push_inflight = gauge(
            "push_inflight", "Push requests sent and not counted yet (answers count at a tick)"
        )
        self.static_prefixes = gauge("static_prefixes", "Static prefixes registered for pushes")
        self.static_registrations = counter(
            "static_registrations", "POST /v1/static requests by HTTP status", "code"
        )
        self.unisolated = gauge(
            "unisolated",
            "1 per explicit opt-out of isolation in the configuration (node: the host or switch): "
            "tenants_any (a host), "
            "program_forwarding_off or deny_unknown_ports_off (a switch)",
            "setting",
            "node",
        )
        self.multicast_groups = gauge(
            "multicast_groups",
            "Multicast groups the switch holds (consumer sets; on a fabric, its part of each tree)",
            "switch",
        )
        self.spine_in_service = gauge(
            "spine_in_service",
            "1 while a fabric spine carries routes and trees, 0 while out of service (lost)",
            "switch",
        )
        self.fabric_link_up = gauge(
            "fabric_link_up",
            "1 while a leaf-spine link carries routes and trees, 0 while out of service (as "
            "POST /v1/fabric/links said)",
            "leaf",
            "spine",
        )
        self.fabric_moves = counter(
            "fabric_moves",
            "Times the fabric's routes and trees moved: spine_down (a spine's session was "
            "lost), spine_up (it came back), link_down and link_up (a leaf-spine link out of "
            "service and back, as POST /v1/fabric/links said)",
            "reason",
        )
        self.ticks = counter("ticks", "Decision ticks run")
        self.tick_seconds = Histogram(
            p + "tick_seconds",
            "Duration of a decision tick",
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r,
        )

    def exposition(self) -> bytes:
        """The metrics in Prometheus' text format."""
        return generate_latest(self.registry)
