"""kvcast's C record path gives the Python path's statistics and decisions, bit for bit.

Every test records the same accesses into a policy on the Python path and one on the C path
(``controlplane.policies._kvcast_native``) and compares every statistic of every tracked chunk,
the policy's scalar state, the ranking and the decisions that follow. ``record_arrays`` (column
input) is compared with ``record_many`` for every registered policy.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from controlplane.policies import (
    Access,
    AccessColumns,
    InvalidAccessError,
    KvcastPolicy,
    available_policies,
    make_policy,
)
from controlplane.policies.kvcast_native import native_record
from experiments.policies.evaluate import replay
from experiments.policies.workloads import (
    Workload,
    agentic_fanout_workload,
    chat_sessions_workload,
    multitenant_prompts_workload,
    zipf_prefix_workload,
)

needs_native = pytest.mark.skipif(
    native_record() is None,
    reason="controlplane.policies._kvcast_native not built (pip install -e . compiles it with "
    "gcc and python3-dev) or KVCAST_NATIVE=0",
)

BLOCK = 4096


def _workloads() -> list[Workload]:
    return [
        zipf_prefix_workload(n_requests=1500, n_documents=400),
        zipf_prefix_workload(n_requests=1500, n_documents=400, churn_period_s=60.0, name="churn"),
        agentic_fanout_workload(n_tasks=40),
        multitenant_prompts_workload(n_requests=1500),
        chat_sessions_workload(n_sessions=150),
    ]


def _state(p: KvcastPolicy) -> tuple[Any, ...]:
    metas = {
        k: (
            m.tenant,
            m.size,
            m.parent,
            m.position,
            m.count,
            m.cls,
            m.logs,
            m.pri,
            m.last,
            m.first,
            m.hosts,
        )
        for k, m in p._meta.items()
    }
    return (
        list(metas.items()),  # the dict's order too: pruning and ties depend on it
        float(p._clock_t) if p._clock_t is not None else None,
        p._clock_v,
        p.half_life_s,
        p._log_gap,
        p._gap_samples,
        p._cls_samples,
        list(p._cls_entries),
        list(p._cls_reuses),
        p._latest,
    )


def _live_heap(p: KvcastPolicy) -> list[tuple[float, int, int]]:
    """The live heap entries without their sequence numbers, in heap-pop order."""
    live = [e for e in p._heap if p._token.get(e[3]) == e[2]]
    return [(e[0], e[1], e[3]) for e in sorted(live)]


def _pair(**params: Any) -> tuple[KvcastPolicy, KvcastPolicy]:
    py = KvcastPolicy(256 * BLOCK, native=False, **params)
    c = KvcastPolicy(256 * BLOCK, **params)
    assert not py.native and c.native
    return py, c


@needs_native
@pytest.mark.parametrize(
    "params",
    [
        {},
        {"max_tracked": 600},  # pruning inside the batch
        {"learned_weights": False},
        {"half_life_s": 20.0, "repeat_host_weight": 1.0},
        {"history_weight": 0.5},
    ],
    ids=["default", "pruning", "unlearned", "fixed-half-life", "history-weight"],
)
def test_native_record_equals_python_record(params: dict[str, Any]) -> None:
    for w in _workloads():
        acc = w.accesses()
        py, c = _pair(**params)
        cut = len(acc) // 3
        # Online, then batches, then online again: the C path must leave the state the
        # Python path leaves, whatever came before.
        for a in acc[:cut]:
            assert py.observe(a) == c.observe(a)
        assert py.record_many(acc[cut : 2 * cut]) == c.record_many(acc[cut : 2 * cut])
        assert _state(py) == _state(c), w.name
        assert _live_heap(py) == _live_heap(c), w.name
        now = acc[2 * cut].time
        assert py.rank(now) == c.rank(now)
        assert py.select(now) == c.select(now)
        for a in acc[2 * cut :]:
            assert py.observe(a) == c.observe(a)
        assert _state(py) == _state(c), w.name


@needs_native
def test_record_arrays_equals_record_many_on_the_c_path() -> None:
    w = multitenant_prompts_workload(n_requests=1500)
    acc = w.accesses()
    cols = AccessColumns.of(acc)
    py, c = _pair(max_tracked=800)
    arr = KvcastPolicy(256 * BLOCK, max_tracked=800)
    py.record_many(acc)
    c.record_many(acc)
    assert arr.record_arrays(*cols) == len(acc)
    assert _state(py) == _state(c) == _state(arr)
    now = acc[-1].time
    assert py.select(now) == c.select(now) == arr.select(now)


@pytest.mark.parametrize("name", available_policies(include_offline=False))
def test_record_arrays_equals_record_many_for_every_policy(name: str) -> None:
    w = agentic_fanout_workload(n_tasks=20)
    acc = w.accesses()
    a = make_policy(name, capacity_bytes=64 * BLOCK)
    b = make_policy(name, capacity_bytes=64 * BLOCK)
    a.record_many(acc)
    assert b.record_arrays(*AccessColumns.of(acc)) == len(acc)
    now = acc[-1].time
    assert [(r.key, r.score) for r in a.rank(now)] == [(r.key, r.score) for r in b.rank(now)]
    assert a.select(now) == b.select(now)


@needs_native
def test_unusual_accesses_take_the_python_path_with_the_same_result() -> None:
    @dataclasses.dataclass(frozen=True, slots=True)
    class Report(Access):
        """A subclass: its slots are not at Access's offsets for all the C loop knows."""

    big = (1 << 64) - 1
    acc = [
        Access(big, 0, BLOCK, 3, 0),  # int time, the largest key
        Access(5, 0, BLOCK, -1, 0.5, parent=big),  # negative host (bit 63)
        Access(6, 1 << 70, BLOCK, 1 << 70, 1.0, parent=5, position=1 << 66),  # beyond 64 bits
        Report(7, 0, BLOCK, 2, 1.5, parent=6, position=2),
        Access(True, 0, BLOCK, 0, 2.0),  # a bool key is the int 1 to Python
        Access(5, "tenant-a", BLOCK, 4, 2.5, parent=big),  # any tenant object
        Access(big, 0, BLOCK, 3, 40),
    ] * 3
    py, c = _pair()
    for p in (py, c):  # a position beyond 64 bits is refused on both paths, after 2 accesses
        with pytest.raises(InvalidAccessError, match="position"):
            p.record_many(acc)
    assert _state(py) == _state(c) and len(c._meta) == 2
    acc = [a for a in acc if a.key != 6]
    py, c = _pair()
    assert py.record_many(acc) == c.record_many(acc) == len(acc)
    assert _state(py) == _state(c)
    assert py.select(50.0) == c.select(50.0)


