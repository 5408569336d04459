"""Mininet smoke test of the trace replay: tens of requests that share a prefix, cache on vs off.

Checks bytes and counts, never times: with the controller applying its decisions, the shared
blocks end up in switch SRAM and the pool node sends fewer bytes than when the controller only
watches (dry run); every fetched block arrives complete and verified in both runs.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from emulation.switches import RefSwitch
from tests.mininet_env import MININET_MISSING

pytestmark = [pytest.mark.slow, pytest.mark.netns]

REQUESTS = 24
SHARED = [1, 2, 3]  # every request starts with these blocks
Summaries = dict[str, dict[str, Any]]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Summaries:
    if MININET_MISSING:
        pytest.skip(MININET_MISSING)
    from experiments.trace_replay.plan import plan_requests
    from experiments.trace_replay.processes import ControllerSettings
    from experiments.trace_replay.run import run_experiment

    trace = tmp_path_factory.mktemp("trace") / "shared.jsonl"
    trace.write_text(
        "".join(
            json.dumps({"timestamp": 250 * i, "hash_ids": [*SHARED, 100 + i]}) + "\n"
            for i in range(REQUESTS)
        )
    )
    requests = plan_requests(trace, max_requests=REQUESTS, hosts=2, seed=1)
    got = run_experiment(
        requests,
        switch_cls=RefSwitch,
        hosts=2,
        block_bytes=1024,
        speedup=1.0,
        pool_mbit=20.0,
        host_mbit=200.0,
        controller=ControllerSettings(tick_s=0.2),
        progress=lambda _s: None,
    )
    return {name: r.summary() for name, r in got.items()}


def test_every_request_gets_verified_blocks_in_both_runs(results: Summaries) -> None:
    for name, s in results.items():
        assert s["missing"] == 0, name
        assert s["requests_ok"] == REQUESTS, (name, s)
        assert s["blocks_fetched"] == (REQUESTS - 1) * len(SHARED), name


def test_the_cache_on_run_sends_fewer_pool_bytes_when_blocks_repeat(results: Summaries) -> None:
    on, off = results["cache-on"], results["cache-off"]
    assert on["pool_tx_bytes"] < off["pool_tx_bytes"], (on, off)
    assert on["blocks_hit"] > 0 and on["loads"] > 0


def test_the_cache_off_run_never_loads_or_hits(results: Summaries) -> None:
    off = results["cache-off"]
    assert off["loads"] == 0 and off["blocks_hit"] == 0 and off["frag_hit_ratio"] == 0.0
    assert off["pool_tx_bytes"] >= off["blocks_fetched"] * 1024


def test_agents_reports_reach_the_controller(results: Summaries) -> None:
    for name, s in results.items():
        assert s["reports"] == REQUESTS * (len(SHARED) + 1), name
