"""The native data path module against its pure-Python equivalents."""

from __future__ import annotations

import os
import shutil
import socket
import sys
import zlib
from array import array
from collections.abc import Iterator

import pytest

from kvcast import p4constants as c
from kvcast.native import describe, native
from kvcast.wire import chunk_crc_seed, data_message, get_message

needs_native = pytest.mark.skipif(
    native is None, reason="kvcast._native not built (make setup compiles it with gcc)"
)
UdpPair = tuple[socket.socket, socket.socket]


@pytest.fixture
def udp() -> Iterator[UdpPair]:
    """A receiving UDP socket bound on loopback and a sending one, both closed afterwards."""
    with (
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as rx,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx,
    ):
        rx.bind(("127.0.0.1", 0))
        yield rx, tx


def test_the_extension_is_built_wherever_a_compiler_is() -> None:
    if shutil.which("gcc") is None:
        pytest.skip("gcc not installed: the pure-Python paths run")
    assert native is not None, "pip install -e . should have compiled kvcast/_native.c"
    assert describe() in ("native", "python (KVCAST_NATIVE=0)")


@needs_native
@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 255, 256, 1000, 8704])
def test_crc32_is_zlibs(n: int) -> None:
    assert native is not None
    data = os.urandom(n)
    for seed in (0, 0x1234ABCD, 0xFFFFFFFF):
        assert native.crc32(data, seed) == zlib.crc32(data, seed)
        assert native.crc32(memoryview(data)[1:], seed) == zlib.crc32(data[1:], seed)


@needs_native
@pytest.mark.parametrize("impl", ["tables", "pclmul", "vpclmul"])
def test_every_crc32_implementation_is_zlibs_at_every_length(impl: str) -> None:
    """Each length from 0 to 1,100 bytes (every tail and fold boundary), then larger ones."""
    assert native is not None
    try:
        native.crc32_with(impl, b"")
    except ValueError:
        pytest.skip(f"the processor has no {impl}")
    data = os.urandom(70_000)
    for n in [*range(1101), 8704, 65_536, 69_999]:
        seed = n * 0x9E3779B1 & 0xFFFFFFFF
        assert native.crc32_with(impl, data[:n], seed) == zlib.crc32(data[:n], seed), n
    assert native.crc32_with(impl, memoryview(data)[3:300]) == zlib.crc32(data[3:300])


@needs_native
def test_crc32_with_refuses_an_unknown_implementation() -> None:
    assert native is not None
    with pytest.raises(ValueError, match="not available"):
        native.crc32_with("sse9", b"x")
    assert native.crc_impl() in ("vpclmul", "pclmul", "zlib", "tables")


@needs_native
def test_recv_datagrams_gives_each_datagram_whole_with_its_sender_and_refuses_small_buffers(
    udp: UdpPair,
) -> None:
    assert native is not None
    rx, tx = udp
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    tx.bind(("127.0.0.1", 0))
    buf = bytearray(65536 * native.MAX_BATCH)
    assert native.recv_datagrams(rx.fileno(), buf, 65536) == []  # nothing queued
    sizes = [0, 1, 296, 65_507] + [i + 40 for i in range(native.MAX_BATCH)]
    sent = [os.urandom(n) for n in sizes]
    for d in sent:
        tx.sendto(d, rx.getsockname())
    port = tx.getsockname()[1]
    got: list[bytes] = []
    while len(got) < len(sent):
        batch = native.recv_datagrams(rx.fileno(), buf, 65536)
        assert 0 < len(batch) <= native.MAX_BATCH
        for m, (n, ip, sport) in enumerate(batch):
            assert (ip, sport) == (0x7F000001, port)
            got.append(bytes(buf[m * 65536 : m * 65536 + n]))
    assert got == sent
    with pytest.raises(ValueError):
        native.recv_datagrams(rx.fileno(), buf, 2048)  # a datagram could be cut short
    with pytest.raises(ValueError):
        native.recv_datagrams(rx.fileno(), bytearray(65536), 65536)


