"""Least-recently-used baseline.

Classes:
    LruPolicy: demand-fill LRU over the resident set (registered as ``"lru"``). Every access
        to a non-resident chunk admits it, evicting the least recently used chunks until it
        fits. It knows nothing of prefixes or hosts; it is the baseline the others must beat.
"""

from __future__ import annotations

from collections import OrderedDict

from controlplane.policies.base import (
    NO_CHANGE,
    Access,
    CachePolicy,
    Decision,
    Ranked,
    register_policy,
)

__all__ = ["LruPolicy"]


@register_policy("lru")
class LruPolicy(CachePolicy):
    """Demand-fill LRU.

    Online, every miss is admitted at once. In batch mode (:meth:`record` then
    :meth:`select`) it remembers the most recently seen non-resident chunks, up to the budget
    in bytes, and selects the most recently used chunks that fit.

    An evicted chunk is DEMOTEd when it was hit at least ``demote_threshold`` times while
    resident (it showed reuse), otherwise DROPped.

    Args:
        capacity_bytes: SRAM budget in bytes.
        demote_threshold: hits while resident needed for a DEMOTE.
    """

    def __init__(self, capacity_bytes: int, *, demote_threshold: float = 1.0) -> None:
        super().__init__(capacity_bytes, demote_threshold=demote_threshold)
        # resident key -> [last access time, hits while resident]; order = recency.
        self._order: OrderedDict[int, list[float]] = OrderedDict()
        # Non-resident chunks seen since, most recent last: key -> (time, tenant, size).
        self._pending: OrderedDict[int, tuple[float, int, int]] = OrderedDict()
        self._pending_bytes = 0

    def _update(self, access: Access) -> None:
        key = access.key
        state = self._order.get(key)
        if state is not None:
            state[0] = access.time
            state[1] += 1.0
            self._order.move_to_end(key)
            return
        old = self._pending.pop(key, None)
        if old is not None:
            self._pending_bytes -= old[2]
        self._pending[key] = (access.time, access.tenant, access.size)
        self._pending_bytes += access.size
        while self._pending_bytes > self._capacity:
            _, (_, _, size) = self._pending.popitem(last=False)
            self._pending_bytes -= size

    def _decide(self, access: Access) -> Decision:
        if access.key in self._resident:
            return NO_CHANGE
        evictions = []
        while self.free_bytes < access.size:
            victim = next(iter(self._order))
            evictions.append(self._evict(victim, access.time))
        admission = self._admit(access.key, access.tenant, access.size, access.time)
        return Decision(admit=(admission,), evict=tuple(evictions))

    def _on_admit(self, key: int) -> None:
        pending = self._pending.pop(key, None)
        last = 0.0
        if pending is not None:
            self._pending_bytes -= pending[2]
            last = pending[0]
        self._order[key] = [last, 0.0]

    def _on_evict(self, key: int) -> None:
        del self._order[key]

    def _forget(self, key: int) -> None:
        pending = self._pending.pop(key, None)
        if pending is not None:
            self._pending_bytes -= pending[2]

    def rank(self, now: float) -> list[Ranked]:
        """Residents and remembered candidates, most recently used first.

        The score is the last access time.
        """
        out = [
            Ranked(k, *self._resident_entry(k), last, True) for k, (last, _) in self._order.items()
        ]
        out += [Ranked(k, tenant, size, t, False) for k, (t, tenant, size) in self._pending.items()]
        out.sort(key=lambda r: -r.score)
        return out

    def residual_value(self, key: int, now: float) -> float:
        """Hits the chunk received while resident (0.0 when not resident)."""
        state = self._order.get(key)
        return 0.0 if state is None else state[1]
