"""The connector's settings, and what one request asks of it.

Both sides of the connector read the same ``kv_connector_extra_config``; a request adds its own
options in its ``kv_transfer_params``.

Classes:
    ConnectorConfig: the connector's settings, from ``kv_connector_extra_config``.
    LoadOptions: what one request asks of kvcast (load, save, multicast group and role, class,
        load budget).
    PoolHandle: one side's DRAM pool client, made on first use and closed with the side.
    ConnectorConfigError: a setting the connector cannot use.

Functions:
    load_object: ``"package.module:attribute"`` -> the attribute.
    make_reporter: the report sink the settings name (None: no reports).
"""

from __future__ import annotations

import importlib
import math
import socket
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kvcast.backend import PoolBackend
from kvcast.integrity import check_keys
from kvcast.kvclass import KvClass, parse_kv_class
from kvcast.replicas import check_replica, replica_key
from kvcast.reports import HttpReporter, ReportSink

__all__ = [
    "ConnectorConfig",
    "ConnectorConfigError",
    "LoadOptions",
    "PoolHandle",
    "load_object",
    "make_reporter",
]

Address = tuple[str, int]


class ConnectorConfigError(ValueError):
    """A ``kv_connector_extra_config`` setting the connector cannot use; the message names it."""


def load_object(path: str) -> Any:
    """Imports ``"package.module:attribute"`` and returns the attribute.

    Raises:
        ConnectorConfigError: not of that form, or the module or attribute does not exist.
    """
    module, sep, attr = path.partition(":")
    if not sep or not module or not attr:
        raise ConnectorConfigError(f"{path!r} is not 'package.module:attribute'")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ConnectorConfigError(f"cannot load {path!r}: {exc}") from None


def _address(value: Any, name: str) -> Address | None:
    if value is None:
        return None
    host, sep, port = str(value).rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ConnectorConfigError(f"{name}: {value!r} is not 'host:port'")
    return host, int(port)


def _addresses(value: Any, name: str) -> tuple[Address, ...]:
    if value is None:
        return ()
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise ConnectorConfigError(f"{name}: {value!r} is not a list of 'host:port'")
    out = []
    for i, item in enumerate(value):
        addr = _address(item, f"{name}[{i}]")
        if addr is None:
            raise ConnectorConfigError(f"{name}[{i}] is empty")
        out.append(addr)
    return tuple(out)


