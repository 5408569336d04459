"""The P4Runtime layer: pipeline push, typed errors, arbitration, reconnect and restart."""

from __future__ import annotations

import asyncio

import finsy as fy
import pytest
from finsy.proto import p4i

from controlplane.drivers import (
    ChunkId,
    ForwardingDriver,
    FragmentLoader,
    HostEndpoint,
    MulticastDriver,
    PoolNode,
    PoolOwnerDriver,
    Route,
    SketchDriver,
    StatsDriver,
)
from controlplane.errors import (
    ConfigError,
    EncodingError,
    EntryExistsError,
    EntryNotFoundError,
    NotPrimaryError,
    SwitchUnavailableError,
)
from controlplane.p4rt import (
    ConnectionState,
    SessionInfo,
    SwitchClient,
    SwitchConfig,
    SwitchFleet,
    conform_p4info,
    load_p4info,
    pipeline_cookie,
)
from emulation.targets import P4INFO_PATH
from kvcast import p4constants as c
from kvcast import wire
from refswitch.state import SwitchState
from refswitch.tables import ActionCall

from .test_p4rt_harness import (
    HOST_MAC,
    HOST_PORT,
    POOL_IP,
    POOL_MAC,
    POOL_PORT,
    SWITCH_MAC,
    RefSwitch,
    config,
    refswitch_fixture,  # noqa: F401 - provides the refswitch fixture
    run,
)

T_CACHE = c.TABLE_INGRESS_CACHE_CACHE_TABLE
A_HIT = c.ACTION_INGRESS_CACHE_CACHE_HIT


class RecordingDriver:
    def __init__(self) -> None:
        self.sessions: list[SessionInfo] = []

    async def reinstall(self, session: SessionInfo) -> None:
        self.sessions.append(session)


def _hit(client: SwitchClient, tenant: int, key: int, epoch: int) -> fy.P4TableEntry:
    return fy.P4TableEntry(
        T_CACHE,
        match=fy.Match(tenant=tenant, key=key),
        action=fy.Action(A_HIT, slot_base=0, frag_count=1, epoch=epoch),
    )


# ------------------------------------------------------------------------------ P4Info
def test_conform_p4info_keeps_a_conforming_p4info_unchanged() -> None:
    fixed = conform_p4info(load_p4info(P4INFO_PATH))
    assert conform_p4info(fixed) is fixed


def test_conform_p4info_prefixes_ids_and_follows_references() -> None:
    fixed = conform_p4info(load_p4info(P4INFO_PATH))
    tables = {t.preamble.name: t for t in fixed.tables}
    actions = {a.preamble.id: a.preamble.name for a in fixed.actions}
    cache = tables[T_CACHE]
    assert cache.preamble.id >> 24 == p4i.P4Ids.TABLE
    assert actions[cache.const_default_action_id] == c.ACTION_INGRESS_CACHE_CACHE_MISS
    assert {actions[r.id] for r in cache.action_refs} == {A_HIT, c.ACTION_INGRESS_CACHE_CACHE_MISS}
    (direct,) = fixed.direct_counters
    assert direct.direct_table_id == cache.preamble.id
    assert list(cache.direct_resource_ids) == [direct.preamble.id]
    assert all(e.preamble.alias for e in fixed.counters)
    assert all(e.preamble.alias for e in fixed.digests)


def test_missing_p4info_is_a_config_error_naming_make_p4() -> None:
    with pytest.raises(ConfigError, match="make p4"):
        SwitchClient(SwitchConfig("s1", "127.0.0.1:1", P4INFO_PATH.with_name("missing.txtpb")))


# ------------------------------------------------------------------------------ sessions
def test_first_session_pushes_the_pipeline_with_its_cookie(refswitch: RefSwitch) -> None:
    driver = RecordingDriver()

    async def main() -> None:
        client = SwitchClient(config(refswitch))
        client.add_driver(driver)
        async with client:
            assert client.state is ConnectionState.READY
            assert client.generation == 1

    run(main())
    (push,) = refswitch.pipeline_pushes()
    assert push.config.cookie.cookie == pipeline_cookie(push.config.p4info, b"")
    assert driver.sessions == [SessionInfo(generation=1, pipeline_pushed=True)]


