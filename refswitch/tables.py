"""Table entries and their matching.

What a table holds, how a key finds an entry, and how a written entry or action is checked
against the program.

Values are plain ints here; bytestrings exist only on the P4Runtime side
(:mod:`refswitch.p4rt_entities`). Writers hold the switch state's lock
(:class:`refswitch.state.SwitchState`); lookups hold none.

Classes:
    ActionCall: an action name and its parameter values, as the pipeline sees it.
    Lpm, Ternary, Range: match values for non-exact key fields (an int is an exact value and
        None a wildcard); MatchSpec is their union.
    TableEntryView: a table entry as read back.
    Entry: one entry with its direct counter and cookies; the pipeline gets it as the opaque
        handle of a lookup.
    Table: the entries of one table and the structures a lookup walks (an exact dict, LPM
        levels, or ternary rows in priority order).

Functions:
    normalize_match: checks a key as PI's construct_match_key does and returns its normal form.
    check_action: checks an action for a table as PI's validate_action does.
    check_extras, set_extras: the direct counter, cookies and idle timeout of a written entry.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from refswitch.errors import InvalidArgumentError, PermissionDeniedError
from refswitch.schema import (
    ActionScope,
    FieldInfo,
    MatchKind,
    PipelineSchema,
    TableInfo,
    check_width,
)

NOACTION = "NoAction"
"""The action of a table whose program names no default (P4Info may not list it)."""


@dataclass(frozen=True)
class ActionCall:
    """An action with its parameter values.

    Attributes:
        action: P4Info action name (``preamble.name``), e.g. "KvcastIngress.cache.cache_hit".
        params: parameter name -> value.
    """

    action: str
    params: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Lpm:
    """LPM match value: the top ``prefix_len`` bits of ``value`` (the rest must be zero)."""

    value: int
    prefix_len: int


@dataclass(frozen=True, slots=True)
class Ternary:
    """Ternary match value: matches when ``key & mask == value``."""

    value: int
    mask: int


@dataclass(frozen=True, slots=True)
class Range:
    """Range match value: matches when ``low <= key <= high``."""

    low: int
    high: int


MatchSpec = int | Lpm | Ternary | Range | None
"""One key field of an entry: an int (exact / optional value), Lpm, Ternary, Range or None
(don't care; allowed for lpm, ternary, range and optional fields)."""


@dataclass(frozen=True)
class TableEntryView:
    """A table entry as read back.

    Attributes:
        table: table name.
        match: one MatchSpec per key field, normalized (an int for lpm fields becomes a full
            prefix, for ternary fields a full mask).
        priority: 0 unless the table needs priorities.
        action: the entry's action.
        counter: direct counter (packets, bytes).
        is_default: True for the default entry (match is empty then).
        metadata: opaque controller cookie (P4Runtime ``metadata``).
        controller_metadata: deprecated integer cookie.
        idle_timeout_ns: as written; the reference target never ages entries out.
    """

    table: str
    match: tuple[MatchSpec, ...]
    priority: int
    action: ActionCall
    counter: tuple[int, int] = (0, 0)
    is_default: bool = False
    metadata: bytes = b""
    controller_metadata: int = 0
    idle_timeout_ns: int = 0


def _full(bitwidth: int) -> int:
    return (1 << bitwidth) - 1


def _normalize_field(f: FieldInfo, spec: MatchSpec) -> MatchSpec:
    """Validates one key field as PI's construct_match_key does and returns its normal form."""
    what = f"match field {f.name!r}"
    if isinstance(spec, bool):
        raise InvalidArgumentError(f"{what}: Invalid match type")
    if f.kind == MatchKind.EXACT:
        if spec is None:
            raise InvalidArgumentError(f"{what}: Missing non-ternary field in match key")
        if not isinstance(spec, int):
            raise InvalidArgumentError(f"{what}: Invalid match type")
        check_width(spec, f.bitwidth, what)
        return spec
    if spec is None:
        return None
    if f.kind == MatchKind.OPTIONAL:
        if not isinstance(spec, int):
            raise InvalidArgumentError(f"{what}: Invalid match type")
        check_width(spec, f.bitwidth, what)
        return spec
    if f.kind == MatchKind.LPM:
        spec = Lpm(spec, f.bitwidth) if isinstance(spec, int) else spec
        if not isinstance(spec, Lpm):
            raise InvalidArgumentError(f"{what}: Invalid match type")
        check_width(spec.value, f.bitwidth, what)
        if spec.prefix_len < 0 or spec.prefix_len > f.bitwidth:
            raise InvalidArgumentError(f"{what}: Prefix length cannot be < 0 or > bitwidth")
        if spec.prefix_len == 0:
            raise InvalidArgumentError(
                f"{what}: Invalid representation of 'don't care' LPM match, omit match field "
                "instead of using a prefix length of 0"
            )
        if spec.value & _full(f.bitwidth - spec.prefix_len):
            raise InvalidArgumentError(
                f"{what}: Invalid LPM value, incorrect number of trailing zeros"
            )
        return spec
    if f.kind == MatchKind.TERNARY:
        spec = Ternary(spec, _full(f.bitwidth)) if isinstance(spec, int) else spec
        if not isinstance(spec, Ternary):
            raise InvalidArgumentError(f"{what}: Invalid match type")
        check_width(spec.value, f.bitwidth, what)
        check_width(spec.mask, f.bitwidth, what)
        if spec.mask == 0:
            raise InvalidArgumentError(
                f"{what}: Invalid representation of 'don't care' ternary match, omit match "
                "field instead of using 0 mask"
            )
        if spec.value & spec.mask != spec.value:
            raise InvalidArgumentError(
                f"{what}: Invalid ternary value, make sure value & mask == value"
            )
        return spec
    spec = Range(spec, spec) if isinstance(spec, int) else spec
    if not isinstance(spec, Range):
        raise InvalidArgumentError(f"{what}: Invalid match type")
    check_width(spec.low, f.bitwidth, what)
    check_width(spec.high, f.bitwidth, what)
    if spec.low == 0 and spec.high == _full(f.bitwidth):
        raise InvalidArgumentError(
            f"{what}: Invalid representation of 'don't care' range match, omit match field"
        )
    if spec.low > spec.high:
        raise InvalidArgumentError(f"{what}: Invalid range value, make sure low <= high")
    return spec


def normalize_match(
    info: TableInfo, match: Sequence[MatchSpec], priority: int
) -> tuple[MatchSpec, ...]:
    """Checks a key and its priority for a table; returns the key in normal form.

    Args:
        info: the table.
        match: one MatchSpec per key field, in P4Info order.
        priority: the entry's priority (> 0 iff the table needs priorities).

    Raises:
        InvalidArgumentError: a field is missing, of the wrong kind or too wide, or the priority
            does not fit the table.
    """
    if not info.fields:
        raise InvalidArgumentError(
            f"table {info.name!r} has no key fields: only its default entry can be written"
        )
    if len(match) != len(info.fields):
        raise InvalidArgumentError(
            f"table {info.name!r} has {len(info.fields)} key fields, got {len(match)}"
        )
    specs = tuple(_normalize_field(f, s) for f, s in zip(info.fields, match, strict=True))
    if priority < 0:
        raise InvalidArgumentError("Negative priority")
    if info.needs_priority and priority == 0:
        raise InvalidArgumentError("Zero priority for ternary match")
    if not info.needs_priority and priority > 0:
        raise InvalidArgumentError("Non-zero priority for non-ternary match")
    return specs


def _mask_of(f: FieldInfo, spec: MatchSpec) -> tuple[int, int]:
    """(value, mask) of a non-range field spec."""
    if spec is None:
        return 0, 0
    if isinstance(spec, Lpm):
        return spec.value, _full(f.bitwidth) ^ _full(f.bitwidth - spec.prefix_len)
    if isinstance(spec, Ternary):
        return spec.value, spec.mask
    assert isinstance(spec, int)
    return spec, _full(f.bitwidth)


class Entry:
    """One entry; the pipeline gets it as the opaque handle of a lookup."""

    __slots__ = (
        "specs",
        "priority",
        "action",
        "packets",
        "bytes",
        "metadata",
        "controller_metadata",
        "idle_timeout_ns",
    )

    def __init__(self, specs: tuple[MatchSpec, ...], priority: int, action: ActionCall) -> None:
        self.specs = specs
        self.priority = priority
        self.action = action
        self.packets = 0
        self.bytes = 0
        self.metadata = b""
        self.controller_metadata = 0
        self.idle_timeout_ns = 0


_TernaryRow = tuple[
    tuple[tuple[int, int, int], ...], tuple[tuple[int, int, int], ...], Entry, int, int
]


class Table:
    """Entries of one table and the structures lookup() walks.

    Writers hold the SwitchState lock; find() holds none. Every structure find() reads is
    either a dict updated one key at a time (atomic under the GIL) or a tuple replaced whole.
    """

    def __init__(self, info: TableInfo, default: ActionCall) -> None:
        self.info = info
        self.initial_default = default
        self.default = Entry((), 0, default)
        self.entries: dict[tuple[tuple[MatchSpec, ...], int], Entry] = {}
        self.exact: dict[tuple[int, ...], Entry] = {}
        self.levels: tuple[tuple[int, int, dict[tuple[int, ...], Entry]], ...] = ()
        self.rows: tuple[_TernaryRow, ...] = ()
        self._seq = 0
        self.find: Callable[[Sequence[int]], Entry | None]
        if info.lookup_kind == "exact":
            self.find = self._find_exact
        elif info.lookup_kind == "lpm":
            self.find = self._find_lpm_1 if len(info.fields) == 1 else self._find_lpm
        else:
            self.find = self._find_ternary

    # The three lookups (hot path).
    def _find_exact(self, key: Sequence[int]) -> Entry | None:
        return self.exact.get(tuple(key))

    def _find_lpm_1(self, key: Sequence[int]) -> Entry | None:
        v = key[0]
        for _plen, mask, d in self.levels:
            e = d.get((v & mask,))
            if e is not None:
                return e
        return None

    def _find_lpm(self, key: Sequence[int]) -> Entry | None:
        i = self.info.lpm_index
        k = tuple(key)
        head, v, tail = k[:i], k[i], k[i + 1 :]
        for _plen, mask, d in self.levels:
            e = d.get((*head, v & mask, *tail))
            if e is not None:
                return e
        return None

    def _find_ternary(self, key: Sequence[int]) -> Entry | None:
        for masks, ranges, entry, _prio, _seq in self.rows:
            for i, v, m in masks:
                if key[i] & m != v:
                    break
            else:
                for i, lo, hi in ranges:
                    if not lo <= key[i] <= hi:
                        break
                else:
                    return entry
        return None

    # Index maintenance (under the SwitchState lock).
    def _lpm_key(self, specs: tuple[MatchSpec, ...]) -> tuple[int, tuple[int, ...]]:
        plen = 0
        values: list[int] = []
        for f, s in zip(self.info.fields, specs, strict=True):
            if f.kind == MatchKind.LPM:
                plen = s.prefix_len if isinstance(s, Lpm) else 0
                values.append(s.value if isinstance(s, Lpm) else 0)
            else:
                assert isinstance(s, int)
                values.append(s)
        return plen, tuple(values)

    def add(self, entry: Entry) -> None:
        """Adds an entry (checked, and not there yet) to the table and its lookup structure."""
        self.entries[(entry.specs, entry.priority)] = entry
        kind = self.info.lookup_kind
        if kind == "exact":
            self.exact[tuple(s for s in entry.specs if isinstance(s, int))] = entry
        elif kind == "lpm":
            plen, k = self._lpm_key(entry.specs)
            for p, _m, d in self.levels:
                if p == plen:
                    d[k] = entry
                    return
            bw = self.info.fields[self.info.lpm_index].bitwidth
            level = (plen, _full(bw) ^ _full(bw - plen), {k: entry})
            self.levels = tuple(sorted((*self.levels, level), key=lambda x: -x[0]))
        else:
            self._seq += 1
            masks: list[tuple[int, int, int]] = []
            ranges: list[tuple[int, int, int]] = []
            for i, (f, s) in enumerate(zip(self.info.fields, entry.specs, strict=True)):
                if isinstance(s, Range):
                    ranges.append((i, s.low, s.high))
                elif s is not None:
                    masks.append((i, *_mask_of(f, s)))
            row = (tuple(masks), tuple(ranges), entry, entry.priority, self._seq)
            self.rows = tuple(sorted((*self.rows, row), key=_row_order))

    def remove(self, entry: Entry) -> None:
        """Removes an entry of the table from the table and its lookup structure."""
        del self.entries[(entry.specs, entry.priority)]
        kind = self.info.lookup_kind
        if kind == "exact":
            del self.exact[tuple(s for s in entry.specs if isinstance(s, int))]
        elif kind == "lpm":
            plen, k = self._lpm_key(entry.specs)
            for p, _m, d in self.levels:
                if p == plen:
                    del d[k]
                    if not d:
                        self.levels = tuple(x for x in self.levels if x[0] != plen)
                    return
        else:
            self.rows = tuple(r for r in self.rows if r[2] is not entry)

    def view(self, entry: Entry, is_default: bool = False) -> TableEntryView:
        """An entry of the table as read back."""
        return TableEntryView(
            table=self.info.name,
            match=entry.specs,
            priority=entry.priority,
            action=entry.action,
            counter=(entry.packets, entry.bytes),
            is_default=is_default,
            metadata=entry.metadata,
            controller_metadata=entry.controller_metadata,
            idle_timeout_ns=entry.idle_timeout_ns,
        )


def _row_order(row: _TernaryRow) -> tuple[int, int]:
    return -row[3], row[4]


def check_action(
    schema: PipelineSchema,
    info: TableInfo,
    call: ActionCall,
    *,
    default: bool,
    program: bool = False,
) -> ActionCall:
    """Validates an action for a table as PI's validate_action does; returns it by P4Info name.

    Args:
        schema: the program.
        info: the table.
        call: the action and parameters to check.
        default: for the default entry (scope check).
        program: the program's own initial default (no table membership or scope check).
    """
    if program and call.action == NOACTION and NOACTION not in schema.action_by_name:
        return ActionCall(NOACTION, {})
    ainfo = schema.action(call.action)
    if not program:
        if ainfo.id not in info.actions:
            raise InvalidArgumentError(
                f"Invalid action for table: {ainfo.name!r} is not an action of {info.name!r}"
            )
        scope = info.actions[ainfo.id]
        if scope == ActionScope.TABLE_ONLY and default:
            raise PermissionDeniedError("Cannot use TABLE_ONLY action as default action")
        if scope == ActionScope.DEFAULT_ONLY and not default:
            raise PermissionDeniedError("Cannot use DEFAULT_ONLY action in table entry")
    if len(call.params) != len(ainfo.params):
        raise InvalidArgumentError(
            f"Unexpected number of action parameters for {ainfo.name!r}: expected "
            f"{len(ainfo.params)}, got {len(call.params)}"
        )
    params: dict[str, int] = {}
    for p in ainfo.params:
        if p.name not in call.params:
            raise InvalidArgumentError(f"Unknown action parameter for {ainfo.name!r}")
        value = call.params[p.name]
        check_width(value, p.bitwidth, f"action {ainfo.name!r} parameter {p.name!r}")
        params[p.name] = value
    return ActionCall(ainfo.name, params)


def check_extras(info: TableInfo, counter: tuple[int, int] | None, idle_timeout_ns: int) -> None:
    """Refuses a direct counter or idle timeout that the table does not have.

    Raises:
        InvalidArgumentError: as PI words it.
    """
    if counter is not None and not info.direct_counter_id:
        raise InvalidArgumentError("Table has no direct counters")
    if idle_timeout_ns < 0:
        raise InvalidArgumentError("idle_timeout_ns must be a positive value")
    if idle_timeout_ns > 0 and not info.supports_idle_timeout:
        raise InvalidArgumentError(
            "idle_timeout_ns must be set to 0 for tables which do not support idle timeout"
        )


def set_extras(
    entry: Entry,
    counter: tuple[int, int] | None,
    metadata: bytes,
    controller_metadata: int,
    idle_timeout_ns: int,
) -> None:
    """Sets what an entry carries besides its key and action (counter None: left as it is)."""
    if counter is not None:
        entry.packets, entry.bytes = counter
    entry.metadata = bytes(metadata)
    entry.controller_metadata = controller_metadata
    entry.idle_timeout_ns = idle_timeout_ns
