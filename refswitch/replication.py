"""The packet replication engine (PRE) of the reference target.

Classes:
    Replica: one copy of a multicast or clone packet (egress port and instance).
    MulticastGroup, CloneSession: PRE entries, as written and read back.
    ReplicationEngine: the groups and sessions written for one program, with the per-packet
        replica lookup.

Functions:
    multicast_group: checks a multicast group as PI's PreMcMgr does and builds it.
    check_clone_session: checks a clone session as PI does.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from refswitch.errors import InvalidArgumentError, OutOfRangeError, WriteOp, check_op

MULTICAST_GROUP_ID_LIMIT = 1 << 15
"""Group ids at or above this are reserved, as in PI's PreMcMgr (used for clone sessions)."""


@dataclass(frozen=True)
class Replica:
    """One copy of a multicast or clone packet.

    Attributes:
        port: egress port.
        instance: replica id (egress_rid).
        port_bytes: the writer used the bytes ``port`` field (P4Runtime >= 1.4) rather than the
            deprecated ``egress_port``; reads answer in the same form. Not part of equality.
    """

    port: int
    instance: int = 0
    port_bytes: bool = field(default=False, compare=False)


@dataclass(frozen=True)
class MulticastGroup:
    """A multicast group entry of the packet replication engine."""

    group_id: int
    replicas: tuple[Replica, ...]
    metadata: bytes = b""


@dataclass(frozen=True)
class CloneSession:
    """A clone session entry of the packet replication engine."""

    session_id: int
    replicas: tuple[Replica, ...]
    class_of_service: int = 0
    packet_length_bytes: int = 0


def multicast_group(
    group_id: int, replicas: Iterable[Replica] = (), metadata: bytes = b""
) -> MulticastGroup:
    """A multicast group, checked as PI checks one.

    Raises:
        InvalidArgumentError: group 0, or a duplicate (port, instance).
        OutOfRangeError: group id in the reserved range.
    """
    if group_id == 0:
        raise InvalidArgumentError("0 is not a valid group id")
    if group_id >= MULTICAST_GROUP_ID_LIMIT:
        raise OutOfRangeError("Group id value is too high")
    return MulticastGroup(group_id, _check_replicas(replicas, "multicast group"), metadata)


def check_clone_session(session: CloneSession) -> None:
    """Refuses a clone session PI refuses.

    Raises:
        InvalidArgumentError: session 0, or a duplicate (port, instance).
    """
    if session.session_id == 0:
        raise InvalidArgumentError("0 is not a valid session id")
    _check_replicas(session.replicas, "clone session")


def _check_replicas(replicas: Iterable[Replica], what: str) -> tuple[Replica, ...]:
    reps = tuple(replicas)
    if len({(r.port, r.instance) for r in reps}) != len(reps):
        raise InvalidArgumentError(f"Duplicate replica in {what}")
    return reps


class ReplicationEngine:
    """The multicast groups and clone sessions written for one program.

    Writers hold the switch state's lock; the per-packet :meth:`ports` holds none (a dict
    changed one key at a time).
    """

    def __init__(self) -> None:
        self.groups: dict[int, MulticastGroup] = {}
        self.group_ports: dict[int, tuple[tuple[int, int], ...]] = {}
        self.sessions: dict[int, CloneSession] = {}

    def ports(self, group_id: int) -> Sequence[tuple[int, int]]:
        """The (egress_port, instance) replicas of a multicast group; empty if unknown."""
        return self.group_ports.get(group_id, ())

    def write_group(self, op: WriteOp, group: MulticastGroup) -> None:
        """Inserts, modifies or deletes a multicast group (one checked by multicast_group()).

        Raises:
            AlreadyExistsError / NotFoundError: as the operation requires.
        """
        gid = group.group_id
        check_op(op, gid in self.groups, "Multicast group")
        if op == WriteOp.DELETE:
            del self.groups[gid]
            del self.group_ports[gid]
            return
        self.groups[gid] = group
        self.group_ports[gid] = tuple((r.port, r.instance) for r in group.replicas)

    def write_session(self, op: WriteOp, session: CloneSession) -> None:
        """Inserts, modifies or deletes a clone session (one checked by check_clone_session()).

        Raises:
            AlreadyExistsError / NotFoundError: as the operation requires.
        """
        check_op(op, session.session_id in self.sessions, "Clone session")
        if op == WriteOp.DELETE:
            del self.sessions[session.session_id]
        else:
            self.sessions[session.session_id] = session

    def carry_over(self, old: ReplicationEngine) -> None:
        """Takes every group and session of ``old`` (a reconciled program keeps them all)."""
        self.groups.update(old.groups)
        self.group_ports.update(old.group_ports)
        self.sessions.update(old.sessions)
