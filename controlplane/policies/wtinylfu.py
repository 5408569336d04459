"""W-TinyLFU (Einziger, Friedman and Manes, ACM ToS 2017), the policy of Caffeine, in bytes.

Three resident regions: a small **window** LRU that every new chunk enters, and a **main**
segmented LRU (a **probation** segment and a **protected** one, about 80 % of main). A chunk
pushed out of the window is a candidate for main; when main is full, the candidate is admitted
only if its **frequency** is higher than that of main's victim (probation's least recent), and
otherwise it is the one evicted. A hit in probation promotes the chunk to protected; protected
overflows back into probation. Frequencies are counts of recent accesses that are all halved
every ``sample_factor x`` (chunks that fit the budget) accesses, TinyLFU's aging, so an old
burst fades.

Caffeine keeps the counts in a 4-bit count-min sketch to bound memory; the evaluation here has
the memory to keep them exactly, which is the sketch without its collisions (an upper bound on
what the sketch achieves). Caffeine also climbs the window size; this is the paper's fixed 1 %
window.

Classes:
    WTinyLfuPolicy: W-TinyLFU over the resident set (registered as ``"wtinylfu"``).
"""

from __future__ import annotations

from collections import OrderedDict

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

__all__ = ["WTinyLfuPolicy"]

_WINDOW, _PROBATION, _PROTECTED = 0, 1, 2


