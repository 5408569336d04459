"""The pool-node server: GET -> DATA/NACK logic (transport-free) and the UDP loops on loopback."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
from collections.abc import Iterator

import pytest

from kvcast import p4constants as c
from kvcast.backend import InMemoryBackend, PoolBackendError
from kvcast.wire import KvpHeader, fragment_crc, get_message
from poolnode.groups import StaticGroups
from poolnode.server import (
    MAX_GET_FRAGMENTS,
    ChunkCache,
    DataAnswer,
    KvpGetHandler,
    PoolServer,
    Reply,
    frags_per_data,
    serve_asyncio,
)
from tests.conftest import backend_holding

TENANT, KEY = 7, 0xFEEDFACECAFEBEEF
NFRAGS = 23
CHUNK = os.urandom(NFRAGS * c.FRAG_BYTES - 100)  # last fragment shorter


@pytest.fixture
def backend() -> InMemoryBackend:
    return backend_holding(TENANT, {KEY: CHUNK})


@pytest.fixture
def handler(backend: InMemoryBackend) -> KvpGetHandler:
    return KvpGetHandler(backend, groups=StaticGroups([5]))


def decode(replies: list[Reply]) -> list[tuple[KvpHeader, bytes]]:
    return [(KvpHeader.unpack(h), bytes(p)) for h, p in replies]


def test_get_of_a_range_is_answered_by_data_covering_it(handler: KvpGetHandler) -> None:
    out = decode(handler.handle(get_message(TENANT, KEY, 2, req_id=99, count=12)))
    assert b"".join(p for _, p in out) == CHUNK[2 * c.FRAG_BYTES : 14 * c.FRAG_BYTES]
    assert [h.frag_idx for h, _ in out] == list(range(2, 14, handler.frags_per_data))


def test_data_echoes_request_and_says_pool(handler: KvpGetHandler) -> None:
    (hdr, _), *_ = decode(handler.handle(get_message(TENANT, KEY, 0, req_id=99, group=5)))
    assert (hdr.op, hdr.flags, hdr.tenant, hdr.key, hdr.req_id, hdr.group) == (
        c.KVP_OP_DATA,
        c.KVP_FLAG_POOL,
        TENANT,
        KEY,
        99,
        5,
    )
    assert hdr.frag_count == NFRAGS


def test_every_data_carries_a_valid_crc(handler: KvpGetHandler) -> None:
    for hdr, payload in decode(handler.handle(get_message(TENANT, KEY, 0, count=NFRAGS))):
        assert hdr.payload_len == len(payload)
        assert hdr.crc == fragment_crc(TENANT, KEY, hdr.frag_idx, payload)


def test_last_fragment_is_the_short_tail(handler: KvpGetHandler) -> None:
    (hdr, payload), *_ = decode(handler.handle(get_message(TENANT, KEY, NFRAGS - 1)))
    assert payload == CHUNK[(NFRAGS - 1) * c.FRAG_BYTES :]


def test_default_data_fits_a_1500_byte_mtu(handler: KvpGetHandler) -> None:
    for h, p in handler.handle(get_message(TENANT, KEY, 0, count=NFRAGS)):
        assert c.IPV4_HDR_BYTES + c.UDP_HDR_BYTES + len(h) + len(p) <= 1500
    assert handler.frags_per_data == frags_per_data(1500) >= 1


def test_smaller_mtu_packs_fewer_fragments(backend: InMemoryBackend) -> None:
    mtu = c.IPV4_HDR_BYTES + c.UDP_HDR_BYTES + c.KVP_HDR_BYTES + c.FRAG_BYTES
    small = KvpGetHandler(backend, mtu=mtu)
    assert len(small.handle(get_message(TENANT, KEY, 0, count=4))) == 4


def test_mtu_too_small_for_one_fragment_is_refused(backend: InMemoryBackend) -> None:
    with pytest.raises(ValueError, match="MTU"):
        KvpGetHandler(backend, mtu=c.FRAG_BYTES)


def test_unknown_key_is_nacked_not_found(handler: KvpGetHandler) -> None:
    [(hdr, payload)] = decode(handler.handle(get_message(TENANT, KEY + 1, 0, req_id=3)))
    assert (hdr.op, hdr.status, hdr.req_id, payload) == (
        c.KVP_OP_NACK,
        c.KVP_STATUS_NOT_FOUND,
        3,
        b"",
    )
    assert handler.stats.nack_not_found == 1


@pytest.mark.parametrize(("first", "count"), [(NFRAGS, 1), (NFRAGS - 2, 3), (0, 0)])
def test_fragments_outside_the_chunk_are_nacked_bad_request(
    handler: KvpGetHandler, first: int, count: int
) -> None:
    [(hdr, _)] = decode(handler.handle(get_message(TENANT, KEY, first, count=count)))
    assert (hdr.op, hdr.status) == (c.KVP_OP_NACK, c.KVP_STATUS_BAD_REQUEST)
    assert handler.stats.nack_bad_request == 1


def test_get_without_its_placeholder_is_nacked_bad_request(handler: KvpGetHandler) -> None:
    [(hdr, _)] = decode(handler.handle(get_message(TENANT, KEY, 0)[: c.KVP_HDR_BYTES]))
    assert hdr.status == c.KVP_STATUS_BAD_REQUEST


@pytest.mark.parametrize(
    "datagram",
    [
        b"",
        b"\x11" * 10,
        bytes([0x21]) + get_message(TENANT, KEY, 0)[1:],  # version 2
        bytes([0x1F]) + get_message(TENANT, KEY, 0)[1:],  # op 15
    ],
)
def test_malformed_datagrams_are_counted_and_dropped(
    handler: KvpGetHandler, datagram: bytes
) -> None:
    assert handler.handle(datagram) == []
    assert handler.stats.malformed == 1


def test_non_get_operations_are_counted_and_dropped(handler: KvpGetHandler) -> None:
    data = KvpHeader(c.KVP_OP_DATA, tenant=TENANT, key=KEY).pack()
    assert handler.handle(data) == []
    assert handler.stats.unexpected_op == 1


def test_backend_failure_is_nacked_unavailable() -> None:
    class Broken(InMemoryBackend):
        def size(self, tenant: int, key: int) -> int | None:
            raise PoolBackendError("master unreachable")

    handler = KvpGetHandler(Broken())
    [(hdr, _)] = decode(handler.handle(get_message(TENANT, KEY, 0)))
    assert hdr.status == c.KVP_STATUS_UNAVAILABLE
    assert handler.stats.nack_unavailable == 1


def test_a_burst_of_gets_reads_the_backend_once(handler: KvpGetHandler) -> None:
    for first in range(NFRAGS):
        handler.handle(get_message(TENANT, KEY, first))
    assert handler.stats.backend_reads == 1
    assert handler.stats.cache_hits == NFRAGS - 1


def test_chunk_cache_evicts_least_recently_used_within_its_bound() -> None:
    cache = ChunkCache(max_bytes=250)
    for key in range(3):
        cache.put(0, key, memoryview(bytes(100)))
    assert cache.get(0, 0) is None
    assert cache.get(0, 2) is not None
    assert cache.used == 2 * (100 + 8)  # each chunk and its CRC table (8 B per fragment)


def test_a_chunk_put_again_gets_a_fresh_crc_table() -> None:
    cache = ChunkCache(max_bytes=1 << 20)
    cache.put(0, 1, memoryview(bytes(1000)))  # 4 fragments
    table = cache.crcs(0, 1)
    assert table is not None and len(table) == 32 and not any(table)
    table[:8] = b"\x01" * 8
    cache.put(0, 1, memoryview(bytes(1000)))
    again = cache.crcs(0, 1)
    assert again is not None and not any(again)  # nothing computed from the old bytes is kept
    assert cache.used == 1000 + 32
    cache.invalidate(0, 1)
    assert cache.crcs(0, 1) is None and cache.used == 0


def test_chunk_cache_skips_chunks_larger_than_its_bound() -> None:
    cache = ChunkCache(max_bytes=50)
    cache.put(0, 1, memoryview(bytes(51)))
    assert len(cache) == 0


@pytest.fixture
def server(backend: InMemoryBackend) -> Iterator[PoolServer]:
    with PoolServer(backend, "127.0.0.1", 0) as srv:
        yield srv


@pytest.fixture
def client() -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(5)
    yield sock
    sock.close()


def test_server_replies_to_the_requesters_address(
    server: PoolServer, client: socket.socket
) -> None:
    client.sendto(get_message(TENANT, KEY, 0, req_id=11), server.address)
    data, src = client.recvfrom(65536)
    hdr = KvpHeader.unpack(data)
    assert (hdr.op, hdr.req_id, src[1]) == (c.KVP_OP_DATA, 11, server.address[1])
    assert data[c.KVP_HDR_BYTES :] == CHUNK[: hdr.payload_len]


def test_server_keeps_serving_after_garbage(server: PoolServer, client: socket.socket) -> None:
    # Random bytes behind a version nibble of 15: without it, 1 draw in 256 starts with 0x11
    # (version 1, GET), which is a well-formed header of a wrong-length GET and earns a NACK.
    noise = bytes([0xF0]) + os.urandom(1999)
    for junk in (b"", b"\xff" * 3, noise, struct.pack("!B", 0x12) * 40):
        client.sendto(junk, server.address)
    client.sendto(get_message(TENANT, KEY, 1, req_id=12), server.address)
    hdr = KvpHeader.unpack(client.recv(65536))
    assert (hdr.req_id, hdr.frag_idx) == (12, 1)
    assert server.stats.malformed + server.stats.unexpected_op == 4


def test_asyncio_server_answers_a_get(backend: InMemoryBackend) -> None:
    async def scenario() -> KvpHeader:
        transport, protocol = await serve_asyncio(backend, "127.0.0.1", 0)
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.setblocking(False)
        try:
            sock.sendto(get_message(TENANT, KEY, 3, req_id=5), transport.get_extra_info("sockname"))
            data = await asyncio.wait_for(loop.sock_recv(sock, 65536), 5)
        finally:
            sock.close()
            transport.close()
        assert protocol.handler.stats.data_sent == 1
        return KvpHeader.unpack(data)

    hdr = asyncio.run(scenario())
    assert (hdr.op, hdr.req_id, hdr.frag_idx) == (c.KVP_OP_DATA, 5, 3)


def test_a_get_delivered_twice_is_answered_once_and_counted(backend: InMemoryBackend) -> None:
    handler = KvpGetHandler(backend, dedup_window=2)
    get = get_message(TENANT, KEY, 0, req_id=41, count=5)
    assert len(handler.handle(get)) == 1
    assert handler.handle(get) == []  # the network's copy: nothing sent again
    assert handler.stats.duplicate_gets == 1
    # A client's retry carries a new request id and is always answered.
    assert len(handler.handle(get_message(TENANT, KEY, 0, req_id=42, count=5))) == 1
    # The window is bounded: after two newer GETs the first is forgotten and answered again.
    handler.handle(get_message(TENANT, KEY, 5, req_id=43, count=5))
    assert len(handler.handle(get)) == 1
    assert len(KvpGetHandler(backend, dedup_window=0).handle(get)) == 1


def test_duplicates_are_told_apart_by_range_and_group(handler: KvpGetHandler) -> None:
    a = get_message(TENANT, KEY, 0, req_id=7, count=5)
    b = get_message(TENANT, KEY, 5, req_id=7, count=5)
    assert handler.handle(a) and handler.handle(b)
    assert handler.stats.duplicate_gets == 0


@pytest.mark.parametrize("gso", [False, True])
@pytest.mark.parametrize("mtu", [1500, 9000])
def test_the_server_sends_exactly_the_handlers_datas_on_both_data_paths(
    data_path: str, backend: InMemoryBackend, client: socket.socket, mtu: int, gso: bool
) -> None:
    # The native path builds headers and CRCs in C (send_data); the bytes on the wire must be
    # the Python path's, DATA for DATA, including the short tail and a group echo; with gso
    # (native only: the Python path sends one datagram per DATA either way) several DATAs leave
    # as one UDP GSO message and arrive as the same datagrams.
    reference = KvpGetHandler(backend, mtu=mtu, groups=StaticGroups([9]))
    gets = [
        get_message(TENANT, KEY, 0, req_id=70, count=NFRAGS),
        get_message(TENANT, KEY, 4, req_id=71, count=NFRAGS - 4, group=9),
        get_message(TENANT, KEY, NFRAGS - 1, req_id=72),
    ]
    gets.append(get_message(TENANT, KEY, 0, req_id=73, count=NFRAGS))  # again: cached CRCs
    expected = [h + bytes(p) for g in gets for h, p in reference.handle(g)]
    with PoolServer(backend, "127.0.0.1", 0, mtu=mtu, gso=gso, groups=StaticGroups([9])) as srv:
        for g in gets:
            client.sendto(g, srv.address)
        got = [client.recv(65536) for _ in expected]
        client.settimeout(0.2)
        with pytest.raises(TimeoutError):
            client.recv(65536)  # nothing beyond the handler's replies
        assert got == expected
        assert srv.stats.data_sent == reference.stats.data_sent == len(expected)
        assert srv.stats.bytes_sent == sum(len(d) for d in expected)
        assert srv.stats.send_errors == srv.stats.internal_errors == 0
        assert srv.stats.data_payload_bytes == reference.stats.data_payload_bytes


def test_a_queued_burst_of_hostile_datagrams_gets_the_handlers_answers_on_both_data_paths(
    data_path: str, backend: InMemoryBackend, client: socket.socket
) -> None:
    # Queued before the server reads anything, so the native path takes them in recvmmsg
    # batches (more than one: 64 per call): the replies, their order and every counter must be
    # the Python path's, one recvfrom per datagram.
    good = get_message(TENANT, KEY, 0, req_id=1, count=NFRAGS)
    data_op = bytearray(get_message(TENANT, KEY, 0, req_id=9))
    data_op[0] = (c.KVP_VERSION << 4) | c.KVP_OP_DATA
    burst = [
        good,
        good,  # a duplicate: dropped
        b"\x11" * 12,  # too short for a header: malformed, no reply
        get_message(TENANT, KEY, 0, req_id=2, count=MAX_GET_FRAGMENTS + 1),  # oversized: NACK
        get_message(TENANT, KEY + 1, 0, req_id=3),  # not found: NACK
        get_message(TENANT, KEY, NFRAGS - 1, req_id=4, count=2),  # past the end: NACK
        get_message(TENANT, KEY, 0, req_id=5)[:-1],  # no full placeholder: NACK
        bytes(data_op),  # not a GET: counted, no reply
        bytes(60_000),  # a large datagram of zeros: malformed
    ]
    burst += [get_message(TENANT, KEY, i % NFRAGS, req_id=100 + i) for i in range(70)]
    reference = KvpGetHandler(backend)
    expected = [h + bytes(p) for d in burst for h, p in reference.handle(d)]
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    srv = PoolServer(backend, "127.0.0.1", 0)
    srv.bind()
    try:
        for d in burst:
            client.sendto(d, srv.address)
        srv.start()
        got = [client.recv(65536) for _ in expected]
        client.settimeout(0.2)
        with pytest.raises(TimeoutError):
            client.recv(65536)
    finally:
        srv.stop()
    assert got == expected
    ours, theirs = srv.stats.as_dict(), reference.stats.as_dict()
    assert ours.pop("bytes_sent") == sum(len(d) for d in expected)
    theirs.pop("bytes_sent")
    assert ours == theirs and ours["duplicate_gets"] == 1 and ours["malformed"] == 2


def test_a_served_get_is_an_answer_whose_datas_are_the_handlers_replies(
    handler: KvpGetHandler,
) -> None:
    get = get_message(TENANT, KEY, 2, req_id=80, count=NFRAGS - 2)
    answer = handler.answer(get)
    assert isinstance(answer, DataAnswer)
    assert (answer.first, answer.end, bytes(answer.chunk)) == (2, NFRAGS, CHUNK)
    hdr = KvpHeader.unpack(answer.header)
    assert (hdr.op, hdr.flags, hdr.req_id, hdr.frag_count) == (
        c.KVP_OP_DATA,
        c.KVP_FLAG_POOL,
        80,
        NFRAGS,
    )
    replies = handler.data_replies(answer)
    assert replies == KvpGetHandler(handler.backend).handle(get)
    assert answer.wire_bytes == sum(len(h) + len(p) for h, p in replies)
    # A refusal is the NACK to send, not a range to serve.
    nack = handler.answer(get_message(TENANT, KEY + 1, 0, req_id=81))
    assert isinstance(nack, list) and len(nack) == 1
    hdr = KvpHeader.unpack(nack[0][0])
    assert (hdr.op, hdr.status, hdr.req_id) == (c.KVP_OP_NACK, c.KVP_STATUS_NOT_FOUND, 81)


def test_an_answer_carries_the_crc_table_cached_with_its_chunk(backend: InMemoryBackend) -> None:
    get = get_message(TENANT, KEY, 0, req_id=90, count=NFRAGS)
    cached = KvpGetHandler(backend).answer(get)
    assert isinstance(cached, DataAnswer) and cached.crcs is not None
    assert len(cached.crcs) == 8 * NFRAGS
    uncached = KvpGetHandler(backend, cache_bytes=0).answer(get)
    assert isinstance(uncached, DataAnswer) and uncached.crcs is None  # computed every time


def test_a_path_that_refuses_gso_turns_it_off_and_the_get_is_still_answered(
    backend: InMemoryBackend, client: socket.socket
) -> None:
    # A socket without UDP checksums (SO_NO_CHECK) cannot send GSO messages: the kernel refuses
    # them (EINVAL), as a path without checksum offload would. The node must answer anyway,
    # one datagram per DATA, and stop trying GSO.
    from kvcast.native import enabled

    if enabled() is None:
        pytest.skip("kvcast._native not in use (not built, or KVCAST_NATIVE=0): GSO needs it")
    reference = KvpGetHandler(backend, mtu=1500)
    get = get_message(TENANT, KEY, 0, req_id=80, count=NFRAGS)
    expected = [h + bytes(p) for h, p in reference.handle(get)]
    assert len(expected) > 1  # several DATAs: one GSO message
    srv = PoolServer(backend, "127.0.0.1", 0, mtu=1500, gso=True)
    srv.bind().setsockopt(socket.SOL_SOCKET, 11, 1)  # SO_NO_CHECK (Linux)
    with srv:
        client.sendto(get, srv.address)
        got = [client.recv(65536) for _ in expected]
        assert got == expected
        assert srv.gso == 0 and srv.stats.send_errors == 0
