"""Behaviour of each built-in policy on small hand-made sequences."""

from __future__ import annotations

import random

import pytest

from controlplane.policies import (
    Access,
    BeladyPolicy,
    EvictAction,
    FutureMismatchError,
    KvcastPolicy,
    LfuPolicy,
    LruPolicy,
    PolicyConfigError,
    SketchPolicy,
    make_policy,
)
from controlplane.policies.sketch import CountMinSketch
from experiments.policies.evaluate import replay
from experiments.policies.workloads import chat_sessions_workload

B = 100


def acc(key: int, t: float, *, host: int = 0, parent: int | None = None, pos: int = 0) -> Access:
    return Access(key, 0, B, host, t, None, parent, pos)


def run(policy: object, keys: list[int]) -> list[int]:
    """Observe single-block accesses one second apart; return the evicted keys in order."""
    assert isinstance(policy, (LruPolicy, LfuPolicy, SketchPolicy, KvcastPolicy, BeladyPolicy))
    evicted = []
    for i, k in enumerate(keys):
        evicted += [e.key for e in policy.observe(acc(k, float(i))).evict]
    return evicted


# --------------------------------------------------------------------------- LRU
def test_lru_evicts_least_recently_used() -> None:
    policy = LruPolicy(3 * B)
    assert run(policy, [1, 2, 3, 1, 4]) == [2]
    assert policy.resident_keys() == {1, 3, 4}


def test_lru_demotes_only_chunks_that_were_hit() -> None:
    policy = LruPolicy(1 * B)
    policy.observe(acc(1, 0.0))
    policy.observe(acc(1, 1.0))
    (ev,) = policy.observe(acc(2, 2.0)).evict
    assert (ev.key, ev.action) == (1, EvictAction.DEMOTE)
    (ev,) = policy.observe(acc(3, 3.0)).evict
    assert (ev.key, ev.action) == (2, EvictAction.DROP)


# --------------------------------------------------------------------------- LFU
def test_lfu_keeps_the_frequent_chunk_over_one_offs_at_first() -> None:
    policy = LfuPolicy(2 * B)
    run(policy, [1] * 10 + [100, 101, 102, 103, 104])
    assert 1 in policy


def test_lfu_aging_eventually_lets_newcomers_displace_an_old_favourite() -> None:
    policy = LfuPolicy(2 * B)
    evicted = run(policy, [1] * 10 + list(range(100, 130)))
    # Each eviction raises the age L by about one, so after ~10 one-off newcomers the
    # old count of 10 no longer protects key 1. Plain LFU would keep it forever.
    assert 1 in evicted
    assert 5 < evicted.index(1) < 15


# --------------------------------------------------------------------------- sketch
def test_count_min_sketch_never_underestimates_and_halves() -> None:
    sketch = CountMinSketch(4, 64)
    for k in range(200):
        for _ in range(k % 5):
            sketch.add(k)
    assert all(sketch.estimate(k) >= k % 5 for k in range(200))
    before = sketch.estimate(4)
    sketch.halve()
    assert sketch.estimate(4) == before // 2


def test_count_min_sketch_rejects_bad_shape() -> None:
    with pytest.raises(PolicyConfigError):
        CountMinSketch(4, 100)
    with pytest.raises(PolicyConfigError):
        CountMinSketch(0, 64)


def test_sketch_admits_when_estimate_reaches_threshold() -> None:
    policy = SketchPolicy(4 * B, threshold=3)
    assert not policy.observe(acc(7, 0.0)).admit
    assert not policy.observe(acc(7, 1.0)).admit
    assert [a.key for a in policy.observe(acc(7, 2.0)).admit] == [7]


def test_sketch_evicts_the_least_hit_cached_key() -> None:
    policy = SketchPolicy(2 * B, threshold=2, aging_misses=10_000)
    run(policy, [1, 1, 2, 2] + [1] * 5 + [2])  # 1 has 5 hits, 2 has 1 hit
    evicted = run(policy, [3, 3, 3])  # estimate 2 (not > 1 hit), then 3 > 1
    assert evicted == [2]
    assert policy.resident_keys() == {1, 3}


