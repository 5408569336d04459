"""The leaf-spine fabric: its layout and trees as data, and a running fabric on Mininet.

The running fabric (two leaves, two spines, two GPU hosts under each leaf, the pool node under
the first leaf, the reference target on every switch) checks that a multicast reaches hosts
under both leaves with one copy per tree link and none back down the link it came up, that a
host cannot name a group on a leaf where it is no member, and that a spine killed under a tree
is survived: its routes and trees move to the other spine and the next fetch completes.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from emulation.topo import FabricSpec, LinkSpec, fabric_addresses
from kvcast import p4constants as c
from tests.mininet_env import MININET_MISSING

PREFIX = 64 * 1024
KEY = 0x5EED0000
# A prefix whose unicast fetch by four hosts lasts long enough (about 1.7 s on the 20 Mbit/s
# pool link) to kill a spine in the middle of it.
LONG_PREFIX = 1024 * 1024
LONG_KEY = 0x5EED1000
TENANT = 7  # experiments.incast's


def _cluster(spec: FabricSpec) -> Any:
    from emulation.fabric import FabricCluster

    return FabricCluster(spec)


def test_a_fabric_spec_lays_nodes_out_leaf_by_leaf() -> None:
    spec = FabricSpec(spines=2, leaves=2, hosts_per_leaf=2, pool_leaves=(2,))
    nodes = {n.name: n for n in fabric_addresses(spec)}
    assert [(n.switch, n.port) for n in nodes.values()] == [
        ("s1", 1), ("s1", 2), ("s2", 1), ("s2", 2), ("s2", 3),
    ]  # fmt: skip
    assert nodes["p1"].role == "pool" and spec.n_pools == 1 and spec.n_hosts == 4
    assert (spec.spine_name(1), spec.spine_name(2), spec.uplink_port(2)) == ("s3", "s4", 5)
    assert FabricSpec().n_hosts == 32 and FabricSpec().n_pools == 4  # the default
    bad: list[dict[str, Any]] = [
        {"spines": 0},
        {"leaves": 17},
        {"leaves": 2, "pool_leaves": (3,)},
        {"mtu": 100},
        {"hosts_per_leaf": 0},
    ]
    for kwargs in bad:
        with pytest.raises(ValueError):
            FabricSpec(**kwargs)


def test_bmv2_runs_a_fabric_only_with_a_program_that_prunes_transit_data() -> None:
    from emulation.fabric import FabricCluster, bmv2_prunes_transit, default_fabric_switch_class
    from emulation.switches import BMv2Switch

    spec = FabricSpec(spines=1, leaves=2, hosts_per_leaf=1)
    if bmv2_prunes_transit():
        FabricCluster(spec, BMv2Switch)  # builds nothing until started
    else:
        with pytest.raises(ValueError, match="egress prune"):
            FabricCluster(spec, BMv2Switch)
        assert default_fabric_switch_class().kind == "refswitch"


def test_hosts_are_spread_round_robin_over_the_leaves() -> None:
    cluster = _cluster(FabricSpec(spines=1, leaves=3, hosts_per_leaf=2))
    assert [h.name for h in cluster.hosts()] == ["h1", "h3", "h5", "h2", "h4", "h6"]


def test_the_cluster_programs_the_plan_its_spec_describes() -> None:
    cluster = _cluster(FabricSpec(spines=2, leaves=3, hosts_per_leaf=2, pool_leaves=(1,)))
    plan = cluster.plan
    assert (plan.leaves, plan.spines) == (["s1", "s2", "s3"], ["s4", "s5"])
    assert plan.fabric_ports("s1") == [4, 5] and plan.fabric_ports("s4") == [1, 2, 3]
    assert cluster.tree_spine() == "s4" and cluster.cache_switch(["h3", "h5"]) == "s4"
    assert cluster.tree(["h3"]) == {"s1": [(4, 0)], "s2": [(1, 1)], "s4": [(2, 0)]}


# ----------------------------------------------------------------------------- running fabric
SPEC = FabricSpec(
    spines=2,
    leaves=2,
    hosts_per_leaf=2,
    pool_leaves=(1,),
    host_link=LinkSpec(bw_mbit=200),
    pool_link=LinkSpec(bw_mbit=20),
    uplink=LinkSpec(bw_mbit=400),
    tenants=(TENANT,),
)


@pytest.fixture(scope="module")
def fabric() -> Iterator[tuple[Any, Any]]:
    if MININET_MISSING:
        pytest.skip(MININET_MISSING)
    from emulation.fabric import FabricCluster
    from emulation.switches import RefSwitch
    from experiments.incast import HostAgents, serve_pools

    with FabricCluster(SPEC, RefSwitch) as cluster, contextlib.ExitStack() as stack:
        serve_pools(cluster, stack, [KEY, LONG_KEY], [PREFIX, LONG_PREFIX], "memory")
        agents = HostAgents(cluster, [h.name for h in cluster.hosts()])
        stack.callback(agents.close)
        yield cluster, agents


def _point(
    fabric: tuple[Any, Any], mode: str, group: int, nbytes: int = PREFIX, key: int = KEY
) -> Any:
    from experiments.incast import run_point
    from experiments.incast_results import MODES

    cluster, agents = fabric
    result = run_point(cluster, agents, MODES[mode], 4, nbytes, key, group=group)
    assert result.all_ok and not result.error, (result.summary(), result.hosts)
    return result


def _copies(result: Any, link: str) -> float:
    return float(result.link_bytes[link] / PREFIX)


def _repaired(point: Any) -> float:
    """Prefixes' worth of fragments the followers fetched by unicast repairs (with headers).

    A follower that lost replicas asks for them by unicast: the pool sends them again, and the
    answers take the route to its leaf, which may cross the other spine (once per link): a
    loaded machine's repairs, not a copy of the stream.
    """
    return 1.3 * point.total("repairs") * c.FRAG_BYTES / PREFIX


def _off_tree(point: Any, *links: str) -> float:
    """Prefix copies on links off the tree beyond what followers' unicast repairs explain."""
    return sum(_copies(point, link) for link in links) - 2 * _repaired(point)


