"""The pipeline's unicast GET-hit fast path gives exactly what the general path gives.

Every packet goes through the same programmed switch twice, once with the fast path on and once
with it off: the frames out and the change of every counter (ingress and egress drops, KVP
events, the cache entries' direct counters) must be identical. Packets: valid GET hits for every
fragment of the loaded chunk from every host, and the fuzz test's seeds and mutants (misses,
stale epochs, groups, NOCACHE, other ops, bit flips, truncations, lying lengths), which the fast
path must hand to the general path untouched. The test also checks that the fast path did serve
the valid hits, so that it cannot pass by never running.
"""

from __future__ import annotations

import array
import random
from typing import Any

import pytest

from fuzz.mutators import mutate_frame
from fuzz.targets import frame_seeds
from kvcast import p4constants as c
from kvcast import wire
from refswitch.pipeline import Output
from tests.conformance.harness import InProcessRefTarget
from tests.conformance.vectors import (
    CHUNK_FRAGS,
    CHUNK_KEY,
    EG_DROPS,
    HOSTS,
    IG_DROPS,
    IG_EVENTS,
    POOL_PORT,
    TENANT,
    VIP,
    host_frame,
)

PORTS = [*HOSTS, POOL_PORT]
T_CACHE = c.TABLE_INGRESS_CACHE_CACHE_TABLE


def _counters(t: InProcessRefTarget) -> list[Any]:
    state = t.state
    return [
        state.counter_values(IG_DROPS),
        state.counter_values(EG_DROPS),
        state.counter_values(IG_EVENTS),
        sorted((repr(e.match), e.counter) for e in state.entries(T_CACHE)),
    ]


def _delta(before: list[Any], after: list[Any]) -> list[list[tuple[int, int, int]]]:
    """Per counter: (cell, packets added, bytes added) of every cell that changed."""
    out = []
    for b_cells, a_cells in zip(before, after, strict=True):
        changes = []
        for i, (b, a) in enumerate(zip(b_cells, a_cells, strict=True)):
            b_val, a_val = (b[1], a[1]) if isinstance(b[0], str) else (b, a)
            if a_val != b_val:
                changes.append((i, a_val[0] - b_val[0], a_val[1] - b_val[1]))
        out.append(changes)
    return out


def _run(
    t: InProcessRefTarget, fast: bool, port: int, frame: bytes
) -> tuple[list[Output], list[list[tuple[int, int, int]]]]:
    t.pipeline.fast_path = fast
    before = _counters(t)
    outputs = t.pipeline.process(port, frame)
    return outputs, _delta(before, _counters(t))


def _same(t: InProcessRefTarget, port: int, frame: bytes) -> list[Output]:
    # A miss bumps the hot-miss sketch: both runs start from the same sketch state.
    rows = [*t.pipeline.regs.cms_rows, t.pipeline.regs.reported]
    sketch_before = [array.array(row.typecode, row) for row in rows]
    fast_out, fast_delta = _run(t, True, port, frame)
    sketch_fast = [row.tobytes() for row in rows]
    for row, saved in zip(rows, sketch_before, strict=True):
        row[:] = saved
    slow_out, slow_delta = _run(t, False, port, frame)
    assert fast_out == slow_out, f"outputs differ for {frame.hex()} from port {port}"
    assert fast_delta == slow_delta, f"counters differ for {frame.hex()} from port {port}"
    assert sketch_fast == [row.tobytes() for row in rows], "the sketch differs"
    return fast_out


def _spy(
    target: InProcessRefTarget, monkeypatch: pytest.MonkeyPatch, name: str = "_unicast_get_hit"
) -> list[int]:
    """Records the port of every packet fast path ``name`` serves."""
    served: list[int] = []
    original = getattr(target.pipeline, name)

    def spy(port: int, frame: bytes) -> list[Output] | None:
        out: list[Output] | None = original(port, frame)
        if out is not None:
            served.append(port)
        return out

    monkeypatch.setattr(target.pipeline, name, spy)
    return served


def _routed(rng: random.Random) -> bytes:
    """IPv4 that is not KVP, of the kinds the routed fast path takes or must refuse."""
    dst = rng.choice([ip for _, ip, _ in HOSTS.values()] + ["10.0.1.1", "192.0.2.9"])
    frame = bytearray(
        host_frame(rng.choice(list(HOSTS)), dst, rng.randbytes(rng.randrange(0, 300)),
                   dport=rng.choice([5000, 53, c.KVP_UDP_PORT]), ttl=rng.choice([64, 2, 1]))
    )  # fmt: skip
    kind = rng.randrange(5)
    if kind == 1:  # another protocol: the parser stops at IPv4
        frame[23] = 6
    elif kind == 2:  # a later fragment: no UDP header to read
        frame[20:22] = (0x2000 | rng.randrange(1, 0x1FFF)).to_bytes(2, "big")
    elif kind == 3:  # the source port is KVP's
        frame[34:36] = c.KVP_UDP_PORT.to_bytes(2, "big")
    if kind in (1, 2, 3):
        frame[24:26] = b"\0\0"
        frame[24:26] = wire.ipv4_checksum(bytes(frame[14:34])).to_bytes(2, "big")
    if kind == 4:  # cut inside the UDP header
        return bytes(frame[: rng.randrange(34, 42)])
    return bytes(frame)


def test_valid_unicast_hits_take_the_fast_path_and_match_the_general_one(
    target: InProcessRefTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    served = _spy(target, monkeypatch)
    frames = [
        (host, host_frame(host, VIP, wire.get_message(TENANT, CHUNK_KEY, i, req_id=100 + i)))
        for host in HOSTS
        for i in range(len(CHUNK_FRAGS))
    ]
    for port, frame in frames:
        (out,) = _same(target, port, frame)
        hdr = wire.KvpHeader.unpack(out.frame, wire.FRAME_KVP_OFFSET)
        assert hdr.op == c.KVP_OP_DATA and hdr.flags & c.KVP_FLAG_HIT
    assert len(served) == len(frames)  # the fast path served every one of them


def test_everything_else_falls_back_and_matches_the_general_path(
    target: InProcessRefTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    served = _spy(target, monkeypatch)
    routed = _spy(target, monkeypatch, "_routed_ipv4")
    rng = random.Random(7)
    seeds = frame_seeds(rng)
    regs_before = target.pipeline.regs.snapshot()
    hits = [
        host_frame(h, VIP, wire.get_message(TENANT, CHUNK_KEY, i, req_id=i, flags=f))
        for h in HOSTS
        for i in range(len(CHUNK_FRAGS) + 1)  # one past the end: BAD_FRAGMENT
        for f in (0, c.KVP_FLAG_HIT | c.KVP_FLAG_POOL, c.KVP_FLAG_REPLICA)
    ]
    seeds += hits
    for _ in range(4000):
        roll = rng.random()
        if roll < 0.5:
            frame = mutate_frame(rng, seeds)
        elif roll < 0.65:
            frame = rng.choice(hits)
        elif roll < 0.8:
            frame = _routed(rng)
        else:
            frame = rng.choice(seeds)
        _same(target, rng.choice(PORTS), frame)
    assert target.pipeline.regs.snapshot() == regs_before
    # Some seeds are valid hits, and bit flips in a hit's placeholder keep it one.
    assert 50 < len(served) < 4000
    assert 50 < len(routed) < 4000