@needs_native
def test_a_malformed_access_raises_after_the_ones_before_it_are_recorded() -> None:
    good = [Access(k, 0, BLOCK, 0, float(k)) for k in range(10)]
    for bad in (Access(99, 0, 0, 0, 10.0), Access(-1, 0, BLOCK, 0, 10.0)):
        py, c = _pair()
        for p in (py, c):
            with pytest.raises(InvalidAccessError):
                p.record_many([*good, bad, *good])
        assert _state(py) == _state(c)
        assert len(c._meta) == 10
    arr = KvcastPolicy(256 * BLOCK)
    cols = AccessColumns.of(good)
    sizes = cols.sizes.copy()
    sizes[4] = 0
    with pytest.raises(InvalidAccessError, match="size must be > 0"):
        arr.record_arrays(cols.keys, cols.tenants, sizes, cols.hosts, cols.times)
    assert len(arr._meta) == 4
    with pytest.raises(InvalidAccessError, match="shape"):
        arr.record_arrays(cols.keys, cols.tenants[:3], cols.sizes, cols.hosts, cols.times)


def test_kvcast_native_0_selects_the_python_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVCAST_NATIVE", "0")
    assert not KvcastPolicy(BLOCK).native
    assert not KvcastPolicy(BLOCK, native=False).native


@needs_native
def test_the_c_path_replays_a_workload_like_the_python_path() -> None:
    """An online replay (one access at a time) is unchanged by the C statistics type."""
    w = chat_sessions_workload(n_sessions=100)
    a = replay(w, KvcastPolicy(128 * BLOCK, native=False))
    b = replay(w, KvcastPolicy(128 * BLOCK))
    assert (a.hit_bytes, a.admissions, a.evictions) == (b.hit_bytes, b.admissions, b.evictions)
    assert np.isclose(a.byte_hit_ratio, b.byte_hit_ratio, rtol=0, atol=0)


def test_shadow_rankings_record_on_the_python_path_as_online() -> None:
    """With shadow rankings the batch goes through the Python record path (the ghosts and
    the four scores per chunk have no C step): a batch leaves the state that the same
    accesses leave one by one, and the variant chosen is the same."""
    for w in _workloads()[3:]:
        acc = w.accesses()
        batch = KvcastPolicy(64 * BLOCK, shadow_rankings=True)
        single = KvcastPolicy(64 * BLOCK, shadow_rankings=True)
        assert not batch.native
        assert batch.record_many(acc) == len(acc)
        for a in acc:
            single.record(a)
        assert _state(batch) == _state(single), w.name
        assert [(k, m.vlogs, m.vpri) for k, m in batch._meta.items()] == [
            (k, m.vlogs, m.vpri) for k, m in single._meta.items()
        ]
        assert batch.variant == single.variant
        now = acc[-1].time
        assert batch.rank(now) == single.rank(now)
        assert batch.select(now) == single.select(now)