# --------------------------------------------------------------------------- kvcast
@pytest.mark.parametrize(("hysteresis", "max_evictions"), [(0.25, 1), (0.0, None)])
def test_kvcast_hysteresis_prevents_thrash_on_alternating_pattern(
    hysteresis: float, max_evictions: int | None
) -> None:
    policy = KvcastPolicy(1 * B, half_life_s=60.0, hysteresis=hysteresis)
    evicted = run(policy, [1, 2] * 100)
    if max_evictions is not None:
        assert len(evicted) <= max_evictions
    else:  # without hysteresis the same pattern swaps the chunk on every access
        assert len(evicted) > 150


def test_lru_thrashes_on_the_alternating_pattern() -> None:
    assert len(run(LruPolicy(1 * B), [1, 2] * 100)) == 199


def test_kvcast_prefers_a_chunk_reused_by_many_hosts() -> None:
    policy = KvcastPolicy(1 * B, half_life_s=60.0)
    for i in range(4):
        policy.record(acc(1, float(i), host=0))  # one host, four times
        policy.record(acc(2, float(i), host=i))  # four hosts
    policy.select(4.0)
    assert policy.resident_keys() == {2}
    assert [r.key for r in policy.rank(4.0)] == [2, 1]


def test_kvcast_host_weighting_can_be_turned_off() -> None:
    policy = KvcastPolicy(1 * B, half_life_s=60.0, repeat_host_weight=1.0, learned_weights=False)
    for i in range(4):
        policy.record(acc(1, float(i), host=0))
        policy.record(acc(2, float(i), host=i))
    assert policy.score(1, 4.0) == pytest.approx(policy.score(2, 4.0))


def test_kvcast_never_admits_a_block_whose_parent_is_not_resident() -> None:
    policy = KvcastPolicy(4 * B, half_life_s=60.0)
    for i in range(5):
        assert not policy.observe(acc(2, float(i), parent=1, pos=1)).admit
    assert len(policy) == 0
    policy.observe(acc(1, 6.0))
    assert [a.key for a in policy.observe(acc(2, 6.0, parent=1, pos=1)).admit] == [2]


def test_kvcast_evicts_children_before_parents_and_with_them() -> None:
    policy = KvcastPolicy(3 * B, half_life_s=60.0)
    for t in range(3):  # chain 1 -> 2 -> 3, all equally popular
        policy.observe(acc(1, float(t)))
        policy.observe(acc(2, float(t), parent=1, pos=1))
        policy.observe(acc(3, float(t), parent=2, pos=2))
    assert policy.resident_keys() == {1, 2, 3}
    hot = [policy.observe(acc(9, 10.0 + i / 10)) for i in range(20)]
    evicted = [e.key for d in hot for e in d.evict]
    assert evicted == [3]  # the deepest block goes first; the prefix 1 -> 2 stays usable
    decision = policy.invalidate(1)
    assert [e.key for e in decision.evict] == [2, 1]  # the orphaned child goes too
    assert policy.resident_keys() == {9}


def test_kvcast_adapts_half_life_to_the_reuse_gap() -> None:
    policy = KvcastPolicy(64 * B)
    t = 0.0
    for key in range(200):
        policy.observe(acc(key, t))
        policy.observe(acc(key, t + 4.0))  # every chunk is first reused after 4 s
        t += 0.5
    assert policy.half_life_s == pytest.approx(1.5 * 4.0, rel=0.15)
    fixed = KvcastPolicy(64 * B, half_life_s=300.0)
    for key in range(50):
        fixed.observe(acc(key, key * 0.5))
        fixed.observe(acc(key, key * 0.5 + 4.0))
    assert fixed.half_life_s == 300.0


def test_kvcast_learns_that_first_sightings_rarely_return() -> None:
    one_offs = KvcastPolicy(64 * B, half_life_s=60.0)
    for key in range(300):
        one_offs.observe(acc(key, key * 0.1))
    one_offs.observe(acc(1000, 30.0))
    plain = KvcastPolicy(64 * B, half_life_s=60.0, learned_weights=False)
    plain.observe(acc(1000, 30.0))
    assert plain.score(1000, 30.0) == pytest.approx(1.0)
    # About 1 in 300 first sightings came back: a new one weighs the floor, 1/64.
    assert one_offs.score(1000, 30.0) == pytest.approx(1 / 64)


