"""On a fabric the daemon's own multicast groups (the engine pushes') are trees across switches.

Three in-process reference switches (leaves s1 and s2, spine s3; test_daemon_fabric's layout)
with the pool node moved under s2 and two hosts with engines under s1: a registered static
prefix is pushed to both as one group fetch, whose group is a tree (the two hosts on s1, the
spine down to s1, the pool's leaf s2 up to the spine) for the order's life, and deleted from
every switch once the pushes are collected.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from controlplane.config import parse_config
from controlplane.daemon import Controller

from .fake_engine import FakeEngine
from .test_daemon_fabric import (
    TENANT,
    UPLINK,
    fabric_config,
    switches_fixture,  # noqa: F401 - provides the switches fixture
)
from .test_daemon_pusher import register, settled, toks
from .test_p4rt_harness import RefSwitch, run

BPT = 1000  # KV bytes per token


@pytest.fixture(name="engines")
def engines_fixture() -> Iterator[dict[str, FakeEngine]]:
    engines = {name: FakeEngine() for name in ("h1", "h4")}
    yield engines
    for e in engines.values():
        e.close()


def _group(sw: RefSwitch, gid: int) -> list[tuple[int, int]]:
    """The switch's replicas of group ``gid`` (empty: no such group)."""
    for g in sw.state.multicast_groups():
        if g.group_id == gid:
            return sorted((r.port, r.instance) for r in g.replicas)
    return []


def test_a_push_group_on_a_fabric_is_one_tree_across_the_switches(
    switches: dict[str, RefSwitch], engines: dict[str, FakeEngine]
) -> None:
    raw = fabric_config({n: sw.address for n, sw in switches.items()})
    raw["pools"][0].update(switch="s2", port=2)  # the pool node under the other leaf
    raw["hosts"][0]["engine_url"] = engines["h1"].url
    raw["hosts"].append(
        {"name": "h4", "ip": "10.0.0.4", "mac": "00:00:00:00:00:04", "port": 4, "switch": "s1",
         "tenants": [TENANT], "engine_url": engines["h4"].url}
    )  # fmt: skip
    raw["push"] = {"budget_bytes_per_tick": 1 << 20, "bytes_per_token": BPT, "model": "m"}
    config = parse_config(raw)

    async def main() -> None:
        ctl = Controller(config)
        await ctl.start()
        try:
            await ctl.wait_ready(10)
            trees = ctl.fabric
            assert trees is not None
            engines["h1"].hold.clear()  # the order stays in flight until released
            await register(ctl, toks(100), tenant=TENANT)
            await ctl.tick()
            for e in engines.values():
                e.wait_requests(1)
            (gid,) = trees.groups()
            assert trees.groups()[gid] == {"h1", "h4"}
            mc = ctl.switches["s1"].multicast
            rids = sorted((port, mc.replica_id(h)) for h, port in (("h1", 1), ("h4", 4)))
            assert [_group(switches[n], gid) for n in ("s1", "s2", "s3")] == [
                rids,  # the members (all under s1: no uplink needed)
                [(UPLINK, 0)],  # the pool's leaf: up to the spine
                [(1, 0)],  # the spine: down to s1
            ]
            engines["h1"].hold.set()
            await settled(ctl)
            await ctl.tick()  # collected: the tree deleted from every switch
            assert trees.groups() == {}
            assert [_group(sw, gid) for sw in switches.values()] == [[]] * 3
        finally:
            await ctl.stop()

    run(main(), limit_s=60)
