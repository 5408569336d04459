"""Learned admission: how many reported uses a chunk needs before loading it into SRAM pays.

Loading a chunk into switch SRAM costs one read of it from the DRAM pool (and its WRITE packets);
each later SRAM hit saves one pool read of it. So the load pays when the chunk will be used more
than once more. ``ReuseAdmission`` learns from the reports how often a chunk that has been used
k times is used again, and admits at the smallest k for which that pays:

    reach[k]  = chunks reported at least k times (k = 1 .. max_uses)
    more(k)   = (reach[k+1] + reach[k+2] + ... + reach[max_uses]) / reach[k]
              = expected further uses of a chunk already used k times
    threshold = the smallest k with reach[k] >= min_samples and more(k) >= 1 + margin

With fewer than ``min_samples`` chunks seen it admits from the first use (nothing learned yet:
the daemon's behaviour with ``min_accesses: 1``); when no k pays, it admits nothing until the
reports say otherwise. Counts are truncated at ``max_uses`` and chunks still being used are
counted as they are, so ``more(k)`` errs low (admission errs late), never high. The daemon uses
it as its doorkeeper's bar with ``policy.min_accesses: auto``.

Classes:
    ReuseAdmission: the learner (observe uses, read the threshold).
"""

from __future__ import annotations

import collections

__all__ = ["ReuseAdmission"]


class ReuseAdmission:
    """Learns the reported-use count at which loading a chunk pays for its pool read.

    Args:
        max_uses: uses counted per chunk (a chunk used more often counts as ``max_uses``).
        min_samples: chunks that must have reached a count before it is trusted.
        margin: expected further uses must reach ``1 + margin`` (a load pays after one hit;
            the margin covers the WRITE packets and the noise of the estimate).
        max_keys: chunks tracked (least recently used ones are forgotten; their counts stay
            in the statistics).

    Raises:
        ValueError: a parameter out of range.
    """

    def __init__(
        self,
        max_uses: int = 16,
        min_samples: int = 100,
        margin: float = 0.25,
        max_keys: int = 1 << 20,
    ) -> None:
        if max_uses < 2 or min_samples < 1 or margin < 0 or max_keys < 1:
            raise ValueError(
                f"need max_uses >= 2, min_samples >= 1, margin >= 0, max_keys >= 1; got "
                f"{max_uses}, {min_samples}, {margin}, {max_keys}"
            )
        self.max_uses = max_uses
        self.min_samples = min_samples
        self.margin = margin
        self.max_keys = max_keys
        self._counts: collections.OrderedDict[int, int] = collections.OrderedDict()
        self._reach = [0] * (max_uses + 1)

    def observe(self, key: int) -> int:
        """Counts one reported use of chunk ``key``.

        Returns:
            The chunk's use count so far (up to ``max_uses``).
        """
        before = self._counts.pop(key, 0)
        count = min(before + 1, self.max_uses)
        self._counts[key] = count
        if count > before:
            self._reach[count] += 1
        if len(self._counts) > self.max_keys:
            self._counts.popitem(last=False)  # forgotten: counted from 1 if it comes back
        return count

    def reach(self, k: int) -> int:
        """Chunks reported at least ``k`` times (1 <= k <= max_uses)."""
        return self._reach[k]

    def expected_more(self, k: int) -> float:
        """Expected further uses of a chunk used ``k`` times (0.0 when none was)."""
        if not 1 <= k <= self.max_uses or self._reach[k] == 0:
            return 0.0
        return sum(self._reach[k + 1 :]) / self._reach[k]

    def threshold(self) -> int:
        """Uses a chunk needs before it is handed to the policy (``max_uses + 1``: none pays)."""
        if self._reach[1] < self.min_samples:
            return 1
        for k in range(1, self.max_uses):
            if self._reach[k] < self.min_samples:
                break
            if self.expected_more(k) >= 1.0 + self.margin:
                return k
        return self.max_uses + 1
