"""experiments.incast outputs from results alone (no cluster): CSVs, plot and relief table."""

from __future__ import annotations

import csv
from pathlib import Path

from experiments.incast import PointResult, relief_table, write_outputs


def _point(mode: str, n: int, seconds: float) -> PointResult:
    hosts = [{"host": f"h{i}", "ok": True, "verified": True, "completion_s": seconds}
             for i in range(n)]  # fmt: skip
    return PointResult(mode, n, 1024, hosts, pool_tx_bytes=1024 * n)


def test_repeated_points_are_written_and_plotted(tmp_path: Path) -> None:
    # Two repeats of every (mode, N) that took different times: the plot groups them by N (it
    # once sorted (N, summary) pairs, which compares two summaries of one N).
    results = [_point(m, n, t * n * rep) for m, t in (("a", 1.0), ("c", 0.1)) for n in (1, 2)
               for rep in (1.0, 1.0, 3.0)]  # fmt: skip
    paths = write_outputs(results, tmp_path)
    assert paths["plot"].stat().st_size > 0
    with paths["summary"].open() as f:
        assert len(list(csv.DictReader(f))) == len(results)
    rows = relief_table(results)
    assert [(r["n"], r["a/c"]) for r in rows] == [(1, 10.0), (2, 10.0)]  # medians of repeats
