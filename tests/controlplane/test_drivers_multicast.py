"""MulticastDriver: exact replica_dst and group writes, id allocation, replication on the wire."""

from __future__ import annotations

import ipaddress

import pytest
from finsy.proto import p4r

from controlplane.drivers import ForwardingDriver, HostEndpoint, MulticastDriver
from controlplane.errors import ConfigError, NotInstalledError, ResourceExhaustedError
from controlplane.p4rt import SwitchClient
from kvcast import p4constants as c
from kvcast import wire

from .test_p4rt_harness import (
    POOL_IP,
    POOL_MAC,
    POOL_PORT,
    SWITCH_MAC,
    Expect,
    RefSwitch,
    config,
    refswitch_fixture,  # noqa: F401 - provides the refswitch fixture
    run,
)

T_REPLICA = c.TABLE_EGRESS_REPLICA_REPLICA_DST
A_REPLICA = c.ACTION_EGRESS_REPLICA_SET_REPLICA_DST
T_MEMBER = c.TABLE_INGRESS_PORT_ROLE_GROUP_MEMBER
A_MEMBER = c.ACTION_INGRESS_PORT_ROLE_MEMBER
INSERT, MODIFY, DELETE = p4r.Update.INSERT, p4r.Update.MODIFY, p4r.Update.DELETE


def host(i: int, port: int | None = None) -> HostEndpoint:
    return HostEndpoint(f"h{i}", port or i, f"00:00:00:00:01:{i:02x}", f"10.0.1.{i}", 40000 + i)


def replica_params(h: HostEndpoint) -> dict[str, int]:
    return {
        "dmac": int.from_bytes(wire.mac_bytes(h.mac), "big"),
        "dip": int(ipaddress.IPv4Address(h.ip)),
        "dport": h.udp_port,
    }


def test_hosts_get_replica_ids_and_replica_dst_entries(refswitch: RefSwitch) -> None:
    async def main() -> None:
        async with SwitchClient(config(refswitch)) as client:
            mc = MulticastDriver(client)
            mark = refswitch.mark()
            assert await mc.add_host(host(1)) == 1
            assert await mc.add_host(host(2)) == 2
            moved = HostEndpoint("h2", 2, host(2).mac, host(2).ip, 41000)
            assert await mc.add_host(moved) == 2
            e = Expect(refswitch)
            assert refswitch.writes(mark) == [
                [e.insert(T_REPLICA, {"rid": 1}, A_REPLICA, replica_params(host(1)))],
                [e.insert(T_REPLICA, {"rid": 2}, A_REPLICA, replica_params(host(2)))],
                [e.modify(T_REPLICA, {"rid": 2}, A_REPLICA, replica_params(moved))],
            ]

    run(main())


def test_a_consumer_set_gets_one_group_of_port_and_replica_id_pairs(refswitch: RefSwitch) -> None:
    async def main() -> None:
        async with SwitchClient(config(refswitch)) as client:
            mc = MulticastDriver(client)
            for i in (1, 2, 3):
                await mc.add_host(host(i))
            mark = refswitch.mark()
            gid = await mc.group_for(["h1", "h3"])
            assert await mc.group_for(["h3", "h1"]) == gid  # the same set: no new group
            await mc.update_group(gid, ["h1", "h2", "h3"])
            await mc.delete_group(gid)
            e = Expect(refswitch)

            def member(p: int) -> dict[str, int]:
                return {"group": gid, "port": p}

            # Each group change is followed by its group_member entries (GET authorization).
            assert refswitch.writes(mark) == [
                [e.group(INSERT, gid, [(1, 1), (3, 3)])],
                [
                    e.insert(T_MEMBER, member(1), A_MEMBER, {}),
                    e.insert(T_MEMBER, member(3), A_MEMBER, {}),
                ],
                [e.group(MODIFY, gid, [(1, 1), (2, 2), (3, 3)])],
                [e.insert(T_MEMBER, member(2), A_MEMBER, {})],
                [e.group(DELETE, gid)],
                [e.delete(T_MEMBER, member(p)) for p in (1, 2, 3)],
            ]
            assert mc.groups() == {}
            assert refswitch.state.entries(T_MEMBER) == []

    run(main())


