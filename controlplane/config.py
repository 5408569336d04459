"""The controller daemon's configuration: a YAML file, validated into typed records.

Every problem is reported as a :class:`~controlplane.errors.ConfigError` whose message names
the offending setting by its path in the file (``switches[0].election_id``) and what is
accepted, so ``python -m controlplane validate-config FILE`` can tell an operator exactly what
to fix. Unknown keys are errors (a typo must not silently fall back to a default).

A complete example (only ``switches`` is required; every other setting has a default)::

    switches:
      - name: s1
        address: 127.0.0.1:9559        # P4Runtime server
        device_id: 1
        election_id: 20                # highest connected id is primary
        target: reference              # reference | bmv2 | tofino (default: bmv2 when a
                                       # device_config is given, else reference)
        device_config: null            # BMv2: p4src/build/kvcast.json; Tofino (Stratum): the
                                       # compiler's kvcast.conf; reference target: null
        router_mac: "02:00:00:00:00:fe"
        program_forwarding: true       # routes, L2 entries, port roles for hosts and pools
                                       # (false: no binding at all; logged as a warning)
        deny_unknown_ports: true       # a port that is neither a host nor a pool: DENY
                                       # (false: unbound host ports; logged as a warning)
        # Tofino only: the CPU (PCIe) port the program was compiled for, and one loopback port
        # per pipe for the WRITE fan-out (every pipe holds the cache): e.g. a 2-pipe Tofino-1
        # cpu_port: 192, fanout_ports: [68, 196]
        epoch_state_file: null         # persist the epoch clock (never reuse an epoch)
        role: leaf                     # leaf | spine: a leaf-spine fabric (fabric_links)
    # A leaf-spine fabric (docs/fabric.md): one link per leaf and spine. Hosts and pool nodes
    # hang off leaves; each switch gets routes to every node through the fabric, and its
    # fabric ports are trusted as a fabric switch's.
    fabric_links: []                   # e.g. - {leaf: s1, leaf_port: 9, spine: s3, spine_port: 1}
    pools:
      - {name: p1, ip: 10.0.1.1, mac: "00:00:00:00:01:01", port: 5,
         fetch_address: "10.254.5.2:19286"}   # where the controller reads chunk bytes
    hosts:
      - {name: h1, id: 1, ip: 10.0.0.1, mac: "00:00:00:00:00:01", port: 1, udp_port: 19287,
         tenants: [1, 2]}              # required: the tenants its port may ask for, or
                                       # `tenants: any` (any tenant; logged as a warning)
    policy:
      name: kvcast
      params: {hysteresis: 0.25}
      dry_run: false                   # true: decide and count, never touch the cache
      min_accesses: auto               # reports of a chunk before the policy hears of it:
                                       # learned from the reports (admission.py), or a number
    sram_budget_bytes: 2097152         # default and maximum: NUM_FRAG_SLOTS * FRAG_BYTES
    tick_s: 1.0
    sketch: {window_s: 10.0, threshold: 8}
    metrics: {listen: "0.0.0.0:9108"}
    report_api: {listen: "0.0.0.0:9109", max_body_bytes: 4194304, max_queue: 200000}
    chunk_source: {timeout_s: 5.0}
    max_loads_per_tick: 512
    classes:                           # static vs transient KV (controlplane.kvclasses)
      detect: true                     # promote a prefix by sustained reuse:
      min_uses: 8                      #   its last min_uses uses fall within window_s
      window_s: 600.0                  #   (and unused this long, it is transient again)
      min_span_s: 60.0                 #   and span at least min_span_s (no burst promotes)
      declared_ttl_s: 3600.0           # a declaration ("class": "static") lasts this long
    push: {budget_bytes_per_tick: 0}   # static prefixes planned for a push (0: no plan)
    log_level: INFO

Classes:
    ListenAddress: a ``host:port`` to bind.
    SwitchSpec: one switch (P4Runtime address, device id, election id, program files, role).
    FabricLinkSpec: one leaf-spine link of a fabric, with its port at each end.
    PoolSpec: one DRAM pool node (data-plane address, switch port, where chunk bytes are read).
    HostSpec: one GPU host (replica destination, switch port, policy host id).
    PolicySpec: the cache policy by registry name, its parameters, dry-run.
    SketchSpec: hot-miss sketch window period and threshold.
    ReportApiSpec: the access-report HTTP API (address, body and queue bounds).
    ClassSpec: (from ``controlplane.kvclasses``) the static-detection rule.
    DaemonConfig: the whole configuration.

Functions:
    load_config: read and validate a YAML file.
    parse_config: validate an already-parsed mapping.
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from controlplane.errors import ConfigError
from controlplane.kvclasses import ClassSpec
from controlplane.policies import PolicyConfigError, available_policies, make_policy
from controlplane.targets import Target
from kvcast import p4constants as c
from kvcast.fabric import Attachment, FabricPlan, Uplink
from kvcast.ports import AGENT_PORT

_LOG = logging.getLogger(__name__)
# The explicit opt-out of tenant binding for a host (``tenants: any``).
ANY_TENANT = "any"

__all__ = [
    "DEFAULT_P4INFO",
    "SRAM_BYTES",
    "DaemonConfig",
    "HostSpec",
    "ListenAddress",
    "PolicySpec",
    "PoolSpec",
    "ReportApiSpec",
    "SketchSpec",
    "SwitchSpec",
    "load_config",
    "parse_config",
]

_REPO = Path(__file__).resolve().parents[1]
DEFAULT_P4INFO = _REPO / "p4src" / "build" / "kvcast.p4info.txtpb"
SRAM_BYTES = c.NUM_FRAG_SLOTS * c.FRAG_BYTES
"""Bytes of fragment SRAM the program has (the largest possible budget)."""
_MAX_ELECTION_ID = (1 << 128) - 1


# ------------------------------------------------------------------------------ records
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


# Device ports of a Tofino pipe: bits 7-8 of the port number name the pipe.
_PIPE_SHIFT = 7


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
    """

    name: str
    id: int
    ip: str
    mac: str
    port: int
    switch: str
    udp_port: int = AGENT_PORT
    tenants: tuple[int, ...] | None = None


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
    """

    listen: ListenAddress = ListenAddress("0.0.0.0", 9109)
    max_body_bytes: int = 4 << 20
    max_queue: int = 200_000
    clock_skew_s: float = 5.0


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


# ------------------------------------------------------------------------------ parsing
class _Section:
    """A mapping being read: takes keys one by one, then complains about any left over."""

    def __init__(self, raw: object, path: str) -> None:
        if not isinstance(raw, Mapping):
            raise ConfigError(f"{path or 'the file'}: expected a mapping, got {_kind(raw)}")
        self._raw = dict(raw)
        self._path = path
        self._known: list[str] = []

    def at(self, key: str) -> str:
        return f"{self._path}.{key}" if self._path else key

    def take(self, key: str, default: object = ..., *, required: bool = False) -> Any:
        self._known.append(key)
        if key in self._raw:
            return self._raw.pop(key)
        if required or default is ...:
            raise ConfigError(f"{self.at(key)}: required setting is missing")
        return default

    def done(self) -> None:
        for key in self._raw:
            hint = difflib.get_close_matches(str(key), self._known, n=1)
            maybe = f"; did you mean {hint[0]!r}?" if hint else ""
            known = ", ".join(self._known)
            raise ConfigError(f"{self.at(str(key))}: unknown setting{maybe} (known: {known})")


def _kind(value: object) -> str:
    return "nothing" if value is None else type(value).__name__


def _str(value: object, path: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{path}: expected a non-empty string, got {_kind(value)} {value!r}")
    return value


def _int(value: object, path: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{path}: expected an integer, got {_kind(value)} {value!r}")
    if not lo <= value <= hi:
        raise ConfigError(f"{path}: {value} is outside {lo}..{hi}")
    return value


def _float(value: object, path: str, *, positive: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{path}: expected a number, got {_kind(value)} {value!r}")
    out = float(value)
    if not math.isfinite(out) or (positive and out <= 0):
        raise ConfigError(f"{path}: expected a positive finite number, got {value!r}")
    return out


def _bool(value: object, path: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{path}: expected true or false, got {_kind(value)} {value!r}")
    return value


def _ip(value: object, path: str) -> str:
    text = _str(value, path)
    try:
        return str(ipaddress.IPv4Address(text))
    except ValueError:
        raise ConfigError(f"{path}: {text!r} is not an IPv4 address") from None


def _mac(value: object, path: str) -> str:
    text = _str(value, path)
    parts = text.split(":")
    if len(parts) != 6 or not all(len(p) == 2 for p in parts):
        raise ConfigError(f"{path}: {text!r} is not a MAC address like 00:00:00:00:00:01")
    try:
        bytes(int(p, 16) for p in parts)
    except ValueError:
        raise ConfigError(f"{path}: {text!r} is not a MAC address") from None
    return text.lower()


def _host_port(value: object, path: str, default_port: int | None = None) -> tuple[str, int]:
    text = _str(value, path)
    host, sep, port_text = text.rpartition(":")
    if not sep:
        if default_port is None:
            raise ConfigError(f"{path}: {text!r} is not host:port")
        host, port_text = text, str(default_port)
    if not host:
        raise ConfigError(f"{path}: {text!r} has no host part")
    try:
        port = int(port_text)
    except ValueError:
        raise ConfigError(f"{path}: port {port_text!r} of {text!r} is not a number") from None
    return host, _int(port, path, 0, 65535)


def _listen(value: object, path: str) -> ListenAddress:
    host, port = _host_port(value, path)
    return ListenAddress(host, port)


def _path(value: object, path: str, base: Path | None, *, must_exist: bool) -> Path:
    p = Path(_str(value, path)).expanduser()
    if not p.is_absolute() and base is not None:
        p = base / p
    if must_exist and not p.is_file():
        raise ConfigError(f"{path}: file {p} does not exist")
    return p


def _list(value: object, path: str) -> list[object]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ConfigError(f"{path}: expected a list, got {_kind(value)}")
    return value


def _switch(raw: object, path: str, base: Path | None) -> SwitchSpec:
    s = _Section(raw, path)
    name = _str(s.take("name", required=True), s.at("name"))
    address = s.take("address", required=True)
    _host_port(address, s.at("address"))
    device_config = s.take("device_config", None)
    target_name = s.take("target", "reference" if device_config is None else "bmv2")
    try:
        target = Target(target_name)
    except ValueError:
        raise ConfigError(
            f"{s.at('target')}: unknown target {target_name!r}; one of "
            + ", ".join(t.value for t in Target)
        ) from None
    if (device_config is None) != (target is Target.REFERENCE):
        raise ConfigError(
            f"{s.at('device_config')}: target {target.value} "
            + ("takes no device_config" if target is Target.REFERENCE else "needs a device_config")
        )
    state = s.take("epoch_state_file", None)
    cpu_port, fanout = _fanout(s, target)
    spec = SwitchSpec(
        name=name,
        address=str(address),
        device_id=_int(s.take("device_id", 1), s.at("device_id"), 0, (1 << 64) - 1),
        election_id=_int(s.take("election_id", 10), s.at("election_id"), 1, _MAX_ELECTION_ID),
        p4info=_path(s.take("p4info", str(DEFAULT_P4INFO)), s.at("p4info"), base, must_exist=True),
        device_config=None
        if device_config is None
        else _path(device_config, s.at("device_config"), base, must_exist=True),
        target=target,
        router_mac=_mac(s.take("router_mac", "02:00:00:00:00:fe"), s.at("router_mac")),
        program_forwarding=_bool(s.take("program_forwarding", True), s.at("program_forwarding")),
        epoch_state_file=None
        if state is None
        else _path(state, s.at("epoch_state_file"), base, must_exist=False),
        deny_unknown_ports=_bool(s.take("deny_unknown_ports", True), s.at("deny_unknown_ports")),
        cpu_port=cpu_port,
        fanout_ports=fanout,
        role=_choice(s.take("role", "leaf"), s.at("role"), ("leaf", "spine")),
    )
    s.done()
    return spec


def _choice(raw: object, path: str, allowed: Sequence[str]) -> str:
    if raw not in allowed:
        raise ConfigError(f"{path}: {raw!r} is not one of {', '.join(allowed)}")
    return str(raw)


def _fabric_link(raw: object, path: str, roles: Mapping[str, str]) -> FabricLinkSpec:
    s = _Section(raw, path)
    link = FabricLinkSpec(
        leaf=_str(s.take("leaf", required=True), s.at("leaf")),
        leaf_port=_int(s.take("leaf_port", required=True), s.at("leaf_port"), 0, 510),
        spine=_str(s.take("spine", required=True), s.at("spine")),
        spine_port=_int(s.take("spine_port", required=True), s.at("spine_port"), 0, 510),
    )
    s.done()
    for end, want in ((link.leaf, "leaf"), (link.spine, "spine")):
        if roles.get(end) != want:
            raise ConfigError(f"{path}: {end!r} is not a switch with role {want}")
    return link


def _fanout(s: _Section, target: Target) -> tuple[int | None, tuple[int, ...]]:
    """A Tofino's CPU port and WRITE fan-out ports (required there, refused elsewhere)."""
    raw_cpu = s.take("cpu_port", None)
    raw_ports = s.take("fanout_ports", None)
    if target is not Target.TOFINO:
        for key, raw in (("cpu_port", raw_cpu), ("fanout_ports", raw_ports)):
            if raw is not None:
                raise ConfigError(f"{s.at(key)}: only a tofino switch has {key}")
        return None, ()
    if raw_cpu is None or raw_ports is None:
        raise ConfigError(
            f"{s.at('fanout_ports')}: a tofino switch needs cpu_port and fanout_ports "
            "(one loopback port per pipe; docs/tofino.md)"
        )
    cpu = _int(raw_cpu, s.at("cpu_port"), 0, 511)
    ports = tuple(
        _int(p, f"{s.at('fanout_ports')}[{i}]", 0, 511)
        for i, p in enumerate(_list(raw_ports, s.at("fanout_ports")))
    )
    pipes = [p >> _PIPE_SHIFT for p in ports]
    if not ports or len(set(pipes)) != len(pipes):
        raise ConfigError(
            f"{s.at('fanout_ports')}: one port in each pipe, got {list(ports)} (pipes {pipes})"
        )
    if cpu in ports or (cpu >> _PIPE_SHIFT) not in pipes:
        raise ConfigError(
            f"{s.at('cpu_port')}: {cpu} must not be a fan-out port, and its pipe "
            f"({cpu >> _PIPE_SHIFT}) must have one"
        )
    return cpu, ports