def test_synced_generation_trails_the_session_until_its_reinstall_has_completed(
    refswitch: RefSwitch,
) -> None:
    seen: list[tuple[int, int]] = []

    class Watching:
        def __init__(self, client: SwitchClient) -> None:
            self.client = client

        async def reinstall(self, session: SessionInfo) -> None:
            seen.append((self.client.generation, self.client.synced_generation))

    async def main() -> tuple[int, int, int, int]:
        client = SwitchClient(config(refswitch))
        client.add_driver(Watching(client))
        async with client:
            first = (client.generation, client.synced_generation)
            refswitch.restart()
            await client.wait_synced(first[0], timeout=10)
            return (*first, client.generation, client.synced_generation)

    assert run(main()) == (1, 1, 2, 2)
    # While a session's drivers re-install, it is not counted as synced yet.
    assert seen == [(1, 0), (2, 1)]


def test_a_switch_running_the_pipeline_is_not_pushed_again(refswitch: RefSwitch) -> None:
    driver = RecordingDriver()

    async def main() -> None:
        async with SwitchClient(config(refswitch)):
            pass
        second = SwitchClient(config(refswitch))
        second.add_driver(driver)
        async with second:
            pass

    run(main())
    assert len(refswitch.pipeline_pushes()) == 1
    assert driver.sessions == [SessionInfo(generation=1, pipeline_pushed=False)]


def test_write_before_start_raises_switch_unavailable(refswitch: RefSwitch) -> None:
    async def main() -> None:
        client = SwitchClient(config(refswitch))
        with pytest.raises(SwitchUnavailableError, match="wait_ready"):
            await client.write([+_hit(client, 1, 1, 1)])

    run(main())


def test_unreachable_switch_times_out_with_the_last_error() -> None:
    async def main() -> None:
        sw = RefSwitch()
        sw.stop()  # nothing listens on its port any more
        client = SwitchClient(config(sw))
        await client.start()
        with pytest.raises(SwitchUnavailableError, match="last error"):
            await client.wait_ready(timeout=0.3)
        await client.stop()

    run(main())


def test_duplicate_insert_is_entry_exists_naming_the_table(refswitch: RefSwitch) -> None:
    async def main() -> None:
        async with SwitchClient(config(refswitch)) as client:
            await client.write([+_hit(client, 1, 7, 1)])
            with pytest.raises(EntryExistsError) as info:
                await client.write([+_hit(client, 1, 7, 1)])
            (failure,) = info.value.failures
            assert failure.code == "ALREADY_EXISTS"
            assert "cache_table" in failure.entity
            with pytest.raises(EntryNotFoundError):
                await client.write([-fy.P4TableEntry(T_CACHE, match=fy.Match(tenant=2, key=2))])

    run(main())


def test_unknown_names_and_wide_values_are_encoding_errors(refswitch: RefSwitch) -> None:
    async def main() -> None:
        async with SwitchClient(config(refswitch)) as client:
            with pytest.raises(EncodingError):
                await client.write([+fy.P4TableEntry("no_such_table")])
            with pytest.raises(EncodingError):
                await client.write([+_hit(client, 1 << 16, 1, 1)])  # tenant is 16 bits

    run(main())


def test_a_backup_cannot_write_and_takes_over_when_the_primary_leaves(
    refswitch: RefSwitch,
) -> None:
    driver = RecordingDriver()

    async def main() -> None:
        primary = SwitchClient(config(refswitch, "primary", election_id=10))
        backup = SwitchClient(config(refswitch, "backup", election_id=5))
        backup.add_driver(driver)
        async with primary:
            await backup.start()
            while backup.state is not ConnectionState.BACKUP:
                await asyncio.sleep(0.01)
            with pytest.raises(NotPrimaryError):
                await backup.write([+_hit(backup, 1, 1, 1)])
        await backup.wait_synced(0, timeout=10)
        await backup.write([+_hit(backup, 1, 1, 1)])
        await backup.stop()

    run(main())
    assert driver.sessions == [SessionInfo(generation=1, pipeline_pushed=False)]


