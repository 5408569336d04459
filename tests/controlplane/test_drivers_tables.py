"""Table drivers: the exact writes of cache table, forwarding, pool owner, sketch and stats."""

from __future__ import annotations

import asyncio
import ipaddress
from collections import Counter

import pytest
from finsy.proto import p4r

from controlplane.drivers import (
    CacheEntry,
    CacheTableDriver,
    ChunkId,
    ConsistentHashRing,
    ForwardingDriver,
    FragmentLoader,
    HotMiss,
    PoolNode,
    PoolOwnerDriver,
    Route,
    SketchDriver,
    StatsDriver,
)
from controlplane.errors import ConfigError, NotInstalledError
from controlplane.p4rt import SwitchClient
from kvcast import p4constants as c
from kvcast import wire

from .test_p4rt_harness import (
    HOST_MAC,
    HOST_PORT,
    POOL_MAC,
    POOL_PORT,
    SWITCH_MAC,
    Expect,
    RefSwitch,
    config,
    refswitch_fixture,  # noqa: F401 - provides the refswitch fixture
    run,
)

T_CACHE = c.TABLE_INGRESS_CACHE_CACHE_TABLE
T_LPM = c.TABLE_INGRESS_FORWARDING_IPV4_LPM
T_L2 = c.TABLE_INGRESS_FORWARDING_L2_FWD
T_ROLE = c.TABLE_INGRESS_PORT_ROLE_PORT_ROLE
T_POOL = c.TABLE_INGRESS_POOL_OWNER_POOL_OWNER
T_SKETCH = c.TABLE_INGRESS_HOT_SKETCH_SKETCH_CONFIG
A_SKETCH = c.ACTION_INGRESS_HOT_SKETCH_SET_SKETCH_CONFIG
A_SET_POOL = c.ACTION_INGRESS_POOL_OWNER_SET_POOL


def ip(text: str) -> int:
    return int(ipaddress.IPv4Address(text))


def mac(text: str) -> int:
    return int.from_bytes(wire.mac_bytes(text), "big")


# ------------------------------------------------------------------------------ cache table
def test_cache_table_driver_sends_exact_insert_modify_delete(refswitch: RefSwitch) -> None:
    chunk = ChunkId(5, 0x1122334455667788)

    async def main() -> None:
        async with SwitchClient(config(refswitch)) as client:
            cache = CacheTableDriver(client)
            mark = refswitch.mark()
            await cache.insert(CacheEntry(chunk, 10, 2, 7))
            await cache.modify(CacheEntry(chunk, 10, 2, 8))
            await cache.delete(chunk)
            expect = Expect(refswitch)
            match = {"tenant": 5, "key": chunk.key}
            hit = c.ACTION_INGRESS_CACHE_CACHE_HIT
            assert refswitch.writes(mark) == [
                [
                    expect.insert(
                        T_CACHE, match, hit, {"slot_base": 10, "frag_count": 2, "epoch": 7}
                    )
                ],
                [
                    expect.modify(
                        T_CACHE, match, hit, {"slot_base": 10, "frag_count": 2, "epoch": 8}
                    )
                ],
                [expect.delete(T_CACHE, match)],
            ]
            with pytest.raises(NotInstalledError):
                await cache.delete(chunk)

    run(main())


def test_hit_counters_count_gets_served_per_chunk(refswitch: RefSwitch) -> None:
    async def main() -> None:
        client = SwitchClient(config(refswitch))
        loader = FragmentLoader(client)
        stats = StatsDriver(client)
        client.add_driver(loader)
        async with client:
            await loader.load(1, 0xA, b"a" * 10)
            await loader.load(1, 0xB, b"b" * 10)
            for _ in range(3):
                refswitch.get(1, 0xA, 0)
            refswitch.get(1, 0xB, 0)
            want = {ChunkId(1, 0xA): 3, ChunkId(1, 0xB): 1}
            assert await loader.cache.hit_counts() == want
            assert await stats.cache_hits() == want

    run(main())


# ------------------------------------------------------------------------------ forwarding
def test_forwarding_driver_writes_routes_l2_and_port_roles(refswitch: RefSwitch) -> None:
    async def main() -> None:
        async with SwitchClient(config(refswitch)) as client:
            fwd = ForwardingDriver(client)
            mark = refswitch.mark()
            await fwd.add_route(Route("10.0.4.0/24", POOL_PORT, SWITCH_MAC, POOL_MAC))
            await fwd.add_route(Route("10.0.4.0/24", POOL_PORT, SWITCH_MAC, POOL_MAC))  # same
            await fwd.add_route(Route("10.0.4.0/24", 5, SWITCH_MAC, POOL_MAC))  # changed
            await fwd.remove_route("10.0.4.0/24")
            await fwd.add_l2(HOST_MAC, HOST_PORT)
            await fwd.set_port_role(POOL_PORT, c.PORT_ROLE_POOL)
            await fwd.set_port_role(POOL_PORT, c.PORT_ROLE_HOST)
            e = Expect(refswitch)
            lpm = {"dst_addr": (ip("10.0.4.0"), 24)}
            route = c.ACTION_INGRESS_FORWARDING_ROUTE
            macs = {"smac": mac(SWITCH_MAC), "dmac": mac(POOL_MAC)}
            role = c.ACTION_INGRESS_PORT_ROLE_SET_PORT_ROLE
            assert refswitch.writes(mark) == [
                [e.insert(T_LPM, lpm, route, {"port": POOL_PORT, **macs})],
                [e.modify(T_LPM, lpm, route, {"port": 5, **macs})],
                [e.delete(T_LPM, lpm)],
                [
                    e.insert(
                        T_L2,
                        {"dst_addr": mac(HOST_MAC)},
                        c.ACTION_INGRESS_FORWARDING_L2_FORWARD,
                        {"port": HOST_PORT},
                    )
                ],
                [e.insert(T_ROLE, {"port": POOL_PORT}, role, {"role": c.PORT_ROLE_POOL})],
                [e.delete(T_ROLE, {"port": POOL_PORT})],
            ]

    run(main())


