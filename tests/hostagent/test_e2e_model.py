"""End to end with a real model: prefix KV produced on host A, fetched on host B, same logits.

A tiny Hugging Face Llama (2 layers, hidden 64, 4 heads, 2 KV heads, vocab 256) is built locally
with random weights from a fixed seed: nothing is downloaded (HF_HUB_OFFLINE=1). Host A prefills a
32-token prompt (two 16-token blocks) and publishes it with the producer path
(``hostagent.producer.Producer``): each block of its ``past_key_values`` packed into a chunk in the
KVLayout, the chunks put into the pool in one batch (Mooncake's ``batch_put_from`` where Mooncake
runs) and reported as stored. Host B, from the token ids alone (``PrefixFetcher``: chunk keys, then
the longest prefix of blocks the network holds), fetches every chunk through the reference switch
pipeline (``RefSwitchBridge``: from switch SRAM loaded with WRITE PacketOuts, or from the pool
after a miss), rebuilds a ``DynamicCache`` and decodes the next token.

Two comparisons:

- **bit-exact** against A decoding the same token from its own cache: the same tensors go in,
  so the logits must be identical (``torch.equal``), in fp32 and bf16 alike. This is what the
  transfer must guarantee: every KV byte arrives unchanged.
- **close** to A's full local prefill of the 33 tokens: the one-token decode and the 33-token
  prefill compute the last position's attention and matmuls with different shapes, so their
  floating-point reductions run in a different order. In fp32 that moves logits of magnitude
  ~0.5 by ~1e-7; the tolerance is 1e-5 (100x margin). In bf16 (8-bit mantissa: one ulp at 0.5
  is ~0.004) the same reordering can move a logit by a few ulps through two layers, so the bf16
  tolerance is 3e-2. bf16 is not the place to judge the transfer (that is the bit-exact check);
  fp32 is, which is why the closeness check is stated per dtype.

A corrupted fragment in switch SRAM is caught by the CRC and never reaches the tensor: the fetch
falls back to the pool and the logits are still exact.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
transformers = pytest.importorskip("transformers", reason="transformers not installed")

from hostagent.chunkkeys import ChunkKeyer  # noqa: E402
from hostagent.fetch import FetchClient  # noqa: E402
from hostagent.layout import KVLayout, block_from_kv, kv_from_blocks  # noqa: E402
from hostagent.prefix import PrefixFetcher  # noqa: E402
from hostagent.producer import Producer  # noqa: E402
from kvcast import p4constants as c  # noqa: E402
from kvcast.backend import InMemoryBackend, PoolBackend  # noqa: E402
from kvcast.fetch import FetchOutcome  # noqa: E402
from kvcast.reports import InMemorySink  # noqa: E402
from poolnode.server import PoolServer  # noqa: E402
from tests.hostagent.refbridge import RefSwitchBridge  # noqa: E402

pytestmark = pytest.mark.slow

TENANT, BLOCK, NBLOCKS, HASH_SEED = 11, 16, 2, "0"
CLOSE = {torch.float32: 1e-5, torch.bfloat16: 3e-2}
# Long first GET timeout: a loaded machine must not turn a working path into a fallback.
STEADY: dict[str, Any] = {"timeout_s": 0.2, "max_timeout_s": 0.5, "max_retries": 2}


@dataclass
class HostA:
    """What host A produced: the model, its chunks and its reference logits."""

    model: Any
    layout: KVLayout
    prompt: list[int]
    next_token: int
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    chunks: list[torch.Tensor]
    chunk_keys: list[int]
    logits_full: torch.Tensor
    logits_own_cache: torch.Tensor


def _layer_kv(cache: Any, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer ``layer``'s (keys, values) of a DynamicCache, in transformers 4.x or 5.x."""
    if hasattr(cache, "layers"):
        return cache.layers[layer].keys, cache.layers[layer].values
    return cache.key_cache[layer], cache.value_cache[layer]


