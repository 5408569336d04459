"""Contract tests run against every registered cache policy.

A policy registered with ``register_policy`` is picked up here automatically; offline
policies are given the future of the sequence they are about to see. Every test runs twice:
with kvcast's C record path (when built) and with ``KVCAST_NATIVE=0``, the Python one.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from controlplane.policies import (
    NO_CHANGE,
    Access,
    CachePolicy,
    Decision,
    EvictAction,
    InvalidAccessError,
    PolicyConfigError,
    available_policies,
    make_policy,
    policy_class,
    register_policy,
)
from controlplane.policies.kvcast_native import _ext as kvcast_native_ext
from controlplane.policies.lru import LruPolicy
from kvcast.kvclass import KvClass

BLOCK = 1000
ALL = available_policies()


@pytest.fixture(autouse=True, params=["native", "python"])
def record_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs the test on kvcast's C record path and on its Python path."""
    if request.param == "native" and kvcast_native_ext is None:
        pytest.skip(
            "controlplane.policies._kvcast_native not built (pip install -e . compiles it "
            "with gcc and python3-dev)"
        )
    monkeypatch.setenv("KVCAST_NATIVE", "1" if request.param == "native" else "0")
    return str(request.param)


def build(name: str, capacity: int, seq: Sequence[Access], **params: object) -> CachePolicy:
    if policy_class(name).offline:
        params = {**params, "future": [a.key for a in seq]}
    return make_policy(name, capacity_bytes=capacity, **params)


def chain_workload(n_requests: int, seed: int, *, variable_sizes: bool) -> list[Access]:
    """Prefix-consistent accesses: Zipf-ish documents of 1-6 blocks plus a unique tail."""
    rng = random.Random(seed)
    docs = []
    next_key = 1
    for _ in range(40):
        length = rng.randint(1, 6)
        docs.append(list(range(next_key, next_key + length)))
        next_key += length
    sizes: dict[int, int] = {}
    out: list[Access] = []
    for r in range(n_requests):
        doc = docs[min(int(rng.paretovariate(1.0)) - 1, len(docs) - 1)]
        blocks = [*doc, next_key]
        next_key += 1
        host = rng.randrange(8)
        parent = None
        for i, key in enumerate(blocks):
            size = sizes.setdefault(key, rng.randint(1, 3) * BLOCK if variable_sizes else BLOCK)
            out.append(Access(key, 0, size, host, r * 0.5, None, parent, i))
            parent = key
    return out


def apply_and_check(policy: CachePolicy, before: frozenset[int], decision: Decision) -> None:
    """The decision explains the change of resident set exactly, within budget."""
    evicted = [e.key for e in decision.evict]
    admitted = [a.key for a in decision.admit]
    assert len(set(evicted)) == len(evicted)
    assert len(set(admitted)) == len(admitted)
    assert set(evicted) <= before
    assert not set(admitted) & before
    assert policy.resident_keys() == (before - set(evicted)) | set(admitted)
    assert policy.used_bytes <= policy.capacity_bytes
    for e in decision.evict:
        assert e.action in (EvictAction.DROP, EvictAction.DEMOTE)
        assert e.residual >= 0.0


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("variable_sizes", [False, True])
def test_online_never_exceeds_budget_and_decisions_match_state(
    name: str, variable_sizes: bool
) -> None:
    seq = chain_workload(300, seed=7, variable_sizes=variable_sizes)
    sizes = {a.key: a.size for a in seq}
    policy = build(name, 8 * BLOCK, seq)
    for access in seq:
        before = policy.resident_keys()
        decision = policy.observe(access)
        apply_and_check(policy, before, decision)
        assert policy.used_bytes == sum(sizes[k] for k in policy.resident_keys())


@pytest.mark.parametrize("reuse_modes", [False, True])
@pytest.mark.parametrize("variable_sizes", [False, True])
def test_kvcast_with_shadow_rankings_keeps_the_contract(
    variable_sizes: bool, reuse_modes: bool
) -> None:
    """The opt-in shadow rankings (kvcast's scoring variants, with or without the fast-reuse
    one) under the same checks: budget, decisions that explain the resident set,
    determinism, batch select."""
    seq = chain_workload(300, seed=7, variable_sizes=variable_sizes)
    sizes = {a.key: a.size for a in seq}
    runs = []
    for _ in range(2):
        policy = build("kvcast", 8 * BLOCK, seq, shadow_rankings=True, reuse_modes=reuse_modes)
        decisions = []
        for access in seq:
            before = policy.resident_keys()
            decision = policy.observe(access)
            apply_and_check(policy, before, decision)
            assert policy.used_bytes == sum(sizes[k] for k in policy.resident_keys())
            decisions.append(decision)
        runs.append(decisions)
    assert runs[0] == runs[1]
    batch = build("kvcast", 8 * BLOCK, seq, shadow_rankings=True, reuse_modes=reuse_modes)
    batch.record_many(seq)
    before = batch.resident_keys()
    apply_and_check(batch, before, batch.select(seq[-1].time))
    assert batch.resident_keys()


