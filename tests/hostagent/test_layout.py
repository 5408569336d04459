"""KV layout: DESIGN.md's sizes, fragment arithmetic, views and the vLLM paged-cache bridge."""

from __future__ import annotations

import pytest
import torch

from hostagent.layout import (
    KVLayout,
    LayoutError,
    dtype_from_name,
    gather_from_paged,
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


@pytest.mark.parametrize("paged", ["flash_attn", "flashinfer"])
def test_scatter_then_gather_round_trips_through_vllm_paged_layout(paged: str) -> None:
    layout = KVLayout(3, 2, 4, torch.bfloat16, block_size=5)
    num_blocks = 6
    shape = (2, num_blocks, 5, 2, 4) if paged == "flash_attn" else (num_blocks, 2, 5, 2, 4)
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


def test_scatter_refuses_caches_of_another_shape() -> None:
    layout = KVLayout(2, 1, 2, torch.float32, block_size=2)
    caches = [torch.zeros((2, 3, 4, 1, 2)) for _ in range(2)]
    with pytest.raises(LayoutError, match="layer 0"):
        scatter_to_paged(layout, layout.alloc_chunk(pin=False), caches, 0)


def test_scatter_refuses_the_wrong_number_of_layers() -> None:
    layout = KVLayout(2, 1, 2, torch.float32, block_size=2)
    with pytest.raises(LayoutError, match="per-layer"):
        scatter_to_paged(layout, layout.alloc_chunk(pin=False), [torch.zeros((2, 3, 2, 1, 2))], 0)
