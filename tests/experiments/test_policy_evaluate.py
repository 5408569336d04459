"""The trace-driven evaluation: hit definition, optimum, workloads, and a smoke run."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from controlplane.policies import (
    NO_CHANGE,
    Access,
    CachePolicy,
    Decision,
    Ranked,
    available_policies,
    make_policy,
)
from experiments.policies.evaluate import evaluate, fractional_opt_bytes, opt_result, replay
from experiments.policies.workloads import (
    Request,
    Workload,
    agentic_fanout_workload,
    load_mooncake_trace,
    zipf_prefix_workload,
)
from experiments.traces import SHIPPED_TRACE, TRACE_ENV, TraceFormatError, default_trace_path

ONLINE = available_policies(include_offline=False)


class StaticPolicy(CachePolicy):
    """Test double: a fixed resident set that never changes."""

    def __init__(self, capacity_bytes: int, resident: dict[int, int]) -> None:
        super().__init__(capacity_bytes)
        for key, size in resident.items():
            self._admit(key, 0, size, 1.0)

    def _update(self, access: Access) -> None:
        pass

    def _decide(self, access: Access) -> Decision:
        return NO_CHANGE

    def rank(self, now: float) -> list[Ranked]:
        return [Ranked(k, 0, 1, 1.0, True) for k in self.resident_keys()]

    def residual_value(self, key: int, now: float) -> float:
        return 0.0


def workload(*requests: tuple[int, ...]) -> Workload:
    return Workload("hand", tuple(Request(float(i), 0, 0, r) for i, r in enumerate(requests)), 10)


def test_a_resident_block_behind_a_miss_is_not_a_prefix_hit() -> None:
    w = workload((1, 2, 3), (1, 2, 3))
    result = replay(w, StaticPolicy(100, {1: 10, 3: 10}))
    # Request 1 and 2: block 1 hits, block 2 misses, block 3 is resident but behind a miss.
    assert result.hit_refs == 2
    assert result.hit_bytes == 20
    assert result.any_hit_bytes == 40
    assert result.total_bytes == 60
    assert result.byte_hit_ratio == pytest.approx(20 / 60)


def test_opt_matches_hand_count_and_is_prefix_closed() -> None:
    w = workload((1, 2), (1, 3), (1, 2), (4,), (1, 3))
    opt = opt_result(w, 2 * 10)
    # Two slots. Block 1 is reused 3 times and keeps a slot. The other slot can earn one hit:
    # 2's reuse (request 3) or 3's reuse (request 5), not both, since 3 must be cached at its
    # first access (request 2), before 2's reuse. Optimum = 3 + 1 = 4 hits.
    assert opt.hit_refs == 4
    assert opt.hit_bytes == opt.any_hit_bytes


@pytest.mark.parametrize("seed", [1, 2])
def test_no_online_policy_beats_the_optimum(seed: int) -> None:
    w = zipf_prefix_workload(n_requests=300, n_documents=60, seed=seed, block_bytes=10)
    for c in evaluate(w, ONLINE, [8, 32]):
        assert c.ratio_to_opt <= 1.0 + 1e-12, (c.result.policy, c.budget_blocks)
        assert 0.0 <= c.result.byte_hit_ratio <= 1.0


def test_belady_is_prefix_closed_on_prefix_workloads() -> None:
    w = agentic_fanout_workload(n_tasks=20, seed=5, block_bytes=10)
    for blocks in (8, 64):
        opt = opt_result(w, blocks * 10)
        assert opt.hit_bytes == opt.any_hit_bytes


def test_fractional_bound_equals_belady_for_equal_sizes() -> None:
    w = zipf_prefix_workload(n_requests=300, n_documents=60, seed=4, block_bytes=10)
    keys = w.key_sequence()
    for blocks in (4, 16, 64):
        bound = fractional_opt_bytes(keys, [10] * len(keys), blocks * 10)
        assert bound == pytest.approx(opt_result(w, blocks * 10).any_hit_bytes)


def test_fractional_bound_dominates_every_policy_with_variable_sizes() -> None:
    w = zipf_prefix_workload(n_requests=200, n_documents=40, seed=6, block_bytes=10)
    sizes = {k: 10 * (1 + k % 3) for k in w.key_sequence()}
    accesses = [
        Access(a.key, a.tenant, sizes[a.key], a.host, a.time, None, a.parent, a.position)
        for a in w.accesses()
    ]
    capacity = 150
    bound = fractional_opt_bytes([a.key for a in accesses], [a.size for a in accesses], capacity)
    for name in available_policies():
        params = {"future": [a.key for a in accesses]} if name == "belady" else {}
        policy = make_policy(name, capacity_bytes=capacity, **params)
        hit = 0
        for a in accesses:
            hit += a.size if a.key in policy else 0
            policy.observe(a)
        assert hit <= bound + 1e-6, name


GENERATORS: list[Callable[[], Workload]] = [
    lambda: zipf_prefix_workload(n_requests=400, n_documents=50, churn_period_s=20.0),
    lambda: agentic_fanout_workload(n_tasks=30),
]


@pytest.mark.parametrize("make", GENERATORS, ids=["zipf", "agentic"])
def test_generated_workloads_are_reproducible_and_prefix_consistent(
    make: Callable[[], Workload],
) -> None:
    a, b = make(), make()
    assert a.requests == b.requests
    parent: dict[int, int | None] = {}
    for r in a.requests:
        prev = None
        for key in r.blocks:
            assert parent.setdefault(key, prev) == prev  # one parent per key
            prev = key
    times = [r.time for r in a.requests]
    assert times == sorted(times)


def test_agentic_branches_share_the_prefix_across_distinct_hosts() -> None:
    w = agentic_fanout_workload(n_tasks=10, fanout_min=4, fanout_max=4, steps_mean=1.0, seed=3)
    hosts_by_prefix: dict[tuple[int, ...], set[int]] = {}
    for r in w.requests:
        hosts_by_prefix.setdefault(r.blocks[:7], set()).add(r.host)
    # system (4) + toolset (3) blocks are shared by the planner and all 4 branches of a task
    assert max(len(h) for h in hosts_by_prefix.values()) >= 4


def test_trace_loader_parses_and_rejects_bad_lines(tmp_path: Path) -> None:
    good = tmp_path / "t.jsonl"
    good.write_text(
        json.dumps({"timestamp": 1500, "input_length": 1, "output_length": 1, "hash_ids": [0, 1]})
        + "\n"
        + json.dumps({"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [0]})
        + "\n"
    )
    w = load_mooncake_trace(good, hosts=4)
    assert w.name == "t"  # named by its file, never "conversation" for another trace
    assert load_mooncake_trace(SHIPPED_TRACE, limit=1).name == "conversation"
    assert [r.time for r in w.requests] == [0.0, 1.5]
    assert [a.parent for a in w.accesses()] == [None, None, 0]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 3}\n')
    with pytest.raises(TraceFormatError, match="bad.jsonl:1"):
        load_mooncake_trace(bad)


def test_the_conversation_trace_ships_with_the_repository() -> None:
    assert default_trace_path() == SHIPPED_TRACE or os.environ.get(TRACE_ENV)
    lines = SHIPPED_TRACE.read_text().splitlines()
    assert len(lines) == 12031
    assert json.loads(lines[0])["hash_ids"][0] == 0


def test_kvcast_trace_names_another_trace(tmp_path, monkeypatch) -> None:
    other = tmp_path / "other.jsonl"
    other.write_text('{"timestamp": 0, "hash_ids": [1]}\n')
    monkeypatch.setenv(TRACE_ENV, str(other))
    assert default_trace_path() == other
    monkeypatch.setenv(TRACE_ENV, str(tmp_path / "missing.jsonl"))
    assert default_trace_path() is None


def test_smoke_evaluation_on_a_slice_of_the_conversation_trace() -> None:
    w = load_mooncake_trace(SHIPPED_TRACE, limit=400)
    results = evaluate(w, ONLINE, [32, 128])
    assert {c.result.policy for c in results} == {*ONLINE, "belady"}
    for c in results:
        assert c.result.refs == w.n_refs
        assert c.ratio_to_opt <= 1.0 + 1e-12
    opt = [c for c in results if c.result.policy == "belady"]
    assert all(c.ratio_to_opt == 1.0 and c.result.hit_bytes > 0 for c in opt)
