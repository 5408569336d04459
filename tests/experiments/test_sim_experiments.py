import csv

import pytest

from experiments.sim import q1, q2, q3, q4
from experiments.sim.report import parse_result, result_line


def _results(out: str, name: str) -> list[dict[str, str]]:
    parsed = [parse_result(line) for line in out.splitlines()]
    return [fields for p in parsed if p is not None and p[0] == name for fields in [p[1]]]


def _rows(path) -> list[dict[str, str]]:
    with path.open() as fh:
        return list(csv.DictReader(fh))


def test_q1_smoke_compares_policies_with_the_optimum(tmp_path, capsys):
    args = ["--quick", "--out", str(tmp_path), "--workloads", "agentic", "--hosts", "64"]
    args += ["--budgets", "4", "--load", "instant", "--policies", "kvcast,lru,belady"]
    assert q1.main(args) == 0
    lines = _results(capsys.readouterr().out, "q1")
    runs = [f for f in lines if "byte_hit" in f]
    assert {f["policy"] for f in runs} == {"kvcast", "lru", "belady"}
    assert all({"budget", "pool_saved", "fetch_saved", "ratio_to_opt"} <= f.keys() for f in runs)
    assert len(_rows(tmp_path / "q1_selection.csv")) == len(lines)
    assert (tmp_path / "q1_selection.png").exists()


def test_q2_smoke_reports_tier_shares(tmp_path, capsys):
    args = ["--quick", "--out", str(tmp_path), "--workloads", "agentic", "--hosts", "64"]
    args += ["--models", "small-kv4", "--rules", "inclusive,exclusive", "--dram-gib", "32"]
    assert q2.main(args) == 0
    lines = _results(capsys.readouterr().out, "q2")
    assert len(lines) == 2
    for f in lines:
        shares = sum(
            float(f[k])
            for k in ("refs_hbm", "refs_dram", "refs_sram", "refs_pool", "refs_recompute")
        )
        assert shares == pytest.approx(1.0, abs=1e-3)
    assert len(_rows(tmp_path / "q2_tiers.csv")) == 2
    assert (tmp_path / "q2_tiers.png").exists()


def test_q3_smoke_measures_value_left_and_demotion(tmp_path, capsys):
    args = ["--quick", "--out", str(tmp_path), "--workloads", "agentic", "--hosts", "64"]
    args += ["--budgets", "4", "--demote-hosts", "8", "--pool-gib", "0.1"]
    assert q3.main(args) == 0
    lines = _results(capsys.readouterr().out, "q3")
    sram = [f for f in lines if f["part"] == "sram"]
    demote = [f for f in lines if f["part"] == "demote"]
    assert sram and all("value_left_hits" in f for f in sram)
    assert {f["pool_write"] for f in demote} == set(q3.POOL_MODES)
    assert len(_rows(tmp_path / "q3_sram.csv")) == len(sram)
    assert len(_rows(tmp_path / "q3_demote.csv")) == len(demote)
    assert (tmp_path / "q3_eviction.png").exists()


def test_q4_smoke_finds_a_breakeven_per_fabric(tmp_path, capsys):
    args = ["--quick", "--out", str(tmp_path), "--parts", "burst", "--ns", "1,4"]
    args += ["--scenarios", "kv4-reuse8"]
    assert q4.main(args) == 0
    lines = _results(capsys.readouterr().out, "q4")
    burst = [f for f in lines if f["part"] == "burst"]
    assert {(f["n"], f["fabric"]) for f in burst} == {
        (n, f) for n in ("1", "4") for f in ("unicast", "multicast", "kvcast")
    }
    assert {f["fabric"] for f in lines if f["part"] == "breakeven"} == {"multicast", "kvcast"}
    assert len(_rows(tmp_path / "q4_burst.csv")) == len(burst)
    assert (tmp_path / "q4_breakeven.png").exists()


def test_q4_trace_part_smoke(tmp_path, capsys):
    args = ["--quick", "--out", str(tmp_path), "--parts", "trace", "--models", "small-kv4"]
    assert q4.main(args) == 0
    lines = _results(capsys.readouterr().out, "q4")
    assert {f["fabric"] for f in lines} == {"unicast", "multicast", "kvcast"}
    assert (tmp_path / "q4_trace.csv").exists()


def test_breakeven_is_the_smallest_n_from_which_every_larger_n_pays():
    assert q4.breakeven([1, 2, 4, 8], [False, True, False, True]) == 8
    assert q4.breakeven([1, 2, 4, 8], [False, True, True, True]) == 2
    assert q4.breakeven([1, 2], [True, False]) is None


def test_result_lines_round_trip():
    line = result_line("q1", echo=False, policy="kvcast", budget=4194304, byte_hit=0.123456)
    assert parse_result(line) == (
        "q1",
        {"policy": "kvcast", "budget": "4194304", "byte_hit": "0.1235"},
    )
    with pytest.raises(ValueError):
        result_line("q1", echo=False, policy="two words")
