"""Adaptive Replacement Cache (Megiddo and Modha, FAST '03), counted in bytes.

ARC keeps two resident lists, ``T1`` (chunks seen once recently) and ``T2`` (seen at least
twice), and two ghost lists of keys it evicted from each, ``B1`` and ``B2``. A miss that finds
its key in ``B1`` says recency was undervalued, so the target size ``p`` of ``T1`` grows; a miss
in ``B2`` shrinks it. Eviction takes the LRU end of ``T1`` while ``T1`` is above ``p``, else of
``T2``. It has no parameter to tune, which is why it is an anchor for the evaluation.

Chunks may differ in size, so every quantity of the paper that counts pages is counted in
bytes here: ``p`` and the adaptation steps, the ``|T1| + |B1| <= c`` and ``<= 2c`` bounds on
the ghosts.

Classes:
    ArcPolicy: ARC over the resident set (registered as ``"arc"``).
"""

from __future__ import annotations

from collections import OrderedDict

from controlplane.policies.base import (
    NO_CHANGE,
    Access,
    CachePolicy,
    Decision,
    Eviction,
    Ranked,
    register_policy,
)

__all__ = ["ArcPolicy"]


class _Lru:
    """An LRU list of key -> (size, tenant, last access), with its byte total."""

    def __init__(self) -> None:
        self.items: OrderedDict[int, tuple[int, int, float]] = OrderedDict()
        self.bytes = 0

    def __contains__(self, key: object) -> bool:
        return key in self.items

    def __len__(self) -> int:
        return len(self.items)

    def push(self, key: int, size: int, tenant: int, t: float) -> None:
        """Put ``key`` at the MRU end."""
        self.pop(key)
        self.items[key] = (size, tenant, t)
        self.bytes += size

    def pop(self, key: int) -> tuple[int, int, float] | None:
        """Remove ``key`` if present."""
        item = self.items.pop(key, None)
        if item is not None:
            self.bytes -= item[0]
        return item

    def lru(self) -> int:
        """The least recently used key (the list must not be empty)."""
        return next(iter(self.items))

    def drop_lru(self) -> int:
        """Remove the least recently used key; its size."""
        _, (size, _, _) = self.items.popitem(last=False)
        self.bytes -= size
        return size


@register_policy("arc")
class ArcPolicy(CachePolicy):
    """ARC with byte sizes.

    Online, every miss is admitted (ARC is demand-fill); the victim comes from ``T1`` or ``T2``
    as the adaptive target ``p`` says. In batch mode (:meth:`record` then :meth:`select`) the
    ranking puts ``T2`` before ``T1`` (each most recent first), then the remembered non-resident
    chunks, ghosts of ``T2`` first: what ARC would keep if it had to choose now.

    An evicted chunk is DEMOTEd when it was in ``T2`` (reused while resident).

    Args:
        capacity_bytes: SRAM budget in bytes.
        demote_threshold: residual value (1.0 for a ``T2`` chunk, 0.0 for ``T1``) for DEMOTE.
    """

    def __init__(self, capacity_bytes: int, *, demote_threshold: float = 1.0) -> None:
        super().__init__(capacity_bytes, demote_threshold=demote_threshold)
        self._t1, self._t2, self._b1, self._b2 = _Lru(), _Lru(), _Lru(), _Lru()
        self._p = 0.0  # target bytes of T1
        # Batch mode: non-resident chunks seen and not in a ghost list, most recent last.
        self._seen = _Lru()

    # ------------------------------------------------------------------ statistics
    def _update(self, access: Access) -> None:
        key, size, t = access.key, access.size, access.time
        for lst in (self._t1, self._t2):
            if key in lst:
                lst.pop(key)
                self._t2.push(key, size, access.tenant, t)
                return
        b1, b2 = self._b1.bytes, self._b2.bytes
        if key in self._b1:
            self._p = min(float(self._capacity), self._p + max(b2 / max(b1, 1), 1.0) * size)
        elif key in self._b2:
            self._p = max(0.0, self._p - max(b1 / max(b2, 1), 1.0) * size)
        else:
            self._seen.push(key, size, access.tenant, t)
            while self._seen.bytes > self._capacity:
                self._seen.drop_lru()
            return
        # Refresh the ghost's recency for the batch ranking.
        lst = self._b1 if key in self._b1 else self._b2
        lst.push(key, size, access.tenant, t)

    def _replace(self, key: int, now: float, size: int) -> list[Eviction]:
        """Evict from T1 or T2 until ``size`` bytes are free (ARC's REPLACE)."""
        out = []
        while self.free_bytes < size:
            t1 = self._t1.bytes
            from_t1 = len(self._t1) > 0 and (
                t1 > self._p or (key in self._b2 and t1 >= self._p) or len(self._t2) == 0
            )
            victim = self._t1.lru() if from_t1 else self._t2.lru()
            out.append(self._evict(victim, now))
        return out

    def _decide(self, access: Access) -> Decision:
        key = access.key
        if key in self._resident:
            return NO_CHANGE
        evictions = self._replace(key, access.time, access.size)
        admission = self._admit(key, access.tenant, access.size, access.time)
        self._trim_ghosts()
        return Decision(admit=(admission,), evict=tuple(evictions))

    def _trim_ghosts(self) -> None:
        c = self._capacity
        while len(self._b1) and self._t1.bytes + self._b1.bytes > c:
            self._b1.drop_lru()
        total = self._t1.bytes + self._t2.bytes + self._b1.bytes + self._b2.bytes
        while len(self._b2) and total > 2 * c:
            total -= self._b2.drop_lru()
        while len(self._b1) and total > 2 * c:
            total -= self._b1.drop_lru()

    def _on_admit(self, key: int) -> None:
        tenant, size = self._resident_entry(key)
        ghost = self._b1.pop(key) or self._b2.pop(key)
        seen = self._seen.pop(key)
        t = (ghost or seen or (0, 0, self._latest))[2]
        # A key ARC remembers from a ghost list has been seen twice: it goes to T2.
        (self._t2 if ghost is not None else self._t1).push(key, size, tenant, t)

    def _on_evict(self, key: int) -> None:
        item = self._t1.pop(key)
        if item is not None:
            self._b1.push(key, item[0], item[1], item[2])
            return
        item = self._t2.pop(key)
        if item is not None:
            self._b2.push(key, item[0], item[1], item[2])

    def _forget(self, key: int) -> None:
        for lst in (self._b1, self._b2, self._seen):
            lst.pop(key)

    # ------------------------------------------------------------------ ranking
    def rank(self, now: float) -> list[Ranked]:
        """T2, then T1 (most recent first in each), then ghosts of T2, T1, then chunks seen once.

        The score is the tier (4 for T2 down to 0) plus the last access time squashed into
        ``[0, 1)``, so that the tiers never mix.
        """
        horizon = max(self._latest, now, 1.0)
        out: list[Ranked] = []
        for tier, lst, resident in (
            (4.0, self._t2, True),
            (3.0, self._t1, True),
            (2.0, self._b2, False),
            (1.0, self._b1, False),
            (0.0, self._seen, False),
        ):
            for key, (size, tenant, t) in lst.items.items():
                if not resident and key in self._resident:
                    continue
                out.append(
                    Ranked(key, tenant, size, tier + max(t, 0.0) / (horizon * 1.001), resident)
                )
        out.sort(key=lambda r: -r.score)
        return out

    def residual_value(self, key: int, now: float) -> float:
        """1.0 for a chunk in ``T2`` (reused while resident), 0.0 otherwise."""
        return 1.0 if key in self._t2 else 0.0
