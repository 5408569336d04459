"""Two engines share a prefix through the connector, with transformers on CPU as the model.

Issue 15's end-to-end flow where no GPU is lent: the official vLLM wheel has no CPU kernels, so
a tiny random Hugging Face Llama (the dimensions of the test model's ``config.json``) stands in
for vLLM's forward pass, and everything around it is vLLM's and kvcast's real code. Engine A's
scheduler schedules the prompt; its "forward pass" writes the model's KV into A's paged cache
(vLLM 0.33's per-layer views) at the blocks A's scheduler allocated; the connector's
``wait_for_save`` publishes the full blocks into the pool. Engine B's scheduler finds them in
the pool, its connector loads them through the reference switch into B's paged cache, and B's
"forward pass" reads its cache back and computes only the remaining tokens. B's logits equal A's
decoding from its own cache bit for bit, and A's full prefill within fp32 reordering noise
(``test_e2e_model.py`` explains the tolerance).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
pytest.importorskip("vllm", reason="vllm is not installed (scripts/setup.sh installs it)")
transformers = pytest.importorskip("transformers", reason="transformers not installed")

from hostagent.layout import block_from_kv, gather_from_paged, kv_from_blocks  # noqa: E402
from hostagent.layout import scatter_to_paged as scatter  # noqa: E402
from tests.hostagent.refbridge import RefSwitchBridge  # noqa: E402
from tests.hostagent.test_e2e_model import decode  # noqa: E402
from tests.hostagent.test_vllm_connector import (  # noqa: E402
    BS,
    HEAD_DIM,
    HEADS,
    LAYERS,
    PROMPT,
    Engine,
    _vllm_env,  # noqa: F401 - the autouse fixture: pool, sink, vLLM's environment
    engine_on_switch,
    hashes,
    meta_of,
    model_dir,  # noqa: F401 - the model directory fixture
    pool_server,  # noqa: F401
    switch,  # noqa: F401
)

pytestmark = pytest.mark.slow


def tiny_llama() -> Any:
    config = transformers.LlamaConfig(
        vocab_size=2000,
        hidden_size=2 * HEADS * HEAD_DIM,
        intermediate_size=128,
        num_hidden_layers=LAYERS,
        num_attention_heads=2 * HEADS,
        num_key_value_heads=HEADS,
        head_dim=HEAD_DIM,
        max_position_embeddings=2048,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).float().eval()


def layer_kv(cache: Any, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    return cache.layers[layer].keys[0], cache.layers[layer].values[0]


def forward_a(eng: Engine, model: Any, req_id: str) -> tuple[list[torch.Tensor], ...]:
    """Engine A's forward pass: the prompt's KV written into its paged cache, as attention does."""
    with torch.no_grad():
        cache = model(torch.tensor([PROMPT]), use_cache=True).past_key_values
    keys = [layer_kv(cache, i)[0] for i in range(LAYERS)]
    values = [layer_kv(cache, i)[1] for i in range(LAYERS)]
    layout = eng.kv.layout
    caches = list(eng.caches.values())
    for b, block_id in enumerate(eng.blocks(req_id)[: len(PROMPT) // BS]):
        scatter(layout, block_from_kv(layout, keys, values, b), caches, block_id, "bhnc")
    return keys, values


def test_engine_b_decodes_from_the_prefix_engine_a_published(
    model_dir: Path,  # noqa: F811
    switch: RefSwitchBridge,  # noqa: F811
) -> None:
    model = tiny_llama()
    full = len(PROMPT) // BS * BS  # 64 tokens in 4 blocks; 6 more to compute
    a = engine_on_switch(model_dir, switch, host="engine-a")
    a.add("a", PROMPT)
    out_a = a.scheduler.schedule()
    assert meta_of(out_a).loads == [] and out_a.num_scheduled_tokens["a"] == len(PROMPT)
    keys_a, values_a = forward_a(a, model, "a")
    assert a.run_worker(out_a) == set()  # the connector's save path publishes blocks 0-3

    b = engine_on_switch(model_dir, switch, host="engine-b")
    b.add("b", PROMPT)
    out_b = b.scheduler.schedule()
    assert [ld.key for ld in meta_of(out_b).loads] == hashes(PROMPT)
    assert out_b.num_scheduled_tokens["b"] == len(PROMPT) - full
    assert b.run_worker(out_b) == set()
    # Engine B's forward pass: the loaded blocks read back from its paged cache, then the rest.
    layout = b.kv.layout
    chunks = []
    for block_id in b.blocks("b")[: full // BS]:
        chunk = layout.alloc_chunk(pin=False)
        gather_from_paged(layout, list(b.caches.values()), block_id, chunk, "bhnc")
        chunks.append(chunk)
    keys_b, values_b = kv_from_blocks(layout, chunks)
    assert all(torch.equal(kb, ka[:, :full]) for kb, ka in zip(keys_b, keys_a, strict=True))
    assert all(torch.equal(vb, va[:, :full]) for vb, va in zip(values_b, values_a, strict=True))

    rest = PROMPT[full:]
    logits_b = rest_logits(model, rest, keys_b, values_b)
    own = [k[:, :full] for k in keys_a], [v[:, :full] for v in values_a]
    assert torch.equal(logits_b, rest_logits(model, rest, *own))
    with torch.no_grad():
        logits_full = model(torch.tensor([PROMPT])).logits[0, -1].float()
    assert torch.allclose(logits_b, logits_full, atol=1e-5, rtol=0)
    assert int(logits_b.argmax()) == int(logits_full.argmax())
    a.close()
    b.close()


def rest_logits(
    model: Any, rest: list[int], keys: list[torch.Tensor], values: list[torch.Tensor]
) -> torch.Tensor:
    """Last-position logits of ``rest`` computed on top of a cache of ``keys``/``values``."""
    if len(rest) == 1:
        return decode(model, rest[0], keys, values)
    cache = transformers.DynamicCache()
    for layer, (k, v) in enumerate(zip(keys, values, strict=True)):
        cache.update(k[None].clone(), v[None].clone(), layer)
    with torch.no_grad():
        out = model(torch.tensor([rest]), past_key_values=cache, use_cache=True)
    logits: torch.Tensor = out.logits[0, -1].float()
    return logits
