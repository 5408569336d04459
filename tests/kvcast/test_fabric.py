"""The fabric plan: routes, fabric ports, trees and cache placement of a leaf-spine fabric."""

from __future__ import annotations

import pytest

from kvcast.fabric import Attachment, FabricPlan, Uplink


def _plan(leaves: int = 3, spines: int = 2, hosts: int = 2, pool_leaf: int = 1) -> FabricPlan:
    """Leaves s1.., spines after them; hosts on ports 1..; the pool node after them; uplink to
    spine k on port hosts + 1 + k, spine port l facing leaf l."""
    leaf = [f"s{i}" for i in range(1, leaves + 1)]
    spine = [f"s{leaves + k}" for k in range(1, spines + 1)]
    links = [
        Uplink(leaf[i], hosts + 1 + k, spine[k - 1], i + 1)
        for i in range(leaves)
        for k in range(1, spines + 1)
    ]
    nodes = [
        Attachment(f"h{i * hosts + j}", leaf[i], j, "host")
        for i in range(leaves)
        for j in range(1, hosts + 1)
    ]
    nodes.append(Attachment("p1", leaf[pool_leaf - 1], hosts + 1, "pool"))
    return FabricPlan(leaf, spine, links, nodes)


def test_a_leaf_routes_its_own_nodes_out_and_the_rest_up_one_spine_per_leaf() -> None:
    plan = _plan()
    assert plan.next_hop("s1", "h1") == (1, None)
    assert plan.next_hop("s1", "p1") == (3, None)
    assert plan.next_hop("s1", "h3") == (5, "s5")  # leaf s2 (index 1): spine 2, port 2 + 1 + 2
    assert plan.next_hop("s1", "h5") == (4, "s4")  # leaf s3 (index 2): spine 1
    assert plan.next_hop("s4", "h5") == (3, "s3")  # a spine: down to the node's leaf
    assert plan.fabric_ports("s1") == [4, 5] and plan.fabric_ports("s5") == [1, 2, 3]


def test_routes_spread_over_the_spines_in_service() -> None:
    plan = _plan(leaves=4, hosts=1)
    assert [plan.route_spine(f"s{i}") for i in (1, 2, 3, 4)] == ["s5", "s6", "s5", "s6"]
    plan.down_spines.add("s5")
    assert [plan.route_spine(f"s{i}") for i in (1, 2, 3, 4)] == ["s6"] * 4
    plan.down_spines.add("s6")
    with pytest.raises(RuntimeError, match="no spine in service"):
        plan.route_spine("s1")


def test_a_link_down_moves_the_routes_and_trees_that_crossed_it() -> None:
    plan = _plan()  # leaves s1-s3, spines s4 s5; the pool node under s1
    assert plan.next_hop("s2", "p1") == (4, "s4") and plan.tree_spine("p1") == "s4"
    plan.down_links.add(("s2", "s4"))
    assert plan.next_hop("s2", "p1") == (5, "s5")  # s2 reaches s1 through s5 now
    assert plan.next_hop("s3", "p1") == (4, "s4")  # the others keep theirs
    # A tree with a member under s2 goes through s5; one without keeps s4.
    assert plan.tree(["h1", "h3"], "p1") == {
        "s1": [(1, 1), (5, 0)],
        "s2": [(1, 1), (5, 0)],
        "s5": [(1, 0), (2, 0)],
    }
    assert "s4" in plan.tree(["h1", "h5"], "p1")
    # s2's and s3's GETs to the pool no longer meet on a spine: the pool's leaf caches.
    assert plan.cache_path(["h3", "h5"], "p1") == ["s1"]
    assert plan.cut_leaves() == []
    plan.down_links.add(("s2", "s5"))
    with pytest.raises(RuntimeError, match="no spine in service reaches"):
        plan.next_hop("s2", "p1")
    assert plan.cut_leaves() == [("s1", "s2"), ("s2", "s3")]
    assert plan.has_link("s2", "s5") and not plan.has_link("s2", "s3")


def test_a_tree_is_one_group_per_switch_through_one_spine() -> None:
    plan = _plan()  # the pool node under s1; leaf s1's traffic crosses spine s4
    assert plan.tree(["h1", "h2", "h3"], "p1") == {
        "s1": [(1, 1), (2, 2), (4, 0)],
        "s2": [(1, 1), (4, 0)],
        "s4": [(1, 0), (2, 0)],
    }
    # Members under the pool node's leaf only: no uplink, no spine.
    assert plan.tree(["h1", "h2"], "p1") == {"s1": [(1, 1), (2, 2)]}
    # Members under one other leaf: the pool's leaf sends one copy up, the spine one down.
    assert plan.tree(["h3", "h4"], "p1") == {
        "s1": [(4, 0)],
        "s2": [(1, 1), (2, 2)],
        "s4": [(2, 0)],
    }
    with pytest.raises(ValueError, match="not a GPU host"):
        plan.tree(["p1"], "p1")


def test_a_shared_prefix_is_cached_where_the_gets_first_meet() -> None:
    plan = _plan()
    assert plan.cache_switch(["h3", "h4"], "p1") == "s2"  # one leaf: that leaf
    assert plan.cache_switch(["h1", "h3"], "p1") == "s1"  # some under the pool's leaf: there
    assert plan.cache_switch(["h3", "h5"], "p1") == "s4"  # else the spine toward the pool
    # The switches every GET crosses after that, the pool node's leaf last.
    assert plan.cache_path(["h3", "h4"], "p1") == ["s2", "s4", "s1"]
    assert plan.cache_path(["h1", "h3"], "p1") == ["s1"]
    assert plan.cache_path(["h3", "h5"], "p1") == ["s4", "s1"]


def test_a_plan_that_is_not_a_fabric_is_refused() -> None:
    leaf, spine = ["s1", "s2"], ["s3"]
    links = [Uplink("s1", 3, "s3", 1), Uplink("s2", 3, "s3", 2)]
    with pytest.raises(ValueError, match="no link"):
        FabricPlan(leaf, spine, links[:1], [])
    with pytest.raises(ValueError, match="no leaf"):
        FabricPlan(leaf, spine, links, [Attachment("h1", "s3", 1, "host")])
    with pytest.raises(ValueError, match="twice"):
        FabricPlan(leaf, spine, links, [Attachment("h1", "s1", 1, "host")] * 2)
    with pytest.raises(ValueError, match="at least one"):
        FabricPlan([], spine, [], [])