def test_a_prefix_with_host_bits_is_refused_before_any_write(refswitch: RefSwitch) -> None:
    async def main() -> None:
        async with SwitchClient(config(refswitch)) as client:
            mark = refswitch.mark()
            with pytest.raises(ConfigError, match="host bits"):
                await ForwardingDriver(client).add_route(
                    Route("10.0.4.1/24", 1, SWITCH_MAC, POOL_MAC)
                )
            with pytest.raises(NotInstalledError):
                await ForwardingDriver(client).remove_route("10.9.0.0/16")
            assert refswitch.writes(mark) == []

    run(main())


# ------------------------------------------------------------------------------ pool owner
NODES = [PoolNode(f"pool{i}", f"10.0.4.{10 + i}") for i in range(4)]


def test_pool_owner_installs_every_bucket_by_consistent_hashing(refswitch: RefSwitch) -> None:
    async def main() -> None:
        async with SwitchClient(config(refswitch)) as client:
            pools = PoolOwnerDriver(client)
            mark = refswitch.mark()
            assert await pools.set_nodes(NODES) == c.POOL_BUCKETS
            ring = ConsistentHashRing(c.POOL_BUCKETS, 128)
            for n in NODES:
                ring.add(n.name)
            by_name = {n.name: n for n in NODES}
            e = Expect(refswitch)
            assert refswitch.writes(mark) == [
                [
                    e.insert(T_POOL, {"bucket": b}, A_SET_POOL, {"pool_ip": ip(by_name[o].ip)})
                    for b, o in enumerate(ring.assignment())
                    if o is not None
                ]
            ]
            shares = Counter(n.name for n in pools.owners().values())
            assert all(c.POOL_BUCKETS / 8 < s < c.POOL_BUCKETS / 2 for s in shares.values())

    run(main())


def test_adding_a_pool_node_moves_about_one_in_n_buckets_all_to_it(refswitch: RefSwitch) -> None:
    async def main() -> None:
        async with SwitchClient(config(refswitch)) as client:
            pools = PoolOwnerDriver(client)
            await pools.set_nodes(NODES)
            before = pools.owners()
            mark = refswitch.mark()
            new = PoolNode("pool4", "10.0.4.20")
            written = await pools.add_node(new)
            after = pools.owners()
            moved = sorted(b for b in after if after[b] != before[b])
            assert all(after[b] == new for b in moved)
            assert written == len(moved)
            share = c.POOL_BUCKETS / 5
            assert share / 2 < len(moved) < share * 2
            e = Expect(refswitch)
            assert refswitch.writes(mark) == [
                [
                    e.modify(T_POOL, {"bucket": b}, A_SET_POOL, {"pool_ip": ip(new.ip)})
                    for b in moved
                ]
            ]

    run(main())


def test_removing_a_pool_node_rewrites_only_its_buckets(refswitch: RefSwitch) -> None:
    async def main() -> None:
        async with SwitchClient(config(refswitch)) as client:
            pools = PoolOwnerDriver(client)
            await pools.set_nodes(NODES)
            before = pools.owners()
            mark = refswitch.mark()
            written = await pools.remove_node("pool1")
            after = pools.owners()
            theirs = sorted(b for b, n in before.items() if n.name == "pool1")
            assert written == len(theirs)
            assert all(after[b] == before[b] for b in after if b not in theirs)
            e = Expect(refswitch)
            assert refswitch.writes(mark) == [
                [
                    e.modify(T_POOL, {"bucket": b}, A_SET_POOL, {"pool_ip": ip(after[b].ip)})
                    for b in theirs
                ]
            ]
            assert await pools.set_nodes([]) == c.POOL_BUCKETS
            assert refswitch.state.entries(T_POOL) == []

    run(main())


