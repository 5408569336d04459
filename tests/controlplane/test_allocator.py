"""SlotAllocator: first fit, coalescing, reservations, and random alloc/free sequences."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    precondition,
    rule,
)

from controlplane.allocator import SlotAllocator, SlotRange
from controlplane.errors import (
    ConfigError,
    InvalidFreeError,
    OutOfEntriesError,
    OutOfSlotsError,
    SlotConflictError,
)
from kvcast import p4constants as c


def test_default_capacity_comes_from_the_generated_sizes() -> None:
    alloc = SlotAllocator()
    assert alloc.capacity == c.NUM_FRAG_SLOTS
    assert alloc.max_ranges == c.CACHE_ENTRIES
    assert alloc.free_ranges() == [SlotRange(0, c.NUM_FRAG_SLOTS)]


def test_first_fit_takes_the_lowest_range_that_fits() -> None:
    alloc = SlotAllocator(100, 10)
    a = alloc.allocate(10)
    b = alloc.allocate(20)
    d = alloc.allocate(5)
    assert (a, b, d) == (SlotRange(0, 10), SlotRange(10, 20), SlotRange(30, 5))
    alloc.free_range(a)
    # 15 does not fit in the 10-slot hole at 0: first fit goes past it.
    assert alloc.allocate(15) == SlotRange(35, 15)
    assert alloc.allocate(4) == SlotRange(0, 4)


def test_freeing_coalesces_with_both_neighbours() -> None:
    alloc = SlotAllocator(30, 10)
    a, b, d = alloc.allocate(10), alloc.allocate(10), alloc.allocate(10)
    alloc.free_range(a)
    alloc.free_range(d)
    assert alloc.free_ranges() == [SlotRange(0, 10), SlotRange(20, 10)]
    alloc.free_range(b)
    assert alloc.free_ranges() == [SlotRange(0, 30)]
    assert alloc.allocate(30) == SlotRange(0, 30)


def test_fragmentation_is_the_share_of_free_slots_outside_the_largest_range() -> None:
    alloc = SlotAllocator(40, 10)
    ranges = [alloc.allocate(10) for _ in range(4)]
    alloc.free_range(ranges[0])
    alloc.free_range(ranges[2])
    stats = alloc.stats()
    assert (stats.free, stats.largest_free, stats.free_ranges) == (20, 10, 2)
    assert stats.fragmentation == pytest.approx(0.5)
    with pytest.raises(OutOfSlotsError, match="largest free range has 10"):
        alloc.allocate(11)


def test_out_of_entries_when_every_cache_entry_is_used() -> None:
    alloc = SlotAllocator(100, 2)
    alloc.allocate(1)
    alloc.allocate(1)
    with pytest.raises(OutOfEntriesError):
        alloc.allocate(1)


def test_reserve_adopts_an_exact_range_and_refuses_overlaps() -> None:
    alloc = SlotAllocator(100, 10)
    assert alloc.reserve(40, 10) == SlotRange(40, 10)
    assert alloc.free_ranges() == [SlotRange(0, 40), SlotRange(50, 50)]
    with pytest.raises(SlotConflictError, match=r"\[40, 50\)"):
        alloc.reserve(45, 10)
    with pytest.raises(SlotConflictError, match="outside"):
        alloc.reserve(95, 10)
    assert alloc.allocate(40) == SlotRange(0, 40)


def test_double_free_and_wrong_size_are_refused() -> None:
    alloc = SlotAllocator(10, 10)
    r = alloc.allocate(4)
    with pytest.raises(InvalidFreeError):
        alloc.free_range(SlotRange(0, 3))
    alloc.free_range(r)
    with pytest.raises(InvalidFreeError):
        alloc.free_range(r)


@pytest.mark.parametrize("count", [0, -1, 11])
def test_bad_counts_are_config_errors(count: int) -> None:
    with pytest.raises(ConfigError):
        SlotAllocator(10, 10).allocate(count)


class AllocatorMachine(RuleBasedStateMachine):
    """Random allocate / reserve / free sequences against a model of which slots are taken."""

    CAPACITY = 64
    MAX_RANGES = 12

    ranges = Bundle("ranges")

    def __init__(self) -> None:
        super().__init__()
        self.alloc = SlotAllocator(self.CAPACITY, self.MAX_RANGES)
        self.owner: list[SlotRange | None] = [None] * self.CAPACITY

    def _fits_somewhere(self, count: int) -> bool:
        run = 0
        for slot in self.owner:
            run = run + 1 if slot is None else 0
            if run >= count:
                return True
        return False

    @rule(target=ranges, count=st.integers(1, 20))
    def allocate(self, count: int) -> SlotRange | None:
        entries_left = len(self.alloc.allocated()) < self.MAX_RANGES
        if entries_left and self._fits_somewhere(count):
            got = self.alloc.allocate(count)
            assert got.count == count
            assert all(self.owner[s] is None for s in range(got.base, got.end))
            # First fit: no lower free run of this size exists.
            assert not any(
                all(self.owner[s] is None for s in range(b, b + count)) for b in range(got.base)
            )
            for s in range(got.base, got.end):
                self.owner[s] = got
            return got
        error = OutOfSlotsError if entries_left else OutOfEntriesError
        with pytest.raises(error):
            self.alloc.allocate(count)
        return None

    @rule(target=ranges, base=st.integers(0, CAPACITY - 1), count=st.integers(1, 10))
    def reserve(self, base: int, count: int) -> SlotRange | None:
        entries_left = len(self.alloc.allocated()) < self.MAX_RANGES
        inside = base + count <= self.CAPACITY
        free = inside and all(self.owner[s] is None for s in range(base, base + count))
        if free and entries_left:
            got = self.alloc.reserve(base, count)
            for s in range(base, base + count):
                self.owner[s] = got
            return got
        with pytest.raises((SlotConflictError, OutOfEntriesError)):
            self.alloc.reserve(base, count)
        return None

    @precondition(lambda self: any(self.owner))
    @rule(r=consumes(ranges))
    def free(self, r: SlotRange | None) -> None:
        if r is None or self.owner[r.base] is not r:
            return
        self.alloc.free_range(r)
        for s in range(r.base, r.end):
            self.owner[s] = None

    @invariant()
    def never_overlapping_and_within_capacity(self) -> None:
        allocated = self.alloc.allocated()
        for a, b in zip(allocated, allocated[1:], strict=False):
            assert a.end <= b.base
        assert all(r.base >= 0 and r.end <= self.CAPACITY for r in allocated)
        assert len(allocated) <= self.MAX_RANGES

    @invariant()
    def accounting_matches_the_model(self) -> None:
        used = sum(s is not None for s in self.owner)
        assert self.alloc.used == used
        assert self.alloc.free == self.CAPACITY - used
        assert sum(r.count for r in self.alloc.allocated()) == used

    @invariant()
    def free_ranges_are_coalesced_and_exactly_the_free_slots(self) -> None:
        free = self.alloc.free_ranges()
        for a, b in zip(free, free[1:], strict=False):
            assert a.end < b.base  # never adjacent: coalesced
        slots = {s for r in free for s in range(r.base, r.end)}
        assert slots == {i for i, o in enumerate(self.owner) if o is None}


AllocatorMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestAllocatorMachine = AllocatorMachine.TestCase
