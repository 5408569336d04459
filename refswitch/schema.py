"""What the reference target derives from a program's P4Info, indexed by id and by name.

Nothing here changes after a program is installed: :class:`PipelineSchema` is built once per
SetForwardingPipelineConfig and read by the runtime (:mod:`refswitch.state`), the table
validation (:mod:`refswitch.tables`) and the P4Runtime translation (:mod:`refswitch.p4rt_entities`).

Classes:
    PipelineSchema: the P4Info indexed by id and by name (or alias); refuses a P4Info that is
        inconsistent or uses what the target lacks.
    TableInfo, FieldInfo, ActionInfo, ParamInfo, CounterInfo, DigestInfo, PacketMetadataInfo:
        one P4Info entity each, as the runtime needs it.
    MatchKind, ActionScope, CounterUnit: P4Info enums, numbered as in p4.config.v1.

Functions:
    check_device_config: refuses a p4_device_config that is not the reference target's.
    check_width: refuses a value wider than its P4Info bit width.
    canonical_bytes: an int as a P4Runtime canonical bytestring.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

from finsy.proto import p4i, p4t

from refswitch.errors import InvalidArgumentError, NotFoundError, UnimplementedError

_T = TypeVar("_T")


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
class _Named:
    """What a P4Info preamble gives every entity with an alias: its id, name and alias."""

    id: int
    name: str
    alias: str


@dataclass(frozen=True, eq=False)
class ActionInfo(_Named):
    """An action and its parameters in P4Info order."""

    params: tuple[ParamInfo, ...]
    param_by_id: Mapping[int, ParamInfo]
    param_by_name: Mapping[str, ParamInfo]


@dataclass(frozen=True, eq=False)
class TableInfo(_Named):
    """A table: key fields in P4Info order, allowed actions and attached resources.

    Attributes:
        lookup_kind: "exact" (every field exact), "lpm" (one lpm field, the rest exact) or
            "ternary" (anything else: entries tried in priority order).
        lpm_index: position of the lpm field when lookup_kind is "lpm".
        needs_priority: some field is ternary, range or optional (P4Runtime's rule).
    """

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
class CounterInfo(_Named):
    """An indirect counter array, or a direct counter (size 0, table_id set)."""

    unit: CounterUnit
    size: int = 0
    table_id: int = 0


@dataclass(frozen=True)
class DigestInfo(_Named):
    """A digest: P4Data shape ("struct", "tuple" or "bitstring") and member bit widths."""

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


def _named(ref: int | str, by_id: Mapping[int, _T], by_name: Mapping[str, _T]) -> _T | None:
    if isinstance(ref, int):
        return by_id.get(ref)
    return by_name.get(ref)


def _known(ref: int | str, by_id: Mapping[int, _T], by_name: Mapping[str, _T], what: str) -> _T:
    """The entity ``ref`` names (its id, name or alias).

    Raises:
        InvalidArgumentError: no such ``what`` (PI's "Invalid P4 id").
    """
    info = _named(ref, by_id, by_name)
    if info is None:
        raise InvalidArgumentError(f"Invalid P4 id: no {what} {ref!r}")
    return info


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
        return _known(ref, self.tables, self.table_by_name, "table")

    def action(self, ref: int | str) -> ActionInfo:
        """The action with this id, name or alias.

        Raises:
            InvalidArgumentError: no such action.
        """
        return _known(ref, self.actions, self.action_by_name, "action")

    def counter(self, ref: int | str) -> CounterInfo:
        """The indirect counter with this id, name or alias.

        Raises:
            InvalidArgumentError: no such counter, or it is a direct counter.
        """
        if isinstance(ref, int) and ref not in self.counters and ref in self.direct_counters:
            raise InvalidArgumentError("Cannot use CounterEntry with a direct counter")
        return _known(ref, self.counters, self.counter_by_name, "counter")

    def digest(self, ref: int | str) -> DigestInfo:
        """The digest with this id, name or alias.

        Raises:
            NotFoundError: no such digest (PI's code for it).
        """
        info = _named(ref, self.digests, self.digest_by_name)
        if info is None:
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


def check_width(value: int, bitwidth: int, what: str) -> None:
    """Refuses a value that is negative or wider than ``bitwidth`` bits.

    Raises:
        InvalidArgumentError: naming ``what`` (e.g. "match field 'key'").
    """
    if value < 0 or value >> bitwidth:
        raise InvalidArgumentError(f"{what}: value {value:#x} does not fit within {bitwidth} bits")


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


def canonical_bytes(value: int) -> bytes:
    """P4Runtime canonical bytestring: no leading zero bytes, at least one byte."""
    return value.to_bytes(max(1, (value.bit_length() + 7) // 8), "big")