def test_kvcast_weighs_a_first_sighting_by_how_often_such_blocks_came_back() -> None:
    policy = KvcastPolicy(64 * B, half_life_s=60.0)
    for key in range(300):  # every block comes back once, a second later
        policy.observe(acc(key, key * 0.1))
        policy.observe(acc(key, key * 0.1 + 1.0))
    policy.observe(acc(1000, 40.0))
    score = policy.score(1000, 40.0)
    assert score is not None and score > 0.95


def test_kvcast_learns_which_branches_of_the_prefix_tree_come_back() -> None:
    policy = KvcastPolicy(64 * B, half_life_s=60.0)
    t = 0.0
    for i in range(200):  # a branch under the hot root returns; its tail never does
        policy.observe(acc(1, t))
        policy.observe(acc(1000 + i, t, parent=1, pos=1))
        policy.observe(acc(5000 + i, t, parent=1000 + i, pos=2))
        policy.observe(acc(1, t + 0.5))
        policy.observe(acc(1000 + i, t + 0.5, parent=1, pos=1))
        t += 1.0
    policy.observe(acc(1, t))
    policy.observe(acc(1, t + 0.1))
    policy.observe(acc(9000, t + 0.1, parent=1, pos=1))  # a new branch under the root
    policy.observe(acc(9001, t + 0.1, parent=9000, pos=2))  # the tail of a new chain
    branch, tail = policy.score(9000, t + 0.1), policy.score(9001, t + 0.1)
    assert branch is not None and tail is not None
    assert branch > 0.9 and tail < 0.05


def test_kvcast_demotes_valuable_chunks_and_drops_stale_ones() -> None:
    policy = KvcastPolicy(1 * B, half_life_s=10.0, hysteresis=0.0, learned_weights=False)
    for i in range(8):
        policy.observe(acc(1, i * 0.1))
    (ev,) = [e for i in range(12) for e in policy.observe(acc(2, 1.0 + i * 0.1)).evict]
    assert (ev.key, ev.action) == (1, EvictAction.DEMOTE)  # score ~7 when displaced
    (ev,) = policy.observe(acc(3, 200.0)).evict
    assert (ev.key, ev.action) == (2, EvictAction.DROP)  # idle for 20 half-lives


def test_kvcast_bounds_its_metadata() -> None:
    policy = KvcastPolicy(4 * B, max_tracked=16)
    run(policy, list(range(1000)))
    assert len(policy.rank(1000.0)) <= 16 + 1


def test_kvcast_history_weight_leans_towards_the_last_access() -> None:
    """Below 1 the earlier accesses count less: a block reused many times long ago falls
    behind one used once just now sooner than with the plain decayed sum."""
    for weight, old_first in ((1.0, True), (0.25, False)):
        policy = KvcastPolicy(4 * B, half_life_s=60.0, learned_weights=False, history_weight=weight)
        for i in range(8):
            policy.observe(acc(1, float(i)))  # eight accesses in the first seconds
        policy.observe(acc(2, 60.0))  # one access a half-life later
        ranked = [r.key for r in policy.rank(60.0)]
        assert (ranked.index(1) < ranked.index(2)) is old_first


def _replay_hits(policy: KvcastPolicy, seq: list[tuple[int, float]]) -> int:
    """Single-block accesses (key, time) without prefix links; how many were resident."""
    hits = 0
    for key, t in seq:
        hits += key in policy
        policy.observe(acc(key, t))
    return hits


def _regulars_among_one_offs(rounds: int, pairs: int, scans: int) -> list[tuple[int, float]]:
    """Rounds of: blocks 0..7 0.1 s apart, ``pairs`` one-offs each reused once 2 s later and
    ``scans`` one-offs read once (both 0.5 s apart), then a 2 s pause; in time order."""
    seq = []
    t, one_off = 0.0, 10**6
    for _ in range(rounds):
        for k in range(8):
            seq.append((k, t))
            t += 0.1
        for _ in range(pairs):
            seq += [(one_off, t), (one_off, t + 2.0)]
            one_off += 1
            t += 0.5
        for _ in range(scans):
            seq.append((one_off, t))
            one_off += 1
            t += 0.5
        t += 2.0
    seq.sort(key=lambda e: e[1])
    return seq


