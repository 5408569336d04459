"""The connector's worker side: chunks into vLLM's paged KV cache and out of it.

It runs in the worker process that holds the KV cache. ``register_kv_caches`` takes vLLM's
per-layer views ``[num_blocks, kv_heads, block_size, 2 x head_dim]`` and derives the chunk layout
from them. ``start_load_kv`` hands the step's loads to a loader thread, which fetches the chunks
with the host agent's ``FetchClient.fetch_many`` (the step's chunks in flight at once, layer 0
of each first; switch first, the pool behind it, the pool directly last; every fragment
CRC-checked) and copies each chunk's layers into its destination blocks as the fetch engine
reports its verified prefix growing; a follower of a multicast group takes the leader's stream
(``FetchClient.follow``) and repairs gaps by unicast. ``wait_for_layer_load(layer)`` waits until
that layer of every chunk of the step is copied or its chunk failed (``LayerGate``); with
``load_async`` ``get_finished`` reports the requests whose loads ended. A chunk that does not
arrive complete and verified is never reported as loaded: ``get_block_ids_with_load_errors``
returns its blocks and every later block of the same request. ``wait_for_save`` copies the
step's newly full prompt blocks out of the KV cache and publishes them through the producer path
(``Producer.publish_keyed``), on a saver thread unless ``save_async`` is off.

Classes:
    KvcastWorker: the worker side (layout, fetch client, loader and saver threads, counters).

Functions:
    worker_sides: this process's worker sides (an engine run in-process).
    worker_stats: their life counters, summed.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
import weakref
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from hostagent.chunkkeys import ChunkKey, ChunkKeyer, wire_key
from hostagent.fetch import FetchClient
from hostagent.layout import KVLayout, PagedLayout, gather_from_paged, scatter_many_to_paged
from hostagent.producer import Producer
from hostagent.vllm_connector.config import (
    ConnectorConfig,
    ConnectorConfigError,
    PoolHandle,
    make_reporter,
)
from hostagent.vllm_connector.data import ChunkLoad, ChunkSave, KvcastConnectorMetadata
from hostagent.vllm_connector.layers import LayerGate
from hostagent.vllm_connector.metrics import KvcastConnectorStats, LoadCounters, load_job_counts
from kvcast.backend import PoolBackend
from kvcast.fetch import MAX_FETCHES, ChunkRequest, FetchReport
from kvcast.fetch.state import Progress
from kvcast.reports import ReportSink

__all__ = ["KvcastWorker", "worker_sides", "worker_stats"]

_LOG = logging.getLogger(__name__)


@dataclass(slots=True)
class _LoadJob:
    """One step's loads in the loader thread: requests, engine blocks written, layer gate."""

    req_ids: set[str]
    asynchronous: bool
    blocks: set[int]
    gate: LayerGate
    future: Future[set[int]] | None = None
    forward_wait_s: float = 0.0
    """How long the forward waited for this job's layers (``wait_for_layer_load``, summed)."""
    load_s: float = 0.0
    """How long the loader took for the whole job (set when it ends)."""


