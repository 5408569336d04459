"""NetCache-style baseline: a count-min sketch over misses chooses what to admit.

NetCache (Jin et al., SOSP 2017) counts queries for uncached keys in a count-min sketch in
the data plane; keys whose estimate crosses a threshold are reported to the controller, which
admits them, evicting the cached key with the fewest hits (per-entry hit counters) when the
newcomer's estimate is higher. Counters are periodically aged.

Classes:
    CountMinSketch: a count-min sketch over 64-bit keys with multiply-shift hashing and
        halving (aging).
    SketchPolicy: the NetCache admission/eviction rule (registered as ``"sketch"``).
"""

from __future__ import annotations

import heapq
import itertools
import random

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

__all__ = ["CountMinSketch", "SketchPolicy"]

_MASK64 = (1 << 64) - 1


class CountMinSketch:
    """Count-min sketch over 64-bit keys.

    Args:
        depth: number of rows (independent hash functions).
        width: counters per row; a power of two.
        seed: seed of the hash multipliers (fixed for determinism).

    Raises:
        PolicyConfigError: if depth < 1 or width is not a power of two >= 2.
    """

    def __init__(self, depth: int = 4, width: int = 65536, *, seed: int = 0x6B76) -> None:
        if depth < 1:
            raise PolicyConfigError(f"sketch depth must be >= 1, got {depth}")
        if width < 2 or width & (width - 1):
            raise PolicyConfigError(f"sketch width must be a power of two >= 2, got {width}")
        rng = random.Random(seed)
        self._shift = 64 - (width.bit_length() - 1)
        self._hashes = [(rng.getrandbits(64) | 1, rng.getrandbits(64)) for _ in range(depth)]
        self._rows = [[0] * width for _ in range(depth)]

    def add(self, key: int) -> int:
        """Count one occurrence of ``key``.

        Args:
            key: 64-bit key.

        Returns:
            The new estimate for ``key`` (an upper bound on its true count).
        """
        est = -1
        shift = self._shift
        for (a, b), row in zip(self._hashes, self._rows, strict=True):
            i = ((a * key + b) & _MASK64) >> shift
            v = row[i] + 1
            row[i] = v
            if est < 0 or v < est:
                est = v
        return est

    def estimate(self, key: int) -> int:
        """The estimate for ``key`` without counting it."""
        shift = self._shift
        return min(
            row[((a * key + b) & _MASK64) >> shift]
            for (a, b), row in zip(self._hashes, self._rows, strict=True)
        )

    def halve(self) -> None:
        """Age every counter by halving it."""
        for row in self._rows:
            row[:] = [v >> 1 for v in row]


