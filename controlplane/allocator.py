"""SRAM slot allocator: contiguous fragment-slot ranges for cached chunks.

A cached chunk occupies ``frag_count`` consecutive fragment slots from ``slot_base`` (one cache
entry names the range), so the switch SRAM is a one-dimensional heap of ``NUM_FRAG_SLOTS`` slots
shared by at most ``CACHE_ENTRIES`` chunks, both taken from the generated constants.

Strategy: **address-ordered first fit** over a sorted list of free ranges, coalescing a freed
range with its free neighbours at once. Chosen over a buddy allocator because chunk sizes are
arbitrary fragment counts (a chunk of 5 fragments would take 8 under buddy rounding): in an SRAM
of a few MiB, the up-to-50 % internal fragmentation of power-of-two blocks costs more than the
external fragmentation first fit leaves, and address-ordered first fit is among the policies
with the least fragmentation in practice (Wilson et al., "Dynamic Storage Allocation: A Survey
and Critical Review", 1995). With at most a few thousand ranges a linear scan is microseconds,
and freeing is a binary search.

Classes:
    SlotRange: a contiguous range of slots (base, count).
    AllocatorStats: a snapshot of usage and fragmentation.
    SlotAllocator: allocate, reserve (adopt a range read back from a switch), free.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from controlplane.errors import (
    ConfigError,
    InvalidFreeError,
    OutOfEntriesError,
    OutOfSlotsError,
    SlotConflictError,
)
from kvcast import p4constants as c


@dataclass(frozen=True, order=True, slots=True)
class SlotRange:
    """Slots ``[base, base + count)``.

    Attributes:
        base: first slot.
        count: number of slots (> 0).
    """

    base: int
    count: int

    @property
    def end(self) -> int:
        """One past the last slot."""
        return self.base + self.count

    def overlaps(self, other: SlotRange) -> bool:
        """Whether the two ranges share a slot."""
        return self.base < other.end and other.base < self.end


@dataclass(frozen=True, slots=True)
class AllocatorStats:
    """Usage of the slot array.

    Attributes:
        capacity: slots in all.
        used: slots allocated.
        free: slots free.
        ranges: allocated ranges (= cache entries in use).
        max_ranges: cache entries in all.
        free_ranges: number of free ranges (1 when unfragmented and not full).
        largest_free: the largest range that can be allocated now.
        fragmentation: ``1 - largest_free / free`` (0 when nothing or one range is free):
            the share of free slots that a single large chunk cannot use.
    """

    capacity: int
    used: int
    free: int
    ranges: int
    max_ranges: int
    free_ranges: int
    largest_free: int
    fragmentation: float


class SlotAllocator:
    """Address-ordered first-fit allocator of contiguous slot ranges.

    Args:
        capacity: number of slots (default: ``NUM_FRAG_SLOTS`` of this target).
        max_ranges: number of ranges that may be allocated at once (default:
            ``CACHE_ENTRIES``, one cache entry per cached chunk).

    Raises:
        ConfigError: a non-positive capacity or max_ranges.
    """

    def __init__(self, capacity: int = c.NUM_FRAG_SLOTS, max_ranges: int = c.CACHE_ENTRIES):
        if capacity <= 0 or max_ranges <= 0:
            raise ConfigError(
                f"capacity ({capacity}) and max_ranges ({max_ranges}) must be positive"
            )
        self._capacity = capacity
        self._max_ranges = max_ranges
        # Free ranges sorted by base, never adjacent (coalesced): parallel lists for bisect.
        self._free_bases: list[int] = [0]
        self._free_counts: list[int] = [capacity]
        self._allocated: dict[int, int] = {}
        self._used = 0

    @property
    def capacity(self) -> int:
        """Number of slots."""
        return self._capacity

    @property
    def max_ranges(self) -> int:
        """Number of ranges that may be allocated at once."""
        return self._max_ranges

    @property
    def used(self) -> int:
        """Slots allocated."""
        return self._used

    @property
    def free(self) -> int:
        """Slots free."""
        return self._capacity - self._used

    def allocated(self) -> list[SlotRange]:
        """The allocated ranges, by base."""
        return [SlotRange(b, n) for b, n in sorted(self._allocated.items())]

    def free_ranges(self) -> list[SlotRange]:
        """The free ranges, by base (coalesced: no two are adjacent)."""
        return [SlotRange(b, n) for b, n in zip(self._free_bases, self._free_counts, strict=True)]

    def largest_free(self) -> int:
        """The size of the largest free range (0 when full)."""
        return max(self._free_counts, default=0)

    def can_allocate(self, count: int) -> bool:
        """Whether :meth:`allocate` of ``count`` slots would succeed now."""
        return (
            count > 0
            and len(self._allocated) < self._max_ranges
            and any(n >= count for n in self._free_counts)
        )

    def stats(self) -> AllocatorStats:
        """A snapshot of usage and fragmentation."""
        free = self.free
        largest = self.largest_free()
        return AllocatorStats(
            capacity=self._capacity,
            used=self._used,
            free=free,
            ranges=len(self._allocated),
            max_ranges=self._max_ranges,
            free_ranges=len(self._free_bases),
            largest_free=largest,
            fragmentation=0.0 if free == 0 else 1.0 - largest / free,
        )

    def allocate(self, count: int) -> SlotRange:
        """Allocates the lowest free range of ``count`` slots.

        Args:
            count: slots wanted (a chunk's fragment count).

        Returns:
            The range.

        Raises:
            ConfigError: count is not positive or exceeds the capacity.
            OutOfEntriesError: ``max_ranges`` ranges are allocated already.
            OutOfSlotsError: no free range is large enough.
        """
        self._check_count(count)
        self._check_entries()
        for i, n in enumerate(self._free_counts):
            if n >= count:
                base = self._free_bases[i]
                if n == count:
                    del self._free_bases[i]
                    del self._free_counts[i]
                else:
                    self._free_bases[i] = base + count
                    self._free_counts[i] = n - count
                return self._take(base, count)
        raise OutOfSlotsError(
            f"no free range of {count} slots: {self.free} of {self._capacity} slots are free, "
            f"the largest free range has {self.largest_free()} "
            f"(fragmentation {self.stats().fragmentation:.0%}); evict chunks first"
        )

    def reserve(self, base: int, count: int) -> SlotRange:
        """Allocates exactly ``[base, base + count)``, e.g. a range read back from a switch.

        Args:
            base: first slot.
            count: number of slots.

        Returns:
            The range.

        Raises:
            ConfigError: count is not positive.
            OutOfEntriesError: ``max_ranges`` ranges are allocated already.
            SlotConflictError: the range is outside the slots or not entirely free.
        """
        self._check_count(count)
        if base < 0 or base + count > self._capacity:
            raise SlotConflictError(
                f"range [{base}, {base + count}) is outside the {self._capacity} slots"
            )
        self._check_entries()
        i = bisect.bisect_right(self._free_bases, base) - 1
        if i < 0 or self._free_bases[i] + self._free_counts[i] < base + count:
            raise SlotConflictError(
                f"range [{base}, {base + count}) overlaps an allocated range "
                f"({self._owner_hint(SlotRange(base, count))})"
            )
        fbase, fcount = self._free_bases[i], self._free_counts[i]
        # Split the free range around the reservation: [fbase, base) and [base+count, fend).
        pieces = [(fbase, base - fbase), (base + count, fbase + fcount - base - count)]
        keep = [(b, n) for b, n in pieces if n > 0]
        self._free_bases[i : i + 1] = [b for b, _ in keep]
        self._free_counts[i : i + 1] = [n for _, n in keep]
        return self._take(base, count)

    def free_range(self, slots: SlotRange) -> None:
        """Returns a range to the free list, merging it with free neighbours.

        Args:
            slots: a range exactly as :meth:`allocate` or :meth:`reserve` returned it.

        Raises:
            InvalidFreeError: the range is not allocated with this base and count.
        """
        if self._allocated.get(slots.base) != slots.count:
            raise InvalidFreeError(
                f"range [{slots.base}, {slots.end}) is not allocated "
                f"({self._owner_hint(slots)}): freed twice, or with the wrong size"
            )
        del self._allocated[slots.base]
        self._used -= slots.count
        i = bisect.bisect_left(self._free_bases, slots.base)
        base, count = slots.base, slots.count
        # Merge with the free range after it, then with the one before it.
        if i < len(self._free_bases) and self._free_bases[i] == slots.end:
            count += self._free_counts[i]
            del self._free_bases[i]
            del self._free_counts[i]
        if i > 0 and self._free_bases[i - 1] + self._free_counts[i - 1] == base:
            self._free_counts[i - 1] += count
        else:
            self._free_bases.insert(i, base)
            self._free_counts.insert(i, count)

    def clear(self) -> None:
        """Frees everything (the switch lost its SRAM, e.g. after a restart)."""
        self._free_bases = [0]
        self._free_counts = [self._capacity]
        self._allocated.clear()
        self._used = 0

    # ------------------------------------------------------------------ internals
    def _take(self, base: int, count: int) -> SlotRange:
        self._allocated[base] = count
        self._used += count
        return SlotRange(base, count)

    def _check_count(self, count: int) -> None:
        if not 0 < count <= self._capacity:
            raise ConfigError(f"slot count {count} outside 1..{self._capacity}")

    def _check_entries(self) -> None:
        if len(self._allocated) >= self._max_ranges:
            raise OutOfEntriesError(
                f"all {self._max_ranges} cache entries are in use; evict a chunk first"
            )

    def _owner_hint(self, slots: SlotRange) -> str:
        hits = [
            f"[{b}, {b + n})"
            for b, n in sorted(self._allocated.items())
            if SlotRange(b, n).overlaps(slots)
        ]
        return "overlapping allocated: " + ", ".join(hits) if hits else "none allocated there"
