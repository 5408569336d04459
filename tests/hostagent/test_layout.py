"""KV layout: DESIGN.md's sizes, fragment arithmetic, views and the vLLM paged-cache bridge."""

from __future__ import annotations

import pytest
import torch

from hostagent.layout import (
    KVLayout,
    LayoutError,
    block_from_kv,
    dtype_from_name,
    gather_from_paged,
    kv_from_blocks,
    scatter_to_paged,
)
from kvcast import p4constants as c

KiB, MiB = 1024, 1024 * 1024
LLAMA3_8B = {
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_size": 4096,
    "torch_dtype": "bfloat16",
}


def test_llama3_8b_bf16_is_128_kib_per_token_and_2_mib_per_16_token_block() -> None:
    layout = KVLayout(32, 8, 128, torch.bfloat16, block_size=16)
    assert layout.bytes_per_token == 128 * KiB
    assert layout.chunk_bytes == 2 * MiB
    assert layout.frag_count == 2 * MiB // c.FRAG_BYTES


def test_small_model_is_12_kib_per_token() -> None:
    assert KVLayout(24, 2, 64, torch.bfloat16).bytes_per_token == 12 * KiB


def test_llama3_8b_from_hf_config() -> None:
    layout = KVLayout.from_hf_config(LLAMA3_8B, block_size=16)
    assert layout == KVLayout(32, 8, 128, torch.bfloat16, 16)


def test_hf_config_without_layers_is_refused() -> None:
    with pytest.raises(LayoutError, match="num_hidden_layers"):
        KVLayout.from_hf_config({"num_attention_heads": 8})


def test_chunk_beyond_16_bit_fragment_index_is_refused() -> None:
    # A 512-token Llama-3-8B block is 64 MiB: more fragments than frag_idx can address.
    with pytest.raises(LayoutError, match="16-bit frag_idx"):
        KVLayout(32, 8, 128, torch.bfloat16, block_size=512)