@needs_native
def test_send_batch_sends_each_pair_as_one_datagram(udp: UdpPair) -> None:
    assert native is not None
    rx, tx = udp
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)  # 300 datagrams queue up
    rx.settimeout(2)
    port = rx.getsockname()[1]

    def pair(i: int) -> tuple[bytes, memoryview]:
        return i.to_bytes(3, "big"), memoryview(bytes([i % 251]) * (i % 50 + 1))

    msgs = [pair(i) for i in range(300)]  # more than one sendmmsg batch (256)
    sent = native.send_batch(tx.fileno(), (0x7F000001, port), msgs)
    assert sent == sum(3 + i % 50 + 1 for i in range(300))
    for i in range(300):
        header, payload = pair(i)
        assert rx.recv(2048) == header + bytes(payload)
    with pytest.raises(TypeError):
        native.send_batch(tx.fileno(), (0x7F000001, port), [b"not a pair"])


@needs_native
def test_recv_fetch_takes_owned_data_and_returns_the_rest(udp: UdpPair) -> None:
    assert native is not None
    tenant, key, n, rid_base = 3, 0xABC, 4, 1000
    chunk = os.urandom(n * c.FRAG_BYTES - 10)
    rx, tx = udp
    tx.bind(("127.0.0.1", 0))
    to = rx.getsockname()
    fb = c.FRAG_BYTES
    # rid 1000 asked for fragments 0-1, rid 1001 for 2-3.
    owner = array("L", [1000, 1000, 1001, 1001])
    frag = bytearray([1, 1, 1, 1])
    good = data_message(tenant, key, 0, n, chunk[: 2 * fb], req_id=1000)
    corrupt = bytearray(data_message(tenant, key, 2, n, chunk[2 * fb :], req_id=1001))
    corrupt[-1] ^= 1
    stolen = data_message(tenant, key, 2, n, chunk[2 * fb :], req_id=1000)  # not its range
    other = data_message(tenant, key + 1, 0, n, chunk[:fb], req_id=1000)
    # A replica of our group (7) for fragment 3: counted in the stream buffer, no event.
    replica = data_message(tenant, key, 3, n, chunk[3 * fb :], req_id=5, group=7,
                           flags=c.KVP_FLAG_HIT | c.KVP_FLAG_REPLICA)  # fmt: skip
    for msg in (good, bytes(corrupt), stolen, other, replica):
        tx.sendto(msg, to)
    out = bytearray(len(chunk))
    events = array("q", bytes(8 * native.MAX_BATCH * native.EVENT_FIELDS))
    stream = array("q", bytes(8 * native.STREAM_FIELDS))
    rxbuf = bytearray(65536 * native.MAX_BATCH)
    seed = chunk_crc_seed(tenant, key)
    nev, slow, foreign, _ = native.recv_fetch(
        rx.fileno(), rxbuf, 65536, True, (), tx.getsockname()[1],
        (c.KVP_VERSION << 4) | c.KVP_OP_DATA, tenant, key, 0, 7, seed, len(chunk), fb,
        rid_base, 2, out, frag, owner, events, stream,
    )  # fmt: skip
    assert foreign == 0 and nev == 2
    first = list(events[0:7])
    assert first == [1000, 0, 2, 2, c.KVP_FLAG_POOL, 1, 0]
    assert list(events[7:14])[3:6] == [0, c.KVP_FLAG_POOL, 0]  # the corrupted one: CRC fails
    assert list(stream)[:5] == [1, 0, 0, 0, 4]  # one new fragment from SRAM, up to fragment 4
    assert list(stream)[5:] == [4, 2]  # the next DATA is expected at 4, of up to 2 fragments
    assert bytes(out[: 2 * fb]) == chunk[: 2 * fb] and frag == bytearray([2, 2, 1, 2])
    assert bytes(out[3 * fb :]) == chunk[3 * fb :]
    assert [bytes(s) for s in slow] == [stolen, other]