def _pool(raw: object, path: str, default_switch: str | None) -> PoolSpec:
    s = _Section(raw, path)
    name = _str(s.take("name", required=True), s.at("name"))
    ip = _ip(s.take("ip", required=True), s.at("ip"))
    switch = s.take("switch", default_switch)
    if switch is None:
        raise ConfigError(f"{s.at('switch')}: required when there are several switches")
    mac = s.take("mac", None)
    port = s.take("port", None)
    fetch = s.take("fetch_address", None)
    fetch_host, fetch_port = (
        (ip, c.KVP_UDP_PORT)
        if fetch is None
        else _host_port(fetch, s.at("fetch_address"), c.KVP_UDP_PORT)
    )
    spec = PoolSpec(
        name=name,
        ip=ip,
        switch=_str(switch, s.at("switch")),
        fetch_host=fetch_host,
        fetch_port=fetch_port,
        mac=None if mac is None else _mac(mac, s.at("mac")),
        port=None if port is None else _int(port, s.at("port"), 0, 510),
    )
    s.done()
    return spec


def _host(raw: object, path: str, index: int, default_switch: str | None) -> HostSpec:
    s = _Section(raw, path)
    name = _str(s.take("name", required=True), s.at("name"))
    switch = s.take("switch", default_switch)
    if switch is None:
        raise ConfigError(f"{s.at('switch')}: required when there are several switches")
    spec = HostSpec(
        name=name,
        id=_int(s.take("id", index + 1), s.at("id"), 0, (1 << 31) - 1),
        ip=_ip(s.take("ip", required=True), s.at("ip")),
        mac=_mac(s.take("mac", required=True), s.at("mac")),
        port=_int(s.take("port", required=True), s.at("port"), 0, 510),
        switch=_str(switch, s.at("switch")),
        udp_port=_int(s.take("udp_port", AGENT_PORT), s.at("udp_port"), 1, 65535),
        tenants=_tenants(s.take("tenants", None), s.at("tenants"), name),
    )
    s.done()
    return spec


