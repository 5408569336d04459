"""The cache-policy interface: access events in, admit/evict decisions out, and a registry.

A cache policy decides which KV-cache chunks occupy the switch SRAM under a byte budget. The
controller feeds it a stream of :class:`Access` events (hot-miss digests from the switch's
count-min sketch, per-entry hit counters, host-agent reports of what each host fetched) and
applies the :class:`Decision` it returns: evictions first, then admissions (the safe update
order: remove a table entry before its slot is reused).

The same object serves two modes:

* online, one access at a time: :meth:`CachePolicy.observe` updates statistics and decides at
  once (trace simulation, or a controller reacting to each digest);
* batch: :meth:`CachePolicy.record` only updates statistics, and the periodic
  :meth:`CachePolicy.on_tick` / :meth:`CachePolicy.select` re-ranks every known chunk
  (:meth:`CachePolicy.rank`) and returns the difference between the best set that fits and the
  current resident set.

KV classes (``kvcast.kvclass``): the controller tells the policy which chunks are static
(:meth:`CachePolicy.set_kv_class`); every other chunk is transient. A batch re-select fills the
budget with the static chunks first (in the policy's own order) and then the transient ones, so
under pressure transient chunks leave first and a static chunk is evicted only for another
static one or when static chunks alone overflow the budget. A prefix of a static chunk counts as
static (a block is served only with its whole prefix). The online decision (:meth:`observe`) is
each policy's own and does not look at classes: the controller decides in batches.

Classes:
    Access: one observed access to a chunk (the policy's only input).
    EvictAction: DROP a chunk, or DEMOTE it to a lower tier because it still has value.
    Admission: a chunk the controller should load into SRAM.
    Eviction: a chunk the controller should remove, with the action for its bytes.
    Decision: admissions, evictions and refusals produced by one call.
    Ranked: one scored chunk in a batch re-rank.
    CachePolicy: abstract base; owns the resident set and byte accounting.
    PolicyError: base of the typed errors below (a ``ControlPlaneError``).
    PolicyConfigError: bad constructor parameters or unknown policy name.
    InvalidAccessError: an access that no policy can accept (size <= 0, key out of range).
    FutureMismatchError: an offline policy saw an access its recorded future did not contain.

Functions:
    register_policy: class decorator that registers a policy under a name.
    make_policy: factory, ``make_policy("kvcast", capacity_bytes=..., **params)``.
    available_policies: names of registered policies.
    policy_class: the class registered under a name.
"""

from __future__ import annotations

import abc
import enum
import inspect
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple, TypeVar

import numpy as np
import numpy.typing as npt

from controlplane.errors import ConfigError, ControlPlaneError
from kvcast.kvclass import KvClass

__all__ = [
    "NO_CHANGE",
    "Access",
    "AccessColumns",
    "Admission",
    "CachePolicy",
    "Decision",
    "EvictAction",
    "Eviction",
    "FutureMismatchError",
    "InvalidAccessError",
    "PolicyConfigError",
    "PolicyError",
    "Ranked",
    "available_policies",
    "make_policy",
    "policy_class",
    "register_policy",
]

KEY_MAX = (1 << 64) - 1
"""Chunk keys are the low 64 bits of the chained block hash (unsigned)."""


class PolicyError(ControlPlaneError):
    """Base class of every error raised by the policy layer."""


class PolicyConfigError(PolicyError, ConfigError):
    """A policy name or constructor parameter is invalid (also a ``ValueError``)."""


class InvalidAccessError(PolicyError, ValueError):
    """An access event is malformed (size <= 0, key outside 0..2**64-1, position beyond 64 bits)."""


class FutureMismatchError(PolicyError):
    """An offline policy observed an access that differs from the future it was given."""


class EvictAction(enum.Enum):
    """What the controller does with the bytes of an evicted chunk.

    Attributes:
        DROP: the chunk has no expected value left; free the slot only.
        DEMOTE: the chunk is still expected to be reused; keep it in a lower tier (the DRAM
            pool, a host's DRAM) instead of discarding it.
    """

    DROP = "drop"
    DEMOTE = "demote"


