"""The producer path: after prefill, a host puts its prompt's chunks into the DRAM pool.

A host that computed a prefix's KV (it missed everywhere, or it is the first to see the prompt)
makes that KV available to every other host: ``Producer`` cuts it into chunks of the host's
``KVLayout`` (from a Hugging Face cache's per-layer tensors, from vLLM's paged per-layer KV
tensors and the request's block ids, or from chunk buffers already packed), keys every full
block the way vLLM hashes it (``ChunkKeyer``), and stores the chunks the pool does not hold yet
with one batched put (``PoolBackend.put_many``: Mooncake Store's ``batch_put_from`` straight from
the chunk buffers, no copy). Then it hands one ``"stored"`` record per chunk it stored to the
report sink, so the controller learns the chunk's length and that the pool has it (a stored
record is not an access: the cache policy counts uses, not productions).

Keys are content hashes of the token prefix, so a chunk the pool already holds under a key is
the same KV: it is not put again (``present``). A partial last block has no key (vLLM does not
cache it either) and is not stored. A put that fails is counted, never retried here and never
reported as stored: the chunk is simply not shareable, and other hosts will recompute it.

KV classes (``kvcast.kvclass``): the caller may declare the first ``static_blocks`` blocks static
(a system prompt and tool definitions every branch reuses) and the rest of the prompt a class of
its own (``kv_class``; None: undeclared). Static chunks are put as static (the pool keeps them
over transient ones: Mooncake's soft pin), everything else as transient, and each ``"stored"``
record carries its declared class to the controller. A chunk the pool already holds is not put
again, so a declaration does not re-pin it.

Classes:
    ProducerError: the caller passed chunks that do not belong to the prompt.
    PublishReport: what one publish did.
    Producer: keys, packs, stores and reports the chunks of one tenant's prompts.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from hostagent.chunkkeys import ChunkKey, ChunkKeyer
from hostagent.layout import KVLayout, PagedLayout, block_from_kv, gather_from_paged
from kvcast.backend import PoolBackend, PoolBackendError
from kvcast.integrity import chunk_mac, mac_key_of
from kvcast.kvclass import KvClass
from kvcast.reports import AccessReport, ReportSink

__all__ = ["Producer", "ProducerError", "PublishReport"]

_LOG = logging.getLogger(__name__)


class ProducerError(ValueError):
    """The chunks given do not match the prompt (more chunks than full blocks, wrong count)."""


@dataclass(slots=True)
class PublishReport:
    """What one publish did.

    Attributes:
        blocks: chunks offered (full blocks of the prompt, or fewer when the caller said so).
        stored: chunks put into the pool now.
        present: chunks the pool already held (same key, hence the same KV): not put again.
        failed: chunks the pool did not take (see ``error``).
        bytes_stored: bytes put into the pool now.
        reported: ``"stored"`` records handed to the report sink.
        duration_s: wall time of the existence check, the put and the reports.
        error: why chunks failed (empty when none did).
        stored_keys: the wire keys of the chunks stored now, in block order.
    """

    blocks: int = 0
    stored: int = 0
    present: int = 0
    failed: int = 0
    bytes_stored: int = 0
    reported: int = 0
    duration_s: float = 0.0
    error: str = ""
    stored_keys: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether every chunk offered is in the pool now."""
        return self.failed == 0


