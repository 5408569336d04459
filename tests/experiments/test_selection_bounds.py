"""The bounds on the missed selection cells: the reference policy, the masks, the command."""

from __future__ import annotations

import pytest

from controlplane.policies import PolicyConfigError, make_policy
from controlplane.policies.belady import NEVER, next_use_indices
from experiments import selection_bounds as sb
from experiments.policies.evaluate import replay
from experiments.policies.workloads import Request, Workload, chat_sessions_workload

BLOCK = 1000


def _workload(*requests: tuple[int, ...]) -> Workload:
    return Workload(
        "hand",
        tuple(Request(float(i), 0, 0, blocks) for i, blocks in enumerate(requests)),
        BLOCK,
    )


def _brute_force_hits(w: Workload, blocks: int, shared_depth: int) -> int:
    """The same order, simulated plainly: sort the residents, drop the lowest."""
    priority: dict[int, tuple[int, int, int]] = {}
    pinned: set[int] = set()
    hits = 0
    for index, r in enumerate(w.requests):
        chain = True
        for key in r.blocks:
            chain = chain and key in priority
            hits += chain
        for p, key in enumerate(r.blocks):
            if p < shared_depth:
                pinned.add(key)
            priority[key] = (1 if key in pinned else 0, index, -p)
            if len(priority) > blocks:
                del priority[min(priority, key=lambda k: priority[k])]
    return hits


def test_the_least_recent_requests_deepest_block_goes_first() -> None:
    w = _workload((1, 2, 3), (4, 5), (6,))
    policy = sb.PrefixRecencyPolicy(5 * BLOCK)
    replay(w, policy)
    # Six blocks for five places: the first request's deepest block (3) was the one to go.
    assert sorted(policy.resident_keys()) == [1, 2, 4, 5, 6]


def test_a_prefix_keeps_its_head_so_the_next_turn_still_hits() -> None:
    # Request 2 needs more room than there is: the old prefix loses its tail, not its head.
    w = _workload((1, 2, 3), (7, 8), (1, 2, 3))
    result = replay(w, sb.PrefixRecencyPolicy(4 * BLOCK))
    assert result.hit_refs == 2  # blocks 1 and 2; 3 was evicted
    lru = replay(w, make_policy("lru", capacity_bytes=4 * BLOCK))
    assert lru.hit_refs == 0  # LRU drops the head (1), so nothing behind it is served


@pytest.mark.parametrize(("blocks", "depth"), [(12, 0), (12, 2), (40, 2), (150, 0)])
def test_replay_of_the_policy_matches_a_plain_simulation(blocks: int, depth: int) -> None:
    w = chat_sessions_workload(n_sessions=120, seed=3)
    result = replay(w, sb.PrefixRecencyPolicy(blocks * w.block_bytes, shared_depth=depth))
    assert result.hit_refs == _brute_force_hits(w, blocks, depth)
    assert result.hit_refs > 0


def test_pinned_system_blocks_survive_a_flood_of_long_requests() -> None:
    # One request on system prompt (1, 2), a flood on another (3, 4), then (1, 2) again.
    flood = [(3, 4, *range(100 + 10 * i, 100 + 10 * i + 6)) for i in range(5)]
    w = _workload((1, 2, 50), *flood, (1, 2, 60))
    pinned = replay(w, sb.PrefixRecencyPolicy(4 * BLOCK, shared_depth=2))
    plain = replay(w, sb.PrefixRecencyPolicy(4 * BLOCK))
    assert pinned.hit_refs - plain.hit_refs == 2  # the last request's 1 and 2


def test_the_oracle_mask_never_admits_a_block_with_no_later_use() -> None:
    w = chat_sessions_workload(n_sessions=80, seed=5)
    mask = sb.dead_block_oracle(w)
    nxt = next_use_indices(w.key_sequence())
    assert mask == [n != NEVER for n in nxt]
    policy = sb.PrefixRecencyPolicy(30 * w.block_bytes, admit=mask)
    admitted = 0
    for i, access in enumerate(w.accesses()):
        decision = policy.observe(access)
        for a in decision.admit:
            assert a.key == access.key and nxt[i] != NEVER
            admitted += 1
    assert admitted > 0