@dataclass(frozen=True, slots=True)
class Access:
    """One access to a KV-cache chunk, as the controller learns of it.

    Attributes:
        key: 64-bit chunk key (low 64 bits of the chained block hash).
        tenant: tenant id; the switch's cache table matches on tenant and key.
        size: chunk size in bytes (> 0).
        host: id of the GPU host that wanted the chunk.
        time: event time in seconds (any monotone clock; only differences matter).
        hit: True if the switch served it from SRAM, False if it missed, None if unknown
            (e.g. a host report that does not say where the bytes came from).
        parent: key of the previous block in the same prefix chain, None for the first
            block or when the reporter does not know it. A block is useful only when its
            whole prefix is available, so policies that know the parent can keep the
            cached set prefix-closed.
        position: index of the block in its prefix chain (0 = first block), None if unknown.
    """

    key: int
    tenant: int
    size: int
    host: int
    time: float
    hit: bool | None = None
    parent: int | None = None
    position: int | None = None


class AccessColumns(NamedTuple):
    """A batch of accesses as column arrays (what a report decoder produces), checked.

    Attributes:
        keys: uint64 chunk keys.
        tenants: int64 tenant ids.
        sizes: int64 sizes in bytes.
        hosts: int64 host ids.
        times: float64 event times.
        parents: uint64 parent keys (meaningful where ``has_parent``).
        has_parent: uint8, 1 where the parent is known.
        positions: int64 positions in the chain, negative where unknown.
    """

    keys: npt.NDArray[np.uint64]
    tenants: npt.NDArray[np.int64]
    sizes: npt.NDArray[np.int64]
    hosts: npt.NDArray[np.int64]
    times: npt.NDArray[np.float64]
    parents: npt.NDArray[np.uint64]
    has_parent: npt.NDArray[np.uint8]
    positions: npt.NDArray[np.int64]

    @classmethod
    def build(
        cls,
        keys: npt.ArrayLike,
        tenants: npt.ArrayLike,
        sizes: npt.ArrayLike,
        hosts: npt.ArrayLike,
        times: npt.ArrayLike,
        parents: npt.ArrayLike | None = None,
        has_parent: npt.ArrayLike | None = None,
        positions: npt.ArrayLike | None = None,
    ) -> AccessColumns:
        """Convert and check columns: every one as long as ``keys``, one dimension.

        Args:
            keys: chunk keys (0..2**64-1).
            tenants: tenant ids.
            sizes: sizes in bytes (a size <= 0 is rejected when its access is recorded).
            hosts: host ids.
            times: event times in seconds.
            parents: parent keys, or None when no parent is known.
            has_parent: where ``parents`` holds a parent (default: everywhere if ``parents``
                is given).
            positions: positions in the prefix chain, negative for unknown (default: unknown).

        Returns:
            The columns as contiguous arrays of the documented types.

        Raises:
            InvalidAccessError: columns of different lengths or more than one dimension.
        """
        k = np.ascontiguousarray(keys, dtype=np.uint64)
        n = len(k)

        def col(v: npt.ArrayLike | None, dtype: type, fill: int) -> Any:
            if v is None:
                return np.full(n, fill, dtype=dtype)
            return np.ascontiguousarray(v, dtype=dtype)

        out = cls(
            k,
            col(tenants, np.int64, 0),
            col(sizes, np.int64, 0),
            col(hosts, np.int64, 0),
            col(times, np.float64, 0),
            col(parents, np.uint64, 0),
            col(has_parent, np.uint8, 0 if parents is None else 1),
            col(positions, np.int64, -1),
        )
        arrays: tuple[np.ndarray, ...] = tuple(out)
        for name, arr in zip(out._fields, arrays, strict=True):
            if arr.ndim != 1 or len(arr) != n:
                raise InvalidAccessError(
                    f"record_arrays: {name} has shape {arr.shape}, keys has ({n},)"
                )
        return out

    @classmethod
    def of(cls, accesses: Sequence[Access]) -> AccessColumns:
        """The columns of ``accesses`` (the inverse of :meth:`access`)."""
        return cls.build(
            [a.key for a in accesses],
            [a.tenant for a in accesses],
            [a.size for a in accesses],
            [a.host for a in accesses],
            [a.time for a in accesses],
            [a.parent or 0 for a in accesses],
            [a.parent is not None for a in accesses],
            [-1 if a.position is None else a.position for a in accesses],
        )

    def access(self, i: int) -> Access:
        """The ``i``-th access as an :class:`Access`."""
        return Access(
            key=int(self.keys[i]),
            tenant=int(self.tenants[i]),
            size=int(self.sizes[i]),
            host=int(self.hosts[i]),
            time=float(self.times[i]),
            parent=int(self.parents[i]) if self.has_parent[i] else None,
            position=int(self.positions[i]) if self.positions[i] >= 0 else None,
        )


