"""The controller daemon, not FabricCluster, programs a running leaf-spine fabric on Mininet.

Two leaves, two spines, two GPU hosts under each leaf and the pool node under the first leaf,
the reference target on every switch (test_fabric's layout). The cluster builds the network and
programs nothing; one daemon takes every switch over (a higher election id, its own pipeline)
and installs the base state and routes from its configuration, and each point's multicast
group as a tree. A pool multicast then reaches the hosts under both leaves with one copy per
tree link; a spine killed under the tree is failed over by the daemon (the next fetch goes
through the other spine), and started again it gets the tree back. A leaf-spine link set down
(both interfaces) is failed over once the daemon is told (``POST /v1/fabric/links``), and back
once it is told the link is up.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import pytest

from emulation.topo import SWITCH_MAC, FabricSpec
from tests.emulation.test_fabric import (
    KEY,
    PREFIX,
    SPEC,
    _copies,
    _off_tree,
    _on_tree,
    _point,
    _repaired,
)
from tests.mininet_env import MININET_MISSING

CONTROLLER_ELECTION_ID = 20  # above the cluster's own clients (10)
T = TypeVar("T")


class Daemon:
    """An in-process controller daemon on an event loop of its own thread."""

    def __init__(self, raw: dict[str, Any]) -> None:
        from controlplane.config import parse_config
        from controlplane.daemon import Controller

        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

        async def make() -> Controller:
            ctl = Controller(parse_config(raw))
            await ctl.start()
            return ctl

        self.ctl = self.call(make())

    def call(self, work: Coroutine[Any, Any, T], timeout_s: float = 60.0) -> T:
        return asyncio.run_coroutine_threadsafe(work, self.loop).result(timeout_s)

    def moves(self, reason: str) -> float:
        value = self.ctl.metrics.registry.get_sample_value(
            "kvcast_controller_fabric_moves_total", {"reason": reason}
        )
        return value or 0.0

    def close(self) -> None:
        try:
            self.call(self.ctl.stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)


def daemon_config(cluster: Any) -> dict[str, Any]:
    """The daemon's configuration of the cluster's fabric (what a fabric user writes)."""
    plan = cluster.plan
    tenants = list(cluster.spec.tenants)
    nodes = list(cluster.nodes.values())
    return {
        "switches": [
            {
                "name": name,
                "address": cluster.switch_node(name).process.address,
                "election_id": CONTROLLER_ELECTION_ID,
                "router_mac": SWITCH_MAC,
                "role": "spine" if plan.is_spine(name) else "leaf",
            }
            for name in cluster.switch_names()
        ],
        "fabric_links": [
            {"leaf": leaf, "leaf_port": plan.uplink_port(leaf, spine), "spine": spine,
             "spine_port": plan.downlink_port(spine, leaf)}
            for leaf in plan.leaves
            for spine in plan.spines
        ],
        "pools": [
            {"name": n.name, "ip": n.ip, "mac": n.mac, "port": n.port, "switch": n.switch}
            for n in nodes if n.role == "pool"
        ],
        "hosts": [
            {"name": n.name, "ip": n.ip, "mac": n.mac, "port": n.port, "switch": n.switch,
             "tenants": tenants}
            for n in nodes if n.role == "host"
        ],
        "tick_s": 3600,
        "metrics": None,
        "report_api": {"listen": "127.0.0.1:0"},
    }  # fmt: skip


def _daemon_fabric(spec: FabricSpec) -> Any:
    """A FabricCluster that programs nothing itself: its daemon does (set ``daemon``)."""
    from emulation.fabric import FabricCluster
    from emulation.switches import RefSwitch

    class DaemonFabric(FabricCluster):
        daemon: Daemon | None = None
        groups_made = 0  # the daemon's next group id is this + 1

        def _program_switch(self) -> None:
            pass  # the daemon programs every switch

        def clients(self) -> list[Any]:
            return []  # the cluster's own clients are no longer primary

        def add_group(self, group_id: int, hosts: list[str]) -> None:
            assert self.daemon is not None and self.daemon.ctl.fabric is not None
            made = self.daemon.call(self.daemon.ctl.fabric.create_group(hosts))
            assert made == group_id, "the daemon hands out group ids round-robin from 1"
            self.groups_made += 1

        def remove_group(self, group_id: int) -> None:
            assert self.daemon is not None and self.daemon.ctl.fabric is not None
            self.daemon.call(self.daemon.ctl.fabric.delete_group(group_id))

    return DaemonFabric(spec, RefSwitch)


@pytest.fixture(scope="module")
def fabric() -> Iterator[tuple[Any, Any]]:
    if MININET_MISSING:
        pytest.skip(MININET_MISSING)
    from experiments.incast import HostAgents, serve_pools

    with _daemon_fabric(SPEC) as cluster, contextlib.ExitStack() as stack:
        daemon = Daemon(daemon_config(cluster))
        stack.callback(daemon.close)
        daemon.call(daemon.ctl.wait_ready(60), 90)
        cluster.daemon = daemon
        serve_pools(cluster, stack, [KEY], [PREFIX], "memory")
        agents = HostAgents(cluster, [h.name for h in cluster.hosts()])
        stack.callback(agents.close)
        yield cluster, agents


def _wait(check: Any, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        time.sleep(0.1)


@pytest.mark.slow
@pytest.mark.netns
def test_the_daemons_tree_carries_one_copy_per_link_and_survives_a_spine(
    fabric: tuple[Any, Any],
) -> None:
    cluster, _ = fabric
    daemon = cluster.daemon
    # h1, h3, h2, h4: two under each leaf; the pool node under s1; the tree through s3.
    first = _point(fabric, "b", 1)
    # The pool sends the prefix once, and again only what followers lost and repaired.
    assert first.pool_tx_bytes / PREFIX < 1.3 + _repaired(first)
    assert _on_tree(first, "s1>s3", "s3>s2")
    assert _copies(first, "s3>s1") < 0.05
    assert _off_tree(first, "s1>s4", "s4>s2") < 0.05
    # The tree's spine killed: the daemon notices its session lost and moves the routes and
    # the next tree to s4.
    cluster.switch_node("s3").kill()
    _wait(lambda: daemon.moves("spine_down") == 1, "s3 taken out of service")
    moved = _point(fabric, "b", 2)
    assert _on_tree(moved, "s1>s4", "s4>s2")
    # Started again, empty: the daemon re-pushes it and puts it back under the trees.
    cluster.switch_node("s3").start_again()
    _wait(lambda: daemon.moves("spine_up") == 1, "s3 back in service", 120)
    back = _point(fabric, "b", 3)
    assert _on_tree(back, "s1>s3", "s3>s2")
    assert _off_tree(back, "s1>s4", "s4>s2") < 0.05


def _tell(daemon: Daemon, leaf: str, spine: str, up: bool) -> None:
    """Tells the daemon a link's state over its HTTP API, as an operator or a monitor would."""
    from controlplane.fabric import LINKS_PATH
    from tests.controlplane.test_daemon_classes import http

    doc = {"leaf": leaf, "spine": spine, "up": up}
    code, answer = http(daemon.ctl, "POST", LINKS_PATH, doc, 60.0)
    assert (code, answer["changed"]) == (200, True), answer


@pytest.mark.slow
@pytest.mark.netns
def test_the_daemon_told_of_a_link_down_moves_the_tree_off_it(fabric: tuple[Any, Any]) -> None:
    import subprocess

    cluster, _ = fabric
    # Leaf s2's link to spine s3 (the tree's) fails: both ends down; the daemon is told.
    ends = [f"s2-eth{cluster.fabric.uplink_port(1)}", "s3-eth2"]
    for intf in ends:
        subprocess.run(["ip", "link", "set", intf, "down"], check=True)
    try:
        _tell(cluster.daemon, "s2", "s3", up=False)
        moved = _point(fabric, "b", cluster.groups_made + 1)  # every host verified
        assert _on_tree(moved, "s1>s4", "s4>s2")
        assert _copies(moved, "s1>s3") + _copies(moved, "s3>s2") < 0.05
    finally:
        for intf in ends:
            subprocess.run(["ip", "link", "set", intf, "up"], check=True)
    _tell(cluster.daemon, "s2", "s3", up=True)
    back = _point(fabric, "b", cluster.groups_made + 1)
    assert _on_tree(back, "s1>s3", "s3>s2")
    assert _off_tree(back, "s1>s4", "s4>s2") < 0.05