def test_fleet_runs_several_switches_in_one_process() -> None:
    switches = [RefSwitch(), RefSwitch()]

    async def main() -> None:
        fleet = SwitchFleet(SwitchClient(config(sw, f"s{i}")) for i, sw in enumerate(switches))
        async with fleet.running(timeout=10):
            for client in fleet:
                await ForwardingDriver(client).set_port_role(POOL_PORT, c.PORT_ROLE_POOL)
        assert [cl.state for cl in fleet] == [ConnectionState.STOPPED] * 2

    try:
        run(main())
        for sw in switches:
            assert len(sw.state.entries(c.TABLE_INGRESS_PORT_ROLE_PORT_ROLE)) == 1
    finally:
        for sw in switches:
            sw.stop()


def test_fleet_refuses_two_switches_with_one_name(refswitch: RefSwitch) -> None:
    with pytest.raises(ConfigError):
        SwitchFleet([SwitchClient(config(refswitch)), SwitchClient(config(refswitch))])


# ------------------------------------------------------------------------------ reconnect
class Installed:
    """Every driver of a switch, with some state in each."""

    def __init__(self, client: SwitchClient) -> None:
        self.forwarding = ForwardingDriver(client)
        self.pools = PoolOwnerDriver(client, vnodes=16)
        self.multicast = MulticastDriver(client)
        self.sketch = SketchDriver(client)
        self.stats = StatsDriver(client, ack_timeout_ns=0)
        self.loader = FragmentLoader(client, ack_timeout_s=2.0)
        for driver in (
            self.forwarding,
            self.pools,
            self.multicast,
            self.sketch,
            self.stats,
            self.loader,
        ):
            client.add_driver(driver)

    async def populate(self) -> None:
        await self.forwarding.set_port_role(POOL_PORT, c.PORT_ROLE_POOL)
        await self.forwarding.add_route(Route("10.0.4.0/24", POOL_PORT, SWITCH_MAC, POOL_MAC))
        await self.forwarding.add_route(Route("10.0.1.0/24", HOST_PORT, SWITCH_MAC, HOST_MAC))
        await self.forwarding.add_l2(HOST_MAC, HOST_PORT)
        await self.pools.set_nodes([PoolNode("p0", POOL_IP), PoolNode("p1", "10.0.4.5")])
        for i in (1, 2):
            await self.multicast.add_host(
                HostEndpoint(f"h{i}", i, f"00:00:00:00:01:0{i}", f"10.0.1.{i}", 40000)
            )
        await self.multicast.group_for(["h1", "h2"])
        await self.sketch.set_threshold(3)
        await self.sketch.open_window()
        await self.loader.load(1, 0xAB, bytes(range(256)) * 3)
        await self.loader.load(2, 0xCD, b"second chunk")


def switch_contents(sw: RefSwitch) -> dict[str, object]:
    """What the switch holds: entries per table, groups, digest config, sketch default."""
    out: dict[str, object] = {}
    for table in (
        c.TABLE_INGRESS_PORT_ROLE_PORT_ROLE,
        c.TABLE_INGRESS_FORWARDING_IPV4_LPM,
        c.TABLE_INGRESS_FORWARDING_L2_FWD,
        c.TABLE_INGRESS_POOL_OWNER_POOL_OWNER,
        c.TABLE_EGRESS_REPLICA_REPLICA_DST,
        T_CACHE,
    ):
        out[table] = sorted(
            (repr(e.match), e.action.action, sorted(e.action.params.items()))
            for e in sw.state.entries(table)
        )
    cache_params = [e.action.params for e in sw.state.entries(T_CACHE)]
    out["cache_slots"] = sorted((p["slot_base"], p["frag_count"]) for p in cache_params)
    out["groups"] = sorted((g.group_id, g.replicas) for g in sw.state.multicast_groups())
    out["digest"] = sw.state.digest_config(c.DIGEST_HOT_MISS_DIGEST_T) is not None
    sketch = sw.state.default_entry(c.TABLE_INGRESS_HOT_SKETCH_SKETCH_CONFIG)
    out["sketch"] = sorted(sketch.action.params.items())
    return out


