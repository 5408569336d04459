"""The daemon builds multicast trees across a leaf-spine fabric and fails a spine over itself.

Four reference-target switch processes (leaves s1 and s2, spines s3 and s4), started for real,
are driven by one daemon; the groups, group members and routes are read back from each switch
over P4Runtime. A spine killed (SIGKILL) has its trees and routes moved to the other spine by
the daemon; started again (empty), it is re-pushed and they come back. A spine that is dead when
the daemon starts is out of service once its grace period passed, until it comes up.

Layout: hosts h1 h2 on ports 1 2 of s1, h3 h4 on ports 1 2 of s2; pool node p1 on port 5 of
s1, p2 on port 5 of s2; each leaf's port 3 faces s3 and port 4 faces s4, a spine's port l
faces leaf s<l>. A tree's spine is the one its pool node's GETs cross: s3 for p1's leaf s1
(index 0), s4 for p2's leaf s2.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from controlplane.config import parse_config
from controlplane.daemon import Controller
from controlplane.fabric import FabricTrees
from emulation.targets import SwitchProcess, load_p4info
from kvcast import p4constants as c
from kvcast import wire
from kvcast.tools.p4rt_client import P4RuntimeClient

from .test_daemon import started
from .test_p4rt_harness import run

LEAVES, SPINES = ("s1", "s2"), ("s3", "s4")
MAC = {f"s{i}": f"02:00:00:00:00:0{i}" for i in range(1, 5)}
HOSTS = {"h1": ("s1", 1), "h2": ("s1", 2), "h3": ("s2", 1), "h4": ("s2", 2)}
UP = {"s3": 3, "s4": 4}  # a leaf's port to each spine
DOWN = {"s1": 1, "s2": 2}  # a spine's port to each leaf
T_LPM = c.TABLE_INGRESS_FORWARDING_IPV4_LPM
T_MEMBER = c.TABLE_INGRESS_PORT_ROLE_GROUP_MEMBER


def _ip(host: str) -> str:
    return f"10.0.{HOSTS[host][0][1]}.{HOSTS[host][1]}"


def fabric_config(addresses: dict[str, str]) -> dict[str, Any]:
    return {
        "switches": [
            {
                "name": n,
                "address": addresses[n],
                "router_mac": MAC[n],
                "role": "spine" if n in SPINES else "leaf",
            }
            for n in (*LEAVES, *SPINES)
        ],
        "fabric_links": [
            {"leaf": lf, "leaf_port": UP[sp], "spine": sp, "spine_port": DOWN[lf]}
            for lf in LEAVES
            for sp in SPINES
        ],
        "pools": [
            {"name": f"p{i}", "ip": f"10.0.{i}.5", "mac": f"00:00:00:00:0{i}:05", "port": 5,
             "switch": f"s{i}"}
            for i in (1, 2)
        ],
        "hosts": [
            {"name": h, "ip": _ip(h), "mac": f"00:00:00:00:0{sw[1]}:0{port}", "port": port,
             "switch": sw, "tenants": [4]}
            for h, (sw, port) in HOSTS.items()
        ],
        "tick_s": 3600,
        "metrics": None,
        "report_api": {"listen": "127.0.0.1:0"},
    }  # fmt: skip


class Fabric:
    """The four switch processes and a reader (a backup client) for each."""

    def __init__(self, log_dir: Path) -> None:
        self.procs: dict[str, SwitchProcess] = {}
        try:
            for name in (*LEAVES, *SPINES):
                self.procs[name] = SwitchProcess(
                    "refswitch", [], log_dir / f"{name}.log", install=False
                )
        except Exception:
            self.close()
            raise
        self.config = parse_config(fabric_config({n: p.address for n, p in self.procs.items()}))

    def reader(self, name: str) -> P4RuntimeClient:
        spec = self.config.switch(name)
        cl = P4RuntimeClient(self.procs[name].address, device_id=spec.device_id)
        cl.use_p4info(load_p4info())
        return cl

    def groups(self, name: str) -> dict[int, list[tuple[int, int]]]:
        cl = self.reader(name)
        try:
            return cl.multicast_groups()
        finally:
            cl.close()

    def members(self, name: str) -> set[tuple[int, int]]:
        """The ``(group, port)`` of each group_member entry."""
        cl = self.reader(name)
        try:
            entries = cl.table_entries(T_MEMBER)
        finally:
            cl.close()
        fields = [{m.field_id: wire_int(m.exact.value) for m in e.match} for e in entries]
        return {(f[1], f[2]) for f in fields}  # group_member(group, port)

    def route(self, name: str, host: str) -> tuple[int, int]:
        """The (port, destination MAC) of the switch's route to a host."""
        cl = self.reader(name)
        try:
            entries = cl.table_entries(T_LPM)
        finally:
            cl.close()
        want = wire.ip_bytes(_ip(host))
        for e in entries:
            if e.match[0].lpm.value.rjust(4, b"\0") == want:
                params = {p.param_id: wire_int(p.value) for p in e.action.action.params}
                return params[1], params[3]  # route(port, smac, dmac)
        raise AssertionError(f"{name} has no route to {host}")

    def close(self) -> None:
        for proc in self.procs.values():
            proc.close()


