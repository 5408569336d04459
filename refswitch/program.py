"""The installed program of the reference target, and its reconciliation.

A SetForwardingPipelineConfig installs one :class:`Program`; a RECONCILE_AND_COMMIT carries
the old program's state over to the new one by P4 id.

Classes:
    Program: the installed program's schema, tables, counters, digests and replication
        engine; replaced whole by the next program (one attribute store in the switch state).
    Counter: the cells of one indirect counter.

Functions:
    reconcile_program: carries entries, controller defaults, PRE entries and digest
        configurations to a new program by P4 id.
    check_index: refuses a counter index outside the counter.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Protocol, TypeVar

from refswitch.digests import Digest
from refswitch.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    OutOfRangeError,
    SwitchStateError,
)
from refswitch.replication import ReplicationEngine
from refswitch.schema import CounterInfo, PipelineSchema, TableInfo
from refswitch.tables import (
    NOACTION,
    ActionCall,
    Entry,
    MatchSpec,
    Table,
    check_action,
    normalize_match,
    set_extras,
)


class Counter:
    """The (packets, bytes) cells of one indirect counter."""

    __slots__ = ("info", "packets", "bytes")

    def __init__(self, info: CounterInfo) -> None:
        self.info = info
        self.packets = [0] * info.size
        self.bytes = [0] * info.size


class _Named(Protocol):
    @property
    def id(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def alias(self) -> str: ...


_I = TypeVar("_I", bound=_Named)
_V = TypeVar("_V")


def _by_ref(infos: Iterable[_I], make: Callable[[_I], _V]) -> dict[str | int, _V]:
    """One object per P4Info entity, found under its id, name and alias."""
    out: dict[str | int, _V] = {}
    for info in infos:
        obj = make(info)
        for ref in (info.id, info.name, info.alias):
            if ref != "":
                out[ref] = obj
    return out


class Program:
    """Everything one SetForwardingPipelineConfig installs; replaced whole by the next one.

    Args:
        schema: the program's P4Info (None: the empty pipeline before the first program).
        device_config: the p4_device_config as installed.
        cookie: the ForwardingPipelineConfig cookie, if any.
        defaults: table name or alias -> the program's initial default action.

    Raises:
        InvalidArgumentError: a default for an unknown table, or an invalid default action.
    """

    def __init__(
        self,
        schema: PipelineSchema | None,
        device_config: bytes = b"",
        cookie: int | None = None,
        defaults: Mapping[str, ActionCall] | None = None,
    ) -> None:
        self.schema = schema
        self.device_config = device_config
        self.cookie = cookie
        self.tables: dict[str | int, Table] = {}
        self.counters: dict[str | int, Counter] = {}
        self.digests: dict[str | int, Digest] = {}
        self.pre = ReplicationEngine()
        if schema is None:
            return
        given = dict(defaults or {})

        def table(info: TableInfo) -> Table:
            call = given.pop(info.name, None) or given.pop(info.alias, None)
            return Table(info, _initial_default(schema, info, call))

        self.tables = _by_ref(schema.tables.values(), table)
        if given:
            raise InvalidArgumentError(f"initial defaults for unknown tables: {sorted(given)}")
        self.counters = _by_ref(schema.counters.values(), Counter)
        self.digests = _by_ref(schema.digests.values(), Digest)

    def unique_tables(self) -> list[Table]:
        """Each table once, in P4Info order."""
        return [self.tables[i] for i in (self.schema.tables if self.schema else ())]

    def unique_digests(self) -> list[Digest]:
        """Each digest once, in P4Info order."""
        return [self.digests[i] for i in (self.schema.digests if self.schema else ())]


def _initial_default(
    schema: PipelineSchema, info: TableInfo, given: ActionCall | None
) -> ActionCall:
    """The given default, else P4Info's initial default, else the const one, else NoAction."""
    if given is not None:
        return check_action(schema, info, given, default=True, program=True)
    tac = info.initial_default
    if tac is not None and tac.action_id in schema.actions:
        ainfo = schema.actions[tac.action_id]
        params = {
            ainfo.param_by_id[a.param_id].name: int.from_bytes(a.value, "big")
            for a in tac.arguments
            if a.param_id in ainfo.param_by_id
        }
        return ActionCall(ainfo.name, params)
    if info.const_default_action_id in schema.actions:
        return ActionCall(schema.actions[info.const_default_action_id].name, {})
    return ActionCall(NOACTION, {})


def check_index(info: CounterInfo, index: int) -> int:
    """Returns ``index`` if it is a cell of the counter.

    Raises:
        InvalidArgumentError: a negative index.
        OutOfRangeError: an index beyond the counter's size.
    """
    if index < 0:
        raise InvalidArgumentError("A negative number is not a valid index value")
    if index >= info.size:
        raise OutOfRangeError(f"Index {index} out of range for counter {info.name!r} ({info.size})")
    return index


def reconcile_program(old: Program, new: Program) -> None:
    """Carries what was written for ``old`` over to ``new`` by P4 id (RECONCILE_AND_COMMIT).

    Indirect counters are not carried (they restart at zero).

    Raises:
        FailedPreconditionError: an entry or a controller default does not validate under the
            new program (``new`` is then half filled: the caller drops it).
    """
    assert old.schema is not None and new.schema is not None
    schema = new.schema
    for t in old.unique_tables():
        nt = new.tables.get(t.info.id)
        if nt is None:
            continue
        try:
            for e in t.entries.values():
                specs: list[MatchSpec] = [None] * len(nt.info.fields)
                for f, s in zip(t.info.fields, e.specs, strict=True):
                    if f.id not in nt.info.field_index:
                        raise InvalidArgumentError(f"key field {f.name!r} is gone")
                    specs[nt.info.field_index[f.id]] = s
                norm = normalize_match(nt.info, specs, e.priority)
                call = check_action(schema, nt.info, _by_id(old, schema, e.action), default=False)
                entry = Entry(norm, e.priority, call)
                counter = (e.packets, e.bytes) if nt.info.direct_counter_id else None
                set_extras(entry, counter, e.metadata, e.controller_metadata, 0)
                nt.add(entry)
            if t.default.action != t.initial_default:
                nt.default.action = check_action(
                    schema, nt.info, _by_id(old, schema, t.default.action), default=True
                )
        except SwitchStateError as err:
            raise FailedPreconditionError(
                f"Error when reconciling config: table {t.info.name!r}: {err}"
            ) from err
    new.pre.carry_over(old.pre)
    for d in old.unique_digests():
        nd = new.digests.get(d.info.id)
        if nd is not None and d.config is not None:
            nd.config = d.config


def _by_id(old: Program, schema: PipelineSchema, call: ActionCall) -> ActionCall:
    """Renames an action and its parameters from the old program to the new one by P4 id."""
    assert old.schema is not None
    if call.action not in old.schema.action_by_name:
        return call
    oinfo = old.schema.action(call.action)
    ninfo = schema.action(oinfo.id)
    params: dict[str, int] = {}
    for name, value in call.params.items():
        pid = oinfo.param_by_name[name].id
        if pid not in ninfo.param_by_id:
            raise InvalidArgumentError(f"action {ninfo.name!r} lost parameter {name!r}")
        params[ninfo.param_by_id[pid].name] = value
    return ActionCall(ninfo.name, params)
