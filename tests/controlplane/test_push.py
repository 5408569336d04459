"""The push planner: targets, tenant isolation, prefix order, pacing, no repeats."""

from __future__ import annotations

import pytest

from controlplane.push import PushCandidate, PushHost, PushPlanner

KIB = 1024
HOSTS = [PushHost("h1", (1,)), PushHost("h2", (1, 2)), PushHost("h3", (2,)), PushHost("h4")]


def chain(tenant: int, keys: list[int], nbytes: int = 4 * KIB) -> list[PushCandidate]:
    return [
        PushCandidate(tenant, k, nbytes, keys[i - 1] if i else None, i) for i, k in enumerate(keys)
    ]


def test_a_static_prefix_goes_once_to_every_host_of_its_tenant_and_no_other() -> None:
    planner = PushPlanner(budget_bytes=64 * KIB)
    plan = planner.plan(chain(1, [10, 11]), HOSTS)
    assert [(o.key, o.hosts) for o in plan.orders] == [
        (10, ("h1", "h2", "h4")),
        (11, ("h1", "h2", "h4")),
    ]
    assert plan.pool_bytes == 8 * KIB and plan.unicast_bytes == 24 * KIB
    assert plan.deliveries == 6
    assert planner.plan(chain(1, [10, 11]), HOSTS).orders == []  # never twice


def test_hosts_that_hold_a_chunk_are_left_out_and_a_host_that_joins_later_gets_it() -> None:
    planner = PushPlanner(budget_bytes=64 * KIB)
    planner.note_held(10, "h1")  # it fetched the chunk itself
    assert [o.hosts for o in planner.plan(chain(1, [10]), HOSTS[:2]).orders] == [("h2",)]
    later = planner.plan(chain(1, [10]), [*HOSTS[:2], PushHost("h5", (1,))])
    assert [o.hosts for o in later.orders] == [("h5",)]


def test_pushes_get_only_what_the_ticks_pulls_left_and_keep_prefix_order() -> None:
    planner = PushPlanner(budget_bytes=10 * KIB)
    cands = chain(1, [10, 11, 12])  # 4 KiB each
    plan = planner.plan(reversed(cands), HOSTS, pull_bytes=3 * KIB)
    assert plan.budget_bytes == 7 * KIB
    assert [o.key for o in plan.orders] == [10] and plan.deferred == 2
    plan = planner.plan(cands, HOSTS)  # a quiet tick: 10 KiB, two more chunks
    assert [o.key for o in plan.orders] == [11, 12] and plan.pool_bytes <= 10 * KIB
    assert planner.plan(cands, HOSTS, pull_bytes=20 * KIB).budget_bytes == 0


def test_a_chunk_larger_than_the_budget_is_counted_and_its_descendants_wait() -> None:
    planner = PushPlanner(budget_bytes=8 * KIB)
    big = PushCandidate(1, 10, 9 * KIB, None, 0)
    child = PushCandidate(1, 11, 1 * KIB, 10, 1)
    other = PushCandidate(2, 20, 1 * KIB, None, 0)
    plan = planner.plan([big, child, other], HOSTS)
    assert plan.too_large == 1 and plan.deferred == 1
    assert [(o.key, o.hosts) for o in plan.orders] == [(20, ("h2", "h3", "h4"))]


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="budget_bytes"):
        PushPlanner(budget_bytes=0)