def wire_int(raw: bytes) -> int:
    return int.from_bytes(raw, "big")


def _mac(text: str) -> int:
    return int(text.replace(":", ""), 16)


@pytest.fixture(name="fabric", scope="module")
def fabric_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fabric]:
    made = Fabric(tmp_path_factory.mktemp("fabric-switches"))
    yield made
    made.close()


async def until(check: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    """Waits until ``check()`` holds (the daemon works in the background); fails after."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        await asyncio.sleep(0.1)


def _rid(ctl: Controller, host: str) -> int:
    return ctl.switches[HOSTS[host][0]].multicast.replica_id(host)


def _sample(ctl: Controller, name: str, **labels: str) -> float | None:
    return ctl.metrics.registry.get_sample_value(name, labels)


def moves(ctl: Controller, reason: str) -> float | None:
    """How many times the daemon moved the fabric's trees and routes for ``reason``."""
    return _sample(ctl, "kvcast_controller_fabric_moves_total", reason=reason)


async def two_trees(ctl: Controller) -> tuple[FabricTrees, int, int]:
    """The daemon's trees, and two made: g1 (h1 h3, from p1: through s3), g2 (h2 h4, p2: s4)."""
    trees = ctl.fabric
    assert trees is not None
    g1 = await trees.create_group(["h1", "h3"], pool="p1")
    g2 = await trees.create_group(["h2", "h4"], pool="p2")
    return trees, g1, g2


def test_a_group_over_two_leaves_is_one_tree_through_one_spine(fabric: Fabric) -> None:
    async def main() -> None:
        ctl = await started(fabric.config)
        try:
            assert ctl.fabric is not None
            g1 = await ctl.fabric.create_group(["h1", "h3"], pool="p1")
            g2 = await ctl.fabric.create_group(["h2", "h4"], pool="p2")
            # Each leaf: its member host (replica id: the daemon's) and the uplink to the
            # tree's spine; the spine: both leaves. Trees spread: g1 over s3, g2 over s4.
            s1, s2 = fabric.groups("s1"), fabric.groups("s2")
            assert s1[g1] == sorted([(1, _rid(ctl, "h1")), (UP["s3"], 0)])
            assert s2[g1] == sorted([(1, _rid(ctl, "h3")), (UP["s3"], 0)])
            assert s1[g2] == sorted([(2, _rid(ctl, "h2")), (UP["s4"], 0)])
            assert s2[g2] == sorted([(2, _rid(ctl, "h4")), (UP["s4"], 0)])
            assert fabric.groups("s3") == {g1: [(1, 0), (2, 0)]}
            assert fabric.groups("s4") == {g2: [(1, 0), (2, 0)]}
            # Membership at the edge only: each member's leaf port, nothing on a spine.
            assert fabric.members("s1") == {(g1, 1), (g2, 2)}
            assert fabric.members("s2") == {(g1, 1), (g2, 2)}
            assert fabric.members("s3") == fabric.members("s4") == set()
            # h4 joins and h1 leaves g1: every member under s2, which needs no uplink any more;
            # s1 keeps the group for its pool node (the uplink only); h1's port is no member
            # any more, h4's is.
            await ctl.fabric.update_group(g1, ["h3", "h4"])
            assert fabric.groups("s1")[g1] == [(UP["s3"], 0)]
            assert fabric.groups("s2")[g1] == sorted([(1, _rid(ctl, "h3")), (2, _rid(ctl, "h4"))])
            assert fabric.groups("s3")[g1] == [(2, 0)]
            assert fabric.members("s1") == {(g2, 2)}
            assert fabric.members("s2") == {(g1, 1), (g1, 2), (g2, 2)}
            # Deleted: gone from every switch.
            await ctl.fabric.delete_group(g1)
            assert [g1 in fabric.groups(n) for n in (*LEAVES, *SPINES)] == [False] * 4
            assert fabric.members("s2") == {(g2, 2)}
            await ctl.tick()  # the status is the last tick's
            assert ctl.status()["switches"]["s4"]["multicast_groups"] == 1
            assert ctl.status()["switches"]["s3"]["multicast_groups"] == 0
        finally:
            await ctl.stop()

    run(main(), limit_s=120)


def test_a_killed_spine_has_its_trees_and_routes_moved_and_back_when_it_returns(
    fabric: Fabric,
) -> None:
    async def main() -> None:
        ctl = await started(fabric.config)
        try:
            trees, g1, g2 = await two_trees(ctl)
            # Routes between the leaves: to s1's nodes through s3, to s2's through s4.
            assert fabric.route("s2", "h1") == (UP["s3"], _mac(MAC["s3"]))
            assert fabric.route("s1", "h3") == (UP["s4"], _mac(MAC["s4"]))
            assert fabric.groups("s3") == {g1: [(1, 0), (2, 0)]}
            assert _sample(ctl, "kvcast_controller_spine_in_service", switch="s3") == 1

            await asyncio.to_thread(fabric.procs["s3"].kill)
            await until(lambda: moves(ctl, "spine_down") == 1, "s3 taken out of service")
            assert trees.status()["spines_down"] == ["s3"]
            assert fabric.groups("s4") == {g1: [(1, 0), (2, 0)], g2: [(1, 0), (2, 0)]}
            assert fabric.groups("s1")[g1] == sorted([(1, _rid(ctl, "h1")), (UP["s4"], 0)])
            assert fabric.groups("s2")[g1] == sorted([(1, _rid(ctl, "h3")), (UP["s4"], 0)])
            assert fabric.route("s2", "h1") == (UP["s4"], _mac(MAC["s4"]))
            assert fabric.route("s1", "h3") == (UP["s4"], _mac(MAC["s4"]))
            assert fabric.members("s1") == {(g1, 1), (g2, 2)}
            await ctl.tick()
            status = ctl.status()["fabric"]
            assert status["spines_in_service"] == ["s4"]
            assert status["trees_by_spine"] == {"s3": 0, "s4": 2}
            assert _sample(ctl, "kvcast_controller_spine_in_service", switch="s3") == 0
            assert _sample(ctl, "kvcast_controller_multicast_groups", switch="s4") == 2

            # Back, empty: re-pushed (pipeline, its routes down to the leaves), then the trees
            # and routes spread again.
            await asyncio.to_thread(fabric.procs["s3"].start_again)
            await until(lambda: moves(ctl, "spine_up") == 1, "s3 back in service", 90)
            assert trees.status()["spines_down"] == []
            assert fabric.groups("s3") == {g1: [(1, 0), (2, 0)]}
            assert fabric.groups("s4") == {g2: [(1, 0), (2, 0)]}
            assert fabric.groups("s1")[g1] == sorted([(1, _rid(ctl, "h1")), (UP["s3"], 0)])
            assert fabric.route("s2", "h1") == (UP["s3"], _mac(MAC["s3"]))
            assert fabric.route("s3", "h3") == (DOWN["s2"], _mac(MAC["s2"]))
            assert _sample(ctl, "kvcast_controller_spine_in_service", switch="s3") == 1
        finally:
            await ctl.stop()

    run(main(), limit_s=240)


def test_a_spine_dead_when_the_daemon_starts_is_out_of_service_until_it_comes_up(
    fabric: Fabric,
) -> None:
    fabric.procs["s3"].kill()

    async def main() -> None:
        ctl = Controller(fabric.config)
        await ctl.start()
        try:
            for name in ("s1", "s2", "s4"):
                await ctl.switches[name].client.wait_ready(10)
            trees = ctl.fabric
            assert trees is not None
            # No session of s3 within the grace period: out of service, routes through s4.
            await until(lambda: moves(ctl, "spine_down") == 1, "s3 taken out of service")
            assert fabric.route("s2", "h1") == (UP["s4"], _mac(MAC["s4"]))
            g1 = await trees.create_group(["h1", "h3"], pool="p1")
            assert fabric.groups("s4") == {g1: [(1, 0), (2, 0)]}
            await asyncio.to_thread(fabric.procs["s3"].start_again)
            await until(lambda: moves(ctl, "spine_up") == 1, "s3 in service", 90)
            assert fabric.groups("s3") == {g1: [(1, 0), (2, 0)]}
            assert fabric.route("s2", "h1") == (UP["s3"], _mac(MAC["s3"]))
        finally:
            await ctl.stop()

    run(main(), limit_s=180)
