"""The controller daemon's configuration as typed records (what ``controlplane.config`` parses).

Constants:
    SRAM_BYTES: bytes of fragment SRAM the program has (the largest possible budget).
    DEFAULT_P4INFO: the P4Info a switch uses when its configuration names none.
    ANY_TENANT: a host's explicit opt-out of tenant binding (``tenants: any``).

Classes:
    ListenAddress: a ``host:port`` to bind.
    SwitchSpec: one switch (P4Runtime address, device id, election id, program files, role).
    FabricLinkSpec: one leaf-spine link of a fabric, with its port at each end.
    PoolSpec: one DRAM pool node (data-plane address, switch port, where chunk bytes are read).
    HostSpec: one GPU host (replica destination, switch port, policy host id, engine URL).
    PolicySpec: the cache policy by registry name, its parameters, dry-run.
    SketchSpec: hot-miss sketch window period and threshold.
    ReportApiSpec: the access-report HTTP API (address, body and queue bounds).
    EnginePushSpec: how push orders reach the engines (prefix size per token, request bounds).
    DaemonConfig: the whole configuration (with ``ClassSpec`` from ``controlplane.kvclasses``,
        the static-detection rule), and the fabric plan it describes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from controlplane.errors import ConfigError
from controlplane.kvclasses import ClassSpec
from controlplane.targets import Target
from kvcast import p4constants as c
from kvcast.fabric import Attachment, FabricPlan, Uplink
from kvcast.ports import AGENT_PORT

__all__ = [
    "ANY_TENANT",
    "DEFAULT_P4INFO",
    "SRAM_BYTES",
    "DaemonConfig",
    "EnginePushSpec",
    "FabricLinkSpec",
    "HostSpec",
    "ListenAddress",
    "PolicySpec",
    "PoolSpec",
    "ReportApiSpec",
    "SketchSpec",
    "SwitchSpec",
]

# The explicit opt-out of tenant binding for a host (``tenants: any``).
ANY_TENANT = "any"

_REPO = Path(__file__).resolve().parents[1]
DEFAULT_P4INFO = _REPO / "p4src" / "build" / "kvcast.p4info.txtpb"
SRAM_BYTES = c.NUM_FRAG_SLOTS * c.FRAG_BYTES
"""Bytes of fragment SRAM the program has (the largest possible budget)."""


@dataclass(frozen=True)
class ListenAddress:
    """Where a server binds.

    Attributes:
        host: address to bind ("0.0.0.0" for all).
        port: TCP port (0: an ephemeral port, for tests).
    """

    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class SwitchSpec:
    """One switch the controller programs.

    Attributes:
        name: unique name (logs, metrics labels, the ``switch`` of hosts and pools).
        address: ``host:port`` of its P4Runtime server.
        device_id: P4Runtime device id.
        election_id: this controller's election id (must exceed every other client's to be
            primary).
        p4info: the P4Info file.
        device_config: the target's program (BMv2 JSON; on Tofino the compiler's ``.conf``),
            or None for the reference target.
        target: the kind of switch, which decides how device_config is pushed and how the
            P4Info's names are read (controlplane.targets).
        router_mac: source MAC the switch writes into routed frames.
        program_forwarding: install routes, L2 entries and port roles for the configured hosts
            and pools (False: another system owns forwarding).
        epoch_state_file: where the epoch clock persists its high-water mark, or None.
        deny_unknown_ports: with ``program_forwarding``, make every port that is neither a
            configured host nor a pool a DENY port (nothing from it on the reference target, no
            KVP on the P4 programs as committed); False writes an unbound host port as the
            default instead (logged as a warning: such a port is not address-checked).
        cpu_port: Tofino: the CPU port the program was compiled for (``CPU_PORT_NUM``).
        fanout_ports: Tofino: one loopback port per pipe, in distinct pipes, the CPU port's
            among them; each WRITE is stored by every pipe through its port (docs/tofino.md).
            Their number is the switch's pipe count.
        role: ``"leaf"`` (hosts and pool nodes hang off it; the only kind without a fabric)
            or ``"spine"`` (only leaves hang off it).
    """

    name: str
    address: str
    device_id: int = 1
    election_id: int = 10
    p4info: Path = DEFAULT_P4INFO
    device_config: Path | None = None
    target: Target = Target.REFERENCE
    router_mac: str = "02:00:00:00:00:fe"
    program_forwarding: bool = True
    epoch_state_file: Path | None = None
    deny_unknown_ports: bool = True
    cpu_port: int | None = None
    fanout_ports: tuple[int, ...] = ()
    role: str = "leaf"

    @property
    def pipes(self) -> int:
        """Pipes that hold the cache: one per fan-out port on a Tofino, else 1."""
        return max(1, len(self.fanout_ports))


@dataclass(frozen=True)
class FabricLinkSpec:
    """One leaf-spine link: ``leaf_port`` on ``leaf`` faces ``spine_port`` on ``spine``."""

    leaf: str
    leaf_port: int
    spine: str
    spine_port: int


@dataclass(frozen=True)
class PoolSpec:
    """One DRAM pool node.

    Attributes:
        name: unique name (its consistent-hashing identity).
        ip: the data-plane IPv4 address missed GETs are rewritten to.
        mac: its MAC (for the route and L2 entry), or None when forwarding is not programmed.
        port: the switch port it is reached through, or None (idem).
        switch: the switch it hangs off.
        fetch_host: where the controller sends its NOCACHE GETs for chunk bytes.
        fetch_port: the UDP port there.
    """

    name: str
    ip: str
    switch: str
    fetch_host: str
    fetch_port: int = c.KVP_UDP_PORT
    mac: str | None = None
    port: int | None = None


@dataclass(frozen=True)
class HostSpec:
    """One GPU host (a multicast replica destination and an access reporter).

    Attributes:
        name: unique name; access reports name their host by it (or by ``id``).
        id: the integer host id the cache policy sees.
        ip: IPv4 address.
        mac: MAC address.
        port: the switch port it is reached through.
        udp_port: the UDP port its agent receives replicas on.
        tenants: the tenants its port may ask for (the switch drops a GET naming another), or
            None for any tenant (a single-tenant fabric: the file must say ``tenants: any``;
            logged as a warning); its source address is bound either way.
        switch: the switch it hangs off.
        engine_url: the host's OpenAI-compatible engine server (``http://host:port``), which
            the controller may call to push static prefixes into its prefix cache
            (``controlplane.pusher``); None: the controller never calls the host.
    """

    name: str
    id: int
    ip: str
    mac: str
    port: int
    switch: str
    udp_port: int = AGENT_PORT
    tenants: tuple[int, ...] | None = None
    engine_url: str | None = None


@dataclass(frozen=True)
class PolicySpec:
    """The cache policy.

    Attributes:
        name: registry name (``controlplane.policies.available_policies()``).
        params: keyword parameters of the policy's constructor (besides the capacity).
        dry_run: the policy decides and the decisions are counted and logged, but the switch
            cache is never changed (a shadow run, or "cache off" for an experiment).
        min_accesses: reported accesses a chunk needs before the policy hears of it (1: all
            at once). With 2, a chunk used once is never loaded: the daemon holds its first
            access back and hands both to the policy at the second (a doorkeeper in front of
            any policy, as TinyLFU's); SRAM loads, which cost pool reads and WRITE packets,
            then go only to chunks that were reused. ``"auto"``: the bar is learned from the
            reports, as the smallest use count after which a chunk is, on average, used more
            than once more, so that its load pays (``controlplane.admission``); the default.
            Until 100 chunks have been reported it admits from the first use.
    """

    name: str = "kvcast"
    params: Mapping[str, Any] = field(default_factory=dict)
    dry_run: bool = False
    min_accesses: int | Literal["auto"] = "auto"


@dataclass(frozen=True)
class SketchSpec:
    """The hot-miss sketch.

    Attributes:
        window_s: seconds between sketch windows (each key is reported once per window).
        threshold: misses in one window that make a key hot.
    """

    window_s: float = 10.0
    threshold: int = c.HOT_MISS_THRESHOLD


@dataclass(frozen=True)
class ReportApiSpec:
    """The host agents' access-report API.

    Attributes:
        listen: where it binds.
        max_body_bytes: larger request bodies are refused (413).
        max_queue: accesses waiting for the next tick; beyond it reports are refused (503).
        clock_skew_s: report times later than now by more than this are clamped to now.
        operators: the client addresses that may change the fabric (``POST
            /v1/fabric/links``); the API is reachable from the GPU hosts, which must not be
            among them. Default: the controller's own host (loopback).
    """

    listen: ListenAddress = ListenAddress("0.0.0.0", 9109)
    max_body_bytes: int = 4 << 20
    max_queue: int = 200_000
    clock_skew_s: float = 5.0
    operators: tuple[str, ...] = ("127.0.0.1",)


@dataclass(frozen=True)
class EnginePushSpec:
    """How the controller sends its push orders to the engines (the ``push`` section).

    Attributes:
        bytes_per_token: KV bytes of one prompt token of the engines' model (sizes a
            registered prefix for the per-tick budget).
        model: the ``model`` field of each completions request (None: left out).
        timeout_s: bound on one completions request.
        retry_s: wait before a host whose push failed is tried again (its next report ends it
            sooner).
        max_inflight: completions requests running at once (the rest queue).
        max_prefixes: static prefixes the registration API holds.
        max_tokens: the longest prefix it accepts, in tokens.
    """

    bytes_per_token: int = 0
    model: str | None = None
    timeout_s: float = 60.0
    retry_s: float = 10.0
    max_inflight: int = 32
    max_prefixes: int = 256
    max_tokens: int = 1 << 17


@dataclass(frozen=True)
class DaemonConfig:
    """The controller daemon's configuration.

    Attributes:
        switches: the switches (at least one).
        pools: the DRAM pool nodes.
        hosts: the GPU hosts.
        policy: the cache policy.
        sram_budget_bytes: SRAM the policy may fill on each switch.
        tick_s: seconds between decision ticks.
        sketch: hot-miss sketch settings.
        metrics: where the Prometheus endpoint binds, or None for none.
        report_api: the access-report API.
        chunk_timeout_s: bound on reading one chunk's bytes from the pool.
        max_loads_per_tick: admissions applied per switch and tick (the rest wait).
        classes: the static-detection rule and the life of a declaration.
        push_budget_bytes: static-prefix bytes the push plan may put on the pool link per tick
            (0: no push plan).
        push_engines: how push orders reach the hosts' engines (used when a host has an
            ``engine_url``).
        log_level: logging level name.
        source: the file it was read from, if any.
        fabric_links: a leaf-spine fabric's links (empty: no fabric, every switch stands
            alone).
    """

    switches: tuple[SwitchSpec, ...]
    pools: tuple[PoolSpec, ...] = ()
    hosts: tuple[HostSpec, ...] = ()
    policy: PolicySpec = field(default_factory=PolicySpec)
    sram_budget_bytes: int = SRAM_BYTES
    tick_s: float = 1.0
    sketch: SketchSpec = field(default_factory=SketchSpec)
    metrics: ListenAddress | None = ListenAddress("0.0.0.0", 9108)
    report_api: ReportApiSpec = field(default_factory=ReportApiSpec)
    chunk_timeout_s: float = 5.0
    max_loads_per_tick: int = 512
    classes: ClassSpec = field(default_factory=ClassSpec)
    push_budget_bytes: int = 0
    push_engines: EnginePushSpec = field(default_factory=EnginePushSpec)
    log_level: str = "INFO"
    source: Path | None = None
    fabric_links: tuple[FabricLinkSpec, ...] = ()

    def fabric_plan(self) -> FabricPlan | None:
        """The fabric's forwarding plan (kvcast.fabric), or None without spines.

        Raises:
            ConfigError: the switches, links and nodes do not make a leaf-spine fabric.
        """
        spines = [s.name for s in self.switches if s.role == "spine"]
        if not spines:
            return None
        leaves = [s.name for s in self.switches if s.role == "leaf"]
        nodes = [Attachment(h.name, h.switch, h.port, "host") for h in self.hosts]
        nodes += [Attachment(p.name, p.switch, p.port or 0, "pool") for p in self.pools]
        links = [Uplink(x.leaf, x.leaf_port, x.spine, x.spine_port) for x in self.fabric_links]
        try:
            return FabricPlan(leaves, spines, links, nodes)
        except ValueError as exc:
            raise ConfigError(f"fabric_links: not a leaf-spine fabric: {exc}") from None

    def switch(self, name: str) -> SwitchSpec:
        """A switch by name.

        Raises:
            ConfigError: no such switch.
        """
        for spec in self.switches:
            if spec.name == name:
                return spec
        raise ConfigError(f"no switch named {name!r}")

    def hosts_of(self, switch: str) -> tuple[HostSpec, ...]:
        """The hosts hanging off a switch."""
        return tuple(h for h in self.hosts if h.switch == switch)

    def pools_of(self, switch: str) -> tuple[PoolSpec, ...]:
        """The pool nodes hanging off a switch."""
        return tuple(p for p in self.pools if p.switch == switch)

    def unisolated(self) -> tuple[tuple[str, str], ...]:
        """The settings of this file that leave a tenant unisolated, as (setting, name) pairs.

        Each is an explicit opt-out that ``controlplane.config`` logs as a warning at load and
        the daemon shows in its status and in ``kvcast_controller_unisolated``: ``tenants_any``
        (a host whose port may name any tenant), ``program_forwarding_off`` (a switch that gets
        no source or tenant binding from this controller) and ``deny_unknown_ports_off`` (a
        switch whose unconfigured ports are unbound host ports).
        """
        out = [("tenants_any", h.name) for h in self.hosts if h.tenants is None]
        for sw in self.switches:
            if not sw.program_forwarding:
                out.append(("program_forwarding_off", sw.name))
            elif not sw.deny_unknown_ports:
                out.append(("deny_unknown_ports_off", sw.name))
        return tuple(out)
