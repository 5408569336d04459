"""The loopback benchmark runs and prints parseable result lines."""

from __future__ import annotations

import re

import pytest

from hostagent import bench


def test_quick_benchmark_prints_a_result_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--quick"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("bench fetch")]
    assert len(lines) == 1
    assert re.search(r"server=socket .*MBps=\d+\.\d .*retries=\d+", lines[0])
