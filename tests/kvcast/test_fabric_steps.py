"""Tree changes as ordered writes: make before break (kvcast.fabric.tree_steps)."""

from __future__ import annotations

from kvcast.fabric import TreeStep, tree_steps

from .test_fabric import _plan


def test_a_new_tree_is_created_on_every_switch_before_any_member_port() -> None:
    plan = _plan()  # leaves s1-s3 (hosts on ports 1, 2), spines s4 s5; the pool node under s1
    tree = plan.tree(["h1", "h3"], "p1")
    steps = tree_steps({}, tree, (), plan.edge_ports(["h1", "h3"]))
    assert steps == [
        TreeStep("create", "s1", ((1, 1), (4, 0))),
        TreeStep("create", "s2", ((1, 1), (4, 0))),
        TreeStep("create", "s4", ((1, 0), (2, 0))),
        TreeStep("member", "s1", port=1),
        TreeStep("member", "s2", port=1),
    ]


def test_a_join_adds_the_new_leaf_and_its_port_before_changing_the_shared_switches() -> None:
    plan = _plan()
    old = plan.tree(["h1", "h3"], "p1")
    new = plan.tree(["h1", "h3", "h5"], "p1")
    steps = tree_steps(old, new, plan.edge_ports(["h1", "h3"]), plan.edge_ports(["h1", "h3", "h5"]))
    assert steps == [
        TreeStep("create", "s3", ((1, 1), (4, 0))),
        TreeStep("member", "s3", port=1),
        TreeStep("modify", "s4", ((1, 0), (2, 0), (3, 0))),
    ]


def test_a_spine_out_of_service_moves_the_tree_and_breaks_the_old_spine_last() -> None:
    plan = _plan()
    members = plan.edge_ports(["h1", "h3"])
    old = plan.tree(["h1", "h3"], "p1")
    plan.down_spines.add("s4")
    new = plan.tree(["h1", "h3"], "p1")
    assert [(s.op, s.switch) for s in tree_steps(old, new, members, members)] == [
        ("create", "s5"),
        ("modify", "s1"),
        ("modify", "s2"),
        ("delete", "s4"),
    ]


def test_a_leave_removes_the_leaving_leaf_then_the_leaving_ports_last() -> None:
    plan = _plan()
    everyone = ["h1", "h2", "h3"]
    old = plan.tree(everyone, "p1")
    new = plan.tree(["h1"], "p1")  # rack-local: no spine, no uplink
    steps = tree_steps(old, new, plan.edge_ports(everyone), plan.edge_ports(["h1"]))
    assert steps == [
        TreeStep("modify", "s1", ((1, 1),)),
        TreeStep("unmember", "s2", port=1),
        TreeStep("delete", "s2"),
        TreeStep("delete", "s4"),
        TreeStep("unmember", "s1", port=2),
    ]
    assert tree_steps(new, {}, plan.edge_ports(["h1"]), ()) == [
        TreeStep("unmember", "s1", port=1),
        TreeStep("delete", "s1"),
    ]
