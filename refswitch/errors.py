"""Typed errors of the reference target's runtime, and the write operations they guard.

Each error carries the google.rpc code that P4Runtime reports for it, so the P4Runtime server
(:mod:`refswitch.p4rt_server`) turns a rejected call into PI's status without a table of its own.

Classes:
    SwitchStateError: base of the typed errors; ``code`` is its google.rpc code.
    InvalidArgumentError, NotFoundError, AlreadyExistsError, PermissionDeniedError,
        FailedPreconditionError, OutOfRangeError, ResourceExhaustedError, UnimplementedError:
        one per code the runtime reports.
    WriteOp: INSERT / MODIFY / DELETE for the entities written through one method.

Functions:
    check_op: refuses an INSERT of what exists and a MODIFY / DELETE of what does not.
"""

from __future__ import annotations

import enum
from typing import Any, ClassVar

from finsy.proto import rpc_code


class SwitchStateError(Exception):
    """A rejected operation; ``code`` is the google.rpc code P4Runtime reports for it.

    A subclass names its code in its class statement (``class E(SwitchStateError, code=...)``).
    """

    code: ClassVar[int] = rpc_code.UNKNOWN

    def __init_subclass__(cls, code: int | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if code is not None:
            cls.code = code


class InvalidArgumentError(SwitchStateError, code=rpc_code.INVALID_ARGUMENT):
    """Malformed request: unknown id, value too wide, bad prefix, wrong parameter count."""


class NotFoundError(SwitchStateError, code=rpc_code.NOT_FOUND):
    """The entry, group or configuration to modify, delete or read does not exist."""


class AlreadyExistsError(SwitchStateError, code=rpc_code.ALREADY_EXISTS):
    """INSERT of an entry, group or configuration that exists."""


class PermissionDeniedError(SwitchStateError, code=rpc_code.PERMISSION_DENIED):
    """Write to something the program makes immutable (const default action, const table)."""


class FailedPreconditionError(SwitchStateError, code=rpc_code.FAILED_PRECONDITION):
    """The switch is not in a state to do this (no pipeline, nothing saved to commit)."""


class OutOfRangeError(SwitchStateError, code=rpc_code.OUT_OF_RANGE):
    """Index or id beyond what the program or the target supports."""


class ResourceExhaustedError(SwitchStateError, code=rpc_code.RESOURCE_EXHAUSTED):
    """The table is full (its P4Info size)."""


class UnimplementedError(SwitchStateError, code=rpc_code.UNIMPLEMENTED):
    """A P4Runtime feature the reference target does not have (see the server's docstring)."""


class WriteOp(enum.Enum):
    """Write operation for the entities written through one method."""

    INSERT = "insert"
    MODIFY = "modify"
    DELETE = "delete"


def check_op(op: WriteOp, exists: bool, what: str) -> None:
    """Refuses an INSERT of what exists and a MODIFY / DELETE of what does not.

    Args:
        op: the operation.
        exists: whether the entity written exists.
        what: the entity, capitalised, for the message ("Multicast group").

    Raises:
        AlreadyExistsError: INSERT of an existing entity.
        NotFoundError: MODIFY or DELETE of a missing one.
    """
    if op == WriteOp.INSERT and exists:
        raise AlreadyExistsError(f"{what} already exists")
    if op != WriteOp.INSERT and not exists:
        raise NotFoundError(f"{what} does not exist")