@pytest.mark.parametrize("name", ALL)
def test_evicts_to_make_room_for_a_new_hot_set(name: str) -> None:
    old = [
        Access(k, 0, BLOCK, k % 4, float(i), None, None, 0) for i, k in enumerate([1, 2, 3, 4] * 5)
    ]
    new = [
        Access(k, 0, BLOCK, k % 4, 20.0 + i, None, None, 0)
        for i, k in enumerate([11, 12, 13, 14] * 50)
    ]
    seq = old + new
    policy = build(name, 4 * BLOCK, seq)
    evictions = 0
    for access in seq:
        before = policy.resident_keys()
        decision = policy.observe(access)
        apply_and_check(policy, before, decision)
        evictions += len(decision.evict)
    assert evictions >= 4
    assert policy.resident_keys() & {11, 12, 13, 14}


@pytest.mark.parametrize("name", ALL)
def test_deterministic(name: str) -> None:
    seq = chain_workload(200, seed=3, variable_sizes=True)
    runs = []
    for _ in range(2):
        policy = build(name, 6 * BLOCK, seq)
        runs.append([policy.observe(a) for a in seq])
    assert runs[0] == runs[1]


@pytest.mark.parametrize("name", ALL)
def test_unknown_keys_are_harmless(name: str) -> None:
    policy = build(name, 4 * BLOCK, [])
    assert 12345 not in policy
    assert policy.residual_value(12345, 0.0) == 0.0
    assert policy.invalidate(12345) is NO_CHANGE
    assert policy.rank(0.0) == []


@pytest.mark.parametrize("name", ALL)
def test_empty_input_changes_nothing(name: str) -> None:
    policy = build(name, 4 * BLOCK, [])
    assert policy.observe_many([]) is NO_CHANGE
    assert policy.record_many([]) == 0
    assert not policy.on_tick(0.0)
    assert not policy.select(0.0)
    assert len(policy) == 0
    assert policy.used_bytes == 0


@pytest.mark.parametrize("name", ALL)
def test_chunk_larger_than_budget_is_refused(name: str) -> None:
    big = Access(99, 0, 5 * BLOCK, 0, 0.0)
    seq = [big, Access(1, 0, BLOCK, 0, 1.0), big, big, big]
    policy = build(name, 4 * BLOCK, seq)
    decisions = [policy.observe(a) for a in seq]
    for access, decision in zip(seq, decisions, strict=True):
        if access.key == 99:
            assert decision.refused == (99,)
            assert not decision.admit and not decision.evict
    assert 99 not in policy
    assert policy.used_bytes <= 4 * BLOCK


@pytest.mark.parametrize("name", ALL)
def test_batch_record_then_select_fills_within_budget(name: str) -> None:
    seq = chain_workload(300, seed=11, variable_sizes=True)
    policy = build(name, 10 * BLOCK, seq)
    assert policy.record_many(seq) == len(seq)
    before = policy.resident_keys()
    decision = policy.select(seq[-1].time)
    apply_and_check(policy, before, decision)
    # Ranking is best first and covers every resident chunk.
    ranked = policy.rank(seq[-1].time)
    assert policy.resident_keys() <= {r.key for r in ranked}


@pytest.mark.parametrize("name", ALL)
def test_on_tick_after_online_run_keeps_budget(name: str) -> None:
    seq = chain_workload(200, seed=5, variable_sizes=False)
    policy = build(name, 6 * BLOCK, seq)
    for access in seq:
        policy.observe(access)
    before = policy.resident_keys()
    apply_and_check(policy, before, policy.on_tick(seq[-1].time + 1.0))


@pytest.mark.parametrize("name", ALL)
def test_observe_many_returns_net_change(name: str) -> None:
    seq = chain_workload(200, seed=9, variable_sizes=True)
    policy = build(name, 6 * BLOCK, seq)
    for access in seq[:100]:
        policy.observe(access)
    before = policy.resident_keys()
    decision = policy.observe_many(seq[100:])
    apply_and_check(policy, before, decision)


@pytest.mark.parametrize("name", ALL)
def test_invalidate_drops_a_resident_chunk(name: str) -> None:
    seq = chain_workload(200, seed=13, variable_sizes=False)
    policy = build(name, 6 * BLOCK, seq)
    for access in seq:
        policy.observe(access)
    assert len(policy) > 0
    victim = min(policy.resident_keys())
    before = policy.resident_keys()
    decision = policy.invalidate(victim)
    apply_and_check(policy, before, decision)
    assert victim not in policy
    assert victim in {e.key for e in decision.evict}
    assert all(e.action is EvictAction.DROP for e in decision.evict)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize(
    "access",
    [
        Access(1, 0, 0, 0, 0.0),
        Access(-1, 0, BLOCK, 0, 0.0),
        Access(1 << 64, 0, BLOCK, 0, 0.0),
    ],
)
def test_malformed_access_is_rejected(name: str, access: Access) -> None:
    policy = build(name, 4 * BLOCK, [access])
    with pytest.raises(InvalidAccessError):
        policy.observe(access)
    with pytest.raises(InvalidAccessError):
        policy.record(access)


