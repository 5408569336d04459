"""Link impairments inside the reference target's port output (for fault campaigns).

This machine's kernel has no netem, so faults are injected where the reference target sends a
frame to a data port: each frame is independently lost, corrupted (one bit flipped in its UDP
payload, so the headers still deliver it and the receiver's check must catch it), duplicated, or
held back and sent after the next frame on the same port (reordering); and every frame may be
delayed by a random time (jitter), which reorders frames whose delays cross, as netem's jitter
does. Frames to the CPU port (PacketIn) are never touched. A seeded generator makes a run
repeatable.

Classes:
    ImpairSpec: the probabilities and the jitter, parsed from
        ``loss=0.01,dup=0.01,corrupt=0.001,reorder=0.05,jitter=0.005``.
    Impairment: applies a spec to one frame at a time and counts what it did.
"""

from __future__ import annotations

import heapq
import itertools
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, fields

__all__ = ["ImpairSpec", "Impairment"]

# Ethernet + IPv4 (no options) + UDP: corruption flips a bit after these.
_PAYLOAD_AT = 14 + 20 + 8


@dataclass(frozen=True)
class ImpairSpec:
    """Per-frame probabilities of each impairment (0 = off).

    Attributes:
        loss: the frame is not sent.
        dup: the frame is sent twice.
        corrupt: one bit of the UDP payload is flipped.
        reorder: the frame is held and sent after the next frame to the same port.
        jitter: seconds; each frame is delayed by a time drawn uniformly from 0..jitter
            (at most 1 s).
        seed: the random generator's seed.
    """

    loss: float = 0.0
    dup: float = 0.0
    corrupt: float = 0.0
    reorder: float = 0.0
    jitter: float = 0.0
    seed: int = 1

    @classmethod
    def parse(cls, text: str) -> ImpairSpec:
        """``"loss=0.01,reorder=0.05,seed=3"``; an empty string is no impairment.

        Raises:
            ValueError: an unknown name, a value that is not a number, or a probability
                (or a jitter in seconds) outside 0..1.
        """
        names = {f.name for f in fields(cls)}
        values: dict[str, float | int] = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            name, sep, raw = item.partition("=")
            if not sep or name not in names:
                raise ValueError(f"impairment {item!r}: expected one of {sorted(names)} =VALUE")
            if name == "seed":
                values[name] = int(raw)
                continue
            p = float(raw)
            if not 0.0 <= p <= 1.0:
                what = "a jitter is 0..1 s" if name == "jitter" else "a probability is in 0..1"
                raise ValueError(f"impairment {name}={raw}: {what}")
            values[name] = p
        return cls(**values)  # type: ignore[arg-type]

    def __str__(self) -> str:
        parts = [f"{f.name}={getattr(self, f.name):g}" for f in fields(self) if f.name != "seed"]
        return ",".join(p for p in parts if not p.endswith("=0")) or "none"


class Impairment:
    """Applies an :class:`ImpairSpec` to frames about to be sent.

    Args:
        spec: the probabilities.
        clock: monotonic seconds (for the jitter's timer queue).

    Attributes:
        counts: frames seen, lost, duplicated, corrupted, reordered, delayed (by jitter).
    """

    def __init__(self, spec: ImpairSpec, clock: Callable[[], float] = time.monotonic) -> None:
        self.spec = spec
        self._rng = random.Random(spec.seed)
        self._clock = clock
        self._held: dict[int, bytes] = {}
        self._delayed: list[tuple[float, int, int, bytes]] = []  # (due, seq, port, frame)
        self._seq = itertools.count()
        self.counts = {
            "frames": 0,
            "lost": 0,
            "duplicated": 0,
            "corrupted": 0,
            "reordered": 0,
            "delayed": 0,
        }

    def next_due(self) -> float | None:
        """Seconds until the next delayed frame is due (0 if one is), or None if none waits."""
        if not self._delayed:
            return None
        return max(0.0, self._delayed[0][0] - self._clock())

    def release_due(self, emit: Callable[[int, bytes], None]) -> None:
        """Sends every delayed frame whose time has come, earliest first."""
        now = self._clock()
        while self._delayed and self._delayed[0][0] <= now:
            _, _, port, frame = heapq.heappop(self._delayed)
            emit(port, frame)

    def _out(self, port: int, frame: bytes, emit: Callable[[int, bytes], None]) -> None:
        if not self.spec.jitter:
            emit(port, frame)
            return
        due = self._clock() + self._rng.uniform(0.0, self.spec.jitter)
        heapq.heappush(self._delayed, (due, next(self._seq), port, frame))
        self.counts["delayed"] += 1

    def send(self, port: int, frame: bytes, emit: Callable[[int, bytes], None]) -> None:
        """Sends ``frame`` to ``port`` through ``emit``, impaired."""
        spec, rng, counts = self.spec, self._rng, self.counts
        counts["frames"] += 1
        if spec.loss and rng.random() < spec.loss:
            counts["lost"] += 1
            return
        if spec.corrupt and len(frame) > _PAYLOAD_AT and rng.random() < spec.corrupt:
            buf = bytearray(frame)
            pos = rng.randrange(_PAYLOAD_AT, len(buf))
            buf[pos] ^= 1 << rng.randrange(8)
            frame = bytes(buf)
            counts["corrupted"] += 1
        held = self._held.pop(port, None)
        if held is None and spec.reorder and rng.random() < spec.reorder:
            self._held[port] = frame  # goes out after the next frame to this port
            counts["reordered"] += 1
            return
        self._out(port, frame, emit)
        if spec.dup and rng.random() < spec.dup:
            self._out(port, frame, emit)
            counts["duplicated"] += 1
        if held is not None:
            self._out(port, held, emit)
        if self._delayed:
            self.release_due(emit)

    def flush(self, emit: Callable[[int, bytes], None]) -> None:
        """Sends the frames held back for reordering (the port went idle) and those now due."""
        held, self._held = self._held, {}
        for port, frame in held.items():
            self._out(port, frame, emit)
        self.release_due(emit)
