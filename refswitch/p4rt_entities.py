"""P4Runtime entities of the reference target: reads and writes translated to SwitchState calls.

Bytestrings exist only here: a Write's entities are decoded into the state's int values and
checked as PI checks them; a Read's answer is encoded with canonical bytestrings. The gRPC
servicer (:mod:`refswitch.p4rt_server`) owns the requests; this module owns their entities.

Classes:
    EntityIO: Write updates and Read entities over one SwitchState.
    WriteError: some updates of a Write failed; one p4.v1.Error per update.

Functions:
    decode_packet_out: a PacketOut's metadata by field name, checked against the P4Info.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NoReturn, TypeVar

from finsy.proto import p4r, rpc_code

from refswitch.digests import DigestConfig
from refswitch.errors import (
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    PermissionDeniedError,
    SwitchStateError,
    UnimplementedError,
    WriteOp,
)
from refswitch.replication import CloneSession, MulticastGroup, Replica
from refswitch.schema import (
    CounterInfo,
    CounterUnit,
    MatchKind,
    PipelineSchema,
    TableInfo,
    canonical_bytes,
)
from refswitch.state import SwitchState
from refswitch.tables import ActionCall, Lpm, MatchSpec, Range, TableEntryView, Ternary

_T = TypeVar("_T")

ERROR_SPACE = "ALL-sswitch-p4org"
"""p4.v1.Error.space of the errors PI reports for simple_switch_grpc."""

_UPDATE_OPS = {p4r.Update.INSERT: WriteOp.INSERT, p4r.Update.MODIFY: WriteOp.MODIFY}
_UPDATE_OPS[p4r.Update.DELETE] = WriteOp.DELETE
_MATCH_ONEOF = {
    MatchKind.EXACT: "exact",
    MatchKind.LPM: "lpm",
    MatchKind.TERNARY: "ternary",
    MatchKind.RANGE: "range",
    MatchKind.OPTIONAL: "optional",
}


# ------------------------------------------------------------------------------ bytestrings
def _int(data: bytes) -> int:
    return int.from_bytes(data, "big")


def _width(value: int, bitwidth: int) -> int:
    if value >> bitwidth:
        raise InvalidArgumentError(f"Bytestring provided does not fit within {bitwidth} bits")
    return value


# ------------------------------------------------------------------------ entity translation
def _decode_match(info: TableInfo, matches: Sequence[p4r.FieldMatch]) -> list[MatchSpec]:
    specs: list[MatchSpec] = [None] * len(info.fields)
    seen: set[int] = set()
    for fm in matches:
        pos = info.field_index.get(fm.field_id)
        if pos is None:
            raise InvalidArgumentError("Unknown field in match key")
        if pos in seen:
            raise InvalidArgumentError("Duplicate field in match key")
        seen.add(pos)
        which = fm.WhichOneof("field_match_type")
        if which != _MATCH_ONEOF[info.fields[pos].kind]:
            raise InvalidArgumentError(f"Invalid match type for field {info.fields[pos].name!r}")
        if which == "exact":
            specs[pos] = _int(fm.exact.value)
        elif which == "lpm":
            specs[pos] = Lpm(_int(fm.lpm.value), fm.lpm.prefix_len)
        elif which == "ternary":
            specs[pos] = Ternary(_int(fm.ternary.value), _int(fm.ternary.mask))
        elif which == "range":
            specs[pos] = Range(_int(fm.range.low), _int(fm.range.high))
        else:
            specs[pos] = _int(fm.optional.value)
    return specs


def _encode_match(info: TableInfo, specs: Sequence[MatchSpec]) -> list[p4r.FieldMatch]:
    out: list[p4r.FieldMatch] = []
    for f, s in zip(info.fields, specs, strict=True):
        if s is None:
            continue
        fm = p4r.FieldMatch(field_id=f.id)
        if isinstance(s, Lpm):
            fm.lpm.value, fm.lpm.prefix_len = canonical_bytes(s.value), s.prefix_len
        elif isinstance(s, Ternary):
            fm.ternary.value, fm.ternary.mask = canonical_bytes(s.value), canonical_bytes(s.mask)
        elif isinstance(s, Range):
            fm.range.low, fm.range.high = canonical_bytes(s.low), canonical_bytes(s.high)
        elif f.kind == MatchKind.OPTIONAL:
            fm.optional.value = canonical_bytes(s)
        else:
            fm.exact.value = canonical_bytes(s)
        out.append(fm)
    return out


def _decode_action(schema: PipelineSchema, action: p4r.Action) -> ActionCall:
    info = schema.action(action.action_id)
    if len(action.params) != len(info.params):
        raise InvalidArgumentError("Unexpected number of action parameters")
    params: dict[str, int] = {}
    for p in action.params:
        pinfo = info.param_by_id.get(p.param_id)
        if pinfo is None:
            raise InvalidArgumentError("Unknown action parameter")
        if pinfo.name in params:
            raise InvalidArgumentError("Duplicate action parameter")
        params[pinfo.name] = _width(_int(p.value), pinfo.bitwidth)
    return ActionCall(info.name, params)


def _encode_action(schema: PipelineSchema, call: ActionCall) -> p4r.Action | None:
    info = schema.action_by_name.get(call.action)
    if info is None:
        return None  # NoAction of a program whose P4Info does not list it
    return p4r.Action(
        action_id=info.id,
        params=[
            p4r.Action.Param(param_id=p.id, value=canonical_bytes(call.params.get(p.name, 0)))
            for p in info.params
        ],
    )


def _counter_data(unit: CounterUnit, packets: int, nbytes: int) -> p4r.CounterData:
    data = p4r.CounterData()
    if unit != CounterUnit.BYTES:
        data.packet_count = packets
    if unit != CounterUnit.PACKETS:
        data.byte_count = nbytes
    return data


def _encode_entry(
    schema: PipelineSchema, info: TableInfo, view: TableEntryView, with_counter: bool
) -> p4r.TableEntry:
    te = p4r.TableEntry(
        table_id=info.id,
        match=[] if view.is_default else _encode_match(info, view.match),
        priority=view.priority,
        controller_metadata=view.controller_metadata,
        metadata=view.metadata,
        is_default_action=view.is_default,
        idle_timeout_ns=view.idle_timeout_ns,
    )
    action = _encode_action(schema, view.action)
    if action is not None:
        te.action.action.CopyFrom(action)
    if with_counter and info.direct_counter_id:
        unit = schema.direct_counters[info.direct_counter_id].unit
        te.counter_data.CopyFrom(_counter_data(unit, *view.counter))
    return te


def _decode_replicas(replicas: Sequence[p4r.Replica]) -> list[Replica]:
    out: list[Replica] = []
    for r in replicas:
        if r.backup_replicas:
            raise UnimplementedError("Backup replicas are not supported")
        which = r.WhichOneof("port_kind")
        if which == "egress_port":
            out.append(Replica(r.egress_port, r.instance))
        elif which == "port":
            if not r.port:
                raise InvalidArgumentError("Port must not be the empty string")
            out.append(Replica(_width(_int(r.port), 32), r.instance, port_bytes=True))
        else:
            raise InvalidArgumentError("Missing port in multicast group replica")
    return out


def _encode_replicas(replicas: Sequence[Replica]) -> list[p4r.Replica]:
    return [
        p4r.Replica(port=canonical_bytes(r.port), instance=r.instance)
        if r.port_bytes
        else p4r.Replica(egress_port=r.port, instance=r.instance)
        for r in replicas
    ]


def _encode_group(g: MulticastGroup) -> p4r.MulticastGroupEntry:
    return p4r.MulticastGroupEntry(
        multicast_group_id=g.group_id, replicas=_encode_replicas(g.replicas), metadata=g.metadata
    )


def _encode_session(s: CloneSession) -> p4r.CloneSessionEntry:
    return p4r.CloneSessionEntry(
        session_id=s.session_id,
        replicas=_encode_replicas(s.replicas),
        class_of_service=s.class_of_service,
        packet_length_bytes=s.packet_length_bytes,
    )


def _error(exc: SwitchStateError | None) -> p4r.Error:
    if exc is None:
        return p4r.Error(canonical_code=rpc_code.OK)
    return p4r.Error(canonical_code=exc.code, message=str(exc), space=ERROR_SPACE)


class WriteError(Exception):
    """Some updates of a Write failed; ``errors`` has one p4.v1.Error per update."""

    def __init__(self, errors: list[p4r.Error]) -> None:
        failed = sum(e.canonical_code != rpc_code.OK for e in errors)
        super().__init__(f"Write failed: {failed} of {len(errors)} updates")
        self.errors = errors


class EntityIO:
    """The Write and Read of P4Runtime entities over one SwitchState (PI's behaviour).

    Args:
        state: the switch.
    """

    def __init__(self, state: SwitchState) -> None:
        self.state = state

    def write(self, updates: Sequence[p4r.Update]) -> None:
        """Applies the updates in order under the state lock, going on after a failed one.

        Raises:
            WriteError: some updates failed.
        """
        errors: list[p4r.Error] = []
        with self.state.lock:
            schema = self.state.schema
            assert schema is not None
            for update in updates:
                try:
                    self._update(schema, update)
                    errors.append(_error(None))
                except SwitchStateError as exc:
                    errors.append(_error(exc))
        if any(e.canonical_code != rpc_code.OK for e in errors):
            raise WriteError(errors)

    def read(self, entities: Sequence[p4r.Entity]) -> list[p4r.Entity]:
        """Every entity the requested ones select, read under the state lock.

        Raises:
            SwitchStateError: a request is invalid or names what does not exist.
        """
        out: list[p4r.Entity] = []
        with self.state.lock:
            schema = self.state.schema
            assert schema is not None
            for entity in entities:
                self._read(schema, entity, out)
        return out

    def _update(self, schema: PipelineSchema, update: p4r.Update) -> None:
        op = _UPDATE_OPS.get(update.type)
        if op is None:
            raise InvalidArgumentError("Update type is not set")
        entity = update.entity
        which = entity.WhichOneof("entity")
        if which == "table_entry":
            self._write_table_entry(schema, op, entity.table_entry)
        elif which == "counter_entry":
            ce = entity.counter_entry
            if op == WriteOp.INSERT:
                raise InvalidArgumentError("INSERT update type not supported for counters")
            data = (0, 0) if op == WriteOp.DELETE else _counter_tuple(ce.data)
            index = ce.index.index if ce.HasField("index") else None
            self.state.set_counter(schema.counter(ce.counter_id).id, index, *data)
        elif which == "direct_counter_entry":
            dce = entity.direct_counter_entry
            if not dce.HasField("table_entry"):
                raise InvalidArgumentError("Missing table_entry field in DirectCounterEntry")
            if op == WriteOp.INSERT:
                raise InvalidArgumentError("INSERT update type not supported for counters")
            info, specs = self._entry_key(schema, dce.table_entry)
            data = (0, 0) if op == WriteOp.DELETE else _counter_tuple(dce.data)
            self.state.set_direct_counter(info.id, specs, *data, priority=dce.table_entry.priority)
        elif which == "packet_replication_engine_entry":
            self._write_pre(op, entity.packet_replication_engine_entry)
        elif which == "digest_entry":
            de = entity.digest_entry
            c = de.config
            config = DigestConfig(c.max_timeout_ns, c.max_list_size, c.ack_timeout_ns)
            self.state.write_digest_config(op, schema.digest(de.digest_id).id, config)
        else:
            _refuse(which, "writes")

    def _entry_key(
        self, schema: PipelineSchema, te: p4r.TableEntry
    ) -> tuple[TableInfo, list[MatchSpec] | None]:
        """The table and key of a TableEntry (None for the default entry)."""
        info = schema.table(te.table_id)
        if te.is_default_action:
            if te.match:
                raise InvalidArgumentError("Non-empty key for default entry")
            if te.priority:
                raise InvalidArgumentError("Non-zero priority for default entry")
            return info, None
        return info, _decode_match(info, te.match)

    def _write_table_entry(self, schema: PipelineSchema, op: WriteOp, te: p4r.TableEntry) -> None:
        info, specs = self._entry_key(schema, te)
        if te.HasField("time_since_last_hit"):
            raise InvalidArgumentError("has_time_since_last_hit must not be set in WriteRequest")
        if te.HasField("meter_config") or te.HasField("meter_counter_data"):
            raise UnimplementedError("Meters are not supported by the reference target")
        action: ActionCall | None = None
        if te.HasField("action"):
            kind = te.action.WhichOneof("type")
            if kind != "action":
                if info.implementation_id:
                    raise UnimplementedError("Action profiles are not supported")
                raise InvalidArgumentError("Cannot provide indirect action for direct table")
            action = _decode_action(schema, te.action.action)
        counter = _counter_tuple(te.counter_data) if te.HasField("counter_data") else None
        if specs is None:
            if op != WriteOp.MODIFY:
                raise InvalidArgumentError(f"Cannot use {op.name} for default entry")
            self.state.set_default_action(info.id, action, counter=counter)
            return
        if info.is_const:
            raise PermissionDeniedError(f"Table {info.name!r} is const")
        if op == WriteOp.DELETE:
            self.state.delete_entry(info.id, specs, priority=te.priority)
            return
        if action is None:
            raise InvalidArgumentError("'action' field must be set")
        write = self.state.insert_entry if op == WriteOp.INSERT else self.state.modify_entry
        write(
            info.id,
            specs,
            action,
            priority=te.priority,
            counter=counter,
            metadata=te.metadata,
            controller_metadata=te.controller_metadata,
            idle_timeout_ns=te.idle_timeout_ns,
        )

    def _write_pre(self, op: WriteOp, pre: p4r.PacketReplicationEngineEntry) -> None:
        which = pre.WhichOneof("type")
        if which == "multicast_group_entry":
            mg = pre.multicast_group_entry
            replicas = _decode_replicas(mg.replicas) if op != WriteOp.DELETE else []
            self.state.write_multicast_group(op, mg.multicast_group_id, replicas, mg.metadata)
        elif which == "clone_session_entry":
            cs = pre.clone_session_entry
            replicas = _decode_replicas(cs.replicas) if op != WriteOp.DELETE else []
            session = CloneSession(
                cs.session_id, tuple(replicas), cs.class_of_service, cs.packet_length_bytes
            )
            self.state.write_clone_session(op, session)
        else:
            raise InvalidArgumentError("Invalid PRE operation")

    # -------------------------------------------------------------- Read
    def _read(self, schema: PipelineSchema, entity: p4r.Entity, out: list[p4r.Entity]) -> None:
        which = entity.WhichOneof("entity")
        if which == "table_entry":
            self._read_table_entries(schema, entity.table_entry, out)
        elif which == "counter_entry":
            ce = entity.counter_entry
            infos = (
                list(schema.counters.values())
                if ce.counter_id == 0
                else [schema.counter(ce.counter_id)]
            )
            for info in infos:
                self._read_counter(info, ce, out)
        elif which == "direct_counter_entry":
            self._read_direct_counters(schema, entity.direct_counter_entry, out)
        elif which == "packet_replication_engine_entry":
            self._read_pre(entity.packet_replication_engine_entry, out)
        elif which == "digest_entry":
            ids = (
                [entity.digest_entry.digest_id]
                if entity.digest_entry.digest_id
                else list(schema.digests)
            )
            for digest_id in ids:
                config = self.state.digest_config(schema.digest(digest_id).id)
                if config is None:
                    if entity.digest_entry.digest_id:
                        raise NotFoundError(f"Digest {digest_id} not configured")
                    continue
                de = p4r.DigestEntry(digest_id=digest_id)
                de.config.max_timeout_ns = config.max_timeout_ns
                de.config.max_list_size = config.max_list_size
                de.config.ack_timeout_ns = config.ack_timeout_ns
                out.append(p4r.Entity(digest_entry=de))
        elif which in ("action_profile_member", "action_profile_group"):
            msg = getattr(entity, which)
            if msg.action_profile_id or schema.p4info.action_profiles:
                raise UnimplementedError(
                    "Action profiles are not supported by the reference target"
                )
        else:
            _refuse(which, "reads")

    def _read_table_entries(
        self, schema: PipelineSchema, te: p4r.TableEntry, out: list[p4r.Entity]
    ) -> None:
        with_counter = te.HasField("counter_data")
        infos = list(schema.tables.values()) if te.table_id == 0 else [schema.table(te.table_id)]
        for info in infos:
            if te.is_default_action:
                views = [self.state.default_entry(info.id)]
            elif te.match:
                found = self.state.get_entry(
                    info.id, _decode_match(info, te.match), priority=te.priority
                )
                views = [found] if found is not None else []
            else:
                views = self.state.entries(info.id)
            for view in views:
                entry = _encode_entry(schema, info, view, with_counter)
                out.append(p4r.Entity(table_entry=entry))

    def _read_counter(self, info: CounterInfo, ce: p4r.CounterEntry, out: list[p4r.Entity]) -> None:
        values = self.state.counter_values(info.id)
        if ce.HasField("index"):
            index = ce.index.index
            if index < 0:
                raise InvalidArgumentError("A negative number is not a valid index value")
            if index >= len(values):
                raise OutOfRangeError(f"Index {index} out of range for {info.name!r}")
            cells = [(index, values[index])]
        else:
            cells = list(enumerate(values))
        for i, (packets, nbytes) in cells:
            entry = p4r.CounterEntry(
                counter_id=info.id,
                index=p4r.Index(index=i),
                data=_counter_data(info.unit, packets, nbytes),
            )
            out.append(p4r.Entity(counter_entry=entry))

    def _read_direct_counters(
        self, schema: PipelineSchema, dce: p4r.DirectCounterEntry, out: list[p4r.Entity]
    ) -> None:
        if not dce.HasField("table_entry"):
            raise InvalidArgumentError("Missing table_entry field in DirectCounterEntry")
        te = dce.table_entry
        if te.table_id == 0:
            infos = [t for t in schema.tables.values() if t.direct_counter_id]
        else:
            infos = [schema.table(te.table_id)]
            if not infos[0].direct_counter_id:
                raise InvalidArgumentError("Table has no direct counters")
        for info in infos:
            unit = schema.direct_counters[info.direct_counter_id].unit
            if te.table_id and (te.match or te.is_default_action):
                _, specs = self._entry_key(schema, te)
                view = (
                    self.state.default_entry(info.id)
                    if specs is None
                    else self.state.get_entry(info.id, specs, priority=te.priority)
                )
                if view is None:
                    raise InvalidArgumentError("Cannot map table entry to handle")
                views = [view]
            else:
                views = self.state.entries(info.id)
            for view in views:
                # The entry as a table read returns it (key, priority, action), as PI does.
                entry = p4r.DirectCounterEntry(
                    table_entry=_encode_entry(schema, info, view, with_counter=False),
                    data=_counter_data(unit, *view.counter),
                )
                out.append(p4r.Entity(direct_counter_entry=entry))

    def _read_pre(self, pre: p4r.PacketReplicationEngineEntry, out: list[p4r.Entity]) -> None:
        which = pre.WhichOneof("type")
        if which == "multicast_group_entry":
            gid = pre.multicast_group_entry.multicast_group_id
            groups = self.state.multicast_groups()
            for g in _selected(groups, gid, lambda g: g.group_id, "Multicast group"):
                out.append(_pre_entity(_encode_group(g)))
        elif which == "clone_session_entry":
            sid = pre.clone_session_entry.session_id
            sessions = self.state.clone_sessions()
            for s in _selected(sessions, sid, lambda s: s.session_id, "Clone session"):
                out.append(_pre_entity(_encode_session(s)))
        else:
            raise InvalidArgumentError("Invalid PRE operation")


def _selected(items: list[_T], ident: int, key: Callable[[_T], int], what: str) -> list[_T]:
    """The items a read selects: all for id 0, else the one with that id.

    Raises:
        NotFoundError: a non-zero id that no item has.
    """
    chosen = [x for x in items if ident in (0, key(x))]
    if ident and not chosen:
        raise NotFoundError(f"{what} does not exist")
    return chosen


def _pre_entity(entry: p4r.MulticastGroupEntry | p4r.CloneSessionEntry) -> p4r.Entity:
    if isinstance(entry, p4r.MulticastGroupEntry):
        pre = p4r.PacketReplicationEngineEntry(multicast_group_entry=entry)
    else:
        pre = p4r.PacketReplicationEngineEntry(clone_session_entry=entry)
    return p4r.Entity(packet_replication_engine_entry=pre)


_UNSUPPORTED = {
    "action_profile_member": "Action profiles are not supported by the reference target",
    "action_profile_group": "Action profiles are not supported by the reference target",
    "meter_entry": "Meters are not supported by the reference target",
    "direct_meter_entry": "Meters are not supported by the reference target",
    "register_entry": "Register {verb} are not supported yet",
    "value_set_entry": "ValueSet {verb} are not supported yet",
    "extern_entry": "No extern support yet",
}
"""What PI answers for the entities it does not serve (the target serves none of them)."""


def _refuse(which: str | None, verb: str) -> NoReturn:
    """Raises PI's error for an entity kind the target does not read or write."""
    message = _UNSUPPORTED.get(which or "")
    if message is None:
        raise SwitchStateError("Incorrect entity type")
    raise UnimplementedError(message.format(verb=verb))


def _counter_tuple(data: p4r.CounterData) -> tuple[int, int]:
    return data.packet_count, data.byte_count


def decode_packet_out(schema: PipelineSchema, packet: p4r.PacketOut) -> dict[str, int]:
    """The packet_out metadata of a PacketOut by field name (0 for the fields it omits).

    Raises:
        InvalidArgumentError: metadata the program has no packet_out header for, an unknown
            metadata id or a value too wide.
    """
    cpm = schema.packet_out
    if cpm is None:
        if packet.metadata:
            raise InvalidArgumentError("Unexpected metadata in PacketOut message")
        return {}
    metadata = {f.name: 0 for f in cpm.fields}
    for md in packet.metadata:
        f = cpm.by_id.get(md.metadata_id)
        if f is None:
            raise InvalidArgumentError("Unknown metadata id in PacketOut message")
        metadata[f.name] = _width(_int(md.value), f.bitwidth)
    return metadata
