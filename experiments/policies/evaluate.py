"""Trace-driven evaluation of cache policies: replay, hit accounting, offline optimum.

Hit definition (prefix hit). Requests are replayed in order; each request's blocks are
offered to the policy one by one, block 0 first, as :class:`~controlplane.policies.base.Access`
events. A block reference is a *hit* when, at the moment the request reaches it, the block is
resident in SRAM **and every earlier block of the same request was a hit**: the host serves
the longest prefix the switch holds, and a block behind a missing block is not served from the
switch. The *byte hit ratio* is hit bytes over all referenced bytes. Decisions take effect at
once (no install latency), for every policy alike.

The replay also reports the *any-block* byte hit ratio (a resident block counts even behind a
miss, as when each GET independently hits or goes to the pool); for prefix-closed policies the
two are equal.

The reference is the offline optimum: Belady's MIN with bypass
(:class:`~controlplane.policies.belady.BeladyPolicy`), exact for equal-size blocks; for
variable sizes :func:`fractional_opt_bytes` gives an upper bound instead.

Classes:
    ReplayResult: counters of one policy replayed over one workload at one budget.
    Comparison: a result with its ratio to the optimum at the same budget.

Functions:
    replay: run one policy over one workload.
    opt_result: replay the offline optimum (Belady) over a workload.
    fractional_opt_bytes: byte-divisible upper bound on hit bytes (any block sizes).
    evaluate: every (budget, policy) pair side by side with the optimum.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from controlplane.policies.base import NO_CHANGE, CachePolicy, EvictAction, make_policy
from controlplane.policies.belady import NEVER, next_use_indices
from experiments.policies.workloads import Workload

__all__ = [
    "Comparison",
    "ReplayResult",
    "evaluate",
    "fractional_opt_bytes",
    "opt_result",
    "replay",
]


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """Counters of one replay.

    Attributes:
        workload: workload name.
        policy: policy name.
        capacity_bytes: SRAM budget.
        refs: block references replayed.
        total_bytes: bytes referenced.
        hit_refs: references that were prefix hits.
        hit_bytes: bytes of prefix hits.
        any_hit_bytes: bytes of references whose block was resident (prefix or not).
        admissions: chunks loaded.
        evictions: chunks removed.
        demotes: evictions marked DEMOTE.
        demotes_reused: DEMOTEd chunks accessed again later in the workload.
        drops_reused: DROPped chunks accessed again later in the workload.
        seconds: wall-clock time of the replay.
    """

    workload: str
    policy: str
    capacity_bytes: int
    refs: int
    total_bytes: int
    hit_refs: int
    hit_bytes: int
    any_hit_bytes: int
    admissions: int
    evictions: int
    demotes: int
    demotes_reused: int
    drops_reused: int
    seconds: float

    @property
    def byte_hit_ratio(self) -> float:
        """Prefix-hit bytes over referenced bytes."""
        return self.hit_bytes / self.total_bytes if self.total_bytes else 0.0

    @property
    def any_byte_hit_ratio(self) -> float:
        """Resident-block bytes over referenced bytes (ignores the prefix rule)."""
        return self.any_hit_bytes / self.total_bytes if self.total_bytes else 0.0

    @property
    def demote_precision(self) -> float:
        """Share of DEMOTEd chunks that were accessed again (0.0 when none)."""
        return self.demotes_reused / self.demotes if self.demotes else 0.0

    @property
    def drop_regret(self) -> float:
        """Share of DROPped chunks that were accessed again (0.0 when none)."""
        drops = self.evictions - self.demotes
        return self.drops_reused / drops if drops else 0.0


@dataclass(frozen=True, slots=True)
class Comparison:
    """A replay next to the optimum at the same budget.

    Attributes:
        result: the policy's replay.
        budget_blocks: the budget in blocks of the workload's block size.
        opt_hit_bytes: the optimum's hit bytes (exact for equal sizes).
    """

    result: ReplayResult
    budget_blocks: int
    opt_hit_bytes: float

    @property
    def ratio_to_opt(self) -> float:
        """Policy hit bytes over optimum hit bytes (1.0 when the optimum hits nothing)."""
        if self.opt_hit_bytes <= 0:
            return 1.0
        return self.result.hit_bytes / self.opt_hit_bytes


def replay(workload: Workload, policy: CachePolicy) -> ReplayResult:
    """Replay a workload through a policy online (one ``observe`` per block reference).

    Args:
        workload: the requests.
        policy: a fresh policy (its budget is the one evaluated).

    Returns:
        The counters, with hits counted by the prefix-hit definition of this module.
    """
    accesses = workload.accesses()
    first = workload.request_starts()
    last_index: dict[int, int] = {}
    for i, a in enumerate(accesses):
        last_index[a.key] = i
    observe = policy.observe
    hit_refs = hit_bytes = any_bytes = total = 0
    admissions = evictions = demotes = demotes_reused = drops_reused = 0
    chain = True
    t0 = time.perf_counter()
    for i, a in enumerate(accesses):
        if first[i]:
            chain = True
        size = a.size
        total += size
        if a.key in policy:
            any_bytes += size
            if chain:
                hit_refs += 1
                hit_bytes += size
        else:
            chain = False
        d = observe(a)
        if d is NO_CHANGE:
            continue
        admissions += len(d.admit)
        for ev in d.evict:
            evictions += 1
            reused = last_index[ev.key] > i
            if ev.action is EvictAction.DEMOTE:
                demotes += 1
                demotes_reused += reused
            else:
                drops_reused += reused
    seconds = time.perf_counter() - t0
    return ReplayResult(
        workload.name,
        policy.name,
        policy.capacity_bytes,
        len(accesses),
        total,
        hit_refs,
        hit_bytes,
        any_bytes,
        admissions,
        evictions,
        demotes,
        demotes_reused,
        drops_reused,
        seconds,
    )


def opt_result(workload: Workload, capacity_bytes: int) -> ReplayResult:
    """Replay the offline optimum (Belady's MIN with bypass).

    Args:
        workload: the requests.
        capacity_bytes: SRAM budget.

    Returns:
        The optimum's counters; for equal-size blocks its ``hit_bytes`` is the maximum any
        policy can reach under the prefix-hit definition.
    """
    return replay(
        workload,
        make_policy("belady", capacity_bytes=capacity_bytes, future=workload.key_sequence()),
    )


def fractional_opt_bytes(keys: Sequence[int], sizes: Sequence[int], capacity_bytes: int) -> float:
    """Upper bound on hit bytes for any policy, for chunks of any sizes.

    Solves the byte-divisible relaxation exactly: every byte is a unit page that shares its
    chunk's access times, and Belady's MIN with bypass on unit pages keeps, at every access,
    the bytes whose next use is nearest. No integral policy (which must keep whole chunks, and
    under the prefix rule whole prefixes) can hit more bytes. For equal sizes it equals the
    integral optimum.

    Args:
        keys: access sequence.
        sizes: chunk size of each access (a key keeps one size).
        capacity_bytes: budget.

    Returns:
        The bound, in bytes.
    """
    nxt = next_use_indices(keys)
    cached: dict[int, float] = {}  # key -> cached bytes
    next_of: dict[int, int] = {}
    heap: list[tuple[int, int]] = []  # (-next use, key), lazily invalidated
    free = float(capacity_bytes)
    hit = 0.0
    for i, (key, size) in enumerate(zip(keys, sizes, strict=True)):
        have = cached.get(key, 0.0)
        hit += have
        n = nxt[i]
        if n == NEVER:
            free += have
            cached.pop(key, None)
            next_of.pop(key, None)
            continue
        next_of[key] = n
        heapq.heappush(heap, (-n, key))
        want = min(float(size), float(capacity_bytes)) - have
        take = min(free, want)
        have += take
        free -= take
        want -= take
        while want > 1e-9 and heap:
            neg_n, victim = heap[0]
            if next_of.get(victim) != -neg_n:
                heapq.heappop(heap)  # stale entry
                continue
            if -neg_n <= n:
                break  # only bytes needed later than this chunk may be displaced
            vb = cached[victim]
            moved = min(vb, want)
            cached[victim] = vb - moved
            have += moved
            want -= moved
            if cached[victim] <= 1e-9:
                heapq.heappop(heap)
                del cached[victim]
                del next_of[victim]
        cached[key] = have
    return hit


def evaluate(
    workload: Workload,
    policies: Iterable[str],
    budgets_blocks: Iterable[int],
    *,
    params: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[Comparison]:
    """Replay every policy at every budget, side by side with the optimum.

    Args:
        workload: equal-size-block workload.
        policies: registered online policy names.
        budgets_blocks: budgets in blocks of ``workload.block_bytes``.
        params: optional per-policy constructor parameters.

    Returns:
        One comparison per (budget, policy), budgets outer, plus one for ``belady`` itself.
    """
    params = params or {}
    names = list(policies)
    out: list[Comparison] = []
    for blocks in budgets_blocks:
        capacity = blocks * workload.block_bytes
        opt = opt_result(workload, capacity)
        out.append(Comparison(opt, blocks, float(opt.hit_bytes)))
        for name in names:
            policy = make_policy(name, capacity_bytes=capacity, **dict(params.get(name, {})))
            out.append(Comparison(replay(workload, policy), blocks, float(opt.hit_bytes)))
    return out
