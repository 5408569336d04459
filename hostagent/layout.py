"""KV-cache layout of one chunk (one prefix block) and its bridge to vLLM's paged KV cache.

A chunk travels and is stored as **one contiguous byte range** laid out as

    [num_layers, 2 (K, V), block_size, num_kv_heads, head_dim]   (row-major, model dtype)

so that fragment *i* of the wire is bytes ``[i*FRAG_BYTES, (i+1)*FRAG_BYTES)`` of that range and
the fetch client can write every fragment straight into a preallocated tensor at its offset.
The layer is the outermost dimension: layer ``l`` is the byte range ``[l, l + 1) x
layer_bytes``, so a chunk whose first fragments have arrived holds its first layers whole, and
the vLLM connector copies them into the engine's cache while the rest is on its way.

Why not vLLM's own layout: vLLM (v1) keeps one tensor per attention layer, shaped
``[2, num_blocks, block_size, num_kv_heads, head_size]`` (FlashAttention) or
``[num_blocks, 2, block_size, num_kv_heads, head_size]`` (FlashInfer). One block's KV is thus
spread over ``num_layers`` tensors (and, for FlashAttention, over two strided halves of each), so
it is not one byte range. But in both backends the slice of one block of one layer,
``kv[:, b]`` or ``kv[b]``, is a ``[2, block_size, num_kv_heads, head_size]`` tensor: exactly one
layer of the chunk layout above. Moving a chunk into the engine is therefore one copy per layer
(``scatter_to_paged``), and the chunk bytes are the same whichever attention backend runs.

vLLM 0.33 standardized its per-layer views (RFC #42082) to ``[num_blocks, num_kv_heads,
block_size, head_size + head_size_v]`` whatever the physical order (``"bhnc"``): a token's key
and value of one head sit side by side in the last dimension. One block of one layer is then
``kv[b]``, and moving a chunk is two strided copies per layer (keys ``kv[b, ..., :D]`` and values
``kv[b, ..., D:]``, each transposed to the chunk's token-major order); the chunk bytes stay the
same, so engines of either generation share chunks.

Classes:
    KVLayout: model dimensions -> bytes per token, chunk bytes, fragment count, tensor views.
    LayoutError: dimensions or tensors that do not fit the layout or the wire format.

Hugging Face transformers keeps one sequence's KV as per-layer key and value tensors shaped
``[batch, num_kv_heads, seq_len, head_dim]`` (``DynamicCache``): block ``b`` of layer ``l`` is
``keys[l][0, :, b*B:(b+1)*B]``, head-major, so packing it into the chunk layout is one transposed
copy per layer and per K/V (``block_from_kv``), and consecutive chunks unpack into the per-layer
tensors a cache is rebuilt from (``kv_from_blocks``).

Functions:
    dtype_from_name: ``"bfloat16"`` -> ``torch.bfloat16``.
    scatter_to_paged: copy a chunk (or its first layers) into a block of vLLM's per-layer paged
        KV tensors.
    scatter_many_to_paged: copy a batch of chunks into many blocks at once: one staging copy per
        chunk, then one indexed copy per layer (what a step's load needs on a GPU, where a copy
        call per block and layer costs more than the bytes).
    gather_from_paged: copy a block of vLLM's per-layer paged KV tensors into a chunk.
    block_from_kv: pack one block of per-layer ``[kv_heads, seq, head_dim]`` keys and values
        (Hugging Face's layout, one sequence) into a chunk.
    kv_from_blocks: unpack consecutive chunks into per-layer keys and values of that layout.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from kvcast import p4constants as c
from kvcast.kvp import MAX_FRAGMENTS, frag_count

PagedLayout = Literal["flash_attn", "flashinfer", "bhnc"]

_DTYPES: dict[str, torch.dtype] = {
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "fp8": torch.float8_e4m3fn,
    "fp8_e4m3": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
    "fp8_e5m2": torch.float8_e5m2,
    "uint8": torch.uint8,
}


class LayoutError(ValueError):
    """Model dimensions, a tensor or a paged cache that does not fit the chunk layout."""


def dtype_from_name(name: str | torch.dtype) -> torch.dtype:
    """A torch dtype from its name as model configs spell it.

    Args:
        name: ``"bfloat16"``, ``"float16"``, ``"fp8"`` ... or a ``torch.dtype``.

    Returns:
        The dtype.

    Raises:
        LayoutError: unknown name.
    """
    if isinstance(name, torch.dtype):
        return name
    try:
        return _DTYPES[name.lower().removeprefix("torch.")]
    except KeyError:
        raise LayoutError(f"unknown KV dtype {name!r}; known: {sorted(_DTYPES)}") from None


@dataclass(frozen=True, slots=True)
class KVLayout:
    """The KV layout of one chunk: ``[num_layers, 2, block_size, num_kv_heads, head_dim]``.

    Attributes:
        num_layers: attention layers holding KV.
        num_kv_heads: key/value heads per layer (after GQA).
        head_dim: dimension of one head.
        dtype: KV cache element type.
        block_size: tokens per chunk (vLLM's block size).
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype = torch.bfloat16
    block_size: int = 16

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_kv_heads", "head_dim", "block_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise LayoutError(f"{name} must be a positive int, got {value!r}")
        if self.frag_count > MAX_FRAGMENTS:
            raise LayoutError(
                f"a {self.block_size}-token chunk is {self.chunk_bytes} bytes = "
                f"{self.frag_count} fragments of FRAG_BYTES={c.FRAG_BYTES}, more than the "
                f"{MAX_FRAGMENTS} a 16-bit frag_idx can address; use at most "
                f"{MAX_FRAGMENTS * c.FRAG_BYTES // self.bytes_per_token} tokens per chunk"
            )

    @classmethod
    def from_hf_config(
        cls, config: Mapping[str, Any], block_size: int = 16, dtype: str | torch.dtype = ""
    ) -> KVLayout:
        """The layout of a Hugging Face ``config.json``.

        Args:
            config: the parsed config (``num_hidden_layers``, ``num_attention_heads``,
                ``num_key_value_heads`` (defaults to the attention heads), ``head_dim``
                (defaults to ``hidden_size / num_attention_heads``), ``torch_dtype``).
            block_size: tokens per chunk.
            dtype: KV dtype; defaults to the config's ``torch_dtype``, else bfloat16.

        Returns:
            The layout.

        Raises:
            LayoutError: a needed field is missing.
        """
        try:
            layers = int(config["num_hidden_layers"])
            heads = int(config["num_attention_heads"])
            kv_heads = int(config.get("num_key_value_heads") or heads)
            head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
        except KeyError as exc:
            raise LayoutError(f"model config lacks {exc.args[0]!r}") from None
        kv_dtype = dtype_from_name(dtype or str(config.get("torch_dtype") or "bfloat16"))
        return cls(layers, kv_heads, head_dim, kv_dtype, block_size)

    @property
    def elem_bytes(self) -> int:
        """Bytes per KV element."""
        return torch.empty((), dtype=self.dtype).element_size()

    @property
    def bytes_per_token(self) -> int:
        """``2 x layers x kv_heads x head_dim x bytes/elem``."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.elem_bytes

    @property
    def chunk_bytes(self) -> int:
        """Bytes of one chunk (one block of ``block_size`` tokens)."""
        return self.bytes_per_token * self.block_size

    @property
    def layer_bytes(self) -> int:
        """Bytes of one layer of a chunk: layer ``l`` is bytes ``[l, l + 1) x layer_bytes``."""
        return self.chunk_bytes // self.num_layers

    def layers_in(self, nbytes: int) -> int:
        """How many whole layers the first ``nbytes`` bytes of a chunk hold (layer-major).

        Raises:
            LayoutError: ``nbytes`` is not in ``0 .. chunk_bytes``.
        """
        if not 0 <= nbytes <= self.chunk_bytes:
            raise LayoutError(f"a chunk prefix of {nbytes} bytes, not in 0..{self.chunk_bytes}")
        return nbytes // self.layer_bytes

    @property
    def frag_count(self) -> int:
        """Fragments of ``FRAG_BYTES`` per chunk; the last one may be shorter."""
        return frag_count(self.chunk_bytes)

    @property
    def shape(self) -> tuple[int, int, int, int, int]:
        """``(num_layers, 2, block_size, num_kv_heads, head_dim)``."""
        return (self.num_layers, 2, self.block_size, self.num_kv_heads, self.head_dim)

    def alloc_chunk(self, pin: bool | None = None) -> torch.Tensor:
        """A fresh uint8 tensor of ``chunk_bytes`` to fetch a chunk into.

        Args:
            pin: page-lock it for fast host-to-GPU copies; default: when CUDA is available.

        Returns:
            A contiguous 1-D uint8 CPU tensor (contents undefined).
        """
        if pin is None:
            pin = torch.cuda.is_available()
        return torch.empty(self.chunk_bytes, dtype=torch.uint8, pin_memory=pin)

    def view(self, chunk: torch.Tensor) -> torch.Tensor:
        """The typed ``shape`` view of a chunk's bytes (no copy).

        Args:
            chunk: a contiguous 1-D uint8 tensor of ``chunk_bytes``.

        Returns:
            A ``dtype`` tensor of ``shape`` sharing ``chunk``'s memory.

        Raises:
            LayoutError: ``chunk`` is not a contiguous uint8 tensor of ``chunk_bytes``.
        """
        self.check_chunk(chunk)
        return chunk.view(self.dtype).view(self.shape)

    def as_bytes(self, kv: torch.Tensor) -> torch.Tensor:
        """The uint8 byte view of a typed chunk tensor (no copy).

        Args:
            kv: a contiguous tensor of ``shape`` and ``dtype``.

        Returns:
            A 1-D uint8 tensor of ``chunk_bytes`` sharing ``kv``'s memory.

        Raises:
            LayoutError: wrong shape, dtype or not contiguous.
        """
        if tuple(kv.shape) != self.shape or kv.dtype != self.dtype or not kv.is_contiguous():
            raise LayoutError(
                f"expected a contiguous {self.dtype} tensor of shape {self.shape}, "
                f"got {kv.dtype} {tuple(kv.shape)} contiguous={kv.is_contiguous()}"
            )
        return kv.view(-1).view(torch.uint8)

    def check_block_size(self, block_size: int) -> None:
        """Checks that chunk keys made for ``block_size``-token blocks fit this layout.

        Raises:
            LayoutError: ``block_size`` is not this layout's.
        """
        if block_size != self.block_size:
            raise LayoutError(
                f"keyer block size {block_size} != layout block size {self.block_size}"
            )

    def check_chunk(self, chunk: torch.Tensor) -> None:
        """Checks that ``chunk`` can hold this layout's bytes.

        Args:
            chunk: the candidate tensor.

        Raises:
            LayoutError: not a contiguous 1-D uint8 tensor of ``chunk_bytes``.
        """
        if chunk.dtype != torch.uint8 or chunk.dim() != 1 or not chunk.is_contiguous():
            raise LayoutError(
                f"a chunk buffer must be a contiguous 1-D uint8 tensor, got {chunk.dtype} "
                f"of shape {tuple(chunk.shape)}; use KVLayout.alloc_chunk()"
            )
        if chunk.numel() != self.chunk_bytes:
            raise LayoutError(
                f"chunk buffer has {chunk.numel()} bytes, the layout needs {self.chunk_bytes}"
            )

    def fragment_range(self, frag_idx: int) -> tuple[int, int]:
        """Byte range ``[start, end)`` of fragment ``frag_idx`` within the chunk."""
        start = frag_idx * c.FRAG_BYTES
        return start, min(start + c.FRAG_BYTES, self.chunk_bytes)


def _block_slot(kv_cache: torch.Tensor, block_id: int, paged: PagedLayout) -> torch.Tensor:
    if paged == "flash_attn":
        return kv_cache[:, block_id]
    if paged == "flashinfer":
        return kv_cache[block_id]
    raise LayoutError(f"unknown paged layout {paged!r}; use 'flash_attn', 'flashinfer' or 'bhnc'")


def _check_paged(layout: KVLayout, kv_caches: Sequence[torch.Tensor], paged: PagedLayout) -> None:
    if len(kv_caches) != layout.num_layers:
        raise LayoutError(
            f"{len(kv_caches)} per-layer KV tensors for a {layout.num_layers}-layer layout"
        )
    want: tuple[int, ...]
    if paged == "bhnc":
        want = (layout.num_kv_heads, layout.block_size, 2 * layout.head_dim)
        dims = "[num_blocks, kv_heads, block_size, 2 x head_dim]"
    else:
        want = (2, layout.block_size, layout.num_kv_heads, layout.head_dim)
        dims = f"blocks {want} (block dim {'1' if paged == 'flash_attn' else '0'})"
    for i, kv in enumerate(kv_caches):
        shape = tuple(kv.shape)
        if paged == "bhnc":
            got = shape[1:]
            rank = 4
        else:
            got = (shape[0], *shape[2:]) if paged == "flash_attn" else shape[1:]
            rank = 5
        if kv.dim() != rank or got != want or kv.dtype != layout.dtype:
            raise LayoutError(
                f"layer {i}: KV tensor {kv.dtype} {shape} does not match the {paged} layout of "
                f"{layout.dtype} {dims}"
            )


def scatter_to_paged(
    layout: KVLayout,
    chunk: torch.Tensor,
    kv_caches: Sequence[torch.Tensor],
    block_id: int,
    paged: PagedLayout = "flash_attn",
    non_blocking: bool = False,
    layers: range | None = None,
) -> None:
    """Copies a fetched chunk into block ``block_id`` of vLLM's per-layer KV tensors.

    Args:
        layout: the chunk layout.
        chunk: the chunk's bytes (1-D uint8 tensor of ``layout.chunk_bytes``).
        kv_caches: one tensor per layer, ``[2, num_blocks, B, H, D]`` (``"flash_attn"``),
            ``[num_blocks, 2, B, H, D]`` (``"flashinfer"``) or ``[num_blocks, H, B, 2 x D]``
            (``"bhnc"``, vLLM 0.33's standardized view); may live on the GPU.
        block_id: the engine's block to fill.
        paged: which of vLLM's paged layouts ``kv_caches`` use.
        non_blocking: let a pinned-host-to-GPU copy run asynchronously on the current CUDA
            stream; ``chunk`` must then stay untouched until that stream has synchronized.
        layers: copy only these layers (a chunk whose first layers have arrived); default all.

    Raises:
        LayoutError: the tensors do not match the layout.
    """
    for part, slot in _paged_pairs(layout, chunk, kv_caches, block_id, paged, layers):
        slot.copy_(part, non_blocking=non_blocking)


def scatter_many_to_paged(
    layout: KVLayout,
    chunks: Sequence[torch.Tensor],
    kv_caches: Sequence[torch.Tensor],
    targets: Sequence[tuple[int, int]],
    paged: PagedLayout = "flash_attn",
    layers: Sequence[int] | None = None,
    non_blocking: bool = False,
) -> None:
    """Copies a batch of chunks into blocks of vLLM's per-layer KV tensors, batched per layer.

    The chunks are staged once on the caches' device (one whole-chunk copy each, from pinned
    memory asynchronously where allowed), then each layer gets one indexed copy
    (``index_copy_``) of every target block: ``num_layers`` kernels for the batch where
    ``scatter_to_paged`` needs one to two copies per block and layer. The result is the same as
    ``scatter_to_paged(layout, chunks[i], kv_caches, block_id, paged)`` for every target.

    Args:
        layout: the chunk layout.
        chunks: the chunks' bytes (1-D uint8 tensors of ``layout.chunk_bytes`` each).
        kv_caches: one tensor per layer, as for ``scatter_to_paged``.
        targets: ``(index into chunks, block id)`` pairs; a chunk may fill several blocks, a
            block is filled once.
        paged: which of vLLM's paged layouts ``kv_caches`` use.
        layers: copy only these layers (default: all), e.g. the layers whose bytes have landed.
        non_blocking: let pinned-host-to-GPU copies run asynchronously on the current CUDA
            stream; the chunks must then stay untouched until that stream has synchronized.

    Raises:
        LayoutError: the tensors do not match the layout, a target names no chunk, or a block
            is named twice.
    """
    if not targets:
        return
    _check_paged(layout, kv_caches, paged)
    for ch in chunks:
        layout.check_chunk(ch)
    if any(not 0 <= i < len(chunks) for i, _ in targets):
        raise LayoutError(f"a target names a chunk outside 0..{len(chunks) - 1}")
    blocks = [b for _, b in targets]
    if len(set(blocks)) != len(blocks):
        raise LayoutError("a block is named twice in one scatter")
    device = kv_caches[0].device
    chosen = range(layout.num_layers) if layers is None else layers
    if not chosen:
        return
    lo, hi = min(chosen), max(chosen) + 1
    if lo < 0 or hi > layout.num_layers:
        raise LayoutError(f"layers {lo}..{hi - 1} outside the layout's {layout.num_layers}")
    # Only the layers asked for are staged (a chunk is layer-major: one byte range).
    staged = torch.empty(
        (len(chunks), hi - lo, *layout.shape[1:]), dtype=layout.dtype, device=device
    )
    for row, ch in zip(staged, chunks, strict=True):
        row.copy_(layout.view(ch)[lo:hi], non_blocking=non_blocking)
    picks = [i for i, _ in targets]
    idx = torch.tensor(blocks, device=device)
    if picks == list(range(len(chunks))):  # each chunk into one block, in order
        src_all = staged
    else:
        src_all = staged.index_select(0, torch.tensor(picks, device=device))
    d = layout.head_dim
    for layer in chosen:
        src = src_all[:, layer - lo]  # [n, 2, B, H, D]
        kv = kv_caches[layer]
        if paged == "bhnc":  # [n, 2, B, H, D] -> [n, H, B, 2 x D]: keys and values side by side
            n, _, b, h, _ = src.shape
            kv.index_copy_(0, idx, src.permute(0, 3, 2, 1, 4).reshape(n, h, b, 2 * d))
        elif paged == "flash_attn":  # [2, num_blocks, B, H, D]
            kv.index_copy_(1, idx, src.transpose(0, 1))
        else:  # flashinfer: [num_blocks, 2, B, H, D]
            kv.index_copy_(0, idx, src)


def gather_from_paged(
    layout: KVLayout,
    kv_caches: Sequence[torch.Tensor],
    block_id: int,
    chunk: torch.Tensor,
    paged: PagedLayout = "flash_attn",
) -> None:
    """Copies block ``block_id`` of vLLM's per-layer KV tensors into a chunk buffer.

    Args:
        layout: the chunk layout.
        kv_caches: one tensor per layer, as for ``scatter_to_paged``.
        block_id: the engine's block to read.
        chunk: destination bytes (1-D uint8 tensor of ``layout.chunk_bytes``).
        paged: which of vLLM's paged layouts ``kv_caches`` use.

    Raises:
        LayoutError: the tensors do not match the layout.
    """
    for part, slot in _paged_pairs(layout, chunk, kv_caches, block_id, paged):
        part.copy_(slot)


def _paged_pairs(
    layout: KVLayout,
    chunk: torch.Tensor,
    kv_caches: Sequence[torch.Tensor],
    block_id: int,
    paged: PagedLayout,
    layers: range | None = None,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``(part of the chunk, the same KV in block block_id)`` views, both ways of a copy.

    Raises:
        LayoutError: the tensors do not match the layout, or ``layers`` is not within it.
    """
    _check_paged(layout, kv_caches, paged)
    view = layout.view(chunk)
    d = layout.head_dim
    pairs = []
    todo = range(layout.num_layers) if layers is None else layers
    if todo and (todo.start < 0 or todo.stop > layout.num_layers or todo.step != 1):
        raise LayoutError(f"layers {todo} are not within the {layout.num_layers}-layer layout")
    for layer in todo:
        kv = kv_caches[layer]
        if paged == "bhnc":  # [H, B, K|V] <-> [2, B, H, D] per layer
            slot = kv[block_id]
            pairs.append((view[layer, 0].transpose(0, 1), slot[..., :d]))
            pairs.append((view[layer, 1].transpose(0, 1), slot[..., d:]))
        else:
            pairs.append((view[layer], _block_slot(kv, block_id, paged)))
    return pairs


def _check_kv(layout: KVLayout, name: str, tensors: Sequence[torch.Tensor], min_len: int) -> None:
    if len(tensors) != layout.num_layers:
        raise LayoutError(
            f"{len(tensors)} per-layer {name} tensors for a {layout.num_layers}-layer layout"
        )
    for i, t in enumerate(tensors):
        shape = tuple(t.shape)
        if (
            t.dim() != 3
            or shape[0] != layout.num_kv_heads
            or shape[2] != layout.head_dim
            or shape[1] < min_len
            or t.dtype != layout.dtype
        ):
            raise LayoutError(
                f"layer {i}: {name} {t.dtype} {shape} is not a {layout.dtype} "
                f"[kv_heads={layout.num_kv_heads}, seq_len>={min_len}, "
                f"head_dim={layout.head_dim}] tensor"
            )


def block_from_kv(
    layout: KVLayout,
    keys: Sequence[torch.Tensor],
    values: Sequence[torch.Tensor],
    block: int,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Packs block ``block`` of one sequence's per-layer keys and values into a chunk.

    Args:
        layout: the chunk layout.
        keys: one tensor per layer, ``[num_kv_heads, seq_len, head_dim]`` (a Hugging Face
            ``DynamicCache`` layer's ``keys[0]``), on any device.
        values: the same for values.
        block: which block: tokens ``[block * block_size, (block + 1) * block_size)``.
        out: the chunk buffer to fill (``layout.alloc_chunk()``); a fresh one by default.

    Returns:
        The chunk (``out`` when given): a 1-D uint8 CPU tensor of ``layout.chunk_bytes``.

    Raises:
        LayoutError: the tensors do not match the layout or are shorter than the block.
    """
    if block < 0:
        raise LayoutError(f"block index must be >= 0, got {block}")
    lo, hi = block * layout.block_size, (block + 1) * layout.block_size
    _check_kv(layout, "keys", keys, hi)
    _check_kv(layout, "values", values, hi)
    chunk = layout.alloc_chunk() if out is None else out
    dst = layout.view(chunk)
    for layer, (k, v) in enumerate(zip(keys, values, strict=True)):
        dst[layer, 0].copy_(k[:, lo:hi].transpose(0, 1))
        dst[layer, 1].copy_(v[:, lo:hi].transpose(0, 1))
    return chunk


def kv_from_blocks(
    layout: KVLayout, chunks: Sequence[torch.Tensor]
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Unpacks consecutive chunks of one sequence into per-layer keys and values.

    Args:
        layout: the chunk layout.
        chunks: chunks of blocks ``0 .. len(chunks) - 1`` of a sequence, in order.

    Returns:
        ``(keys, values)``: one contiguous ``[num_kv_heads, len(chunks) * block_size,
        head_dim]`` CPU tensor per layer each (add a batch dimension with ``[None]`` for a
        Hugging Face cache).

    Raises:
        LayoutError: no chunk, or a chunk that does not match the layout.
    """
    if not chunks:
        raise LayoutError("kv_from_blocks needs at least one chunk")
    views = [layout.view(chunk) for chunk in chunks]
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    for layer in range(layout.num_layers):
        keys.append(torch.cat([v[layer, 0] for v in views]).transpose(0, 1).contiguous())
        values.append(torch.cat([v[layer, 1] for v in views]).transpose(0, 1).contiguous())
    return keys, values
