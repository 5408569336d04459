"""Runtime state of one reference-target switch, shaped by the P4Info of its program.

The per-packet pipeline (:mod:`refswitch.pipeline`) reads this state and the P4Runtime server
(:mod:`refswitch.p4rt_server`) writes it; both go through :class:`SwitchState`, so the two never
share anything else. Values are plain ints here; bytestrings exist only on the P4Runtime side.

Classes:
    SwitchState: table entries, default actions, counters, direct counters, multicast groups,
        clone sessions and digest configuration of one switch, with the per-packet calls
        (``lookup``, ``count``, ``emit_digest`` ...) and the control-plane calls (``insert_entry``,
        ``write_multicast_group`` ...). Validates every write the way PI (simple_switch_grpc's
        P4Runtime front end) does.
    PipelineSchema: the P4Info indexed by id and by name (TableInfo, FieldInfo, ActionInfo,
        ParamInfo, CounterInfo, DigestInfo, PacketMetadataInfo).
    ActionCall: an action name and its parameter values, as the pipeline sees it.
    Lpm, Ternary, Range: match values for non-exact key fields (an int is an exact value and
        None a wildcard).
    TableEntryView, MulticastGroup, Replica, CloneSession, DigestConfig: read results and write
        arguments.
    WriteOp: INSERT / MODIFY / DELETE for the entities written with one method.
    SwitchStats: what was delivered to or dropped before the controller.
    SwitchStateError: base of the typed errors (InvalidArgumentError, NotFoundError, ...), each
        carrying the google.rpc code that P4Runtime reports for it.
"""

from __future__ import annotations

import enum
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, TypeVar

from finsy.proto import p4d, p4i, p4r, p4t, rpc_code

_LOG = logging.getLogger(__name__)

MULTICAST_GROUP_ID_LIMIT = 1 << 15
"""Group ids at or above this are reserved, as in PI's PreMcMgr (used for clone sessions)."""

_NOACTION = "NoAction"
_T = TypeVar("_T")


# --------------------------------------------------------------------------------------- errors
class SwitchStateError(Exception):
    """A rejected operation; ``code`` is the google.rpc code P4Runtime reports for it."""

    code: ClassVar[int] = rpc_code.UNKNOWN


class InvalidArgumentError(SwitchStateError):
    """Malformed request: unknown id, value too wide, bad prefix, wrong parameter count."""

    code = rpc_code.INVALID_ARGUMENT


class NotFoundError(SwitchStateError):
    """The entry, group or configuration to modify, delete or read does not exist."""

    code = rpc_code.NOT_FOUND


class AlreadyExistsError(SwitchStateError):
    """INSERT of an entry, group or configuration that exists."""

    code = rpc_code.ALREADY_EXISTS


class PermissionDeniedError(SwitchStateError):
    """Write to something the program makes immutable (const default action, const table)."""

    code = rpc_code.PERMISSION_DENIED


class FailedPreconditionError(SwitchStateError):
    """The switch is not in a state to do this (no pipeline, nothing saved to commit)."""

    code = rpc_code.FAILED_PRECONDITION


class OutOfRangeError(SwitchStateError):
    """Index or id beyond what the program or the target supports."""

    code = rpc_code.OUT_OF_RANGE


class ResourceExhaustedError(SwitchStateError):
    """The table is full (its P4Info size)."""

    code = rpc_code.RESOURCE_EXHAUSTED


class UnimplementedError(SwitchStateError):
    """A P4Runtime feature the reference target does not have (see the server's docstring)."""

    code = rpc_code.UNIMPLEMENTED


# ------------------------------------------------------------------------------ value classes
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


class WriteOp(enum.Enum):
    """Write operation for the entities written through one method."""

    INSERT = "insert"
    MODIFY = "modify"
    DELETE = "delete"


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


# ---------------------------------------------------------------------------------- the schema
class MatchKind(enum.IntEnum):
    """Match kinds, numbered as p4.config.v1.MatchField.MatchType."""

    EXACT = 2
    LPM = 3
    TERNARY = 4
    RANGE = 5
    OPTIONAL = 6


class ActionScope(enum.IntEnum):
    """Where a table may use an action, numbered as p4.config.v1.ActionRef.Scope."""

    TABLE_AND_DEFAULT = 0
    TABLE_ONLY = 1
    DEFAULT_ONLY = 2


class CounterUnit(enum.IntEnum):
    """Counter units, numbered as p4.config.v1.CounterSpec.Unit."""

    UNSPECIFIED = 0
    BYTES = 1
    PACKETS = 2
    BOTH = 3


_MATCH_KINDS = frozenset(int(k) for k in MatchKind)


@dataclass(frozen=True)
class FieldInfo:
    """A table key field."""

    id: int
    name: str
    bitwidth: int
    kind: MatchKind


@dataclass(frozen=True)
class ParamInfo:
    """An action parameter, or a controller packet metadata field."""

    id: int
    name: str
    bitwidth: int


@dataclass(frozen=True, eq=False)
class ActionInfo:
    """An action and its parameters in P4Info order."""

    id: int
    name: str
    alias: str
    params: tuple[ParamInfo, ...]
    param_by_id: Mapping[int, ParamInfo]
    param_by_name: Mapping[str, ParamInfo]


@dataclass(frozen=True, eq=False)
class TableInfo:
    """A table: key fields in P4Info order, allowed actions and attached resources.

    Attributes:
        lookup_kind: "exact" (every field exact), "lpm" (one lpm field, the rest exact) or
            "ternary" (anything else: entries tried in priority order).
        lpm_index: position of the lpm field when lookup_kind is "lpm".
        needs_priority: some field is ternary, range or optional (P4Runtime's rule).
    """

    id: int
    name: str
    alias: str
    fields: tuple[FieldInfo, ...]
    field_index: Mapping[int, int]
    actions: Mapping[int, ActionScope]
    const_default_action_id: int
    initial_default: p4i.TableActionCall | None
    implementation_id: int
    direct_counter_id: int
    direct_meter_id: int
    size: int
    supports_idle_timeout: bool
    is_const: bool
    lookup_kind: str
    lpm_index: int
    needs_priority: bool


@dataclass(frozen=True)
class CounterInfo:
    """An indirect counter array, or a direct counter (size 0, table_id set)."""

    id: int
    name: str
    alias: str
    unit: CounterUnit
    size: int = 0
    table_id: int = 0


