"""A follower takes a group's stream into many chunks at once (``FetchClient.follow_many``).

The leader asks for its chunks layer by layer (``fetch_many`` with ``stripe_bytes``), so every
chunk's first stripe comes before any chunk is whole; the follower fills all of them from the
one stream, fetches their MAC objects beside them, hands on verified prefixes as they grow,
and repairs what its link lost. ``MulticastRelay`` plays the switch (the real pool handler
behind it); the last test runs the real reference pipeline.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from hostagent.fetch import FetchClient
from kvcast import p4constants as c
from kvcast.backend import InMemoryBackend
from kvcast.fetch import Address, ChunkRequest, FetchError, FetchReport
from kvcast.integrity import chunk_mac, mac_key_of
from kvcast.wire import KvpHeader
from poolnode.groups import ANY_GROUP
from poolnode.server import PoolServer
from tests.hostagent.fakes import FakeServer, MulticastRelay, silent
from tests.hostagent.refbridge import RefSwitchBridge

pytestmark = pytest.mark.usefixtures("data_path")

TENANT, GROUP = 4, 9
SECRET = bytes(range(32))
STRIPE = 16 * c.FRAG_BYTES  # a "layer": every chunk's first 16 fragments come first
CHUNKS = 6
KEYS = [0x5EED_0000_0000_0000 + (i << 8) for i in range(CHUNKS)]
DATA = [os.urandom(4 * STRIPE) for _ in KEYS]


def backend(macs: bool) -> InMemoryBackend:
    b = InMemoryBackend()
    for key, data in zip(KEYS, DATA, strict=True):
        b.put(TENANT, key, data)
        if macs:
            b.put(TENANT, mac_key_of(key), chunk_mac(SECRET, TENANT, key, data))
    return b


def client(service: Address, pool: Address | None, macs: bool, **kw: object) -> FetchClient:
    return FetchClient(
        service, pool, group=GROUP, bind=("127.0.0.1", 0), timeout_s=0.2, max_timeout_s=0.4,
        max_retries=2, deadline_s=20.0, mac_keys={TENANT: SECRET} if macs else None,
        **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def requests() -> list[ChunkRequest]:
    return [
        ChunkRequest(TENANT, k, torch.zeros(len(d), dtype=torch.uint8))
        for k, d in zip(KEYS, DATA, strict=True)
    ]


def run_group(
    leader: FetchClient, follower: FetchClient, stall_s: float = 5.0
) -> tuple[list[FetchReport], list[FetchReport], list[ChunkRequest], list[tuple[int, int]]]:
    """The leader's striped fetch and the follower's ``follow_many`` at once."""
    lead_reqs, fol_reqs = requests(), requests()
    seen: list[tuple[int, int]] = []
    with ThreadPoolExecutor(2) as ex:
        fol = ex.submit(
            follower.follow_many, fol_reqs, stall_s=stall_s,
            progress=lambda i, n: seen.append((i, n)),
        )  # fmt: skip
        lead = leader.fetch_many(
            lead_reqs, max_chunks_in_flight=CHUNKS, stripe_bytes=STRIPE,
            progress=lambda i, n: None,
        )  # fmt: skip
        return lead, fol.result(), fol_reqs, seen


@pytest.fixture(params=[False, True], ids=["crc", "mac"])
def macs(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


@pytest.fixture
def relay(macs: bool) -> Iterator[MulticastRelay]:
    with MulticastRelay(backend(macs), {}) as r:
        yield r


def test_a_follower_fills_every_chunk_from_the_one_stream(
    relay: MulticastRelay, macs: bool
) -> None:
    with (
        client(relay.address, None, macs, nocache=True) as leader,
        client(relay.address, None, macs) as follower,
    ):
        relay.groups[GROUP] = [leader.address, follower.address]
        lead, fol, reqs, seen = run_group(leader, follower)
        asked = relay.gets.get(follower.address, 0)
    assert all(r.ok for r in lead) and all(r.ok for r in fol)
    assert [r.dst.numpy().tobytes() for r in reqs] == DATA
    n = 4 * STRIPE // c.FRAG_BYTES
    assert all((r.frags_stream, r.repairs, r.stalled) == (n, 0, False) for r in fol)
    # It asked for nothing but, with MAC keys, the MAC objects (beside the chunks, verified).
    if macs:
        assert all(r.mac_verified for r in fol)
        assert 1 <= asked <= 2 * CHUNKS
    else:
        assert asked == 0
    # Progress: per chunk, growing prefixes that end at its whole length.
    for i in range(CHUNKS):
        got = [b for j, b in seen if j == i]
        assert got == sorted(got) and len(set(got)) == len(got)
        assert got[-1] == len(DATA[i])


Group = tuple[list[FetchReport], list[FetchReport], list[ChunkRequest], list[tuple[int, int]]]


def run_lossy(lose: Callable[[KvpHeader, int], bool], macs: bool, stall_s: float) -> Group:
    """``run_group`` where the follower's copies of the DATA ``lose(header, frags)`` are lost."""
    lost: list[Address] = []

    def mangle(member: Address, datagram: bytes) -> bytes | None:
        frags = -(-(len(datagram) - c.KVP_HDR_BYTES) // c.FRAG_BYTES)
        return None if member in lost and lose(KvpHeader.unpack(datagram), frags) else datagram

    with (
        MulticastRelay(backend(macs), {}, mangle) as relay,
        client(relay.address, None, macs, nocache=True) as leader,
        client(relay.address, None, macs) as follower,
    ):
        lost.append(follower.address)
        relay.groups[GROUP] = [leader.address, follower.address]
        return run_group(leader, follower, stall_s)


def test_fragments_lost_on_the_followers_link_are_repaired(macs: bool) -> None:
    lead, fol, reqs, seen = run_lossy(
        lambda h, _: h.key in (KEYS[1], KEYS[4]) and h.frag_idx in (0, 20, 60), macs, 5.0
    )
    assert all(r.ok for r in lead) and all(r.ok for r in fol)
    assert [r.dst.numpy().tobytes() for r in reqs] == DATA
    assert fol[1].repairs >= 3 and fol[4].repairs >= 3
    assert sum(r.repairs for r in fol) == fol[1].repairs + fol[4].repairs
    assert all(max(b for j, b in seen if j == i) == len(DATA[i]) for i in range(CHUNKS))


def test_a_lost_last_fragment_is_repaired_once_the_tail_is_quiet_not_after_a_stall() -> None:
    n = len(DATA[2]) // c.FRAG_BYTES
    # The DATA with chunk 2's last fragment is lost: nothing comes after it in its stream.
    _, fol, reqs, _ = run_lossy(lambda h, frags: h.key == KEYS[2] and h.frag_idx + frags >= n,
                                False, 30.0)  # fmt: skip
    assert all(r.ok for r in fol)
    assert [r.dst.numpy().tobytes() for r in reqs] == DATA
    # Repaired after the tail's quiet spell: a stall (30 s without a fragment) never came.
    assert fol[2].repairs >= 1 and not fol[2].stalled
    assert all(r.repairs == 0 for i, r in enumerate(fol) if i != 2)


def test_a_follower_whose_stream_never_comes_repairs_every_chunk(macs: bool) -> None:
    with (
        PoolServer(backend(macs), "127.0.0.1", 0, groups=ANY_GROUP) as pool,
        client(pool.address, None, macs) as follower,
    ):
        reqs = requests()
        reports = follower.follow_many(reqs, stall_s=0.1)
    assert all(r.ok and r.stalled for r in reports)
    assert [r.dst.numpy().tobytes() for r in reqs] == DATA


def test_with_neither_stream_nor_switch_every_chunk_is_repaired_from_the_pool(macs: bool) -> None:
    with (
        PoolServer(backend(macs), "127.0.0.1", 0, groups=ANY_GROUP) as pool,
        FakeServer(silent) as switch,
        FetchClient(
            switch.address, pool.address, group=GROUP, timeout_s=0.02, max_timeout_s=0.05,
            max_retries=1, mac_keys={TENANT: SECRET} if macs else None,
        ) as follower,
    ):  # fmt: skip
        reqs = requests()
        reports = follower.follow_many(reqs, stall_s=0.05)
    assert all(r.ok and r.stalled and r.fell_back for r in reports)
    assert all(r.repairs == r.frag_count for r in reports)
    assert [r.dst.numpy().tobytes() for r in reqs] == DATA


def test_a_follower_keeps_a_later_chunks_stream_and_needs_a_group(relay: MulticastRelay) -> None:
    macs = False
    with (
        client(relay.address, None, macs, nocache=True) as leader,
        client(relay.address, None, macs) as follower,
    ):
        relay.groups[GROUP] = [leader.address, follower.address]
        later = torch.zeros(len(DATA[5]), dtype=torch.uint8)
        assert leader.fetch(TENANT, KEYS[5], later.clone()).ok  # the stream of chunk 5 ...
        first = follower.follow_many(requests()[:2], stall_s=0.1)  # ... read while on 0-1
        relay.groups[GROUP] = []  # nothing new can arrive
        kept = follower.follow_many([ChunkRequest(TENANT, KEYS[5], later)], stall_s=0.1)
    assert all(r.ok and r.stalled for r in first)  # their stream never came: repaired
    assert sum(r.stashed for r in first) >= 1  # chunk 5's replicas, kept
    assert kept[0].ok and not kept[0].stalled and kept[0].repairs == 0
    assert kept[0].stashed >= 1 and later.numpy().tobytes() == DATA[5]
    with (
        FetchClient(relay.address) as alone,
        pytest.raises(FetchError, match="group"),
    ):
        alone.follow_many(requests())


def test_follow_many_through_the_reference_pipeline(macs: bool) -> None:
    with (
        PoolServer(backend(macs), "127.0.0.1", 0, groups=ANY_GROUP) as pool,
        RefSwitchBridge(pool.address) as bridge,
        client(bridge.vip, pool.address, macs, nocache=True) as leader,
        client(bridge.vip, pool.address, macs) as follower,
    ):
        hosts = [bridge.register(leader.address), bridge.register(follower.address)]
        bridge.add_group(GROUP, hosts)
        lead, fol, reqs, _ = run_group(leader, follower)
    assert all(r.ok for r in lead) and all(r.ok for r in fol)
    assert [r.dst.numpy().tobytes() for r in reqs] == DATA
    assert all(r.frags_pool == r.frags_stream == r.frag_count for r in fol)