@dataclass(frozen=True, slots=True)
class ConnectorConfig:
    """The connector's settings (``kv_connector_extra_config``).

    Attributes:
        service: the switch VIP ``(host, port)`` GETs go to first (``"service": "host:port"``).
        pool: a pool node asked directly when the service path fails (``"pool"``).
        pools: the other pool nodes the switch may send this engine's GETs to (``"pools":
            ["host:port", ...]``): the fetch client takes DATA and NACKs only from the switch,
            ``pool`` and these, so every pool node of the fabric must be named.
        tenant: the wire tenant id of requests without a ``cache_salt`` (``"tenant"``).
        tenants: wire tenant id per ``cache_salt`` (``"tenants": {"salt": id}``); a salt not
            listed uses ``tenant`` (the salt is hashed into the keys either way).
        pool_backend: ``"mooncake"`` (Mooncake Store, settings in ``"mooncake"``) or
            ``"package.module:factory"``, called with the extra config, returning a
            ``PoolBackend``: the scheduler asks it which chunks exist, the worker puts into it.
        mooncake: keyword arguments of ``kvcast.mooncake.MooncakeBackend``.
        report_url: the controller's report API (``http://host:port``); None: no reports.
        reporter: ``"package.module:factory"`` returning a ``ReportSink`` (overrides
            ``report_url``).
        host: this engine's name in reports; default: the hostname.
        load_async: load between engine steps (the request waits in vLLM's
            ``WAITING_FOR_REMOTE_KVS``) instead of within the step that needs the KV.
        pipeline_layers: within a step, release each layer to the forward once that layer
            of every chunk of the step is in the cache (verified), so fetch and compute
            overlap; off: the first layer waits for the whole load.
        save: publish newly computed prompt blocks (only when the role produces KV).
        save_async: publish them on a saver thread, off the engine step's critical path (the
            blocks are copied out within the step either way).
        fetch: keyword arguments of ``FetchClient`` (``timeout_s``, ``deadline_s``, ``window``,
            ``max_retries``, ``frags_per_get``, ``nocache``, ``group``).
        bind: the fetch client's local address (``"host:port"``); an engine that takes part in
            multicast group fetches binds ``kvcast.ports.AGENT_PORT``, where the switch
            sends every member's replicas. None: an ephemeral port.
        follow_stall_s: a follower's silence (no new replica) before it repairs by unicast.
        follow_first_wait_s: how long a follower waits for the leader's first replica.
        mac_keys: tenant id -> secret (hex), ``kvcast.integrity``: a chunk of such a tenant
            is published with its keyed MAC and loaded only once its MAC matches its bytes.
        load_budget_us_per_token: what recomputing a token costs this engine, in microseconds
            (its prefill rate): a load job may take at most that per token it loads. A load
            still running then (a dead switch or pool node, a stalled stream) stops, and the
            blocks it has not loaded are recomputed, so a fault never costs more than computing
            the prefix would have, plus that. None: only the fetch client's ``deadline_s``
            bounds each chunk.
    """

    service: Address | None = None
    pool: Address | None = None
    pools: tuple[Address, ...] = ()
    tenant: int = 0
    tenants: Mapping[str, int] = field(default_factory=dict)
    pool_backend: str = "mooncake"
    mooncake: Mapping[str, Any] = field(default_factory=dict)
    report_url: str | None = None
    reporter: str | None = None
    host: str = ""
    load_async: bool = False
    pipeline_layers: bool = True
    save: bool = True
    save_async: bool = True
    fetch: Mapping[str, Any] = field(default_factory=dict)
    bind: Address | None = None
    follow_stall_s: float = 0.5
    follow_first_wait_s: float = 2.0
    mac_keys: Mapping[int, bytes] = field(default_factory=dict)
    load_budget_us_per_token: float | None = None

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any]) -> ConnectorConfig:
        """The settings from ``kv_connector_extra_config``.

        Raises:
            ConnectorConfigError: an unknown key, a bad address or tenant id, neither address.
        """
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(extra) - known)
        if unknown:
            raise ConnectorConfigError(
                f"unknown kvcast setting {unknown[0]!r}; known: {', '.join(sorted(known))}"
            )
        tenants = {str(k): int(v) for k, v in dict(extra.get("tenants") or {}).items()}
        tenant = int(extra.get("tenant", 0))
        for name, tid in [("tenant", tenant), *tenants.items()]:
            if not 0 <= tid <= 0xFFFF:
                raise ConnectorConfigError(f"tenant id {tid} of {name!r} is not 16-bit")
        cfg = cls(
            service=_address(extra.get("service"), "service"),
            pool=_address(extra.get("pool"), "pool"),
            pools=_addresses(extra.get("pools"), "pools"),
            tenant=tenant,
            tenants=tenants,
            pool_backend=str(extra.get("pool_backend", "mooncake")),
            mooncake=dict(extra.get("mooncake") or {}),
            report_url=extra.get("report_url"),
            reporter=extra.get("reporter"),
            host=str(extra.get("host") or socket.gethostname()),
            load_async=bool(extra.get("load_async", False)),
            pipeline_layers=bool(extra.get("pipeline_layers", True)),
            save=bool(extra.get("save", True)),
            save_async=bool(extra.get("save_async", True)),
            fetch=dict(extra.get("fetch") or {}),
            bind=_address(extra.get("bind"), "bind"),
            follow_stall_s=float(extra.get("follow_stall_s", 0.5)),
            follow_first_wait_s=float(extra.get("follow_first_wait_s", 2.0)),
            mac_keys=_mac_keys(extra.get("mac_keys")),
            load_budget_us_per_token=(
                None
                if extra.get("load_budget_us_per_token") is None
                else float(extra["load_budget_us_per_token"])
            ),
        )
        if cfg.follow_stall_s <= 0 or cfg.follow_first_wait_s <= 0:
            raise ConnectorConfigError("follow_stall_s and follow_first_wait_s must be positive")
        budget = cfg.load_budget_us_per_token
        if budget is not None and not (budget > 0 and math.isfinite(budget)):
            raise ConnectorConfigError(
                f"load_budget_us_per_token must be positive (microseconds per token), got {budget}"
            )
        if cfg.service is None and cfg.pool is None:
            raise ConnectorConfigError(
                "kvcast needs 'service' (the switch VIP, host:port), 'pool' (a pool node) or both"
            )
        return cfg

    def tenant_of(self, cache_salt: str | None) -> int:
        """The wire tenant id of a request with this ``cache_salt``."""
        if cache_salt:
            return self.tenants.get(cache_salt, self.tenant)
        return self.tenant


