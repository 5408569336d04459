"""Smoke tests of the policy benchmark and of the benchmark runner's line format."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import bench_line, parse_line
from benchmarks.__main__ import discover, format_tables, main
from benchmarks.policies import _rate_rows, goal_rows, policy_rows, target_rows
from experiments.policies.workloads import zipf_prefix_workload


def test_bench_line_round_trips_through_parse_line() -> None:
    line = bench_line("policies", budget=512, policy="kvcast", byte_hit=0.41234567)
    assert line == "bench policies budget=512 policy=kvcast byte_hit=0.4123"
    assert parse_line(line) == (
        "policies",
        {"budget": "512", "policy": "kvcast", "byte_hit": "0.4123"},
    )
    assert parse_line("# a comment") is None
    assert parse_line("bench switch ratio refswitch/bmv2=0.50") == (
        "switch",
        {"label": "ratio", "refswitch/bmv2": "0.50"},
    )


def test_bench_line_rejects_values_with_spaces() -> None:
    with pytest.raises(ValueError, match="without spaces"):
        bench_line("x", name="two words")


def test_format_tables_groups_rows_by_suite() -> None:
    text = format_tables(
        [
            "bench a k=1 v=2",
            "noise",
            "bench b z=9",
            "bench a k=10 w=3",
        ]
    )
    lines = text.splitlines()
    assert lines[0] == "== a (2 rows)"
    assert lines[1].split() == ["k", "v", "w"]
    assert lines[2].split() == ["1", "2", "-"]
    assert lines[3].split() == ["10", "-", "3"]
    assert "== b (1 rows)" in lines


def test_runner_discovers_the_policy_suite() -> None:
    suites, _errors = discover()
    assert "policies" in {b.name for b in suites}


def test_runner_refuses_an_unknown_suite(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--only", "no-such-suite"]) == 2
    assert "unknown suite" in capsys.readouterr().out


def test_policy_rows_report_every_policy_against_the_optimum(
    capsys: pytest.CaptureFixture[str],
) -> None:
    w = zipf_prefix_workload(n_requests=200, n_documents=30, block_bytes=10)
    table: dict[int, dict[str, float]] = {}
    lines = policy_rows(w, [8], {"lru": ("lru", {}), "kvcast": ("kvcast", {})}, table)
    parsed = [parse_line(line) for line in lines]
    assert [p[1]["policy"] for p in parsed if p] == ["belady", "lru", "kvcast"]
    assert table[8]["belady"] == 1.0
    assert all(0.0 <= table[8][k] <= 1.0 for k in ("lru", "kvcast"))
    assert capsys.readouterr().out.count("bench policies") == 3


def test_target_rows_compare_kvcast_with_the_best_anchor() -> None:
    w = zipf_prefix_workload(n_requests=20, n_documents=5, block_bytes=10)
    table = {8: {"kvcast": 0.9, "lru": 0.5, "arc": 0.75, "opt_byte_hit": 0.3}, 16: {"lru": 1.0}}
    (line,) = target_rows(w, table)
    parsed = parse_line(line)
    assert parsed is not None
    fields = parsed[1]
    assert (fields["best_anchor"], fields["kvcast_over_best_anchor"]) == ("arc", "1.2")
    assert (fields["target"], fields["met"]) == ("1.15", "True")
    assert (fields["ceiling"], fields["reachable"]) == ("1.333", "True")


def test_target_rows_say_where_the_target_is_out_of_reach() -> None:
    """An anchor at 0.9 of the optimum leaves at most 1.11x: printed, and still not met."""
    w = zipf_prefix_workload(n_requests=20, n_documents=5, block_bytes=10)
    table = {8: {"kvcast": 0.95, "wtinylfu": 0.9, "opt_byte_hit": 0.3}}
    (line,) = target_rows(w, table)
    parsed = parse_line(line)
    assert parsed is not None
    fields = parsed[1]
    assert (fields["ceiling"], fields["reachable"], fields["met"]) == ("1.111", "False", "False")


def test_trace_option_names_the_trace_every_suite_replays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from experiments.traces import TRACE_ENV, default_trace_path

    # main() sets the variable for the suites; setenv records the state before the test, so
    # monkeypatch puts it back (unset) afterwards and no later test replays the test's trace.
    monkeypatch.setenv(TRACE_ENV, "")
    monkeypatch.delenv(TRACE_ENV)
    with pytest.raises(SystemExit) as exc:
        main(["--trace", str(tmp_path / "missing.jsonl"), "--list"])
    assert exc.value.code == 2 and "no such file" in capsys.readouterr().err
    other = tmp_path / "other.jsonl"
    other.write_text('{"timestamp": 0, "hash_ids": [1]}\n')
    assert main(["--trace", str(other), "--list"]) == 0
    assert default_trace_path() == other.resolve()


def test_rate_rows_time_every_record_path_and_check_they_select_alike(
    capsys: pytest.CaptureFixture[str],
) -> None:
    w = zipf_prefix_workload(n_requests=150, n_documents=20)
    lines = _rate_rows(w, w.accesses(), reps=2)
    fields = [parse_line(line) for line in lines]
    paths = [f[1]["path"] for f in fields if f]
    assert paths[0] == "python"
    assert set(paths) <= {"python", "native", "arrays"}
    for f in fields:
        assert f is not None and f[0] == "policies-rate"
        assert f[1]["runs"] == "2" and f[1]["same_selection"] == "True"
        assert f[1]["target_s"] == "1" and f[1]["met"] in ("True", "False")
    assert "policies-rate" in capsys.readouterr().out


def test_goal_rows_print_issue_29_targets_per_budget_and_policy() -> None:
    w = zipf_prefix_workload(n_requests=20, n_documents=5, block_bytes=10)
    table = {
        8: {"kvcast": 0.5, "adaptive": 0.45, "lru": 0.4, "arc": 0.3, "opt_byte_hit": 0.2},
        9: {"kvcast": 0.95, "wtinylfu": 0.9, "opt_byte_hit": 0.3},
    }
    lines = goal_rows(w, table, {8: "4%", 9: "16%"})
    parsed = [parse_line(x) for x in lines]
    cells = {(f[1]["budget"], f[1]["policy"]): f[1] for f in parsed if f is not None}
    low = cells["8", "kvcast"]
    assert (low["best_anchor"], low["ratio"], low["closed"]) == ("lru", "1.25", "0.167")
    assert (low["met_ratio"], low["met_close"], low["met"]) == ("yes", "yes", "yes")
    # 0.45 closes only 0.05 / 0.6 of the distance: behind the target, though ahead of LRU.
    assert (cells["8", "adaptive"]["met_close"], cells["8", "adaptive"]["met"]) == ("no", "no")
    high = cells["9", "kvcast"]
    assert (high["closed"], high["met_close"], high["met"]) == ("-", "n/a", "yes")
    assert ("9", "adaptive") not in cells
