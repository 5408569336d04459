"""kvcast as a vLLM KV connector: prefix KV from the switch (or the DRAM pool) into vLLM's cache.

vLLM's v1 engine loads external KV through a ``KVConnectorBase_V1``; ``KvcastConnector`` is one,
written for vLLM 0.32.0 (the connector API changes between releases; 0.33's is the same for what
it uses), loaded with::

    --kv-transfer-config '{"kv_connector": "KvcastConnector",
        "kv_connector_module_path": "hostagent.vllm_connector", "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"service": "10.0.0.100:19286", "pool": "10.0.1.1:19286",
                                      "mooncake": {"master_addr": "10.0.1.1:50051"}}}'

A chunk is the KV of one full vLLM block; its key is the low 64 bits of vLLM's own block hash of
that block (``request.block_hashes``, the hash prefix caching uses, chained over the prefix with
the request's ``cache_salt`` in the first block), so every engine of a tenant names a prefix
block the same way. The connector runs in two places:

Scheduler side (``role == SCHEDULER``), per step:

* ``get_num_new_matched_tokens`` asks the pool which of the request's blocks after the local
  prefix-cache hit it holds (an existence check, no KV moves) and answers the longest run as
  tokens to load, leaving at least one prompt token to compute. The switch caches only chunks
  the control plane loaded from the pool, so the pool's answer covers the switch's too.
* ``update_state_after_alloc`` records which vLLM block ids the loaded blocks go to.
* ``build_connector_meta`` hands the worker one ``ChunkLoad`` per distinct chunk of the step:
  requests of one step that share a prefix share its fetches (one fetch, copied into every
  request's block); and one ``ChunkSave`` per request whose prompt blocks became full in the step
  and are not yet known to be in the pool.

Worker side (``role == WORKER``):

* ``register_kv_caches`` takes vLLM's per-layer views ``[num_blocks, kv_heads, block_size,
  2 x head_dim]`` and derives the chunk layout from them.
* ``start_load_kv`` hands the step's loads to a loader thread, which fetches the chunks with the
  host agent's ``FetchClient.fetch_many`` (several in flight at once; switch first, the pool
  behind it, the pool directly last; every fragment CRC-checked) and copies each into every
  destination block of every layer. A request may ask for a multicast group fetch
  (``LoadOptions``: its ``kv_transfer_params``): the leader's GETs name the group and the switch
  replicates the replies to every member; a follower takes the stream
  (``FetchClient.follow``) and repairs gaps by unicast.
* KV classes (``kvcast.kvclass``): a request may declare its prompt's class (``"class":
  "static"`` or ``"transient"``) and that its first ``static_tokens`` tokens are static (the
  blocks wholly inside them: a system prompt and tool definitions every branch reuses). The
  declared class of each block goes with its access record and its ``"stored"`` record to the
  controller, and static blocks are put into the pool as static (Mooncake's soft pin).
* ``wait_for_layer_load`` waits for a synchronous load (one chunk holds every layer, so the first
  layer waits for all); with ``load_async`` the engine goes on and ``get_finished`` reports the
  requests whose loads ended.
* A chunk that does not arrive complete and verified is never reported as loaded: its blocks, and
  every later block of the same request, are returned by ``get_block_ids_with_load_errors`` and
  vLLM recomputes from the first of them (``kv_load_failure_policy: recompute``).
* ``wait_for_save`` copies the step's newly full prompt blocks out of the KV cache and publishes
  them through the producer path (``Producer.publish_keyed``: one batched put of the chunks the
  pool lacks, ``"stored"`` records to the controller).

Classes:
    ConnectorConfig: the connector's settings, from ``kv_connector_extra_config``.
    LoadOptions: what one request asks of kvcast (load, save, multicast group and role).
    KvcastConnectorStats: the connector's counters for vLLM's metrics.
    ChunkLoad: one chunk to fetch and the engine blocks it goes to.
    ChunkSave: one request's newly full blocks to publish.
    KvcastConnectorMetadata: what the scheduler side hands the worker side each step.
    KvcastConnector: the connector.
    ConnectorConfigError: a setting the connector cannot use.

Functions:
    load_object: ``"package.module:attribute"`` -> the attribute.
    worker_stats: the counters of this process's worker connectors (an in-process engine).
"""

from __future__ import annotations

import importlib
import logging
import math
import socket
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats

from hostagent.chunkkeys import ChunkKey, ChunkKeyer, wire_key
from hostagent.fetch import ChunkRequest, FetchClient, FetchReport
from hostagent.integrity import check_keys
from hostagent.layout import KVLayout, PagedLayout, gather_from_paged, scatter_to_paged
from hostagent.producer import Producer
from hostagent.reports import HttpReporter, ReportSink
from kvcast.kvclass import KvClass, parse_kv_class
from poolnode.backend import PoolBackend, PoolBackendError

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