@dataclass(frozen=True, slots=True)
class Admission:
    """Load this chunk into SRAM.

    Attributes:
        key: chunk key.
        tenant: tenant id (needed for the cache-table entry).
        size: bytes of SRAM it occupies.
        score: the policy's value estimate when it decided (policy-specific units).
    """

    key: int
    tenant: int
    size: int
    score: float


@dataclass(frozen=True, slots=True)
class Eviction:
    """Remove this chunk from SRAM.

    Attributes:
        key: chunk key.
        tenant: tenant id.
        size: bytes of SRAM freed.
        action: DROP, or DEMOTE to a lower tier because it is still expected to be reused.
        residual: the policy's estimate of the value left in the chunk (same units it uses
            for its DEMOTE threshold).
    """

    key: int
    tenant: int
    size: int
    action: EvictAction
    residual: float


@dataclass(frozen=True, slots=True)
class Decision:
    """The changes one policy call asks for; apply ``evict`` before ``admit``.

    Attributes:
        admit: chunks to load, in the order the policy chose them.
        evict: chunks to remove (always applied first).
        refused: keys that can never be cached (larger than the whole budget).
    """

    admit: tuple[Admission, ...] = ()
    evict: tuple[Eviction, ...] = ()
    refused: tuple[int, ...] = ()

    def __bool__(self) -> bool:
        """True when the decision changes anything or refuses a chunk."""
        return bool(self.admit or self.evict or self.refused)


NO_CHANGE = Decision()
"""The shared empty decision (most accesses change nothing)."""


@dataclass(frozen=True, slots=True)
class Ranked:
    """One chunk in a batch ranking, best first.

    Attributes:
        key: chunk key.
        tenant: tenant id.
        size: bytes.
        score: value per SRAM byte in the policy's units (higher is better).
        resident: whether the chunk is in SRAM now.
        parent: the chunk's parent key when the policy knows it (used to keep the
            selected set prefix-closed).
    """

    key: int
    tenant: int
    size: int
    score: float
    resident: bool
    parent: int | None = None


@dataclass(slots=True)
class _Resident:
    tenant: int
    size: int


