"""The connector's scheduler side: which blocks to load and save, one step at a time.

It runs in vLLM's scheduler process. Per step, ``get_num_new_matched_tokens`` asks the pool
which of a request's blocks after the local prefix-cache hit it holds (an existence check, no KV
moves) and answers the longest run as tokens to load, leaving at least one prompt token to
compute (the switch caches only chunks the control plane loaded from the pool, so the pool's
answer covers the switch's too). ``update_state_after_alloc`` records which vLLM block ids the
loaded blocks go to. ``build_connector_meta`` hands the worker one ``ChunkLoad`` per distinct
chunk of the step (requests of one step that share a prefix share its fetches) with the most
patient load budget of the requests that need it, and one ``ChunkSave`` per request whose
prompt blocks became full in the step and are not yet known to be in the pool.

Classes:
    KvcastScheduler: the scheduler side's state (lookups, pending loads, request options,
        blocks known to be in the pool) and its per-step answers.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from hostagent.chunkkeys import wire_key
from hostagent.vllm_connector.config import (
    ConnectorConfig,
    ConnectorConfigError,
    LoadOptions,
    PoolHandle,
)
from hostagent.vllm_connector.data import ChunkLoad, ChunkSave, KvcastConnectorMetadata
from kvcast.backend import PoolBackendError
from kvcast.kvclass import KvClass

if TYPE_CHECKING:
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks, KVCacheManager
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.request import Request

__all__ = ["KvcastScheduler"]

_LOG = logging.getLogger(__name__)


class KvcastScheduler:
    """The connector's scheduler side.

    Args:
        config: the connector's settings.
        block_size: tokens per vLLM block (one chunk).
        save: whether newly full prompt blocks are published (the role produces KV and the
            settings say so).
        pool: the pool client it asks which chunks exist.
    """

    def __init__(
        self, config: ConnectorConfig, block_size: int, save: bool, pool: PoolHandle
    ) -> None:
        self.config = config
        self.block_size = block_size
        self.save = save
        self.pool = pool
        self.kv_cache_manager: KVCacheManager | None = None
        """The engine's KV cache manager (bound by vLLM's scheduler; saves need block ids)."""
        self._lookups: dict[str, int] = {}  # request -> the local hit it was last asked after
        self._requests: dict[str, Request] = {}
        self._pending: dict[str, list[tuple[int, int]]] = {}
        self._options: dict[str, LoadOptions] = {}
        self._known_upto: dict[str, int] = {}

    def _held_many(self, tenant: int, keys: list[int]) -> list[bool]:
        """Which of a request's blocks the pool holds: one batched query per request."""
        try:
            return self.pool.get().contains_many(tenant, keys)
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
        self._lookups[request.request_id] = num_computed_tokens
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
        local_tokens = self._lookups.pop(req_id, None)
        if local_tokens is None:
            return
        bs = self.block_size
        first = local_tokens // bs
        end = (local_tokens + num_external_tokens) // bs
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
                # Held (the lookup) under its own key; read under its replica's where one is
                # chosen (the copies are made under those keys).
                key = opts.read_key(wire_key(hashes[position]))
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
        if self.save:
            meta.saves = self._saves(scheduler_output)
        return meta

    def _saves(self, scheduler_output: SchedulerOutput) -> list[ChunkSave]:
        """Prompt blocks that become full in this step and are not known to be in the pool."""
        out: list[ChunkSave] = []
        if self.kv_cache_manager is None:
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
            block_ids = self.kv_cache_manager.get_blocks(req_id).get_block_ids()[0]
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

    def shutdown(self) -> None:
        """Closes the pool client."""
        self.pool.close()