def test_last_fragment_is_shorter_when_the_chunk_is_not_a_multiple() -> None:
    layout = KVLayout(1, 1, 3, torch.float32, block_size=30)  # 720 bytes
    assert layout.chunk_bytes == 720
    assert layout.frag_count == -(-720 // c.FRAG_BYTES)
    start, end = layout.fragment_range(layout.frag_count - 1)
    assert end == 720
    assert end - start == 720 - (layout.frag_count - 1) * c.FRAG_BYTES


def test_view_is_layers_kv_tokens_heads_dim_over_the_same_bytes() -> None:
    layout = KVLayout(2, 2, 4, torch.bfloat16, block_size=3)
    chunk = layout.alloc_chunk(pin=False)
    kv = layout.view(chunk)
    assert tuple(kv.shape) == (2, 2, 3, 2, 4)
    kv.fill_(1.5)
    assert layout.as_bytes(kv).data_ptr() == chunk.data_ptr()
    assert bool((chunk.view(torch.bfloat16) == 1.5).all())


def test_view_refuses_a_buffer_of_the_wrong_size() -> None:
    layout = KVLayout(2, 2, 4, torch.bfloat16, block_size=3)
    with pytest.raises(LayoutError, match="bytes"):
        layout.view(torch.empty(layout.chunk_bytes + 1, dtype=torch.uint8))


def test_view_refuses_a_non_uint8_buffer() -> None:
    layout = KVLayout(2, 2, 4, torch.bfloat16, block_size=3)
    with pytest.raises(LayoutError, match="uint8"):
        layout.view(torch.empty(layout.chunk_bytes // 2, dtype=torch.bfloat16))


def test_non_positive_dimension_is_refused() -> None:
    with pytest.raises(LayoutError, match="num_kv_heads"):
        KVLayout(2, 0, 4)


def test_dtype_names() -> None:
    assert dtype_from_name("bfloat16") is torch.bfloat16
    assert dtype_from_name("torch.float16") is torch.float16
    with pytest.raises(LayoutError, match="unknown KV dtype"):
        dtype_from_name("int3")


@pytest.mark.parametrize("paged", ["flash_attn", "flashinfer", "bhnc"])
def test_scatter_then_gather_round_trips_through_vllm_paged_layout(paged: str) -> None:
    layout = KVLayout(3, 2, 4, torch.bfloat16, block_size=5)
    num_blocks = 6
    shapes = {
        "flash_attn": (2, num_blocks, 5, 2, 4),
        "flashinfer": (num_blocks, 2, 5, 2, 4),
        "bhnc": (num_blocks, 2, 5, 8),
    }
    shape = shapes[paged]
    caches = [torch.zeros(shape, dtype=torch.bfloat16) for _ in range(3)]
    src = layout.alloc_chunk(pin=False)
    layout.view(src).copy_(torch.randn(layout.shape))
    scatter_to_paged(layout, src, caches, block_id=4, paged=paged)  # type: ignore[arg-type]
    out = layout.alloc_chunk(pin=False)
    gather_from_paged(layout, caches, 4, out, paged=paged)  # type: ignore[arg-type]
    assert torch.equal(out, src)


def test_scatter_writes_layer_l_of_the_chunk_into_layer_l_block_b() -> None:
    layout = KVLayout(2, 1, 2, torch.float32, block_size=2)
    caches = [torch.zeros((2, 3, 2, 1, 2)) for _ in range(2)]
    src = layout.alloc_chunk(pin=False)
    kv = layout.view(src)
    kv.copy_(torch.arange(kv.numel(), dtype=torch.float32).view(layout.shape))
    scatter_to_paged(layout, src, caches, block_id=1)
    assert torch.equal(caches[1][:, 1], kv[1])
    assert caches[0][:, 0].abs().sum() == 0


def test_bhnc_scatter_puts_keys_then_values_of_each_head_and_token_side_by_side() -> None:
    layout = KVLayout(2, 2, 3, torch.float32, block_size=4)
    caches = [torch.zeros((5, 2, 4, 6)) for _ in range(2)]  # vLLM 0.33: [B, H, N, K|V]
    src = layout.alloc_chunk(pin=False)
    kv = layout.view(src)  # [L, 2, N, H, D]
    kv.copy_(torch.arange(kv.numel(), dtype=torch.float32).view(layout.shape))
    scatter_to_paged(layout, src, caches, block_id=3, paged="bhnc")
    for layer in range(2):
        for head in range(2):
            for tok in range(4):
                cell = caches[layer][3, head, tok]
                assert torch.equal(cell[:3], kv[layer, 0, tok, head])
                assert torch.equal(cell[3:], kv[layer, 1, tok, head])
    assert caches[0][2].abs().sum() == 0 and caches[1][4].abs().sum() == 0


def test_layer_l_is_the_l_th_range_of_layer_bytes_so_a_prefix_holds_whole_layers() -> None:
    layout = KVLayout(3, 2, 4, torch.float32, block_size=2)
    assert layout.layer_bytes * 3 == layout.chunk_bytes
    chunk = layout.alloc_chunk(pin=False)
    kv = layout.view(chunk)
    kv.copy_(torch.arange(kv.numel(), dtype=torch.float32).view(layout.shape))
    second = chunk[layout.layer_bytes : 2 * layout.layer_bytes]
    assert torch.equal(second.view(torch.float32), kv[1].reshape(-1))
    assert [layout.layers_in(n) for n in (0, layout.layer_bytes - 1, 2 * layout.layer_bytes)] == [
        0,
        0,
        2,
    ]
    assert layout.layers_in(layout.chunk_bytes) == 3
    with pytest.raises(LayoutError, match="prefix"):
        layout.layers_in(layout.chunk_bytes + 1)


@pytest.mark.parametrize("paged", ["flash_attn", "flashinfer", "bhnc"])
def test_scatter_of_some_layers_writes_those_layers_only(paged: str) -> None:
    layout = KVLayout(3, 2, 4, torch.float32, block_size=2)
    shape = {"flash_attn": (2, 4, 2, 2, 4), "flashinfer": (4, 2, 2, 2, 4), "bhnc": (4, 2, 2, 8)}
    caches = [torch.zeros(shape[paged]) for _ in range(3)]
    full = [torch.zeros(shape[paged]) for _ in range(3)]
    src = layout.alloc_chunk(pin=False)
    layout.view(src).copy_(torch.randn(layout.shape))
    scatter_to_paged(layout, src, full, 1, paged)  # type: ignore[arg-type]
    scatter_to_paged(layout, src, caches, 1, paged, layers=range(1, 2))  # type: ignore[arg-type]
    assert torch.equal(caches[1], full[1])
    assert caches[0].abs().sum() == 0 and caches[2].abs().sum() == 0
    with pytest.raises(LayoutError, match="layers"):
        scatter_to_paged(layout, src, caches, 1, paged, layers=range(2, 4))  # type: ignore[arg-type]


def test_scatter_refuses_caches_of_another_shape() -> None:
    layout = KVLayout(2, 1, 2, torch.float32, block_size=2)
    caches = [torch.zeros((2, 3, 4, 1, 2)) for _ in range(2)]
    with pytest.raises(LayoutError, match="layer 0"):
        scatter_to_paged(layout, layout.alloc_chunk(pin=False), caches, 0)


def test_scatter_refuses_the_wrong_number_of_layers() -> None:
    layout = KVLayout(2, 1, 2, torch.float32, block_size=2)
    with pytest.raises(LayoutError, match="per-layer"):
        scatter_to_paged(layout, layout.alloc_chunk(pin=False), [torch.zeros((2, 3, 2, 1, 2))], 0)


def _hf_kv(layout: KVLayout, seq: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    shape = (layout.num_kv_heads, seq, layout.head_dim)
    keys = [torch.randn(shape).to(layout.dtype) for _ in range(layout.num_layers)]
    values = [torch.randn(shape).to(layout.dtype) for _ in range(layout.num_layers)]
    return keys, values


def test_hf_blocks_pack_token_major_and_unpack_to_the_same_tensors() -> None:
    layout = KVLayout(3, 2, 8, torch.bfloat16, block_size=4)
    keys, values = _hf_kv(layout, 3 * 4 + 1)  # a partial fourth block is not packed
    chunks = [block_from_kv(layout, keys, values, b) for b in range(3)]
    view = layout.view(chunks[1])
    # Layer 2, K, token 1 of block 1 (sequence position 5), head 1: keys[2][1, 5].
    assert torch.equal(view[2, 0, 1, 1], keys[2][1, 5])
    assert torch.equal(view[0, 1, 3, 0], values[0][0, 7])
    back_k, back_v = kv_from_blocks(layout, chunks)
    assert all(torch.equal(b, k[:, :12]) for b, k in zip(back_k, keys, strict=True))
    assert all(torch.equal(b, v[:, :12]) for b, v in zip(back_v, values, strict=True))


def test_block_from_kv_fills_a_given_buffer() -> None:
    layout = KVLayout(1, 1, 4, torch.float32, block_size=2)
    keys, values = _hf_kv(layout, 4)
    buf = layout.alloc_chunk(pin=False)
    assert block_from_kv(layout, keys, values, 1, out=buf) is buf
    assert torch.equal(layout.view(buf)[0, 0], keys[0][:, 2:4].transpose(0, 1))


@pytest.mark.parametrize(
    "bad",
    ["layers", "dtype", "short", "heads"],
)
def test_block_from_kv_refuses_tensors_that_do_not_fit(bad: str) -> None:
    layout = KVLayout(2, 2, 8, torch.float32, block_size=4)
    keys, values = _hf_kv(layout, 8)
    if bad == "layers":
        keys = keys[:1]
    elif bad == "dtype":
        keys = [k.to(torch.float16) for k in keys]
    elif bad == "short":
        keys = [k[:, :6] for k in keys]
    else:
        keys = [k[:1] for k in keys]
    with pytest.raises(LayoutError):
        block_from_kv(layout, keys, values, 1)


def test_kv_from_blocks_needs_a_chunk() -> None:
    with pytest.raises(LayoutError, match="at least one"):
        kv_from_blocks(KVLayout(1, 1, 4, torch.float32, block_size=2), [])


@pytest.mark.parametrize("paged", ["flash_attn", "flashinfer", "bhnc"])
def test_a_batched_scatter_fills_every_block_as_one_scatter_per_block_does(paged: str) -> None:
    from hostagent.layout import scatter_many_to_paged

    layout = KVLayout(3, 2, 8, torch.float16, block_size=4)
    gen = torch.Generator().manual_seed(5)
    chunks = [torch.randint(0, 256, (layout.chunk_bytes,), dtype=torch.uint8, generator=gen)
              for _ in range(3)]  # fmt: skip
    # Chunk 1 fills two blocks (two requests sharing a prefix), blocks out of order.
    targets = [(0, 6), (1, 2), (2, 0), (1, 4)]

    def caches() -> list[torch.Tensor]:
        if paged == "bhnc":
            return [torch.zeros(8, 2, 4, 16, dtype=torch.float16) for _ in range(3)]
        if paged == "flash_attn":
            return [torch.zeros(2, 8, 4, 2, 8, dtype=torch.float16) for _ in range(3)]
        return [torch.zeros(8, 2, 4, 2, 8, dtype=torch.float16) for _ in range(3)]

    one_by_one, batched = caches(), caches()
    for i, block in targets:
        scatter_to_paged(layout, chunks[i], one_by_one, block, paged)  # type: ignore[arg-type]
    scatter_many_to_paged(layout, chunks, batched, targets, paged)  # type: ignore[arg-type]

    def same(a: torch.Tensor, b: torch.Tensor) -> bool:  # bitwise: random bytes hold NaNs
        return torch.equal(a.view(torch.int16), b.view(torch.int16))

    assert all(same(a, b) for a, b in zip(one_by_one, batched, strict=True))
    assert any(bool(a.view(torch.int16).any()) for a in batched)
    # Only the layers named: layer 1 stays empty.
    some = caches()
    scatter_many_to_paged(layout, chunks, some, targets, paged, layers=[0, 2])  # type: ignore[arg-type]
    assert same(some[0], one_by_one[0]) and same(some[2], one_by_one[2])
    assert not some[1].view(torch.int16).any()
    # The later layers alone (what arrived after the first), staged from their byte range only.
    later = caches()
    scatter_many_to_paged(layout, chunks, later, targets, paged, layers=range(1, 3))  # type: ignore[arg-type]
    assert not later[0].view(torch.int16).any()
    assert same(later[1], one_by_one[1]) and same(later[2], one_by_one[2])
    with pytest.raises(LayoutError, match="outside"):
        scatter_many_to_paged(layout, chunks, later, targets, paged, layers=range(2, 4))  # type: ignore[arg-type]


def test_a_batched_scatter_refuses_a_block_named_twice_or_a_missing_chunk() -> None:
    from hostagent.layout import scatter_many_to_paged

    layout = KVLayout(1, 1, 8, torch.float16, block_size=4)
    chunk = layout.alloc_chunk(pin=False)
    kv = [torch.zeros(2, 8, 4, 1, 8, dtype=torch.float16)]
    with pytest.raises(LayoutError, match="twice"):
        scatter_many_to_paged(layout, [chunk, chunk], kv, [(0, 1), (1, 1)])
    with pytest.raises(LayoutError, match="outside"):
        scatter_many_to_paged(layout, [chunk], kv, [(1, 1)])
    with pytest.raises(LayoutError):
        scatter_many_to_paged(layout, [chunk[:-1]], kv, [(0, 1)])
