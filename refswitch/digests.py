"""Digests of the reference target: configuration, batching, duplicate suppression.

A digest's samples are batched into DigestLists; a sample already sent is suppressed until its
list is acked or its ack timeout passes.

Classes:
    DigestConfig: DigestEntry.Config (list timeout, list size, ack timeout).
    Digest: the configuration, pending list and duplicate cache of one digest of the installed
        program. Its callers (:class:`refswitch.stream.ControllerStream`) hold one lock around
        every call.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from finsy.proto import p4d, p4r

from refswitch.errors import AlreadyExistsError, InvalidArgumentError, NotFoundError, WriteOp
from refswitch.schema import DigestInfo, canonical_bytes, check_width


@dataclass(frozen=True)
class DigestConfig:
    """DigestEntry.Config: batching and duplicate suppression of one digest.

    Attributes:
        max_timeout_ns: longest a sample waits for its list to fill; 0 sends every sample at
            once.
        max_list_size: samples per list; 0 means no limit (then max_timeout_ns decides).
        ack_timeout_ns: a sample already sent is not sent again until its list is acked or this
            long has passed; 0 disables the suppression.
    """

    max_timeout_ns: int = 0
    max_list_size: int = 0
    ack_timeout_ns: int = 0


class Digest:
    """Configuration, pending list and duplicate cache of one digest (under the digest lock).

    Args:
        info: the digest in the P4Info.

    Attributes:
        config: None while no DigestEntry configures the digest (samples are then dropped).
        timer: the pending list's max_timeout_ns timer, while one runs.
    """

    def __init__(self, info: DigestInfo) -> None:
        self.info = info
        self.config: DigestConfig | None = None
        self.next_list_id = 1
        self.pending: list[p4d.P4Data] = []
        self.pending_keys: list[tuple[int, ...]] = []
        self.timer: threading.Timer | None = None
        self.cache: set[tuple[int, ...]] = set()
        self.unacked: dict[int, tuple[int, list[tuple[int, ...]]]] = {}

    def reset(self) -> None:
        """Unconfigures the digest, dropping pending samples; list ids keep increasing."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.config = None
        self.pending = []
        self.pending_keys = []
        self.cache = set()
        self.unacked = {}

    def configure(
        self, op: WriteOp, config: DigestConfig | None
    ) -> p4r.StreamMessageResponse | None:
        """Configures (INSERT / MODIFY) or unconfigures (DELETE) the digest.

        Returns:
            The pending samples as a DigestList when the new configuration sends at once.

        Raises:
            AlreadyExistsError: INSERT of a configured digest.
            NotFoundError: MODIFY / DELETE of an unconfigured one.
        """
        if op == WriteOp.INSERT and self.config is not None:
            raise AlreadyExistsError(f"Digest {self.info.id} already configured")
        if op != WriteOp.INSERT and self.config is None:
            raise NotFoundError(f"Digest {self.info.id} not configured")
        if op == WriteOp.DELETE:
            self.reset()
            return None
        self.config = config or DigestConfig()
        if self.pending and self.config.max_timeout_ns == 0:
            return self.flush()
        return None

    def add(self, values: Sequence[int]) -> bool:
        """Adds one sample to the pending list of a configured digest.

        Returns:
            False if the sample was dropped as a repeat within ack_timeout_ns.

        Raises:
            InvalidArgumentError: wrong number of values or a value too wide.
        """
        config = self.config
        assert config is not None
        widths = self.info.bitwidths
        if len(values) != len(widths):
            raise InvalidArgumentError(
                f"digest {self.info.name!r} has {len(widths)} members, got {len(values)}"
            )
        key = tuple(values)
        for v, w in zip(key, widths, strict=True):
            check_width(v, w, f"digest {self.info.name!r}")
        if config.ack_timeout_ns > 0:
            self._expire_unacked(time.monotonic_ns())
            if key in self.cache:
                return False
            self.cache.add(key)
            self.pending_keys.append(key)
        members = [p4d.P4Data(bitstring=canonical_bytes(v)) for v in key]
        if self.info.shape == "struct":
            data = p4d.P4Data(struct=p4d.P4StructLike(members=members))
        elif self.info.shape == "tuple":
            data = p4d.P4Data(tuple=p4d.P4StructLike(members=members))
        else:
            data = members[0]
        self.pending.append(data)
        return True

    def due(self) -> bool:
        """The pending list goes out now (no timeout configured, or it is full)."""
        config = self.config
        assert config is not None
        full = config.max_list_size > 0 and len(self.pending) >= config.max_list_size
        return config.max_timeout_ns == 0 or full

    def flush(self) -> p4r.StreamMessageResponse:
        """Turns the pending samples into a DigestList (caller holds the digest lock)."""
        assert self.config is not None
        msg = p4r.StreamMessageResponse(
            digest=p4r.DigestList(
                digest_id=self.info.id,
                list_id=self.next_list_id,
                data=self.pending,
                timestamp=time.time_ns(),
            )
        )
        if self.pending_keys:
            deadline = time.monotonic_ns() + self.config.ack_timeout_ns
            self.unacked[self.next_list_id] = (deadline, self.pending_keys)
        self.next_list_id += 1
        self.pending = []
        self.pending_keys = []
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        return msg

    def ack(self, list_id: int) -> None:
        """DigestListAck: lets the samples of that list through again; unknown ids are ignored."""
        acked = self.unacked.pop(list_id, None)
        if acked is not None:
            self.cache.difference_update(acked[1])

    def _expire_unacked(self, now: int) -> None:
        for list_id in [i for i, (deadline, _) in self.unacked.items() if deadline <= now]:
            self.cache.difference_update(self.unacked.pop(list_id)[1])
