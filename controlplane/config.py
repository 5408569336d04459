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
    # hang off leaves (their `switch`); each switch gets routes to every node through the
    # fabric, and its fabric ports are trusted as a fabric switch's; multicast groups are
    # trees across the switches, and a spine whose session is lost has them moved off it.
    fabric_links: []                   # e.g. - {leaf: s1, leaf_port: 9, spine: s3, spine_port: 1}
    pools:
      - {name: p1, ip: 10.0.1.1, mac: "00:00:00:00:01:01", port: 5,
         fetch_address: "10.254.5.2:19286"}   # where the controller reads chunk bytes
    hosts:
      - {name: h1, id: 1, ip: 10.0.0.1, mac: "00:00:00:00:00:01", port: 1, udp_port: 19287,
         tenants: [1, 2],              # required: the tenants its port may ask for, or
                                       # `tenants: any` (any tenant; logged as a warning)
         engine_url: "http://10.254.0.1:8000"}  # optional: its OpenAI-compatible server,
                                       # where the controller pushes static prefixes
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
    report_api: {listen: "0.0.0.0:9109", max_body_bytes: 4194304, max_queue: 200000,
                 operators: ["127.0.0.1"]}   # who may POST /v1/fabric/links (never a host)
    chunk_source: {timeout_s: 5.0}
    max_loads_per_tick: 512
    classes:                           # static vs transient KV (controlplane.kvclasses)
      detect: true                     # promote a prefix by sustained reuse:
      min_uses: 8                      #   its last min_uses uses fall within window_s
      window_s: 600.0                  #   (and unused this long, it is transient again)
      min_span_s: 60.0                 #   and span at least min_span_s (no burst promotes)
      declared_ttl_s: 3600.0           # a declaration ("class": "static") lasts this long
    push:                              # static prefixes pushed ahead of demand
      budget_bytes_per_tick: 67108864  # pool-link bytes per tick, pulls first (0, the
                                       # default: no plan, no engine_url)
      bytes_per_token: 131072          # the model's KV bytes per token (Llama-3-8B; sizes
                                       # a prefix; required with engine_url)
      model: null                      # "model" of the completions requests (null: none)
      timeout_s: 60.0                  # bound on one push request
      retry_s: 10.0                    # a failed host is tried again after this
      max_inflight: 32                 # push requests running at once
      max_prefixes: 256                # prefixes POST /v1/static holds
      max_tokens: 131072               # the longest prefix it accepts
    log_level: INFO

Classes:
    None here: the records it gives (``DaemonConfig`` and its parts) are in
    ``controlplane.configspec``, the typed readers of single values (``Section``, ``as_int``,
    ...) in ``controlplane.configfields``. This module holds the file's layout: each section's
    keys, defaults and cross-checks.

Functions:
    load_config: read and validate a YAML file.
    parse_config: validate an already-parsed mapping.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

import yaml

from controlplane.configfields import (
    Section,
    as_bool,
    as_choice,
    as_float,
    as_host_port,
    as_int,
    as_ip,
    as_list,
    as_listen,
    as_mac,
    as_path,
    as_str,
)
from controlplane.configspec import (
    ANY_TENANT,
    DEFAULT_P4INFO,
    SRAM_BYTES,
    DaemonConfig,
    EnginePushSpec,
    FabricLinkSpec,
    HostSpec,
    ListenAddress,
    PolicySpec,
    PoolSpec,
    ReportApiSpec,
    SketchSpec,
    SwitchSpec,
)
from controlplane.errors import ConfigError
from controlplane.kvclasses import ClassSpec
from controlplane.policies import PolicyConfigError, available_policies, make_policy
from controlplane.targets import Target, compiled_cpu_port
from kvcast import p4constants as c
from kvcast.ports import AGENT_PORT

_LOG = logging.getLogger(__name__)

__all__ = ["load_config", "parse_config"]

_MAX_ELECTION_ID = (1 << 128) - 1
# Device ports of a Tofino pipe: bits 7-8 of the port number name the pipe.
_PIPE_SHIFT = 7