def decode(
    model: Any, next_token: int, keys: list[torch.Tensor], values: list[torch.Tensor]
) -> torch.Tensor:
    """Next-token logits from a cache rebuilt from per-layer ``[kv_heads, seq, dim]`` KV."""
    cache = transformers.DynamicCache()
    for layer, (k, v) in enumerate(zip(keys, values, strict=True)):
        cache.update(k[None].clone(), v[None].clone(), layer)
    with torch.no_grad():
        out = model(torch.tensor([[next_token]]), past_key_values=cache, use_cache=True)
    logits: torch.Tensor = out.logits[0, -1].float()
    return logits


def host_a(dtype: torch.dtype) -> HostA:
    """Builds the model and prefills the prompt on host A."""
    config = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(dtype).eval()
    layout = KVLayout.from_hf_config(config.to_dict(), block_size=BLOCK, dtype=dtype)
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, config.vocab_size, (NBLOCKS * BLOCK + 1,), generator=gen).tolist()
    prompt, next_token = tokens[:-1], tokens[-1]
    with torch.no_grad():
        cache = model(torch.tensor([prompt]), use_cache=True).past_key_values
        logits_full = model(torch.tensor([tokens])).logits[0, -1].float()
    keys = [_layer_kv(cache, i)[0][0] for i in range(layout.num_layers)]
    values = [_layer_kv(cache, i)[1][0] for i in range(layout.num_layers)]
    chunks = [block_from_kv(layout, keys, values, b) for b in range(NBLOCKS)]
    chunk_keys = ChunkKeyer(BLOCK, HASH_SEED).wire_keys(prompt)
    logits_own_cache = decode(model, next_token, keys, values)
    return HostA(
        model,
        layout,
        prompt,
        next_token,
        keys,
        values,
        chunks,
        chunk_keys,
        logits_full,
        logits_own_cache,
    )


