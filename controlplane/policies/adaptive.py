"""A selection that learns online which expert policy fits the traffic, and follows it.

One ranking cannot serve every workload: memoryless chat sessions want the last access
(LRU's order), traces with long idle periods a frequency filter with a long memory
(W-TinyLFU), the conversation trace kvcast's learned, prefix-aware score (docs/policies.md).
This policy runs several complete policies side by side on every access, the *experts*
(by default kvcast, ARC, W-TinyLFU, LFU and LRU: kvcast's prefix-aware score, recency balanced
with frequency, and frequency), counts the prefix hits each would have had, and makes its
own resident set that of the expert that has been doing best lately: the idea of adaptive
policy selection by simulation (Waldspurger et al., ATC '17) and of learning among experts
(LeCaR, HotStorage '18; CACHEUS, FAST '21), with the experts run exactly instead of sampled.

* **Hits per expert.** An expert hits a block reference when the block is resident in it and
  every earlier block of the request was an expert hit too (the replay's prefix-hit rule; a
  request starts at position 0 or where no position is given).
* **Who leads.** For each pair of experts the policy counts, with exponential decay over a
  window of ``window_factor`` x (budget in chunks) accesses (4,096 to 65,536), the
  references one hit and the other missed (``wins[i][j]``). It moves from the current leader
  ``c`` to the expert ``i`` with the largest lead when ``wins[i][c] - wins[c][i] > z *
  sqrt(wins[i][c] + wins[c][i]) + min_lead``: a lead of ``z`` standard deviations of a paired
  count (the same test as kvcast's shadow rankings), so a tie or noise never switches.
  The first expert (kvcast) leads at the start.
* **Following.** After each access the resident set is the leader's: usually that is the
  leader's own decision for that access; on a switch, one decision moves the resident set to
  the new leader's (evictions first, then admissions, as every decision).
* **Value recovery.** An evicted chunk is DEMOTEd when kvcast's expert (which tracks every
  chunk's decayed score) values it at least ``demote_threshold``; without a kvcast expert,
  the leader's value is used.

Batch mode records every access into every expert (kvcast's C record path for its
statistics; the anchors' Python paths), counts the hits each expert's resident set would have
had for the batch, and ``select`` re-selects every expert and follows the leader.

Cost: every expert's update on every access, about the sum of the experts' costs. The anchors'
Python record and select paths (0.7-5 s per million accesses each in ``make bench --quick``)
dominate a batch: 5-10 s per million in all, against the 1 s rate kvcast's C path meets, which
is why this policy is not the controller's default.

Classes:
    AdaptivePolicy: the policy (registered as ``"adaptive"``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from controlplane.policies.base import (
    NO_CHANGE,
    Access,
    Admission,
    CachePolicy,
    Decision,
    EvictAction,
    Eviction,
    InvalidAccessError,
    PolicyConfigError,
    Ranked,
    make_policy,
    policy_class,
    register_policy,
)
from controlplane.policies.base import _check_access as check_access
from kvcast.kvclass import KvClass

__all__ = ["DEFAULT_EXPERTS", "AdaptivePolicy"]

DEFAULT_EXPERTS = ("kvcast", "arc", "wtinylfu", "lfu", "lru")
"""The experts by default: kvcast's score, ARC (recency with frequency), W-TinyLFU and LFU
(frequency), LRU (recency)."""


@register_policy("adaptive")
class AdaptivePolicy(CachePolicy):
    """Runs expert policies side by side and keeps the resident set of the one doing best.

    Args:
        capacity_bytes: SRAM budget in bytes (every expert gets the same).
        experts: registered online policy names, the first leading at the start.
        expert_params: per expert name, its constructor parameters.
        z: standard deviations of the paired hit count a challenger's lead must exceed.
        min_lead: hits the lead must exceed on top of that.
        window_factor: the decay window in accesses, as a multiple of the budget in chunks.
        demote_threshold: residual value (kvcast's score) at which an eviction is a DEMOTE.

    Raises:
        PolicyConfigError: no experts, an unknown or offline expert, a repeated one, a
            negative ``z`` or ``min_lead``, a non-positive window factor, or an invalid
            expert parameter.
    """

    def __init__(
        self,
        capacity_bytes: int,
        *,
        experts: Sequence[str] = DEFAULT_EXPERTS,
        expert_params: Mapping[str, Mapping[str, Any]] | None = None,
        z: float = 3.0,
        min_lead: float = 4.0,
        window_factor: float = 16.0,
        demote_threshold: float = 1.0,
    ) -> None:
        super().__init__(capacity_bytes, demote_threshold=demote_threshold)
        names = tuple(experts)
        if not names:
            raise PolicyConfigError("adaptive needs at least one expert")
        if len(set(names)) != len(names):
            raise PolicyConfigError(f"experts repeat a name: {names}")
        for name in names:
            if name == self.name or policy_class(name).offline:
                raise PolicyConfigError(f"{name!r} cannot be an expert (offline or itself)")
        if not z >= 0 or not min_lead >= 0:
            raise PolicyConfigError(f"z and min_lead must be >= 0, got {z}, {min_lead}")
        if not window_factor > 0:
            raise PolicyConfigError(f"window_factor must be > 0, got {window_factor}")
        params = expert_params or {}
        self._names = names
        self._experts: list[CachePolicy] = [
            make_policy(n, capacity_bytes=capacity_bytes, **dict(params.get(n, {}))) for n in names
        ]
        self._value = self._experts[names.index("kvcast")] if "kvcast" in names else None
        self._z = float(z)
        self._min_lead = float(min_lead)
        self._window_factor = float(window_factor)
        self._keep = 0.0  # decay per access, set from the first access's size
        n = len(names)
        # wins[i][j]: references expert i hit and j missed, decayed by ``keep`` per access.
        self._wins = [[0.0] * n for _ in range(n)]
        self._gain = 1.0  # the weight of a win now: the counts are ``wins / gain``
        self._chain = [True] * n
        self._leader = 0
        self._switches = 0
        self._pending: Decision = NO_CHANGE

    # ------------------------------------------------------------------ inspection
    @property
    def experts(self) -> tuple[str, ...]:
        """The experts' names, in order."""
        return self._names

    @property
    def leader(self) -> str:
        """The expert whose resident set this policy keeps now."""
        return self._names[self._leader]

    @property
    def switches(self) -> int:
        """How many times the leader changed."""
        return self._switches

    def expert(self, name: str) -> CachePolicy:
        """The expert of that name (for inspection; do not feed it accesses)."""
        return self._experts[self._names.index(name)]

    # ------------------------------------------------------------------ learning
    def _window(self, size: int) -> None:
        chunks = max(1, self._capacity // max(size, 1))
        self._keep = 1.0 - 1.0 / min(max(self._window_factor * chunks, 4096.0), 65536.0)

    def _score(self, access: Access) -> None:
        """Count which experts would have hit this reference (before it changes anything)."""
        if not self._keep:
            self._window(access.size)
        if access.position is None or access.position == 0:
            self._chain = [True] * len(self._experts)
        key = access.key
        chain = self._chain
        for i, e in enumerate(self._experts):
            if chain[i] and key not in e:
                chain[i] = False
        # Decay every count by ``keep`` per access, lazily: a win's weight grows by 1 / keep
        # per access instead, and the counts are brought back to scale now and then.
        self._gain /= self._keep
        if self._gain > 1e100:
            self._rescale()
        if all(chain) or not any(chain):
            return  # no pair differs
        gain = self._gain
        wins = self._wins
        for i, hi in enumerate(chain):
            if hi:
                row = wins[i]
                for j, hj in enumerate(chain):
                    if not hj:
                        row[j] += gain

    def _rescale(self) -> None:
        g = self._gain
        self._wins = [[v / g for v in row] for row in self._wins]
        self._gain = 1.0

    def _challenger(self) -> int:
        """The expert to follow from now on (the current leader unless one leads clearly)."""
        cur = self._leader
        self._rescale()
        wins = self._wins
        best, best_lead = cur, 0.0
        for i in range(len(self._experts)):
            if i == cur:
                continue
            lead = wins[i][cur] - wins[cur][i]
            bar = self._z * math.sqrt(wins[i][cur] + wins[cur][i]) + self._min_lead
            if lead > bar and lead > best_lead:
                best, best_lead = i, lead
        return best

    # ------------------------------------------------------------------ online mode
    def _update(self, access: Access) -> None:
        self._score(access)
        decisions = [e.observe(access) for e in self._experts]
        self._pending = decisions[self._leader]

    def _decide(self, access: Access) -> Decision:
        pending, self._pending = self._pending, NO_CHANGE
        # Switch only where a request starts: mid-request, the blocks the old leader missed
        # already broke the prefix, and the new leader's blocks could not serve the rest.
        starts = access.position is None or access.position == 0
        new = self._challenger() if starts else self._leader
        if new != self._leader:
            self._leader = new
            self._switches += 1
            return self._follow(access.time)
        if pending is NO_CHANGE:
            return NO_CHANGE
        return self._mirror(pending, access.time)

    def _mirror(self, d: Decision, now: float) -> Decision:
        """Apply the leader's own decision to this policy's resident set."""
        evictions = tuple(self._evict(ev.key, now) for ev in d.evict if ev.key in self._resident)
        admissions = tuple(
            self._admit(ad.key, ad.tenant, ad.size, ad.score)
            for ad in d.admit
            if ad.key not in self._resident
        )
        if not (evictions or admissions):
            return NO_CHANGE
        return Decision(admit=admissions, evict=evictions)

    def _follow(self, now: float) -> Decision:
        """Move the resident set to the leader's: evictions first, then admissions."""
        leader = self._experts[self._leader]
        target = leader.resident_keys()
        evictions: list[Eviction] = [
            self._evict(k, now) for k in list(self._resident) if k not in target
        ]
        admissions: list[Admission] = []
        for k in target:
            if k not in self._resident:
                tenant, size = leader._resident_entry(k)
                admissions.append(self._admit(k, tenant, size, leader.residual_value(k, now)))
        if not (evictions or admissions):
            return NO_CHANGE
        return Decision(admit=tuple(admissions), evict=tuple(evictions))

    # ------------------------------------------------------------------ batch mode
    def record_many(self, accesses: Iterable[Access]) -> int:
        """Batch mode: count the experts' hits on the batch, then record it into each.

        Returns:
            How many accesses were recorded.

        Raises:
            InvalidAccessError: if an access is malformed (the experts stop at it too).
        """
        seq = accesses if isinstance(accesses, list) else list(accesses)
        for i, a in enumerate(seq):
            try:
                check_access(a)
            except InvalidAccessError:
                for e in self._experts:
                    e.record_many(seq[:i])
                raise
            self._score(a)
            self._latest = max(self._latest, a.time)
        for e in self._experts:
            e.record_many(seq)
        return len(seq)

    def record(self, access: Access) -> None:
        """Batch mode: one access (see :meth:`record_many`)."""
        self.record_many([access])

    def select(self, now: float) -> Decision:
        """Every expert re-selects; this policy follows the leader (switching if one leads).

        Args:
            now: current time in seconds.

        Returns:
            The change of resident set.
        """
        self._latest = max(self._latest, now)
        for e in self._experts:
            e.select(now)
        new = self._challenger()
        if new != self._leader:
            self._leader = new
            self._switches += 1
        return self._follow(now)

    def rank(self, now: float) -> list[Ranked]:
        """The leader's ranking (residency flags are this policy's, equal to the leader's).

        Args:
            now: current time in seconds.

        Returns:
            Every chunk the leader tracks, best first.
        """
        return [
            Ranked(r.key, r.tenant, r.size, r.score, r.key in self._resident, r.parent)
            for r in self._experts[self._leader].rank(now)
        ]

    def set_kv_class(self, key: int, kv_class: KvClass) -> None:
        """Sets a chunk's class here and in every expert: whichever leads keeps static first."""
        super().set_kv_class(key, kv_class)
        for e in self._experts:
            e.set_kv_class(key, kv_class)

    def invalidate(self, key: int, now: float | None = None) -> Decision:
        """Forget a chunk in every expert, and drop what the leader no longer holds.

        Returns:
            DROP evictions of this policy's chunks that the leader dropped with it.
        """
        at = self._latest if now is None else now
        self._static.discard(key)
        self._static_seen.pop(key, None)
        for e in self._experts:
            e.invalidate(key, at)
        target = self._experts[self._leader].resident_keys()
        evictions = tuple(
            self._evict(k, at, action=EvictAction.DROP)
            for k in list(self._resident)
            if k not in target
        )
        return Decision(evict=evictions) if evictions else NO_CHANGE

    def _knows(self, key: int) -> bool:
        return key in self._resident or any(e._knows(key) for e in self._experts)

    def residual_value(self, key: int, now: float) -> float:
        """The chunk's value by kvcast's expert (by the leader without a kvcast expert)."""
        src = self._value if self._value is not None else self._experts[self._leader]
        return src.residual_value(key, now)
