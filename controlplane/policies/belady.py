"""Offline optimum (Belady's MIN with bypass). OFFLINE: it needs the future.

This policy is an evaluation bound, never a candidate for the controller: it must be given
the complete sequence of keys it will observe, in order, and it fails loudly if the observed
stream differs.

For equal-size chunks it is the exact optimum of the hit count for a cache that may decline
to admit (Belady 1966; the "bypass" variant: on a miss the newcomer competes with the
residents and the chunk whose next use is farthest away, possibly the newcomer, is left out).
Ties between equal next uses evict the deeper block of a prefix chain first, so a block is
never kept without its parent; with prefix-consistent traces (every access of block i follows
an access of block i-1 in the same request) the cached set therefore stays prefix-closed and
its hit count is also the optimum under the prefix hit definition of
:mod:`experiments.policies.evaluate`.

For variable sizes the same rule (evict farthest-next-use first until the newcomer fits, admit
only if every victim is needed later than the newcomer) is a feasible heuristic, not an
optimum; the evaluation then normalizes by :func:`experiments.policies.evaluate.
fractional_opt_bytes`, an upper bound (the byte-divisible relaxation).

Classes:
    BeladyPolicy: the offline MIN policy (registered as ``"belady"``, ``offline = True``).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from typing import ClassVar

from controlplane.policies.base import (
    NO_CHANGE,
    Access,
    CachePolicy,
    Decision,
    FutureMismatchError,
    PolicyConfigError,
    Ranked,
    register_policy,
)

__all__ = ["BeladyPolicy", "next_use_indices"]

NEVER = 1 << 62
"""Next-use index of a key that is never accessed again."""


def next_use_indices(keys: Sequence[int]) -> list[int]:
    """For each position, the position of the next access to the same key.

    Args:
        keys: the access sequence.

    Returns:
        ``out[i]`` = smallest ``j > i`` with ``keys[j] == keys[i]``, or :data:`NEVER`.
    """
    out = [NEVER] * len(keys)
    last: dict[int, int] = {}
    for i in range(len(keys) - 1, -1, -1):
        k = keys[i]
        out[i] = last.get(k, NEVER)
        last[k] = i
    return out


@register_policy("belady")
class BeladyPolicy(CachePolicy):
    """Belady's MIN with bypass (offline; exact optimum for equal-size chunks).

    An evicted chunk is DEMOTEd exactly when it will be accessed again.

    Args:
        capacity_bytes: SRAM budget in bytes.
        future: every key the policy will observe (through :meth:`observe` or
            :meth:`record`), in order.
        min_accesses: admit a chunk only from its ``min_accesses``-th access on. 1 is the
            optimum; 2 is a reference for history-based policies (the best a policy can do
            with perfect foresight if it never admits a chunk on its first sight), not a
            proven bound.
        demote_threshold: residual value for a DEMOTE (the residual is 1.0 for a chunk
            accessed again, 0.0 otherwise).

    Raises:
        PolicyConfigError: if ``future`` is missing.
    """

    offline: ClassVar[bool] = True

    def __init__(
        self,
        capacity_bytes: int,
        *,
        future: Sequence[int] | None = None,
        min_accesses: int = 1,
        demote_threshold: float = 1.0,
    ) -> None:
        super().__init__(capacity_bytes, demote_threshold=demote_threshold)
        if future is None:
            raise PolicyConfigError(
                "belady is offline: pass future=<every key it will observe, in order>"
            )
        if min_accesses < 1:
            raise PolicyConfigError(f"min_accesses must be >= 1, got {min_accesses}")
        self._min_accesses = min_accesses
        self._seen: dict[int, int] = {}
        self._future = list(future)
        self._next = next_use_indices(self._future)
        self._cursor = 0
        self._next_use: dict[int, int] = {}  # resident key -> index of its next access
        self._depth: dict[int, int] = {}
        self._heap: list[tuple[int, int, int, int]] = []  # (-next use, -depth, seq, key)
        self._seq = itertools.count()
        self._current_next = NEVER

    @property
    def position(self) -> int:
        """How many accesses of the future have been observed."""
        return self._cursor

    def _update(self, access: Access) -> None:
        i = self._cursor
        if i >= len(self._future) or self._future[i] != access.key:
            expected = self._future[i] if i < len(self._future) else "end of future"
            raise FutureMismatchError(
                f"belady: access #{i} is key {access.key}, the given future has {expected}"
            )
        self._cursor = i + 1
        self._current_next = self._next[i]
        if self._min_accesses > 1:
            self._seen[access.key] = self._seen.get(access.key, 0) + 1
        if access.key in self._next_use:
            self._push(access.key, self._current_next, self._depth[access.key])

    def _push(self, key: int, next_use: int, depth: int) -> None:
        self._next_use[key] = next_use
        heapq.heappush(self._heap, (-next_use, -depth, next(self._seq), key))

    def _decide(self, access: Access) -> Decision:
        key = access.key
        nxt = self._current_next
        if key in self._resident or nxt == NEVER:
            return NO_CHANGE
        if self._min_accesses > 1 and self._seen.get(key, 0) < self._min_accesses:
            return NO_CHANGE
        depth = access.position or 0
        victims: list[tuple[int, int, int, int]] = []
        freed = self.free_bytes
        ok = True
        while freed < access.size:
            entry = heapq.heappop(self._heap)
            neg_next, neg_depth, _, victim = entry
            if self._next_use.get(victim) != -neg_next or victim in (v[3] for v in victims):
                continue  # stale
            victims.append(entry)
            freed += self._resident_entry(victim)[1]
            # The newcomer wins only against chunks needed strictly later, or needed at
            # the same time but deeper in their chain.
            if (-neg_next, -neg_depth) <= (nxt, depth):
                ok = False
                break
        if not ok:
            for entry in victims:
                heapq.heappush(self._heap, entry)
            return NO_CHANGE
        evictions = tuple(self._evict(v[3], access.time) for v in victims)
        self._depth[key] = depth
        admission = self._admit(key, access.tenant, access.size, 1.0 / (nxt - self._cursor + 1))
        self._push(key, nxt, depth)
        return Decision(admit=(admission,), evict=evictions)

    def _on_evict(self, key: int) -> None:
        del self._next_use[key]
        del self._depth[key]

    def rank(self, now: float) -> list[Ranked]:
        """Residents by nearest next use (score = 1 / accesses until the next use)."""
        out = []
        for key, nxt in sorted(self._next_use.items(), key=lambda kv: kv[1]):
            tenant, size = self._resident_entry(key)
            score = 0.0 if nxt >= NEVER else 1.0 / (nxt - self._cursor + 1)
            out.append(Ranked(key, tenant, size, score, True))
        return out

    def residual_value(self, key: int, now: float) -> float:
        """1.0 if the chunk will be accessed again, else 0.0."""
        nxt = self._next_use.get(key)
        return 0.0 if nxt is None or nxt >= NEVER else 1.0