def _shadow_against_plain(seq: list[tuple[int, float]]) -> tuple[str, int, int]:
    """``seq`` replayed on 12 blocks with and without shadow rankings: (the variant the
    shadowing policy ends on, its hits, the plain policy's hits)."""
    shadow = KvcastPolicy(12 * B, shadow_rankings=True)
    shadow_hits = _replay_hits(shadow, seq)
    return shadow.variant, shadow_hits, _replay_hits(KvcastPolicy(12 * B), seq)


def test_kvcast_shadow_rankings_pick_recency_on_chat_sessions() -> None:
    """Memoryless chat sessions: the last access predicts the next turn, the frequency does
    not. The ghosts see the recency variant's lead and the policy switches to it, with more
    hits than the default score alone."""
    w = chat_sessions_workload(n_sessions=300, seed=3)
    capacity = int(0.04 * len(set(w.key_sequence()))) * w.block_bytes
    plain = KvcastPolicy(capacity)
    shadow = KvcastPolicy(capacity, shadow_rankings=True)
    plain_hits = replay(w, plain).hit_bytes
    shadow_hits = replay(w, shadow).hit_bytes
    assert plain.variant == "default" and plain.variant_switches == 0
    assert shadow.variant == "recency" and shadow.variant_switches >= 1
    assert shadow_hits > 1.05 * plain_hits


def test_kvcast_shadow_rankings_pick_long_memory_for_rare_regulars() -> None:
    """Eight blocks come back every ~7 s while pairs of one-offs (reused once, 2 s apart) pull
    the adaptive half-life down to ~3 s: the default forgets the regulars between their
    visits, the slower-decaying variant keeps them."""
    variant, shadow_hits, plain_hits = _shadow_against_plain(_regulars_among_one_offs(400, 6, 0))
    assert variant == "long-memory"
    assert shadow_hits > 1.1 * plain_hits


def test_kvcast_shadow_rankings_pick_frequency_for_regulars_among_scans() -> None:
    """Eight blocks come back every ~23 s among 40 one-offs per round and four pairs reused
    2 s apart (which pull the adaptive half-life down to ~3 s): even the 2x slower decay has
    forgotten the regulars by their next visit; the frequency variant (8x slower, every
    access alike) keeps them."""
    variant, shadow_hits, plain_hits = _shadow_against_plain(_regulars_among_one_offs(150, 4, 40))
    assert variant == "frequency"
    assert shadow_hits > 4 * plain_hits


def test_kvcast_reuse_modes_pick_fast_reuse_for_bursts_after_long_gaps() -> None:
    """A new block every 0.5 s comes back once ~200 s later and then twice more 2 s apart:
    the first-reuse gaps put the adaptive half-life in the slow mode (minutes), where 16
    blocks hold nothing that returns. The two-cluster estimate finds the fast mode (2 s),
    and the fast-reuse variant, decaying on its half-life, catches the bursts."""
    rng = random.Random(5)
    seq = []
    for i in range(3000):
        back = 0.5 * i + 200.0 + rng.uniform(-20.0, 20.0)
        seq += [(i, 0.5 * i), (i, back), (i, back + 2.0), (i, back + 4.0)]
    seq.sort(key=lambda e: e[1])
    shadow = KvcastPolicy(16 * B, shadow_rankings=True)
    modes = KvcastPolicy(16 * B, shadow_rankings=True, reuse_modes=True)
    shadow_hits = _replay_hits(shadow, seq)
    modes_hits = _replay_hits(modes, seq)
    assert shadow.fast_half_life_s is None and shadow.variant == "default"
    assert modes.half_life_s > 100.0
    assert modes.fast_half_life_s is not None and 2.0 <= modes.fast_half_life_s <= 6.0
    assert modes.variant == "fast-reuse"
    assert modes_hits > 4 * shadow_hits


