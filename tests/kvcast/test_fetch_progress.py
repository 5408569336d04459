"""fetch_many's progress: the verified contiguous prefix of each chunk, as it grows (no torch).

The vLLM connector copies a chunk into the engine's cache layer by layer as its prefix grows,
so what the callback names must be bytes that are final: every fragment CRC-checked, never
written again, and, for a tenant with a MAC key, nothing before the MAC matched.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import pytest

from kvcast import p4constants as c
from kvcast.backend import InMemoryBackend
from kvcast.fetch import ChunkRequest, FetchClient, FetchReport, RecomputeReason
from kvcast.integrity import SEGMENT_BYTES, chunk_mac, mac_key_of
from poolnode.server import PoolServer
from tests.conftest import backend_holding
from tests.hostagent.fakes import Corrupting, Dropping, FakeServer, Partial, Respond

pytestmark = pytest.mark.usefixtures("data_path")

TENANT = 6
KEYS = [0x2000 + i for i in range(4)]
CHUNKS = {k: os.urandom((9 + i) * c.FRAG_BYTES - 5 * (i + 1)) for i, k in enumerate(KEYS)}
FAST = {"timeout_s": 0.02, "max_timeout_s": 0.08, "max_retries": 2, "deadline_s": 5.0}


@pytest.fixture
def backend() -> InMemoryBackend:
    return backend_holding(TENANT, CHUNKS)


@pytest.fixture
def pool_server(backend: InMemoryBackend) -> Iterator[PoolServer]:
    with PoolServer(backend, "127.0.0.1", 0, cache_bytes=0) as srv:
        yield srv


class Watch:
    """A progress callback that checks, at each call, that the named prefix is the chunk's."""

    def __init__(self, requests: list[ChunkRequest]) -> None:
        self.requests = requests
        self.calls: dict[int, list[int]] = {}
        self.wrong: list[tuple[int, int]] = []

    def __call__(self, index: int, nbytes: int) -> None:
        self.calls.setdefault(index, []).append(nbytes)
        r = self.requests[index]
        if bytes(r.dst[:nbytes]) != CHUNKS[r.key][:nbytes]:
            self.wrong.append((index, nbytes))


def requests(keys: list[int]) -> list[ChunkRequest]:
    return [
        ChunkRequest(TENANT, k, np.zeros(len(CHUNKS.get(k, b"x" * 999)), dtype=np.uint8))
        for k in keys
    ]


def fetch_one(responder: Respond, frags_per_get: int) -> tuple[FetchReport, Watch]:
    """Chunk ``KEYS[0]`` from a fake pool, watched."""
    reqs = requests(KEYS[:1])
    watch = Watch(reqs)
    with (
        FakeServer(responder) as srv,
        FetchClient(srv.address, window=4, frags_per_get=frags_per_get, **FAST) as client,
    ):
        (report,) = client.fetch_many(reqs, progress=watch)
    return report, watch


def test_each_chunks_prefix_grows_in_fragment_steps_to_its_length(
    pool_server: PoolServer,
) -> None:
    reqs = requests(KEYS)
    watch = Watch(reqs)
    with FetchClient(pool_server.address, window=4, frags_per_get=1, **FAST) as client:
        reports = client.fetch_many(reqs, max_chunks_in_flight=2, progress=watch)
    assert all(r.ok for r in reports)
    assert not watch.wrong
    for i, k in enumerate(KEYS):
        calls = watch.calls[i]
        assert calls == sorted(set(calls)), "a prefix only grows"
        assert calls[-1] == len(CHUNKS[k])
        assert all(n % c.FRAG_BYTES == 0 for n in calls[:-1])
    # One fragment per GET, four GETs in flight: the first chunk is reported before it ends.
    assert len(watch.calls[0]) > 1


def test_a_lost_fragment_holds_the_prefix_back_until_its_repair(backend: InMemoryBackend) -> None:
    reqs = requests(KEYS[:2])
    watch = Watch(reqs)
    with (
        FakeServer(Dropping(backend, {3})) as srv,
        FetchClient(srv.address, window=8, frags_per_get=1, **FAST) as client,
    ):
        reports = client.fetch_many(reqs, progress=watch)
    assert all(r.ok for r in reports) and not watch.wrong
    # Fragments after 3 arrived first; a prefix reported past 3 before its repair would hold
    # the buffer's zeros there, which Watch finds.
    assert reports[0].retries >= 1
    assert watch.calls[0][-1] == len(CHUNKS[KEYS[0]])


