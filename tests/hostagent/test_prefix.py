"""PrefixFetcher: token ids -> the longest prefix of blocks the network holds, verified."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from hostagent.chunkkeys import ChunkKeyer
from hostagent.fetch import FetchClient
from hostagent.layout import KVLayout, LayoutError
from hostagent.prefix import PrefixFetcher
from kvcast.backend import InMemoryBackend
from kvcast.fetch import RecomputeReason
from kvcast.reports import InMemorySink
from poolnode.server import PoolServer

TENANT, BLOCK, SEED = 6, 4, "0"
LAYOUT = KVLayout(2, 1, 8, torch.float16, block_size=BLOCK)
PROMPT = list(range(500, 500 + 5 * BLOCK + 3))  # five full blocks and a partial one
KEYS = ChunkKeyer(BLOCK, SEED).keys(PROMPT)
TIMING = {"timeout_s": 0.05, "max_timeout_s": 0.1, "max_retries": 1, "deadline_s": 5.0}


def chunk(i: int) -> bytes:
    return bytes((i * 7 + j) & 0xFF for j in range(LAYOUT.chunk_bytes))


@pytest.fixture
def backend() -> InMemoryBackend:
    return InMemoryBackend()


@pytest.fixture
def client(backend: InMemoryBackend) -> Iterator[tuple[FetchClient, InMemorySink]]:
    sink = InMemorySink()
    with (
        PoolServer(backend, "127.0.0.1", 0) as server,
        FetchClient(server.address, reporter=sink, report_host="h1", **TIMING) as cl,
    ):
        yield cl, sink


def fetcher(cl: FetchClient) -> PrefixFetcher:
    return PrefixFetcher(cl, LAYOUT, ChunkKeyer(BLOCK, SEED), TENANT)


def store(backend: InMemoryBackend, blocks: list[int]) -> None:
    for i in blocks:
        backend.put(TENANT, KEYS[i].key, chunk(i))


def test_the_prefix_ends_at_the_first_block_the_network_lacks(
    backend: InMemoryBackend, client: tuple[FetchClient, InMemorySink]
) -> None:
    store(backend, [0, 1, 2, 4])  # block 3 is gone: block 4 is of no use without it
    cl, sink = client
    result = fetcher(cl).fetch_prefix(PROMPT)
    assert result.blocks == 3 and result.tokens == 3 * BLOCK
    assert [c.numpy().tobytes() for c in result.chunks] == [chunk(i) for i in range(3)]
    assert result.stop_reason is RecomputeReason.NOT_FOUND
    assert [r.ok for r in result.reports] == [True, True, True, False]
    assert result.bytes == 3 * LAYOUT.chunk_bytes
    # Every block tried is one access record, chained by parent and position; block 4 may have
    # been in flight already when block 3 failed (fetch_many), and was then fetched too.
    entries = sorted(sink.entries, key=lambda e: e.position)
    assert [(e.key, e.position, e.hit) for e in entries[:4]] == [
        (KEYS[0].key, 0, False), (KEYS[1].key, 1, False), (KEYS[2].key, 2, False),
        (KEYS[3].key, 3, None),
    ]  # fmt: skip
    assert [(e.key, e.position, e.hit) for e in entries[4:]] in ([], [(KEYS[4].key, 4, False)])
    assert [e.parent for e in entries] == [None] + [k.key for k in KEYS[: len(entries) - 1]]


def test_every_full_block_when_the_network_has_them_all(
    backend: InMemoryBackend, client: tuple[FetchClient, InMemorySink]
) -> None:
    store(backend, list(range(5)))
    cl, _ = client
    result = fetcher(cl).fetch_prefix(PROMPT)
    assert (result.blocks, result.tokens, result.stop_reason) == (
        5,
        5 * BLOCK,
        RecomputeReason.NONE,
    )
    assert len(result.reports) == 5  # the partial sixth block has no key: never asked for


def test_max_blocks_bounds_the_fetch(
    backend: InMemoryBackend, client: tuple[FetchClient, InMemorySink]
) -> None:
    store(backend, list(range(5)))
    cl, sink = client
    assert fetcher(cl).fetch_prefix(PROMPT, max_blocks=2).blocks == 2
    nothing = fetcher(cl).fetch_prefix(PROMPT, max_blocks=0)
    assert (nothing.blocks, nothing.tokens, nothing.reports) == (0, 0, [])
    assert len(sink.entries) == 2
    with pytest.raises(ValueError, match="max_blocks"):
        fetcher(cl).fetch_prefix(PROMPT, max_blocks=-1)


def test_given_buffers_are_filled_in_place_and_checked(
    backend: InMemoryBackend, client: tuple[FetchClient, InMemorySink]
) -> None:
    store(backend, [0, 1])
    cl, _ = client
    bufs = [LAYOUT.alloc_chunk(pin=False) for _ in range(2)]
    result = fetcher(cl).fetch_prefix(PROMPT, buffers=bufs)
    assert result.blocks == 2 and all(a is b for a, b in zip(result.chunks, bufs, strict=True))
    with pytest.raises(LayoutError):
        fetcher(cl).fetch_prefix(PROMPT, buffers=[torch.zeros(3, dtype=torch.uint8)])


def test_a_short_prompt_has_no_prefix_to_fetch(client: tuple[FetchClient, InMemorySink]) -> None:
    cl, sink = client
    result = fetcher(cl).fetch_prefix(PROMPT[: BLOCK - 1])
    assert (result.blocks, result.tokens, result.keys, sink.entries) == (0, 0, [], [])
    with pytest.raises(ValueError, match="block size"):
        PrefixFetcher(cl, LAYOUT, ChunkKeyer(BLOCK + 1, SEED), TENANT)
