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
    assert got["batched_gbps"] > 0 and got["equal"] is True
    assert main(["--shape", "tiny", "--lengths", "", "--load-tokens", "64",
                 "--repeats", "1", "--device", "cpu", "--out", str(tmp_path)]) == 0  # fmt: skip
    (entry,) = json.loads((tmp_path / "prefill.json").read_text())
    assert entry["tokens"] == 64 and entry["blocks"] == 4


def test_the_layered_step_matches_the_serial_step_and_waits_for_the_transfer() -> None:
    from experiments.prefill_rate import measure_pipeline

    got = measure_pipeline("tiny", [128], suffix=32, rates_gbps=[0.02], repeats=1, device="cpu")
    (point,) = got["points"]
    assert point["prefix"] == 96 and point["kv_bytes"] == 96 * got["kv_bytes_per_token"]
    assert point["fetch_s"] == 96 * got["kv_bytes_per_token"] * 8 / 0.02e9
    # The serial step starts its forward only once the whole prefix is in.
    assert point["serial_s"] >= point["fetch_s"]
    assert point["layered_s"] >= point["fetch_s"] * (1 / 2)  # the last layer lands at fetch_s
    assert point["equal"] is True


def test_a_layer_that_ran_before_its_kv_landed_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    from experiments import prefill_rate

    # A broken wait: the forward no longer waits for a layer's KV, so it reads zeros. The
    # bytes land only once the forward is over (at join), whatever the machine's load.
    monkeypatch.setattr(prefill_rate._Arrival, "wait", lambda self, layer: None)
    monkeypatch.setattr(prefill_rate._Arrival, "start", lambda self, t0, fetch_s: None)
    monkeypatch.setattr(prefill_rate._Arrival, "join", lambda self: self._run(0.0, 0.0))
    got = prefill_rate.measure_pipeline("tiny", [128], 32, [0.02], repeats=1, device="cpu")
    assert got["points"][0]["equal"] is False
