"""The shadow rankings of kvcast's policy: ghost caches of its scoring variants on a sample.

With ``shadow_rankings=True`` :class:`~controlplane.policies.kvcast.KvcastPolicy` keeps four
scores per chunk (its own; recency: the last access only; long memory: a 2x slower decay;
frequency: an 8x slower decay without the learned weight) and
ranks by the variant whose ghost cache has had significantly more hits lately. This module holds
the ghosts and the choice among the variants; the policy keeps every variant's score.

Classes:
    Ghost: one scoring variant's ghost cache (residents and an eviction heap).
    Shadows: the ghost caches of every variant on a spatially hashed sample of the prefix
        chains, and the variant in use.
"""

from __future__ import annotations

import heapq
import math

__all__ = ["FREQUENCY_MEMORY", "LONG_MEMORY", "SEGMENT", "VARIANTS", "Ghost", "Shadows"]

_HASH_MUL = 0x9E3779B97F4A7C15
_M64 = (1 << 64) - 1
_SAMPLE_BITS = 24
_SAMPLE_ONE = 1 << _SAMPLE_BITS

SEGMENT = 16
"""The shadow sample takes prefix chains in segments of this many blocks (by position)."""

VARIANTS = ("default", "recency", "long-memory", "frequency", "fast-reuse")
"""The scoring variants the shadow rankings choose among (``shadow_rankings=True``; the fifth
only with ``reuse_modes=True``)."""

LONG_MEMORY = 2.0
"""The long-memory variant decays this many times slower than the default."""

FREQUENCY_MEMORY = 8.0
"""The frequency variant decays this many times slower than the default (and counts every
access alike, without the learned weight): nearly a plain access count, LFU's order with the
prefix clamp."""


class Ghost:
    """One scoring variant's ghost cache on the sampled keys: residents and an eviction heap."""

    __slots__ = ("heap", "res", "seq", "used")

    def __init__(self) -> None:
        self.res: dict[int, tuple[int, int]] = {}  # resident key -> (live heap seq, size)
        self.heap: list[tuple[float, int, int, int]] = []  # (pri, -position, seq, key)
        self.seq = 0
        self.used = 0


class Shadows:
    """Ghost caches of the scoring variants on a spatially hashed sample of the prefix chains.

    Sampling (SHARDS-style): a block is in the sample when the top 24 bits of ``root *
    _HASH_MUL`` are below ``threshold``, ``root`` being the first block of its 16-block
    segment of the prefix chain; every access of a sampled block is seen, and parent and child
    are sampled together inside a segment, so the ghosts see prefix structure. The rate is
    chosen so that a ghost holds about ``sample_chunks`` chunks (every block below that). Each
    variant keeps the sampled blocks it ranks best (its own prefix-clamped score, kept by the
    policy for every tracked block) in ``capacity`` bytes, the budget scaled by the sample
    rate, with the policy's hysteresis, admitting a block only under a resident parent and
    never evicting the parent of the newcomer. A ghost hit is a resident block whose sampled
    parent is resident too. ``wins[i][j]`` counts, with exponential decay over a window, the
    sampled accesses variant i hit and variant j missed; ``current`` moves to a variant whose
    lead over it is significant: ``wins - losses > z sqrt(wins + losses) + 4``.
    """

    def __init__(
        self, capacity: int, size: int, n: int, log_margin: float, sample_chunks: int, z: float
    ) -> None:
        chunks = max(capacity // size, 1)
        self.threshold = min(_SAMPLE_ONE, -(-(sample_chunks * _SAMPLE_ONE) // chunks))
        self.capacity = capacity * self.threshold // _SAMPLE_ONE
        sampled_chunks = max(self.capacity // size, 1)
        self.keep = 1.0 - 1.0 / min(max(16 * sampled_chunks, 4096), 1 << 16)
        self.ghosts = [Ghost() for _ in range(n)]
        self.wins = [[0.0] * n for _ in range(n)]
        self.log_margin = log_margin
        self.z = z
        self.current = 0
        self.switches = 0

    def sampled(self, root: int) -> bool:
        """Whether the blocks of the segment that starts at ``root`` are in the sample."""
        return ((root * _HASH_MUL) & _M64) >> (64 - _SAMPLE_BITS) < self.threshold

    def step(
        self,
        key: int,
        size: int,
        parent: int | None,
        position: int,
        pris: list[float],
    ) -> None:
        """One sampled access to every ghost, then the choice of the variant.

        Args:
            key: the block.
            size: its bytes.
            parent: its parent if sampled too, else None.
            position: its depth in the chain (ties evict the deeper block).
            pris: its prefix-clamped score under each variant after this access.
        """
        hit = []
        for g, pri in zip(self.ghosts, pris, strict=True):
            g.seq += 1
            if key in g.res:
                hit.append(parent is None or parent in g.res)
                g.res[key] = (g.seq, size)
                heapq.heappush(g.heap, (pri, -position, g.seq, key))
                continue
            hit.append(False)
            if size <= self.capacity and (parent is None or parent in g.res):
                self._offer(g, key, size, pri, position, parent)
        keep = self.keep
        for i, row in enumerate(self.wins):
            hi = hit[i]
            for j in range(len(row)):
                row[j] = row[j] * keep + (1.0 if hi and not hit[j] else 0.0)
        c = self.current
        best, margin = c, 0.0
        for i, row in enumerate(self.wins):
            if i != c:
                won, lost = row[c], self.wins[c][i]
                lead = won - lost - self.z * math.sqrt(won + lost) - 4.0
                if lead > margin:
                    best, margin = i, lead
        if best != c:
            self.current = best
            self.switches += 1

    def _offer(
        self, g: Ghost, key: int, size: int, pri: float, position: int, parent: int | None
    ) -> None:
        """Admit a block if it outranks (with hysteresis) what it must displace."""
        popped: list[tuple[float, int, int, int]] = []
        free = self.capacity - g.used
        while free < size:
            e = heapq.heappop(g.heap)
            r = g.res.get(e[3])
            if r is None or r[0] != e[2]:
                continue  # stale
            popped.append(e)
            if e[0] + self.log_margin >= pri or e[3] == parent:
                for p in popped:
                    heapq.heappush(g.heap, p)
                return
            free += r[1]
        for e in popped:
            g.used -= g.res.pop(e[3])[1]
        g.res[key] = (g.seq, size)
        g.used += size
        heapq.heappush(g.heap, (pri, -position, g.seq, key))
        if len(g.heap) > 4 * len(g.res) + 1024:
            g.heap = [e for e in g.heap if g.res.get(e[3], (-1, 0))[0] == e[2]]
            heapq.heapify(g.heap)