def fragment_served(sw: RefSwitch, tenant: int, key: int, frag_idx: int, data: bytes) -> bool:
    """Whether a GET is answered from SRAM with the right bytes (CRC and payload)."""
    outs = sw.get(tenant, key, frag_idx)
    if len(outs) != 1:
        return False
    hdr = wire.KvpHeader.unpack(outs[0].frame, wire.FRAME_KVP_OFFSET)
    body = outs[0].frame[wire.FRAME_KVP_OFFSET + c.KVP_HDR_BYTES :][: hdr.payload_len]
    want = data[frag_idx * c.FRAG_BYTES : (frag_idx + 1) * c.FRAG_BYTES]
    return (
        hdr.op == c.KVP_OP_DATA
        and body == want
        and hdr.crc == wire.fragment_crc(tenant, key, frag_idx, body)
    )


def test_restarted_switch_gets_pipeline_and_every_driver_state_back_once(
    refswitch: RefSwitch,
) -> None:
    chunk = bytes(range(256)) * 3

    async def main() -> tuple[dict[str, object], dict[str, object], dict[ChunkId, object]]:
        client = SwitchClient(config(refswitch))
        drivers = Installed(client)
        async with client:
            await drivers.populate()
            before = switch_contents(refswitch)
            epochs = {ch: e.epoch for ch, e in drivers.loader.resident().items()}
            generation = client.generation
            refswitch.restart()
            await client.wait_synced(generation, timeout=10)
            after = switch_contents(refswitch)
            assert fragment_served(refswitch, 1, 0xAB, 2, chunk)
            assert all(e.epoch > epochs[ch] for ch, e in drivers.loader.resident().items()), (
                "a reload must use new epochs"
            )
            return before, after, dict(drivers.loader.resident())

    before, after, resident = run(main())
    assert len(refswitch.pipeline_pushes()) == 2
    # Same entries (the cache entries differ only by their new epochs), no orphans, no dups.
    for key in before:
        if key != T_CACHE:
            assert after[key] == before[key], key
    assert after["cache_slots"] == before["cache_slots"]
    assert len(resident) == 2


def drift(state: SwitchState) -> None:
    """While the controller is away, an orphan appears and an entry it installed disappears."""
    state.insert_entry(
        c.TABLE_INGRESS_FORWARDING_L2_FWD,
        [0x1234],
        ActionCall(c.ACTION_INGRESS_FORWARDING_L2_FORWARD, {"port": 9}),
    )
    state.delete_entry(T_CACHE, [2, 0xCD])


def test_reconnect_to_a_switch_that_kept_its_state_reconciles_it(refswitch: RefSwitch) -> None:
    async def main() -> tuple[dict[str, object], dict[str, object]]:
        client = SwitchClient(config(refswitch))
        drivers = Installed(client)
        async with client:
            await drivers.populate()
            before = switch_contents(refswitch)
            expect_stale = drivers.loader.resident()[ChunkId(2, 0xCD)]
            generation = client.generation
            mark = refswitch.mark()
            refswitch.reconnect(while_away=drift)
            await client.wait_synced(generation, timeout=10)
            assert refswitch.pipeline_pushes(mark) == []
            assert drivers.loader.resident()[ChunkId(2, 0xCD)] == expect_stale
            return before, switch_contents(refswitch)

    before, after = run(main())
    assert after == before