def test_a_fragment_that_fails_its_crc_is_never_in_a_reported_prefix(
    backend: InMemoryBackend,
) -> None:
    report, watch = fetch_one(Corrupting(backend, 2), frags_per_get=2)
    assert report.ok and report.crc_failures == 1
    assert not watch.wrong and watch.calls[0][-1] == len(CHUNKS[KEYS[0]])


def test_a_chunk_that_fails_is_reported_only_up_to_what_arrived(backend: InMemoryBackend) -> None:
    report, watch = fetch_one(Partial(backend, 4), frags_per_get=1)
    assert not report.ok
    assert not watch.wrong
    assert max(watch.calls.get(0, [0])) <= 4 * c.FRAG_BYTES


def test_a_missing_chunk_is_never_reported(pool_server: PoolServer) -> None:
    reqs = requests([KEYS[0], 0xDEAD])
    watch = Watch(reqs)
    with FetchClient(pool_server.address, **FAST) as client:
        reports = client.fetch_many(reqs, progress=watch)
    assert reports[0].ok and reports[1].reason is RecomputeReason.NOT_FOUND
    assert 1 not in watch.calls and watch.calls[0][-1] == len(CHUNKS[KEYS[0]])


def test_a_mac_tenants_chunk_is_reported_once_whole_after_its_mac_matched(
    backend: InMemoryBackend,
) -> None:
    secret = bytes(range(1, 33))
    for k in KEYS[:3]:
        backend.put(TENANT, mac_key_of(k), chunk_mac(secret, TENANT, k, CHUNKS[k]))
    backend.put(TENANT, mac_key_of(KEYS[1]), bytes(32))  # the middle chunk's MAC is wrong
    reqs = requests(KEYS[:3])
    watch = Watch(reqs)
    with (
        PoolServer(backend, "127.0.0.1", 0, cache_bytes=0) as srv,
        FetchClient(srv.address, mac_keys={TENANT: secret}, frags_per_get=1, **FAST) as client,
    ):
        reports = client.fetch_many(reqs, max_chunks_in_flight=3, progress=watch)
    assert [r.ok for r in reports] == [True, False, True]
    assert watch.calls == {0: [len(CHUNKS[KEYS[0]])], 2: [len(CHUNKS[KEYS[2]])]}
    assert not watch.wrong


def test_without_a_callback_nothing_is_reported_and_the_chunks_arrive(
    pool_server: PoolServer,
) -> None:
    reqs = requests(KEYS[:2])
    with FetchClient(pool_server.address, **FAST) as client:
        reports = client.fetch_many(reqs)
        assert client._progress is None
    assert all(r.ok for r in reports)
    assert [bytes(r.dst) for r in reqs] == [CHUNKS[k] for k in KEYS[:2]]


def test_datagrams_name_their_chunk(pool_server: PoolServer) -> None:
    # The progress of one chunk never names another's index: each DATA is checked against
    # the chunk its key names (here: the same key twice, one after the other).
    reqs = requests([KEYS[0], KEYS[0]])
    watch = Watch(reqs)
    with FetchClient(pool_server.address, frags_per_get=1, **FAST) as client:
        reports = client.fetch_many(reqs, progress=watch)
    assert all(r.ok for r in reports) and not watch.wrong
    assert sorted(watch.calls) == [0, 1]


def test_stripes_bring_every_chunks_first_stripe_before_any_chunks_third(
    pool_server: PoolServer,
) -> None:
    stripe = 3 * c.FRAG_BYTES
    reqs = requests(KEYS)
    order: list[tuple[int, int]] = []
    with FetchClient(pool_server.address, window=4, frags_per_get=1, **FAST) as client:
        reports = client.fetch_many(
            reqs, progress=lambda i, n: order.append((i, n)), stripe_bytes=stripe
        )
    assert all(r.ok for r in reports)
    reached = dict.fromkeys(range(len(KEYS)), 0)
    for i, n in order:
        if n > 2 * stripe:
            assert min(reached.values()) >= stripe, f"chunk {i} at {n} before {reached}"
        reached[i] = n
    assert reached == {i: len(CHUNKS[k]) for i, k in enumerate(KEYS)}


