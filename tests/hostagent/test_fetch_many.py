"""FetchClient.fetch_many: several chunks with their GETs in flight together."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

from hostagent.fetch import FetchClient
from kvcast import p4constants as c
from kvcast.backend import InMemoryBackend
from kvcast.fetch import ChunkRequest, FetchError, RecomputeReason
from kvcast.integrity import chunk_mac, mac_key_of
from kvcast.wire import KvpHeader, data_message
from poolnode.server import PoolServer
from tests.conftest import backend_holding
from tests.hostagent.fakes import Corrupting, Dropping, FakeServer, Gate, pool

# Each test runs on the native data path and on the pure-Python one.
pytestmark = pytest.mark.usefixtures("data_path")

TENANT = 5
KEYS = [0x1000 + i for i in range(6)]
# Chunks of different lengths (a short last fragment each), so a DATA of one chunk never fits
# another's shape by accident.
CHUNKS = {k: os.urandom((7 + i) * c.FRAG_BYTES - 11 * (i + 1)) for i, k in enumerate(KEYS)}
FAST: dict[str, Any] = {"timeout_s": 0.02, "max_timeout_s": 0.08, "max_retries": 2, "deadline_s": 5}
STEADY: dict[str, Any] = {"timeout_s": 0.2, "max_timeout_s": 0.4, "max_retries": 2}
STEADY["deadline_s"] = 10


@pytest.fixture
def backend() -> InMemoryBackend:
    return backend_holding(TENANT, CHUNKS)


def requests(keys: list[int]) -> list[ChunkRequest]:
    return [
        ChunkRequest(TENANT, k, torch.zeros(len(CHUNKS.get(k, b"x" * 999)), dtype=torch.uint8))
        for k in keys
    ]


def got(req: ChunkRequest) -> bytes:
    return req.dst.numpy().tobytes()


@pytest.mark.parametrize("in_flight", [1, 2, 4, 6])
def test_every_chunk_arrives_whole_and_unmixed(pool_server: PoolServer, in_flight: int) -> None:
    reqs = requests(KEYS)
    # One fragment per GET and a small window: the chunks' GETs interleave.
    with FetchClient(pool_server.address, window=4, frags_per_get=1, **STEADY) as client:
        reports = client.fetch_many(reqs, max_chunks_in_flight=in_flight)
    assert [r.key for r in reports] == KEYS
    for req, report in zip(reqs, reports, strict=True):
        assert report.ok and report.retries == 0
        assert report.frags_pool == report.frag_count
        assert got(req) == CHUNKS[req.key]


def test_the_next_chunks_gets_go_out_before_the_first_chunk_is_answered(
    backend: InMemoryBackend,
) -> None:
    keys = KEYS[:3]
    with FakeServer(Gate(backend, need=3)) as gate:
        reqs = requests(keys)
        with FetchClient(gate.address, window=32, **STEADY) as client:
            reports = client.fetch_many(reqs, max_chunks_in_flight=3)
    assert all(r.ok for r in reports)
    assert [got(r) for r in reqs] == [CHUNKS[k] for k in keys]


def test_one_chunk_at_a_time_leaves_the_gate_shut_for_the_first(
    backend: InMemoryBackend,
) -> None:
    with FakeServer(Gate(backend, need=2)) as gate:
        reqs = requests(KEYS[:2])
        with FetchClient(gate.address, window=32, **FAST) as client:
            reports = client.fetch_many(reqs, max_chunks_in_flight=1)
    # The second chunk's GETs go out only once the first has given up; they open the gate.
    assert reports[0].reason is RecomputeReason.NO_ANSWER
    assert reports[1].ok and got(reqs[1]) == CHUNKS[KEYS[1]]


class _CrossLabelling:
    """The pool, but the first answer to a GET for ``victim`` is a DATA of ``other`` carrying
    the GET's request id (a good CRC for ``other``'s bytes), then the true answer."""

    def __init__(self, backend: InMemoryBackend, victim: int, other: int) -> None:
        self.inner = pool(backend)
        self.victim, self.other = victim, other
        self.done = False

    def __call__(self, datagram: bytes) -> list[bytes]:
        hdr = KvpHeader.unpack(datagram)
        out = []
        if not self.done and hdr.op == c.KVP_OP_GET and hdr.key == self.victim:
            self.done = True
            data = CHUNKS[self.other]
            n = -(-len(data) // c.FRAG_BYTES)
            frag = data[: c.FRAG_BYTES]
            out.append(data_message(TENANT, self.other, 0, n, frag, req_id=hdr.req_id))
        return out + self.inner(datagram)


def test_a_data_of_another_chunk_in_flight_naming_this_chunks_get_is_not_taken(
    backend: InMemoryBackend,
) -> None:
    victim, other = KEYS[0], KEYS[1]
    with FakeServer(_CrossLabelling(backend, victim, other)) as srv:
        reqs = requests([victim, other])
        with FetchClient(srv.address, window=8, frags_per_get=1, **STEADY) as client:
            reports = client.fetch_many(reqs, max_chunks_in_flight=2)
    # The forged DATA names other's key: it is other's fragment 0 (its CRC binds it to that key
    # and index) or ignored, and never lands in victim's tensor.
    assert all(r.ok for r in reports)
    assert reports[0].frags_pool == reports[0].frag_count and reports[0].crc_failures == 0
    assert [got(r) for r in reqs] == [CHUNKS[victim], CHUNKS[other]]


def test_losses_and_corruption_are_repaired_per_chunk(backend: InMemoryBackend) -> None:
    class _Both:
        def __init__(self) -> None:
            self.drop = Dropping(backend, {2, 5})
            self.corrupt = Corrupting(backend, 3)

        def __call__(self, datagram: bytes) -> list[bytes]:
            if KvpHeader.unpack(datagram).key == KEYS[1]:
                return self.corrupt(datagram)
            return self.drop(datagram)

    with FakeServer(_Both()) as srv:
        reqs = requests(KEYS[:4])
        with FetchClient(srv.address, window=6, frags_per_get=2, **FAST) as client:
            reports = client.fetch_many(reqs, max_chunks_in_flight=4)
    assert all(r.ok for r in reports)
    assert reports[1].crc_failures == 1
    assert sum(r.retries for r in reports) >= 2
    assert [got(r) for r in reqs] == [CHUNKS[k] for k in KEYS[:4]]


def test_a_missing_chunk_fails_alone(pool_server: PoolServer) -> None:
    keys = [KEYS[0], 0xDEAD, KEYS[2], KEYS[3]]
    reqs = requests(keys)
    with FetchClient(pool_server.address, **FAST) as client:
        reports = client.fetch_many(reqs, max_chunks_in_flight=4)
    assert [r.ok for r in reports] == [True, False, True, True]
    assert reports[1].reason is RecomputeReason.NOT_FOUND
    assert got(reqs[2]) == CHUNKS[KEYS[2]] and got(reqs[3]) == CHUNKS[KEYS[3]]


def test_stop_after_failure_starts_no_further_chunk(pool_server: PoolServer) -> None:
    keys = [KEYS[0], 0xDEAD, *KEYS[2:]]
    with FetchClient(pool_server.address, **FAST) as client:
        reports = client.fetch_many(requests(keys), max_chunks_in_flight=2, stop_after_failure=True)
    # 0xDEAD fails while at most one later chunk is in flight: the rest never start.
    assert reports[1].reason is RecomputeReason.NOT_FOUND
    assert 2 <= len(reports) <= 3


def test_each_chunks_mac_is_checked(backend: InMemoryBackend) -> None:
    secret = bytes(range(32))
    for k in KEYS[:3]:
        backend.put(TENANT, mac_key_of(k), chunk_mac(secret, TENANT, k, CHUNKS[k]))
    backend.put(TENANT, mac_key_of(KEYS[1]), bytes(32))  # a wrong MAC for the middle chunk
    with (
        PoolServer(backend, "127.0.0.1", 0, cache_bytes=0) as srv,
        FetchClient(srv.address, mac_keys={TENANT: secret}, **FAST) as client,
    ):
        reports = client.fetch_many(requests(KEYS[:3]), max_chunks_in_flight=3)
    assert [r.mac_verified for r in reports] == [True, False, True]
    assert reports[1].reason is RecomputeReason.MAC_MISMATCH


def test_bad_requests_raise_before_anything_is_sent(backend: InMemoryBackend) -> None:
    bad = ChunkRequest(TENANT, KEYS[0], torch.zeros(4, dtype=torch.float32))
    with FakeServer(pool(backend)) as srv, FetchClient(srv.address, **FAST) as client:
        with pytest.raises(FetchError):
            client.fetch_many([*requests(KEYS[:1]), bad])
        with pytest.raises(ValueError, match="max_chunks_in_flight"):
            client.fetch_many(requests(KEYS[:1]), max_chunks_in_flight=0)
        assert srv.received == 0
    with pytest.raises(ValueError, match="max_chunks_in_flight"):
        FetchClient(("127.0.0.1", 9), max_chunks_in_flight=65)


def test_the_same_chunk_twice_is_fetched_twice(pool_server: PoolServer) -> None:
    reqs = requests([KEYS[0], KEYS[1], KEYS[0]])
    with FetchClient(pool_server.address, window=4, frags_per_get=1, **STEADY) as client:
        reports = client.fetch_many(reqs, max_chunks_in_flight=3)
    assert all(r.ok and r.retries == 0 for r in reports)
    assert [got(r) for r in reqs] == [CHUNKS[KEYS[0]], CHUNKS[KEYS[1]], CHUNKS[KEYS[0]]]


def test_request_ids_are_not_reused_across_many_fetches(pool_server: PoolServer) -> None:
    # The pool node drops a GET it has seen (same key, range and request id) as a duplicate:
    # a client reusing request ids for repeated fetches of a chunk would lose GETs.
    with FetchClient(pool_server.address, **STEADY) as client:
        reports = [r for _ in range(150) for r in client.fetch_many(requests(KEYS[:2]))]
    assert all(r.ok for r in reports)
    assert sum(r.retries for r in reports) == 0


class _FullSendBuffer:
    """A path's connected socket whose send buffer refuses every third GET (EAGAIN).

    On the native path it also stands in for ``kvcast._native.send_gets`` (``client._native``
    is swapped for this object, every other function passing through): each batch is cut at
    the next refusal, and the batch sizes are kept.
    """

    def __init__(self, sock: Any, native: Any) -> None:
        self.sock, self.native = sock, native
        self.calls = 0
        self.refused = 0
        self.batches: list[int] = []

    def fileno(self) -> int:
        return int(self.sock.fileno())

    def send(self, msg: Any) -> int:
        self.calls += 1
        if self.calls % 3 == 0:
            self.refused += 1
            raise BlockingIOError
        return int(self.sock.send(msg))

    def send_gets(self, fd: int, buf: Any, slot: int, count: int) -> int:
        self.batches.append(count)
        self.calls += 1
        if self.calls % 3 == 0:
            self.refused += 1
            return 0
        take = min(count, 2)
        return int(self.native.send_gets(fd, buf, slot, take))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.native, name)


def test_gets_a_full_send_buffer_refused_are_taken_back_and_sent_later(
    pool_server: PoolServer,
) -> None:
    reqs = requests(KEYS[:4])
    with FetchClient(pool_server.address, window=8, frags_per_get=1, **STEADY) as client:
        path = client.paths[0]
        assert path.sock is not None
        full = _FullSendBuffer(path.sock, client._native)
        path.sock = full  # type: ignore[assignment]
        if client._native is not None:
            client._native = full  # type: ignore[assignment]
        reports = client.fetch_many(reqs, max_chunks_in_flight=4)
    for req, report in zip(reqs, reports, strict=True):
        assert report.ok and got(req) == CHUNKS[req.key]
        # A refused GET was never left in flight to time out and be retried.
        assert report.retries == report.timeouts == 0
    assert full.refused > 0
    # Every GET counted as sent reached the pool node, and only those.
    assert sum(r.gets_sent for r in reports) == pool_server.stats.gets
    if client._native is not None:
        assert max(full.batches) > 1  # several GETs due at once went out together
