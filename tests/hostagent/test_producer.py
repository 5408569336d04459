"""The producer path: prompt KV -> chunks -> DRAM pool (batched put) -> "stored" reports."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
import torch

from hostagent.chunkkeys import ChunkKeyer
from hostagent.layout import KVLayout, LayoutError, block_from_kv, scatter_to_paged
from hostagent.producer import Producer, ProducerError
from kvcast.backend import BytesLike, InMemoryBackend, PoolBackend, PoolBackendError
from kvcast.integrity import mac_key_of
from kvcast.kvclass import KvClass
from kvcast.reports import InMemorySink
from tests.poolnode.conftest import MOONCAKE_MISSING

TENANT = 4
BLOCK = 4
LAYOUT = KVLayout(2, 2, 8, torch.float32, block_size=BLOCK)
SEED = "0"
PROMPT = list(range(100, 100 + 3 * BLOCK + 2))  # three full blocks and a partial one


def kv(seq_len: int, seed: int = 0) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    shape = (LAYOUT.num_kv_heads, seq_len, LAYOUT.head_dim)
    keys = [torch.randn(shape, generator=gen) for _ in range(LAYOUT.num_layers)]
    values = [torch.randn(shape, generator=gen) for _ in range(LAYOUT.num_layers)]
    return keys, values


def producer(backend: PoolBackend, sink: InMemorySink | None = None) -> Producer:
    return Producer(backend, LAYOUT, ChunkKeyer(BLOCK, SEED), TENANT, reporter=sink, host="h1")


def test_every_full_block_is_stored_with_its_bytes_and_reported_as_stored() -> None:
    backend, sink = InMemoryBackend(), InMemorySink()
    keys, values = kv(len(PROMPT))
    report = producer(backend, sink).publish_kv(PROMPT, keys, values)
    ckeys = ChunkKeyer(BLOCK, SEED).keys(PROMPT)
    assert len(ckeys) == 3
    assert (report.blocks, report.stored, report.present, report.failed) == (3, 3, 0, 0)
    assert report.ok and report.bytes_stored == 3 * LAYOUT.chunk_bytes
    assert report.stored_keys == [ck.key for ck in ckeys]
    assert len(backend) == 3  # the partial block has no key and is not stored
    for b, ck in enumerate(ckeys):
        want = block_from_kv(LAYOUT, keys, values, b).numpy().tobytes()
        assert backend.get(TENANT, ck.key) == want
    records = sink.entries
    assert report.reported == 3 and [r.key for r in records] == report.stored_keys
    assert all(r.event == "stored" and r.hit is None for r in records)
    assert [r.position for r in records] == [0, 1, 2]
    assert [r.parent for r in records] == [None, ckeys[0].key, ckeys[1].key]
    assert all(r.size == LAYOUT.chunk_bytes and r.host == "h1" for r in records)
    assert records[0].as_json()["event"] == "stored" and "hit" not in records[0].as_json()


def test_chunks_the_pool_holds_are_not_put_or_reported_again() -> None:
    backend, sink = InMemoryBackend(), InMemorySink()
    keys, values = kv(len(PROMPT))
    producer(backend).publish_kv(PROMPT[: 2 * BLOCK], keys, values)  # another host did 2
    report = producer(backend, sink).publish_kv(PROMPT, keys, values)
    assert (report.stored, report.present, report.reported) == (1, 2, 1)
    assert [r.position for r in sink.entries] == [2]


def test_a_longer_prompt_with_the_same_prefix_shares_its_chunks() -> None:
    backend = InMemoryBackend()
    keys, values = kv(64)
    producer(backend).publish_kv(PROMPT, keys, values)
    other = PROMPT[: 2 * BLOCK] + [7] * (2 * BLOCK)  # same first two blocks, then different
    report = producer(backend).publish_kv(other, keys, values)
    assert (report.present, report.stored) == (2, 2)


def test_paged_kv_is_published_from_the_engines_block_ids() -> None:
    backend = InMemoryBackend()
    keys, values = kv(len(PROMPT))
    chunks = [block_from_kv(LAYOUT, keys, values, b) for b in range(3)]
    caches = [torch.zeros((2, 8, BLOCK, 2, 8)) for _ in range(LAYOUT.num_layers)]
    block_ids = [5, 1, 6, 2]  # the engine's blocks for the prompt; 2 holds the partial block
    for chunk, block_id in zip(chunks, block_ids, strict=False):
        scatter_to_paged(LAYOUT, chunk, caches, block_id)
    report = producer(backend).publish_paged(PROMPT, caches, block_ids)
    assert report.stored == 3
    for ck, chunk in zip(ChunkKeyer(BLOCK, SEED).keys(PROMPT), chunks, strict=True):
        assert backend.get(TENANT, ck.key) == chunk.numpy().tobytes()
    with pytest.raises(ProducerError, match="2 block ids"):
        producer(backend).publish_paged(PROMPT, caches, block_ids[:2])


def test_chunks_that_do_not_belong_to_the_prompt_are_refused_and_nothing_is_stored() -> None:
    backend = InMemoryBackend()
    good = LAYOUT.alloc_chunk(pin=False)
    with pytest.raises(ProducerError, match="4 chunks for a prompt of 3 full blocks"):
        producer(backend).publish_chunks(PROMPT, [good] * 4)
    short = torch.zeros(LAYOUT.chunk_bytes - 1, dtype=torch.uint8)
    with pytest.raises(LayoutError):
        producer(backend).publish_chunks(PROMPT, [good, short])
    assert len(backend) == 0
    with pytest.raises(ValueError, match="block size"):
        Producer(backend, LAYOUT, ChunkKeyer(BLOCK * 2, SEED), TENANT)


class _FailingAfter(InMemoryBackend):
    """Takes the first ``ok`` chunks of a batched put, then fails as a full pool would."""

    def __init__(self, ok: int) -> None:
        super().__init__()
        self.ok = ok

    def put_many(
        self, items: Iterable[tuple[int, int, BytesLike]], *, kv_class: KvClass = KvClass.TRANSIENT
    ) -> None:
        for i, (tenant, key, data) in enumerate(items):
            if i >= self.ok:
                raise PoolBackendError(f"no space for chunk {key:#x}")
            self.put(tenant, key, data, kv_class=kv_class)


def test_a_failed_put_is_counted_and_only_what_landed_is_reported() -> None:
    backend, sink = _FailingAfter(ok=2), InMemorySink()
    keys, values = kv(len(PROMPT))
    report = producer(backend, sink).publish_kv(PROMPT, keys, values)
    assert (report.stored, report.failed) == (2, 1) and not report.ok
    assert "no space" in report.error
    assert [r.position for r in sink.entries] == [0, 1]


class _BrokenSink(InMemorySink):
    def submit(self, entries: object) -> None:  # type: ignore[override]
        raise RuntimeError("sink broke")


def test_a_broken_report_sink_never_fails_the_publish() -> None:
    backend = InMemoryBackend()
    keys, values = kv(len(PROMPT))
    report = producer(backend, _BrokenSink()).publish_kv(PROMPT, keys, values)
    assert report.stored == 3 and report.reported == 0 and len(backend) == 3


def test_publish_into_mooncake_store_with_batch_put_from(mooncake_store: PoolBackend) -> None:
    mooncake = mooncake_store
    sink = InMemorySink()
    keys, values = kv(len(PROMPT), seed=9)
    report = producer(mooncake, sink).publish_kv(PROMPT, keys, values)
    assert (report.stored, report.failed, report.reported) == (3, 0, 3)
    for b, key in enumerate(report.stored_keys):
        assert mooncake.get(TENANT, key) == block_from_kv(LAYOUT, keys, values, b).numpy().tobytes()
    again = producer(mooncake).publish_kv(PROMPT, keys, values)
    assert (again.present, again.stored) == (3, 0)


def test_a_dead_mooncake_master_is_a_counted_failure_not_a_hang() -> None:
    if MOONCAKE_MISSING:
        pytest.skip(MOONCAKE_MISSING)
    from kvcast.mooncake import MooncakeBackend
    from poolnode.mooncake import MooncakeMaster

    master = MooncakeMaster().start()
    backend = MooncakeBackend(
        master.address, global_segment_size=16 << 20, local_buffer_size=4 << 20
    )
    try:
        master.stop()  # the pool's master dies after the host connected
        sink = InMemorySink()
        keys, values = kv(len(PROMPT), seed=3)
        report = producer(backend, sink).publish_kv(PROMPT, keys, values)
        assert (report.stored, report.failed, report.reported) == (0, 3, 0)
        assert "RPC_FAIL" in report.error and sink.entries == []
        # One existence check and the put reach the dead master; the rest are not asked.
        assert report.duration_s < 15
    finally:
        backend.close()


def test_static_blocks_and_their_macs_are_put_as_static_and_reported_with_the_class() -> None:
    backend, sink = InMemoryBackend(), InMemorySink()
    secret = bytes(range(32))
    prod = Producer(
        backend, LAYOUT, ChunkKeyer(BLOCK, SEED), TENANT, reporter=sink, host="h1", mac_key=secret
    )
    ckeys = ChunkKeyer(BLOCK, SEED).keys(PROMPT)
    chunks = [LAYOUT.alloc_chunk() for _ in ckeys]
    report = prod.publish_keyed(ckeys, chunks, static_blocks=2, kv_class=KvClass.TRANSIENT)
    assert report.ok and report.stored == 3
    classes = [backend.kv_class(TENANT, ck.key) for ck in ckeys]
    assert classes == [KvClass.STATIC, KvClass.STATIC, KvClass.TRANSIENT]
    macs = [backend.kv_class(TENANT, mac_key_of(ck.key)) for ck in ckeys]
    assert macs == classes
    assert [r.kv_class for r in sink.entries] == classes
    with pytest.raises(ProducerError, match="static_blocks"):
        prod.publish_keyed(ckeys, chunks, static_blocks=-1)
