"""kvcast's own policy: expected pool bytes saved per SRAM byte, prefix-aware, with hysteresis.

The value of keeping a chunk in SRAM is the pool bytes it saves: the bytes of every future
fetch it serves. Per SRAM byte that is the chunk's future fetch rate, which the policy
estimates from the past with an exponentially decayed, host-weighted access count:

    score(k, now) = sum over accesses i of k:  w_i * 2 ** (-(now - t_i) / H)

* ``w_i = 1`` for an access from a host that has not asked for the chunk in the current
  episode (since it was last idle for a half-life), ``repeat_host_weight`` for a repeat from
  the same host. Demand spread over many hosts is what multicast serves at once (one SRAM read
  replicated to N hosts, and the N-to-1 incast on the pool link that it removes); a repeat by
  one host is often served by that host's own HBM/DRAM prefix cache and is a weaker signal.
  Hosts are tracked in a 64-bit bitmap per chunk (exact up to 64 hosts, hashed beyond).
* Decay makes the estimate follow shifting popularity. It is kept lazily in the log domain
  (``log2 sum w_i 2**v(t_i)`` on a virtual clock ``v`` that advances one unit per half-life),
  so aging costs nothing per tick, all chunks stay comparable at any instant, and the
  half-life can change without touching any stored score.
* The half-life adapts to the workload's time scale unless fixed: it is ``gap_factor`` times
  the running median of the *first-reuse gap* (time from a chunk's first access to its
  second), the time an SRAM entry must survive to earn anything. Why 1.5: a chunk reused
  once after a gap g has score ``(1 + u) * u`` with ``u = 2**(-g/H)`` just before its next
  reuse, and it still outranks a fresh one-off (score 1) only while ``u + u*u >= 1``, i.e.
  ``H >= g / log2(golden ratio) = 1.44 g``. Agent branches reuse within seconds,
  conversations within minutes; one fixed half-life cannot serve both.
* Learned weights (``learned_weights``): each access also weighs the share of blocks of its
  *class* that came back, learned online from every access the controller hears of. The class
  is the block's access count (1, 2, 3, 4-7, 8+) and either its gap since the previous access
  (in half-lives) or, at first sight, how often its parent in the prefix tree was seen. On the
  conversation trace a first sighting returns 23 % of the time and a fourth one 55 %; in
  multi-turn chat with memoryless sessions every turn returns about 80 % of the time; a unique
  question tail never does. The same rule then weighs a one-off like a one-off and a session
  turn like a session turn without a parameter per workload, and the score becomes a decayed
  count of expected reuses rather than of accesses.
* Prefix structure: block i of a request is useful only if blocks 0..i-1 are available, and a
  child is never more popular than its parent. The policy clamps a block's priority to its
  parent's (``pri = min(own, parent)``), breaks ties by evicting the deeper block, admits a
  block only when its parent is resident (``prefix_closed``), and when it evicts a block it also
  evicts the resident descendants that would be orphaned. The cached set stays prefix-closed,
  so no SRAM holds a block that can never be served.
* Hysteresis: a newcomer displaces only chunks whose value density is lower by the factor
  ``1 + hysteresis``, and a batch re-select ranks residents with the same bonus. Loading a chunk
  costs SRAM WRITE packets through the switch CPU port and table churn, and the counts it
  compares are noisy (a Poisson count n has relative noise 1/sqrt(n): 25 % at n = 16), so
  near-ties must not swap chunks back and forth.
* Shadow rankings (``shadow_rankings``, off by default): four scores per chunk (the one
  above; recency: the last access only; long memory: a 2x slower decay; frequency: an 8x
  slower decay, no learned weight), each run as a ghost
  cache on a hashed sample of prefix-chain segments; the policy ranks by the variant whose
  ghost has had significantly more hits lately. Memoryless chat sessions want recency, the
  conversation trace a longer memory, and no fixed setting serves both. Python record path
  only (no C step yet). With ``reuse_modes`` a fifth variant, fast reuse, decays with the
  half-life of the fast mode of the reuse gaps (a running two-cluster estimate): where reuse
  is bimodal (the next turn seconds later, or minutes later) the adaptive half-life sits in
  the slow mode, and a small budget can serve only the fast one.
* Value recovery: an evicted chunk whose current score is at least ``demote_threshold`` (about
  one expected access per half-life) is DEMOTEd to the lower tier, otherwise DROPped.

Batch path: ``record_many`` and ``record_arrays`` run the per-access update in C
(``controlplane.policies._kvcast_native``, built by ``pip install -e .``; its binding is
:mod:`controlplane.policies.kvcast_native`) when it is built and ``KVCAST_NATIVE`` is not ``0``:
the same operations in the same order, so the statistics, the ranking and every decision are
those of the Python path, bit for bit (tested both ways). An access the C loop cannot take
exactly as Python would (a subclass of Access, a non-int key, a value outside 64 bits, a
malformed one) goes through the Python path. The ghost caches of the shadow rankings are in
:mod:`controlplane.policies.kvcast_shadows`.

Classes:
    KvcastPolicy: the policy (registered as ``"kvcast"``): the scores, the online decision,
        the batch re-select and the ranking.
"""