@dataclass(frozen=True)
class DigestInfo:
    """A digest: P4Data shape ("struct", "tuple" or "bitstring") and member bit widths."""

    id: int
    name: str
    alias: str
    shape: str
    bitwidths: tuple[int, ...]


@dataclass(frozen=True, eq=False)
class PacketMetadataInfo:
    """controller_packet_metadata "packet_in" or "packet_out": its fields in header order."""

    id: int
    name: str
    fields: tuple[ParamInfo, ...]
    by_id: Mapping[int, ParamInfo]
    by_name: Mapping[str, ParamInfo]


def _named(ref: int | str, by_id: Mapping[int, object], by_name: Mapping[str, object]) -> object:
    if isinstance(ref, int):
        return by_id.get(ref)
    return by_name.get(ref)


class PipelineSchema:
    """The P4Info of the installed program, indexed by id and by name (or alias).

    Args:
        p4info: the program's P4Info.

    Raises:
        InvalidArgumentError: the P4Info is inconsistent (duplicate or dangling ids).
        UnimplementedError: it uses a match kind or digest type the reference target lacks.
    """

    def __init__(self, p4info: p4i.P4Info) -> None:
        self.p4info = p4info
        self.actions: dict[int, ActionInfo] = {}
        self.action_by_name: dict[str, ActionInfo] = {}
        self.tables: dict[int, TableInfo] = {}
        self.table_by_name: dict[str, TableInfo] = {}
        self.counters: dict[int, CounterInfo] = {}
        self.counter_by_name: dict[str, CounterInfo] = {}
        self.direct_counters: dict[int, CounterInfo] = {}
        self.digests: dict[int, DigestInfo] = {}
        self.digest_by_name: dict[str, DigestInfo] = {}
        self.packet_in: PacketMetadataInfo | None = None
        self.packet_out: PacketMetadataInfo | None = None
        self.unsupported_ids: set[int] = set()
        """Ids of entities the program has but the target does not serve over P4Runtime."""
        for a in p4info.actions:
            params = tuple(ParamInfo(p.id, p.name, p.bitwidth) for p in a.params)
            info = ActionInfo(
                a.preamble.id,
                a.preamble.name,
                a.preamble.alias or a.preamble.name,
                params,
                {p.id: p for p in params},
                {p.name: p for p in params},
            )
            self._add(self.actions, self.action_by_name, info.id, info, a.preamble)
        for c in p4info.counters:
            cinfo = CounterInfo(
                c.preamble.id, c.preamble.name, c.preamble.alias, CounterUnit(c.spec.unit), c.size
            )
            self._add(self.counters, self.counter_by_name, cinfo.id, cinfo, c.preamble)
        for dc in p4info.direct_counters:
            self.direct_counters[dc.preamble.id] = CounterInfo(
                dc.preamble.id,
                dc.preamble.name,
                dc.preamble.alias,
                CounterUnit(dc.spec.unit),
                table_id=dc.direct_table_id,
            )
        direct_meter_ids = {m.preamble.id for m in p4info.direct_meters}
        for t in p4info.tables:
            tinfo = self._table_info(t, direct_meter_ids)
            self._add(self.tables, self.table_by_name, tinfo.id, tinfo, t.preamble)
        for d in p4info.digests:
            shape, widths = _digest_shape(d, p4info.type_info)
            dinfo = DigestInfo(d.preamble.id, d.preamble.name, d.preamble.alias, shape, widths)
            self._add(self.digests, self.digest_by_name, dinfo.id, dinfo, d.preamble)
        for cpm in p4info.controller_packet_metadata:
            fields = tuple(ParamInfo(m.id, m.name, m.bitwidth) for m in cpm.metadata)
            pinfo = PacketMetadataInfo(
                cpm.preamble.id,
                cpm.preamble.name,
                fields,
                {f.id: f for f in fields},
                {f.name: f for f in fields},
            )
            if cpm.preamble.name == "packet_in":
                self.packet_in = pinfo
            elif cpm.preamble.name == "packet_out":
                self.packet_out = pinfo
        for group in (
            p4info.action_profiles,
            p4info.meters,
            p4info.direct_meters,
            p4info.registers,
            p4info.value_sets,
        ):
            self.unsupported_ids.update(x.preamble.id for x in group)

    @staticmethod
    def _add(
        by_id: dict[int, _T],
        by_name: dict[str, _T],
        ident: int,
        info: _T,
        preamble: p4i.Preamble,
    ) -> None:
        if ident == 0 or ident in by_id:
            raise InvalidArgumentError(f"P4Info: invalid or duplicate id {ident:#x}")
        by_id[ident] = info
        by_name[preamble.name] = info
        if preamble.alias and preamble.alias not in by_name:
            by_name[preamble.alias] = info

    def _table_info(self, t: p4i.Table, direct_meter_ids: set[int]) -> TableInfo:
        fields: list[FieldInfo] = []
        for mf in t.match_fields:
            if mf.WhichOneof("match") != "match_type" or mf.match_type not in _MATCH_KINDS:
                raise UnimplementedError(
                    f"P4Info: table {t.preamble.name!r} field {mf.name!r}: unsupported match kind"
                )
            fields.append(FieldInfo(mf.id, mf.name, mf.bitwidth, MatchKind(mf.match_type)))
        for ref in t.action_refs:
            if ref.id not in self.actions:
                raise InvalidArgumentError(
                    f"P4Info: table {t.preamble.name!r} refers to unknown action {ref.id:#x}"
                )
        kinds = [f.kind for f in fields]
        lpm_index = kinds.index(MatchKind.LPM) if MatchKind.LPM in kinds else -1
        if all(k == MatchKind.EXACT for k in kinds):
            lookup_kind = "exact"
        elif kinds.count(MatchKind.LPM) == 1 and all(
            k in (MatchKind.EXACT, MatchKind.LPM) for k in kinds
        ):
            lookup_kind = "lpm"
        else:
            lookup_kind = "ternary"
        direct_counter_id = next((i for i in t.direct_resource_ids if i in self.direct_counters), 0)
        direct_meter_id = next((i for i in t.direct_resource_ids if i in direct_meter_ids), 0)
        return TableInfo(
            id=t.preamble.id,
            name=t.preamble.name,
            alias=t.preamble.alias or t.preamble.name,
            fields=tuple(fields),
            field_index={f.id: i for i, f in enumerate(fields)},
            actions={ref.id: ActionScope(ref.scope) for ref in t.action_refs},
            const_default_action_id=t.const_default_action_id,
            initial_default=(
                t.initial_default_action if t.HasField("initial_default_action") else None
            ),
            implementation_id=t.implementation_id,
            direct_counter_id=direct_counter_id,
            direct_meter_id=direct_meter_id,
            size=t.size,
            supports_idle_timeout=t.idle_timeout_behavior == p4i.Table.NOTIFY_CONTROL,
            is_const=t.is_const_table,
            lookup_kind=lookup_kind,
            lpm_index=lpm_index,
            needs_priority=any(
                k in (MatchKind.TERNARY, MatchKind.RANGE, MatchKind.OPTIONAL) for k in kinds
            ),
        )

    def table(self, ref: int | str) -> TableInfo:
        """The table with this id, name or alias.

        Raises:
            InvalidArgumentError: no such table.
        """
        info = _named(ref, self.tables, self.table_by_name)
        if not isinstance(info, TableInfo):
            raise InvalidArgumentError(f"Invalid P4 id: no table {ref!r}")
        return info

    def action(self, ref: int | str) -> ActionInfo:
        """The action with this id, name or alias.

        Raises:
            InvalidArgumentError: no such action.
        """
        info = _named(ref, self.actions, self.action_by_name)
        if not isinstance(info, ActionInfo):
            raise InvalidArgumentError(f"Invalid P4 id: no action {ref!r}")
        return info

    def counter(self, ref: int | str) -> CounterInfo:
        """The indirect counter with this id, name or alias.

        Raises:
            InvalidArgumentError: no such counter, or it is a direct counter.
        """
        info = _named(ref, self.counters, self.counter_by_name)
        if not isinstance(info, CounterInfo):
            if isinstance(ref, int) and ref in self.direct_counters:
                raise InvalidArgumentError("Cannot use CounterEntry with a direct counter")
            raise InvalidArgumentError(f"Invalid P4 id: no counter {ref!r}")
        return info

    def digest(self, ref: int | str) -> DigestInfo:
        """The digest with this id, name or alias.

        Raises:
            NotFoundError: no such digest (PI's code for it).
        """
        info = _named(ref, self.digests, self.digest_by_name)
        if not isinstance(info, DigestInfo):
            raise NotFoundError(f"{ref!r} is not a valid digest id")
        return info