def test_removing_a_host_updates_its_groups_then_deletes_its_entry(refswitch: RefSwitch) -> None:
    async def main() -> None:
        async with SwitchClient(config(refswitch)) as client:
            mc = MulticastDriver(client)
            for i in (1, 2):
                await mc.add_host(host(i))
            both = await mc.group_for(["h1", "h2"])
            alone = await mc.group_for(["h2"])
            mark = refswitch.mark()
            await mc.remove_host("h2")
            e = Expect(refswitch)
            assert refswitch.writes(mark) == [
                [e.group(MODIFY, both, [(1, 1)])],
                [e.delete(T_MEMBER, {"group": both, "port": 2})],
                [e.group(DELETE, alone)],
                [e.delete(T_MEMBER, {"group": alone, "port": 2})],
                [e.delete(T_REPLICA, {"rid": 2})],
            ]
            with pytest.raises(NotInstalledError):
                mc.replica_id("h2")

    run(main())


def test_a_host_moving_to_another_port_moves_in_its_groups(refswitch: RefSwitch) -> None:
    async def main() -> None:
        async with SwitchClient(config(refswitch)) as client:
            mc = MulticastDriver(client)
            await mc.add_host(host(1))
            gid = await mc.group_for(["h1"])
            mark = refswitch.mark()
            await mc.add_host(host(1, port=7))
            e = Expect(refswitch)
            # The replica_dst entry is unchanged: the group and its membership move.
            assert refswitch.writes(mark) == [
                [e.group(MODIFY, gid, [(7, 1)])],
                [e.delete(T_MEMBER, {"group": gid, "port": 1})]
                + [e.insert(T_MEMBER, {"group": gid, "port": 7}, A_MEMBER, {})],
            ]

    run(main())


def test_group_ids_are_not_reused_at_once_and_run_out_cleanly(refswitch: RefSwitch) -> None:
    async def main() -> None:
        async with SwitchClient(config(refswitch)) as client:
            mc = MulticastDriver(client, group_ids=range(1, 3), replica_ids=range(1, 3))
            await mc.add_host(host(1))
            await mc.add_host(host(2))
            with pytest.raises(ResourceExhaustedError):
                await mc.add_host(host(3))
            first = await mc.create_group(["h1"])
            await mc.delete_group(first)
            second = await mc.create_group(["h1"])
            assert second != first
            await mc.create_group(["h2"])
            with pytest.raises(ResourceExhaustedError):
                await mc.create_group(["h1", "h2"])
            with pytest.raises(NotInstalledError):
                await mc.create_group(["nobody"])
            with pytest.raises(ConfigError):
                await mc.create_group([])

    run(main())


def test_pool_data_for_a_group_reaches_every_member_rewritten(refswitch: RefSwitch) -> None:
    async def main() -> None:
        async with SwitchClient(config(refswitch)) as client:
            await ForwardingDriver(client).set_port_role(POOL_PORT, c.PORT_ROLE_POOL)
            mc = MulticastDriver(client)
            for i in (1, 2, 3):
                await mc.add_host(host(i))
            gid = await mc.group_for(["h1", "h3"])
            data = wire.data_message(1, 0xAB, 0, 1, b"payload", group=gid)
            frame = wire.udp_frame(
                POOL_MAC, SWITCH_MAC, POOL_IP, "10.0.1.1", c.KVP_UDP_PORT, 40000, data
            )
            outs = refswitch.process(POOL_PORT, frame)
            dst = wire.ETH_HDR_BYTES + 16  # IPv4 destination address
            got = sorted((o.port, o.frame[dst : dst + 4]) for o in outs)
            assert got == [(1, wire.ip_bytes("10.0.1.1")), (3, wire.ip_bytes("10.0.1.3"))]

    run(main())


def test_the_write_fanout_group_replicates_to_one_port_per_pipe(refswitch: RefSwitch) -> None:
    fanout = c.WRITE_FANOUT_GROUP

    async def main() -> None:
        async with SwitchClient(config(refswitch)) as client:
            mc = MulticastDriver(client)
            mark = refswitch.mark()
            await mc.set_write_fanout([196, 68])
            await mc.set_write_fanout([68, 196])  # the same ports: nothing written
            await mc.add_host(host(1))
            gid = await mc.group_for(["h1"])
            assert gid != fanout
            await mc.set_write_fanout([])
            e = Expect(refswitch)
            writes = refswitch.writes(mark)
            assert writes[0] == [e.group(INSERT, fanout, [(68, 0), (196, 0)])]
            assert writes[-1] == [e.group(DELETE, fanout)]
            assert len(writes) == 5  # fan-out, replica_dst, group, its member, fan-out removed

    run(main())


def test_host_groups_never_take_the_write_fanout_group_id() -> None:
    with pytest.raises(ConfigError, match="WRITE fan-out"):
        MulticastDriver(None, group_ids=range(1, 1 << 15))  # type: ignore[arg-type]
