"""The cross-check of the flow model against SimGrid: scenarios, the home side, the table.

The scenario builder, the home model's side and the table are tested always; the SimGrid side
when the ``simgrid`` package imports (``make sim-crosscheck`` installs it).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from experiments.sim.crosscheck import (
    CrossCheckConfig,
    Transfer,
    build_cases,
    compare,
    format_table,
    link_capacities,
    main,
    receiver_times,
    run_home,
    run_simgrid,
    simgrid_available,
    simgrid_spec,
    tree_routes,
    unicast_route,
)
from experiments.sim.fabric import build_plan

SMALL = CrossCheckConfig(
    fabric=replace(
        CrossCheckConfig().fabric, spines=2, leaves=4, hosts_per_leaf=4, groups=4, members=4,
        member_leaves=2,
    ),
    ns=(1, 3, 16), replicas=(2,), variants=("raw",),
)  # fmt: skip
NIC = SMALL.fabric.gbps * 1e9 / 8
ONE = SMALL.fabric.prefix_bytes / NIC  # one prefix over one NIC

needs_simgrid = pytest.mark.skipif(
    not simgrid_available(), reason="simgrid not installed (make sim-crosscheck installs it)"
)


def cases_by_name() -> dict[str, object]:
    return {c.name: c for c in build_cases(SMALL)}


def test_unicast_follows_the_plans_next_hops() -> None:
    plan = build_plan(SMALL.fabric)
    # p0.0 is under l0: a host under l0 is two hops away, one under l2 goes through the spine
    # the plan routes l2's traffic through.
    assert unicast_route(plan, "p0.0", "h0.1") == ("p0.0", "l0", "h0.1")
    spine = plan.route_spine("l2", "l0")
    assert unicast_route(plan, "p0.0", "h2.3") == ("p0.0", "l0", spine, "l2", "h2.3")


def test_tree_carries_one_copy_per_link_through_the_plans_spine() -> None:
    plan = build_plan(SMALL.fabric)
    members = ["h0.0", "h1.0", "h1.1", "h3.2"]
    routes = tree_routes(plan, "p0.0", members)
    assert set(routes) == set(members)
    spine = plan.tree_spine("p0.0", plan.leaves)
    t = Transfer("p0.0", routes, True)
    edges = t.edges()
    assert len(edges) == len(set(edges))
    assert ("l0", spine) in edges and ("l0", "h0.0") in edges
    assert {e for e in edges if e[0] == spine} == {(spine, "l1"), (spine, "l3")}
    # pool NIC, uplink, 2 downlinks, 4 host NICs
    assert len(edges) == 1 + 1 + 2 + 4


def test_cases_spread_hosts_over_leaves_and_replicas_over_pools() -> None:
    cases = cases_by_name()
    uni = cases["unicast/3"]
    assert [next(iter(t.routes)) for t in uni.transfers] == ["h0.0", "h1.0", "h2.0"]
    rep = cases["replicas-2/16"]
    assert {t.source for t in rep.transfers} == {"p0.0", "p2.0"}
    multi = cases["multicast/16"]
    assert len(multi.transfers) == 1 and len(multi.transfers[0].routes) == 16
    groups = cases["groups-multicast/16"]
    assert len(groups.transfers) == 4
    assert cases["groups-unicast/16"].n == 16


def test_home_model_incast_times_are_the_pool_nics() -> None:
    cases = cases_by_name()
    assert max(run_home(SMALL, cases["unicast/16"])) == pytest.approx(16 * ONE)
    assert max(run_home(SMALL, cases["multicast/16"])) == pytest.approx(ONE)
    assert max(run_home(SMALL, cases["replicas-2/16"])) == pytest.approx(8 * ONE)
    # Every receiver of one unicast incast shares the pool NIC equally: all end together.
    times = run_home(SMALL, cases["unicast/3"])
    assert times == pytest.approx([3 * ONE] * 3)


def test_home_model_sees_an_oversubscribed_uplink() -> None:
    # Oversubscription 8 with 4 hosts per leaf over 2 spines: each uplink carries a quarter
    # of a NIC, so a remote unicast is 4 times slower than a local one.
    cfg = replace(SMALL, fabric=replace(SMALL.fabric, oversub=8.0))
    caps = link_capacities(cfg, build_plan(cfg.fabric))
    assert caps["l0>s0"] == pytest.approx(NIC / 4)
    times = run_home(cfg, [c for c in build_cases(cfg) if c.name == "unicast/1"][0])
    assert times == [pytest.approx(ONE)]  # h0.0 is under the pool's leaf
    remote = [c for c in build_cases(cfg) if c.name == "unicast/3"][0]
    assert max(run_home(cfg, remote)) == pytest.approx(4 * ONE)


def test_spec_has_every_route_both_ways_and_one_comm_per_tree_link() -> None:
    cases = build_cases(SMALL)
    spec = simgrid_spec(SMALL, cases, "raw")
    routes = {(s, d): names for s, d, names in spec["routes"]}
    links = {name for name, _bw, _lat in spec["links"]}
    for (s, d), names in routes.items():
        assert (d, s) in routes
        assert set(names) <= links
    for case, transfers in zip(cases, spec["cases"], strict=True):
        comms = [c for t in transfers for c in t]
        assert all((s, d) in routes for s, d, _ in comms)
        expected = sum(len(t.edges()) if t.multicast else len(t.routes) for t in case.transfers)
        assert len(comms) == expected
        # one entry per unicast, one per tree (its links)
        assert len(transfers) == sum(1 if t.multicast else len(t.routes) for t in case.transfers)
    assert all(lat == 0 for _n, _b, lat in spec["links"])
    assert not spec["parallel_tasks"] and simgrid_spec(SMALL, cases, "ptask")["parallel_tasks"]
    lv08 = simgrid_spec(SMALL, cases, "lv08")
    assert all(lat == pytest.approx(1e-6) for _n, _b, lat in lv08["links"])
    with pytest.raises(ValueError, match="unknown SimGrid variant"):
        simgrid_spec(SMALL, cases, "ns3")


def test_a_tree_receiver_waits_for_every_comm_on_its_path() -> None:
    routes = {"h1": ("p", "l0", "s", "l1", "h1"), "h0": ("p", "l0", "h0")}
    case = build_cases(SMALL)[0]
    case.transfers = [Transfer("p", routes, True)]
    edges = case.transfers[0].edges()
    finish = [float(i + 1) for i in range(len(edges))]
    done = dict(zip(edges, finish, strict=True))
    got = receiver_times(case, finish)
    assert got == [max(done[e] for e in zip(r, r[1:], strict=False)) for r in routes.values()]
    with pytest.raises(ValueError, match="comm times"):
        receiver_times(case, [*finish, 9.0])


def test_table_rows_and_ratios() -> None:
    cases = build_cases(SMALL)[:2]
    home = [[1.0, 2.0], [4.0]]
    sim = {"raw": [[1.0, 3.0], [2.0]]}
    rows = compare(SMALL, cases, home, sim)
    assert rows[0]["home_last_ms"] == 2000.0 and rows[0]["raw_ratio_last"] == 1.5
    assert rows[0]["raw_ratio_mean"] == pytest.approx(2.0 / 1.5, rel=1e-3)
    assert rows[1]["raw_ratio_last"] == 0.5
    table = format_table(rows, ["raw"])
    assert "| SimGrid raw (ms) | raw / home |" in table and "| 1.500 |" in table
    with pytest.raises(ValueError, match="receivers"):
        compare(SMALL, cases, home, {"raw": [[1.0], [2.0]]})


def test_bad_config_is_refused() -> None:
    with pytest.raises(ValueError, match="N must be"):
        CrossCheckConfig(fabric=replace(SMALL.fabric, leaves=2, hosts_per_leaf=2), ns=(5,))
    with pytest.raises(ValueError, match="variants"):
        CrossCheckConfig(variants=("ns3",))


def test_command_line_writes_the_table(tmp_path: Path) -> None:
    assert main(["--quick", "--variants", "raw", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "crosscheck.json").read_text())
    rows = data["rows"]
    assert {r["scenario"] for r in rows} >= {"unicast", "multicast", "replicas-2"}
    assert (tmp_path / "crosscheck.csv").read_text().startswith("oversub,scenario,n,transfers")
    if simgrid_available():
        assert data["simgrid_version"] and all("raw_last_ms" in r for r in rows)


@needs_simgrid
@pytest.mark.parametrize("oversub", [2.0, 8.0])
def test_simgrid_raw_model_agrees_with_the_home_model(oversub: float) -> None:
    cfg = replace(SMALL, fabric=replace(SMALL.fabric, oversub=oversub))
    cases = build_cases(cfg)
    got = run_simgrid(cfg, cases, "raw")
    assert got is not None
    times, version = got
    assert version.startswith("4.")
    for case, sim in zip(cases, times, strict=True):
        home = run_home(cfg, case)
        # The last receiver agrees everywhere; so does every unicast receiver (max-min both).
        assert max(sim) == pytest.approx(max(home), rel=1e-4), case.name
        if "multicast" not in case.scenario:
            assert sorted(sim) == pytest.approx(sorted(home), rel=1e-4), case.name
        else:
            # A tree as one comm per link is multi-rate: a receiver behind fast links only is
            # not held to the slowest branch, so none is later than in the home model.
            assert all(s <= h * (1 + 1e-4) for s, h in zip(sim, home, strict=True)), case.name


@needs_simgrid
def test_simgrid_parallel_tasks_hold_a_tree_at_one_rate() -> None:
    cfg = replace(SMALL, fabric=replace(SMALL.fabric, oversub=8.0))
    cases = [c for c in build_cases(cfg) if c.scenario in ("multicast", "unicast")]
    got = run_simgrid(cfg, cases, "ptask")
    assert got is not None
    for case, sim in zip(cases, got[0], strict=True):
        assert sim == pytest.approx(run_home(cfg, case), rel=1e-4), case.name


@needs_simgrid
def test_simgrid_lv08_costs_latency_and_factors() -> None:
    cfg = replace(SMALL, variants=("lv08",))
    cases = [c for c in build_cases(cfg) if c.name in ("unicast/1", "unicast/16")]
    got = run_simgrid(cfg, cases, "lv08")
    assert got is not None
    one, sixteen = got[0]
    # Alone, a flow is held to 0.97 of its bottleneck and pays 13.01 x its route's latency.
    assert one[0] == pytest.approx(ONE / 0.97 + 13.01 * 2e-6, rel=1e-3)
    # Sixteen share the pool NIC: every flow moves 0.97 of the share it is given, after its
    # route's latency x 13.01 (2 or 4 links of 1 us): the pool NIC is never idle after the
    # first flows' latency.
    assert max(sixteen) == pytest.approx(16 * ONE / 0.97 + 13.01 * 2e-6, rel=1e-6)
    # RTT-weighted sharing: the receivers under the pool's leaf (shorter route) end first,
    # where the home model ends all sixteen together.
    local = [t for i, t in enumerate(sixteen) if i % SMALL.fabric.leaves == 0]
    remote = [t for i, t in enumerate(sixteen) if i % SMALL.fabric.leaves != 0]
    assert max(local) < min(remote)
