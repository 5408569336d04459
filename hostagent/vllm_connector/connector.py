"""The class vLLM loads: a thin front over the connector's scheduler and worker sides.

vLLM makes one ``KvcastConnector`` per role (``KVConnectorRole.SCHEDULER`` in the scheduler
process, ``WORKER`` in the worker that holds the KV cache); each builds only the side of its role
and hands vLLM's calls to it, as vLLM's own Mooncake store connector does. The package docstring
(``hostagent.vllm_connector``) says what each call does.

Classes:
    KvcastConnector: the connector (a ``KVConnectorBase_V1``), loaded through
        ``kv_connector_module_path: hostagent.vllm_connector``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorRole,
)

from hostagent.vllm_connector.config import ConnectorConfig, ConnectorConfigError, PoolHandle
from hostagent.vllm_connector.data import KvcastConnectorMetadata
from hostagent.vllm_connector.metrics import KvcastConnectorStats
from hostagent.vllm_connector.scheduler import KvcastScheduler
from hostagent.vllm_connector.worker import KvcastWorker

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks, KVCacheManager
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

__all__ = ["KvcastConnector"]

_LOG = logging.getLogger(__name__)


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
        pool = PoolHandle(self.config, extra)
        self.connector_scheduler: KvcastScheduler | None = None
        """The scheduler side (``role == SCHEDULER``; None on a worker)."""
        self.connector_worker: KvcastWorker | None = None
        """The worker side (``role == WORKER``; None on the scheduler)."""
        if role == KVConnectorRole.SCHEDULER:
            save = self.config.save and bool(self._kv_transfer_config.is_kv_producer)
            self.connector_scheduler = KvcastScheduler(self.config, self.block_size, save, pool)
        else:
            self.connector_worker = KvcastWorker(self.config, self.block_size, pool, extra)

    @property
    def scheduler_side(self) -> KvcastScheduler:
        """The scheduler side; a worker's connector has none."""
        if self.connector_scheduler is None:
            raise RuntimeError("a scheduler-side call reached the worker's kvcast connector")
        return self.connector_scheduler

    @property
    def worker_side(self) -> KvcastWorker:
        """The worker side; the scheduler's connector has none."""
        if self.connector_worker is None:
            raise RuntimeError("a worker-side call reached the scheduler's kvcast connector")
        return self.connector_worker

    def _metadata(self) -> KvcastConnectorMetadata:
        meta = self._get_connector_metadata()
        assert isinstance(meta, KvcastConnectorMetadata)
        return meta

    def shutdown(self) -> None:
        """Shuts the side of this role down (threads, fetch client, reporter, pool client)."""
        if self.connector_scheduler is not None:
            self.connector_scheduler.shutdown()
        if self.connector_worker is not None:
            self.connector_worker.shutdown()

    # -------------------------------------------------------------- scheduler side
    def bind_kv_cache_manager(self, kv_cache_manager: KVCacheManager) -> None:
        """Gives the scheduler side the engine's KV cache manager (saves need its block ids)."""
        super().bind_kv_cache_manager(kv_cache_manager)
        if self.connector_scheduler is not None:
            self.connector_scheduler.kv_cache_manager = kv_cache_manager

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        """``KvcastScheduler.get_num_new_matched_tokens``."""
        return self.scheduler_side.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        """``KvcastScheduler.update_state_after_alloc``."""
        self.scheduler_side.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KvcastConnectorMetadata:
        """``KvcastScheduler.build_connector_meta``."""
        return self.scheduler_side.build_connector_meta(scheduler_output)

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        """``KvcastScheduler.request_finished``."""
        return self.scheduler_side.request_finished(request, block_ids)

    @classmethod
    def build_kv_connector_stats(
        cls, data: dict[str, Any] | None = None
    ) -> KvcastConnectorStats | None:
        """The worker's stats rebuilt on the scheduler side from their ``data``."""
        return KvcastConnectorStats(data=dict(data or {}))

    # -------------------------------------------------------------- worker side
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """``KvcastWorker.register_kv_caches``."""
        self.worker_side.register_kv_caches(kv_caches)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        """Hands the step's chunk loads to the worker side's loader thread.

        Args:
            forward_context: the step's forward context (unused: the caches are registered).
            **kwargs: unused.
        """
        self.worker_side.start_load_kv(self._metadata())

    def wait_for_layer_load(self, layer_name: str) -> None:
        """``KvcastWorker.wait_for_layer_load``."""
        self.worker_side.wait_for_layer_load(layer_name)

    def save_kv_layer(
        self,
        layer_name: str,
        kv_layer: torch.Tensor,
        attn_metadata: AttentionMetadata,
        **kwargs: Any,
    ) -> None:
        """Nothing per layer: a chunk holds every layer, so ``wait_for_save`` publishes it."""

    def wait_for_save(self) -> None:
        """Publishes the step's newly full prompt blocks (``KvcastWorker.wait_for_save``)."""
        self.worker_side.wait_for_save(self._metadata())

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        """``KvcastWorker.get_finished``."""
        return self.worker_side.get_finished(finished_req_ids)

    def get_block_ids_with_load_errors(self) -> set[int]:
        """``KvcastWorker.get_block_ids_with_load_errors``."""
        return self.worker_side.get_block_ids_with_load_errors()

    def get_kv_connector_stats(self) -> KvcastConnectorStats | None:
        """The worker side's counters since the last call (None: nothing new, or no worker)."""
        if self.connector_worker is None:
            return None
        return self.connector_worker.get_kv_connector_stats()