def _bitstring_width(spec: p4t.P4BitstringLikeTypeSpec) -> int:
    which = spec.WhichOneof("type_spec")
    if which == "bit":
        return spec.bit.bitwidth
    if which == "int":
        return spec.int.bitwidth
    raise UnimplementedError("Varbits not supported for digests")


def _digest_shape(d: p4i.Digest, type_info: p4t.P4TypeInfo) -> tuple[str, tuple[int, ...]]:
    spec = d.type_spec
    which = spec.WhichOneof("type_spec")
    if which == "bitstring":
        return "bitstring", (_bitstring_width(spec.bitstring),)
    if which == "struct":
        name = spec.struct.name
        if name not in type_info.structs:
            raise InvalidArgumentError(f"P4Info: digest struct {name!r} not in type_info")
        members = [m.type_spec for m in type_info.structs[name].members]
    elif which == "tuple":
        members = list(spec.tuple.members)
    else:
        raise UnimplementedError("Packed type for digest can only be bitstring, struct or tuple")
    widths: list[int] = []
    for mspec in members:
        if mspec.WhichOneof("type_spec") != "bitstring":
            raise UnimplementedError(f"digest {d.preamble.name!r}: only bitstring members")
        widths.append(_bitstring_width(mspec.bitstring))
    return which, tuple(widths)


# ------------------------------------------------------------------------------ the entries
def _check_width(value: int, bitwidth: int, what: str) -> None:
    if value < 0 or value >> bitwidth:
        raise InvalidArgumentError(f"{what}: value {value:#x} does not fit within {bitwidth} bits")


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
        _check_width(spec, f.bitwidth, what)
        return spec
    if spec is None:
        return None
    if f.kind == MatchKind.OPTIONAL:
        if not isinstance(spec, int):
            raise InvalidArgumentError(f"{what}: Invalid match type")
        _check_width(spec, f.bitwidth, what)
        return spec
    if f.kind == MatchKind.LPM:
        spec = Lpm(spec, f.bitwidth) if isinstance(spec, int) else spec
        if not isinstance(spec, Lpm):
            raise InvalidArgumentError(f"{what}: Invalid match type")
        _check_width(spec.value, f.bitwidth, what)
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
        _check_width(spec.value, f.bitwidth, what)
        _check_width(spec.mask, f.bitwidth, what)
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
    _check_width(spec.low, f.bitwidth, what)
    _check_width(spec.high, f.bitwidth, what)
    if spec.low == 0 and spec.high == _full(f.bitwidth):
        raise InvalidArgumentError(
            f"{what}: Invalid representation of 'don't care' range match, omit match field"
        )
    if spec.low > spec.high:
        raise InvalidArgumentError(f"{what}: Invalid range value, make sure low <= high")
    return spec


def check_device_config(schema: PipelineSchema, blob: bytes) -> None:
    """Refuses a p4_device_config that is not the reference target's.

    The reference target's program is built in (refswitch.pipeline), so its device config is
    empty. A client that drives BMv2 and this target alike may push BMv2's JSON to both: that
    is accepted when it is the JSON of the same program, i.e. every table of the P4Info is one
    of its pipelines' tables. Anything else (another program's JSON, another target's binary,
    garbage) is refused rather than silently ignored.

    Args:
        schema: the P4Info the config comes with.
        blob: the p4_device_config.

    Raises:
        InvalidArgumentError: the config is neither empty nor that program's BMv2 JSON.
    """
    if not blob:
        return
    try:
        doc = json.loads(blob)
    except ValueError:  # UnicodeDecodeError included
        doc = None
    pipelines = doc.get("pipelines") if isinstance(doc, dict) else None
    if not isinstance(pipelines, list):
        raise InvalidArgumentError(
            f"p4_device_config ({len(blob)} bytes) is neither empty nor a BMv2 JSON: the "
            "reference target runs its own pipeline and takes no other device config"
        )
    names = {
        t.get("name")
        for p in pipelines
        if isinstance(p, dict)
        for t in p.get("tables", ())
        if isinstance(t, dict)
    }
    missing = sorted(t.name for t in schema.tables.values() if t.name not in names)
    if missing:
        raise InvalidArgumentError(
            f"p4_device_config is a BMv2 JSON of another program: it has no table "
            f"{missing[0]!r} of the P4Info ({len(missing)} missing); the reference target "
            "takes an empty device config or the JSON of the program the P4Info describes"
        )


