"""experiments.incast_results from results alone (no cluster): CSVs, plot and the final table."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from experiments.incast_results import (
    MODES,
    PointResult,
    fit_sim,
    format_table,
    parse_modes,
    relief_table,
    replica_key,
    write_outputs,
)
from experiments.sim.incast import IncastParams


def _point(mode: str, n: int, seconds: float, repeat: int = 0, **host: object) -> PointResult:
    hosts = [{"host": f"h{i + 1}", "role": "leader", "ok": True, "verified": True,
              "completion_s": seconds, "retries": 1, "timeouts": 0, "repairs": 0, **host}
             for i in range(n)]  # fmt: skip
    return PointResult(mode, n, 1024, hosts, pool_tx_bytes=1024 * n, repeat=repeat)


def test_repeats_give_a_median_and_a_range_paired_by_repeat(tmp_path: Path) -> None:
    # mode a takes 1, 1, 3 s over three repeats; mode c a tenth of that in each.
    results = [_point(m, n, t * n * f, repeat=k) for m, t in (("a", 1.0), ("c", 0.1))
               for n in (1, 2) for k, f in enumerate((1.0, 1.0, 3.0))]  # fmt: skip
    paths = write_outputs(results, tmp_path, "a test run")
    assert paths["plot"].stat().st_size > 0
    with paths["summary"].open() as f:
        assert len(list(csv.DictReader(f))) == len(results)
    rows = relief_table(results)
    c2 = next(r for r in rows if r["mode"] == "c" and r["n"] == 2)
    assert (c2["t_s"], c2["t_min_s"], c2["t_max_s"]) == (0.2, 0.2, 0.6)
    assert (c2["relief"], c2["relief_min"], c2["relief_max"]) == (10.0, 10.0, 10.0)
    assert (c2["retries"], c2["ok"], c2["repeats"]) == (6, "6/6", 3)
    assert [r["mode"] for r in rows if r["n"] == 1] == ["a", "c"]


def test_a_failed_repeat_is_left_out_of_times_and_counted_in_ok(tmp_path: Path) -> None:
    results = [_point("a", 2, 2.0, 0), _point("a", 2, 9.0, 1, ok=False), _point("d", 2, 0.5, 0),
               _point("d", 2, 0.4, 1)]  # fmt: skip
    rows = {r["mode"]: r for r in relief_table(results)}
    assert rows["a"]["t_max_s"] == 2.0 and rows["a"]["ok"] == "2/4"
    assert rows["d"]["relief"] == 4.0  # only repeat 0 has a complete mode a to pair with


def test_hosts_csv_keeps_the_experiment_mode_and_the_mininet_names(tmp_path: Path) -> None:
    results = [_point("b", 2, 1.0)]
    paths = write_outputs(results, tmp_path)
    with paths["hosts"].open() as f:
        rows = list(csv.DictReader(f))
    assert [(r["host"], r["mode"], r["role"]) for r in rows] == [
        ("h1", "b", "leader"),
        ("h2", "b", "leader"),
    ]


def test_the_table_is_aligned_titled_and_carries_the_prediction() -> None:
    results = [_point("a", 4, 4.0), _point("b", 4, 1.0), _point("r2", 4, 2.0)]
    sim = IncastParams(pool_mbit=2.0, host_mbit=20.0, frag_bytes=256)
    rows = relief_table(results, sim)
    assert next(r for r in rows if r["mode"] == "r2")["sim_relief"] == pytest.approx(2.0, rel=0.05)
    text = format_table(rows, "kvcast incast: test", ["a note"])
    lines = text.splitlines()
    assert lines[0] == "kvcast incast: test" and lines[-1] == "a note"
    body = [ln for ln in lines[2:-2] if ln and not ln.startswith("-")]
    assert len({len(ln) for ln in body[1:]}) <= 2  # rows line up (only the label column varies)
    assert "pool-replicas-2" in text and "sim a/x" in lines[2]


def test_fit_sim_fits_the_switch_to_the_largest_n() -> None:
    results = [_point(m, n, t) for n in (1, 8) for m, t in (("a", n * 1.1), ("c", 0.3), ("d", 2.0))]
    params = fit_sim(results, 2.0, 20.0)
    assert params.switch_pps is not None and params.switch_pps > 0
    assert fit_sim([_point("a", 1, 1.0)], 2.0, 20.0).switch_pps is None


def test_modes_parse_in_both_spellings_and_replica_keys_stay_in_their_buckets() -> None:
    assert parse_modes("abcd") == ["a", "b", "c", "d"]
    assert parse_modes("a,r2,r4") == ["a", "r2", "r4"]
    assert parse_modes("r4") == ["r4"]
    with pytest.raises(ValueError, match="unknown"):
        parse_modes("a,z")
    assert [replica_key(0x5EED0000, j) & 0xFF for j in range(4)] == [0, 1, 2, 3]
    with pytest.raises(ValueError):
        replica_key(0x5EED0001, 1)
    assert {m.label for m in MODES.values()} >= {"pool-replicas-2", "pool-replicas-4"}


def test_what_a_point_puts_in_flight_fits_the_switch_queue() -> None:
    from experiments.incast import SWITCH_QUEUE_FRAMES, agent_window, pool_requesters

    for name in ("a", "c", "d", "r2", "r4"):
        for n in (2, 16, 32, 64):
            mode = MODES[name]
            load = n if mode.via == "switch" else pool_requesters(mode, n)
            assert load * agent_window(mode, n) <= max(SWITCH_QUEUE_FRAMES, load), (name, n)
    assert agent_window(MODES["a"], 1) == 32  # one host keeps the full window
    assert agent_window(MODES["b"], 32) == 32  # one leader for the whole group
    assert agent_window(MODES["d"], 32, window=1) == 1
    assert pool_requesters(MODES["b"], 32) == 1 and pool_requesters(MODES["r4"], 6) == 2


def test_points_that_failed_outright_are_tabled_and_plotted_without_times(tmp_path: Path) -> None:
    results = [_point("a", 2, 2.0), _point("c", 2, 0.2),
               PointResult("d", 2, 1024, error="switch: UNAVAILABLE")]  # fmt: skip
    paths = write_outputs(results, tmp_path, "a switch died")
    rows = {r["mode"]: r for r in relief_table(results)}
    assert rows["d"]["t_s"] is None and rows["d"]["ok"] == "0/2"
    assert "UNAVAILABLE" in paths["summary"].read_text()
    d_line = next(ln for ln in format_table(list(rows.values()), "t").splitlines()
                  if ln.split()[:2] == ["2", "d"])  # fmt: skip
    assert d_line.split()[3:6] == ["-", "-", "-"]  # no time, no range, no relief