def _on_tree(point: Any, *links: str) -> bool:
    """Whether each link carried one copy of the prefix (and at most the repairs beside it),
    and the followers took most of the prefix from the stream, not from repairs."""
    followers = len(point.hosts) - 1
    streamed = point.total("frags_stream") * c.FRAG_BYTES / PREFIX
    return streamed > 0.5 * followers and all(
        0.95 < _copies(point, link) < 1.3 + _repaired(point) for link in links
    )


@pytest.mark.slow
@pytest.mark.netns
def test_a_multicast_reaches_both_leaves_with_one_copy_per_tree_link(
    fabric: tuple[Any, Any],
) -> None:
    # h1, h3, h2, h4: two under each leaf; the pool node under leaf s1; the tree through s3.
    unicast = _point(fabric, "a", 201)
    assert 1.9 < _copies(unicast, "s1>s3") + _copies(unicast, "s1>s4") < 2.2  # one per remote
    multicast = _point(fabric, "b", 202)
    # The pool sends the prefix once, and again only what followers lost and repaired.
    assert multicast.pool_tx_bytes / PREFIX < 1.3 + _repaired(multicast)
    assert _on_tree(multicast, "s1>s3", "s3>s2")  # up once, down once to the other leaf
    # Nothing comes back down to the leaf it came from, and the other spine carries nothing
    # but repairs.
    assert _copies(multicast, "s3>s1") < 0.05
    assert _off_tree(multicast, "s1>s4", "s4>s2") < 0.05
    # From SRAM: the pool's leaf holds it (two members sit under it); the same tree, no pool.
    sram = _point(fabric, "c", 203)
    assert sram.pool_tx_bytes < 0.05 * PREFIX and sram.counters["get_hit"] > 0
    # Hits are one fragment per packet: more header bytes than the pool's jumbo DATA.
    assert 0.95 < _copies(sram, "s1>s3") < 1.5 and _copies(sram, "s3>s1") < 0.05