class CachePolicy(abc.ABC):
    """Abstract cache-selection policy for the switch SRAM.

    The base class owns the resident set and its byte accounting and guarantees that the
    budget is never exceeded; subclasses implement the statistics (:meth:`_update`), the online
    decision (:meth:`_decide`), the ranking (:meth:`rank`) and the value left in a chunk
    (:meth:`residual_value`). Subclasses change the resident set only through
    :meth:`_admit` and :meth:`_evict`.

    Class attributes:
        name: registry name (set by :func:`register_policy`).
        offline: True for policies that need the future (evaluation bounds only; never a
            candidate for the controller).

    Args:
        capacity_bytes: SRAM budget in bytes (> 0).
        demote_threshold: an evicted chunk whose residual value is at least this is
            DEMOTEd rather than DROPped.

    Raises:
        PolicyConfigError: if ``capacity_bytes`` is not positive.
    """

    name: ClassVar[str] = ""
    offline: ClassVar[bool] = False

    def __init__(self, capacity_bytes: int, *, demote_threshold: float = 1.0) -> None:
        if not isinstance(capacity_bytes, int) or capacity_bytes <= 0:
            raise PolicyConfigError(
                f"capacity_bytes must be a positive int, got {capacity_bytes!r}"
            )
        self._capacity = capacity_bytes
        self._used = 0
        self._resident: dict[int, _Resident] = {}
        # The latest time seen (accesses, ticks): what invalidate() evaluates a residual at.
        self._latest = 0.0
        self._demote_threshold = float(demote_threshold)
        self._static: set[int] = set()
        # The last access of each static key, so that a policy that forgot the key (a bounded
        # history) can still be told to keep it: key -> (tenant, size, parent).
        self._static_seen: dict[int, tuple[int, int, int | None]] = {}

    # ------------------------------------------------------------------ state queries
    @property
    def capacity_bytes(self) -> int:
        """The SRAM budget in bytes."""
        return self._capacity

    @property
    def used_bytes(self) -> int:
        """Bytes occupied by resident chunks (never above ``capacity_bytes``)."""
        return self._used

    @property
    def free_bytes(self) -> int:
        """Bytes still free."""
        return self._capacity - self._used

    def __contains__(self, key: object) -> bool:
        """Whether ``key`` is resident in SRAM."""
        return key in self._resident

    def __len__(self) -> int:
        """Number of resident chunks."""
        return len(self._resident)

    def resident_keys(self) -> frozenset[int]:
        """The keys resident in SRAM now."""
        return frozenset(self._resident)

    # ------------------------------------------------------------------ KV classes
    def set_kv_class(self, key: int, kv_class: KvClass) -> None:
        """Sets a chunk's class; the next batch re-select keeps static chunks first.

        Args:
            key: chunk key (tracked or not: the class waits for the chunk's accesses).
            kv_class: its class.
        """
        if kv_class is KvClass.STATIC:
            self._static.add(key)
        else:
            self._static.discard(key)
            self._static_seen.pop(key, None)

    def kv_class(self, key: int) -> KvClass:
        """A chunk's class as set by :meth:`set_kv_class` (TRANSIENT unless set static)."""
        return KvClass.STATIC if key in self._static else KvClass.TRANSIENT

    def static_keys(self) -> frozenset[int]:
        """The keys set static."""
        return frozenset(self._static)

    def resident_bytes_by_class(self) -> dict[KvClass, int]:
        """Bytes of resident chunks per class (the policy's own figure of what SRAM holds)."""
        out = dict.fromkeys(KvClass, 0)
        for key, entry in self._resident.items():
            out[KvClass.STATIC if key in self._static else KvClass.TRANSIENT] += entry.size
        return out

    def _note_static(self, access: Access) -> None:
        if access.key in self._static:
            self._static_seen[access.key] = (access.tenant, access.size, access.parent)

    def _static_closure(self, parent_of: Callable[[int], int | None]) -> set[int]:
        """The static keys and every ancestor of theirs that ``parent_of`` knows.

        Args:
            parent_of: a tracked key's parent (None: first block or unknown); called only for
                keys the policy tracks.
        """
        tier: set[int] = set()
        for key in self._static:
            k: int | None = key
            while k is not None and k not in tier:
                tier.add(k)
                k = parent_of(k)
        return tier

    # ------------------------------------------------------------------ inputs
    def observe(self, access: Access) -> Decision:
        """Online mode: account for one access and decide at once.

        Args:
            access: the access event.

        Returns:
            The admissions/evictions this access triggers (often :data:`NO_CHANGE`).

        Raises:
            InvalidAccessError: if the access is malformed.
        """
        _check_access(access)
        self._latest = max(self._latest, access.time)
        self._update(access)
        self._note_static(access)
        if access.size > self._capacity and access.key not in self._resident:
            return Decision(refused=(access.key,))
        return self._decide(access)

    def record(self, access: Access) -> None:
        """Batch mode: account for one access without deciding anything.

        Decisions come later from :meth:`select` or :meth:`on_tick`.

        Args:
            access: the access event.

        Raises:
            InvalidAccessError: if the access is malformed.
        """
        _check_access(access)
        self._latest = max(self._latest, access.time)
        self._update(access)
        self._note_static(access)

    def record_many(self, accesses: Iterable[Access]) -> int:
        """Batch mode: :meth:`record` every access of an iterable.

        Args:
            accesses: access events in time order.

        Returns:
            How many accesses were recorded.
        """
        n = 0
        for access in accesses:
            _check_access(access)
            self._latest = max(self._latest, access.time)
            self._update(access)
            self._note_static(access)
            n += 1
        return n

    def record_arrays(
        self,
        keys: npt.ArrayLike,
        tenants: npt.ArrayLike,
        sizes: npt.ArrayLike,
        hosts: npt.ArrayLike,
        times: npt.ArrayLike,
        parents: npt.ArrayLike | None = None,
        has_parent: npt.ArrayLike | None = None,
        positions: npt.ArrayLike | None = None,
    ) -> int:
        """Batch mode over column arrays: the same as :meth:`record_many` of those accesses.

        A report decoder that has the accesses as arrays hands them over without building an
        :class:`Access` per access (see :meth:`AccessColumns.build` for the columns). This
        default builds them; a policy with a faster path (kvcast's C record path) overrides
        :meth:`_record_columns`.

        Returns:
            How many accesses were recorded.

        Raises:
            InvalidAccessError: columns of different lengths, or a malformed access (those
                before it stay recorded).
        """
        cols = AccessColumns.build(
            keys, tenants, sizes, hosts, times, parents, has_parent, positions
        )
        return self._record_columns(cols)

    def _record_columns(self, cols: AccessColumns) -> int:
        """What :meth:`record_arrays` does with checked columns: :meth:`record_many` of them.

        A policy with a faster path over columns (kvcast's C record path) overrides this.

        Args:
            cols: the columns, built and checked by :meth:`AccessColumns.build`.

        Returns:
            How many accesses were recorded.

        Raises:
            InvalidAccessError: a malformed access (those before it stay recorded).
        """
        return self.record_many(cols.access(i) for i in range(len(cols.keys)))

    def observe_many(self, accesses: Iterable[Access]) -> Decision:
        """Online mode over a batch: observe each access and return the net decision.

        A chunk admitted and evicted within the batch appears in neither list; a chunk
        evicted and re-admitted appears in neither either (it stays where it was).

        Args:
            accesses: access events in time order.

        Returns:
            The net change from the resident set before the call to the one after it.
        """
        before = dict(self._resident)
        evictions: dict[int, Eviction] = {}
        admissions: dict[int, Admission] = {}
        refused: dict[int, None] = {}
        for access in accesses:
            decision = self.observe(access)
            for ev in decision.evict:
                admissions.pop(ev.key, None)
                if ev.key in before:
                    evictions[ev.key] = ev
            for ad in decision.admit:
                if ad.key in evictions:
                    del evictions[ad.key]
                elif ad.key not in before:
                    admissions[ad.key] = ad
            for key in decision.refused:
                refused[key] = None
        if not (admissions or evictions or refused):
            return NO_CHANGE
        return Decision(
            admit=tuple(admissions.values()),
            evict=tuple(evictions.values()),
            refused=tuple(refused),
        )

    def on_tick(self, now: float) -> Decision:
        """Periodic decision point for the controller (default: a batch re-select).

        Args:
            now: current time in seconds, on the same clock as ``Access.time``.

        Returns:
            The changes to apply.
        """
        return self.select(now)

    def invalidate(self, key: int, now: float | None = None) -> Decision:
        """Forget a chunk that no longer exists (deleted from the pool, tenant flushed).

        Args:
            key: chunk key; unknown keys are ignored.
            now: current time, on the clock of ``Access.time``; default: the latest time the
                policy has seen (an eviction's residual value is evaluated then, never at 0,
                which decayed scores overflow at).

        Returns:
            DROP evictions for the chunk if it was resident (and, for prefix-aware policies,
            for resident descendants that can no longer be served), else :data:`NO_CHANGE`.
        """
        evictions: list[Eviction] = []
        for k in self._invalidation_set(key):
            if k in self._resident:
                at = self._latest if now is None else now
                evictions.append(self._evict(k, at, action=EvictAction.DROP))
        self._forget(key)
        self._static.discard(key)
        self._static_seen.pop(key, None)
        return Decision(evict=tuple(evictions)) if evictions else NO_CHANGE

    def _invalidation_set(self, key: int) -> list[int]:
        """Keys to evict when ``key`` disappears, each before its ancestors (default: itself)."""
        return [key]

    # ------------------------------------------------------------------ batch ranking
    @abc.abstractmethod
    def rank(self, now: float) -> list[Ranked]:
        """Score every chunk the policy tracks, best first.

        Args:
            now: current time in seconds.

        Returns:
            Resident chunks and tracked candidates, ordered by decreasing value per byte.
        """

    def select(self, now: float) -> Decision:
        """Batch re-rank: fill the budget greedily from :meth:`rank` and apply the difference.

        A candidate whose ``parent`` is known but not selected is skipped, so the selected
        set stays prefix-closed whenever the policy reports parents. Static chunks (and their
        ancestors) are taken before transient ones, each group in rank order.

        Args:
            now: current time in seconds.

        Returns:
            Evictions (residents not selected) and admissions (selected non-residents).
        """
        self._latest = max(self._latest, now)
        ranked = self.rank(now)
        if self._static:
            # Static chunks the policy no longer ranks (a bounded history forgot them) are
            # still candidates, after the static ones it ranks.
            ranked_keys = {r.key for r in ranked}
            ranked += [
                Ranked(key, tenant, size, 0.0, key in self._resident, parent)
                for key, (tenant, size, parent) in self._static_seen.items()
                if key not in ranked_keys
            ]
            parents = {r.key: r.parent for r in ranked}
            tier = self._static_closure(parents.get)
            ranked = [r for r in ranked if r.key in tier] + [r for r in ranked if r.key not in tier]
        chosen: dict[int, Ranked] = {}
        free = self._capacity
        for item in ranked:
            if item.size > free:
                continue
            if item.parent is not None and item.parent not in chosen and self._knows(item.parent):
                continue
            chosen[item.key] = item
            free -= item.size
            if free == 0:
                break
        return self._apply_target(chosen, now)

    def _knows(self, key: int) -> bool:
        """Whether the policy tracks ``key`` at all (used by the prefix rule in select)."""
        return key in self._resident

    def _apply_target(self, chosen: dict[int, Ranked], now: float) -> Decision:
        evictions = [self._evict(key, now) for key in list(self._resident) if key not in chosen]
        admissions = [
            self._admit(r.key, r.tenant, r.size, r.score)
            for r in chosen.values()
            if r.key not in self._resident
        ]
        if not (evictions or admissions):
            return NO_CHANGE
        return Decision(admit=tuple(admissions), evict=tuple(evictions))

    # ------------------------------------------------------------------ value recovery
    @abc.abstractmethod
    def residual_value(self, key: int, now: float) -> float:
        """The policy's estimate of the value left in a chunk (0.0 for unknown keys).

        Args:
            key: chunk key.
            now: current time in seconds.

        Returns:
            A non-negative value in the policy's units; at least ``demote_threshold`` means
            an eviction of this chunk is a DEMOTE.
        """

    # ------------------------------------------------------------------ subclass hooks
    @abc.abstractmethod
    def _update(self, access: Access) -> None:
        """Update statistics for one (already validated) access."""

    @abc.abstractmethod
    def _decide(self, access: Access) -> Decision:
        """Online decision after ``_update`` for an access whose chunk can fit."""

    def _on_admit(self, key: int) -> None:  # noqa: B027 - optional hook
        """Called after ``key`` became resident."""

    def _on_evict(self, key: int) -> None:  # noqa: B027 - optional hook
        """Called after ``key`` stopped being resident."""

    def _forget(self, key: int) -> None:  # noqa: B027 - optional hook
        """Drop every statistic about ``key`` (used by :meth:`invalidate`)."""

    # ------------------------------------------------------------------ resident-set changes
    def _admit(self, key: int, tenant: int, size: int, score: float) -> Admission:
        """Make ``key`` resident; the caller must have made room.

        Raises:
            PolicyError: if the key is already resident or does not fit (a policy bug).
        """
        if key in self._resident:
            raise PolicyError(f"{type(self).__name__}: key {key} admitted twice")
        if size > self._capacity - self._used:
            raise PolicyError(
                f"{type(self).__name__}: admitting key {key} ({size} B) would exceed the "
                f"budget ({self._used} of {self._capacity} B used)"
            )
        self._resident[key] = _Resident(tenant, size)
        self._used += size
        self._on_admit(key)
        return Admission(key, tenant, size, score)

    def _evict(self, key: int, now: float, *, action: EvictAction | None = None) -> Eviction:
        """Remove ``key`` from the resident set and say what to do with its bytes."""
        entry = self._resident.pop(key)
        self._used -= entry.size
        residual = self.residual_value(key, now)
        if action is None:
            action = EvictAction.DEMOTE if residual >= self._demote_threshold else EvictAction.DROP
        self._on_evict(key)
        return Eviction(key, entry.tenant, entry.size, action, residual)

    def _resident_entry(self, key: int) -> tuple[int, int]:
        """(tenant, size) of a resident key."""
        entry = self._resident[key]
        return entry.tenant, entry.size