def test_hindsight_masks_admit_all_at_zero_and_fewer_as_the_threshold_rises() -> None:
    w = chat_sessions_workload(n_sessions=80, seed=6)
    masks = sb.hindsight_admission(w, (0.0, 0.3, 0.6, 1.01))
    assert all(masks[0.0])
    assert not any(masks[1.01])
    for low, high in ((0.0, 0.3), (0.3, 0.6)):
        assert all(a or not b for a, b in zip(masks[low], masks[high], strict=True))
    assert sum(masks[0.6]) < len(masks[0.6])


def test_features_separate_first_sights_from_seen_blocks() -> None:
    w = _workload((1, 2, 3), (1, 2, 4))
    feats = sb.reuse_features(w)
    assert [f[0] for f in feats] == ["new", "new", "new", "seen", "seen", "new"]  # type: ignore[index]
    # Block 4 is the request's last and the first of its run of new blocks, after 2 shared.
    assert feats[5] == ("new", 0, 0, 1, 0)


def test_a_negative_shared_depth_is_refused() -> None:
    with pytest.raises(PolicyConfigError, match="shared_depth"):
        sb.PrefixRecencyPolicy(10 * BLOCK, shared_depth=-1)


def test_bound_rows_compare_every_bound_with_the_figure_the_cell_needs() -> None:
    w = chat_sessions_workload(n_sessions=150, seed=7, name="chat-small")
    (row,) = sb.bound_rows({"chat": [w]}, {"chat": (0.04,)}, kvcast_params={})
    assert row["need"] == pytest.approx(row["best"] + 0.1 * (1 - row["best"]), abs=1e-3)
    for name in ("kvcast", "recency", "fitted", "oracle"):
        assert 0.0 < row[name] <= 1.0
    assert row["reached_oracle"] == (row["oracle"] >= row["need"])
    assert row["reached_online"] == (max(row["recency"], row["fitted"]) >= row["need"])


def test_main_prints_a_line_per_cell_and_refuses_unknown_families(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert sb.main(["--quick", "--families", "chat"]) == 0
    out = capsys.readouterr().out
    assert out.count("result selection-bound family=chat ") == len(sb.MISSED["chat"])
    assert "reached_online=" in out and "told which return" in out
    with pytest.raises(SystemExit):
        sb.main(["--families", "rag"])


@pytest.mark.parametrize("anchor", ["lru", "lfu", "arc", "wtinylfu"])
def test_an_anchor_behind_an_open_mask_is_the_anchor(anchor: str) -> None:
    w = chat_sessions_workload(n_sessions=100, seed=8)
    cap = 40 * w.block_bytes
    bare = replay(w, make_policy(anchor, capacity_bytes=cap))
    n = len(w.accesses())
    opened = replay(w, sb.FilteredPolicy(make_policy(anchor, capacity_bytes=cap), [True] * n))
    closed = replay(w, sb.FilteredPolicy(make_policy(anchor, capacity_bytes=cap), [False] * n))
    assert opened.hit_bytes == bare.hit_bytes > 0
    assert closed.hit_bytes == 0


def test_a_hidden_access_does_not_refresh_a_resident_block() -> None:
    # LRU with room for two: 1 and 2 loaded, 1 touched again but hidden, then 3 arrives.
    w = _workload((1,), (2,), (1,), (3,))
    policy = sb.FilteredPolicy(
        make_policy("lru", capacity_bytes=2 * BLOCK), [True, True, False, True]
    )
    result = replay(w, policy)
    assert result.hit_refs == 1  # the hidden access still hits: 1 was resident
    assert sorted(policy.resident_keys()) == [2, 3]  # but 1 aged and went first