@pytest.mark.slow
@pytest.mark.netns
def test_no_host_names_a_group_on_a_leaf_where_it_is_no_member(
    fabric: tuple[Any, Any],
) -> None:

    cluster, _ = fabric
    # h1 (port 1 of leaf s1) is the only member; h3 has port 1 too, under leaf s2.
    cluster.add_group(204, ["h1"])
    try:
        assert _refused(cluster, "h3", "s2", 204, gets=5) == 5
    finally:
        cluster.remove_group(204)


def _refused(cluster: Any, host: str, leaf: str, group: int, gets: int = 1) -> int:
    """GETs naming ``group`` that ``host`` sends, and ``leaf`` drops as BAD_GROUP."""

    client = cluster.switch_node(leaf).client
    drops = c.COUNTER_INGRESS_STATS_DROP_COUNTER
    before = client.counters(drops)[c.DROP_BAD_GROUP]
    send = (
        "import socket;from kvcast import wire;s=socket.socket(2,2);"
        f"[s.sendto(wire.get_message({TENANT},{KEY:#x},0,i,{group},0),"
        f"('10.0.100.1',{c.KVP_UDP_PORT})) for i in range({gets})]"
    )
    cluster.host(host).cmd(f'{sys.executable} -c "{send}"')
    return int(client.counters(drops)[c.DROP_BAD_GROUP] - before)


@pytest.mark.slow
@pytest.mark.netns
def test_a_spine_killed_under_a_tree_is_survived(fabric: tuple[Any, Any]) -> None:
    cluster, _ = fabric
    assert cluster.tree_spine() == "s3"
    cluster.switch_node("s3").kill()
    cluster.take_spine_down("s3")
    try:
        moved = _point(fabric, "b", 205)
        assert cluster.tree_spine() == "s4"
        assert 0.95 < _copies(moved, "s1>s4") < 1.3 and 0.95 < _copies(moved, "s4>s2") < 1.3
        assert _copies(moved, "s1>s3") < 0.05
        unicast = _point(fabric, "a", 206)
        assert _copies(unicast, "s1>s3") < 0.05
    finally:
        cluster.bring_spine_up("s3")
    back = _point(fabric, "b", 207)
    assert cluster.tree_spine() == "s3" and 0.95 < _copies(back, "s1>s3") < 1.3


@pytest.mark.slow
@pytest.mark.netns
def test_a_spine_killed_in_the_middle_of_the_fetches_is_survived(
    fabric: tuple[Any, Any],
) -> None:
    import threading
    import time

    from experiments.incast import _pool_tx_bytes

    cluster, _ = fabric

    # Unicast from the pool under s1: the GETs of the hosts under s2 climb through s3 (the
    # spine toward s1); the pool's DATA for them comes through s4 (the spine toward s2). s4
    # dies with DATA in flight, and the controller's part (here the test's) moves its routes
    # to s3.
    def fail() -> None:
        # Once a quarter of the four hosts' bytes has left the pool: the fetches are under way.
        start = _pool_tx_bytes(cluster)
        deadline = time.monotonic() + 30
        while _pool_tx_bytes(cluster) - start < LONG_PREFIX and time.monotonic() < deadline:
            time.sleep(0.01)
        cluster.switch_node("s4").kill()
        time.sleep(0.2)  # the controller notices a while later: DATA keeps going to s4
        cluster.take_spine_down("s4")

    killer = threading.Thread(target=fail)
    killer.start()
    try:
        # Every host verified, or the helper fails.
        survived = _point(fabric, "a", 208, LONG_PREFIX, LONG_KEY)
    finally:
        killer.join()
        cluster.bring_spine_up("s4")
    assert not cluster.plan.down_spines
    # The kill lost DATA in flight (sent up to s4, never delivered down), the GETs for it were
    # sent again and answered through s3.
    assert survived.link_bytes["s1>s4"] > survived.link_bytes["s4>s2"]
    assert survived.summary()["retries"] > 0, survived.summary()
    assert survived.link_bytes["s3>s2"] > PREFIX
    # s4 is back in service: the DATA for the two hosts under s2 comes through it again.
    back = _point(fabric, "a", 209)
    assert 1.9 < _copies(back, "s4>s2") < 2.2