@register_policy("wtinylfu")
class WTinyLfuPolicy(CachePolicy):
    """Window LRU, frequency-filtered admission, segmented main LRU.

    In batch mode (:meth:`record` then :meth:`select`) it ranks every chunk it counts by its
    aged frequency (residents first among equals, then the more recent).

    An evicted chunk is DEMOTEd when its aged frequency is at least ``demote_threshold``.

    Args:
        capacity_bytes: SRAM budget in bytes.
        window_fraction: share of the budget for the window LRU (Caffeine starts at 0.01).
        protected_fraction: share of main for the protected segment (0.8 in Caffeine).
        sample_factor: halve every count after this many times the number of chunks that fit
            the budget (at the mean chunk size seen) accesses (10 in the paper).
        demote_threshold: aged frequency at which an eviction is a DEMOTE.

    Raises:
        PolicyConfigError: a fraction outside (0, 1) or a sample factor below 1.
    """

    def __init__(
        self,
        capacity_bytes: int,
        *,
        window_fraction: float = 0.01,
        protected_fraction: float = 0.8,
        sample_factor: float = 10.0,
        demote_threshold: float = 2.0,
    ) -> None:
        super().__init__(capacity_bytes, demote_threshold=demote_threshold)
        for name, value in (
            ("window_fraction", window_fraction),
            ("protected_fraction", protected_fraction),
        ):
            if not 0.0 < value < 1.0:
                raise PolicyConfigError(f"{name} must be within (0, 1), got {value}")
        if sample_factor < 1.0:
            raise PolicyConfigError(f"sample_factor must be >= 1, got {sample_factor}")
        self._window_fraction = window_fraction
        self._protected_fraction = protected_fraction
        self._sample_factor = sample_factor
        # Resident key -> segment, and one LRU order per segment (key -> size).
        self._segment: dict[int, int] = {}
        self._lists: tuple[OrderedDict[int, int], ...] = (
            OrderedDict(),
            OrderedDict(),
            OrderedDict(),
        )
        self._bytes = [0, 0, 0]
        # Aged access counts and what the ranking needs of non-resident chunks.
        self._freq: dict[int, int] = {}
        self._meta: dict[int, tuple[int, int, float]] = {}  # key -> (tenant, size, last time)
        self._samples = 0
        self._seen_bytes = 0
        self._seen_count = 0

    # ------------------------------------------------------------------ statistics
    def frequency(self, key: int) -> int:
        """The aged access count of ``key``."""
        return self._freq.get(key, 0)

    def _update(self, access: Access) -> None:
        key = access.key
        self._freq[key] = self._freq.get(key, 0) + 1
        if key not in self._meta:
            self._seen_bytes += access.size
            self._seen_count += 1
        self._meta[key] = (access.tenant, access.size, access.time)
        self._samples += 1
        mean = self._seen_bytes / self._seen_count
        if self._samples >= self._sample_factor * max(1.0, self._capacity / mean):
            self._age()
        segment = self._segment.get(key)
        if segment is None:
            return
        if segment == _PROBATION:
            self._move(key, _PROTECTED)
            self._rebalance_protected()
        else:
            self._lists[segment].move_to_end(key)

    def _age(self) -> None:
        """TinyLFU's reset: halve every count, forget the chunks that reach zero."""
        self._samples //= 2
        halved = {k: v // 2 for k, v in self._freq.items()}
        self._freq = {k: v for k, v in halved.items() if v > 0}
        for key in [k for k in self._meta if k not in self._freq and k not in self._segment]:
            self._forget_meta(key)

    def _forget_meta(self, key: int) -> None:
        meta = self._meta.pop(key, None)
        if meta is not None:
            self._seen_bytes -= meta[1]
            self._seen_count -= 1

    def _move(self, key: int, segment: int) -> None:
        old = self._segment[key]
        size = self._lists[old].pop(key)
        self._bytes[old] -= size
        self._segment[key] = segment
        self._lists[segment][key] = size
        self._bytes[segment] += size

    def _rebalance_protected(self) -> None:
        main = self._capacity - self._window_cap(0)
        cap = self._protected_fraction * main
        protected = self._lists[_PROTECTED]
        while self._bytes[_PROTECTED] > cap and len(protected) > 1:
            self._move(next(iter(protected)), _PROBATION)

    def _window_cap(self, size: int) -> float:
        return max(self._window_fraction * self._capacity, float(size))

    # ------------------------------------------------------------------ online decision
    def _decide(self, access: Access) -> Decision:
        key, size, now = access.key, access.size, access.time
        if key in self._resident:
            return NO_CHANGE
        wcap = self._window_cap(size)
        main_cap = self._capacity - wcap
        evictions: list[Eviction] = []
        window = self._lists[_WINDOW]
        # The window makes room for the newcomer; what it pushes out is a candidate for main.
        while window and self._bytes[_WINDOW] + size > wcap:
            candidate = next(iter(window))
            self._move(candidate, _PROBATION)
            self._lists[_PROBATION].move_to_end(candidate)
            evictions += self._admit_to_main(candidate, main_cap, now)
        # Main may still be over its share (a larger newcomer widened the window).
        while self.free_bytes < size:
            victim = self._victim(exclude=None)
            evictions.append(self._evict(victim, now))
        admission = self._admit(key, access.tenant, size, float(self.frequency(key)))
        return Decision(admit=(admission,), evict=tuple(evictions))

    def _victim(self, exclude: int | None) -> int:
        """Main's victim: probation's least recent, else protected's (else the window's)."""
        for segment in (_PROBATION, _PROTECTED, _WINDOW):
            for key in self._lists[segment]:
                if key != exclude:
                    return key
        raise AssertionError("no victim in a full cache")  # unreachable: the budget is > 0

    def _admit_to_main(self, candidate: int, main_cap: float, now: float) -> list[Eviction]:
        """TinyLFU's filter: while main is over its share, the less frequent one leaves.

        The candidate and main's victim are compared by aged frequency; a tie goes against
        the candidate, as in the paper.
        """
        out = []
        while self._bytes[_PROBATION] + self._bytes[_PROTECTED] > main_cap:
            victim = self._victim(exclude=candidate)
            if self._segment.get(victim) == _WINDOW:
                out.append(self._evict(candidate, now))
                break
            if self.frequency(candidate) > self.frequency(victim):
                out.append(self._evict(victim, now))
            else:
                out.append(self._evict(candidate, now))
                break
        return out

    def _on_admit(self, key: int) -> None:
        _, size = self._resident_entry(key)
        self._segment[key] = _WINDOW
        self._lists[_WINDOW][key] = size
        self._bytes[_WINDOW] += size

    def _on_evict(self, key: int) -> None:
        segment = self._segment.pop(key)
        self._bytes[segment] -= self._lists[segment].pop(key)

    def _forget(self, key: int) -> None:
        self._freq.pop(key, None)
        self._forget_meta(key)

    # ------------------------------------------------------------------ ranking
    def rank(self, now: float) -> list[Ranked]:
        """Every counted chunk by aged frequency; residents, then recency, break ties."""
        out = []
        for key, (tenant, size, _t) in self._meta.items():
            resident = key in self._resident
            out.append(Ranked(key, tenant, size, float(self.frequency(key)), resident))
        out.sort(key=lambda r: (-r.score, not r.resident, -self._meta[r.key][2]))
        return out

    def residual_value(self, key: int, now: float) -> float:
        """The aged frequency."""
        return float(self.frequency(key))