def _mac_keys(raw: Any) -> dict[int, bytes]:
    """``{"tenant": "hex secret"}`` -> ``{tenant: secret}``, checked by ``integrity``."""
    if not raw:
        return {}
    if not isinstance(raw, Mapping):
        raise ConnectorConfigError(f"mac_keys must map tenant ids to hex secrets, got {raw!r}")
    try:
        return dict(check_keys({int(t): bytes.fromhex(str(k)) for t, k in raw.items()}))
    except ValueError as exc:
        raise ConnectorConfigError(f"mac_keys: {exc}") from exc


def _pool_backend(cfg: ConnectorConfig, extra: Mapping[str, Any]) -> PoolBackend:
    if cfg.pool_backend == "mooncake":
        from kvcast.mooncake import MooncakeBackend

        return MooncakeBackend(**dict(cfg.mooncake))
    factory: Callable[[Mapping[str, Any]], PoolBackend] = load_object(cfg.pool_backend)
    return factory(extra)


class PoolHandle:
    """One side's DRAM pool client (``ConnectorConfig.pool_backend``), made on first use.

    The scheduler side asks it which chunks exist; the worker side puts into it.

    Args:
        config: the connector's settings.
        extra: the raw ``kv_connector_extra_config`` (a factory's argument).
    """

    def __init__(self, config: ConnectorConfig, extra: Mapping[str, Any]) -> None:
        self._config = config
        self._extra = extra
        self._backend: PoolBackend | None = None
        self._lock = threading.Lock()

    def get(self) -> PoolBackend:
        """The pool client (made on the first call)."""
        with self._lock:
            if self._backend is None:
                self._backend = _pool_backend(self._config, self._extra)
            return self._backend

    def close(self) -> None:
        """Closes the pool client if one was made; a later ``get`` makes a new one."""
        if self._backend is not None:
            self._backend.close()
            self._backend = None


def make_reporter(cfg: ConnectorConfig, extra: Mapping[str, Any]) -> ReportSink | None:
    """The report sink the settings name: ``reporter``'s factory, else ``report_url``'s client.

    Returns:
        The sink; None when neither is set (no reports).

    Raises:
        ConnectorConfigError: ``reporter`` cannot be loaded.
    """
    if cfg.reporter:
        factory: Callable[[Mapping[str, Any]], ReportSink] = load_object(cfg.reporter)
        return factory(extra)
    return HttpReporter(cfg.report_url) if cfg.report_url else None