def _tenants(raw: object, path: str, host: str) -> tuple[int, ...] | None:
    """A host's tenant binding: a list of tenant ids, or None for an explicit ``any``.

    Raises:
        ConfigError: omitted (a host must name its tenants), empty, or not tenant ids.
    """
    if raw is None:
        raise ConfigError(
            f"{path}: required: list the tenants host {host!r} may ask for (e.g. tenants: [1]), "
            f"or write 'tenants: {ANY_TENANT}' to let its port ask for any tenant "
            "(a single-tenant fabric; docs/security.md)"
        )
    if raw == ANY_TENANT:
        _LOG.warning(
            "%s: host %r may ask for any tenant (tenants: any): its port is bound to its address "
            "only, and it can read every tenant's chunks",
            path,
            host,
            extra={"event": "config_warning", "setting": path},
        )
        return None
    items = _list(raw, path)
    if not items:
        raise ConfigError(
            f"{path}: an empty list binds no tenant; list them, or write 'tenants: {ANY_TENANT}'"
        )
    return tuple(sorted({_int(t, f"{path}[{i}]", 0, 0xFFFF) for i, t in enumerate(items)}))


def _policy(raw: object, budget: int) -> PolicySpec:
    s = _Section({} if raw is None else raw, "policy")
    name = _str(s.take("name", "kvcast"), s.at("name"))
    params = s.take("params", None) or {}
    if not isinstance(params, Mapping) or not all(isinstance(k, str) for k in params):
        raise ConfigError("policy.params: expected a mapping of parameter names to values")
    dry_run = _bool(s.take("dry_run", False), s.at("dry_run"))
    raw_min = s.take("min_accesses", "auto")
    min_accesses: int | Literal["auto"] = (
        "auto" if raw_min == "auto" else _int(raw_min, s.at("min_accesses"), 1, 64)
    )
    s.done()
    if name not in available_policies(include_offline=False):
        known = ", ".join(available_policies(include_offline=False))
        raise ConfigError(f"policy.name: {name!r} is not an online policy; choose one of {known}")
    if "capacity_bytes" in params:
        raise ConfigError("policy.params.capacity_bytes: set sram_budget_bytes instead")
    try:
        make_policy(name, capacity_bytes=budget, **dict(params))
    except PolicyConfigError as exc:
        raise ConfigError(f"policy.params: {exc}") from None
    return PolicySpec(name, dict(params), dry_run, min_accesses)