@pytest.fixture(scope="module", params=[torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def a(request: pytest.FixtureRequest) -> HostA:
    return host_a(request.param)


@pytest.fixture(scope="module")
def a32() -> HostA:
    return host_a(torch.float32)


def publish(a: HostA, backend: PoolBackend) -> None:
    """Host A's producer path: its prefill cache cut into chunks, stored in one batched put
    (Mooncake's ``batch_put_from`` where Mooncake runs) and reported as stored."""
    sink = InMemorySink()
    producer = Producer(backend, a.layout, ChunkKeyer(BLOCK, HASH_SEED), TENANT, reporter=sink)
    report = producer.publish_kv(a.prompt, a.keys, a.values)
    assert report.ok and report.stored_keys == a.chunk_keys
    assert [(e.key, e.event) for e in sink.entries] == [(k, "stored") for k in a.chunk_keys]


@pytest.fixture
def memory_pool() -> Iterator[tuple[InMemoryBackend, PoolServer]]:
    backend = InMemoryBackend()
    with PoolServer(backend, "127.0.0.1", 0) as server:
        yield backend, server


def host_b_fetch(a: HostA, client: FetchClient) -> tuple[list[torch.Tensor], list[Any]]:
    """Host B: from the token ids alone, the longest prefix the network holds."""
    fetcher = PrefixFetcher(client, a.layout, ChunkKeyer(BLOCK, HASH_SEED), TENANT)
    result = fetcher.fetch_prefix(a.prompt)
    assert [k.key for k in result.keys] == a.chunk_keys
    assert result.tokens == len(a.prompt), f"prefix ended early: {result.stop_reason}"
    return result.chunks, result.reports


def check_logits(a: HostA, bufs: list[torch.Tensor]) -> None:
    keys, values = kv_from_blocks(a.layout, bufs)
    assert all(torch.equal(k, ka) for k, ka in zip(keys, a.keys, strict=True))
    assert all(torch.equal(v, va) for v, va in zip(values, a.values, strict=True))
    logits = decode(a.model, a.next_token, keys, values)
    assert torch.equal(logits, a.logits_own_cache)
    tol = CLOSE[a.layout.dtype]
    assert torch.allclose(logits, a.logits_full, atol=tol, rtol=0), (
        (logits - a.logits_full).abs().max()
    )
    assert int(logits.argmax()) == int(a.logits_full.argmax())


def load_sram(a: HostA, bridge: RefSwitchBridge) -> None:
    n = a.layout.frag_count
    for b, (key, chunk) in enumerate(zip(a.chunk_keys, a.chunks, strict=True)):
        bridge.load_chunk(TENANT, key, chunk.numpy().tobytes(), slot_base=b * n, epoch=1)


def test_next_token_from_chunks_served_by_switch_sram(
    a: HostA, memory_pool: tuple[InMemoryBackend, PoolServer]
) -> None:
    backend, server = memory_pool
    publish(a, backend)
    with RefSwitchBridge(server.address) as bridge:
        load_sram(a, bridge)
        with FetchClient(bridge.vip, server.address, frags_per_get=1, **STEADY) as client:
            bridge.register(client.address)
            bufs, reports = host_b_fetch(a, client)
    n = a.layout.frag_count
    assert [(r.ok, r.frags_hit, r.frags_pool) for r in reports] == [(True, n, 0)] * NBLOCKS
    check_logits(a, bufs)


@pytest.mark.parametrize("store", ["memory", "mooncake"])
def test_next_token_from_chunks_the_pool_serves_after_a_switch_miss(
    a32: HostA, store: str, request: pytest.FixtureRequest
) -> None:
    backend: PoolBackend = (
        InMemoryBackend() if store == "memory" else request.getfixturevalue("mooncake_store")
    )
    publish(a32, backend)
    with (
        PoolServer(backend, "127.0.0.1", 0) as server,
        RefSwitchBridge(server.address) as bridge,
        FetchClient(bridge.vip, server.address, **STEADY) as client,
    ):
        bridge.register(client.address)
        bufs, reports = host_b_fetch(a32, client)
        events = bridge.client.counters(c.COUNTER_INGRESS_STATS_KVP_EVENT_COUNTER)
    n = a32.layout.frag_count
    assert [(r.ok, r.frags_hit, r.frags_pool) for r in reports] == [(True, 0, n)] * NBLOCKS
    assert not any(r.fell_back for r in reports)  # served through the switch, not around it
    assert events[c.EV_GET_MISS] == sum(r.gets_sent for r in reports)
    check_logits(a32, bufs)


def test_corrupted_sram_fragment_never_reaches_the_tensor_and_the_pool_serves_it(
    a32: HostA, memory_pool: tuple[InMemoryBackend, PoolServer]
) -> None:
    backend, server = memory_pool
    publish(a32, backend)
    bad_frag = 3
    lo, hi = bad_frag * c.FRAG_BYTES, (bad_frag + 1) * c.FRAG_BYTES
    with RefSwitchBridge(server.address) as bridge:
        load_sram(a32, bridge)
        with bridge.lock:  # block 0's fragment 3 is slot 3: flip one byte of it in SRAM
            bridge.target.pipeline.regs.frag_words[lo + 17] ^= 0x20
            corrupted = bytes(bridge.target.pipeline.regs.frag_words[lo:hi])
        assert corrupted != a32.chunks[0].numpy().tobytes()[lo:hi]
        # Without a pool to fall back to, the fragment never lands: clear failure, and the
        # tensor's bytes at that fragment are still what they were before the fetch.
        with FetchClient(bridge.vip, None, frags_per_get=1, **STEADY) as switch_only:
            bridge.register(switch_only.address)
            buf = a32.layout.alloc_chunk(pin=False).zero_()
            alone = switch_only.fetch_block(TENANT, a32.chunk_keys[0], a32.layout, buf)
        assert alone.outcome is FetchOutcome.RECOMPUTE and alone.crc_failures >= 1
        assert buf[lo:hi].count_nonzero() == 0
        # With the pool behind it, the fetch re-fetches that fragment from the pool.
        with FetchClient(bridge.vip, server.address, frags_per_get=1, **STEADY) as client:
            bridge.register(client.address)
            bufs, reports = host_b_fetch(a32, client)
    first = reports[0]
    assert first.ok and first.fell_back and first.crc_failures >= 1
    assert first.frags_pool >= 1 and first.frags_hit + first.frags_pool == a32.layout.frag_count
    assert reports[1].ok and reports[1].crc_failures == 0
    check_logits(a32, bufs)