class KvcastWorker:
    """The connector's worker side.

    Args:
        config: the connector's settings.
        block_size: tokens per vLLM block (one chunk).
        pool: the pool client it publishes into.
        extra: the raw ``kv_connector_extra_config`` (the reporter factory's argument).

    Raises:
        ConnectorConfigError: the reporter cannot be made.
    """

    def __init__(
        self,
        config: ConnectorConfig,
        block_size: int,
        pool: PoolHandle,
        extra: Mapping[str, Any],
    ) -> None:
        self.config = config
        self.block_size = block_size
        self.pool = pool
        self._reporter: ReportSink | None = make_reporter(config, extra)
        self._client: FetchClient | None = None
        self._layout: KVLayout | None = None
        self._caches: list[torch.Tensor] = []
        self._layer_index: dict[str, int] = {}
        self._bufs: list[torch.Tensor] = []
        self._paged: PagedLayout = "bhnc"
        self._producers: dict[int, Producer] = {}
        self._executor: ThreadPoolExecutor | None = None
        self._saver: ThreadPoolExecutor | None = None
        self._pending_saves: list[Future[None]] = []
        self._sync_job: _LoadJob | None = None
        self._stream: torch.cuda.Stream | None = None
        self._async_jobs: list[_LoadJob] = []
        self._load_errors: set[int] = set()
        self.last_reports: list[FetchReport] = []
        """The fetch reports of the last finished load job (for logs and tests)."""
        self.last_step: dict[str, float] = {}
        """The last synchronous load job's times: ``load_s`` (the loader's whole job),
        ``forward_wait_s`` (the forward's waits for its layers, summed) and ``end_wait_s``
        (the wait for the rest of the job after the forward)."""
        self.counters = LoadCounters()
        self.saved: list[tuple[int, int]] = []
        """``(tenant, key)`` of every block ``wait_for_save`` handed the pool, in order."""
        _WORKERS.add(self)

    @property
    def stats(self) -> dict[str, float]:
        """Counters over the worker's life (``LoadCounters.life``)."""
        return self.counters.life

    @property
    def backend(self) -> PoolBackend:
        """The DRAM pool client (made on first use)."""
        return self.pool.get()

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
        self.pool.close()

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
        self._layer_index = {name: i for i, name in enumerate(kv_caches)}
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
            if self.config.pools:
                extra["pool_addrs"] = self.config.pools
            self._client = FetchClient(
                self.config.service,
                self.config.pool,
                reporter=self._reporter,
                report_host=self.config.host,
                **extra,
            )
        return self._client

    def start_load_kv(self, meta: KvcastConnectorMetadata) -> None:
        """Hands the step's chunk loads to the loader thread.

        Args:
            meta: the step's metadata from the scheduler side.
        """
        if not meta.loads:
            return
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="kvcast-load")
        blocks = {b for load in meta.loads for _, b in load.targets}
        gate = LayerGate(len(meta.loads), self.layout.num_layers)
        job = _LoadJob(set(meta.load_reqs), self.config.load_async, blocks, gate)
        job.future = self._executor.submit(self._load, list(meta.loads), job)
        if job.asynchronous:
            self._async_jobs.append(job)
        else:
            self._sync_job = job

    def _load(self, loads: Sequence[ChunkLoad], job: _LoadJob) -> set[int]:
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

        Layers: with ``pipeline_layers`` each chunk's layers are copied as the fetch engine
        reports its verified prefix growing (``_copy_layers``), else once the chunk is whole;
        the job's gate (chunk ``i`` is ``loads[i]``) learns what each chunk has settled and is
        closed when the job ends, however it ends.
        """
        try:
            return self._load_kinds(loads, job)
        finally:
            job.gate.close()

    def _load_kinds(self, loads: Sequence[ChunkLoad], job: _LoadJob) -> set[int]:
        """``_load`` within its gate."""
        gate = job.gate
        kinds: dict[tuple[int, bool], list[tuple[int, ChunkLoad]]] = {}
        for at, load in enumerate(loads):
            kinds.setdefault((load.group, load.follower), []).append((at, load))
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
            cut += self._load_part(
                part, gate, group, follower, failed_reqs, failed, reports, deadline
            )
        self.last_reports = reports
        seconds = job.load_s = time.monotonic() - t0
        loaded = sum(any(b not in failed for _, b in load.targets) for load in loads)
        self.counters.add(
            load_job_counts(reports, len(failed), seconds, self.layout.chunk_bytes, cut, loaded)
        )
        return failed

    def _load_part(
        self,
        loads: Sequence[tuple[int, ChunkLoad]],
        gate: LayerGate,
        group: int,
        follower: bool,
        failed_reqs: set[str],
        failed: set[int],
        reports: list[FetchReport],
        deadline: float | None = None,
    ) -> int:
        """``_load`` for the loads of one kind; adds to ``failed_reqs``, ``failed``, ``reports``.

        ``loads`` pairs each load with its chunk's index in ``gate``; every chunk is settled
        in the gate by the time this returns (copied whole, or failed). Past ``deadline`` (the
        load budget) no chunk is started and each one in flight is cut short: their blocks are
        recomputed.

        Returns:
            The chunks not started because the budget was spent.
        """
        layout = self.layout
        client = self.fetch_client()
        in_flight = client.max_chunks_in_flight
        if self.config.pipeline_layers and "max_chunks_in_flight" not in self.config.fetch:
            # Every chunk of the step at once (each a buffer), layer 0 of each first.
            in_flight = max(in_flight, min(len(loads), MAX_FETCHES))
        bufs = self._load_buffers(in_flight)
        base_deadline_s = client.deadline_s
        at = 0
        while at < len(loads):
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                # Recomputing what is left is now cheaper than waiting for it.
                for chunk, load in loads[at:]:
                    failed_reqs.update(r for r, _ in load.targets)
                    failed.update(b for _, b in load.targets)
                    gate.settle(chunk, layout.num_layers)
                return len(loads) - at
            batch: list[tuple[int, int, ChunkLoad]] = []  # (index in loads, in gate, load)
            while at < len(loads) and len(batch) < len(bufs):
                chunk, load = loads[at]
                if any(r not in failed_reqs for r, _ in load.targets):
                    batch.append((at, chunk, load))
                else:
                    failed.update(b for _, b in load.targets)
                    gate.settle(chunk, layout.num_layers)
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
                for (_, _, load), buf in zip(batch, bufs, strict=False)
            ]

            progress = (
                functools.partial(self._copy_prefix, gate, batch, bufs, failed_reqs)
                if self.config.pipeline_layers
                else None
            )
            got: list[FetchReport | None]
            if left is not None:
                client.deadline_s = min(base_deadline_s, left)
            try:
                got = list(self._fetch(client, requests, group, follower, progress))
            except Exception:  # a load must end in blocks loaded or blocks to recompute
                _LOG.exception("kvcast: fetch of chunks %s raised", [hex(r.key) for r in requests])
                got = [None] * len(batch)
            finally:
                client.deadline_s = base_deadline_s
            if len(got) < len(batch):  # stopped after a failure: the rest is considered again
                at = batch[len(got)][0]
            for (_, chunk, load), buf, report in zip(batch, bufs, got, strict=False):
                live = [(r, b) for r, b in load.targets if r not in failed_reqs]
                failed.update(b for r, b in load.targets if r in failed_reqs)
                if report is not None:
                    reports.append(report)
                if report is None or not report.ok:
                    # Layers of it already copied stay in blocks that are now reported failed.
                    failed_reqs.update(r for r, _ in live)
                    failed.update(b for _, b in live)
                    gate.settle(chunk, layout.num_layers)
                    continue
                self._copy_layers(gate, chunk, load, buf, layout.chunk_bytes, failed_reqs)
        return 0

    def _copy_prefix(
        self,
        gate: LayerGate,
        batch: Sequence[tuple[int, int, ChunkLoad]],
        bufs: Sequence[torch.Tensor],
        failed_reqs: set[str],
        j: int,
        nbytes: int,
    ) -> None:
        """The fetch engine's progress for chunk ``j`` of ``batch`` (``_copy_layers``)."""
        _, chunk, load = batch[j]
        self._copy_layers(gate, chunk, load, bufs[j], nbytes, failed_reqs)

    def _copy_layers(
        self,
        gate: LayerGate,
        chunk: int,
        load: ChunkLoad,
        buf: torch.Tensor,
        nbytes: int,
        failed_reqs: set[str],
    ) -> None:
        """Copies the whole layers in ``buf[:nbytes]`` not copied yet into the load's blocks.

        ``buf[:nbytes]`` is verified (the fetch engine's progress, or a complete chunk), so
        its whole layers go into every block of a request that has not failed, and the gate
        learns them settled. On CUDA the copies run on a side stream, synchronized before the
        gate hears of them, so a released layer is in the cache when its forward reads it.
        """
        layout = self.layout
        done = gate.settled(chunk)
        upto = layout.layers_in(nbytes)
        if upto <= done:
            return
        layers = range(done, upto)
        stream = self._copy_stream()
        targets = [(0, block_id) for req, block_id in load.targets if req not in failed_reqs]
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            # One staging copy of the layers, then one indexed copy per layer into every block
            # (a copy per block and layer costs more than the bytes on a GPU: docs/results.md).
            scatter_many_to_paged(
                layout, [buf], self._caches, targets, self._paged,
                layers=layers, non_blocking=stream is not None,
            )  # fmt: skip
        if stream is not None:
            stream.synchronize()
        gate.settle(chunk, upto)

    def _copy_stream(self) -> torch.cuda.Stream | None:
        """The loader's CUDA stream for copies into a cache on the GPU (None: a CPU cache)."""
        if not self._caches or not self._caches[0].is_cuda:
            return None
        if self._stream is None:
            self._stream = torch.cuda.Stream(device=self._caches[0].device)  # type: ignore[no-untyped-call]
        return self._stream

    def _fetch(
        self,
        client: FetchClient,
        requests: Sequence[ChunkRequest],
        group: int,
        follower: bool,
        progress: Progress | None = None,
    ) -> list[FetchReport]:
        """One batch of chunks: unicast, leading group ``group`` or following it.

        ``progress`` is ``fetch_many``'s (``follow_many``'s for a follower: the stream fills
        every chunk of the batch at once, layer 0 of each first as the leader asks for it).

        Returns:
            One report per chunk started, in order; the batch stops after the first chunk that
            fails (a prefix is of use only up to its first missing block).
        """
        many = functools.partial(
            client.fetch_many,
            requests,
            max_chunks_in_flight=len(requests),
            stop_after_failure=True,
            progress=progress,
            stripe_bytes=None if progress is None else self.layout.layer_bytes,
        )
        if group == 0:
            return many()
        client.group = group
        try:
            if not follower:
                return many()
            return client.follow_many(
                requests,
                stall_s=self.config.follow_stall_s,
                first_wait_s=self.config.follow_first_wait_s,
                progress=progress,
            )
        finally:
            client.group = 0

    def get_kv_connector_stats(self) -> KvcastConnectorStats | None:
        """The counters since the last call, for vLLM's stat loggers (None: nothing new)."""
        return self.counters.take_interval()

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
        """Waits until layer ``layer_name`` of the step's synchronous load is in the cache.

        A layer is released once that layer of every chunk of the step is copied from verified
        bytes or its chunk has failed (``LayerGate``); a failed chunk's blocks are reported by
        ``get_block_ids_with_load_errors`` after the forward, and vLLM then discards what the
        step computed for their requests and recomputes them. A name that is not a registered
        layer (``""``: the step's end) waits for the whole load and ends the job.
        """
        job = self._sync_job
        if job is None:
            return
        layer = self._layer_index.get(layer_name)
        t0 = time.monotonic()
        if layer is not None:
            job.gate.wait(layer)
            job.forward_wait_s += time.monotonic() - t0
            return
        self._sync_job = None
        self._finish(job)
        end_wait_s = time.monotonic() - t0
        self.last_step = {
            "load_s": job.load_s,
            "forward_wait_s": job.forward_wait_s,
            "end_wait_s": end_wait_s,
        }
        self.counters.add(
            {"forward_wait_s": job.forward_wait_s, "end_wait_s": end_wait_s, "load_steps": 1}
        )

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

    def wait_for_save(self, meta: KvcastConnectorMetadata) -> None:
        """Copies the step's newly full prompt blocks out of the KV cache and publishes them.

        The copy is made here, within the step (the engine may reuse the blocks afterwards);
        the publish (the pool's batched put and the ``"stored"`` records) runs on the saver
        thread, off the step's critical path, unless ``save_async`` is off. ``flush_saves``
        waits for what is queued.
        """
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
                self.pool.get(),
                self.layout,
                keyer,
                tenant,
                reporter=self._reporter,
                host=self.config.host,
                mac_key=self.config.mac_keys.get(tenant),
            )
            self._producers[tenant] = producer
        return producer


_WORKERS: weakref.WeakSet[KvcastWorker] = weakref.WeakSet()


def worker_sides() -> list[KvcastWorker]:
    """This process's worker sides.

    An engine run in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, the ``uni`` executor) holds
    its worker side here, so a driver can read what its requests loaded and saved.
    """
    return list(_WORKERS)


def worker_stats() -> dict[str, float]:
    """The life counters (``KvcastWorker.stats``) of this process's worker sides, summed."""
    out: dict[str, float] = {}
    for worker in worker_sides():
        for k, v in worker.counters.snapshot().items():
            out[k] = out.get(k, 0) + v
    return out