def _classes(raw: object) -> ClassSpec:
    s = _Section({} if raw is None else raw, "classes")
    d = ClassSpec()
    spec = ClassSpec(
        detect=_bool(s.take("detect", d.detect), s.at("detect")),
        min_uses=_int(s.take("min_uses", d.min_uses), s.at("min_uses"), 2, 1 << 16),
        window_s=_float(s.take("window_s", d.window_s), s.at("window_s")),
        min_span_s=_float(s.take("min_span_s", d.min_span_s), s.at("min_span_s"), positive=False),
        declared_ttl_s=_float(s.take("declared_ttl_s", d.declared_ttl_s), s.at("declared_ttl_s")),
        max_keys=_int(s.take("max_keys", d.max_keys), s.at("max_keys"), 1, 1 << 26),
    )
    s.done()
    return spec


def _check_unique(items: Sequence[tuple[str, object]], what: str) -> None:
    seen: dict[object, str] = {}
    for path, value in items:
        if value in seen:
            raise ConfigError(f"{path}: {what} {value!r} is also used by {seen[value]}")
        seen[value] = path


def parse_config(raw: object, *, base: Path | None = None) -> DaemonConfig:
    """Validates a parsed configuration.

    Args:
        raw: the mapping (e.g. from ``yaml.safe_load``).
        base: directory relative file paths are resolved against (the file's directory).

    Returns:
        The configuration.

    Raises:
        ConfigError: the first problem found, named by its path in the file.
    """
    top = _Section(raw, "")
    switch_list = _list(top.take("switches", required=True), "switches")
    if not switch_list:
        raise ConfigError("switches: at least one switch is required")
    switches = tuple(_switch(r, f"switches[{i}]", base) for i, r in enumerate(switch_list))
    _check_unique([(f"switches[{i}].name", s.name) for i, s in enumerate(switches)], "name")
    only = switches[0].name if len(switches) == 1 else None
    pools = tuple(
        _pool(r, f"pools[{i}]", only) for i, r in enumerate(_list(top.take("pools", []), "pools"))
    )
    hosts = tuple(
        _host(r, f"hosts[{i}]", i, only)
        for i, r in enumerate(_list(top.take("hosts", []), "hosts"))
    )
    names = {s.name for s in switches}
    placed = [(f"pools[{i}]", p.switch) for i, p in enumerate(pools)]
    placed += [(f"hosts[{i}]", h.switch) for i, h in enumerate(hosts)]
    for where, switch in placed:
        if switch not in names:
            raise ConfigError(
                f"{where}.switch: no switch named {switch!r} (switches: {', '.join(sorted(names))})"
            )
    _check_unique(
        [(f"pools[{i}].name", p.name) for i, p in enumerate(pools)]
        + [(f"hosts[{i}].name", h.name) for i, h in enumerate(hosts)],
        "name",
    )
    roles = {s.name: s.role for s in switches}
    for where, switch in placed:
        if roles[switch] == "spine":
            raise ConfigError(
                f"{where}.switch: {switch!r} is a spine; hosts and pools hang off leaves"
            )
    fabric_links = tuple(
        _fabric_link(r, f"fabric_links[{i}]", roles)
        for i, r in enumerate(_list(top.take("fabric_links", []), "fabric_links"))
    )
    _check_unique(
        [(f"fabric_links[{i}]", (x.leaf, x.spine)) for i, x in enumerate(fabric_links)],
        "leaf-spine pair",
    )
    _check_unique([(f"hosts[{i}].id", h.id) for i, h in enumerate(hosts)], "host id")
    _check_unique(
        [(f"pools[{i}].ip", p.ip) for i, p in enumerate(pools)]
        + [(f"hosts[{i}].ip", h.ip) for i, h in enumerate(hosts)],
        "address",
    )
    _check_unique(
        [(f"pools[{i}].port", (p.switch, p.port)) for i, p in enumerate(pools) if p.port]
        + [(f"hosts[{i}].port", (h.switch, h.port)) for i, h in enumerate(hosts)],
        "switch port",
    )
    for i, sw in enumerate(switches):
        if not sw.program_forwarding:
            _LOG.warning(
                "switches[%d].program_forwarding: false: switch %r gets no source or tenant "
                "binding from this controller; another system must bind its host ports (the "
                "reference target denies every port nobody configured)",
                i,
                sw.name,
                extra={"event": "config_warning", "setting": f"switches[{i}].program_forwarding"},
            )
        elif not sw.deny_unknown_ports:
            _LOG.warning(
                "switches[%d].deny_unknown_ports: false: every port of switch %r that is neither "
                "a configured host nor a pool is an unbound host port (no address check)",
                i,
                sw.name,
                extra={"event": "config_warning", "setting": f"switches[{i}].deny_unknown_ports"},
            )
        if sw.program_forwarding:
            for i, p in enumerate(pools):
                if p.switch == sw.name and (p.mac is None or p.port is None):
                    raise ConfigError(
                        f"pools[{i}]: mac and port are required when switch {sw.name!r} "
                        "programs forwarding (program_forwarding: true)"
                    )
    budget = _int(
        top.take("sram_budget_bytes", SRAM_BYTES),
        "sram_budget_bytes",
        c.FRAG_BYTES,
        SRAM_BYTES,
    )
    policy = _policy(top.take("policy", None), budget)
    tick_s = _float(top.take("tick_s", 1.0), "tick_s")
    sk = _Section(top.take("sketch", None) or {}, "sketch")
    sketch = SketchSpec(
        window_s=_float(sk.take("window_s", 10.0), sk.at("window_s")),
        threshold=_int(
            sk.take("threshold", c.HOT_MISS_THRESHOLD), sk.at("threshold"), 1, (1 << 16) - 1
        ),
    )
    sk.done()
    metrics_raw = top.take("metrics", {"listen": "0.0.0.0:9108"})
    metrics: ListenAddress | None = None
    if metrics_raw is not None:
        m = _Section(metrics_raw, "metrics")
        metrics = _listen(m.take("listen", required=True), m.at("listen"))
        m.done()
    ra = _Section(top.take("report_api", None) or {}, "report_api")
    report_api = ReportApiSpec(
        listen=_listen(ra.take("listen", "0.0.0.0:9109"), ra.at("listen")),
        max_body_bytes=_int(
            ra.take("max_body_bytes", 4 << 20), ra.at("max_body_bytes"), 1024, 1 << 30
        ),
        max_queue=_int(ra.take("max_queue", 200_000), ra.at("max_queue"), 1, 1 << 30),
        clock_skew_s=_float(ra.take("clock_skew_s", 5.0), ra.at("clock_skew_s")),
    )
    ra.done()
    cs = _Section(top.take("chunk_source", None) or {}, "chunk_source")
    chunk_timeout_s = _float(cs.take("timeout_s", 5.0), cs.at("timeout_s"))
    cs.done()
    max_loads = _int(top.take("max_loads_per_tick", 512), "max_loads_per_tick", 1, 1 << 20)
    classes = _classes(top.take("classes", None))
    ps = _Section(top.take("push", None) or {}, "push")
    push_budget = _int(
        ps.take("budget_bytes_per_tick", 0), ps.at("budget_bytes_per_tick"), 0, 1 << 40
    )
    ps.done()
    level = _str(top.take("log_level", "INFO"), "log_level").upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        raise ConfigError(f"log_level: {level!r} is not DEBUG, INFO, WARNING, ERROR or CRITICAL")
    top.done()
    if metrics is not None and metrics.port and metrics.port == report_api.listen.port:
        raise ConfigError(
            f"metrics.listen and report_api.listen both use port {metrics.port}; pick two"
        )
    config = DaemonConfig(
        switches=switches,
        pools=pools,
        hosts=hosts,
        policy=policy,
        sram_budget_bytes=budget,
        tick_s=tick_s,
        sketch=sketch,
        metrics=metrics,
        report_api=report_api,
        chunk_timeout_s=chunk_timeout_s,
        max_loads_per_tick=max_loads,
        classes=classes,
        push_budget_bytes=push_budget,
        log_level=level,
        fabric_links=fabric_links,
    )
    config.fabric_plan()  # a fabric must be whole: every leaf linked to every spine
    return config


def load_config(path: str | Path) -> DaemonConfig:
    """Reads and validates a YAML configuration file.

    Relative file paths inside it (``p4info``, ``device_config``, ``epoch_state_file``) are
    resolved against the file's directory.

    Args:
        path: the YAML file.

    Returns:
        The configuration.

    Raises:
        ConfigError: the file cannot be read, is not YAML, or a setting is invalid.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read configuration {p}: {exc.strerror or exc}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p} is not valid YAML: {exc}") from None
    if raw is None:
        raise ConfigError(f"{p} is empty; it needs at least a 'switches' list")
    return dataclasses.replace(parse_config(raw, base=p.resolve().parent), source=p)
