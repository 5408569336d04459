"""Typed errors of the control plane's P4Runtime layer, drivers and SRAM allocator.

Every error says what failed and what to do about it; none of them ends the process (a daemon
catches them, logs them and carries on or retries).

Classes:
    ControlPlaneError: base of every error below.
    ConfigError: a bad argument or setting (a prefix with host bits, an empty chunk, ...).
    SwitchError: base of the errors of one switch's P4Runtime session; names the switch.
    SwitchUnavailableError: the switch is not connected (down, restarting, unreachable).
    NotPrimaryError: another controller is primary for the switch.
    PipelineError: the switch refused the pipeline, or the P4Info cannot be used.
    EncodingError: a name or value does not fit the P4Info (stale P4Info or constants).
    WriteError: a P4Runtime Write failed; ``failures`` lists each refused update.
    EntryExistsError / EntryNotFoundError: every failed update was ALREADY_EXISTS / NOT_FOUND.
    ReadError: a P4Runtime Read failed.
    UpdateFailure: one refused update of a Write (index, code, message, entity).
    FragmentLoadError: a chunk could not be loaded into switch SRAM.
    WriteAckTimeoutError: a WRITE was never acknowledged, even after retries.
    AllocationError: base of the SRAM slot allocator's errors.
    OutOfSlotsError: no free slot range is large enough.
    OutOfEntriesError: every cache entry is in use.
    SlotConflictError: a reserved range overlaps an allocated one.
    InvalidFreeError: freeing a range that is not allocated as given.
    FabricCutError: a spine or link out of service would cut two leaves apart.
    ResourceExhaustedError: a driver ran out of ids (multicast groups, replica ids).
    NotInstalledError: an operation names something the driver has not installed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


class ControlPlaneError(Exception):
    """Base class of every control-plane error."""


class ConfigError(ControlPlaneError, ValueError):
    """A bad argument or configuration value; the message names it and the accepted range."""


class SwitchError(ControlPlaneError):
    """An error of one switch's P4Runtime session.

    Attributes:
        switch: the switch's name.
    """

    def __init__(self, switch: str, message: str) -> None:
        super().__init__(f"switch {switch!r}: {message}")
        self.switch = switch


class SwitchUnavailableError(SwitchError):
    """The switch is not connected: not started, down, restarting or unreachable.

    The layer reconnects by itself; drivers re-install their state once it is back. Retry the
    operation after :meth:`~controlplane.p4rt.SwitchClient.wait_ready`.
    """


class NotPrimaryError(SwitchError):
    """Another controller holds a higher election id: this one is a backup and may not write."""


class PipelineError(SwitchError):
    """The switch refused the pipeline (P4Info / device config), or it cannot be used."""


class EncodingError(ControlPlaneError, ValueError):
    """A table, action, field or value does not fit the P4Info.

    Usually a stale P4Info or stale generated constants: rebuild with ``make p4`` and
    ``make constants`` so that p4src/build and kvcast/p4constants.py agree.
    """


@dataclass(frozen=True)
class UpdateFailure:
    """One update a switch refused.

    Attributes:
        index: position of the update in its WriteRequest.
        code: gRPC status code name, e.g. "ALREADY_EXISTS".
        message: the switch's message.
        entity: a short description of the update (type and entity).
    """

    index: int
    code: str
    message: str
    entity: str

    def __str__(self) -> str:
        return f"[{self.index}] {self.code}: {self.message} ({self.entity})"


class WriteError(SwitchError):
    """A P4Runtime Write failed.

    Attributes:
        code: the gRPC status code name of the Write.
        failures: one entry per refused update (empty if the whole Write was refused).
    """

    def __init__(
        self, switch: str, message: str, code: str, failures: Sequence[UpdateFailure] = ()
    ) -> None:
        detail = "; ".join(str(f) for f in failures)
        super().__init__(switch, f"{message}: {detail}" if detail else message)
        self.code = code
        self.failures = list(failures)


class EntryExistsError(WriteError):
    """Every refused update was an INSERT of something that exists: MODIFY it instead."""


class EntryNotFoundError(WriteError):
    """Every refused update named something that does not exist (MODIFY or DELETE)."""


class ReadError(SwitchError):
    """A P4Runtime Read failed."""


class FragmentLoadError(ControlPlaneError):
    """A chunk could not be loaded into switch SRAM; its slots were released."""


class WriteAckTimeoutError(FragmentLoadError):
    """A WRITE was never acknowledged by a WRITE_ACK PacketIn, even after retries.

    Attributes:
        slot: the slot the WRITE targeted.
        req_id: the request id of the last try.
        tries: how many WRITEs were sent.
    """

    def __init__(self, switch: str, slot: int, req_id: int, tries: int, waited_s: float) -> None:
        super().__init__(
            f"switch {switch!r}: no WRITE_ACK for slot {slot} (req_id {req_id}) after {tries} "
            f"tries of {waited_s:g} s each. Check that the switch runs the kvcast program, that "
            "PacketOut reaches its CPU port (BMv2: --cpu-port 255) and its drop_counter "
            "(UNAUTHORIZED, BAD_FRAGMENT, MALFORMED)"
        )
        self.slot = slot
        self.req_id = req_id
        self.tries = tries


class AllocationError(ControlPlaneError):
    """Base of the SRAM slot allocator's errors."""


class OutOfSlotsError(AllocationError):
    """No free range of the requested size exists.

    The message gives the free space and the largest free range: if the free space would
    suffice, the slots are fragmented; evicting a neighbour of a free range helps.
    """


class OutOfEntriesError(AllocationError):
    """Every cache-table entry is in use: evict a chunk before loading another."""


class SlotConflictError(AllocationError):
    """A range to reserve overlaps a range already allocated, or lies outside the slots."""


class InvalidFreeError(AllocationError):
    """Freeing a range that is not allocated exactly as given (double free or wrong size)."""


class FabricCutError(ControlPlaneError):
    """Taking a spine or link out of service would leave two leaves with no spine between them."""


class ResourceExhaustedError(ControlPlaneError):
    """A driver ran out of ids (multicast group ids, replica ids): release some first."""


class NotInstalledError(ControlPlaneError, KeyError):
    """An operation names a host, group, chunk, route or pool node that is not installed."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""
