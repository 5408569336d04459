"""Trace replay planning (no root needed): keys, what is fetched, host assignment, slices."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.trace_replay.plan import block_key, distinct_blocks, plan_requests
from experiments.trace_replay.run import main
from experiments.traces import SHIPPED_TRACE


def write_trace(path: Path, requests: list[tuple[int, list[int]]]) -> Path:
    path.write_text(
        "".join(
            json.dumps({"timestamp": ts, "input_length": 1, "output_length": 1, "hash_ids": ids})
            + "\n"
            for ts, ids in requests
        )
    )
    return path


def test_block_keys_are_stable_distinct_64_bit_values() -> None:
    keys = [block_key(i) for i in range(10_000)]
    assert len(set(keys)) == len(keys)
    assert all(0 <= k < 1 << 64 for k in keys)
    assert block_key(7) == block_key(7)
    assert len({k & 0xFF for k in keys}) == 256  # spread over every pool bucket


def test_a_request_fetches_exactly_its_prefix_seen_in_earlier_requests(tmp_path: Path) -> None:
    trace = write_trace(
        tmp_path / "t.jsonl",
        [(0, [1, 2, 3]), (100, [1, 2, 4, 5]), (200, [1, 2, 4, 3]), (300, [9, 1])],
    )
    reqs = plan_requests(trace, max_requests=10, hosts=2)
    k = {i: block_key(i) for i in (1, 2, 3, 4, 5, 9)}
    assert [(r.fetch, r.computed) for r in reqs] == [
        ((), (k[1], k[2], k[3])),
        ((k[1], k[2]), (k[4], k[5])),
        ((k[1], k[2], k[4], k[3]), ()),  # 3 was seen (request 0), at another position
        ((), (k[9], k[1])),  # a seen block behind an unseen one is computed, not fetched
    ]
    assert [r.time for r in reqs] == [0.0, 0.1, 0.2, 0.3]
    assert distinct_blocks(reqs) == [k[1], k[2], k[3], k[4], k[5], k[9]]


def test_hosts_are_assigned_by_seed_and_a_slice_keeps_its_hosts(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.jsonl", [(i * 10, [i]) for i in range(50)])
    whole = plan_requests(trace, max_requests=50, hosts=4, seed=3)
    assert whole == plan_requests(trace, max_requests=50, hosts=4, seed=3)
    assert {r.host for r in whole} == {0, 1, 2, 3}
    part = plan_requests(trace, max_requests=10, start=20, hosts=4, seed=3)
    assert [r.host for r in part] == [r.host for r in whole[20:30]]
    assert [r.index for r in part] == list(range(10))


def test_bad_slices_are_refused(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.jsonl", [(0, [1])])
    with pytest.raises(ValueError, match="max_requests"):
        plan_requests(trace, max_requests=0)


def test_the_shipped_trace_reuses_block_zero_from_the_second_request() -> None:
    reqs = plan_requests(SHIPPED_TRACE, max_requests=400, hosts=8)
    assert reqs[0].fetch == () and all(r.fetch[:1] == (block_key(0),) for r in reqs[1:])
    fetched = sum(len(r.fetch) for r in reqs)
    assert fetched == 1528  # prefix blocks an earlier request used (docs/controlplane.md)


def test_the_cli_refuses_bad_runs_before_building_anything(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--runs", "sideways", "--trace", "/dev/null"])
    assert exit_.value.code == 2
    assert "--runs takes cache-off and/or cache-on" in capsys.readouterr().err


def _row(t_start: float, t_done: float, **kw: int) -> dict[str, float]:
    base = {"blocks_hit": 0, "frags_pool": 0, "failed": 0, "fell_back": 0, "retries": 0,
            "wrong_bytes": 0}  # fmt: skip
    return {"t_start": t_start, "t_done": t_done, **base, **kw}


def test_a_pool_outage_lasts_until_the_pool_is_back_not_until_the_first_hit() -> None:
    from experiments.trace_replay.restarts import restart_outcome

    rows = [
        _row(100.1, 100.2, blocks_hit=1),  # a hit just after the kill at 100.0
        _row(100.3, 100.9, frags_pool=3, retries=2),  # waited for the pool, back at 100.6
        _row(101.0, 101.1, frags_pool=3),  # after the outage
    ]
    master = restart_outcome(rows, {"killed_at": 100.0, "up_s": 0.6})
    assert (master["requests_in_outage"], master["retries"]) == (2, 2)
    assert master["hits_return_s"] == pytest.approx(0.2)
    assert master["pool_return_s"] == pytest.approx(0.9)
    # A switch restart (re-synced by the daemon): the outage ends with the first hit.
    switch = restart_outcome(rows, {"killed_at": 100.0, "up_s": 0.6, "resync_s": 1.0})
    assert (switch["requests_in_outage"], switch["retries"]) == (1, 0)