def _switch(raw: object, path: str, base: Path | None) -> SwitchSpec:
    s = Section(raw, path)
    name = as_str(s.take("name", required=True), s.at("name"))
    address = s.take("address", required=True)
    as_host_port(address, s.at("address"))
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
        device_id=as_int(s.take("device_id", 1), s.at("device_id"), 0, (1 << 64) - 1),
        election_id=as_int(s.take("election_id", 10), s.at("election_id"), 1, _MAX_ELECTION_ID),
        p4info=as_path(
            s.take("p4info", str(DEFAULT_P4INFO)), s.at("p4info"), base, must_exist=True
        ),
        device_config=None
        if device_config is None
        else as_path(device_config, s.at("device_config"), base, must_exist=True),
        target=target,
        router_mac=as_mac(s.take("router_mac", "02:00:00:00:00:fe"), s.at("router_mac")),
        program_forwarding=as_bool(s.take("program_forwarding", True), s.at("program_forwarding")),
        epoch_state_file=None
        if state is None
        else as_path(state, s.at("epoch_state_file"), base, must_exist=False),
        deny_unknown_ports=as_bool(s.take("deny_unknown_ports", True), s.at("deny_unknown_ports")),
        cpu_port=cpu_port,
        fanout_ports=fanout,
        role=as_choice(s.take("role", "leaf"), s.at("role"), ("leaf", "spine")),
    )
    s.done()
    if spec.device_config is not None and spec.cpu_port is not None:
        compiled = compiled_cpu_port(spec.device_config)
        if compiled is not None and compiled != spec.cpu_port:
            raise ConfigError(
                f"{s.at('cpu_port')}: {spec.cpu_port}, but {spec.device_config} was compiled "
                f"for CPU port {compiled} (make p4-tofino CPU_PORT={spec.cpu_port})"
            )
    return spec


def _fabric_link(raw: object, path: str, roles: Mapping[str, str]) -> FabricLinkSpec:
    s = Section(raw, path)
    link = FabricLinkSpec(
        leaf=as_str(s.take("leaf", required=True), s.at("leaf")),
        leaf_port=as_int(s.take("leaf_port", required=True), s.at("leaf_port"), 0, 510),
        spine=as_str(s.take("spine", required=True), s.at("spine")),
        spine_port=as_int(s.take("spine_port", required=True), s.at("spine_port"), 0, 510),
    )
    s.done()
    for end, want in ((link.leaf, "leaf"), (link.spine, "spine")):
        if roles.get(end) != want:
            raise ConfigError(f"{path}: {end!r} is not a switch with role {want}")
    return link