@pytest.mark.slow
@pytest.mark.netns
def test_hosts_join_and_leave_a_tree(fabric: tuple[Any, Any]) -> None:
    cluster, _ = fabric

    def refused(host: str, leaf: str) -> int:
        return _refused(cluster, host, leaf, 210)

    cluster.add_group(210, ["h1"])  # one leaf: no uplink, no spine
    try:
        assert set(cluster.tree(["h1"])) == {"s1"}
        assert refused("h3", "s2") == 1
        cluster.update_group(210, ["h1", "h3"])  # h3 joins from the other leaf
        assert refused("h3", "s2") == 0
        joined = _point_existing_group(fabric, 210, ["h1", "h3"])
        assert joined["s1>s3"] > 0.95 * PREFIX  # now one copy up to the tree's spine
        cluster.update_group(210, ["h3"])  # h1 leaves
        assert refused("h1", "s1") == 1
    finally:
        cluster.remove_group(210)


def _point_existing_group(fabric: tuple[Any, Any], group: int, hosts: list[str]) -> dict[str, int]:
    """A multicast fetch of the prefix by ``hosts`` (h1 leads) in an existing group."""
    from experiments.incast import _agent_cmd, _link_bytes, get_timeouts
    from experiments.incast_results import MODES

    cluster, agents = fabric
    mode = MODES["b"]
    timeouts = get_timeouts(mode, len(hosts), 20.0, 32, cluster.spec.mtu)
    lines = {
        h: _agent_cmd(h, mode, "leader" if i == 0 else "follower", KEY, PREFIX, group,
                      cluster.pools()[0].ip, 30.0, timeouts, 32, cluster.spec.mtu)
        for i, h in enumerate(hosts)
    }  # fmt: skip
    before = _link_bytes(cluster)
    records = agents.run(lines, 60.0)
    assert all(r.get("ok") and r.get("verified") for r in records.values()), records
    return {k: v - before[k] for k, v in _link_bytes(cluster).items()}


@pytest.mark.slow
@pytest.mark.netns
def test_a_link_down_moves_the_trees_that_crossed_it(fabric: tuple[Any, Any]) -> None:
    import subprocess

    cluster, _ = fabric
    hosts = ["h1", "h3", "h2", "h4"]
    assert cluster.tree_spine_of(hosts) == "s3"
    # Leaf s2's link to spine s3 fails (both ends down), and the controller's part takes it out.
    ends = [f"s2-eth{cluster.fabric.uplink_port(1)}", "s3-eth2"]
    for intf in ends:
        subprocess.run(["ip", "link", "set", intf, "down"], check=True)
    cluster.take_link_down("s2", "s3")
    try:
        assert cluster.tree_spine_of(hosts) == "s4"
        moved = _point(fabric, "b", 211)  # every host verified, or the helper fails
        assert 0.95 < _copies(moved, "s1>s4") < 1.3 and 0.95 < _copies(moved, "s4>s2") < 1.3
        assert _copies(moved, "s1>s3") + _copies(moved, "s3>s2") < 0.05
    finally:
        for intf in ends:
            subprocess.run(["ip", "link", "set", intf, "up"], check=True)
        cluster.bring_link_up("s2", "s3")
    assert cluster.tree_spine_of(hosts) == "s3"
    back = _point(fabric, "b", 212)
    assert 0.95 < _copies(back, "s1>s3") < 1.3
