"""vLLM KV events -> controller records, through vLLM's own ZMQ publisher and event types."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import pytest

pytest.importorskip("vllm", reason="vllm is not installed (scripts/setup.sh installs it)")

from vllm.distributed.kv_events import (  # noqa: E402
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    ZmqEventPublisher,
)

from hostagent.vllm_events import EventTranslator, KvEventSubscriber, block_key  # noqa: E402
from kvcast.reports import (
    InMemorySink,  # noqa: E402
    parse_reports,  # noqa: E402
)

CHUNK = 4096
H = [0x1111_0000_0000_0001, 0x2222_0000_0000_0002, 0x3333_0000_0000_0003]


def stored(hashes: list[int], parent: int | None, salt: str | None = None) -> BlockStored:
    extra = [(salt,) if salt and parent is None and i == 0 else None for i in range(len(hashes))]
    return BlockStored(
        block_hashes=list(hashes),
        parent_block_hash=parent,
        token_ids=list(range(16 * len(hashes))),
        block_size=16,
        lora_id=None,
        medium="GPU",
        lora_name=None,
        extra_keys=extra,
    )


def translator(sink: InMemorySink) -> EventTranslator:
    return EventTranslator(sink, "engine-1", CHUNK, tenant=3, tenants={"tenant-b": 9})


def test_stored_blocks_become_access_records_the_controller_accepts() -> None:
    sink = InMemorySink()
    t = translator(sink)
    t.handle(KVEventBatch(ts=1700000000.5, events=[stored(H[:2], None)]))
    t.handle(KVEventBatch(ts=1700000001.0, events=[stored(H[2:], H[1])]))
    got = [(e.key, e.parent, e.position, e.tenant) for e in sink.entries]
    assert got == [(H[0], None, 0, 3), (H[1], H[0], 1, 3), (H[2], H[1], 2, 3)]
    assert all(e.event == "access" and e.hit is None and e.size == CHUNK for e in sink.entries)
    parsed = parse_reports(json.dumps([e.as_json() for e in sink.entries]).encode())
    assert [r.key for r in parsed] == H and parsed[2].time == 1700000001.0
    assert t.resident == set(H)


def test_the_cache_salt_picks_the_tenant_of_the_whole_chain() -> None:
    sink = InMemorySink()
    t = translator(sink)
    t.handle(KVEventBatch(ts=1.0, events=[stored(H[:1], None, salt="tenant-b")]))
    t.handle(KVEventBatch(ts=2.0, events=[stored(H[1:2], H[0])]))
    assert [e.tenant for e in sink.entries] == [9, 9]


def test_removed_and_cleared_blocks_leave_the_resident_set() -> None:
    t = translator(InMemorySink())
    t.handle(KVEventBatch(ts=1.0, events=[stored(H, None)]))
    t.handle(KVEventBatch(ts=2.0, events=[BlockRemoved(block_hashes=[H[1]], medium="GPU")]))
    assert t.resident == {H[0], H[2]} and t.stats.removed == 1
    t.handle(KVEventBatch(ts=3.0, events=[AllBlocksCleared()]))
    assert t.resident == set() and t.stats.cleared == 1


def test_a_parent_seen_before_subscribing_leaves_position_unknown() -> None:
    sink = InMemorySink()
    translator(sink).handle(KVEventBatch(ts=1.0, events=[stored(H[2:], H[1])]))
    assert [(e.parent, e.position) for e in sink.entries] == [(H[1], None)]


def test_other_media_are_skipped_and_raw_hashes_are_cut_to_their_low_64_bits() -> None:
    sink = InMemorySink()
    t = translator(sink)
    cpu = stored(H[:1], None)
    cpu.medium = "CPU"
    t.handle(KVEventBatch(ts=1.0, events=[cpu]))
    assert sink.entries == [] and t.stats.other_medium == 1
    raw = bytes(range(32))
    assert block_key(raw) == int.from_bytes(raw[24:], "big")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def publisher() -> Iterator[tuple[ZmqEventPublisher, int]]:
    port = free_port()
    pub = ZmqEventPublisher(data_parallel_rank=0, endpoint=f"tcp://*:{port}", topic="kv")
    yield pub, port
    pub.shutdown()


def test_the_subscriber_receives_vllms_published_batches(
    publisher: tuple[ZmqEventPublisher, int],
) -> None:
    pub, port = publisher
    sink = InMemorySink()
    with KvEventSubscriber(f"tcp://127.0.0.1:{port}", translator(sink), topic="kv") as sub:
        # ZMQ drops what a PUB sends before the SUB has joined: warm up with empty batches.
        for _ in range(100):
            pub.publish(KVEventBatch(ts=time.time(), events=[]))
            if sub.poll(0.05):
                break
        pub.publish(KVEventBatch(ts=time.time(), events=[stored(H[:2], None)]))
        pub.publish(KVEventBatch(ts=time.time(), events=[BlockRemoved([H[0]], "GPU")]))
        deadline = time.monotonic() + 5
        while sub.stats.removed == 0 and time.monotonic() < deadline:
            sub.poll(0.05)
    assert [e.key for e in sink.entries] == H[:2]
    assert sub.translator.resident == {H[1]}
    assert sub.stats.undecodable == 0 and sub.stats.missed == 0
