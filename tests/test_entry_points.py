"""Every ``python -m`` entry point the README and docs name answers ``--help``.

A help string with a bare ``%`` (argparse formats help with ``%``) once made
``python -m experiments.faults --help`` crash; this keeps every entry point's help working.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ENTRY_POINTS = [
    "benchmarks", "controlplane", "fuzz", "poolnode", "refswitch",
    "hostagent.agent", "hostagent.vllm_events", "benchmarks.loopback", "benchmarks.vllm_layers",
    "kvcast.tools.gen_constants", "kvcast.tools.tofino_summary",
    "experiments.faults", "experiments.incast", "experiments.lofo", "experiments.prefill_rate",
    "experiments.prefix_share", "experiments.replication", "experiments.serving",
    "experiments.serving_engine", "experiments.trace_replay", "experiments.sim.validate",
    "experiments.sim.fabric", "experiments.sim.crosscheck", "experiments.sram_tokens",
    "experiments.q1_selection", "experiments.q2_tiers", "experiments.q3_eviction",
    "experiments.q4_breakeven", "experiments.selection_bounds",
]  # fmt: skip


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_help_works(module: str) -> None:
    got = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert got.returncode == 0, got.stderr[-2000:]
    assert "usage:" in got.stdout.lower()


def test_every_documented_entry_point_is_listed() -> None:
    import re

    named = set()
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        named |= set(re.findall(r"python -m ((?:[a-z_0-9]+\.)*[a-z_0-9]+)", doc.read_text()))
    named -= {"pytest", "pip", "venv"}
    importable = {m for m in named if (REPO / m.replace(".", "/")).with_suffix(".py").exists()
                  or (REPO / m.replace(".", "/") / "__main__.py").exists()}  # fmt: skip
    assert importable <= set(ENTRY_POINTS), sorted(importable - set(ENTRY_POINTS))
