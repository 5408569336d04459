"""Mutation operators over real packets (frames for switches, UDP payloads for hosts).

Functions:
    mutate_frame: one mutant of an Ethernet frame carrying KVP (or random bytes).
    mutate_payload: one mutant of a KVP UDP payload.
"""

from __future__ import annotations

import random

from kvcast import p4constants as c
from kvcast import wire

_KVP = wire.FRAME_KVP_OFFSET


def mutate_frame(rng: random.Random, seeds: list[bytes]) -> bytes:
    """A mutant of one of ``seeds`` (whole frames), or random bytes."""
    kind = rng.randrange(6)
    if kind == 0:
        return rng.randbytes(rng.randrange(0, 400))
    frame = bytearray(rng.choice(seeds))
    if kind == 1:  # truncated anywhere
        return bytes(frame[: rng.randrange(len(frame) + 1)])
    if kind == 2:  # bit flips
        for _ in range(rng.randrange(1, 8)):
            pos = rng.randrange(len(frame))
            frame[pos] ^= 1 << rng.randrange(8)
        return bytes(frame)
    if kind == 3:  # a random KVP header, mostly with a valid version
        frame[_KVP : _KVP + c.KVP_HDR_BYTES] = rng.randbytes(c.KVP_HDR_BYTES)
        if rng.random() < 0.7:
            frame[_KVP] = (c.KVP_VERSION << 4) | rng.randrange(16)
        return bytes(frame)
    if kind == 4:  # trailing garbage
        return bytes(frame) + rng.randbytes(rng.randrange(1, 300))
    frame[38:40] = rng.getrandbits(16).to_bytes(2, "big")  # lengths that lie
    if rng.random() < 0.5:
        frame[16:18] = rng.getrandbits(16).to_bytes(2, "big")
    return bytes(frame)


def mutate_payload(rng: random.Random, seeds: list[bytes]) -> bytes:
    """A mutant of one of ``seeds`` (KVP UDP payloads), or random bytes."""
    kind = rng.randrange(7)
    if kind == 0:
        return rng.randbytes(rng.randrange(0, 2 * c.KVP_HDR_BYTES + c.FRAG_BYTES))
    msg = bytearray(rng.choice(seeds))
    if kind == 1:
        return bytes(msg[: rng.randrange(len(msg) + 1)])
    if kind == 2:
        for _ in range(rng.randrange(1, 8)):
            pos = rng.randrange(len(msg))
            msg[pos] ^= 1 << rng.randrange(8)
        return bytes(msg)
    if kind == 3:  # one header field replaced by random bits
        field = rng.choice([(0, 1), (1, 1), (2, 1), (6, 2), (16, 4), (20, 4), (24, 2), (26, 2),
                            (28, 2), (36, 4)])  # fmt: skip
        off, size = field
        msg[off : off + size] = rng.randbytes(size)
        return bytes(msg)
    if kind == 4:
        return bytes(msg) + rng.randbytes(rng.randrange(1, 300))
    if kind == 5:  # a random header on a real payload
        msg[: c.KVP_HDR_BYTES] = rng.randbytes(c.KVP_HDR_BYTES)
        msg[0] = (c.KVP_VERSION << 4) | rng.randrange(16)
        return bytes(msg)
    return bytes(msg)  # a replay, unchanged