def test_without_stripes_the_earliest_chunk_goes_first(pool_server: PoolServer) -> None:
    reqs = requests(KEYS)
    order: list[tuple[int, int]] = []
    with FetchClient(pool_server.address, window=2, frags_per_get=1, **FAST) as client:
        client.fetch_many(reqs, progress=lambda i, n: order.append((i, n)))
    first_whole = next(i for i, n in order if n == len(CHUNKS[KEYS[i]]))
    first_last = next(k for k, (i, _) in enumerate(order) if i == len(KEYS) - 1)
    assert first_whole == 0
    assert order.index((0, len(CHUNKS[KEYS[0]]))) < first_last


def test_a_stripe_must_be_positive(pool_server: PoolServer) -> None:
    with (
        FetchClient(pool_server.address, **FAST) as client,
        pytest.raises(ValueError, match="stripe_bytes"),
    ):
        client.fetch_many(requests(KEYS[:1]), stripe_bytes=0)


# -------------------------------------------------------------- a MAC tenant's segments

BIG = 0x2100
BIG_CHUNK = os.urandom(3 * SEGMENT_BYTES + 1000)  # four segments, the last one short
SECRET = bytes(range(7, 39))


def big_pool(forged_segment: int | None) -> InMemoryBackend:
    """BIG with its true MAC object; one segment's bytes rewritten (CRCs served valid)."""
    b = InMemoryBackend()
    data = bytearray(BIG_CHUNK)
    if forged_segment is not None:
        at = forged_segment * SEGMENT_BYTES + 5
        data[at] ^= 0xFF
    b.put(TENANT, BIG, bytes(data))
    b.put(TENANT, mac_key_of(BIG), chunk_mac(SECRET, TENANT, BIG, BIG_CHUNK))
    return b


def fetch_big(
    service: InMemoryBackend, pool_copy: InMemoryBackend | None
) -> tuple[FetchReport, list[int], bool]:
    """BIG through fetch_many with progress: (report, reported lengths, all reported bytes true)."""
    dst = np.zeros(len(BIG_CHUNK), dtype=np.uint8)
    calls: list[int] = []
    true = [True]

    def progress(_i: int, n: int) -> None:
        calls.append(n)
        true[0] &= bytes(dst[:n]) == BIG_CHUNK[:n]

    with (
        PoolServer(service, "127.0.0.1", 0, cache_bytes=0) as srv,
        PoolServer(pool_copy or service, "127.0.0.1", 0, cache_bytes=0) as direct_pool,
        FetchClient(
            srv.address, direct_pool.address if pool_copy else None,
            mac_keys={TENANT: SECRET}, window=4, frags_per_get=4, **FAST,
        ) as client,
    ):  # fmt: skip
        (report,) = client.fetch_many([ChunkRequest(TENANT, BIG, dst)], progress=progress)
    return report, calls, true[0]


def test_a_mac_tenants_chunk_is_handed_on_segment_by_segment() -> None:
    report, calls, true = fetch_big(big_pool(None), None)
    assert report.ok and report.mac_verified and true
    assert calls[-1] == len(BIG_CHUNK) and len(calls) > 1
    assert all(n % SEGMENT_BYTES == 0 for n in calls[:-1])


def test_a_forged_later_segment_stops_the_chunk_after_the_segments_before_it() -> None:
    # Segments 0 and 1 were verified and handed on; segment 2 does not match. The repair would
    # rewrite bytes already handed on, so the chunk is not repaired: it is recomputed.
    report, calls, true = fetch_big(big_pool(2), big_pool(None))
    assert not report.ok and report.reason is RecomputeReason.MAC_MISMATCH
    assert report.mac_failures == 1 and not report.mac_repaired
    assert true and calls and max(calls) <= 2 * SEGMENT_BYTES


def test_a_forged_first_segment_is_repaired_from_the_pool_before_anything_is_handed_on() -> None:
    report, calls, true = fetch_big(big_pool(0), big_pool(None))
    assert report.ok and report.mac_repaired and true
    assert calls == [len(BIG_CHUNK)]
