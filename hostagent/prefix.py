"""The host agent's entry point for a request: token ids in, the longest available KV prefix out.

``PrefixFetcher.fetch_prefix(token_ids)`` keys every full block of the prompt the way vLLM hashes
it (``ChunkKeyer``), then fetches the blocks in order with the ``FetchClient`` (switch SRAM first,
the DRAM pool behind it, the pool directly last) into chunk buffers of the host's ``KVLayout``,
several blocks in flight at once (``FetchClient.fetch_many``, the client's
``max_chunks_in_flight``), and keeps the blocks up to the first one that cannot be had: a block's
KV depends on every token before it, so only a contiguous prefix is of use, and the engine
prefills from the first missing block on. Every block kept is complete and CRC-checked; the
missing block's buffer is not returned (a partly filled tensor is never handed on). Each block
fetched is reported with its parent and position (the client's reporter), blocks that were in
flight past the missing one included (no further block is started).

Classes:
    PrefixResult: what one prefix fetch found (blocks, tokens covered, buffers, reports).
    PrefixFetcher: fetches the longest available prefix of a prompt.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from hostagent.chunkkeys import ChunkKey, ChunkKeyer
from hostagent.fetch import FetchClient
from hostagent.layout import KVLayout
from kvcast.fetch import ChunkRequest, FetchReport, RecomputeReason

__all__ = ["PrefixFetcher", "PrefixResult"]


@dataclass(slots=True)
class PrefixResult:
    """The longest prefix of a prompt whose KV was fetched.

    Attributes:
        keys: the chunk keys of every full block of the prompt.
        chunks: one verified chunk buffer per fetched block, blocks ``0 .. len(chunks) - 1``
            (``layout.view(chunk)`` is the block's KV).
        reports: one fetch report per block tried: every fetched block, then the block that
            stopped the prefix (if one did).
        stop_reason: why the prefix ends before the last full block (``NONE`` when every full
            block was fetched or ``max_blocks`` was reached).
        duration_s: wall time of the whole prefix fetch.
    """

    keys: list[ChunkKey]
    chunks: list[torch.Tensor] = field(default_factory=list)
    reports: list[FetchReport] = field(default_factory=list)
    stop_reason: RecomputeReason = RecomputeReason.NONE
    duration_s: float = 0.0

    @property
    def blocks(self) -> int:
        """Blocks fetched (the prefix's length in blocks)."""
        return len(self.chunks)

    @property
    def tokens(self) -> int:
        """Tokens the fetched prefix covers (the engine prefills from here on)."""
        return self.keys[self.blocks - 1].end if self.chunks else 0

    @property
    def bytes(self) -> int:
        """KV bytes fetched."""
        return sum(r.nbytes for r in self.reports if r.ok)

    @property
    def blocks_from_switch(self) -> int:
        """Fetched blocks that switch SRAM served for the most part."""
        return sum(1 for r in self.reports if r.ok and r.frags_hit * 2 > r.frag_count)


class PrefixFetcher:
    """Fetches the longest available KV prefix of a prompt, several blocks in flight at once.

    Args:
        client: the fetch client (its paths, timeouts, reporter and group are used as they are).
        layout: the engine's KV layout (one chunk per block).
        keyer: computes the chunk keys (same block size as ``layout``; the tenant's hash seed
            and salt).
        tenant: tenant id on the wire.

    Raises:
        LayoutError: the keyer's block size is not the layout's.
    """

    def __init__(
        self, client: FetchClient, layout: KVLayout, keyer: ChunkKeyer, tenant: int
    ) -> None:
        layout.check_block_size(keyer.block_size)
        self.client = client
        self.layout = layout
        self.keyer = keyer
        self.tenant = tenant

    def fetch_prefix(
        self,
        token_ids: Sequence[int],
        *,
        max_blocks: int | None = None,
        buffers: Sequence[torch.Tensor] | None = None,
    ) -> PrefixResult:
        """Fetches blocks ``0, 1, ...`` of the prompt until one cannot be had.

        Args:
            token_ids: the prompt's token ids.
            max_blocks: fetch at most this many blocks (e.g. the engine already holds the
                rest, or the last block must be computed anyway); default: every full block.
            buffers: chunk buffers to fill, one per block at least up to the blocks fetched
                (``layout.alloc_chunk()``, pinned where CUDA exists); default: allocated here.

        Returns:
            The prefix found. ``result.chunks[i]`` holds block ``i``'s verified KV.

        Raises:
            ValueError: ``max_blocks`` is negative.
            LayoutError: a given buffer does not match the layout.
        """
        if max_blocks is not None and max_blocks < 0:
            raise ValueError(f"max_blocks must be >= 0, got {max_blocks}")
        start = time.monotonic()
        keys = self.keyer.keys(token_ids)
        result = PrefixResult(keys)
        wanted = keys if max_blocks is None else keys[:max_blocks]
        requests = []
        for ck in wanted:
            if buffers is not None and ck.index < len(buffers):
                buf = buffers[ck.index]
                self.layout.check_chunk(buf)
            else:
                buf = self.layout.alloc_chunk()
            parent = keys[ck.index - 1].key if ck.index > 0 else None
            requests.append(
                ChunkRequest(self.tenant, ck.key, buf, self.layout.chunk_bytes, parent, ck.index)
            )
        # Blocks after a failed one are of no use: none is started once one has failed (those
        # already in flight end, and their reports are dropped with the rest of the tail).
        for req, report in zip(
            requests, self.client.fetch_many(requests, stop_after_failure=True), strict=False
        ):
            result.reports.append(report)
            if not report.ok:
                result.stop_reason = report.reason
                break
            result.chunks.append(req.dst)
        result.duration_s = time.monotonic() - start
        return result