from __future__ import annotations

import heapq
import itertools
import math
from typing import Any

import numpy as np

from controlplane.policies.base import (
    NO_CHANGE,
    Access,
    Decision,
    PolicyConfigError,
    Ranked,
    register_policy,
)
from controlplane.policies.kvcast_native import NativeRecordPolicy, native_record
from controlplane.policies.kvcast_shadows import (
    FREQUENCY_MEMORY,
    LONG_MEMORY,
    SEGMENT,
    VARIANTS,
    Shadows,
)

__all__ = ["KvcastPolicy"]

_NEG_INF = float("-inf")


_FAST = -1.0
"""Decay divisor marking the fast-reuse variant, which runs on a clock of its own."""

_N_CLASSES = 20
"""Reuse classes of the learned weights: 5 access-count buckets x 4 (gap or parent) buckets."""


class _Meta:
    """Statistics of one tracked chunk (resident or not)."""

    __slots__ = (
        "cls",
        "count",
        "first",
        "hosts",
        "last",
        "logs",
        "parent",
        "position",
        "pri",
        "root",
        "size",
        "tenant",
        "vlogs",
        "vpri",
    )

    def __init__(self, tenant: int, size: int) -> None:
        self.tenant = tenant
        self.size = size
        self.parent: int | None = None
        self.position = 0
        self.logs = _NEG_INF  # log2 of sum w_i 2**v(t_i), v = the virtual clock
        self.pri = _NEG_INF  # min(logs, parent's pri): the eviction priority
        self.last = _NEG_INF
        self.first = _NEG_INF  # time of the first access until the first reuse, then +inf
        self.hosts = 0
        self.count = 0
        self.cls = -1
        self.root = 0  # the first block of its segment of the prefix chain (shadow sample)
        self.vlogs: list[float] = []  # logs and pri under each variant (shadow rankings)
        self.vpri: list[float] = []