def test_kvcast_shadow_rankings_stay_put_without_a_significant_lead() -> None:
    """Working sets of 20 blocks, each read 10 times round-robin, then replaced: every
    variant hits (almost) the same, so the policy never switches."""
    seq = [(1000 * phase + k, 0.0) for phase in range(30) for _ in range(10) for k in range(20)]
    seq = [(k, float(i)) for i, (k, _) in enumerate(seq)]
    shadow = KvcastPolicy(25 * B, shadow_rankings=True)
    plain_hits = _replay_hits(KvcastPolicy(25 * B), seq)
    assert _replay_hits(shadow, seq) == plain_hits
    assert shadow.variant == "default" and shadow.variant_switches == 0


def test_kvcast_rejects_bad_parameters() -> None:
    for params in (
        {"half_life_s": 0.0},
        {"hysteresis": -0.1},
        {"repeat_host_weight": 0.0},
        {"max_tracked": 1},
        {"min_half_life_s": 10.0, "initial_half_life_s": 5.0},
        {"history_weight": 0.0},
        {"history_weight": 1.5},
        {"shadow_sample_chunks": 8},
        {"shadow_z": -1.0},
        {"reuse_modes": True},
    ):
        with pytest.raises(PolicyConfigError):
            make_policy("kvcast", capacity_bytes=B, **params)


# --------------------------------------------------------------------------- belady
def test_belady_hand_checked_sequence() -> None:
    keys = [1, 2, 3, 1, 2, 4, 1]
    policy = BeladyPolicy(2 * B, future=keys)
    hits = 0
    for i, k in enumerate(keys):
        hits += k in policy
        policy.observe(acc(k, float(i)))
    # t0 1 in, t1 2 in, t2 3 never reused: bypassed, t3 hit 1, t4 hit 2, t5 4 bypassed,
    # t6 hit 1. LRU gets none of these.
    assert hits == 3
    lru = LruPolicy(2 * B)
    lru_hits = 0
    for i, k in enumerate(keys):
        lru_hits += k in lru
        lru.observe(acc(k, float(i)))
    assert lru_hits == 0


def test_belady_demotes_exactly_the_chunks_used_again() -> None:
    keys = [1, 2, 2, 1]
    policy = BeladyPolicy(1 * B, future=keys)
    evictions = [e for i, k in enumerate(keys) for e in policy.observe(acc(k, float(i))).evict]
    assert [(e.key, e.action) for e in evictions] == [(1, EvictAction.DEMOTE)]


def test_belady_min_accesses_skips_first_sightings() -> None:
    keys = [1, 1, 1]
    policy = BeladyPolicy(1 * B, future=keys, min_accesses=2)
    assert not policy.observe(acc(1, 0.0)).admit
    assert policy.observe(acc(1, 1.0)).admit


def test_belady_requires_and_checks_the_future() -> None:
    with pytest.raises(PolicyConfigError, match="offline"):
        make_policy("belady", capacity_bytes=B)
    policy = BeladyPolicy(B, future=[1, 2])
    policy.observe(acc(1, 0.0))
    with pytest.raises(FutureMismatchError):
        policy.observe(acc(3, 1.0))


def test_kvcast_batch_select_never_picks_a_block_whose_parent_is_unknown() -> None:
    policy = KvcastPolicy(8 * B, half_life_s=60.0)
    for i in range(5):  # the parent (key 1) was never reported, or was forgotten
        policy.record(acc(2, float(i), parent=1, pos=1))
        policy.record(acc(3, float(i)))
    policy.select(5.0)
    assert policy.resident_keys() == {3}


def test_invalidate_after_unix_times_evaluates_residual_at_the_latest_time() -> None:
    # Regression: invalidate() evaluated residuals at t=0, and decayed scores overflowed once
    # access times were Unix times.
    from controlplane.policies import Access, make_policy

    t0 = 1.8e9
    for name in ("kvcast", "lru", "lfu", "sketch"):
        policy = make_policy(name, capacity_bytes=1 << 20)
        for i in range(50):
            policy.observe(Access(key=1, tenant=0, size=1024, host=i % 4, time=t0 + i))
        policy.on_tick(t0 + 60)
        decision = policy.invalidate(1)
        assert 1 not in policy.resident_keys(), name
        assert all(e.key == 1 for e in decision.evict), name
