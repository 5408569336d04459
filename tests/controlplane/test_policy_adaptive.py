"""The learning policy ``adaptive``: which expert it follows, when it switches, what it keeps."""

from __future__ import annotations

import pytest

from controlplane.policies import AdaptivePolicy, PolicyConfigError, make_policy
from experiments.policies.evaluate import replay
from experiments.policies.workloads import Request, Workload, chat_sessions_workload

B = 10


def hot_and_scan(rounds: int) -> Workload:
    """Four hot keys, then a scan of eight new ones, every round: W-TinyLFU's frequency filter
    keeps the hot keys in a 6-chunk cache, LRU loses them to every scan."""
    requests = []
    t = 0.0
    fresh = 1000
    for _ in range(rounds):
        for key in (1, 2, 3, 4):
            requests.append(Request(t, 0, 0, (key,)))
            t += 1.0
        for _ in range(8):
            requests.append(Request(t, 0, 0, (fresh,)))
            fresh += 1
            t += 1.0
    return Workload("hot-and-scan", tuple(requests), B)


def test_adaptive_follows_the_expert_that_hits_more() -> None:
    w = hot_and_scan(400)
    p = AdaptivePolicy(6 * B, experts=("lru", "wtinylfu"))
    mine = replay(w, p)
    lru = replay(w, make_policy("lru", capacity_bytes=6 * B))
    assert p.leader == "wtinylfu" and p.switches == 1
    assert mine.hit_refs > 2 * lru.hit_refs


def test_adaptive_stays_with_its_first_expert_without_a_significant_lead() -> None:
    p = AdaptivePolicy(6 * B, experts=("lru", "wtinylfu"), z=1e6)
    replay(hot_and_scan(400), p)
    assert (p.leader, p.switches) == ("lru", 0)


def test_adaptive_holds_the_leaders_resident_set_after_every_access() -> None:
    w = chat_sessions_workload(n_sessions=60, seed=3)
    p = AdaptivePolicy(64 * w.block_bytes)
    for a in w.accesses():
        p.observe(a)
        assert p.resident_keys() == p.expert(p.leader).resident_keys()
    assert p.used_bytes <= p.capacity_bytes


def test_adaptive_switches_only_where_a_request_starts() -> None:
    # A hot 6-block request between two scans of fresh 3-block requests, 8 blocks of SRAM:
    # the lead builds up inside the hot request (switching there would come at block 4).
    requests = []
    t, fresh = 0.0, 1000
    for _ in range(300):
        requests.append(Request(t, 0, 0, (1, 2, 3, 4, 5, 6)))
        for _ in range(2):
            requests.append(Request(t, 0, 0, (fresh, fresh + 1, fresh + 2)))
            fresh += 3
        t += 1.0
    w = Workload("chains", tuple(requests), B)
    p = AdaptivePolicy(8 * B, experts=("lru", "wtinylfu"))
    positions = []
    for a in w.accesses():
        before = p.leader
        p.observe(a)
        if p.leader != before:
            positions.append(a.position)
    assert positions == [0]


def test_adaptive_batch_select_takes_the_leaders_set() -> None:
    accesses = hot_and_scan(300).accesses()
    p = AdaptivePolicy(6 * B, experts=("lru", "wtinylfu"))
    for start in range(0, len(accesses), 24):
        batch = accesses[start : start + 24]
        p.record_many(batch)
        p.select(batch[-1].time)
        assert p.resident_keys() == p.expert(p.leader).resident_keys()
    assert p.leader == "wtinylfu"


@pytest.mark.parametrize(
    "experts",
    [(), ("lru", "lru"), ("belady",), ("adaptive",), ("nope",)],
)
def test_adaptive_refuses_experts_it_cannot_run(experts: tuple[str, ...]) -> None:
    with pytest.raises(PolicyConfigError):
        AdaptivePolicy(6 * B, experts=experts)