__all__ = [
    "ChunkLoad",
    "ChunkSave",
    "ConnectorConfig",
    "ConnectorConfigError",
    "KvcastConnector",
    "KvcastConnectorMetadata",
    "KvcastConnectorStats",
    "LoadOptions",
    "load_object",
    "worker_stats",
]

_LOG = logging.getLogger(__name__)

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


@dataclass(frozen=True, slots=True)
class ConnectorConfig:
    """The connector's settings (``kv_connector_extra_config``).

    Attributes:
        service: the switch VIP ``(host, port)`` GETs go to first (``"service": "host:port"``).
        pool: a pool node asked directly when the service path fails (``"pool"``).
        tenant: the wire tenant id of requests without a ``cache_salt`` (``"tenant"``).
        tenants: wire tenant id per ``cache_salt`` (``"tenants": {"salt": id}``); a salt not
            listed uses ``tenant`` (the salt is hashed into the keys either way).
        pool_backend: ``"mooncake"`` (Mooncake Store, settings in ``"mooncake"``) or
            ``"package.module:factory"``, called with the extra config, returning a
            ``PoolBackend``: the scheduler asks it which chunks exist, the worker puts into it.
        mooncake: keyword arguments of ``poolnode.mooncake.MooncakeBackend``.
        report_url: the controller's report API (``http://host:port``); None: no reports.
        reporter: ``"package.module:factory"`` returning a ``ReportSink`` (overrides
            ``report_url``).
        host: this engine's name in reports; default: the hostname.
        load_async: load between engine steps (the request waits in vLLM's
            ``WAITING_FOR_REMOTE_KVS``) instead of within the step that needs the KV.
        save: publish newly computed prompt blocks (only when the role produces KV).
        save_async: publish them on a saver thread, off the engine step's critical path (the
            blocks are copied out within the step either way).
        fetch: keyword arguments of ``FetchClient`` (``timeout_s``, ``deadline_s``, ``window``,
            ``max_retries``, ``frags_per_get``, ``nocache``, ``group``).
        bind: the fetch client's local address (``"host:port"``); an engine that takes part in
            multicast group fetches binds ``hostagent.ports.AGENT_PORT``, where the switch
            sends every member's replicas. None: an ephemeral port.
        follow_stall_s: a follower's silence (no new replica) before it repairs by unicast.
        follow_first_wait_s: how long a follower waits for the leader's first replica.
        mac_keys: tenant id -> secret (hex), ``hostagent.integrity``: a chunk of such a tenant
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
    tenant: int = 0
    tenants: Mapping[str, int] = field(default_factory=dict)
    pool_backend: str = "mooncake"
    mooncake: Mapping[str, Any] = field(default_factory=dict)
    report_url: str | None = None
    reporter: str | None = None
    host: str = ""
    load_async: bool = False
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
            tenant=tenant,
            tenants=tenants,
            pool_backend=str(extra.get("pool_backend", "mooncake")),
            mooncake=dict(extra.get("mooncake") or {}),
            report_url=extra.get("report_url"),
            reporter=extra.get("reporter"),
            host=str(extra.get("host") or socket.gethostname()),
            load_async=bool(extra.get("load_async", False)),
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
        from poolnode.mooncake import MooncakeBackend

        return MooncakeBackend(**dict(cfg.mooncake))
    factory: Callable[[Mapping[str, Any]], PoolBackend] = load_object(cfg.pool_backend)
    return factory(extra)


def _reporter(cfg: ConnectorConfig, extra: Mapping[str, Any]) -> ReportSink | None:
    if cfg.reporter:
        factory: Callable[[Mapping[str, Any]], ReportSink] = load_object(cfg.reporter)
        return factory(extra)
    return HttpReporter(cfg.report_url) if cfg.report_url else None


@dataclass(frozen=True, slots=True)
class LoadOptions:
    """What one request asks of kvcast, in its ``kv_transfer_params``.

    A request says it with ``SamplingParams(extra_args={"kv_transfer_params": {"kvcast":
    {"load": ..., "group": ..., "role": ..., "class": ..., "static_tokens": ...}}})``, as
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
    """

    load: bool = True
    group: int = 0
    follower: bool = False
    save: bool = True
    kv_class: KvClass | None = None
    static_tokens: int = 0
    budget_us_per_token: float | None = None

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
        known = {"load", "group", "role", "save", "class", "static_tokens", "budget_us_per_token"}
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
        return cls(
            bool(raw.get("load", True)),
            group,
            role == "follower",
            bool(raw.get("save", True)),
            kv_class,
            static_tokens,
            None if budget is None else float(budget),
        )


# ------------------------------------------------------------------------------ metadata
@dataclass(slots=True)
class ChunkLoad:
    """One chunk to fetch, and the engine blocks it goes to.

    Attributes:
        tenant: wire tenant id.
        key: chunk key (low 64 bits of vLLM's block hash).
        parent: key of the previous block of the prefix (for the access report).
        position: the block's index in its prefix.
        targets: ``(request id, engine block id)`` for every request of the step that needs it.
        group: multicast group of the fetch (0: none; ``LoadOptions``).
        follower: receive the group's stream rather than ask.
        kv_class: its declared class (static when any request that needs it says so).
        budget_us: microseconds per token its load may take (the most patient of the requests
            that need it; None: no bound but the fetch client's).
    """

    tenant: int
    key: int
    parent: int | None
    position: int
    targets: list[tuple[str, int]] = field(default_factory=list)
    group: int = 0
    follower: bool = False
    kv_class: KvClass | None = None
    budget_us: float | None = None


@dataclass(slots=True)
class ChunkSave:
    """One request's prompt blocks that became full this step, to publish.

    Attributes:
        req_id: the request.
        tenant: wire tenant id.
        digests: vLLM's block hashes of blocks ``0 .. first + len(block_ids) - 1``.
        first: index of the first block to publish.
        block_ids: engine block ids of blocks ``first ..``.
        static_blocks: blocks ``0 .. static_blocks - 1`` are declared static.
        kv_class: the declared class of the other blocks (None: undeclared).
    """

    req_id: str
    tenant: int
    digests: list[bytes]
    first: int
    block_ids: list[int]
    static_blocks: int = 0
    kv_class: KvClass | None = None


@dataclass
class KvcastConnectorMetadata(KVConnectorMetadata):
    """What the scheduler side hands the worker side for one step.

    Attributes:
        loads: one entry per distinct chunk to fetch, in prefix order.
        load_reqs: the requests whose loads this step carries.
        saves: prompt blocks to publish after the step's forward pass.
    """

    loads: list[ChunkLoad] = field(default_factory=list)
    load_reqs: list[str] = field(default_factory=list)
    saves: list[ChunkSave] = field(default_factory=list)


@dataclass(slots=True)
class _Lookup:
    """A request's last answer: the local hit it was asked after."""

    local_tokens: int


@dataclass(slots=True)
class _LoadJob:
    """One step's loads in the loader thread: its requests and every engine block it writes."""

    req_ids: set[str]
    asynchronous: bool
    blocks: set[int]
    future: Future[set[int]] | None = None


# ------------------------------------------------------------------------------ stats
@dataclass
class KvcastConnectorStats(KVConnectorStats):
    """kvcast's counters for vLLM's connector metrics (``data``: counter -> sum)."""

    def reset(self) -> None:  # noqa: D102
        self.data = {}

    def aggregate(self, other: KVConnectorStats) -> KvcastConnectorStats:  # noqa: D102
        for k, v in other.data.items():
            self.data[k] = self.data.get(k, 0) + v
        return self

    def reduce(self) -> dict[str, int | float]:  # noqa: D102
        out: dict[str, int | float] = dict(self.data)
        if out.get("load_s"):
            out["load_gbps"] = round(out.get("bytes_loaded", 0) * 8 / out["load_s"] / 1e9, 3)
        return out

    def is_empty(self) -> bool:  # noqa: D102
        return not self.data


_WORKERS: weakref.WeakSet[KvcastConnector] = weakref.WeakSet()


def worker_stats() -> dict[str, float]:
    """The life counters (``KvcastConnector.stats``) of this process's worker connectors, summed.

    An engine run in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, the ``uni`` executor) holds
    its worker connector here, so a driver can read what its requests loaded.
    """
    out: dict[str, float] = {}
    for conn in list(_WORKERS):
        with conn._stats_lock:
            for k, v in conn.stats.items():
                out[k] = out.get(k, 0) + v
    return out


# ------------------------------------------------------------------------------ connector
class KvcastConnector(KVConnectorBase_V1):
    """vLLM KV connector that loads prefix KV through kvcast and publishes computed KV.

    Args:
        vllm_config: the engine's configuration (``kv_transfer_config`` holds kvcast's
            settings in ``kv_connector_extra_config``; see ``ConnectorConfig``).
        role: scheduler or worker side.
        kv_cache_config: the engine's KV cache configuration.

    Raises:
        ConnectorConfigError: a setting is unusable, the hash block size is not the block size
            (a chunk is one vLLM block), or the engine has several KV cache groups or ranks.
    """

    def __init__(
        self,
        vllm_config: VllmConfig,
        role: KVConnectorRole,
        kv_cache_config: KVCacheConfig,
    ) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = dict(self._kv_transfer_config.kv_connector_extra_config)
        self.config = ConnectorConfig.from_extra(extra)
        self.block_size = int(vllm_config.cache_config.block_size)
        hash_block = getattr(kv_cache_config, "hash_block_size", None)
        if hash_block not in (None, self.block_size):
            raise ConnectorConfigError(
                f"vLLM hashes blocks of {hash_block} tokens but the KV blocks hold "
                f"{self.block_size}; kvcast keys one chunk per block hash"
            )
        groups = len(kv_cache_config.kv_cache_groups)
        parallel = vllm_config.parallel_config
        if groups != 1 or parallel.tensor_parallel_size * parallel.pipeline_parallel_size != 1:
            raise ConnectorConfigError(
                f"kvcast handles one KV cache group on one worker; this engine has {groups} "
                f"groups, tensor parallel {parallel.tensor_parallel_size} and pipeline parallel "
                f"{parallel.pipeline_parallel_size} (each rank would need its own chunk keys)"
            )
        if self._kv_transfer_config.kv_load_failure_policy != "recompute":
            _LOG.warning(
                "kv_load_failure_policy is %r: a chunk kvcast cannot fetch fails the request; "
                "set it to 'recompute' to prefill such blocks instead",
                self._kv_transfer_config.kv_load_failure_policy,
            )
        self._extra = extra
        self._save = self.config.save and bool(self._kv_transfer_config.is_kv_producer)
        self._backend: PoolBackend | None = None
        self._backend_lock = threading.Lock()
        # scheduler side
        self._lookups: dict[str, _Lookup] = {}
        self._requests: dict[str, Request] = {}
        self._pending: dict[str, list[tuple[int, int]]] = {}
        self._options: dict[str, LoadOptions] = {}
        self._known_upto: dict[str, int] = {}
        # worker side
        self._reporter: ReportSink | None = None
        self._client: FetchClient | None = None
        self._layout: KVLayout | None = None
        self._caches: list[torch.Tensor] = []
        self._bufs: list[torch.Tensor] = []
        self._paged: PagedLayout = "bhnc"
        self._producers: dict[int, Producer] = {}
        self._executor: ThreadPoolExecutor | None = None
        self._saver: ThreadPoolExecutor | None = None
        self._pending_saves: list[Future[None]] = []
        self._sync_job: _LoadJob | None = None
        self._async_jobs: list[_LoadJob] = []
        self._load_errors: set[int] = set()
        self.last_reports: list[FetchReport] = []
        """The fetch reports of the last finished load job (for logs and tests)."""
        self.stats: dict[str, float] = {}
        """Counters over the connector's life: load jobs, chunks and bytes loaded, chunks and
        blocks failed, fragments from SRAM, the pool and a group's stream, repairs, seconds."""
        self._interval: dict[str, float] = {}
        self._stats_lock = threading.Lock()
        self.saved: list[tuple[int, int]] = []
        """``(tenant, key)`` of every block ``wait_for_save`` handed the pool, in order."""
        if role == KVConnectorRole.WORKER:
            self._reporter = _reporter(self.config, extra)
            _WORKERS.add(self)

    # -------------------------------------------------------------- shared
    @property
    def backend(self) -> PoolBackend:
        """The DRAM pool client (made on first use)."""
        with self._backend_lock:
            if self._backend is None:
                self._backend = _pool_backend(self.config, self._extra)
            return self._backend

    def shutdown(self) -> None:
        """Waits for the loader and saver threads, closes the fetch client, reporter and pool."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        if self._saver is not None:
            self._saver.shutdown(wait=True)
            self._saver = None
            self._pending_saves = []
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._reporter is not None:
            self._reporter.close()
        if self._backend is not None:
            self._backend.close()
            self._backend = None

    # -------------------------------------------------------------- scheduler side
    def _held_many(self, tenant: int, keys: list[int]) -> list[bool]:
        """Which of a request's blocks the pool holds: one batched query per request."""
        try:
            return self.backend.contains_many(tenant, keys)
        except PoolBackendError as exc:
            _LOG.info("kvcast: pool existence check of %d blocks failed: %s", len(keys), exc)
            return [False] * len(keys)

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        """Tokens after the local hit whose blocks the pool (and so maybe the switch) holds.

        Args:
            request: the request (its ``block_hashes`` and ``cache_salt`` are used).
            num_computed_tokens: tokens the engine's own prefix cache holds (block-aligned).

        Returns:
            ``(tokens to load, load asynchronously)``; ``(0, False)`` when none.
        """
        bs = self.block_size
        hashes = request.block_hashes
        # At least one prompt token must be computed: vLLM needs its logits.
        limit = min(len(hashes), (request.num_tokens - 1) // bs)
        first = num_computed_tokens // bs
        tenant = self.config.tenant_of(request.cache_salt)
        try:
            options = LoadOptions.of(request.kv_transfer_params)
        except ConnectorConfigError as exc:
            _LOG.warning("kvcast: request %s computes every token: %s", request.request_id, exc)
            options = LoadOptions(load=False)
        hit = first
        if options.load and first < limit:
            held = self._held_many(tenant, [wire_key(h) for h in hashes[first:limit]])
            while hit < limit and held[hit - first]:
                hit += 1
        self._lookups[request.request_id] = _Lookup(num_computed_tokens)
        self._options[request.request_id] = options
        self._requests[request.request_id] = request
        if hit == first:
            return 0, False
        return hit * bs - num_computed_tokens, self.config.load_async

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        """Records which engine blocks the request's loaded chunks go to.

        Args:
            request: the request.
            blocks: every block the request holds now.
            num_external_tokens: tokens to load (0: nothing).
        """
        req_id = request.request_id
        self._requests[req_id] = request
        lookup = self._lookups.pop(req_id, None)
        if lookup is None:
            return
        bs = self.block_size
        first = lookup.local_tokens // bs
        end = (lookup.local_tokens + num_external_tokens) // bs
        self._known_upto[req_id] = max(self._known_upto.get(req_id, 0), end)
        if num_external_tokens <= 0:
            return
        block_ids = blocks.get_block_ids()[0]
        self._pending[req_id] = [(i, block_ids[i]) for i in range(first, end)]

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KvcastConnectorMetadata:
        """The step's loads (one per distinct chunk) and saves; resets the pending loads.

        Args:
            scheduler_output: the step's schedule.

        Returns:
            The metadata for the worker side.
        """
        meta = KvcastConnectorMetadata()
        by_chunk: dict[tuple[int, int, int, bool], ChunkLoad] = {}
        for req_id, items in self._pending.items():
            request = self._requests[req_id]
            tenant = self.config.tenant_of(request.cache_salt)
            opts = self._options.get(req_id, LoadOptions())
            hashes = request.block_hashes
            for position, block_id in items:
                key = wire_key(hashes[position])
                load = by_chunk.get((tenant, key, opts.group, opts.follower))
                if load is None:
                    parent = wire_key(hashes[position - 1]) if position > 0 else None
                    load = by_chunk[(tenant, key, opts.group, opts.follower)] = ChunkLoad(
                        tenant, key, parent, position, group=opts.group, follower=opts.follower
                    )
                declared = opts.class_of(position, self.block_size)
                if declared is KvClass.STATIC or load.kv_class is None:
                    load.kv_class = declared
                budget = opts.budget_us_per_token or self.config.load_budget_us_per_token
                if not load.targets:
                    load.budget_us = budget
                elif load.budget_us is not None:
                    load.budget_us = None if budget is None else max(load.budget_us, budget)
                load.targets.append((req_id, block_id))
            meta.load_reqs.append(req_id)
        meta.loads = sorted(by_chunk.values(), key=lambda ld: ld.position)
        self._pending.clear()
        if self._save:
            meta.saves = self._saves(scheduler_output)
        return meta

    def _saves(self, scheduler_output: SchedulerOutput) -> list[ChunkSave]:
        """Prompt blocks that become full in this step and are not known to be in the pool."""
        out: list[ChunkSave] = []
        if self._kv_cache_manager is None:
            return out
        bs = self.block_size
        cached = scheduler_output.scheduled_cached_reqs
        computed = dict(zip(cached.req_ids, cached.num_computed_tokens, strict=True))
        for new in scheduler_output.scheduled_new_reqs:
            computed[new.req_id] = new.num_computed_tokens
        for req_id, scheduled in scheduler_output.num_scheduled_tokens.items():
            request = self._requests.get(req_id)
            if request is None or req_id not in computed:
                continue
            opts = self._options.get(req_id, LoadOptions())
            if not opts.save:
                continue
            upto = min(computed[req_id] + scheduled, request.num_prompt_tokens)
            end = min(upto // bs, len(request.block_hashes))
            first = self._known_upto.get(req_id, 0)
            if end <= first:
                continue
            block_ids = self._kv_cache_manager.get_blocks(req_id).get_block_ids()[0]
            out.append(
                ChunkSave(
                    req_id,
                    self.config.tenant_of(request.cache_salt),
                    [bytes(h) for h in request.block_hashes[:end]],
                    first,
                    list(block_ids[first:end]),
                    opts.static_blocks(bs),
                    opts.kv_class,
                )
            )
            self._known_upto[req_id] = end
        return out

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        """Forgets the request; its blocks can be freed at once (saves are synchronous)."""
        req_id = request.request_id
        for table in (
            self._lookups,
            self._requests,
            self._pending,
            self._known_upto,
            self._options,
        ):
            table.pop(req_id, None)
        return False, None

    # -------------------------------------------------------------- worker side
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """Takes the per-layer KV views and derives the chunk layout from them.

        Args:
            kv_caches: layer name -> ``[num_blocks, kv_heads, block_size, 2 x head_dim]``
                (vLLM's standardized view since 0.32), in layer order.

        Raises:
            ConnectorConfigError: a view of another shape, or layers that differ.
        """
        caches = list(kv_caches.values())
        if not caches:
            raise ConnectorConfigError("no KV cache layers registered")
        first = caches[0]
        if first.dim() != 4 or first.shape[3] % 2:
            raise ConnectorConfigError(
                f"KV view {tuple(first.shape)} is not [num_blocks, kv_heads, block_size, "
                "2 x head_dim] (vLLM's per-layer view)"
            )
        _, heads, block, content = (int(d) for d in first.shape)
        if block != self.block_size:
            raise ConnectorConfigError(f"KV view blocks of {block} tokens, not {self.block_size}")
        for name, kv in kv_caches.items():
            if kv.shape != first.shape or kv.dtype != first.dtype:
                raise ConnectorConfigError(f"layer {name}: {kv.dtype} {tuple(kv.shape)} differs")
        self._caches = caches
        self._layout = KVLayout(len(caches), heads, content // 2, first.dtype, block)
        self._bufs = []  # chunk buffers of the previous layout, if any

    @property
    def layout(self) -> KVLayout:
        """The chunk layout of the registered KV caches."""
        if self._layout is None:
            raise ConnectorConfigError("no KV caches registered yet (register_kv_caches)")
        return self._layout

    def fetch_client(self) -> FetchClient:
        """The worker's fetch client (made on first use; one fetch at a time, from the loader)."""
        if self._client is None:
            extra: dict[str, Any] = dict(self.config.fetch)
            if self.config.bind is not None:
                extra["bind"] = self.config.bind
            if self.config.mac_keys:
                extra["mac_keys"] = self.config.mac_keys
            self._client = FetchClient(
                self.config.service,
                self.config.pool,
                reporter=self._reporter,
                report_host=self.config.host,
                **extra,
            )
        return self._client

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        """Hands the step's chunk loads to the loader thread.

        Args:
            forward_context: the step's forward context (unused: the caches are registered).
            **kwargs: unused.
        """
        meta = self._get_connector_metadata()
        assert isinstance(meta, KvcastConnectorMetadata)
        if not meta.loads:
            return
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="kvcast-load")
        blocks = {b for load in meta.loads for _, b in load.targets}
        job = _LoadJob(set(meta.load_reqs), self.config.load_async, blocks)
        job.future = self._executor.submit(self._load, list(meta.loads))
        if job.asynchronous:
            self._async_jobs.append(job)
        else:
            self._sync_job = job

    def _load(self, loads: Sequence[ChunkLoad]) -> set[int]:
        """Fetches every chunk once and copies it into its blocks; returns the failed blocks.

        The loads of one kind (no group; leading group ``g``; following group ``g``) go
        together, kinds in the order their first chunk appears. Unicast chunks go through
        ``FetchClient.fetch_many``, up to the client's ``max_chunks_in_flight`` at once (each
        into its own reusable buffer), in prefix order. A leader does the same with the group in
        its GETs; a follower takes one chunk's stream after the other (``FetchClient.follow``),
        keeping the replicas of the chunks after it that it reads meanwhile for their turn.

        A chunk that does not end complete (every fragment present and CRC-checked) fails its
        blocks and every later block of the requests that needed it: a block's KV depends on
        every token before it, so vLLM must recompute from the first block it lacks. After a
        failure no further chunk is started in that batch; the chunks not started are
        considered again with what failed, so a chunk only failed requests need is not
        fetched (chunks already in flight with the failed one end, and their bytes go only to
        the requests that did not fail).
        """
        kinds: dict[tuple[int, bool], list[ChunkLoad]] = {}
        for load in loads:
            kinds.setdefault((load.group, load.follower), []).append(load)
        failed_reqs: set[str] = set()
        failed: set[int] = set()
        reports: list[FetchReport] = []
        t0 = time.monotonic()
        # The job may take what recomputing its tokens would (each chunk's budget); a chunk
        # without one leaves the job unbounded but by the fetch client's deadline.
        budgets = [load.budget_us for load in loads]
        deadline = (
            None
            if any(b is None for b in budgets)
            else t0 + sum(b or 0.0 for b in budgets) * self.layout.block_size * 1e-6
        )
        cut = 0
        for (group, follower), part in kinds.items():
            cut += self._load_part(part, group, follower, failed_reqs, failed, reports, deadline)
        self.last_reports = reports
        self._count(reports, failed, time.monotonic() - t0, cut)
        return failed

    def _load_part(
        self,
        loads: Sequence[ChunkLoad],
        group: int,
        follower: bool,
        failed_reqs: set[str],
        failed: set[int],
        reports: list[FetchReport],
        deadline: float | None = None,
    ) -> int:
        """``_load`` for the loads of one kind; adds to ``failed_reqs``, ``failed``, ``reports``.

        Past ``deadline`` (the load budget) no chunk is started and each one in flight is cut
        short: their blocks are recomputed.

        Returns:
            The chunks not started because the budget was spent.
        """
        layout = self.layout
        client = self.fetch_client()
        bufs = self._load_buffers(client.max_chunks_in_flight)
        base_deadline_s = client.deadline_s
        at = 0
        while at < len(loads):
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                # Recomputing what is left is now cheaper than waiting for it.
                for load in loads[at:]:
                    failed_reqs.update(r for r, _ in load.targets)
                    failed.update(b for _, b in load.targets)
                return len(loads) - at
            batch: list[tuple[int, ChunkLoad]] = []  # (index in loads, load)
            while at < len(loads) and len(batch) < len(bufs):
                load = loads[at]
                if any(r not in failed_reqs for r, _ in load.targets):
                    batch.append((at, load))
                else:
                    failed.update(b for _, b in load.targets)
                at += 1
            if not batch:
                break
            requests = [
                ChunkRequest(
                    load.tenant,
                    load.key,
                    buf,
                    layout.chunk_bytes,
                    load.parent,
                    load.position,
                    load.kv_class,
                )
                for (_, load), buf in zip(batch, bufs, strict=False)
            ]
            got: list[FetchReport | None]
            if left is not None:
                client.deadline_s = min(base_deadline_s, left)
            try:
                got = list(self._fetch(client, requests, group, follower))
            except Exception:  # a load must end in blocks loaded or blocks to recompute
                _LOG.exception("kvcast: fetch of chunks %s raised", [hex(r.key) for r in requests])
                got = [None] * len(batch)
            finally:
                client.deadline_s = base_deadline_s
            if len(got) < len(batch):  # stopped after a failure: the rest is considered again
                at = batch[len(got)][0]
            for (_, load), buf, report in zip(batch, bufs, got, strict=False):
                live = [(r, b) for r, b in load.targets if r not in failed_reqs]
                failed.update(b for r, b in load.targets if r in failed_reqs)
                if report is not None:
                    reports.append(report)
                if report is None or not report.ok:
                    failed_reqs.update(r for r, _ in live)
                    failed.update(b for _, b in live)
                    continue
                for _, block_id in live:
                    scatter_to_paged(layout, buf, self._caches, block_id, self._paged)
        return 0

    def _fetch(
        self, client: FetchClient, requests: Sequence[ChunkRequest], group: int, follower: bool
    ) -> list[FetchReport]:
        """One batch of chunks: unicast, leading group ``group`` or following it.

        Returns:
            One report per chunk started, in order; the batch stops after the first chunk that
            fails (a prefix is of use only up to its first missing block).
        """
        if group == 0:
            return client.fetch_many(requests, stop_after_failure=True)
        client.group = group
        try:
            if not follower:
                return client.fetch_many(requests, stop_after_failure=True)
            out: list[FetchReport] = []
            for r in requests:
                report = client.follow(
                    r.tenant, r.key, r.dst, r.nbytes,
                    stall_s=self.config.follow_stall_s,
                    first_wait_s=self.config.follow_first_wait_s,
                    parent=r.parent, position=r.position, kv_class=r.kv_class,
                )  # fmt: skip
                out.append(report)
                if not report.ok:
                    break
            return out
        finally:
            client.group = 0

    def _count(
        self, reports: Sequence[FetchReport], failed: set[int], seconds: float, cut: int = 0
    ) -> None:
        """Adds one load job to the connector's counters (``stats``, vLLM's connector stats).

        ``cut``: chunks not started because the job's load budget was spent.
        """
        layout = self.layout
        ok = [r for r in reports if r.ok]
        delta = {
            "load_jobs": 1,
            "chunks_loaded": len(ok),
            "bytes_loaded": len(ok) * layout.chunk_bytes,
            "chunks_failed": len(reports) - len(ok),
            "blocks_failed": len(failed),
            "frags_hit": sum(r.frags_hit for r in reports),
            "frags_pool": sum(r.frags_pool for r in reports),
            "frags_stream": sum(r.frags_stream for r in reports),
            "repairs": sum(r.repairs for r in reports),
            "load_s": seconds,
            "chunks_over_budget": cut,
        }
        with self._stats_lock:
            for k, v in delta.items():
                self.stats[k] = self.stats.get(k, 0) + v
                self._interval[k] = self._interval.get(k, 0) + v

    def get_kv_connector_stats(self) -> KvcastConnectorStats | None:
        """The counters since the last call, for vLLM's stat loggers (None: nothing new)."""
        with self._stats_lock:
            if not self._interval:
                return None
            data, self._interval = self._interval, {}
        return KvcastConnectorStats(data=data)

    @classmethod
    def build_kv_connector_stats(
        cls, data: dict[str, Any] | None = None
    ) -> KvcastConnectorStats | None:
        """The worker's stats rebuilt on the scheduler side from their ``data``."""
        return KvcastConnectorStats(data=dict(data or {}))

    def _load_buffers(self, count: int) -> list[torch.Tensor]:
        """``count`` chunk buffers (pinned where CUDA is), made once and reused by every load."""
        while len(self._bufs) < count:
            self._bufs.append(self.layout.alloc_chunk())
        return self._bufs[:count]

    def _finish(self, job: _LoadJob) -> None:
        assert job.future is not None
        try:
            self._load_errors |= job.future.result()
        except Exception:  # the thread died: nothing it touched counts as loaded
            _LOG.exception("kvcast: load job failed")
            self._load_errors |= job.blocks

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Waits for the step's synchronous load (a chunk holds every layer: the first waits)."""
        job, self._sync_job = self._sync_job, None
        if job is not None:
            self._finish(job)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        """Requests whose asynchronous loads ended (their failed blocks are reported too).

        Args:
            finished_req_ids: requests the engine finished (saves are synchronous: none wait).

        Returns:
            ``(None, finished loading)``.
        """
        self.wait_for_layer_load("")  # a step without attention layers still ends its load
        done: set[str] = set()
        pending: list[_LoadJob] = []
        for job in self._async_jobs:
            assert job.future is not None
            if job.future.done():
                self._finish(job)
                done |= job.req_ids
            else:
                pending.append(job)
        self._async_jobs = pending
        return None, done or None

    def get_block_ids_with_load_errors(self) -> set[int]:
        """Engine blocks whose chunk was not loaded: vLLM recomputes from them on."""
        self.wait_for_layer_load("")
        errors, self._load_errors = self._load_errors, set()
        return errors

    def save_kv_layer(
        self,
        layer_name: str,
        kv_layer: torch.Tensor,
        attn_metadata: AttentionMetadata,
        **kwargs: Any,
    ) -> None:
        """Nothing per layer: a chunk holds every layer, so ``wait_for_save`` publishes it."""

    def wait_for_save(self) -> None:
        """Copies the step's newly full prompt blocks out of the KV cache and publishes them.

        The copy is made here, within the step (the engine may reuse the blocks afterwards);
        the publish (the pool's batched put and the ``"stored"`` records) runs on the saver
        thread, off the step's critical path, unless ``save_async`` is off. ``flush_saves``
        waits for what is queued.
        """
        meta = self._get_connector_metadata()
        assert isinstance(meta, KvcastConnectorMetadata)
        if not meta.saves or self._layout is None:
            return
        layout = self._layout
        for save in meta.saves:
            ckeys = [
                ChunkKey(i, d, wire_key(d), i * layout.block_size, (i + 1) * layout.block_size)
                for i, d in enumerate(save.digests)
            ]
            chunks = []
            for block_id in save.block_ids:
                chunk = layout.alloc_chunk()
                gather_from_paged(layout, self._caches, block_id, chunk, self._paged)
                chunks.append(chunk)
            self.saved.extend((save.tenant, k.key) for k in ckeys[save.first :])
            if not self.config.save_async:
                self._publish(save, ckeys, chunks)
                continue
            if self._saver is None:
                self._saver = ThreadPoolExecutor(1, thread_name_prefix="kvcast-save")
            self._pending_saves.append(self._saver.submit(self._publish, save, ckeys, chunks))
        self._pending_saves = [f for f in self._pending_saves if not f.done()]

    def _publish(self, save: ChunkSave, ckeys: list[ChunkKey], chunks: list[torch.Tensor]) -> None:
        """One request's blocks into the pool (the producer path); failures are logged."""
        req_id = save.req_id
        try:
            report = self._producer(save.tenant).publish_keyed(
                ckeys,
                chunks,
                save.first,
                static_blocks=save.static_blocks,
                kv_class=save.kv_class,
            )
        except Exception:  # a save that fails costs reuse, never the engine
            _LOG.exception("kvcast: publishing %d chunks of %s raised", len(chunks), req_id)
            return
        if not report.ok:
            _LOG.info(
                "kvcast: %d chunks of %s not published: %s", report.failed, req_id, report.error
            )

    def flush_saves(self, timeout_s: float | None = None) -> bool:
        """Waits for the queued publishes; returns whether all ended within ``timeout_s``."""
        pending, self._pending_saves = self._pending_saves, []
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for f in pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                f.result(timeout=left)
            except TimeoutError:
                self._pending_saves.append(f)
        return not self._pending_saves

    def _producer(self, tenant: int) -> Producer:
        producer = self._producers.get(tenant)
        if producer is None:
            # Keys come from vLLM (publish_keyed); the keyer only fixes the block size.
            keyer = ChunkKeyer(self.layout.block_size, "unused")
            producer = Producer(
                self.backend,
                self.layout,
                keyer,
                tenant,
                reporter=self._reporter,
                host=self.config.host,
                mac_key=self.config.mac_keys.get(tenant),
            )
            self._producers[tenant] = producer
        return producer