@needs_native
def test_recv_fetch_takes_several_batches_per_call_and_stops_when_the_fetch_is_complete(
    udp: UdpPair,
) -> None:
    """A queue of 300 replicas is drained in one call (5 recvmmsg batches); a fetch that
    completes in a full batch ends the call there, leaving what follows in the socket."""
    assert native is not None
    tenant, key, group, fb = 3, 0xABC, 7, c.FRAG_BYTES

    def stream(k: int, n: int, chunk: bytes) -> list[bytes]:
        return [
            data_message(
                tenant,
                k,
                i,
                n,
                chunk[i * fb : (i + 1) * fb],
                group=group,
                flags=c.KVP_FLAG_HIT | c.KVP_FLAG_REPLICA,
            )  # fmt: skip
            for i in range(n)
        ]

    def receive(k: int, n: int, chunk_len: int) -> tuple[int, bytearray, bytearray, list[int]]:
        out, frag = bytearray(chunk_len), bytearray(n)
        st = array("q", bytes(8 * native.STREAM_FIELDS))
        nev, slow, _, drained = native.recv_fetch(
            rx.fileno(), rxbuf, 65536, False, (), c.KVP_UDP_PORT,
            (c.KVP_VERSION << 4) | c.KVP_OP_DATA, tenant, k, 0, group,
            chunk_crc_seed(tenant, k), chunk_len, fb, 0, 0, out, frag,
            array("L", bytes(8 * n)), events, st,
        )  # fmt: skip
        assert nev == 0 and slow == []
        return drained, out, frag, list(st)

    long_chunk, one_batch = os.urandom(300 * fb), os.urandom(native.MAX_BATCH * fb)
    events = array("q", bytes(8 * native.MAX_BATCH * native.EVENT_FIELDS))
    rxbuf = bytearray(65536 * native.MAX_BATCH)
    rx, tx = udp
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    for msg in stream(key, 300, long_chunk):
        tx.sendto(msg, rx.getsockname())
    drained, out, frag, st = receive(key, 300, len(long_chunk))
    assert drained == 1 and bytes(out) == long_chunk and st[:5] == [300, 0, 0, 0, 300]
    # One full batch completes the chunk; 100 datagrams of the next one wait behind it.
    for msg in stream(key, native.MAX_BATCH, one_batch) + stream(key + 1, 100, long_chunk):
        tx.sendto(msg, rx.getsockname())
    drained, out, frag, st = receive(key, native.MAX_BATCH, len(one_batch))
    assert drained == 0 and bytes(out) == one_batch and frag.count(2) == native.MAX_BATCH
    assert native.recv_count(rx.fileno(), rxbuf, 65536, 100, 200) == (100, 100 * (40 + fb))


@needs_native
def test_recv_fetch_books_consecutive_datas_of_one_get_as_one_event(udp: UdpPair) -> None:
    """A pool node answers a GET with several DATAs in a row: one event for the run (its range
    and new fragments summed); a duplicate, a bad CRC or another GET starts a new event."""
    assert native is not None
    tenant, key, n, fb = 3, 0xABC, 8, c.FRAG_BYTES
    chunk = os.urandom(n * fb)

    def data(first: int, rid: int) -> bytes:
        return data_message(tenant, key, first, n, chunk[first * fb : (first + 2) * fb],
                            req_id=rid)  # fmt: skip

    bad = bytearray(data(6, 1001))
    bad[-1] ^= 1
    order = [data(0, 1000), data(2, 1000), data(4, 1000), data(2, 1000), data(6, 1001)]
    order += [bytes(bad)]
    owner = array("L", [1000] * 6 + [1001] * 2)
    frag = bytearray([1] * n)
    out = bytearray(len(chunk))
    events = array("q", bytes(8 * native.MAX_BATCH * native.EVENT_FIELDS))
    rx, tx = udp
    for msg in order:
        tx.sendto(msg, rx.getsockname())
    nev, slow, _, _ = native.recv_fetch(
        rx.fileno(), bytearray(65536 * native.MAX_BATCH), 65536, False, (), c.KVP_UDP_PORT,
        (c.KVP_VERSION << 4) | c.KVP_OP_DATA, tenant, key, 0, 0, chunk_crc_seed(tenant, key),
        len(chunk), fb, 1000, 2, out, frag, owner, events,
        array("q", bytes(8 * native.STREAM_FIELDS)),
    )  # fmt: skip
    pool = c.KVP_FLAG_POOL
    assert slow == [] and nev == 4
    assert [list(events[i * 7 : i * 7 + 7]) for i in range(nev)] == [
        [1000, 0, 6, 6, pool, 1, 0],  # three DATAs, one event
        [1000, 2, 4, 0, pool, 1, 0],  # the duplicate
        [1001, 6, 8, 2, pool, 1, 0],
        [1001, 6, 8, 0, pool, 0, 0],  # the bad CRC: nothing new
    ]
    assert bytes(out) == chunk and frag == bytearray([2] * n)