def _check_access(access: Access) -> None:
    if access.size <= 0:
        raise InvalidAccessError(f"chunk {access.key}: size must be > 0, got {access.size}")
    if not 0 <= access.key <= KEY_MAX:
        raise InvalidAccessError(f"chunk key {access.key} is not an unsigned 64-bit value")
    if access.position is not None and not -(1 << 63) <= access.position < 1 << 63:
        raise InvalidAccessError(
            f"chunk {access.key}: position {access.position} is not a signed 64-bit value"
        )


# ---------------------------------------------------------------------- registry
_REGISTRY: dict[str, type[CachePolicy]] = {}

_P = TypeVar("_P", bound=type[CachePolicy])


def register_policy(name: str) -> Callable[[_P], _P]:
    """Class decorator: register a :class:`CachePolicy` subclass under ``name``.

    Args:
        name: registry name (lower-case identifier, e.g. ``"lru"``).

    Returns:
        The decorator; it sets ``cls.name`` and returns the class unchanged.

    Raises:
        PolicyConfigError: if the name is empty or already taken by another class.
    """
    if not name or not name.replace("_", "").replace("-", "").isalnum():
        raise PolicyConfigError(f"invalid policy name {name!r}")

    def decorator(cls: _P) -> _P:
        existing = _REGISTRY.get(name)
        if existing is not None and existing is not cls:
            raise PolicyConfigError(
                f"policy name {name!r} already registered by {existing.__qualname__}"
            )
        if inspect.isabstract(cls):
            raise PolicyConfigError(f"{cls.__qualname__} is abstract and cannot be registered")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return decorator