def _normalize_match(
    info: TableInfo, match: Sequence[MatchSpec], priority: int
) -> tuple[MatchSpec, ...]:
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


class _Entry:
    """One entry; the pipeline gets it as the opaque handle of lookup()."""

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
    tuple[tuple[int, int, int], ...], tuple[tuple[int, int, int], ...], _Entry, int, int
]


class _Table:
    """Entries of one table and the structures lookup() walks.

    Writers hold the SwitchState lock; lookup() holds none. Every structure lookup() reads is
    either a dict updated one key at a time (atomic under the GIL) or a tuple replaced whole.
    """

    def __init__(self, info: TableInfo, default: ActionCall) -> None:
        self.info = info
        self.initial_default = default
        self.default = _Entry((), 0, default)
        self.entries: dict[tuple[tuple[MatchSpec, ...], int], _Entry] = {}
        self.exact: dict[tuple[int, ...], _Entry] = {}
        self.levels: tuple[tuple[int, int, dict[tuple[int, ...], _Entry]], ...] = ()
        self.rows: tuple[_TernaryRow, ...] = ()
        self._seq = 0
        self.find: Callable[[Sequence[int]], _Entry | None]
        if info.lookup_kind == "exact":
            self.find = self._find_exact
        elif info.lookup_kind == "lpm":
            self.find = self._find_lpm_1 if len(info.fields) == 1 else self._find_lpm
        else:
            self.find = self._find_ternary

    # The three lookups (hot path).
    def _find_exact(self, key: Sequence[int]) -> _Entry | None:
        return self.exact.get(tuple(key))

    def _find_lpm_1(self, key: Sequence[int]) -> _Entry | None:
        v = key[0]
        for _plen, mask, d in self.levels:
            e = d.get((v & mask,))
            if e is not None:
                return e
        return None

    def _find_lpm(self, key: Sequence[int]) -> _Entry | None:
        i = self.info.lpm_index
        k = tuple(key)
        head, v, tail = k[:i], k[i], k[i + 1 :]
        for _plen, mask, d in self.levels:
            e = d.get((*head, v & mask, *tail))
            if e is not None:
                return e
        return None

    def _find_ternary(self, key: Sequence[int]) -> _Entry | None:
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

    def add(self, entry: _Entry) -> None:
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

    def remove(self, entry: _Entry) -> None:
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

    def view(self, entry: _Entry, is_default: bool = False) -> TableEntryView:
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


class _Counter:
    __slots__ = ("info", "packets", "bytes")

    def __init__(self, info: CounterInfo) -> None:
        self.info = info
        self.packets = [0] * info.size
        self.bytes = [0] * info.size


class _Digest:
    """Configuration, pending list and duplicate cache of one digest (under the digest lock)."""

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


class _Pipeline:
    """Everything one SetForwardingPipelineConfig installs; replaced whole by the next one."""

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
        self.tables: dict[str | int, _Table] = {}
        self.counters: dict[str | int, _Counter] = {}
        self.digests: dict[str | int, _Digest] = {}
        self.mc_groups: dict[int, MulticastGroup] = {}
        self.mc_ports: dict[int, tuple[tuple[int, int], ...]] = {}
        self.clone_sessions: dict[int, CloneSession] = {}
        if schema is None:
            return
        defaults = dict(defaults or {})
        for info in schema.tables.values():
            given = defaults.pop(info.name, None) or defaults.pop(info.alias, None)
            table = _Table(info, _initial_default(schema, info, given))
            for ref in _refs(info.id, info.name, info.alias):
                self.tables[ref] = table
        if defaults:
            raise InvalidArgumentError(f"initial defaults for unknown tables: {sorted(defaults)}")
        for cinfo in schema.counters.values():
            counter = _Counter(cinfo)
            for cref in _refs(cinfo.id, cinfo.name, cinfo.alias):
                self.counters[cref] = counter
        for dinfo in schema.digests.values():
            digest = _Digest(dinfo)
            for dref in _refs(dinfo.id, dinfo.name, dinfo.alias):
                self.digests[dref] = digest

    def unique_tables(self) -> list[_Table]:
        return [self.tables[i] for i in (self.schema.tables if self.schema else ())]


def _refs(ident: int, name: str, alias: str) -> set[str | int]:
    """The keys one table, counter or digest is found under: id, name and alias."""
    refs: set[str | int] = {ident, name, alias}
    refs.discard("")
    return refs


def _initial_default(
    schema: PipelineSchema, info: TableInfo, given: ActionCall | None
) -> ActionCall:
    if given is not None:
        return _check_action(schema, info, given, default=True, program=True)
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
    return ActionCall(_NOACTION, {})