class Producer:
    """Puts the chunks of one tenant's prompts into the DRAM pool and reports them.

    Args:
        backend: the DRAM pool (a ``MooncakeBackend`` in deployment; ``InMemoryBackend`` in
            tests).
        layout: the engine's KV layout (one chunk per block).
        keyer: computes the chunk keys (same block size as ``layout``, same hash seed and salt
            as every other host of the tenant).
        tenant: tenant id on the wire.
        reporter: where the ``"stored"`` records go (None: no reports).
        host: this host's name or id in the records; default: the hostname.
        skip_present: ask the pool which chunks it holds first and put only the others.
        mac_key: the tenant's secret (kvcast.integrity): each chunk is stored with a keyed
            MAC next to it, which agents holding the same secret verify; None: no MAC.

    Raises:
        LayoutError: the keyer's block size is not the layout's.
    """

    def __init__(
        self,
        backend: PoolBackend,
        layout: KVLayout,
        keyer: ChunkKeyer,
        tenant: int,
        *,
        reporter: ReportSink | None = None,
        host: str | int | None = None,
        skip_present: bool = True,
        mac_key: bytes | None = None,
    ) -> None:
        layout.check_block_size(keyer.block_size)
        self.backend = backend
        self.layout = layout
        self.keyer = keyer
        self.tenant = tenant
        self.reporter = reporter
        self.host = socket.gethostname() if host is None else host
        self.skip_present = skip_present
        self.mac_key = mac_key
        if mac_key is not None:
            chunk_mac(mac_key, tenant, 0, b"")  # checks the key's length now
        self._pool_error = False
        self._declared: dict[int, KvClass | None] = {}

    def full_blocks(self, token_ids: Sequence[int]) -> int:
        """How many full blocks (chunks with a key) ``token_ids`` has."""
        return len(token_ids) // self.layout.block_size

    def publish_kv(
        self,
        token_ids: Sequence[int],
        keys: Sequence[torch.Tensor],
        values: Sequence[torch.Tensor],
    ) -> PublishReport:
        """Publishes a prompt's KV given as per-layer tensors (a Hugging Face cache).

        Args:
            token_ids: the prompt's token ids.
            keys: one ``[num_kv_heads, seq_len >= len(token_ids) rounded down to a block,
                head_dim]`` tensor per layer.
            values: the same for values.

        Returns:
            What was stored.

        Raises:
            LayoutError: the tensors do not match the layout.
        """
        chunks = [
            block_from_kv(self.layout, keys, values, b) for b in range(self.full_blocks(token_ids))
        ]
        return self.publish_chunks(token_ids, chunks)

    def publish_paged(
        self,
        token_ids: Sequence[int],
        kv_caches: Sequence[torch.Tensor],
        block_ids: Sequence[int],
        paged: PagedLayout = "flash_attn",
    ) -> PublishReport:
        """Publishes a prompt's KV from vLLM's paged per-layer KV tensors.

        Args:
            token_ids: the prompt's token ids.
            kv_caches: the engine's per-layer KV tensors (any device).
            block_ids: the engine blocks holding the prompt, in order (at least one per full
                block; a trailing partial block's id is ignored).
            paged: which of vLLM's paged layouts ``kv_caches`` use.

        Returns:
            What was stored.

        Raises:
            ProducerError: fewer block ids than full blocks.
            LayoutError: the tensors do not match the layout.
        """
        n = self.full_blocks(token_ids)
        if len(block_ids) < n:
            raise ProducerError(f"{len(block_ids)} block ids for a prompt of {n} full blocks")
        chunks = []
        for block_id in block_ids[:n]:
            chunk = self.layout.alloc_chunk()
            gather_from_paged(self.layout, kv_caches, block_id, chunk, paged)
            chunks.append(chunk)
        return self.publish_chunks(token_ids, chunks)

    def publish_chunks(
        self, token_ids: Sequence[int], chunks: Sequence[torch.Tensor]
    ) -> PublishReport:
        """Publishes packed chunks: ``chunks[i]`` is block ``i`` of ``token_ids``.

        Args:
            token_ids: the prompt's token ids.
            chunks: one chunk buffer per block from the first on (``layout.alloc_chunk()``
                filled); fewer than the full blocks publishes a shorter prefix.

        Returns:
            What was stored.

        Raises:
            ProducerError: more chunks than the prompt has full blocks.
            LayoutError: a chunk does not match the layout (nothing is stored then).
        """
        ckeys = self.keyer.keys(token_ids)
        if len(chunks) > len(ckeys):
            raise ProducerError(
                f"{len(chunks)} chunks for a prompt of {len(ckeys)} full blocks of "
                f"{self.layout.block_size} tokens (a partial block has no key)"
            )
        return self.publish_keyed(ckeys, chunks)

    def publish_keyed(
        self,
        ckeys: Sequence[ChunkKey],
        chunks: Sequence[torch.Tensor],
        first: int = 0,
        *,
        static_blocks: int = 0,
        kv_class: KvClass | None = None,
    ) -> PublishReport:
        """Publishes packed chunks under keys the caller computed (e.g. the engine's own hashes).

        A serving engine already holds each block's hash (vLLM's ``request.block_hashes``,
        whatever its hash algorithm and extra keys); publishing under those keys lets the engine
        find the chunks again by the same hashes.

        Args:
            ckeys: the keys of the prompt's full blocks from block 0 on (parents and positions of
                the records come from them).
            chunks: ``chunks[i]`` is block ``first + i``.
            first: the block index of ``chunks[0]`` (the blocks before it are not offered).
            static_blocks: blocks ``0 .. static_blocks - 1`` are declared static.
            kv_class: the declared class of the other blocks (None: undeclared, put as
                transient).

        Returns:
            What was stored.

        Raises:
            ProducerError: the chunks run past the keys, or ``static_blocks`` is negative.
            LayoutError: a chunk does not match the layout (nothing is stored then).
        """
        if first < 0 or first + len(chunks) > len(ckeys):
            raise ProducerError(
                f"chunks for blocks {first}..{first + len(chunks) - 1} of a prompt with "
                f"{len(ckeys)} keyed blocks"
            )
        if static_blocks < 0:
            raise ProducerError(f"static_blocks must be >= 0, got {static_blocks}")
        for chunk in chunks:
            self.layout.check_chunk(chunk)
        self._declared = {
            ck.key: KvClass.STATIC if ck.index < static_blocks else kv_class
            for ck in ckeys[first : first + len(chunks)]
        }
        start = time.monotonic()
        report = PublishReport(blocks=len(chunks))
        todo: list[tuple[ChunkKey, torch.Tensor]] = []
        self._pool_error = False
        for ck, chunk in zip(ckeys[first:], chunks, strict=False):
            if self.skip_present and self._holds(ck.key):
                report.present += 1
            else:
                todo.append((ck, chunk))
        if todo:
            self._put(todo, report)
        if self.reporter is not None and report.stored_keys:
            self._report(ckeys, report)
        report.duration_s = time.monotonic() - start
        return report

    def _holds(self, key: int) -> bool:
        """Whether the pool holds ``key``; False without asking once a check has failed.

        A pool that does not answer (its master gone) takes an RPC timeout per question, so
        after the first failure the rest are taken as absent: putting a present key is a no-op,
        and a put to a dead pool fails fast.
        """
        if self._pool_error:
            return False
        try:
            return self.backend.contains(self.tenant, key)
        except PoolBackendError as exc:
            self._pool_error = True
            _LOG.info("pool existence check of chunk %#x failed: %s", key, exc)
            return False

    def _put(self, todo: list[tuple[ChunkKey, torch.Tensor]], report: PublishReport) -> None:
        try:
            items = [(self.tenant, ck.key, chunk.contiguous().numpy().data) for ck, chunk in todo]
            static = [it for it in items if self._declared.get(it[1]) is KvClass.STATIC]
            others = [it for it in items if self._declared.get(it[1]) is not KvClass.STATIC]
            for part, kv_class in ((static, KvClass.STATIC), (others, KvClass.TRANSIENT)):
                if not part:
                    continue
                if self.mac_key is not None:
                    # The MACs go first: a chunk is never in the pool without its MAC.
                    secret = self.mac_key
                    self._put_many(
                        [(t, mac_key_of(k), chunk_mac(secret, t, k, data)) for t, k, data in part],
                        kv_class,
                    )
                self._put_many(part, kv_class)
            done = [ck for ck, _ in todo]
        except PoolBackendError as exc:
            report.error = str(exc)
            _LOG.warning("put of %d chunks into the pool failed: %s", len(todo), exc)
            done = [ck for ck, _ in todo if self._holds(ck.key)]  # which did land
        report.stored = len(done)
        report.failed = len(todo) - len(done)
        report.bytes_stored = len(done) * self.layout.chunk_bytes
        report.stored_keys = [ck.key for ck in done]

    def _put_many(self, items: list[tuple[int, int, Any]], kv_class: KvClass) -> None:
        if kv_class is KvClass.TRANSIENT:
            self.backend.put_many(items)  # the default class
        else:
            self.backend.put_many(items, kv_class=kv_class)

    def _report(self, ckeys: Sequence[ChunkKey], report: PublishReport) -> None:
        assert self.reporter is not None
        stored = set(report.stored_keys)
        now = time.time()
        entries = [
            AccessReport(
                tenant=self.tenant,
                key=ck.key,
                size=self.layout.chunk_bytes,
                host=self.host,
                time=now,
                parent=ckeys[ck.index - 1].key if ck.index > 0 else None,
                position=ck.index,
                event="stored",
                kv_class=self._declared.get(ck.key),
            )
            for ck in ckeys
            if ck.key in stored
        ]
        try:
            self.reporter.submit(entries)
            report.reported = len(entries)
        except Exception:  # a report must never fail a publish, whatever the sink does
            _LOG.exception("stored records of %d chunks not handed over", len(entries))
