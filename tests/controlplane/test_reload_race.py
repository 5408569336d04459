"""End to end: load a chunk, GET it, reload its slots with another chunk while GETs race.

The controller loads chunk A through the P4Runtime layer into the in-process reference switch;
a GET hits. Then A's slot range is evicted and reloaded with chunk B, and after *every* step of
the reload as the switch applies it (the entry delete, each WRITE, the entry insert) GETs for
every fragment of A (and of B) go through the pipeline. Each reply must be a correct fragment
of the chunk asked for (checked with its CRC), a miss forwarded towards the pool owner, or a
counted drop: never B's bytes under A's key.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from controlplane.drivers import (
    ChunkId,
    ForwardingDriver,
    FragmentLoader,
    PoolNode,
    PoolOwnerDriver,
    Route,
)
from controlplane.p4rt import SwitchClient
from kvcast import p4constants as c
from kvcast import wire

from .test_p4rt_harness import (
    POOL_IP,
    POOL_MAC,
    POOL_PORT,
    SWITCH_MAC,
    RefSwitch,
    config,
    refswitch_fixture,  # noqa: F401 - provides the refswitch fixture
    run,
)

TENANT = 3
KEY_A = 0x1111_2222_3333_4444
KEY_B = 0x5555_6666_7777_8888
F = c.FRAG_BYTES
FRAGS = 3
# Distinct, non-repeating bytes: a fragment of B can never pass for one of A.
DATA_A = bytes((i * 7 + 1) & 0xFF for i in range(FRAGS * F - 40))
DATA_B = bytes((i * 13 + 5) & 0xFF for i in range(FRAGS * F - 17))
DROP_COUNTERS = (c.COUNTER_INGRESS_STATS_DROP_COUNTER, c.COUNTER_EGRESS_STATS_DROP_COUNTER)


def fragment(data: bytes, i: int) -> bytes:
    return data[i * F : (i + 1) * F]


def total_drops(sw: RefSwitch) -> int:
    return sum(p for name in DROP_COUNTERS for p, _ in sw.state.counter_values(name))


def probe(sw: RefSwitch, key: int, frag_idx: int) -> str:
    """Sends one GET and names the outcome: hit, miss, drop, or what went wrong."""
    own, other = (DATA_A, DATA_B) if key == KEY_A else (DATA_B, DATA_A)
    drops = total_drops(sw)
    outs = sw.get(TENANT, key, frag_idx, req_id=frag_idx)
    if not outs:
        return "drop" if total_drops(sw) == drops + 1 else "vanished"
    if len(outs) != 1:
        return f"{len(outs)} replies"
    (out,) = outs
    hdr = wire.KvpHeader.unpack(out.frame, wire.FRAME_KVP_OFFSET)
    if hdr.op == c.KVP_OP_DATA and hdr.flags & c.KVP_FLAG_HIT:
        body = out.frame[wire.FRAME_KVP_OFFSET + c.KVP_HDR_BYTES :][: hdr.payload_len]
        if body == fragment(other, frag_idx) or body != fragment(own, frag_idx):
            return "WRONG BYTES"
        if hdr.crc != wire.fragment_crc(TENANT, key, frag_idx, body):
            return "BAD CRC"
        return "hit"
    dst = wire.ETH_HDR_BYTES + 16
    to_pool = out.frame[dst : dst + 4] == wire.ip_bytes(POOL_IP)
    if hdr.op == c.KVP_OP_GET and out.port == POOL_PORT and to_pool:
        return "miss"
    return f"unexpected op {hdr.op} on port {out.port}"


@dataclass
class Probes:
    """GETs for both keys after every step the switch applies; outcomes by step."""

    sw: RefSwitch
    steps: list[str] = field(default_factory=list)
    outcomes: dict[int, list[str]] = field(default_factory=lambda: {KEY_A: [], KEY_B: []})
    errors: list[BaseException] = field(default_factory=list)

    def __call__(self, step: object) -> None:
        # Runs in the switch's server thread, with the switch held still: record, never raise.
        try:
            self.steps.append("write" if isinstance(step, bytes) else "p4runtime write")
            for key in (KEY_A, KEY_B):
                self.outcomes[key] += [probe(self.sw, key, i) for i in range(FRAGS)]
        except BaseException as exc:  # noqa: BLE001 - surfaced by the test
            self.errors.append(exc)

    def attach(self) -> None:
        self.sw.after_write.append(self)
        self.sw.after_packet_out.append(self)

    def detach(self) -> None:
        self.sw.after_write.remove(self)
        self.sw.after_packet_out.remove(self)


def controller(
    refswitch: RefSwitch, **loader_args: Any
) -> tuple[SwitchClient, FragmentLoader, ForwardingDriver, PoolOwnerDriver]:
    """A switch client (not connected yet) with a fragment loader, forwarding and pool drivers.

    ``loader_args`` go to the FragmentLoader.
    """
    client = SwitchClient(config(refswitch))
    loader = FragmentLoader(client, **loader_args)
    forwarding, pools = ForwardingDriver(client), PoolOwnerDriver(client)
    for driver in (forwarding, pools, loader):
        client.add_driver(driver)
    return client, loader, forwarding, pools


async def route_misses_to_the_pool(forwarding: ForwardingDriver, pools: PoolOwnerDriver) -> None:
    """Routes the pool subnet to the pool port and gives every bucket to the one pool node."""
    await forwarding.add_route(Route("10.0.4.0/24", POOL_PORT, SWITCH_MAC, POOL_MAC))
    await pools.set_nodes([PoolNode("pool", POOL_IP)])


async def replace(loader: FragmentLoader) -> None:
    await loader.replace(ChunkId(TENANT, KEY_A), TENANT, KEY_B, DATA_B)


async def evict_then_load(loader: FragmentLoader) -> None:
    await loader.evict(ChunkId(TENANT, KEY_A))
    await loader.load(TENANT, KEY_B, DATA_B)


@pytest.mark.parametrize("reload", [replace, evict_then_load])
def test_no_get_racing_a_reload_receives_the_other_chunk(
    refswitch: RefSwitch, reload: Callable[[FragmentLoader], Awaitable[None]]
) -> None:
    probes = Probes(refswitch)

    async def main() -> None:
        client, loader, forwarding, pools = controller(refswitch)
        async with client:
            await route_misses_to_the_pool(forwarding, pools)
            a = await loader.load(TENANT, KEY_A, DATA_A)
            assert [probe(refswitch, KEY_A, i) for i in range(FRAGS)] == ["hit"] * FRAGS
            assert [probe(refswitch, KEY_B, i) for i in range(FRAGS)] == ["miss"] * FRAGS

            probes.attach()
            try:
                await reload(loader)
            finally:
                probes.detach()

            b = loader.entry(ChunkId(TENANT, KEY_B))
            assert b is not None and b.slots == a.slots and b.epoch > a.epoch
            assert [probe(refswitch, KEY_B, i) for i in range(FRAGS)] == ["hit"] * FRAGS
            assert [probe(refswitch, KEY_A, i) for i in range(FRAGS)] == ["miss"] * FRAGS

    run(main())
    assert probes.errors == []
    # A probe after every step: the delete, each of the three WRITEs, the insert.
    assert probes.steps == ["p4runtime write", "write", "write", "write", "p4runtime write"]
    allowed = {"hit", "miss", "drop"}
    assert set(probes.outcomes[KEY_A]) <= allowed, probes.outcomes[KEY_A]
    assert set(probes.outcomes[KEY_B]) <= allowed, probes.outcomes[KEY_B]
    # The old key is never served once its entry is gone (the safe order's first step), and
    # the new key only once its entry is in (the last step).
    assert probes.outcomes[KEY_A] == ["miss"] * (5 * FRAGS)
    assert probes.outcomes[KEY_B] == ["miss"] * (4 * FRAGS) + ["hit"] * FRAGS


def test_gets_through_a_stale_entry_are_dropped_not_served_the_new_bytes(
    refswitch: RefSwitch,
) -> None:
    """The epoch check is the safety net: WRITEs into a range whose entry still exists."""

    async def main() -> list[str]:
        client = SwitchClient(config(refswitch))
        loader = FragmentLoader(client)
        client.add_driver(loader)
        async with client:
            a = await loader.load(TENANT, KEY_A, DATA_A)
            # The wrong order: rewrite A's first slot with B's fragment, A's entry still in.
            md = {
                md.name: 0 for md in client.schema.controller_packet_metadata["packet_out"].metadata
            }
            payload = wire.write_message(
                TENANT, KEY_B, 0, a.slot_base, a.epoch + 1, fragment(DATA_B, 0), req_id=99
            )
            frame = wire.udp_frame(
                "02:00:00:00:00:fe",
                "02:00:00:00:00:ff",
                "169.254.0.1",
                "169.254.0.2",
                c.KVP_UDP_PORT,
                c.KVP_UDP_PORT,
                payload,
            )
            await client.packet_out(frame, **md)
            while refswitch.events(c.EV_WRITE) < FRAGS + 1:
                await asyncio.sleep(0.005)
            return [probe(refswitch, KEY_A, i) for i in range(FRAGS)]

    outcomes = run(main())
    assert outcomes == ["drop", "hit", "hit"]
    assert refswitch.drops(c.DROP_BAD_EPOCH) == 1


KEY_C = 0x9999_AAAA_BBBB_CCCC
DATA_C = bytes((i * 29 + 3) & 0xFF for i in range(FRAGS * F - 5))


def test_a_controller_killed_in_the_middle_of_a_reload_leaves_nothing_half_written_served(
    refswitch: RefSwitch,
) -> None:
    """The controller dies after one of B's three WRITEs into A's slots (A's entry deleted).

    Nothing on the switch names the half-written range: A and B miss, never a hit of mixed or
    stale bytes. A new controller adopts only what is whole (no orphan entry), takes the freed
    range for its next load (C) with an epoch above every epoch still installed, and C's every
    fragment is served exactly.
    """
    only_first_of_b: list[int] = []

    def drop_after_first_of_b(payload: bytes) -> bool:
        hdr = wire.KvpHeader.unpack(payload, wire.FRAME_KVP_OFFSET)
        if hdr.op != c.KVP_OP_WRITE or hdr.key != KEY_B:
            return False
        if hdr.frag_idx == 0:
            only_first_of_b.append(hdr.epoch)
            return False
        return True  # never reaches the pipeline: the controller is killed while it waits

    async def first_controller() -> tuple[int, int]:
        client, loader, forwarding, pools = controller(refswitch, ack_timeout_s=5.0)
        async with client:
            await route_misses_to_the_pool(forwarding, pools)
            a = await loader.load(TENANT, KEY_A, DATA_A)
            keep = await loader.load(TENANT, KEY_C + 1, DATA_A)  # a whole chunk that stays
            refswitch.drop_packet_out = drop_after_first_of_b
            reload = asyncio.ensure_future(replace(loader))
            while refswitch.events(c.EV_WRITE) < 2 * FRAGS + 1:  # B's first WRITE is in SRAM
                await asyncio.sleep(0.005)
            # SIGKILL: the load stops here. Nothing a dying controller does after this point
            # reaches the switch (cancelling only unwinds this process's own state).
            reload.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reload
            return a.slot_base, keep.epoch

    async def second_controller(a_base: int, keep_epoch: int) -> None:
        refswitch.drop_packet_out = None
        # Half-written: A's entry is gone, B's never went in, one slot holds B's epoch.
        assert [probe(refswitch, KEY_A, i) for i in range(FRAGS)] == ["miss"] * FRAGS
        assert [probe(refswitch, KEY_B, i) for i in range(FRAGS)] == ["miss"] * FRAGS
        client = SwitchClient(config(refswitch, election_id=20))
        loader = FragmentLoader(client)
        client.add_driver(loader)
        async with client:
            # Adopted: the whole chunk only; the switch holds no entry the controller lacks.
            assert set(loader.resident()) == {ChunkId(TENANT, KEY_C + 1)}
            assert [
                e.match for e in refswitch.state.entries(c.TABLE_INGRESS_CACHE_CACHE_TABLE)
            ] == [(TENANT, KEY_C + 1)]
            entry = await loader.load(TENANT, KEY_C, DATA_C)
            # The half-written range is reused, with an epoch above any still installed.
            assert entry.slot_base == a_base and entry.epoch > keep_epoch
            want = [fragment(DATA_C, i) for i in range(FRAGS)]
            for i in range(FRAGS):
                (out,) = refswitch.get(TENANT, KEY_C, i, req_id=i)
                hdr = wire.KvpHeader.unpack(out.frame, wire.FRAME_KVP_OFFSET)
                body = out.frame[wire.FRAME_KVP_OFFSET + c.KVP_HDR_BYTES :][: hdr.payload_len]
                assert hdr.flags & c.KVP_FLAG_HIT and body == want[i]
            assert [probe(refswitch, KEY_B, i) for i in range(FRAGS)] == ["miss"] * FRAGS

    a_base, keep_epoch = run(first_controller())
    assert len(only_first_of_b) == 1
    run(second_controller(a_base, keep_epoch))
    assert refswitch.drops(c.DROP_BAD_EPOCH) == 0
