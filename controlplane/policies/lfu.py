"""Least-frequently-used baseline with dynamic aging (LFU-DA).

Classes:
    LfuPolicy: demand-fill LFU with dynamic aging (registered as ``"lfu"``). Each resident
        chunk has priority ``L + count`` where ``count`` is its accesses since admission and
        ``L`` (the "age") is raised to the priority of every evicted chunk, so chunks that
        were popular long ago eventually lose to newly popular ones (Arlitt et al., "Evaluating
        content management techniques for Web proxy caches", 2000).
"""

from __future__ import annotations

import heapq
import itertools

from controlplane.policies.base import (
    NO_CHANGE,
    Access,
    CachePolicy,
    Decision,
    Eviction,
    PolicyConfigError,
    Ranked,
    register_policy,
)

__all__ = ["LfuPolicy"]


@register_policy("lfu")
class LfuPolicy(CachePolicy):
    """LFU with dynamic aging; admits every missed chunk, evicts the lowest priority.

    Online, every miss is admitted at once with count 1 (classic LFU-DA). In batch mode
    (:meth:`record` then :meth:`select`) it also counts accesses to non-resident chunks, up to
    ``max_tracked`` of them, and selects by ``L + count``.

    An evicted chunk is DEMOTEd when it was accessed at least ``demote_threshold`` times
    after its admission.

    Args:
        capacity_bytes: SRAM budget in bytes.
        max_tracked: non-resident chunks counted for batch selection.
        demote_threshold: accesses after admission needed for a DEMOTE.

    Raises:
        PolicyConfigError: if ``max_tracked`` < 2.
    """

    def __init__(
        self, capacity_bytes: int, *, max_tracked: int = 65536, demote_threshold: float = 1.0
    ) -> None:
        super().__init__(capacity_bytes, demote_threshold=demote_threshold)
        if max_tracked < 2:
            raise PolicyConfigError(f"max_tracked must be >= 2, got {max_tracked}")
        self._max_tracked = max_tracked
        self._age = 0.0
        self._count: dict[int, int] = {}
        self._priority: dict[int, float] = {}
        # Sequence number of each key's live heap entry; older entries are stale.
        self._token: dict[int, int] = {}
        self._heap: list[tuple[float, int, int]] = []
        self._seq = itertools.count()
        # Non-resident chunks: key -> [count, tenant, size].
        self._pending: dict[int, list[int]] = {}

    def _push(self, key: int) -> None:
        pri = self._age + self._count[key]
        seq = next(self._seq)
        self._priority[key] = pri
        self._token[key] = seq
        heapq.heappush(self._heap, (pri, seq, key))
        if len(self._heap) > 4 * len(self._token) + 1024:
            # Drop stale entries so the heap stays O(resident chunks).
            self._heap = [e for e in self._heap if self._token.get(e[2]) == e[1]]
            heapq.heapify(self._heap)

    def _update(self, access: Access) -> None:
        key = access.key
        if key in self._count:
            self._count[key] += 1
            self._push(key)
            return
        entry = self._pending.get(key)
        if entry is None:
            if len(self._pending) >= self._max_tracked:
                keep = sorted(self._pending.items(), key=lambda kv: -kv[1][0])
                self._pending = dict(keep[: self._max_tracked // 2])
            self._pending[key] = [1, access.tenant, access.size]
        else:
            entry[0] += 1

    def _decide(self, access: Access) -> Decision:
        if access.key in self._resident:
            return NO_CHANGE
        evictions: list[Eviction] = []
        while self.free_bytes < access.size:
            pri, seq, key = heapq.heappop(self._heap)
            if self._token.get(key) != seq:
                continue  # stale heap entry
            self._age = pri
            evictions.append(self._evict(key, access.time))
        self._pending.pop(access.key, None)  # online LFU-DA starts every newcomer at 1
        admission = self._admit(access.key, access.tenant, access.size, self._age + 1.0)
        return Decision(admit=(admission,), evict=tuple(evictions))

    def _on_admit(self, key: int) -> None:
        entry = self._pending.pop(key, None)
        self._count[key] = 1 if entry is None else entry[0]
        self._push(key)

    def _on_evict(self, key: int) -> None:
        del self._count[key]
        del self._priority[key]
        del self._token[key]

    def _forget(self, key: int) -> None:
        self._pending.pop(key, None)

    def rank(self, now: float) -> list[Ranked]:
        """Residents and counted candidates by decreasing ``L + count``."""
        out = [Ranked(k, *self._resident_entry(k), p, True) for k, p in self._priority.items()]
        out += [
            Ranked(k, tenant, size, self._age + count, False)
            for k, (count, tenant, size) in self._pending.items()
        ]
        out.sort(key=lambda r: (-r.score, not r.resident))
        return out

    def residual_value(self, key: int, now: float) -> float:
        """Accesses after admission (0.0 when not resident)."""
        return float(self._count.get(key, 1) - 1)