def test_a_missed_get_goes_to_the_pool_node_owning_its_bucket(refswitch: RefSwitch) -> None:
    key = 0x0123456789ABCDEF

    async def main() -> None:
        async with SwitchClient(config(refswitch)) as client:
            pools = PoolOwnerDriver(client)
            await pools.set_nodes(NODES)
            await ForwardingDriver(client).add_route(
                Route("10.0.4.0/24", POOL_PORT, SWITCH_MAC, POOL_MAC)
            )
            (out,) = refswitch.get(1, key, 0)
            owner = pools.owners()[key & (c.POOL_BUCKETS - 1)]
            assert out.port == POOL_PORT
            assert out.frame[wire.ETH_HDR_BYTES + 16 : wire.ETH_HDR_BYTES + 20] == wire.ip_bytes(
                owner.ip
            )

    run(main())


# ------------------------------------------------------------------------------ sketch
def test_sketch_driver_writes_the_default_action(refswitch: RefSwitch) -> None:
    async def main() -> None:
        async with SwitchClient(config(refswitch)) as client:
            sketch = SketchDriver(client)
            mark = refswitch.mark()
            await sketch.set_threshold(20)
            assert await sketch.open_window() == 1
            e = Expect(refswitch)
            assert refswitch.writes(mark) == [
                [e.set_default(T_SKETCH, A_SKETCH, {"threshold": 20, "window": 0})],
                [e.set_default(T_SKETCH, A_SKETCH, {"threshold": 20, "window": 1})],
            ]
            with pytest.raises(ConfigError):
                await sketch.set_threshold(1 << 24)

    run(main())


def test_window_ids_wrap_at_the_width_of_the_window_parameter(refswitch: RefSwitch) -> None:
    async def main() -> None:
        async with SwitchClient(config(refswitch)) as client:
            sketch = SketchDriver(client)
            assert [await sketch.open_window() for _ in range(3)] == [1, 2, 3]
            # 16-bit window ids: the last few of 65536 windows, without writing them all.
            sketch._window = (1 << 16) - 3
            windows = [await sketch.open_window() for _ in range(3)]
            assert windows == [(1 << 16) - 2, (1 << 16) - 1, 0]
            assert refswitch.state.default_entry(T_SKETCH).action.params["window"] == 0

    run(main())


def test_run_opens_windows_periodically(refswitch: RefSwitch) -> None:
    async def main() -> None:
        async with SwitchClient(config(refswitch)) as client:
            sketch = SketchDriver(client)
            task = asyncio.create_task(sketch.run(0.01))
            while sketch.window < 2:
                await asyncio.sleep(0.01)
            task.cancel()
            default = refswitch.state.default_entry(T_SKETCH)
            assert default.action.params["window"] >= 2

    run(main())


# ------------------------------------------------------------------------------ stats
def test_stats_driver_configures_the_digest_and_streams_hot_misses(refswitch: RefSwitch) -> None:
    async def main() -> tuple[list[list[p4r.Update]], HotMiss]:
        client = SwitchClient(config(refswitch))
        stats = StatsDriver(client, ack_timeout_ns=0)
        sketch = SketchDriver(client, threshold=3)
        client.add_driver(stats)
        client.add_driver(sketch)
        mark = refswitch.mark()
        async with client:
            misses = stats.hot_misses()
            first = asyncio.ensure_future(anext(misses))
            await asyncio.sleep(0)
            for _ in range(3):
                refswitch.get(9, 0xBEEF, 0)
            miss = await first
            await misses.aclose()
            return refswitch.writes(mark), miss

    writes, miss = run(main())
    e = Expect(refswitch)
    assert writes == [
        [e.digest(p4r.Update.INSERT, c.DIGEST_HOT_MISS_DIGEST_T, 1, 0, 0)],
        [e.set_default(T_SKETCH, A_SKETCH, {"threshold": 3, "window": 0})],
    ]
    assert miss == HotMiss(9, 0xBEEF, 3)


def test_counters_are_read_by_reason_and_event_name(refswitch: RefSwitch) -> None:
    async def main() -> None:
        client = SwitchClient(config(refswitch))
        stats = StatsDriver(client)
        async with client:
            route = Route("10.0.0.0/24", POOL_PORT, SWITCH_MAC, POOL_MAC)
            await ForwardingDriver(client).add_route(route)
            refswitch.get(1, 1, 0)  # a miss, routed towards the service address
            write = wire.write_message(1, 1, 0, 0, 1, b"x")
            frame = wire.udp_frame(
                HOST_MAC, SWITCH_MAC, "10.0.1.1", "10.0.0.1", 1, c.KVP_UDP_PORT, write
            )
            refswitch.process(HOST_PORT, frame)  # a WRITE from a host: UNAUTHORIZED
            counters = await stats.counters()
            assert counters.drops == {
                "malformed": 0,
                "bad_epoch": 0,
                "bad_fragment": 0,
                "unauthorized": 1,
                "no_route": 0,
                "ttl_expired": 0,
                "spoofed": 0,
                "bad_tenant": 0,
                "bad_group": 0,
                "port_denied": 0,
                "vlan": 0,
                "ipv6": 0,
                "mpls": 0,
                "llc": 0,
                "other_ethertype": 0,
                "arp_malformed": 0,
                "arp_spoofed": 0,
                "ipv4_fragment": 0,
            }
            assert counters.events["get_miss"] == 1
            assert sum(counters.events.values()) == 1

    run(main())