@dataclass(frozen=True, slots=True)
class LoadOptions:
    """What one request asks of kvcast, in its ``kv_transfer_params``.

    A request says it with ``SamplingParams(extra_args={"kv_transfer_params": {"kvcast":
    {"load": ..., "group": ..., "role": ..., "class": ..., "static_tokens": ...,
    "replica": ..., "replicas": ...}}})``, as
    vLLM's own connectors take per-request transfer parameters.

    Attributes:
        load: look the request's prefix up in the pool and load it (False: the engine computes
            every token, as with no connector).
        group: multicast group of the request's fetch (0: none). Engines that serve requests
            with the same prefix at once name one group: the leader's GETs name it and the
            switch replicates every reply to every member.
        follower: this engine receives the group's stream instead of asking (another engine
            leads); gaps are repaired by unicast.
        save: publish the request's newly computed prompt blocks (when the connector saves).
        kv_class: the declared class of the prompt's blocks (``"class"``; None: undeclared).
        static_tokens: the first this many tokens are static: the blocks wholly inside them
            are declared static whatever ``kv_class`` says.
        budget_us_per_token: this request's load budget (``ConnectorConfig``'s
            ``load_budget_us_per_token``, which it overrides; None: the engine's).
        replica: with ``replicas`` > 1, the replica this engine reads every chunk from: the
            prefix is stored on ``replicas`` pool nodes, each chunk under
            ``kvcast.replicas.replica_key`` of its key, and the switch's pool-owner map sends
            that key's GETs to pool node ``replica`` (the reader picks its replica, as
            Mooncake's replica-aware client does; engine i of N usually takes ``i mod
            replicas``).
        replicas: how many replicas the prefix has (1: read the block's own key).
    """

    load: bool = True
    group: int = 0
    follower: bool = False
    save: bool = True
    kv_class: KvClass | None = None
    static_tokens: int = 0
    budget_us_per_token: float | None = None
    replica: int = 0
    replicas: int = 1

    def read_key(self, key: int) -> int:
        """The key a block with key ``key`` is read under (its replica's, if one is chosen)."""
        return key if self.replicas == 1 else replica_key(key, self.replica, self.replicas)

    def static_blocks(self, block_size: int) -> int:
        """How many blocks from the first are declared static."""
        return self.static_tokens // block_size

    def class_of(self, position: int, block_size: int) -> KvClass | None:
        """The declared class of block ``position`` (None: undeclared)."""
        return KvClass.STATIC if position < self.static_blocks(block_size) else self.kv_class

    @classmethod
    def of(cls, params: Mapping[str, Any] | None) -> LoadOptions:
        """The options in a request's ``kv_transfer_params`` (defaults where it has none).

        Raises:
            ConnectorConfigError: an unknown key or an unusable value.
        """
        raw = (params or {}).get("kvcast")
        if raw is None:
            return cls()
        if not isinstance(raw, Mapping):
            raise ConnectorConfigError(f"kv_transfer_params['kvcast'] is not a mapping: {raw!r}")
        known = {
            "load", "group", "role", "save", "class", "static_tokens", "budget_us_per_token",
            "replica", "replicas",
        }  # fmt: skip
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ConnectorConfigError(f"unknown kvcast request option {unknown[0]!r}")
        role = raw.get("role", "leader")
        group = raw.get("group", 0)
        if role not in ("leader", "follower"):
            raise ConnectorConfigError(f"kvcast role {role!r} is not 'leader' or 'follower'")
        if not isinstance(group, int) or isinstance(group, bool) or not 0 <= group <= 0xFFFF:
            raise ConnectorConfigError(f"kvcast group {group!r} is not a 16-bit group id")
        if role == "follower" and group == 0:
            raise ConnectorConfigError("a kvcast follower needs a group")
        kv_class = None
        if raw.get("class") is not None:
            try:
                kv_class = parse_kv_class(raw["class"])
            except ValueError as exc:
                raise ConnectorConfigError(f"kvcast class: {exc}") from None
        static_tokens = raw.get("static_tokens", 0)
        if (
            not isinstance(static_tokens, int)
            or isinstance(static_tokens, bool)
            or static_tokens < 0
        ):
            raise ConnectorConfigError(
                f"kvcast static_tokens {static_tokens!r} is not a non-negative token count"
            )
        budget = raw.get("budget_us_per_token")
        if budget is not None and (
            not isinstance(budget, int | float)
            or isinstance(budget, bool)
            or not (budget > 0 and math.isfinite(budget))
        ):
            raise ConnectorConfigError(
                f"kvcast budget_us_per_token {budget!r} is not a positive number of microseconds"
            )
        replica, replicas = raw.get("replica", 0), raw.get("replicas", 1)
        try:
            check_replica(replica, replicas)
        except ValueError as exc:
            raise ConnectorConfigError(f"kvcast replica: {exc}") from None
        if replicas > 1 and group:
            raise ConnectorConfigError("kvcast replicas and a multicast group do not go together")
        return cls(
            bool(raw.get("load", True)),
            group,
            role == "follower",
            bool(raw.get("save", True)),
            kv_class,
            static_tokens,
            None if budget is None else float(budget),
            replica,
            replicas,
        )
