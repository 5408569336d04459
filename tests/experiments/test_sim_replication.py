import csv

import pytest

from experiments.sim.replication import MULTICAST, UNICAST, fetch_point, main
from experiments.sim.report import parse_result

MIB = 1 << 20


@pytest.mark.parametrize("n", [1, 4, 16])
def test_multicast_at_one_instant_relieves_n_and_sends_the_prefix_once(n: int) -> None:
    uni = fetch_point(UNICAST, n, 64 * MIB, 100)
    mc = fetch_point(MULTICAST, n, 64 * MIB, 100)
    assert uni.makespan_s / mc.makespan_s == pytest.approx(n, rel=1e-6)
    assert mc.pool_wire_bytes == pytest.approx(uni.pool_wire_bytes / n)


@pytest.mark.parametrize(("k", "n"), [(2, 16), (4, 16), (8, 4)])
def test_k_replicas_relieve_at_most_k_and_cost_k_copies(k: int, n: int) -> None:
    uni = fetch_point(UNICAST, n, 64 * MIB, 100)
    rep = fetch_point(f"replicas-{k}", n, 64 * MIB, 100)
    assert uni.makespan_s / rep.makespan_s == pytest.approx(min(k, n), rel=1e-6)
    assert rep.dram_bytes == k * 64 * MIB
    assert rep.pool_wire_bytes == pytest.approx(uni.pool_wire_bytes)


def test_multicast_cannot_help_consumers_that_never_overlap() -> None:
    # 4 consumers 250 ms apart; one stream of 64 MiB takes ~5 ms at 100 Gb/s.
    uni = fetch_point(UNICAST, 4, 64 * MIB, 100, spread_s=1.0)
    mc = fetch_point(MULTICAST, 4, 64 * MIB, 100, spread_s=1.0)
    assert mc.makespan_s == pytest.approx(uni.makespan_s, rel=1e-6)
    assert mc.pool_wire_bytes == pytest.approx(uni.pool_wire_bytes)


def test_a_late_joiner_repairs_what_it_missed_from_the_pool() -> None:
    # The second consumer asks halfway through the first one's stream.
    one = fetch_point(MULTICAST, 1, 64 * MIB, 100)
    two = fetch_point(MULTICAST, 2, 64 * MIB, 100, spread_s=one.makespan_s)
    assert two.pool_wire_bytes == pytest.approx(1.5 * one.pool_wire_bytes, rel=1e-3)


def test_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown mode"):
        fetch_point("replicas-x", 2, MIB, 100)


def test_quick_run_writes_csv_plot_and_result_lines(tmp_path, capsys) -> None:
    assert main(["--quick", "--out", str(tmp_path), "--spreads", "0"]) == 0
    lines = [p for p in map(parse_result, capsys.readouterr().out.splitlines()) if p]
    assert {f["mode"] for _, f in lines} == {
        UNICAST,
        "replicas-2",
        "replicas-4",
        "replicas-8",
        MULTICAST,
    }
    with (tmp_path / "replication.csv").open() as fh:
        assert len(list(csv.DictReader(fh))) == len(lines) == 3 * 2 * 5
    assert (tmp_path / "replication.png").stat().st_size > 0