@register_policy("sketch")
class SketchPolicy(CachePolicy):
    """NetCache's rule: admit a missed chunk once its sketch estimate reaches a threshold.

    Misses (``hit is False``, or ``hit is None`` for a non-resident chunk) are counted in a
    count-min sketch; hits of resident chunks in per-entry counters. When a missed chunk's
    estimate reaches ``threshold`` it is admitted if it fits, or if its estimate exceeds the
    hit count of every resident chunk that must be evicted to make room (fewest hits first).
    Every ``aging_misses`` counted misses the sketch and the hit counters are halved
    (NetCache clears them every statistics period; halving after a fixed number of samples
    is TinyLFU's scale-free form of the same aging). By default ``aging_misses`` is ten
    times the number of chunks the budget holds, measured with the first chunk's size.

    An evicted chunk is DEMOTEd when it had at least ``demote_threshold`` hits since the
    last aging.

    Args:
        capacity_bytes: SRAM budget in bytes.
        threshold: sketch estimate at which a missed chunk becomes a candidate.
        depth: sketch rows.
        width: sketch counters per row (power of two).
        aging_misses: misses between two halvings; None for the default above.
        max_candidates: hot but not admitted chunks remembered for :meth:`select`.
        demote_threshold: hits needed for a DEMOTE.

    Raises:
        PolicyConfigError: for a threshold < 1, a bad sketch shape or a non-positive aging.
    """

    def __init__(
        self,
        capacity_bytes: int,
        *,
        threshold: int = 3,
        depth: int = 4,
        width: int = 65536,
        aging_misses: int | None = None,
        max_candidates: int = 4096,
        demote_threshold: float = 1.0,
    ) -> None:
        super().__init__(capacity_bytes, demote_threshold=demote_threshold)
        if threshold < 1:
            raise PolicyConfigError(f"threshold must be >= 1, got {threshold}")
        if aging_misses is not None and aging_misses < 1:
            raise PolicyConfigError(f"aging_misses must be >= 1, got {aging_misses}")
        self._threshold = threshold
        self._sketch = CountMinSketch(depth, width)
        self._aging = aging_misses
        self._misses = 0
        self._hits: dict[int, int] = {}
        self._heap: list[tuple[int, int, int]] = []
        # Sequence number of each resident key's live heap entry; older entries are stale.
        self._token: dict[int, int] = {}
        self._seq = itertools.count()
        self._last_estimate = 0
        self._max_candidates = max_candidates
        # Hot chunks that were not admitted: key -> (estimate, tenant, size).
        self._candidates: dict[int, tuple[int, int, int]] = {}

    def _update(self, access: Access) -> None:
        key = access.key
        if key in self._resident and access.hit is not False:
            hits = self._hits[key] + 1
            self._hits[key] = hits
            self._push(key, hits)
            self._last_estimate = 0
            return
        if self._aging is None:
            self._aging = 10 * max(1, self._capacity // access.size)
        est = self._sketch.add(key)
        self._last_estimate = est
        if est >= self._threshold and key not in self._resident:
            self._remember(key, est, access)
        self._misses += 1
        if self._misses >= self._aging:
            self._misses = 0
            self._sketch.halve()
            for k in self._hits:
                self._hits[k] >>= 1
            self._heap = []
            for k, h in self._hits.items():
                self._push(k, h)
            self._candidates = {
                k: (e >> 1, t, s) for k, (e, t, s) in self._candidates.items() if e > 1
            }

    def _push(self, key: int, hits: int) -> None:
        seq = next(self._seq)
        self._token[key] = seq
        heapq.heappush(self._heap, (hits, seq, key))
        if len(self._heap) > 4 * len(self._token) + 1024:
            # Drop stale entries so the heap stays O(resident chunks).
            self._heap = [e for e in self._heap if self._token.get(e[2]) == e[1]]
            heapq.heapify(self._heap)

    def _pop_least_hit(self) -> tuple[int, int]:
        while True:
            hits, seq, key = heapq.heappop(self._heap)
            if self._token.get(key) == seq:
                del self._token[key]  # popped: it is re-pushed if it stays resident
                return hits, key

    def _decide(self, access: Access) -> Decision:
        key = access.key
        est = self._last_estimate
        if key in self._resident or est < self._threshold:
            return NO_CHANGE
        victims: list[tuple[int, int]] = []
        freed = self.free_bytes
        while freed < access.size:
            hits, victim = self._pop_least_hit()
            victims.append((hits, victim))
            freed += self._resident_entry(victim)[1]
            if hits >= est:
                break
        if freed < access.size or (victims and victims[-1][0] >= est):
            for hits, victim in victims:
                self._push(victim, hits)
            return NO_CHANGE
        evictions: list[Eviction] = [self._evict(v, access.time) for _, v in victims]
        admission = self._admit(key, access.tenant, access.size, float(est))
        return Decision(admit=(admission,), evict=tuple(evictions))

    def _remember(self, key: int, est: int, access: Access) -> None:
        if key not in self._candidates and len(self._candidates) >= self._max_candidates:
            # Keep the hotter half; amortized O(1) per remembered candidate.
            keep = sorted(self._candidates.items(), key=lambda kv: -kv[1][0])
            self._candidates = dict(keep[: self._max_candidates // 2])
        self._candidates[key] = (est, access.tenant, access.size)

    def _on_admit(self, key: int) -> None:
        self._candidates.pop(key, None)
        self._hits[key] = 0
        self._push(key, 0)

    def _on_evict(self, key: int) -> None:
        del self._hits[key]
        self._token.pop(key, None)

    def _forget(self, key: int) -> None:
        self._candidates.pop(key, None)

    def rank(self, now: float) -> list[Ranked]:
        """Residents by hits and hot candidates by sketch estimate, best first."""
        items = [Ranked(k, *self._resident_entry(k), float(h), True) for k, h in self._hits.items()]
        items += [
            Ranked(k, t, s, float(est), False)
            for k, (est, t, s) in self._candidates.items()
            if k not in self._resident
        ]
        items.sort(key=lambda r: (-r.score, not r.resident, r.key))
        return items

    def residual_value(self, key: int, now: float) -> float:
        """Hits since the last aging (0.0 when not resident)."""
        return float(self._hits.get(key, 0))