def policy_class(name: str) -> type[CachePolicy]:
    """The class registered under ``name``.

    Args:
        name: registry name.

    Returns:
        The policy class.

    Raises:
        PolicyConfigError: if no policy has that name.
    """
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY)) or "none"
        raise PolicyConfigError(f"unknown policy {name!r}; registered: {known}") from None


def make_policy(name: str, *, capacity_bytes: int, **params: Any) -> CachePolicy:
    """Create a registered policy by name (the factory the controller's config uses).

    Args:
        name: registry name, e.g. ``"kvcast"``.
        capacity_bytes: SRAM budget in bytes.
        **params: policy-specific keyword parameters.

    Returns:
        A new policy instance.

    Raises:
        PolicyConfigError: for an unknown name, unknown parameters or invalid values.
    """
    cls = policy_class(name)
    try:
        inspect.signature(cls).bind(capacity_bytes, **params)
    except TypeError as exc:
        raise PolicyConfigError(f"policy {name!r}: {exc}") from None
    return cls(capacity_bytes, **params)


def available_policies(*, include_offline: bool = True) -> tuple[str, ...]:
    """Names of the registered policies, sorted.

    Args:
        include_offline: include policies that need the future (evaluation bounds).

    Returns:
        The policy names.
    """
    return tuple(sorted(n for n, c in _REGISTRY.items() if include_offline or not c.offline))
