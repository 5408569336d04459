"""The fabric placement simulation: each rule puts its copies where it says, the model counts."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.sim.fabric import RULES, FabricSimConfig, RuleResult, main, simulate

SMALL = FabricSimConfig(
    leaves=4, spines=2, hosts_per_leaf=4, groups=8, members=4, member_leaves=2, sram_prefixes=8
)


def by_rule(cfg: FabricSimConfig) -> dict[str, RuleResult]:
    return {r.rule: r for r in simulate(cfg)}


def test_without_a_cache_every_group_costs_the_pool_one_copy() -> None:
    got = by_rule(SMALL)["pool"]
    assert got.groups_from_sram == 0 and got.sram_copies == 0
    assert got.pool_bytes == pytest.approx(SMALL.groups * SMALL.prefix_bytes)


def test_rack_local_groups_cached_where_they_meet_cross_no_fabric_link() -> None:
    local = FabricSimConfig(**{**SMALL.__dict__, "rack_local": 1.0})
    got = by_rule(local)
    first = got["first-meet"]
    assert first.pool_bytes == 0 and first.fabric_bytes == 0
    assert first.sram_copies == local.groups
    # The pool's leaf caches too, but its hits still cross the fabric to other racks.
    assert got["pool-leaf"].fabric_bytes > 0


def test_member_leaves_costs_a_copy_per_member_leaf() -> None:
    cross = FabricSimConfig(**{**SMALL.__dict__, "rack_local": 0.0})
    got = by_rule(cross)
    assert got["member-leaves"].sram_copies == 2 * cross.groups
    assert got["first-meet"].sram_copies == cross.groups
    # One copy per group through the fabric: never more fabric bytes than serving from the pool.
    assert got["first-meet"].fabric_bytes <= got["pool"].fabric_bytes


def test_a_full_meeting_switch_spills_to_the_next_on_the_path() -> None:
    # One slot per switch and only two spines: cross-rack groups that meet on a spine take the
    # pool node's leaf next, so first-meet never caches fewer groups than the spine rule.
    tight = FabricSimConfig(**{**SMALL.__dict__, "rack_local": 0.0, "sram_prefixes": 1})
    got = by_rule(tight)
    assert got["first-meet"].groups_from_sram >= got["spine"].groups_from_sram
    assert got["first-meet"].groups_from_sram > 2


def test_bad_configs_and_rules_are_refused() -> None:
    with pytest.raises(ValueError):
        FabricSimConfig(hosts_per_leaf=4, members=8, rack_local=0.5)
    with pytest.raises(ValueError):
        FabricSimConfig(leaves=4, member_leaves=5)
    with pytest.raises(ValueError, match="unknown rule"):
        simulate(SMALL, rules=["nearest"])


def test_the_command_writes_every_rule_per_cell(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(["--quick", "--out", str(tmp_path), "--rack-local", "0.5", "--sram-prefixes", "2"])
        == 0
    )
    rows = (tmp_path / "fabric.csv").read_text().splitlines()
    assert len(rows) == 1 + len(RULES)
    assert "first-meet" in capsys.readouterr().out