def _fanout(s: Section, target: Target) -> tuple[int | None, tuple[int, ...]]:
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
    cpu = as_int(raw_cpu, s.at("cpu_port"), 0, 511)
    ports = tuple(
        as_int(p, f"{s.at('fanout_ports')}[{i}]", 0, 511)
        for i, p in enumerate(as_list(raw_ports, s.at("fanout_ports")))
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
    s = Section(raw, path)
    name = as_str(s.take("name", required=True), s.at("name"))
    ip = as_ip(s.take("ip", required=True), s.at("ip"))
    switch = s.take("switch", default_switch)
    if switch is None:
        raise ConfigError(f"{s.at('switch')}: required when there are several switches")
    mac = s.take("mac", None)
    port = s.take("port", None)
    fetch = s.take("fetch_address", None)
    fetch_host, fetch_port = (
        (ip, c.KVP_UDP_PORT)
        if fetch is None
        else as_host_port(fetch, s.at("fetch_address"), c.KVP_UDP_PORT)
    )
    spec = PoolSpec(
        name=name,
        ip=ip,
        switch=as_str(switch, s.at("switch")),
        fetch_host=fetch_host,
        fetch_port=fetch_port,
        mac=None if mac is None else as_mac(mac, s.at("mac")),
        port=None if port is None else as_int(port, s.at("port"), 0, 510),
    )
    s.done()
    return spec


def _host(raw: object, path: str, index: int, default_switch: str | None) -> HostSpec:
    s = Section(raw, path)
    name = as_str(s.take("name", required=True), s.at("name"))
    switch = s.take("switch", default_switch)
    if switch is None:
        raise ConfigError(f"{s.at('switch')}: required when there are several switches")
    spec = HostSpec(
        name=name,
        id=as_int(s.take("id", index + 1), s.at("id"), 0, (1 << 31) - 1),
        ip=as_ip(s.take("ip", required=True), s.at("ip")),
        mac=as_mac(s.take("mac", required=True), s.at("mac")),
        port=as_int(s.take("port", required=True), s.at("port"), 0, 510),
        switch=as_str(switch, s.at("switch")),
        udp_port=as_int(s.take("udp_port", AGENT_PORT), s.at("udp_port"), 1, 65535),
        tenants=_tenants(s.take("tenants", None), s.at("tenants"), name),
        engine_url=_engine_url(s.take("engine_url", None), s.at("engine_url")),
    )
    s.done()
    return spec


def _engine_url(raw: object, path: str) -> str | None:
    """A host's engine server, ``http://host:port`` (no path, no trailing slash), or None."""
    if raw is None:
        return None
    text = as_str(raw, path)
    scheme, sep, rest = text.partition("://")
    if scheme not in ("http", "https") or not sep:
        raise ConfigError(f"{path}: {text!r} is not an http:// or https:// URL")
    rest = rest.rstrip("/")
    as_host_port(rest, path)
    return f"{scheme}://{rest}"


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
    items = as_list(raw, path)
    if not items:
        raise ConfigError(
            f"{path}: an empty list binds no tenant; list them, or write 'tenants: {ANY_TENANT}'"
        )
    return tuple(sorted({as_int(t, f"{path}[{i}]", 0, 0xFFFF) for i, t in enumerate(items)}))


def _policy(raw: object, budget: int) -> PolicySpec:
    s = Section({} if raw is None else raw, "policy")
    name = as_str(s.take("name", "kvcast"), s.at("name"))
    params = s.take("params", None) or {}
    if not isinstance(params, Mapping) or not all(isinstance(k, str) for k in params):
        raise ConfigError("policy.params: expected a mapping of parameter names to values")
    dry_run = as_bool(s.take("dry_run", False), s.at("dry_run"))
    raw_min = s.take("min_accesses", "auto")
    min_accesses: int | Literal["auto"] = (
        "auto" if raw_min == "auto" else as_int(raw_min, s.at("min_accesses"), 1, 64)
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
    s = Section({} if raw is None else raw, "classes")
    d = ClassSpec()
    spec = ClassSpec(
        detect=as_bool(s.take("detect", d.detect), s.at("detect")),
        min_uses=as_int(s.take("min_uses", d.min_uses), s.at("min_uses"), 2, 1 << 16),
        window_s=as_float(s.take("window_s", d.window_s), s.at("window_s")),
        min_span_s=as_float(s.take("min_span_s", d.min_span_s), s.at("min_span_s"), positive=False),
        declared_ttl_s=as_float(s.take("declared_ttl_s", d.declared_ttl_s), s.at("declared_ttl_s")),
        max_keys=as_int(s.take("max_keys", d.max_keys), s.at("max_keys"), 1, 1 << 26),
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
    top = Section(raw, "")
    switch_list = as_list(top.take("switches", required=True), "switches")
    if not switch_list:
        raise ConfigError("switches: at least one switch is required")
    switches = tuple(_switch(r, f"switches[{i}]", base) for i, r in enumerate(switch_list))
    _check_unique([(f"switches[{i}].name", s.name) for i, s in enumerate(switches)], "name")
    only = switches[0].name if len(switches) == 1 else None
    pools = tuple(
        _pool(r, f"pools[{i}]", only) for i, r in enumerate(as_list(top.take("pools", []), "pools"))
    )
    hosts = tuple(
        _host(r, f"hosts[{i}]", i, only)
        for i, r in enumerate(as_list(top.take("hosts", []), "hosts"))
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
        for i, r in enumerate(as_list(top.take("fabric_links", []), "fabric_links"))
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
    internal = {
        (sw.name, port): what
        for sw in switches
        for port, what in [
            *((p, "its fan-out (loopback) port") for p in sw.fanout_ports),
            *([(sw.cpu_port, "its CPU port")] if sw.cpu_port is not None else []),
        ]
    }
    attached: list[tuple[str, str, str, int]] = [
        *(
            (f"pools[{i}].port", p.name, p.switch, p.port)
            for i, p in enumerate(pools)
            if p.port is not None
        ),
        *((f"hosts[{i}].port", h.name, h.switch, h.port) for i, h in enumerate(hosts)),
    ]
    for where, name, switch, port in attached:
        what = internal.get((switch, port))
        if what is not None:
            raise ConfigError(
                f"{where}: {name!r} on port {port} of {switch!r}, {what}: a host or pool node "
                "needs a port of its own (PacketOuts and WRITE copies enter there)"
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
    budget = as_int(
        top.take("sram_budget_bytes", SRAM_BYTES),
        "sram_budget_bytes",
        c.FRAG_BYTES,
        SRAM_BYTES,
    )
    policy = _policy(top.take("policy", None), budget)
    tick_s = as_float(top.take("tick_s", 1.0), "tick_s")
    sk = Section(top.take("sketch", None) or {}, "sketch")
    sketch = SketchSpec(
        window_s=as_float(sk.take("window_s", 10.0), sk.at("window_s")),
        threshold=as_int(
            sk.take("threshold", c.HOT_MISS_THRESHOLD), sk.at("threshold"), 1, (1 << 16) - 1
        ),
    )
    sk.done()
    metrics_raw = top.take("metrics", {"listen": "0.0.0.0:9108"})
    metrics: ListenAddress | None = None
    if metrics_raw is not None:
        m = Section(metrics_raw, "metrics")
        metrics = as_listen(m.take("listen", required=True), m.at("listen"))
        m.done()
    ra = Section(top.take("report_api", None) or {}, "report_api")
    report_api = ReportApiSpec(
        listen=as_listen(ra.take("listen", "0.0.0.0:9109"), ra.at("listen")),
        max_body_bytes=as_int(
            ra.take("max_body_bytes", 4 << 20), ra.at("max_body_bytes"), 1024, 1 << 30
        ),
        max_queue=as_int(ra.take("max_queue", 200_000), ra.at("max_queue"), 1, 1 << 30),
        clock_skew_s=as_float(ra.take("clock_skew_s", 5.0), ra.at("clock_skew_s")),
        operators=tuple(
            as_ip(x, f"{ra.at('operators')}[{i}]")
            for i, x in enumerate(as_list(ra.take("operators", ["127.0.0.1"]), ra.at("operators")))
        ),
    )
    ra.done()
    hosts_as_operators = sorted({h.ip for h in hosts} & set(report_api.operators))
    if hosts_as_operators:
        raise ConfigError(
            f"{ra.at('operators')}: {', '.join(hosts_as_operators)} is a GPU host's address; "
            "only operators (the controller's host, a monitor) may change the fabric"
        )
    cs = Section(top.take("chunk_source", None) or {}, "chunk_source")
    chunk_timeout_s = as_float(cs.take("timeout_s", 5.0), cs.at("timeout_s"))
    cs.done()
    max_loads = as_int(top.take("max_loads_per_tick", 512), "max_loads_per_tick", 1, 1 << 20)
    classes = _classes(top.take("classes", None))
    ps = Section(top.take("push", None) or {}, "push")
    push_budget = as_int(
        ps.take("budget_bytes_per_tick", 0), ps.at("budget_bytes_per_tick"), 0, 1 << 40
    )
    push_engines = _push_engines(ps, push_budget, hosts)
    ps.done()
    level = as_str(top.take("log_level", "INFO"), "log_level").upper()
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
        push_engines=push_engines,
        log_level=level,
        fabric_links=fabric_links,
    )
    config.fabric_plan()  # a fabric must be whole: every leaf linked to every spine
    return config


def _push_engines(ps: Section, budget: int, hosts: Sequence[HostSpec]) -> EnginePushSpec:
    """The ``push`` section's engine settings; checked against the hosts' ``engine_url``."""
    model = ps.take("model", None)
    spec = EnginePushSpec(
        bytes_per_token=as_int(ps.take("bytes_per_token", 0), ps.at("bytes_per_token"), 0, 1 << 30),
        model=None if model is None else as_str(model, ps.at("model")),
        timeout_s=as_float(ps.take("timeout_s", 60.0), ps.at("timeout_s")),
        retry_s=as_float(ps.take("retry_s", 10.0), ps.at("retry_s")),
        max_inflight=as_int(ps.take("max_inflight", 32), ps.at("max_inflight"), 1, 1024),
        max_prefixes=as_int(ps.take("max_prefixes", 256), ps.at("max_prefixes"), 1, 1 << 16),
        max_tokens=as_int(ps.take("max_tokens", 1 << 17), ps.at("max_tokens"), 1, 1 << 24),
    )
    engines = [i for i, h in enumerate(hosts) if h.engine_url is not None]
    if engines and (budget <= 0 or spec.bytes_per_token <= 0):
        raise ConfigError(
            f"hosts[{engines[0]}].engine_url: pushing to engines needs "
            "push.budget_bytes_per_tick and push.bytes_per_token (the model's KV bytes per "
            "token), both positive"
        )
    return spec


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