def test_registry_lists_builtin_policies() -> None:
    assert {"lru", "lfu", "sketch", "kvcast", "belady"} <= set(available_policies())
    assert "belady" not in available_policies(include_offline=False)
    assert policy_class("belady").offline
    assert not policy_class("kvcast").offline


def test_make_policy_rejects_unknown_name_and_parameters() -> None:
    with pytest.raises(PolicyConfigError, match="unknown policy"):
        make_policy("nope", capacity_bytes=BLOCK)
    with pytest.raises(PolicyConfigError, match="lru"):
        make_policy("lru", capacity_bytes=BLOCK, no_such_param=1)
    with pytest.raises(PolicyConfigError, match="capacity_bytes"):
        make_policy("lru", capacity_bytes=0)


def test_register_policy_refuses_a_taken_name() -> None:
    class Other(LruPolicy):
        pass

    with pytest.raises(PolicyConfigError, match="already registered"):
        register_policy("lru")(Other)
    assert policy_class("lru") is LruPolicy


# ---------------------------------------------------------------------- KV classes
ONLINE = available_policies(include_offline=False)


def _class_workload(t0: float, branch_keys: Sequence[int], reps: int = 2) -> list[Access]:
    """A static prefix 1 -> 2 used once early, then branch suffixes used ``reps`` times each."""
    out = [Access(1, 0, BLOCK, 0, t0, None, None, 0), Access(2, 0, BLOCK, 0, t0, None, 1, 1)]
    for i, key in enumerate(branch_keys):
        for rep in range(reps):
            out.append(Access(key, 0, BLOCK, 1 + i, t0 + 1 + i + rep * 0.1, None, None, 0))
    return out


@pytest.mark.parametrize("name", ONLINE)
def test_transient_chunks_leave_before_static_ones_under_pressure(name: str) -> None:
    plain = make_policy(name, capacity_bytes=4 * BLOCK)
    classed = make_policy(name, capacity_bytes=4 * BLOCK)
    for key in (1, 2):  # the controller marks every block of a static prefix
        classed.set_kv_class(key, KvClass.STATIC)
    for policy in (plain, classed):
        policy.record_many(_class_workload(0.0, [10, 11, 12, 13]))
        policy.select(10.0)
    assert not {1, 2} <= plain.resident_keys(), "the workload must put the prefix at risk"
    assert {1, 2} <= classed.resident_keys()
    # A new, hotter set of branches: every eviction it causes is transient.
    classed.record_many(_class_workload(20.0, [20, 21, 22, 23, 24], reps=6)[2:])
    decision = classed.select(30.0)
    assert all(ev.key not in (1, 2) for ev in decision.evict)
    assert {1, 2} <= classed.resident_keys() and len(classed.resident_keys()) == 4
    assert classed.resident_bytes_by_class() == {
        KvClass.STATIC: 2 * BLOCK,
        KvClass.TRANSIENT: 2 * BLOCK,
    }


def test_kvcast_keeps_the_tracked_ancestors_of_a_static_block() -> None:
    policy = make_policy("kvcast", capacity_bytes=4 * BLOCK)
    policy.set_kv_class(2, KvClass.STATIC)  # 1 is its parent: a prefix of a static prefix
    policy.record_many(_class_workload(0.0, [10, 11, 12, 13]))
    policy.select(10.0)
    policy.record_many(_class_workload(20.0, [20, 21, 22, 23, 24], reps=6)[2:])
    policy.select(30.0)
    assert {1, 2} <= policy.resident_keys()


@pytest.mark.parametrize("name", ["kvcast", "lru"])
def test_a_chunk_set_back_to_transient_competes_on_its_value_again(name: str) -> None:
    policy = make_policy(name, capacity_bytes=4 * BLOCK)
    policy.set_kv_class(2, KvClass.STATIC)
    policy.record_many(_class_workload(0.0, [10, 11, 12, 13]))
    policy.select(10.0)
    assert 2 in policy.resident_keys()
    policy.set_kv_class(2, KvClass.TRANSIENT)
    assert policy.kv_class(2) is KvClass.TRANSIENT and not policy.static_keys()
    policy.record_many(_class_workload(20.0, [20, 21, 22, 23], reps=6)[2:])
    policy.select(30.0)
    assert 2 not in policy.resident_keys()
