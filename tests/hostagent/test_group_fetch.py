"""Group fetch: a leader's GETs name a group, followers take the multicast stream and repair.

Most tests play the switch with ``MulticastRelay`` (the real pool-node handler behind a loopback
socket that copies every grouped DATA to each member, losing or corrupting chosen copies); the
last runs the real reference pipeline between loopback sockets (``RefSwitchBridge``), and
test_group_emulation.py runs it as a switch process in Mininet.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from hostagent.fetch import FetchClient
from kvcast import p4constants as c
from kvcast import wire
from kvcast.backend import InMemoryBackend
from kvcast.fetch import Address, FetchError, FetchReport, RecomputeReason
from kvcast.wire import KvpHeader
from poolnode.groups import ANY_GROUP
from poolnode.server import PoolServer
from tests.conftest import backend_holding
from tests.hostagent.fakes import FakeServer, MulticastRelay, Recording, silent
from tests.hostagent.refbridge import RefSwitchBridge

# Each test runs on the native data path and on the pure-Python one.
pytestmark = pytest.mark.usefixtures("data_path")

TENANT, KEY, GROUP = 4, 0xFEEDFACE12345678, 9
NFRAGS = 23
CHUNK = os.urandom(NFRAGS * c.FRAG_BYTES - 100)


def client(
    service: Address | None, pool_addr: Address | None, group: int, nocache: bool = False
) -> FetchClient:
    return FetchClient(
        service,
        pool_addr,
        group=group,
        nocache=nocache,
        bind=("127.0.0.1", 0),
        timeout_s=0.2,
        max_timeout_s=0.4,
        max_retries=2,
        deadline_s=20.0,
    )


@contextlib.contextmanager
def leader_and_follower(
    backend: InMemoryBackend,
) -> Iterator[tuple[MulticastRelay, FetchClient, FetchClient]]:
    """A multicast relay and two clients, leader and follower, both members of ``GROUP``.

    The clients are closed after the relay has stopped.
    """
    relay = MulticastRelay(backend, {})
    lead = client(relay.address, None, GROUP)
    fol = client(relay.address, None, GROUP)
    relay.groups[GROUP] = [lead.address, fol.address]
    with lead, fol, relay:
        yield relay, lead, fol


def dst() -> torch.Tensor:
    return torch.zeros(len(CHUNK), dtype=torch.uint8)


def as_bytes(t: torch.Tensor) -> bytes:
    return t.numpy().tobytes()


@pytest.fixture
def backend() -> InMemoryBackend:
    return backend_holding(TENANT, {KEY: CHUNK})


@pytest.fixture
def pool_server(backend: InMemoryBackend) -> Iterator[PoolServer]:
    # Behind the (reference) switch, which checks group membership: any group.
    with PoolServer(backend, "127.0.0.1", 0, groups=ANY_GROUP) as srv:
        yield srv


def test_leader_and_two_followers_all_end_verified_and_the_lossy_one_repairs(
    backend: InMemoryBackend, pool_server: PoolServer
) -> None:
    lossy: list[Address] = []

    def mangle(member: Address, datagram: bytes) -> bytes | None:
        if member not in lossy:
            return datagram
        first = KvpHeader.unpack(datagram).frag_idx
        if first in (5, 15):
            return None  # lost on the way to f2
        if first == 10:
            flipped = bytearray(datagram)
            flipped[c.KVP_HDR_BYTES + 3] ^= 0x40  # corrupted on the way to f2
            return bytes(flipped)
        return datagram

    # The clients' first GET timeout (0.2 s) is long enough that a loaded machine causes no
    # spurious retry; the followers' stall timeout (5 s) is far beyond any gap of a live stream,
    # or the wait for the leader's thread to start: at 0.3 s a loaded machine stalled f2 first.
    with MulticastRelay(backend, {}, mangle) as relay:
        leader = client(relay.address, pool_server.address, GROUP, nocache=True)
        f1 = client(relay.address, pool_server.address, GROUP)
        f2 = client(relay.address, pool_server.address, GROUP)
        lossy.append(f2.address)
        relay.groups[GROUP] = [leader.address, f1.address, f2.address]
        bufs = [dst(), dst(), dst()]
        with ThreadPoolExecutor(3) as ex:
            fut1 = ex.submit(f1.follow, TENANT, KEY, bufs[1], stall_s=5.0)
            fut2 = ex.submit(f2.follow, TENANT, KEY, bufs[2], stall_s=5.0)
            fut0 = ex.submit(leader.fetch, TENANT, KEY, bufs[0])
            reports: list[FetchReport] = [fut0.result(), fut1.result(), fut2.result()]
        gets = dict(relay.gets)
    addr1, addr2 = f1.address, f2.address
    for cl in (leader, f1, f2):
        cl.close()
    assert all(r.ok for r in reports)
    assert [as_bytes(b) for b in bufs] == [CHUNK] * 3
    lead, r1, r2 = reports
    assert (lead.frags_pool, lead.frags_stream, lead.repairs) == (NFRAGS, 0, 0)
    assert (r1.frags_stream, r1.repairs, r1.stalled) == (NFRAGS, 0, False)
    assert gets.get(addr1, 0) == 0  # f1 never asked: the stream carried it all
    # f2 repairs its gaps once the stream brought the chunk's last fragment, before any stall.
    assert not r2.stalled and r2.crc_failures == 1
    assert r2.repairs == 15 and r2.frags_stream == NFRAGS - 15
    assert gets[addr2] >= 1


def test_follower_whose_stream_never_comes_repairs_everything(pool_server: PoolServer) -> None:
    out = dst()
    with client(pool_server.address, None, GROUP) as follower:
        report = follower.follow(TENANT, KEY, out, stall_s=0.1)
    assert report.ok and report.stalled
    assert (report.repairs, report.frags_stream) == (NFRAGS, 0)
    assert as_bytes(out) == CHUNK


def test_follower_repairs_from_the_pool_directly_when_the_switch_is_silent(
    pool_server: PoolServer,
) -> None:
    with (
        FakeServer(silent) as switch,
        FetchClient(
            switch.address,
            pool_server.address,
            group=GROUP,
            timeout_s=0.02,
            max_timeout_s=0.05,
            max_retries=1,
        ) as follower,
    ):
        out = dst()
        report = follower.follow(TENANT, KEY, out, stall_s=0.05)
    assert report.ok and report.stalled and report.fell_back
    assert report.repairs == NFRAGS
    assert as_bytes(out) == CHUNK


def test_follower_with_nothing_anywhere_is_a_clear_failure() -> None:
    with (
        FakeServer(silent) as a,
        FetchClient(
            a.address, group=GROUP, timeout_s=0.02, max_timeout_s=0.04, max_retries=1
        ) as follower,
    ):
        report = follower.follow(TENANT, KEY, dst(), stall_s=0.05)
    assert not report.ok
    assert report.reason is RecomputeReason.NO_ANSWER
    assert report.stalled and report.repairs == 0


def test_follower_keeps_the_stream_of_another_chunk_for_its_turn(
    backend: InMemoryBackend,
) -> None:
    other = os.urandom(4 * c.FRAG_BYTES)
    backend.put(TENANT, KEY + 1, other)
    with leader_and_follower(backend) as (relay, lead, fol):
        other_buf = torch.zeros(len(other), dtype=torch.uint8)
        assert lead.fetch(TENANT, KEY + 1, other_buf).ok
        out = dst()
        report = fol.follow(TENANT, KEY, out, stall_s=0.1)
        # The other chunk's replicas, read while following KEY, complete its own follow later
        # without a GET; relay.groups is emptied first, so nothing new can arrive.
        relay.groups[GROUP] = []
        later = torch.zeros(len(other), dtype=torch.uint8)
        kept = fol.follow(TENANT, KEY + 1, later, stall_s=0.1)
    assert report.ok and report.stalled
    assert report.stashed >= 1 and report.frags_stream == 0
    assert as_bytes(out) == CHUNK
    assert kept.ok and not kept.stalled and kept.repairs == 0
    assert kept.frags_stream == 4 and later.numpy().tobytes() == other


def test_discarding_pending_datagrams_drops_the_stash_too(backend: InMemoryBackend) -> None:
    other = os.urandom(4 * c.FRAG_BYTES)
    backend.put(TENANT, KEY + 1, other)
    with leader_and_follower(backend) as (relay, lead, fol):
        assert lead.fetch(TENANT, KEY + 1, torch.zeros(len(other), dtype=torch.uint8)).ok
        assert fol.follow(TENANT, KEY, dst(), stall_s=0.1).ok
        assert fol.discard_pending() >= 1
        relay.groups[GROUP] = []
        report = fol.follow(TENANT, KEY + 1, torch.zeros(len(other), dtype=torch.uint8),
                            stall_s=0.05)  # fmt: skip
    assert report.ok and report.stalled and report.frags_stream == 0


def test_leader_gets_name_the_group_and_nocache_and_follower_repairs_do_not() -> None:
    backend = InMemoryBackend()
    backend.put(TENANT, KEY, CHUNK)
    record = Recording(backend)
    seen = record.seen

    with FakeServer(record) as srv:
        with client(srv.address, None, GROUP, nocache=True) as leader:
            assert leader.fetch(TENANT, KEY, dst()).ok
        lead_gets, seen[:] = list(seen), []
        with client(srv.address, None, GROUP) as follower:
            assert follower.follow(TENANT, KEY, dst(), stall_s=0.05).ok
    assert lead_gets and all(g.group == GROUP and g.flags & c.KVP_FLAG_NOCACHE for g in lead_gets)
    assert seen and all(g.group == 0 and not g.flags & c.KVP_FLAG_NOCACHE for g in seen)


def test_follow_needs_a_group(pool_server: PoolServer) -> None:
    with FetchClient(pool_server.address) as cl, pytest.raises(FetchError, match="group"):
        cl.follow(TENANT, KEY, dst())


@pytest.mark.parametrize("via", ["switch", "pool"])
def test_group_fetch_through_the_reference_pipeline(
    backend: InMemoryBackend, pool_server: PoolServer, via: str
) -> None:
    # The real reference pipeline replicates: SRAM hits of the leader's per-fragment GETs
    # (via switch), or the pool's DATA for its NOCACHE range GETs (via pool).
    with RefSwitchBridge(pool_server.address) as bridge:
        if via == "switch":
            bridge.load_chunk(TENANT, KEY, CHUNK, slot_base=0, epoch=1)
        leader = FetchClient(
            bridge.vip,
            pool_server.address,
            group=GROUP,
            nocache=via == "pool",
            frags_per_get=1 if via == "switch" else None,
            timeout_s=0.2,
            max_timeout_s=0.4,
        )
        follower = client(bridge.vip, pool_server.address, GROUP)
        hosts = [bridge.register(leader.address), bridge.register(follower.address)]
        bridge.add_group(GROUP, hosts)
        bufs = [dst(), dst()]
        with ThreadPoolExecutor(2) as ex:
            fut_f = ex.submit(follower.follow, TENANT, KEY, bufs[1], stall_s=5.0)
            lead = ex.submit(leader.fetch, TENANT, KEY, bufs[0]).result()
            fol = fut_f.result()
        leader.close()
        follower.close()
    assert lead.ok and fol.ok
    assert [as_bytes(b) for b in bufs] == [CHUNK, CHUNK]
    assert (fol.frags_stream, fol.repairs, fol.gets_sent) == (NFRAGS, 0, 0)
    if via == "switch":
        assert (lead.frags_hit, fol.frags_hit) == (NFRAGS, NFRAGS)
    else:
        assert (lead.frags_pool, fol.frags_pool) == (NFRAGS, NFRAGS)


# Where the stream comes from: a pool node the follower was given (it takes nothing from others).
STREAM_ADDR = ("127.0.0.5", c.KVP_UDP_PORT)


class _Stream:
    """Sends a chunk's fragments as the group's multicast replicas, from a pool node's address."""

    def __init__(self, chunk: bytes) -> None:
        self.chunk = chunk
        self.n = -(-len(chunk) // c.FRAG_BYTES)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(STREAM_ADDR)

    def send(self, to: Address, frags: Iterable[int]) -> None:
        for i in frags:
            body = self.chunk[i * c.FRAG_BYTES : (i + 1) * c.FRAG_BYTES]
            msg = wire.data_message(TENANT, KEY, i, self.n, body, group=GROUP,
                                    flags=c.KVP_FLAG_HIT | c.KVP_FLAG_REPLICA)  # fmt: skip
            self.sock.sendto(msg, to)

    def close(self) -> None:
        self.sock.close()


def _follow_with_gaps(
    chunk: bytes, lost: set[int], server: Address, later: range | None = None
) -> FetchReport:
    """A follower receives ``chunk``'s stream less ``lost`` (``later`` after it started)."""
    stream = _Stream(chunk)
    timer = None
    try:
        with FetchClient(
            server, group=GROUP, socket_buffer_bytes=8 << 20, pool_addrs=[STREAM_ADDR]
        ) as follower:
            first = range(stream.n) if later is None else range(later.start)
            stream.send(follower.address, (i for i in first if i not in lost))
            if later is not None:
                timer = threading.Timer(0.3, stream.send, args=(follower.address, later))
                timer.start()
            out = torch.zeros(len(chunk), dtype=torch.uint8)
            report = follower.follow(TENANT, KEY, out, stall_s=5.0)
            assert not report.ok or as_bytes(out) == chunk
            return report
    finally:
        if timer is not None:
            timer.join()
        stream.close()


def test_a_follower_repairs_a_gap_the_stream_went_past_without_waiting_for_a_stall() -> None:
    """One fragment of the group's stream is lost on the follower's link; the rest arrive."""
    chunk = os.urandom(200 * c.FRAG_BYTES - 9)
    backend = InMemoryBackend()
    backend.put(TENANT, KEY, chunk)
    with PoolServer(backend, "127.0.0.1", 0) as server:
        report = _follow_with_gaps(chunk, {3}, server.address)
    assert report.ok
    # Repaired as soon as the stream had gone 64 fragments past the gap: no 5 s stall.
    assert not report.stalled and report.repairs == 1 and report.frags_stream == 199


def test_a_follower_asks_for_nothing_the_stream_has_not_gone_past() -> None:
    """A stream that is whole but not yet finished: no repair GET for what is still to come."""
    chunk = os.urandom(200 * c.FRAG_BYTES)
    backend = InMemoryBackend()
    backend.put(TENANT, KEY, chunk)
    record = Recording(backend)
    seen = record.seen

    with FakeServer(record) as server:
        # The first half now, the rest once the follower is listening.
        report = _follow_with_gaps(chunk, set(), server.address, later=range(100, 200))
    assert report.ok and report.repairs == 0 and seen == []


def test_a_follower_repairs_a_tail_gap_once_the_last_fragment_came() -> None:
    """The lost fragment is among the last ones: the stream never goes 64 past it."""
    chunk = os.urandom(100 * c.FRAG_BYTES)
    backend = InMemoryBackend()
    backend.put(TENANT, KEY, chunk)
    with PoolServer(backend, "127.0.0.1", 0) as server:
        report = _follow_with_gaps(chunk, {95}, server.address)
    assert report.ok and not report.stalled and report.repairs == 1


def test_a_follower_whose_stream_lost_its_last_fragments_repairs_without_a_stall() -> None:
    """The stream's last fragments never come: nothing tells the follower it went past them."""
    chunk = os.urandom(100 * c.FRAG_BYTES)
    backend = InMemoryBackend()
    backend.put(TENANT, KEY, chunk)
    with PoolServer(backend, "127.0.0.1", 0) as server:
        report = _follow_with_gaps(chunk, {98, 99}, server.address)
    # Repaired once the stream in its tail went quiet, not after the 5 s stall.
    assert report.ok and not report.stalled and report.repairs >= 2


def test_a_follower_waits_for_the_next_jumbo_data_of_a_slow_stream() -> None:
    """A stream of 34-fragment DATAs (a 9000-byte MTU), one every 40 ms (a slow pool link).

    Sixteen fragment spacings are half of one DATA's: a follower that took that for the end of
    the stream asked the pool for its tail while the stream was still bringing it. The quiet
    time is also at least QUIET_ARRIVALS of its arrival spacings, so it asks for nothing.
    """
    per, gap_s = 34, 0.04
    chunk = os.urandom(200 * c.FRAG_BYTES)
    n = -(-len(chunk) // c.FRAG_BYTES)
    backend = InMemoryBackend()
    backend.put(TENANT, KEY, chunk)
    record = Recording(backend)
    seen = record.seen

    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(STREAM_ADDR)

    def stream(to: Address) -> None:
        for first in range(0, n, per):
            body = chunk[first * c.FRAG_BYTES : (first + per) * c.FRAG_BYTES]
            flags = c.KVP_FLAG_POOL | c.KVP_FLAG_REPLICA
            sock.sendto(
                wire.data_message(TENANT, KEY, first, n, body, group=GROUP, flags=flags), to
            )
            time.sleep(gap_s)

    try:
        with (
            FakeServer(record) as server,
            FetchClient(
                server.address, group=GROUP, socket_buffer_bytes=8 << 20, pool_addrs=[STREAM_ADDR]
            ) as follower,
        ):
            sender = threading.Thread(target=stream, args=(follower.address,))
            sender.start()
            out = torch.zeros(len(chunk), dtype=torch.uint8)
            report = follower.follow(TENANT, KEY, out, stall_s=5.0)
            sender.join()
    finally:
        sock.close()
    assert report.ok and as_bytes(out) == chunk
    assert report.repairs == 0 and seen == []


def test_a_hostile_multi_fragment_stream_leaves_only_verified_bytes_on_both_data_paths() -> None:
    """Bad CRCs, a forged duplicate, reordering, short and out-of-range DATA, all queued at once.

    The native path receives predicted DATA straight into the tensor (kvcast._native's
    scatter); the Python path copies each checked payload. Both must end with exactly the
    chunk, count the same drops, and never let a later copy overwrite a fragment they hold.
    """
    n, per = 60, 5  # DATAs of 5 fragments: what a 1500-byte MTU client expects first
    chunk = os.urandom(n * c.FRAG_BYTES - 33)
    fb = c.FRAG_BYTES

    def data(first: int, body: bytes | None = None) -> bytes:
        last = min(first + per, n)
        payload = chunk[first * fb : last * fb] if body is None else body
        return wire.data_message(TENANT, KEY, first, n, payload, group=GROUP,
                                 flags=c.KVP_FLAG_POOL | c.KVP_FLAG_REPLICA)  # fmt: skip

    bad = bytearray(data(0))
    bad[-1] ^= 0x40  # the CRC fails
    forged = data(5, os.urandom(per * fb))  # a valid CRC over other bytes, after the real one
    short = data(20)[: c.KVP_HDR_BYTES + 600]  # the header says 1,280 payload bytes
    beyond = bytearray(data(50))
    beyond[24:26] = (58).to_bytes(2, "big")  # fragments 58-62 of a 60-fragment chunk
    order = [bytes(bad), data(5), forged, data(15), data(10), data(0), short, bytes(beyond)]
    order += [data(f) for f in range(20, n, per)]
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sender.bind(STREAM_ADDR)
    try:
        with FetchClient(None, ("127.0.0.1", 9), group=GROUP, socket_buffer_bytes=8 << 20,
                         deadline_s=10.0, pool_addrs=[STREAM_ADDR]) as follower:  # fmt: skip
            for msg in order:
                sender.sendto(msg, follower.address)
            out = torch.zeros(len(chunk), dtype=torch.uint8)
            report = follower.follow(TENANT, KEY, out, stall_s=5.0)
    finally:
        sender.close()
    assert report.ok and as_bytes(out) == chunk
    assert (report.crc_failures, report.duplicates, report.invalid) == (1, 1, 2)
    assert report.frags_stream == n and report.repairs == 0 and not report.stalled


def test_a_follower_keeps_the_data_size_its_last_stream_carried() -> None:
    """A follower set up for 1500-byte frames follows a stream of 34-fragment DATAs twice.

    The native path receives a DATA straight into the tensor where it predicts it, from the
    fragments the DATAs before it carried; the client's first guess comes from its own MTU, so
    the whole first batch of a jumbo stream missed. The next fetch starts from what the last
    one saw; a fetch of one-fragment datagrams (SRAM hits) leaves it as it was.
    """
    per = 34
    chunk = os.urandom(300 * c.FRAG_BYTES)
    n = -(-len(chunk) // c.FRAG_BYTES)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(STREAM_ADDR)
    flags = c.KVP_FLAG_POOL | c.KVP_FLAG_REPLICA

    def follow(key: int, frags_per_datagram: int) -> None:
        for first in range(0, n, frags_per_datagram):
            body = chunk[first * c.FRAG_BYTES : (first + frags_per_datagram) * c.FRAG_BYTES]
            message = wire.data_message(TENANT, key, first, n, body, group=GROUP, flags=flags)
            sock.sendto(message, follower.address)
        out = torch.zeros(len(chunk), dtype=torch.uint8)
        report = follower.follow(TENANT, key, out, stall_s=5.0)
        assert report.ok and report.frags_stream == n and as_bytes(out) == chunk

    try:
        with FetchClient(
            ("127.0.0.1", 9),
            group=GROUP,
            mtu=1500,
            socket_buffer_bytes=8 << 20,
            pool_addrs=[STREAM_ADDR],
        ) as follower:
            native = follower._native is not None
            assert follower._data_frags == 5
            follow(KEY, per)
            assert follower._data_frags == (per if native else 5)
            follow(KEY + 1, 1)
            assert follower._data_frags == (per if native else 5)
    finally:
        sock.close()
