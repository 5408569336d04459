"""Random and malformed packets into the reference pipeline: no crash, every drop counted, no
cache state changed.

Packets come from host and pool ports only (the CPU port is the control plane's, and a WRITE
from it is supposed to change state). Each packet must end in exactly one accounted outcome: at
least one frame out, or one drop counted (by the program or the reference target's edge guard),
or one KVP event counted (a multicast to a group with no member emits nothing, as on BMv2, but is
counted as an event).
"""

from __future__ import annotations

import random
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuzz.mutators import mutate_frame
from fuzz.targets import frame_seeds
from kvcast import p4constants as c
from kvcast import wire
from tests.conformance.harness import InProcessRefTarget
from tests.conformance.vectors import (
    CHUNK_KEY,
    EG_DROPS,
    HOSTS,
    IG_DROPS,
    IG_EVENTS,
    POOL_PORT,
    STALE_KEY,
    TENANT,
    VIP,
    host_frame,
    pool_frame,
)

PORTS = [*HOSTS, POOL_PORT]
N_RANDOM = 12_000


def _totals(t: InProcessRefTarget) -> tuple[int, int]:
    drops = sum(t.state.counter_value(IG_DROPS, i)[0] for i in range(c.DROP_REASON_COUNT))
    drops += sum(t.state.counter_value(EG_DROPS, i)[0] for i in range(c.DROP_REASON_COUNT))
    events = sum(t.state.counter_value(IG_EVENTS, i)[0] for i in range(c.EV_COUNT))
    return drops, events


def _check_one(t: InProcessRefTarget, port: int, frame: bytes, outcomes: Counter[str]) -> None:
    drops0, events0 = _totals(t)
    outputs = t.pipeline.process(port, frame)
    drops1, events1 = _totals(t)
    if outputs:
        outcomes["forwarded"] += 1
        # A frame out of a drop is impossible: forwarding and dropping exclude each other,
        # except that one multicast replica may be dropped in egress while others go out.
        assert drops1 - drops0 <= len(outputs) + 1
    else:
        assert (drops1 - drops0, events1 - events0) in {(1, 0), (0, 1)}, (
            f"packet from port {port} vanished without a counted drop: {frame.hex()}"
        )
        outcomes["dropped" if drops1 > drops0 else "empty_group"] += 1


def test_random_and_malformed_packets_are_all_accounted_and_change_no_cache_state(
    target: InProcessRefTarget,
) -> None:
    rng = random.Random(20261122)
    seeds = frame_seeds(rng)
    regs_before = target.pipeline.regs.snapshot()
    entries_before = target.client.table_entries(c.TABLE_INGRESS_CACHE_CACHE_TABLE)
    outcomes: Counter[str] = Counter()
    for _ in range(N_RANDOM):
        _check_one(target, rng.choice(PORTS), mutate_frame(rng, seeds), outcomes)
    assert target.pipeline.regs.snapshot() == regs_before
    assert target.client.table_entries(c.TABLE_INGRESS_CACHE_CACHE_TABLE) == entries_before
    assert sum(outcomes.values()) == N_RANDOM
    assert outcomes["dropped"] > N_RANDOM // 2  # most mutants are malformed, and counted so


@settings(
    max_examples=1500,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    port=st.sampled_from(PORTS),
    op=st.integers(0, 15),
    version=st.sampled_from([1, 1, 1, 0, 2, 15]),
    flags=st.integers(0, 255),
    group=st.sampled_from([0, 7, 8, 9, 65535]),
    key=st.sampled_from([CHUNK_KEY, STALE_KEY, 0, 2**64 - 1]),
    frag_idx=st.integers(0, 65535),
    payload_len=st.integers(0, 65535),
    index=st.integers(0, 2**32 - 1),
    body=st.binary(max_size=2 * c.FRAG_BYTES),
)
def test_structured_kvp_fuzz_never_changes_cache_state(
    target: InProcessRefTarget,
    port: int,
    op: int,
    version: int,
    flags: int,
    group: int,
    key: int,
    frag_idx: int,
    payload_len: int,
    index: int,
    body: bytes,
) -> None:
    hdr = wire.KvpHeader(
        op,
        flags=flags,
        tenant=TENANT,
        group=group,
        key=key,
        frag_idx=frag_idx,
        payload_len=payload_len,
        index=index,
        version=version,
    )
    frame = (
        host_frame(port, VIP, hdr.pack() + body)
        if port != POOL_PORT
        else pool_frame(1, hdr.pack() + body)
    )
    before = target.pipeline.regs.snapshot()
    _check_one(target, port, frame, Counter())
    assert target.pipeline.regs.snapshot() == before
