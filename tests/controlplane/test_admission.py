"""ReuseAdmission: the reported-use count from which loading a chunk pays, learned."""

from __future__ import annotations

import pytest

from controlplane.admission import ReuseAdmission


def feed(adm: ReuseAdmission, uses_per_key: list[int]) -> None:
    for key, uses in enumerate(uses_per_key):
        for _ in range(uses):
            adm.observe(key)


def test_admits_from_the_first_use_until_it_has_seen_enough_chunks() -> None:
    adm = ReuseAdmission(min_samples=100)
    feed(adm, [1] * 99)  # 99 one-offs: not enough to conclude anything
    assert adm.threshold() == 1


def test_chunks_reused_often_are_admitted_at_once() -> None:
    adm = ReuseAdmission(min_samples=50)
    feed(adm, [5] * 200)  # every chunk used five times: after one use, four more come
    assert adm.expected_more(1) == pytest.approx(4.0)
    assert adm.threshold() == 1


def test_mostly_one_off_chunks_move_the_bar_to_where_reuse_starts() -> None:
    # 900 chunks used once, 80 twice, 20 ten times (the hot prefix blocks).
    adm = ReuseAdmission(min_samples=10)
    feed(adm, [1] * 900 + [2] * 80 + [10] * 20)
    assert adm.reach(1) == 1000 and adm.reach(2) == 100 and adm.reach(3) == 20
    # After one use: (100 + 20 * 8) / 1000 = 0.26 more; after two: 20 * 8 / 100 = 1.6.
    assert adm.expected_more(1) == pytest.approx(0.26)
    assert adm.expected_more(2) == pytest.approx(1.6)
    assert adm.threshold() == 2


def test_nothing_is_admitted_when_no_count_pays_for_a_load() -> None:
    adm = ReuseAdmission(min_samples=10)
    feed(adm, [1] * 500 + [2] * 500)  # reused once at most: a load never gets two hits
    assert adm.threshold() == adm.max_uses + 1


def test_counts_stop_at_max_uses_and_old_keys_are_forgotten() -> None:
    adm = ReuseAdmission(max_uses=4, min_samples=1, max_keys=2)
    assert [adm.observe(7) for _ in range(6)] == [1, 2, 3, 4, 4, 4]
    adm.observe(8)
    adm.observe(9)  # 7 is forgotten
    assert adm.observe(7) == 1
    with pytest.raises(ValueError):
        ReuseAdmission(max_uses=1)