@needs_native
def test_recv_fetch_receives_predicted_data_in_place_and_never_over_a_present_fragment(
    udp: UdpPair,
) -> None:
    """The scatter of recv_fetch: a DATA predicted for its slot lands in the tensor directly
    (its slot in the batch buffer stays untouched); a fragment already PRESENT is never a
    destination, so a forged copy with a valid CRC cannot overwrite it; a DATA that lands in
    another's predicted place is put back together and checked like any other; bad bytes in
    place are never marked PRESENT."""
    assert native is not None
    tenant, key, n, per, group = 3, 0xABC, 16, 4, 7
    fb = c.FRAG_BYTES
    chunk = os.urandom(n * fb)

    def data(first: int, body: bytes | None = None) -> bytes:
        payload = chunk[first * fb : (first + per) * fb] if body is None else body
        return data_message(tenant, key, first, n, payload, group=group,
                            flags=c.KVP_FLAG_POOL | c.KVP_FLAG_REPLICA)  # fmt: skip

    forged = data(0, os.urandom(per * fb))  # valid CRC, other bytes, for fragments held
    bad = bytearray(data(12))
    bad[-1] ^= 1
    order = [forged, data(4), bytes(bad), data(8), data(12)]
    out = bytearray(b"\xee" * len(chunk))
    out[: per * fb] = chunk[: per * fb]
    frag = bytearray([2] * per + [0] * (n - per))  # fragments 0-3 PRESENT already
    stream = array("q", bytes(8 * native.STREAM_FIELDS))
    stream[5], stream[6] = 0, per  # the next DATA from fragment 0, 4 fragments each
    events = array("q", bytes(8 * native.MAX_BATCH * native.EVENT_FIELDS))
    rxbuf = bytearray(b"\xaa" * (65536 * native.MAX_BATCH))
    rx, tx = udp
    for msg in order:
        tx.sendto(msg, rx.getsockname())
    nev, slow, foreign, _ = native.recv_fetch(
        rx.fileno(), rxbuf, 65536, False, (), c.KVP_UDP_PORT,
        (c.KVP_VERSION << 4) | c.KVP_OP_DATA, tenant, key, 0, group,
        chunk_crc_seed(tenant, key), len(chunk), fb, 0, 0, out, frag,
        array("L", bytes(8 * n)), events, stream,
    )  # fmt: skip
    assert (nev, slow, foreign) == (0, [], 0)
    assert bytes(out) == chunk and frag == bytearray([2] * n)
    assert list(stream) == [0, 12, 1, 1, 16, 16, per]  # 12 new, 1 duplicate, 1 bad CRC
    # DATA 4-7 was the second datagram, predicted for slot 1: received in place.
    slot1 = rxbuf[65536 + c.KVP_HDR_BYTES : 65536 + c.KVP_HDR_BYTES + per * fb]
    assert slot1 == b"\xaa" * (per * fb)


@needs_native
@pytest.mark.parametrize("gso", [0, 64, 3])
@pytest.mark.parametrize(("mtu", "first", "end"), [(576, 0, 300), (1500, 3, 61), (9000, 0, 61)])
def test_send_data_sends_the_python_paths_datas(
    mtu: int, first: int, end: int, gso: int, udp: UdpPair
) -> None:
    # 576 B carries one fragment per DATA: 300 DATAs cross the 256-message sendmmsg batch. With
    # gso, DATAs leave several per UDP GSO message (the last one of a range shorter); the
    # receiver must still get each DATA as its own datagram, byte for byte.
    from kvcast.backend import InMemoryBackend
    from poolnode.groups import StaticGroups
    from poolnode.server import DataAnswer, KvpGetHandler

    assert native is not None
    chunk = os.urandom(end * c.FRAG_BYTES - 77)  # the last fragment is short
    backend = InMemoryBackend()
    backend.put(5, 0x1122334455667788, chunk)
    # The GET names group 3: the node echoes only groups it was told about.
    handler = KvpGetHandler(backend, mtu=mtu, max_get_fragments=1024, groups=StaticGroups({3}))
    answer = handler.answer(
        get_message(5, 0x1122334455667788, first, req_id=99, group=3, count=end - first)
    )
    assert isinstance(answer, DataAnswer)
    expected = [h + bytes(p) for h, p in handler.data_replies(answer)]
    rx, tx = udp
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    rx.settimeout(2)
    port = rx.getsockname()[1]
    sent = native.send_data(
        tx.fileno(), (0x7F000001, port), answer.header, answer.chunk, first, end,
        handler.frags_per_data, c.FRAG_BYTES, None, gso,
    )  # fmt: skip
    assert sent == sum(len(d) for d in expected)
    assert [rx.recv(65536) for _ in expected] == expected
    rx.setblocking(False)
    with pytest.raises(BlockingIOError):  # nothing more: no datagram came twice
        rx.recv(65536)


