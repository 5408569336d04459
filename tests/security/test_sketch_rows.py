"""The hot-miss sketch's rows are independent, and a key past the threshold is still reported."""

from __future__ import annotations

import queue
import random
import struct
import zlib
from collections import Counter
from collections.abc import Callable, Iterator

import pytest

from kvcast import p4constants as c
from kvcast import wire
from refswitch.pipeline import sketch_indices
from tests.conformance.harness import InProcessRefTarget
from tests.conformance.vectors import (
    HOSTS,
    HOT_TENANT,
    HOT_THRESHOLD,
    REPORT_ATTACKER_KEY,
    REPORT_ATTACKER_TENANT,
    REPORT_VICTIM_KEY,
    ROW0_TWIN_KEYS,
    SWITCH_MAC,
    VIP,
    program_switch,
)

IG_EVENTS = c.COUNTER_INGRESS_STATS_KVP_EVENT_COUNTER


def _conditional_collision_rate(
    index: Callable[[int, int], tuple[int, ...]], keys: list[int], tenant: int = 1
) -> float:
    """P(two keys share row 1's cell | they share row 0's cell), over all pairs of ``keys``."""
    rows = [index(tenant, k) for k in keys]
    row0 = Counter(r[0] for r in rows)
    both = Counter((r[0], r[1]) for r in rows)
    pairs0 = sum(n * (n - 1) // 2 for n in row0.values())
    pairs01 = sum(n * (n - 1) // 2 for n in both.values())
    return pairs01 / pairs0


def _salted_crc32_rows(tenant: int, key: int) -> tuple[int, ...]:
    """The previous design: one CRC-32 over {tenant, key, row} for every row."""
    return tuple(
        zlib.crc32(struct.pack("!HQB", tenant, key, row)) % c.CMS_WIDTH for row in range(3)
    )


def test_rows_collide_independently_on_random_keys() -> None:
    rng = random.Random(12)
    keys = [rng.getrandbits(64) for _ in range(60_000)]
    rate = _conditional_collision_rate(sketch_indices, keys)
    # Independent rows: about 1/CMS_WIDTH (~440 row-0 pairs, ~0.1 expected in both rows).
    assert rate < 4 / c.CMS_WIDTH
    # Rows 0 and 2 (and the report row) too.
    swapped = _conditional_collision_rate(lambda t, k: sketch_indices(t, k)[::2], keys)
    assert swapped < 4 / c.CMS_WIDTH


def test_the_salted_crc_design_this_replaced_collides_in_every_row() -> None:
    rng = random.Random(12)
    keys = [rng.getrandbits(64) for _ in range(20_000)]
    # CRC is affine: a salt byte XORs a constant into every output, so collisions carry over.
    assert _conditional_collision_rate(_salted_crc32_rows, keys) == 1.0


def test_the_twin_keys_of_the_conformance_vector_share_row_0_only() -> None:
    first, twin = (sketch_indices(HOT_TENANT, k) for k in ROW0_TWIN_KEYS)
    assert first[0] == twin[0]
    assert all(a != b for a, b in zip(first[1:], twin[1:], strict=True))


def test_the_report_row_vectors_keys_share_the_report_cell_only() -> None:
    victim = sketch_indices(HOT_TENANT, REPORT_VICTIM_KEY)
    attacker = sketch_indices(REPORT_ATTACKER_TENANT, REPORT_ATTACKER_KEY)
    assert victim[3] == attacker[3]
    assert all(a != b for a, b in zip(victim[:3], attacker[:3], strict=True))


@pytest.fixture
def target() -> Iterator[InProcessRefTarget]:
    t = InProcessRefTarget()
    try:
        program_switch(t.client)  # routes, the pool owner, sketch window 1 and its threshold
        yield t
    finally:
        t.close()


def _miss(target: InProcessRefTarget, key: int) -> None:
    mac, ip, port = HOSTS[3]
    get = wire.get_message(HOT_TENANT, key, 0, 1)
    target.send(3, wire.udp_frame(mac, SWITCH_MAC, ip, VIP, port, c.KVP_UDP_PORT, get))


def _hot_reports(target: InProcessRefTarget) -> int:
    return int(target.state.counter_values(IG_EVENTS)[c.EV_HOT_DIGEST][0])


def test_a_key_whose_cells_another_key_filled_is_still_reported(target: InProcessRefTarget) -> None:
    victim = 0xD00D
    regs = target.pipeline.regs
    # An attacker's keys already pushed every cell the victim hashes to far past the threshold
    # in the current window (1).
    for row, index in zip(regs.cms_rows, sketch_indices(HOT_TENANT, victim)[:3], strict=True):
        row[index] = (1 << 16) | (HOT_THRESHOLD + 50)
    _miss(target, victim)
    assert _hot_reports(target) == 1
    # ... once per window.
    _miss(target, victim)
    assert _hot_reports(target) == 1


# ---------------------------------------------------------------------- the report row
ATTACKER_TENANT = 9  # host 1's port may ask for any tenant: it plays a tenant of its own


def _report_twin(victim_tenant: int, victim: int, tenant: int) -> int:
    """A key of ``tenant`` sharing only the report cell with ``victim`` (found by search)."""
    want = sketch_indices(victim_tenant, victim)
    rng = random.Random(27)
    while True:
        key = rng.getrandbits(64)
        got = sketch_indices(tenant, key)
        if got[3] == want[3] and all(a != b for a, b in zip(got[:3], want[:3], strict=True)):
            return key


def _miss_as(target: InProcessRefTarget, host: int, tenant: int, key: int, req_id: int) -> None:
    mac, ip, port = HOSTS[host]
    get = wire.get_message(tenant, key, 0, req_id)
    target.send(host, wire.udp_frame(mac, SWITCH_MAC, ip, VIP, port, c.KVP_UDP_PORT, get))


def _digests(target: InProcessRefTarget) -> list[tuple[int, ...]]:
    rows: list[tuple[int, ...]] = []
    while True:
        try:
            _name, data = target.client.digests.get(timeout=0.2)
        except queue.Empty:
            return rows
        rows += [tuple(r) for r in data]


def test_another_tenants_key_on_the_victims_report_cell_does_not_hide_the_victim(
    target: InProcessRefTarget,
) -> None:
    victim = 0xD00D
    attacker = _report_twin(HOT_TENANT, victim, ATTACKER_TENANT)
    # The attacker makes its own key hot first: it is reported and marks the shared cell.
    for n in range(HOT_THRESHOLD):
        _miss_as(target, 1, ATTACKER_TENANT, attacker, req_id=100 + n)
    assert _digests(target) == [(ATTACKER_TENANT, attacker, HOT_THRESHOLD)]
    # The victim's key then reaches the threshold in the same window: it is reported all the
    # same, once.
    for n in range(HOT_THRESHOLD + 2):
        _miss_as(target, 3, HOT_TENANT, victim, req_id=200 + n)
    assert _digests(target) == [(HOT_TENANT, victim, HOT_THRESHOLD)]
    assert _hot_reports(target) == 2


def test_one_tenants_keys_on_one_report_cell_are_still_reported_once_per_window(
    target: InProcessRefTarget,
) -> None:
    victim = 0xD00D
    attacker = _report_twin(HOT_TENANT, victim, ATTACKER_TENANT)
    for n in range(HOT_THRESHOLD):
        _miss_as(target, 3, HOT_TENANT, victim, req_id=300 + n)
    for n in range(HOT_THRESHOLD):
        _miss_as(target, 1, ATTACKER_TENANT, attacker, req_id=400 + n)
    # Back and forth on the shared cell: each is reported again after the other re-marked it,
    # never more than once per miss of a key already past the threshold.
    _miss_as(target, 3, HOT_TENANT, victim, req_id=500)
    _miss_as(target, 3, HOT_TENANT, victim, req_id=501)
    assert _digests(target) == [
        (HOT_TENANT, victim, HOT_THRESHOLD),
        (ATTACKER_TENANT, attacker, HOT_THRESHOLD),
        (HOT_TENANT, victim, HOT_THRESHOLD + 1),
    ]
