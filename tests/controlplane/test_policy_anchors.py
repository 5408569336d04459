"""ARC and W-TinyLFU, the anchors: the behaviour that defines each, beyond the shared contract."""

from __future__ import annotations

from controlplane.policies import Access, ArcPolicy, WTinyLfuPolicy, make_policy

BLOCK = 1024


def acc(key: int, t: float, size: int = BLOCK) -> Access:
    return Access(key, 0, size, 0, t)


def run(policy, keys, t0: float = 0.0) -> int:
    """Observe ``keys`` in order; the number of hits."""
    hits = 0
    for i, k in enumerate(keys):
        hits += k in policy
        policy.observe(acc(k, t0 + i))
    return hits


def test_arc_keeps_a_reused_set_through_a_scan() -> None:
    arc = make_policy("arc", capacity_bytes=8 * BLOCK)
    lru = make_policy("lru", capacity_bytes=8 * BLOCK)
    hot = [1, 2, 3, 4]
    for p in (arc, lru):
        run(p, hot * 3)  # seen more than once: ARC's T2
        run(p, range(100, 120), t0=100)  # a scan of 20 one-time keys
    assert set(hot) <= arc.resident_keys()
    assert not set(hot) & lru.resident_keys()


def test_arc_adapts_its_target_to_ghost_hits() -> None:
    arc = ArcPolicy(4 * BLOCK)
    run(arc, [1, 1, 2, 2, 3, 4, 5])  # T2 = {1, 2}; 3 leaves T1 for the ghost list B1
    assert arc._p == 0.0 and 3 not in arc.resident_keys()
    run(arc, [3], t0=10)  # a B1 hit: recency was undervalued, T1's target grows
    assert arc._p == BLOCK and 3 in arc.resident_keys()


def test_wtinylfu_admits_only_what_is_more_frequent_than_the_victim() -> None:
    w = WTinyLfuPolicy(10 * BLOCK, window_fraction=0.1)
    hot = list(range(1, 10))
    run(w, hot * 5)  # nine keys seen five times fill main
    hits_in_scan = run(w, range(100, 200), t0=100)  # one-time keys only pass the window
    assert hits_in_scan == 0
    assert set(hot) <= w.resident_keys()
    assert len(w.resident_keys() & set(range(100, 200))) <= 1  # the window's one slot
    # A newcomer that becomes frequent does get in.
    run(w, [500] * 8, t0=300)
    run(w, [501], t0=400)
    assert 500 in w.resident_keys()


def test_wtinylfu_halves_its_counts_as_it_ages() -> None:
    w = WTinyLfuPolicy(4 * BLOCK, sample_factor=2.0)  # halve every 2 x 4 accesses
    run(w, [7] * 7)
    assert w.frequency(7) == 7
    run(w, [8], t0=10)  # the 8th access: counts halve
    assert w.frequency(7) == 3 and w.frequency(8) == 0
    assert w.used_bytes <= w.capacity_bytes
