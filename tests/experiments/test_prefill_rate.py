"""experiments.prefill_rate on the CPU with the tiny shape: what the GPU run measures, checked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="transformers not installed (make setup)")


def test_prefill_and_cached_step_are_measured_per_length() -> None:
    from experiments.prefill_rate import measure

    got = measure("tiny", [128, 256], suffix=32, repeats=1, device="cpu")
    assert got["kv_bytes_per_token"] == 2 * 2 * 1 * 64 * 2
    assert [p["tokens"] for p in got["prefill"]] == [128, 256]
    assert all(p["s"] > 0 and p["us_per_token"] > 0 for p in got["prefill"])
    assert [(x["prefix"], x["suffix"]) for x in got["cached"]] == [(96, 32), (224, 32)]
    assert got["cached"][1]["kv_bytes"] == 224 * got["kv_bytes_per_token"]


def test_the_connectors_copy_path_is_timed_and_fills_every_block(tmp_path: Path) -> None:
    from experiments.prefill_rate import main, measure_scatter

    got = measure_scatter("tiny", 256, "cpu", repeats=1)
    assert got["blocks"] == 16 and got["bytes"] == 256 * 2 * 2 * 64 * 2 and got["gbps"] > 0
    assert main(["--shape", "tiny", "--lengths", "", "--load-tokens", "64",
                 "--repeats", "1", "--device", "cpu", "--out", str(tmp_path)]) == 0  # fmt: skip
    (entry,) = json.loads((tmp_path / "prefill.json").read_text())
    assert entry["tokens"] == 64 and entry["blocks"] == 4