def _check_action(
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
    if program and call.action == _NOACTION and _NOACTION not in schema.action_by_name:
        return ActionCall(_NOACTION, {})
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
        _check_width(value, p.bitwidth, f"action {ainfo.name!r} parameter {p.name!r}")
        params[p.name] = value
    return ActionCall(ainfo.name, params)


def _canonical(value: int) -> bytes:
    """P4Runtime canonical bytestring: no leading zero bytes, at least one byte."""
    return value.to_bytes(max(1, (value.bit_length() + 7) // 8), "big")


# ------------------------------------------------------------------------------- the state
StreamSink = Callable[[p4r.StreamMessageResponse], bool]
"""Hands a message to the primary controller's stream; False if there is none to take it."""


class SwitchState:
    """The runtime state of one switch: what the P4 program's tables, counters and PRE hold.

    Per-packet calls (``lookup``, ``count_direct``, ``count``, ``multicast_group``,
    ``emit_digest``, ``emit_packet_in``) take no lock on the lookup path: each pipeline
    structure is a dict changed one key at a time or a tuple replaced whole, and a new program
    replaces the whole set at once (one attribute store), so a lookup sees either the old or
    the new entry, never a torn one. Counter increments take a small lock so that
    concurrent pipeline threads do not lose counts. Control-plane writes and reads hold
    :attr:`lock` (an RLock; hold it around a batch to make it atomic for other writers).

    Args:
        device_id: P4Runtime device id.
        cpu_port: the port whose packets are PacketIn / PacketOut (for the pipeline).

    Attributes:
        packet_out_handler: set by the pipeline; called with (payload, packet_out metadata by
            field name) for every PacketOut from the primary controller, in the gRPC stream's
            thread.
        stats: what was delivered to or dropped before the controller.
    """

    def __init__(self, device_id: int = 1, cpu_port: int = 255) -> None:
        self.device_id = device_id
        self.cpu_port = cpu_port
        self.packet_out_handler: Callable[[bytes, Mapping[str, int]], None] | None = None
        self.stats = SwitchStats()
        self._lock = threading.RLock()
        self._counter_lock = threading.Lock()
        self._digest_lock = threading.Lock()
        self._pipe = _Pipeline(None)
        self._sink: StreamSink | None = None
        self._warned: set[str] = set()

    # ------------------------------------------------------------------ program
    def set_pipeline(
        self,
        p4info: p4i.P4Info,
        device_config: bytes = b"",
        initial_defaults: Mapping[str, ActionCall] | None = None,
        *,
        cookie: int | None = None,
        reconcile: bool = False,
    ) -> None:
        """Installs a program, replacing the previous one and everything written for it.

        Args:
            p4info: the program's P4Info.
            device_config: empty, or the program's BMv2 JSON (kept for
                GetForwardingPipelineConfig; see :func:`check_device_config`).
            initial_defaults: table name -> the program's default action (P4Info carries no
                default parameters); other tables default to the P4Info initial default action,
                else the const default action, else NoAction.
            cookie: ForwardingPipelineConfig cookie, if the controller sent one.
            reconcile: keep table entries (with their direct counters), default actions set by
                the controller, multicast groups, clone sessions and digest configurations
                whose ids exist in the new P4Info (RECONCILE_AND_COMMIT); indirect counters
                restart at zero. If any kept entry is invalid under the new P4Info, nothing
                changes.

        Raises:
            InvalidArgumentError: bad P4Info, device config or initial defaults.
            UnimplementedError: the P4Info uses something the reference target lacks.
            FailedPreconditionError: reconcile could not carry an entry over.
        """
        schema = PipelineSchema(p4info)
        check_device_config(schema, bytes(device_config))
        new = _Pipeline(schema, bytes(device_config), cookie, initial_defaults)
        with self._lock:
            old = self._pipe
            if reconcile and old.schema is not None:
                _reconcile(old, new)
            with self._digest_lock:
                for digest in set(old.digests.values()):
                    digest.reset()
            self._pipe = new
            self._warned.clear()
        _LOG.info("pipeline installed: %s", p4info.pkg_info.name or "(unnamed)")

    @property
    def ready(self) -> bool:
        """A pipeline is installed."""
        return self._pipe.schema is not None

    @property
    def schema(self) -> PipelineSchema | None:
        """The installed program's P4Info, indexed; None before the first one."""
        return self._pipe.schema

    @property
    def p4info(self) -> p4i.P4Info | None:
        """The installed program's P4Info."""
        schema = self._pipe.schema
        return schema.p4info if schema is not None else None

    @property
    def device_config(self) -> bytes:
        """The installed program's device config blob."""
        return self._pipe.device_config

    @property
    def cookie(self) -> int | None:
        """The installed program's ForwardingPipelineConfig cookie, if it had one."""
        return self._pipe.cookie

    @property
    def lock(self) -> threading.RLock:
        """The control-plane lock; hold it to make several writes or reads one batch."""
        return self._lock

    def set_stream_sink(self, sink: StreamSink | None) -> None:
        """Sets where PacketIn and DigestList messages go (the P4Runtime server's primary)."""
        self._sink = sink

    def _require(self) -> PipelineSchema:
        schema = self._pipe.schema
        if schema is None:
            raise FailedPreconditionError("No forwarding pipeline config set for this device")
        return schema

    def _table(self, table: str | int) -> _Table:
        self._require()
        try:
            return self._pipe.tables[table]
        except KeyError:
            raise InvalidArgumentError(f"Invalid P4 id: no table {table!r}") from None

    # ------------------------------------------------------------------ per packet
    def lookup(self, table: str, key: Sequence[int]) -> tuple[ActionCall, object | None]:
        """Matches a key against a table.

        Args:
            table: table name (or alias).
            key: one int per key field, in P4Info order.

        Returns:
            The matching entry's action and an opaque handle for count_direct, or the default
            action and None on a miss.

        Raises:
            NotFoundError: no such table (or no pipeline).
        """
        try:
            t = self._pipe.tables[table]
        except KeyError:
            raise NotFoundError(f"no table {table!r} in the installed pipeline") from None
        entry = t.find(key)
        if entry is None:
            return t.default.action, None
        return entry.action, entry

    def count_direct(self, entry: object | None, packets: int = 1, nbytes: int = 0) -> None:
        """Adds to the direct counter of the entry lookup() returned; no-op for None."""
        if isinstance(entry, _Entry):
            with self._counter_lock:
                entry.packets += packets
                entry.bytes += nbytes

    def count(self, counter: str, index: int, packets: int = 1, nbytes: int = 0) -> None:
        """Adds to one cell of an indirect counter; an index outside it is ignored (logged once).

        Raises:
            NotFoundError: no such counter.
        """
        try:
            c = self._pipe.counters[counter]
        except KeyError:
            raise NotFoundError(f"no counter {counter!r} in the installed pipeline") from None
        if 0 <= index < c.info.size:
            with self._counter_lock:
                c.packets[index] += packets
                c.bytes[index] += nbytes
            return
        self.stats.counter_index_errors += 1
        if counter not in self._warned:
            self._warned.add(counter)
            _LOG.warning("counter %s: index %d outside 0..%d ignored", counter, index, c.info.size)

    def multicast_group(self, group_id: int) -> Sequence[tuple[int, int]]:
        """The (egress_port, instance) replicas of a multicast group; empty if unknown."""
        return self._pipe.mc_ports.get(group_id, ())

    def clone_session(self, session_id: int) -> CloneSession | None:
        """A clone session, or None if unknown."""
        return self._pipe.clone_sessions.get(session_id)

    def emit_digest(self, digest: str, values: Sequence[int]) -> None:
        """Sends one digest sample towards the primary controller.

        The sample is dropped (``stats.digests_unconfigured``) unless a DigestEntry configured
        the digest, as on BMv2. Samples are batched per DigestConfig and sent as DigestList
        messages (list ids from 1, wall-clock timestamps in ns, members as canonical
        bitstrings).

        Args:
            digest: digest name as in P4Info (the struct type name, e.g. "hot_miss_digest_t").
            values: the struct members in order.

        Raises:
            NotFoundError: no such digest.
            InvalidArgumentError: wrong number of values or a value too wide.
        """
        try:
            d = self._pipe.digests[digest]
        except KeyError:
            raise NotFoundError(f"no digest {digest!r} in the installed pipeline") from None
        msg = None
        with self._digest_lock:
            config = d.config
            if config is None:
                self.stats.digests_unconfigured += 1
                return
            widths = d.info.bitwidths
            if len(values) != len(widths):
                raise InvalidArgumentError(
                    f"digest {d.info.name!r} has {len(widths)} members, got {len(values)}"
                )
            key = tuple(values)
            for v, w in zip(key, widths, strict=True):
                _check_width(v, w, f"digest {d.info.name!r}")
            if config.ack_timeout_ns > 0:
                _expire_unacked(d, time.monotonic_ns())
                if key in d.cache:
                    self.stats.digests_suppressed += 1
                    return
                d.cache.add(key)
                d.pending_keys.append(key)
            members = [p4d.P4Data(bitstring=_canonical(v)) for v in key]
            if d.info.shape == "struct":
                data = p4d.P4Data(struct=p4d.P4StructLike(members=members))
            elif d.info.shape == "tuple":
                data = p4d.P4Data(tuple=p4d.P4StructLike(members=members))
            else:
                data = members[0]
            d.pending.append(data)
            full = config.max_list_size > 0 and len(d.pending) >= config.max_list_size
            if config.max_timeout_ns == 0 or full:
                msg = _flush(d)
            elif d.timer is None:
                d.timer = threading.Timer(config.max_timeout_ns / 1e9, self._flush_later, (d,))
                d.timer.daemon = True
                d.timer.start()
        if msg is not None:
            self._deliver_digest(msg)

    def _flush_later(self, d: _Digest) -> None:
        with self._digest_lock:
            d.timer = None
            msg = _flush(d) if d.pending and d.config is not None else None
        if msg is not None:
            self._deliver_digest(msg)

    def _deliver_digest(self, msg: p4r.StreamMessageResponse) -> None:
        sink = self._sink
        if sink is not None and sink(msg):
            self.stats.digest_lists_sent += 1
        else:
            self.stats.digest_lists_dropped += 1

    def emit_packet_in(self, payload: bytes, metadata: Mapping[str, int]) -> None:
        """Sends a PacketIn to the primary controller (dropped, and counted, if none).

        Args:
            payload: the packet, without the packet_in header.
            metadata: packet_in header fields by P4Info name; missing ones are 0, unknown names
                are ignored (logged once).

        Raises:
            InvalidArgumentError: a metadata value is too wide for its field.
        """
        sink = self._sink
        if sink is None:
            self.stats.packet_ins_dropped += 1
            return
        schema = self._pipe.schema
        cpm = schema.packet_in if schema is not None else None
        md: list[p4r.PacketMetadata] = []
        if cpm is not None:
            for f in cpm.fields:
                v = metadata.get(f.name, 0)
                _check_width(v, f.bitwidth, f"packet_in metadata {f.name!r}")
                md.append(p4r.PacketMetadata(metadata_id=f.id, value=_canonical(v)))
            if "packet_in" not in self._warned:
                unknown = sorted(k for k in metadata if k not in cpm.by_name)
                if unknown:
                    self._warned.add("packet_in")
                    _LOG.warning("packet_in metadata %s not in P4Info: ignored", unknown)
        msg = p4r.StreamMessageResponse(packet=p4r.PacketIn(payload=payload, metadata=md))
        if sink(msg):
            self.stats.packet_ins_sent += 1
        else:
            self.stats.packet_ins_dropped += 1

    # ------------------------------------------------------------------ tables
    def insert_entry(
        self,
        table: str | int,
        match: Sequence[MatchSpec],
        action: ActionCall,
        *,
        priority: int = 0,
        counter: tuple[int, int] | None = None,
        metadata: bytes = b"",
        controller_metadata: int = 0,
        idle_timeout_ns: int = 0,
    ) -> None:
        """Adds an entry (const tables included: the program may install its const entries).

        Args:
            table: table id, name or alias.
            match: one MatchSpec per key field, in P4Info order.
            action: the entry's action (by P4Info name or alias).
            priority: required (> 0) iff a key field is ternary, range or optional.
            counter: initial direct counter (packets, bytes); only for tables with one.
            metadata: opaque controller cookie.
            controller_metadata: deprecated integer cookie.
            idle_timeout_ns: accepted for tables that support idle timeout; never fires.

        Raises:
            InvalidArgumentError: bad key, action or parameters.
            PermissionDeniedError: the action's scope forbids it here.
            AlreadyExistsError: an entry with this key and priority exists.
            ResourceExhaustedError: the table is full.
        """
        with self._lock:
            t = self._table(table)
            schema = self._require()
            specs = _normalize_match(t.info, match, priority)
            call = _check_action(schema, t.info, action, default=False)
            _check_extras(t.info, counter, idle_timeout_ns)
            if (specs, priority) in t.entries:
                raise AlreadyExistsError(
                    "Match entry exists, use MODIFY if you wish to change action"
                )
            if 0 < t.info.size <= len(t.entries):
                raise ResourceExhaustedError(f"Table {t.info.name!r} is full ({t.info.size})")
            entry = _Entry(specs, priority, call)
            _set_extras(entry, counter, metadata, controller_metadata, idle_timeout_ns)
            t.add(entry)

    def modify_entry(
        self,
        table: str | int,
        match: Sequence[MatchSpec],
        action: ActionCall,
        *,
        priority: int = 0,
        counter: tuple[int, int] | None = None,
        metadata: bytes = b"",
        controller_metadata: int = 0,
        idle_timeout_ns: int = 0,
    ) -> None:
        """Changes the action (and cookies, and the direct counter if given) of an entry.

        Raises:
            NotFoundError: no entry with this key and priority.
            InvalidArgumentError, PermissionDeniedError: as for insert_entry.
        """
        with self._lock:
            t = self._table(table)
            schema = self._require()
            specs = _normalize_match(t.info, match, priority)
            call = _check_action(schema, t.info, action, default=False)
            _check_extras(t.info, counter, idle_timeout_ns)
            entry = t.entries.get((specs, priority))
            if entry is None:
                raise NotFoundError("Cannot find match entry")
            entry.action = call
            with self._counter_lock:
                _set_extras(entry, counter, metadata, controller_metadata, idle_timeout_ns)

    def delete_entry(
        self, table: str | int, match: Sequence[MatchSpec], *, priority: int = 0
    ) -> None:
        """Removes an entry.

        Raises:
            NotFoundError: no entry with this key and priority.
            InvalidArgumentError: bad key.
        """
        with self._lock:
            t = self._table(table)
            specs = _normalize_match(t.info, match, priority)
            entry = t.entries.get((specs, priority))
            if entry is None:
                raise NotFoundError("Cannot find match entry")
            t.remove(entry)

    def set_default_action(
        self,
        table: str | int,
        action: ActionCall | None,
        *,
        counter: tuple[int, int] | None = None,
    ) -> None:
        """Sets a table's default action, or with None restores the program's initial one.

        Raises:
            PermissionDeniedError: the table has a const default action, or the action is
                TABLE_ONLY.
            InvalidArgumentError: bad action, or the table is indirect.
        """
        with self._lock:
            t = self._table(table)
            schema = self._require()
            if t.info.implementation_id:
                raise InvalidArgumentError(
                    f"Cannot set / reset default action for indirect table {t.info.name!r}"
                )
            if t.info.const_default_action_id:
                raise PermissionDeniedError(
                    f"Cannot set / reset default action for table {t.info.name!r} which has a "
                    "const default action"
                )
            call = (
                t.initial_default
                if action is None
                else _check_action(schema, t.info, action, default=True)
            )
            _check_extras(t.info, counter, 0)
            t.default.action = call
            if counter is not None:
                with self._counter_lock:
                    t.default.packets, t.default.bytes = counter

    def entries(self, table: str | int) -> list[TableEntryView]:
        """All entries of a table (not the default one), in insertion order."""
        with self._lock:
            t = self._table(table)
            return [t.view(e) for e in t.entries.values()]

    def get_entry(
        self, table: str | int, match: Sequence[MatchSpec], *, priority: int = 0
    ) -> TableEntryView | None:
        """The entry with exactly this key and priority, or None.

        Raises:
            InvalidArgumentError: bad key.
        """
        with self._lock:
            t = self._table(table)
            entry = t.entries.get((_normalize_match(t.info, match, priority), priority))
            return t.view(entry) if entry is not None else None

    def default_entry(self, table: str | int) -> TableEntryView:
        """The default entry of a table."""
        with self._lock:
            t = self._table(table)
            return t.view(t.default, is_default=True)

    def set_direct_counter(
        self,
        table: str | int,
        match: Sequence[MatchSpec] | None,
        packets: int,
        nbytes: int,
        *,
        priority: int = 0,
    ) -> None:
        """Sets the direct counter of an entry (match None: of the default entry).

        Raises:
            InvalidArgumentError: the table has no direct counter, or no such entry (PI's code).
        """
        with self._lock:
            t = self._table(table)
            if not t.info.direct_counter_id:
                raise InvalidArgumentError("Table has no direct counters")
            if match is None:
                entry: _Entry | None = t.default
            else:
                entry = t.entries.get((_normalize_match(t.info, match, priority), priority))
            if entry is None:
                raise InvalidArgumentError("Cannot map table entry to handle")
            with self._counter_lock:
                entry.packets, entry.bytes = packets, nbytes

    def direct_counter_value(self, table: str, key: Sequence[int]) -> tuple[int, int]:
        """The direct counter (packets, bytes) of the entry a lookup of ``key`` hits.

        Raises:
            NotFoundError: the key hits no entry.
        """
        _, entry = self.lookup(table, key)
        if not isinstance(entry, _Entry):
            raise NotFoundError(f"{table}: no entry matches {list(key)}")
        return entry.packets, entry.bytes

    # ------------------------------------------------------------------ counters
    def _counter(self, counter: str | int) -> _Counter:
        schema = self._require()
        cinfo = schema.counter(counter)
        return self._pipe.counters[cinfo.id]

    def set_counter(self, counter: str | int, index: int | None, packets: int, nbytes: int) -> None:
        """Sets one cell of an indirect counter, or every cell if index is None.

        Raises:
            InvalidArgumentError: no such counter, or a negative index.
            OutOfRangeError: index beyond the counter's size.
        """
        with self._lock:
            c = self._counter(counter)
            indices = range(c.info.size) if index is None else (_check_index(c.info, index),)
            with self._counter_lock:
                for i in indices:
                    c.packets[i], c.bytes[i] = packets, nbytes

    def counter_value(self, counter: str, index: int) -> tuple[int, int]:
        """(packets, bytes) of one counter cell.

        Raises:
            InvalidArgumentError: no such counter, or a negative index.
            OutOfRangeError: index beyond the counter's size.
        """
        c = self._counter(counter)
        i = _check_index(c.info, index)
        return c.packets[i], c.bytes[i]

    def counter_values(self, counter: str | int) -> list[tuple[int, int]]:
        """(packets, bytes) of every cell of a counter."""
        c = self._counter(counter)
        with self._counter_lock:
            return list(zip(c.packets, c.bytes, strict=True))

    # ------------------------------------------------------------------ replication engine
    def write_multicast_group(
        self,
        op: WriteOp,
        group_id: int,
        replicas: Iterable[Replica] = (),
        metadata: bytes = b"",
    ) -> None:
        """Inserts, modifies or deletes a multicast group.

        Raises:
            InvalidArgumentError: group 0, or a duplicate (port, instance).
            OutOfRangeError: group id in the reserved range.
            AlreadyExistsError / NotFoundError: as the operation requires.
        """
        if group_id == 0:
            raise InvalidArgumentError("0 is not a valid group id")
        if group_id >= MULTICAST_GROUP_ID_LIMIT:
            raise OutOfRangeError("Group id value is too high")
        reps = _check_replicas(replicas, "multicast group")
        with self._lock:
            self._require()
            groups = self._pipe.mc_groups
            _check_op(op, group_id in groups, "Multicast group")
            if op == WriteOp.DELETE:
                del groups[group_id]
                del self._pipe.mc_ports[group_id]
                return
            groups[group_id] = MulticastGroup(group_id, reps, metadata)
            self._pipe.mc_ports[group_id] = tuple((r.port, r.instance) for r in reps)

    def multicast_groups(self) -> list[MulticastGroup]:
        """All multicast groups, by group id."""
        with self._lock:
            return [self._pipe.mc_groups[g] for g in sorted(self._pipe.mc_groups)]

    def write_clone_session(self, op: WriteOp, session: CloneSession) -> None:
        """Inserts, modifies or deletes a clone session (stored for the pipeline and reads).

        Raises:
            InvalidArgumentError: session 0, or a duplicate (port, instance).
            AlreadyExistsError / NotFoundError: as the operation requires.
        """
        if session.session_id == 0:
            raise InvalidArgumentError("0 is not a valid session id")
        _check_replicas(session.replicas, "clone session")
        with self._lock:
            self._require()
            sessions = self._pipe.clone_sessions
            _check_op(op, session.session_id in sessions, "Clone session")
            if op == WriteOp.DELETE:
                del sessions[session.session_id]
            else:
                sessions[session.session_id] = session

    def clone_sessions(self) -> list[CloneSession]:
        """All clone sessions, by session id."""
        with self._lock:
            return [self._pipe.clone_sessions[s] for s in sorted(self._pipe.clone_sessions)]

    # ------------------------------------------------------------------ digests
    def write_digest_config(
        self, op: WriteOp, digest: str | int, config: DigestConfig | None = None
    ) -> None:
        """Configures (INSERT / MODIFY) or unconfigures (DELETE) a digest, as a DigestEntry does.

        Raises:
            NotFoundError: no such digest, or MODIFY / DELETE of an unconfigured one.
            AlreadyExistsError: INSERT of a configured one.
        """
        with self._lock:
            d = self._digest(digest)
            msg = None
            with self._digest_lock:
                if op == WriteOp.INSERT and d.config is not None:
                    raise AlreadyExistsError(f"Digest {d.info.id} already configured")
                if op != WriteOp.INSERT and d.config is None:
                    raise NotFoundError(f"Digest {d.info.id} not configured")
                if op == WriteOp.DELETE:
                    d.reset()
                    return
                d.config = config or DigestConfig()
                if d.pending and d.config.max_timeout_ns == 0:
                    msg = _flush(d)
            if msg is not None:
                self._deliver_digest(msg)

    def digest_config(self, digest: str | int) -> DigestConfig | None:
        """A digest's configuration, or None if unconfigured.

        Raises:
            NotFoundError: no such digest.
        """
        with self._lock:
            return self._digest(digest).config

    def ack_digest_list(self, digest: str | int, list_id: int) -> None:
        """DigestListAck: lets the samples of that list through again. Unknown ids are ignored."""
        d = self._pipe.digests.get(digest)
        if d is None:
            return
        with self._digest_lock:
            acked = d.unacked.pop(list_id, None)
            if acked is not None:
                d.cache.difference_update(acked[1])

    def _digest(self, digest: str | int) -> _Digest:
        schema = self._require()
        return self._pipe.digests[schema.digest(digest).id]


# ----------------------------------------------------------------------------------- helpers
def _check_extras(info: TableInfo, counter: tuple[int, int] | None, idle_timeout_ns: int) -> None:
    if counter is not None and not info.direct_counter_id:
        raise InvalidArgumentError("Table has no direct counters")
    if idle_timeout_ns < 0:
        raise InvalidArgumentError("idle_timeout_ns must be a positive value")
    if idle_timeout_ns > 0 and not info.supports_idle_timeout:
        raise InvalidArgumentError(
            "idle_timeout_ns must be set to 0 for tables which do not support idle timeout"
        )


def _set_extras(
    entry: _Entry,
    counter: tuple[int, int] | None,
    metadata: bytes,
    controller_metadata: int,
    idle_timeout_ns: int,
) -> None:
    if counter is not None:
        entry.packets, entry.bytes = counter
    entry.metadata = bytes(metadata)
    entry.controller_metadata = controller_metadata
    entry.idle_timeout_ns = idle_timeout_ns


def _check_index(info: CounterInfo, index: int) -> int:
    if index < 0:
        raise InvalidArgumentError("A negative number is not a valid index value")
    if index >= info.size:
        raise OutOfRangeError(f"Index {index} out of range for counter {info.name!r} ({info.size})")
    return index


def _check_replicas(replicas: Iterable[Replica], what: str) -> tuple[Replica, ...]:
    reps = tuple(replicas)
    if len({(r.port, r.instance) for r in reps}) != len(reps):
        raise InvalidArgumentError(f"Duplicate replica in {what}")
    return reps


def _check_op(op: WriteOp, exists: bool, what: str) -> None:
    if op == WriteOp.INSERT and exists:
        raise AlreadyExistsError(f"{what} already exists")
    if op != WriteOp.INSERT and not exists:
        raise NotFoundError(f"{what} does not exist")


def _flush(d: _Digest) -> p4r.StreamMessageResponse:
    """Turns the pending samples into a DigestList (caller holds the digest lock)."""
    assert d.config is not None
    msg = p4r.StreamMessageResponse(
        digest=p4r.DigestList(
            digest_id=d.info.id,
            list_id=d.next_list_id,
            data=d.pending,
            timestamp=time.time_ns(),
        )
    )
    if d.pending_keys:
        deadline = time.monotonic_ns() + d.config.ack_timeout_ns
        d.unacked[d.next_list_id] = (deadline, d.pending_keys)
    d.next_list_id += 1
    d.pending = []
    d.pending_keys = []
    if d.timer is not None:
        d.timer.cancel()
        d.timer = None
    return msg


def _expire_unacked(d: _Digest, now: int) -> None:
    for list_id in [i for i, (deadline, _) in d.unacked.items() if deadline <= now]:
        d.cache.difference_update(d.unacked.pop(list_id)[1])


def _reconcile(old: _Pipeline, new: _Pipeline) -> None:
    """Carries what was written for ``old`` over to ``new`` by P4 id (RECONCILE_AND_COMMIT)."""
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
                norm = _normalize_match(nt.info, specs, e.priority)
                call = _check_action(schema, nt.info, _by_id(old, schema, e.action), default=False)
                entry = _Entry(norm, e.priority, call)
                counter = (e.packets, e.bytes) if nt.info.direct_counter_id else None
                _set_extras(entry, counter, e.metadata, e.controller_metadata, 0)
                nt.add(entry)
            if t.default.action != t.initial_default:
                nt.default.action = _check_action(
                    schema, nt.info, _by_id(old, schema, t.default.action), default=True
                )
        except SwitchStateError as err:
            raise FailedPreconditionError(
                f"Error when reconciling config: table {t.info.name!r}: {err}"
            ) from err
    new.mc_groups.update(old.mc_groups)
    new.mc_ports.update(old.mc_ports)
    new.clone_sessions.update(old.clone_sessions)
    for d in set(old.digests.values()):
        nd = new.digests.get(d.info.id)
        if nd is not None and d.config is not None:
            nd.config = d.config


def _by_id(old: _Pipeline, schema: PipelineSchema, call: ActionCall) -> ActionCall:
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