@needs_native
@pytest.mark.parametrize(
    ("header_len", "first", "end", "per_data"),
    [(39, 0, 1, 1), (40, 0, 5, 1), (40, -1, 1, 1), (40, 2, 2, 1), (40, 0, 1, 0), (40, 0, 1, 300)],
)
def test_send_data_refuses_a_bad_header_or_range(
    header_len: int, first: int, end: int, per_data: int
) -> None:
    assert native is not None
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        with pytest.raises(ValueError, match="send_data"):
            native.send_data(
                tx.fileno(), (0x7F000001, 9), bytes(header_len), bytes(4 * c.FRAG_BYTES - 1),
                first, end, per_data, c.FRAG_BYTES,
            )  # fmt: skip
        # A chunk of more fragments than a 16-bit index names: nothing past 65535 is sent.
        with pytest.raises(ValueError, match="16-bit"):
            native.send_data(
                tx.fileno(), (0x7F000001, 9), bytes(40), bytes(65537), 65536, 65537, 1, 1
            )
    finally:
        tx.close()


@needs_native
def test_send_gets_sends_each_slot_as_one_datagram_on_a_connected_socket(udp: UdpPair) -> None:
    assert native is not None
    rx, tx = udp
    rx.settimeout(2)
    tx.connect(rx.getsockname())
    slot, count = 296, 5
    buf = bytearray(os.urandom(slot * (count + 1)))
    assert native.send_gets(tx.fileno(), buf, slot, count) == count
    for q in range(count):
        assert rx.recv(2048) == bytes(buf[q * slot : (q + 1) * slot])
    assert native.send_gets(tx.fileno(), buf, slot, 0) == 0
    for bad in ((slot, count + 2), (0, 1), (slot, -1), (1, native.SEND_BATCH + 1)):
        with pytest.raises(ValueError, match="send_gets"):
            native.send_gets(tx.fileno(), bytearray(400), *bad)


@needs_native
def test_send_data_keeps_each_datas_crc_in_the_table_and_reuses_it(udp: UdpPair) -> None:
    from poolnode.server import crc_slots

    assert native is not None
    chunk = os.urandom(10 * c.FRAG_BYTES - 5)
    header = bytearray(40)
    header[4:6], header[8:16] = (3).to_bytes(2, "big"), (0xABCD).to_bytes(8, "big")
    table = crc_slots(len(chunk))
    rx, tx = udp
    rx.settimeout(2)
    to = (0x7F000001, rx.getsockname()[1])

    def send(first: int, end: int, crcs: bytearray | None) -> list[bytes]:
        native.send_data(tx.fileno(), to, bytes(header), chunk, first, end, 4, c.FRAG_BYTES,
                         crcs)  # fmt: skip
        return [rx.recv(4096) for _ in range(-(-(end - first) // 4))]

    plain = send(0, 10, None)
    assert send(0, 10, table) == plain  # computed and kept
    assert any(table[0:8]) and any(table[32:40]) and any(table[64:72])  # DATAs at 0, 4, 8
    assert send(0, 10, table) == plain  # taken from the table
    # The table is what is sent: a DATA of the same start and length takes its CRC.
    table[36:40] = b"\xde\xad\xbe\xef"
    poisoned = int.from_bytes(table[36:40], sys.byteorder).to_bytes(4, "big")
    assert send(4, 8, table)[0][36:40] == poisoned
    # A DATA of another length at the same start is computed again (and kept).
    short = send(4, 6, table)[0]
    assert short == send(4, 6, None)[0]
    with pytest.raises(ValueError, match="crcs"):
        native.send_data(tx.fileno(), to, bytes(header), chunk, 0, 1, 4, c.FRAG_BYTES,
                         bytearray(8))  # fmt: skip
