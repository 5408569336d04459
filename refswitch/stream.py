"""What the reference target sends its primary controller: PacketIn and DigestList messages.

The P4Runtime server sets the sink (its primary's stream); the pipeline's packets reach it
through :class:`refswitch.state.SwitchState`'s ``emit_packet_in`` and ``emit_digest``.

Classes:
    ControllerStream: the sink, the digest lock and timers, and the delivery counts.
    SwitchStats: what was delivered to or dropped before the controller.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from finsy.proto import p4r

from refswitch.digests import Digest, DigestConfig
from refswitch.errors import WriteOp
from refswitch.schema import PacketMetadataInfo, canonical_bytes, check_width

_LOG = logging.getLogger(__name__)

StreamSink = Callable[[p4r.StreamMessageResponse], bool]
"""Hands a message to the primary controller's stream; False if there is none to take it."""


@dataclass
class SwitchStats:
    """Deliveries to and drops before the primary controller (approximate under races).

    Attributes:
        digests_unconfigured: samples dropped because no DigestEntry configured their digest.
        digests_suppressed: samples dropped as repeats within ack_timeout_ns.
        digest_lists_sent: DigestList messages handed to the primary's stream.
        digest_lists_dropped: DigestList messages with no primary (or a full stream) to take them.
        packet_ins_sent: PacketIn messages handed to the primary's stream.
        packet_ins_dropped: PacketIn messages with no primary (or a full stream).
        packet_outs: PacketOut messages passed to packet_out_handler.
        packet_outs_dropped: PacketOut messages dropped (no handler, bad metadata, not primary).
        counter_index_errors: count() calls with an index outside the counter, ignored.
    """

    digests_unconfigured: int = 0
    digests_suppressed: int = 0
    digest_lists_sent: int = 0
    digest_lists_dropped: int = 0
    packet_ins_sent: int = 0
    packet_ins_dropped: int = 0
    packet_outs: int = 0
    packet_outs_dropped: int = 0
    counter_index_errors: int = 0


class ControllerStream:
    """Delivers PacketIns and batched DigestLists to the sink, counting what it drops.

    Every call that touches a :class:`~refswitch.digests.Digest` takes the digest lock; a
    list's timer (max_timeout_ns) flushes it from its own thread.

    Attributes:
        stats: the delivery counts (the switch state's ``stats``).
    """

    def __init__(self) -> None:
        self.stats = SwitchStats()
        self._sink: StreamSink | None = None
        self._lock = threading.Lock()
        self._warned_packet_in = False

    def set_sink(self, sink: StreamSink | None) -> None:
        """Sets where PacketIn and DigestList messages go (None: dropped)."""
        self._sink = sink

    def reset(self, digests: Iterable[Digest]) -> None:
        """Unconfigures the digests of a program being replaced; warnings may repeat."""
        with self._lock:
            for digest in digests:
                digest.reset()
        self._warned_packet_in = False

    def emit_digest(self, d: Digest, values: Sequence[int]) -> None:
        """Adds a sample to its digest's list and sends the list when it is due.

        Raises:
            InvalidArgumentError: wrong number of values or a value too wide.
        """
        msg = None
        with self._lock:
            config = d.config
            if config is None:
                self.stats.digests_unconfigured += 1
                return
            if not d.add(values):
                self.stats.digests_suppressed += 1
                return
            if d.due():
                msg = d.flush()
            elif d.timer is None:
                d.timer = threading.Timer(config.max_timeout_ns / 1e9, self._flush_later, (d,))
                d.timer.daemon = True
                d.timer.start()
        if msg is not None:
            self._deliver_digest(msg)

    def configure_digest(self, d: Digest, op: WriteOp, config: DigestConfig | None) -> None:
        """Writes a DigestEntry (see :meth:`Digest.configure`); sends what it makes due."""
        with self._lock:
            msg = d.configure(op, config)
        if msg is not None:
            self._deliver_digest(msg)

    def ack_digest(self, d: Digest, list_id: int) -> None:
        """DigestListAck: lets the samples of that list through again."""
        with self._lock:
            d.ack(list_id)

    def _flush_later(self, d: Digest) -> None:
        with self._lock:
            d.timer = None
            msg = d.flush() if d.pending and d.config is not None else None
        if msg is not None:
            self._deliver_digest(msg)

    def _deliver_digest(self, msg: p4r.StreamMessageResponse) -> None:
        sink = self._sink
        if sink is not None and sink(msg):
            self.stats.digest_lists_sent += 1
        else:
            self.stats.digest_lists_dropped += 1

    def emit_packet_in(
        self, cpm: PacketMetadataInfo | None, payload: bytes, metadata: Mapping[str, int]
    ) -> None:
        """Sends a PacketIn (dropped, and counted, with no sink).

        Args:
            cpm: the program's packet_in header, if it has one.
            payload: the packet, without the packet_in header.
            metadata: packet_in header fields by P4Info name; missing ones are 0, unknown names
                are ignored (logged once per program).

        Raises:
            InvalidArgumentError: a metadata value is too wide for its field.
        """
        sink = self._sink
        if sink is None:
            self.stats.packet_ins_dropped += 1
            return
        md: list[p4r.PacketMetadata] = []
        if cpm is not None:
            for f in cpm.fields:
                v = metadata.get(f.name, 0)
                check_width(v, f.bitwidth, f"packet_in metadata {f.name!r}")
                md.append(p4r.PacketMetadata(metadata_id=f.id, value=canonical_bytes(v)))
            if not self._warned_packet_in:
                unknown = sorted(k for k in metadata if k not in cpm.by_name)
                if unknown:
                    self._warned_packet_in = True
                    _LOG.warning("packet_in metadata %s not in P4Info: ignored", unknown)
        msg = p4r.StreamMessageResponse(packet=p4r.PacketIn(payload=payload, metadata=md))
        if sink(msg):
            self.stats.packet_ins_sent += 1
        else:
            self.stats.packet_ins_dropped += 1
