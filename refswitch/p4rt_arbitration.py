"""StreamChannel connections of the reference target's P4Runtime server and their arbitration.

Arbitration follows PI's DeviceState for the default role: the highest election id is primary,
a leaving primary promotes the next highest, and every change is announced on each stream.

Classes:
    Connection: one StreamChannel, its election id and the queue its response generator drains.
    Arbiter: the open connections of one device and which is primary.
    Abort: a queued item that ends a stream with a status.

Functions:
    status_code: the gRPC status code of a switch state error.
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import threading

import grpc
from finsy.proto import p4r, rpc_code, rpc_status

from refswitch.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    ResourceExhaustedError,
    SwitchStateError,
    UnimplementedError,
)

MAX_CONNECTIONS = 16
"""Open StreamChannels per device, as PI."""
STREAM_QUEUE_SIZE = 10000
"""Messages waiting for a slow client before PacketIn / DigestList are dropped."""
CLOSE = object()
"""A queued item that ends a stream normally."""

_GRPC_CODES = {sc.value[0]: sc for sc in grpc.StatusCode}


def status_code(exc: SwitchStateError) -> grpc.StatusCode:
    """The gRPC status code of the error's google.rpc code (UNKNOWN if gRPC has none)."""
    return _GRPC_CODES.get(exc.code, grpc.StatusCode.UNKNOWN)


def _u128(value: p4r.Uint128) -> int:
    return (value.high << 64) | value.low


def _to_u128(value: int) -> p4r.Uint128:
    return p4r.Uint128(high=value >> 64, low=value & ((1 << 64) - 1))


class Abort:
    """Ends a stream with a status (queued behind the messages already sent)."""

    def __init__(self, exc: SwitchStateError) -> None:
        self.code = status_code(exc)
        self.message = str(exc)


class Connection:
    """One StreamChannel: its election id and the queue its response generator drains."""

    _ids = itertools.count(1)

    def __init__(self) -> None:
        self.id = next(self._ids)
        self.queue: queue.Queue[object] = queue.Queue(STREAM_QUEUE_SIZE)
        self.election_id = 0
        self.registered = False

    def send(self, msg: object) -> bool:
        """Queues a message for the client; False if its queue is full (the message is lost)."""
        try:
            self.queue.put_nowait(msg)
        except queue.Full:
            return False
        return True

    def close(self, item: object = CLOSE) -> None:
        """Ends the stream after what is queued (an Abort item: with its status)."""
        try:
            self.queue.put_nowait(item)
        except queue.Full:  # the generator is stuck behind a full queue: make room
            with contextlib.suppress(queue.Empty):
                self.queue.get_nowait()
            self.queue.put_nowait(item)


class Arbiter:
    """Controller arbitration for the default role, as PI's DeviceState."""

    def __init__(self, device_id: int) -> None:
        self.device_id = device_id
        self.primary: Connection | None = None  # read without the lock by the senders
        self._conns: list[Connection] = []
        self._lock = threading.Lock()

    def arbitrate(self, conn: Connection, update: p4r.MasterArbitrationUpdate) -> None:
        """Registers a connection or changes its election id; announces the outcome.

        Raises:
            SwitchStateError: PI's error for a bad device id, role or election id, or too many
                connections.
        """
        if update.HasField("role") and (update.role.name or update.role.id):
            raise UnimplementedError("Only the default role is supported")
        eid = _u128(update.election_id)
        with self._lock:
            if conn.registered:
                if update.device_id != self.device_id:
                    raise FailedPreconditionError("Invalid device id")
                if eid == conn.election_id:
                    return  # PI: no change, no reply
                if any(c.election_id == eid for c in self._conns if c is not conn):
                    raise InvalidArgumentError("New election id already exists")
                was_primary = conn is self.primary
                conn.election_id = eid
            else:
                if update.device_id != self.device_id:
                    raise NotFoundError(f"Invalid device id {update.device_id}")
                if len(self._conns) >= MAX_CONNECTIONS:
                    raise ResourceExhaustedError("Too many connections")
                if any(c.election_id == eid for c in self._conns):
                    raise InvalidArgumentError("Election id already exists")
                was_primary = False
                conn.election_id = eid
                conn.registered = True
                self._conns.append(conn)
            self._elect()
            if (conn is self.primary) != was_primary:
                self._notify_all()
            else:
                self._notify(conn)

    def remove(self, conn: Connection) -> None:
        """Forgets a closed connection; a new primary is announced if it was the primary."""
        with self._lock:
            if not conn.registered:
                return
            conn.registered = False
            self._conns.remove(conn)
            was_primary = conn is self.primary
            self._elect()
            if was_primary:
                self._notify_all()  # PI promotes the next highest election id

    def check_writer(
        self, request: p4r.WriteRequest | p4r.SetForwardingPipelineConfigRequest
    ) -> None:
        """Refuses a Write or SetForwardingPipelineConfig from anyone but the primary.

        Raises:
            PermissionDeniedError: "Not primary".
        """
        eid = _u128(request.election_id)
        with self._lock:
            if not self._conns:
                if request.HasField("election_id"):
                    raise PermissionDeniedError("Not primary")
                return
            if self.primary is None or self.primary.election_id != eid:
                raise PermissionDeniedError("Not primary")

    def close_all(self) -> None:
        """Ends every open stream (the server is stopping)."""
        with self._lock:
            for c in self._conns:
                c.close()

    def _elect(self) -> None:
        self.primary = max(self._conns, key=lambda c: c.election_id, default=None)

    def _notify(self, conn: Connection) -> None:
        assert self.primary is not None
        is_primary = conn is self.primary
        status = rpc_status.Status(
            code=rpc_code.OK if is_primary else rpc_code.ALREADY_EXISTS,
            message="Is primary" if is_primary else "Is backup",
        )
        update = p4r.MasterArbitrationUpdate(
            device_id=self.device_id,
            election_id=_to_u128(self.primary.election_id),
            status=status,
        )
        conn.send(p4r.StreamMessageResponse(arbitration=update))

    def _notify_all(self) -> None:
        for c in self._conns:
            self._notify(c)