@register_policy("kvcast")
class KvcastPolicy(NativeRecordPolicy):
    """Decayed, host-weighted reuse value per SRAM byte; prefix-closed; with hysteresis.

    Args:
        capacity_bytes: SRAM budget in bytes.
        half_life_s: fixed half-life of the decayed access count in seconds, or None to
            adapt it (``gap_factor`` x the median first-reuse gap).
        gap_factor: adaptive half-life over the median first-reuse gap.
        initial_half_life_s: adaptive half-life before the first reuses are seen.
        min_half_life_s: lower bound of the adaptive half-life.
        max_half_life_s: upper bound of the adaptive half-life.
        hysteresis: a challenger must be worth ``1 + hysteresis`` times what it displaces.
        repeat_host_weight: weight of an access from a host already counted in the current
            episode (1.0 turns host weighting off).
        prefix_closed: admit a block only while its parent is resident.
        max_tracked: chunks whose statistics are kept; beyond it the least valuable
            non-resident ones are forgotten (bounded controller memory).
        demote_threshold: score at or above which an evicted chunk is DEMOTEd.
        learned_weights: weigh each access by the learned share of its class's blocks that
            came back (False: every access weighs 1, the policy before issue 14).
        native: use the C record path for batches when it is built (``KVCAST_NATIVE=0`` also
            turns it off; read when the policy is created).
        history_weight: at each access the decayed sum of the earlier ones is first multiplied
            by this (1: the plain decayed sum; below 1 the score leans towards the last
            access, as LRU does; a grid point of the leave-one-family-out evaluation).
        shadow_rankings: keep four scores per chunk (this one; recency: the last access
            only, no learned weight; long memory: a 2x slower decay; frequency: an 8x slower
            decay, no learned weight) and rank by the one whose
            ghost cache has had significantly more hits lately (ghosts run on a hashed
            sample of the prefix chains). Batches then go through the Python record path.
        shadow_sample_chunks: about how many chunks each ghost cache holds (the sample rate
            is this over the budget in chunks, at most 1).
        shadow_z: how many standard deviations a variant's lead in ghost hits must reach.
        reuse_modes: add a fifth shadow variant, *fast reuse*: the decayed count on a clock of
            its own whose half-life is ``gap_factor`` x the fast mode of the reuse gaps (a
            running two-cluster estimate of log2 of every gap between a chunk's accesses),
            without the learned weight. Needs ``shadow_rankings``.

    Raises:
        PolicyConfigError: for a non-positive half-life, a negative hysteresis, a host weight
            outside (0, 1], ``max_tracked`` < 16 or ``reuse_modes`` without shadow rankings.
    """

    def __init__(
        self,
        capacity_bytes: int,
        *,
        half_life_s: float | None = None,
        gap_factor: float = 1.5,
        initial_half_life_s: float = 60.0,
        min_half_life_s: float = 1.0,
        max_half_life_s: float = 3600.0,
        hysteresis: float = 0.25,
        repeat_host_weight: float = 0.5,
        prefix_closed: bool = True,
        max_tracked: int = 1 << 18,
        demote_threshold: float = 1.0,
        learned_weights: bool = True,
        native: bool = True,
        history_weight: float = 1.0,
        shadow_rankings: bool = False,
        shadow_sample_chunks: int = 8192,
        shadow_z: float = 3.0,
        reuse_modes: bool = False,
    ) -> None:
        super().__init__(capacity_bytes, demote_threshold=demote_threshold)
        if half_life_s is not None and not half_life_s > 0:
            raise PolicyConfigError(f"half_life_s must be > 0 or None, got {half_life_s}")
        if not 0 < min_half_life_s <= initial_half_life_s <= max_half_life_s:
            raise PolicyConfigError(
                "need 0 < min_half_life_s <= initial_half_life_s <= max_half_life_s, got "
                f"{min_half_life_s}, {initial_half_life_s}, {max_half_life_s}"
            )
        if not gap_factor > 0:
            raise PolicyConfigError(f"gap_factor must be > 0, got {gap_factor}")
        if not hysteresis >= 0:
            raise PolicyConfigError(f"hysteresis must be >= 0, got {hysteresis}")
        if not 0 < repeat_host_weight <= 1:
            raise PolicyConfigError(
                f"repeat_host_weight must be in (0, 1], got {repeat_host_weight}"
            )
        if max_tracked < 16:
            raise PolicyConfigError(f"max_tracked must be >= 16, got {max_tracked}")
        if not 0 < history_weight <= 1:
            raise PolicyConfigError(f"history_weight must be in (0, 1], got {history_weight}")
        self._log_history = math.log2(history_weight)
        if shadow_sample_chunks < 16:
            raise PolicyConfigError(
                f"shadow_sample_chunks must be >= 16, got {shadow_sample_chunks}"
            )
        if not shadow_z >= 0:
            raise PolicyConfigError(f"shadow_z must be >= 0, got {shadow_z}")
        # (log2 history weight, learned weight in the score, decay divisor) per variant
        self._variants = [
            (self._log_history, learned_weights, 1.0),
            (_NEG_INF, False, 1.0),
            (self._log_history, learned_weights, LONG_MEMORY),
            (self._log_history, False, FREQUENCY_MEMORY),
        ]
        if reuse_modes:
            if not shadow_rankings:
                raise PolicyConfigError("reuse_modes needs shadow_rankings=True")
            # The fast-reuse variant: its own clock (the fast mode's half-life), no learned
            # weight (its classes are in the default half-life's units).
            self._variants.append((self._log_history, False, _FAST))
        self._modes = reuse_modes
        # Two-cluster estimate of log2(reuse gap): the fast and the slow mode's medians.
        self._mode_lo = math.log2(initial_half_life_s / gap_factor) - 2.0
        self._mode_hi = self._mode_lo + 4.0
        self._mode_samples = 0
        self._fast_t: float | None = None
        self._fast_v = 0.0
        self._shadow_on = shadow_rankings
        self._shadow_chunks = shadow_sample_chunks
        self._shadow_z = shadow_z
        self._shadow: Shadows | None = None
        self._mult = 1.0  # the current variant's decay divisor
        self._adaptive = half_life_s is None
        self._half_life = float(initial_half_life_s if half_life_s is None else half_life_s)
        self._gap_factor = float(gap_factor)
        self._min_half_life = float(min_half_life_s)
        self._max_half_life = float(max_half_life_s)
        self._fast_half_life = self._half_life_for(self._mode_lo)
        # Running median of log2(first-reuse gap), by the sign-step quantile tracker.
        self._log_gap = math.log2(self._half_life / self._gap_factor)
        self._gap_samples = 0
        self._log_margin = math.log2(1.0 + hysteresis)
        self._log_repeat = math.log2(repeat_host_weight)
        self._prefix_closed = prefix_closed
        self._max_tracked = max_tracked
        # Virtual clock v(t) = v_c + (t - t_c) / H: one unit per half-life.
        self._clock_t: float | None = None
        self._clock_v = 0.0
        self._meta: dict[int, _Meta] = {}
        self._children: dict[int, set[int]] = {}  # resident parent -> resident children
        self._heap: list[tuple[float, int, int, int]] = []  # (pri, -position, seq, key)
        self._token: dict[int, int] = {}  # resident key -> seq of its live heap entry
        self._seq = itertools.count()
        self._learned = learned_weights
        # Per reuse class: blocks that entered it and how many of them came back (a prior of
        # one half for classes not seen yet).
        self._cls_entries = [1.0] * _N_CLASSES
        self._cls_reuses = [0.5] * _N_CLASSES
        self._cls_samples = 0
        self._ext = native_record() if native and not shadow_rankings else None
        self._meta_cls: Any = _Meta if self._ext is None else self._ext.KvMeta

    # ------------------------------------------------------------------ statistics
    @property
    def half_life_s(self) -> float:
        """The half-life in use now (fixed, or the adaptive estimate)."""
        return self._half_life

    def _x(self, t: float) -> float:
        """The virtual clock at ``t``, in half-lives (the log2 inflation of a weight)."""
        if self._clock_t is None:
            return 0.0
        return self._clock_v + (t - self._clock_t) / self._half_life

    def _xs(self, t: float) -> float:
        """The virtual clock of the scores in use (slower under the long-memory variant)."""
        if self._mult == _FAST:
            return self._fx(t)
        x = self._x(t)
        return x if self._mult == 1.0 else x / self._mult

    def _fx(self, t: float) -> float:
        """The fast-reuse variant's clock at ``t``, in its own half-lives."""
        if self._fast_t is None:
            return 0.0
        return self._fast_v + (t - self._fast_t) / self._fast_half_life

    def _observe_mode(self, gap: float, now: float) -> None:
        """Feed one reuse gap to the two-cluster tracker and retune the fast half-life.

        The gap joins the nearer of two centres (log2 seconds), which takes one sign step
        towards it: each centre tracks the median of its own cluster, so on bimodal reuse
        (the next turn seconds later, or minutes later) the lower one sits in the fast mode.
        """
        if self._fast_t is None:
            self._fast_t = now
        step = 1.0 / 16 if self._mode_samples >= 64 else 0.5
        self._mode_samples += 1
        lg = math.log2(max(gap, 1e-3))
        lo = abs(lg - self._mode_lo) <= abs(lg - self._mode_hi)
        c = self._mode_lo if lo else self._mode_hi
        c += step if lg > c else -step if lg < c else 0.0
        if lo:
            self._mode_lo = min(c, self._mode_hi)
        else:
            self._mode_hi = max(c, self._mode_lo)
        target = self._half_life_for(self._mode_lo)
        if abs(math.log2(target / self._fast_half_life)) > 0.1:
            self._fast_v = self._fx(now)
            self._fast_t = now
            self._fast_half_life = target

    @property
    def fast_half_life_s(self) -> float | None:
        """The fast-reuse variant's half-life (None without ``reuse_modes``)."""
        return self._fast_half_life if self._modes else None

    @property
    def variant(self) -> str:
        """The scoring variant in use (``default`` without shadow rankings)."""
        return VARIANTS[0 if self._shadow is None else self._shadow.current]

    @property
    def variant_switches(self) -> int:
        """How many times the shadow rankings changed the scoring variant."""
        return 0 if self._shadow is None else self._shadow.switches

    def _half_life_for(self, log_gap: float) -> float:
        """``gap_factor`` x the gap ``2**log_gap``, within the half-life's bounds."""
        target: float = self._gap_factor * 2.0**log_gap
        return min(self._max_half_life, max(self._min_half_life, target))

    def _observe_gap(self, gap: float, now: float) -> None:
        """Feed one first-reuse gap to the median tracker and retune the half-life."""
        step = 1.0 / 16 if self._gap_samples >= 64 else 0.5
        self._gap_samples += 1
        lg = math.log2(max(gap, 1e-3))
        if lg > self._log_gap:
            self._log_gap += step
        elif lg < self._log_gap:
            self._log_gap -= step
        target = self._half_life_for(self._log_gap)
        if abs(math.log2(target / self._half_life)) > 0.1:
            # Start a new clock segment; stored scores stay valid as they are.
            self._clock_v = self._x(now)
            self._clock_t = now
            self._half_life = target

    def _learn(self, m: _Meta, now: float, parent: int | None) -> float:
        """Account one access in the reuse classes; the log2 weight it contributes.

        The class an access puts a block in is its access count (1, 2, 3, 4-7, 8+) and one
        more feature: from the second access on, the gap since the previous one in half-lives
        (< 1/4, < 1, more); at first sight, what the prefix tree says of the block's parent
        (none, seen once, 2-7 times, 8+ times: a new branch under a hot system prompt is
        another kind than the tail of a brand-new chain). The block's previous class is
        credited with a reuse; the weight is the share of blocks that came back after entering
        the new class (at least 1/64). Counts are halved every 65,536 accesses so the shares
        follow a changing workload.
        """
        if m.cls >= 0:
            self._cls_reuses[m.cls] += 1.0
        m.count += 1
        c = m.count
        cls = (c - 1 if c < 4 else 3 if c < 8 else 4) * 4
        if c > 1:
            g = (now - m.last) / self._half_life
            cls += 1 if g < 0.25 else 2 if g < 1.0 else 3
        elif parent is not None:
            pm = self._meta.get(parent)
            pc = pm.count if pm is not None else 0
            cls += 1 if pc <= 1 else 2 if pc < 8 else 3
        m.cls = cls
        self._cls_entries[cls] += 1.0
        self._cls_samples += 1
        if self._cls_samples >= 1 << 16:
            self._cls_samples = 0
            self._cls_entries = [max(v / 2, 1.0) for v in self._cls_entries]
            self._cls_reuses = [v / 2 for v in self._cls_reuses]
        share = self._cls_reuses[cls] / self._cls_entries[cls]
        return math.log2(min(max(share, 1.0 / 64), 1.0))

    def score(self, key: int, now: float) -> float | None:
        """Current decayed, host-weighted access count of a chunk (None if untracked).

        Args:
            key: chunk key.
            now: current time in seconds.

        Returns:
            The prefix-clamped score, or None for a chunk the policy does not track.
        """
        m = self._meta.get(key)
        if m is None:
            return None
        return float(2.0 ** (m.pri - self._xs(now)))

    def _update(self, access: Access) -> None:
        if self._clock_t is None:
            self._clock_t = access.time
        key = access.key
        m = self._meta.get(key)
        if m is None:
            m = self._meta_cls(access.tenant, access.size)
            self._meta[key] = m
        elif key not in self._resident:
            m.tenant = access.tenant
            m.size = access.size
        if self._modes and m.last != _NEG_INF:
            self._observe_mode(access.time - m.last, access.time)
        if m.first == _NEG_INF:
            m.first = access.time
        elif m.first != math.inf:
            if self._adaptive:
                self._observe_gap(access.time - m.first, access.time)
            m.first = math.inf
        x = self._x(access.time)
        # Host weighting: a new episode starts once the chunk was idle for a half-life.
        if access.time - m.last > self._half_life:
            m.hosts = 0
        bit = 1 << (access.host & 63)
        lw = x + self._log_repeat if m.hosts & bit else x
        if self._shadow_on:
            lhost = self._log_repeat if m.hosts & bit else 0.0
            w = self._learn(m, access.time, access.parent) if self._learned else 0.0
            m.hosts |= bit
            m.last = access.time
            self._update_variants(access, m, x, lhost, w)
            return
        if self._learned:
            lw += self._learn(m, access.time, access.parent)
        m.hosts |= bit
        a = m.logs + self._log_history
        if a == _NEG_INF:
            m.logs = lw
        elif a >= lw:
            m.logs = a + math.log2(1.0 + 2.0 ** (lw - a))
        else:
            m.logs = lw + math.log2(1.0 + 2.0 ** (a - lw))
        m.last = access.time
        pri = m.logs
        if access.parent is not None:
            m.parent = access.parent
            pm = self._meta.get(access.parent)
            if pm is not None:
                m.position = pm.position + 1
                pri = min(pri, pm.pri)
        if access.position is not None:
            m.position = access.position
        m.pri = pri
        if key in self._resident:
            self._push(key, m)
        elif len(self._meta) > self._max_tracked:
            self._prune(keep=key)

    def _update_variants(self, access: Access, m: _Meta, x: float, lhost: float, w: float) -> None:
        """The rest of an access with shadow rankings: every variant's score, the ghosts.

        Args:
            access: the access.
            m: its chunk's statistics (count, hosts and last access already updated).
            x: the virtual clock at the access.
            lhost: log2 of its host weight.
            w: log2 of its learned weight (0 without learned weights).
        """
        key = access.key
        shadow = self._shadow
        if shadow is None:
            shadow = self._shadow = Shadows(
                self._capacity,
                access.size,
                len(self._variants),
                self._log_margin,
                self._shadow_chunks,
                self._shadow_z,
            )
        if not m.vlogs:
            m.vlogs = [_NEG_INF] * len(self._variants)
            m.vpri = [_NEG_INF] * len(self._variants)
        pm = None
        if access.parent is not None:
            m.parent = access.parent
            pm = self._meta.get(access.parent)
            if pm is not None:
                m.position = pm.position + 1
        if access.position is not None:
            m.position = access.position
        for i, (log_history, use_w, mult) in enumerate(self._variants):
            if mult == _FAST:
                lw = self._fx(access.time) + lhost
            else:
                lw = (x if mult == 1.0 else x / mult) + lhost
            if use_w:
                lw += w
            a = m.vlogs[i] + log_history
            if a == _NEG_INF:
                logs = lw
            elif a >= lw:
                logs = a + math.log2(1.0 + 2.0 ** (lw - a))
            else:
                logs = lw + math.log2(1.0 + 2.0 ** (a - lw))
            m.vlogs[i] = logs
            m.vpri[i] = min(logs, pm.vpri[i]) if pm is not None and pm.vpri else logs
        same_segment = pm is not None and m.position % SEGMENT != 0
        m.root = pm.root if same_segment and pm is not None else key
        c = shadow.current
        m.logs = m.vlogs[c]
        m.pri = m.vpri[c]
        if shadow.sampled(m.root):
            shadow.step(
                key, access.size, access.parent if same_segment else None, m.position, m.vpri
            )
            if shadow.current != c:
                self._use_variant(shadow.current)
        if key in self._resident:
            self._push(key, m)
        elif len(self._meta) > self._max_tracked:
            self._prune(keep=key)

    def _use_variant(self, i: int) -> None:
        """Rank by variant ``i`` from now on: every chunk's score and the heap switch at once."""
        self._mult = self._variants[i][2]
        for m in self._meta.values():
            if m.vlogs:
                m.logs = m.vlogs[i]
                m.pri = m.vpri[i]
        self._heap = []
        self._token = {}
        for key in self._resident:
            self._push(key, self._meta[key])

    def _push(self, key: int, m: _Meta) -> None:
        seq = next(self._seq)
        self._token[key] = seq
        heapq.heappush(self._heap, (m.pri, -m.position, seq, key))
        if len(self._heap) > 4 * len(self._token) + 1024:
            # Drop stale entries so the heap stays O(resident chunks).
            self._heap = [e for e in self._heap if self._token.get(e[3]) == e[2]]
            heapq.heapify(self._heap)

    def _prune(self, keep: int) -> None:
        """Forget the least valuable non-resident chunks down to 3/4 of ``max_tracked``.

        Args:
            keep: a key that must survive (the one being accessed).
        """
        drop = len(self._meta) - (3 * self._max_tracked) // 4
        if self._ext is not None:
            # The same candidates in the same order, read in C.
            keys, logs_all, _, _, excluded, _ = self._columns(keep)
            idx = np.flatnonzero(~excluded)
            if drop <= 0 or not len(idx):
                return
            logs = logs_all[idx]
            drop = min(drop, len(idx))
            for i in np.argpartition(logs, drop - 1)[:drop]:
                del self._meta[keys[int(idx[int(i)])]]
            return
        candidates = [k for k in self._meta if k not in self._resident and k != keep]
        if drop <= 0 or not candidates:
            return
        logs = np.fromiter((self._meta[k].logs for k in candidates), float, len(candidates))
        drop = min(drop, len(candidates))
        for i in np.argpartition(logs, drop - 1)[:drop]:
            del self._meta[candidates[int(i)]]

    def _columns(
        self, keep: int | None = None
    ) -> tuple[list[int], np.ndarray, np.ndarray, np.ndarray, np.ndarray, int | None]:
        """Every tracked chunk's key, logs, pri, position, resident-or-``keep`` flag; min size.

        Read in C when the native path is in use, else in Python; the dict's order either way.
        """
        if self._ext is not None:
            keys, logs, pri, pos, excl, min_size = self._ext.columns(
                self._meta, self._resident, keep
            )
            return (
                keys,
                np.frombuffer(logs, np.float64),
                np.frombuffer(pri, np.float64),
                np.frombuffer(pos, np.int64),
                np.frombuffer(excl, np.uint8).astype(bool),
                min_size,
            )
        keys = list(self._meta)
        metas = [self._meta[k] for k in keys]
        n = len(metas)
        return (
            keys,
            np.fromiter((m.logs for m in metas), float, n),
            np.fromiter((m.pri for m in metas), float, n),
            np.fromiter((m.position for m in metas), np.int64, n),
            np.fromiter((k in self._resident or k == keep for k in keys), bool, n),
            min((m.size for m in metas), default=None),
        )

    # ------------------------------------------------------------------ online decision
    def _decide(self, access: Access) -> Decision:
        key = access.key
        if key in self._resident:
            return NO_CHANGE
        m = self._meta[key]
        if self._prefix_closed and m.parent is not None and m.parent not in self._resident:
            return NO_CHANGE
        need = access.size - self.free_bytes
        popped: list[tuple[float, int, int, int]] = []
        doomed: dict[int, None] = {}  # keys to evict, each after its descendants
        freed = 0
        while freed < need:
            entry = heapq.heappop(self._heap)
            victim = entry[3]
            if self._token.get(victim) != entry[2]:
                continue  # stale
            popped.append(entry)
            if victim in doomed:
                continue  # already going as a descendant of an earlier victim
            if entry[0] + self._log_margin >= m.pri or victim == m.parent:
                # Not worth (1 + hysteresis) times less per byte: keep everything.
                for e in popped:
                    heapq.heappush(self._heap, e)
                return NO_CHANGE
            for k in self._subtree(victim):
                if k not in doomed:
                    doomed[k] = None
                    freed += self._meta[k].size
        if m.parent is not None and m.parent in doomed:
            for e in popped:
                heapq.heappush(self._heap, e)
            return NO_CHANGE
        evictions = tuple(self._evict(k, access.time) for k in doomed)
        x = self._xs(access.time)
        admission = self._admit(key, access.tenant, access.size, float(2.0 ** (m.pri - x)))
        return Decision(admit=(admission,), evict=evictions)

    def _subtree(self, key: int) -> list[int]:
        """``key`` and its resident descendants, every descendant before its ancestor."""
        out: list[int] = []
        stack = [(key, False)]
        while stack:
            k, expanded = stack.pop()
            if expanded:
                out.append(k)
                continue
            stack.append((k, True))
            stack.extend((c, False) for c in self._children.get(k, ()))
        return out

    def _on_admit(self, key: int) -> None:
        m = self._meta[key]
        if m.parent is not None and m.parent in self._resident:
            self._children.setdefault(m.parent, set()).add(key)
        self._push(key, m)

    def _on_evict(self, key: int) -> None:
        self._token.pop(key, None)
        parent = self._meta[key].parent
        if parent is not None:
            siblings = self._children.get(parent)
            if siblings is not None:
                siblings.discard(key)
                if not siblings:
                    del self._children[parent]
        self._children.pop(key, None)

    def _forget(self, key: int) -> None:
        self._meta.pop(key, None)

    def _invalidation_set(self, key: int) -> list[int]:
        return self._subtree(key) if key in self._resident else [key]

    def _knows(self, key: int) -> bool:
        return key in self._meta

    def _parent_of(self, key: int) -> int | None:
        m = self._meta.get(key)
        return None if m is None else m.parent

    # ------------------------------------------------------------------ batch ranking
    def rank(self, now: float) -> list[Ranked]:
        """Every tracked chunk by decreasing prefix-clamped score (deeper blocks last on ties).

        Args:
            now: current time in seconds.

        Returns:
            The ranking; ``score`` is the decayed, host-weighted access count.
        """
        keys, _, pri, depth, _, _ = self._columns()
        order = np.lexsort((depth, -pri))
        x = self._xs(now)
        out = []
        for i in order:
            key = keys[int(i)]
            m = self._meta[key]
            out.append(
                Ranked(
                    key,
                    m.tenant,
                    m.size,
                    float(2.0 ** (m.pri - x)),
                    key in self._resident,
                    m.parent,
                )
            )
        return out

    def select(self, now: float) -> Decision:
        """Batch re-select with hysteresis: residents rank as if worth ``1 + hysteresis`` more.

        Fills the budget greedily by value density, static chunks (and their ancestors) before
        transient ones, skipping blocks whose tracked parent was not selected (prefix closure),
        and returns the difference from the resident set.

        Args:
            now: current time in seconds.

        Returns:
            Evictions of residents that lost their place and admissions of newcomers.
        """
        keys, _, pri, depth, resident, min_size = self._columns()
        if not keys or min_size is None:
            return NO_CHANGE
        value = -(pri + np.where(resident, self._log_margin, 0.0))
        if self._static:
            tier = self._static_closure(self._parent_of)
            transient = np.fromiter((k not in tier for k in keys), bool, len(keys))
            order = np.lexsort((depth, value, transient))
        else:
            order = np.lexsort((depth, value))
        chosen: dict[int, Ranked] = {}
        free = self._capacity
        x = self._xs(now)
        for i in order:
            if free < min_size:
                break
            key = keys[int(i)]
            m = self._meta[key]
            if m.size > free or m.pri == _NEG_INF:
                continue
            if self._prefix_closed and m.parent is not None and m.parent not in chosen:
                continue  # a block without its parent cannot be served
            chosen[key] = Ranked(key, m.tenant, m.size, float(2.0 ** (m.pri - x)), False, m.parent)
            free -= m.size
        # Evict parents' orphaned descendants together with them: a resident child whose
        # parent is dropped is not in `chosen` (its parent was skipped), so it is evicted too.
        return self._apply_target(chosen, now)

    # ------------------------------------------------------------------ value recovery
    def residual_value(self, key: int, now: float) -> float:
        """The chunk's current score (about its expected accesses per half-life)."""
        m = self._meta.get(key)
        if m is None:
            return 0.0
        return float(2.0 ** (m.logs - self._xs(now)))
