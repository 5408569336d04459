import csv
import random
from dataclasses import replace

import pytest

from experiments.sim import validate
from experiments.sim.incast import MODES, IncastParams, predict
from experiments.sim.report import parse_result

PARAMS = IncastParams(pool_mbit=20.0, host_mbit=200.0, switch_pps=30_000.0)
COLUMNS = [
    "mode",
    "label",
    "n",
    "prefix_bytes",
    "ok_hosts",
    "p50_s",
    "p99_s",
    "max_s",
    "pool_tx_bytes",
]


def _write_summary(path, noise=0.0, repeats=1, seed=0, ok_hosts=None):
    """A synthetic emulation summary: the model's own times, scaled by random noise."""
    rng = random.Random(seed)
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(COLUMNS)
        for n in (1, 2, 4, 8, 16):
            for m in MODES:
                pt = predict(m, n, 256 * 1024, PARAMS)
                for _ in range(repeats):
                    f = 1 + rng.uniform(-noise, noise)
                    ok = n if ok_hosts is None else ok_hosts
                    w.writerow(
                        [
                            m,
                            MODES[m],
                            n,
                            pt.prefix_bytes,
                            ok,
                            pt.p50_s * f,
                            pt.max_s * f,
                            pt.max_s * f,
                            pt.pool_tx_bytes,
                        ]
                    )
    return path


def _args(summary, out, *extra):
    return [
        "--emulation",
        str(summary),
        "--pool-mbit",
        "20",
        "--host-mbit",
        "200",
        "--out",
        str(out),
        *extra,
    ]


def test_validator_reports_every_ratio_within_tolerance_for_data_the_model_explains(
    tmp_path, capsys
):
    summary = _write_summary(tmp_path / "summary.csv", noise=0.03, repeats=3)
    rc = validate.main(_args(summary, tmp_path / "out", "--switch-pps", "30000"))
    out = capsys.readouterr().out
    assert rc == 0
    results = [
        parse_result(line) for line in out.splitlines() if line.startswith("result validate")
    ]
    ratios = [f for _, f in results if f.get("quantity", "").startswith("a/")]
    assert {f["quantity"] for f in ratios} == {f"a/{m}" for m in MODES if m != "a"}
    assert all(f["within"] == "yes" for f in ratios)
    summary_line = [f for _, f in results if f.get("summary") == "relief"]
    assert summary_line and summary_line[0]["compared"] == summary_line[0]["within"]
    assert (tmp_path / "out" / "validation.csv").exists()
    assert (tmp_path / "out" / "validation.png").exists()


def test_validator_flags_a_model_that_misses_the_measurement(tmp_path, capsys):
    summary = _write_summary(tmp_path / "summary.csv")
    # a switch ten times slower than the one that made the data: SRAM modes are mispredicted
    rc = validate.main(_args(summary, tmp_path / "out", "--switch-pps", "3000"))
    out = capsys.readouterr().out
    assert rc == 1
    assert "within=no" in out


def test_calibration_recovers_the_switch_rate_and_replica_cost(tmp_path, capsys):
    summary = _write_summary(tmp_path / "summary.csv")
    points = validate.read_summary(summary)
    d16 = next(p for p in points if p.mode == "d" and p.n == 16)
    c16 = next(p for p in points if p.mode == "c" and p.n == 16)
    base = IncastParams(pool_mbit=20.0, host_mbit=200.0, replica_cost=0.9)
    pps = validate.calibrate_switch_pps(d16, base)
    assert pps == pytest.approx(30_000.0, rel=1e-3)
    rep = validate.calibrate_replica_cost(c16, replace(base, switch_pps=pps))
    assert rep == pytest.approx(PARAMS.replica_cost, abs=1e-3)
    rc = validate.main(_args(summary, tmp_path / "out", "--calibrate"))
    out = capsys.readouterr().out
    assert rc == 0
    assert "quantity=a/d measured" in out and "counted=no" in out


def test_repeats_are_reduced_to_their_median_and_failed_rows_skipped(tmp_path):
    summary = _write_summary(tmp_path / "summary.csv", noise=0.2, repeats=3)
    points = validate.read_summary(summary)
    assert len(points) == 5 * len(MODES)
    assert all(p.repeats == 3 for p in points)
    failed = _write_summary(tmp_path / "failed.csv", ok_hosts=0)
    assert [p for p in validate.read_summary(failed) if p.n > 0] == []


def test_a_summary_without_the_contract_columns_is_refused(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("mode,n,max_s\na,1,0.1\n")
    assert validate.main(_args(bad, tmp_path / "out")) == 2
    assert "missing column" in capsys.readouterr().err


def test_replicas_split_the_pool_load_k_ways() -> None:
    p = IncastParams(pool_mbit=2.0, host_mbit=20.0)
    a, r2, r4 = (predict(m, 8, 256 * 1024, p) for m in ("a", "r2", "r4"))
    assert r2.max_s == pytest.approx(a.max_s / 2, rel=0.02)
    assert r4.max_s == pytest.approx(a.max_s / 4, rel=0.02)
    assert a.pool_tx_bytes == r2.pool_tx_bytes == r4.pool_tx_bytes  # N copies either way
    one = predict("a", 1, 256 * 1024, p).max_s
    assert predict("r4", 1, 256 * 1024, p).max_s == pytest.approx(one)  # one host: one replica
