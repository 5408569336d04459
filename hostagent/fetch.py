"""The host agent's fetch client: the KVP fetch engine (``kvcast.fetch``) on tensors.

The engine fills any writable uint8 buffer; a GPU host fetches into a preallocated, pinned uint8
CPU tensor (``KVLayout.alloc_chunk``) and copies it to the GPU's paged KV cache afterwards
(``KVLayout.scatter_to_paged``). This client checks that a destination is such a tensor (a CUDA
tensor is refused with the way to do it) and hands the engine the same memory as an array, and
adds ``fetch_block``: one chunk of a ``KVLayout``. Everything else (paths, group fetch, windows
of chunks, MAC checks, reports) is the engine's, and so are the records it returns
(``kvcast.fetch``: ``FetchReport``, ``ChunkRequest``, ``FetchError``, ...).

Classes:
    FetchClient: the engine's client, taking tensors.
"""

from __future__ import annotations

from typing import Any

import torch

from hostagent.layout import KVLayout
from kvcast.fetch import Array, FetchError, FetchReport
from kvcast.fetch import FetchClient as _EngineClient

__all__ = ["FetchClient"]


class FetchClient(_EngineClient):
    """``kvcast.fetch.FetchClient`` whose destinations are contiguous 1-D uint8 CPU tensors.

    Takes the engine's arguments (``kvcast.fetch.FetchClient``). ``dst`` of ``fetch``,
    ``follow`` and each ``ChunkRequest`` (``fetch_many``, ``follow_many``) is a tensor; its
    length defaults to ``dst.numel()``.
    """

    def _as_array(self, dst: Any) -> Array:
        """The tensor's memory as the engine's array.

        Raises:
            FetchError: ``dst`` is not a contiguous 1-D uint8 tensor in host memory.
        """
        if not isinstance(dst, torch.Tensor):
            raise FetchError(f"fetch needs a uint8 tensor, got {type(dst).__name__}")
        if dst.dtype != torch.uint8 or dst.dim() != 1 or not dst.is_contiguous():
            raise FetchError(
                f"fetch needs a contiguous 1-D uint8 tensor, got {dst.dtype} {tuple(dst.shape)}"
            )
        if dst.device.type != "cpu":
            raise FetchError(
                f"fetch writes host memory; got a {dst.device} tensor: fetch into a pinned CPU "
                "tensor (KVLayout.alloc_chunk) and copy it to the GPU with scatter_to_paged"
            )
        arr: Array = dst.numpy()
        return arr

    def fetch_block(
        self,
        tenant: int,
        key: int,
        layout: KVLayout,
        dst: torch.Tensor,
        *,
        parent: int | None = None,
        position: int | None = None,
    ) -> FetchReport:
        """Fetches one chunk of ``layout`` into ``dst``.

        Args:
            tenant: tenant id.
            key: chunk key (``ChunkKey.key``).
            layout: the chunk's KV layout.
            dst: ``layout.alloc_chunk()`` or any contiguous 1-D uint8 CPU tensor of
                ``layout.chunk_bytes``.
            parent: key of the previous block of the prefix chain (for the access report).
            position: the block's index in its chain (for the access report).

        Returns:
            The report; ``layout.view(dst)`` is the KV when ``report.ok``.

        Raises:
            LayoutError: ``dst`` does not match the layout.
        """
        layout.check_chunk(dst)
        return self.fetch(tenant, key, dst, layout.chunk_bytes, parent=parent, position=position)
