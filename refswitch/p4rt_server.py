"""P4Runtime gRPC server of the reference target, behaving like simple_switch_grpc's (PI).

The same control plane (finsy, p4runtime-shell) drives this server and BMv2, so it copies PI's
observable behaviour: error codes, per-update errors of a Write, arbitration (including PI's
promotion of the next backup when the primary leaves), accepting non-canonical bytestrings and
answering with canonical ones. Messages carry PI's wording where PI has one, often with the
entity named; they are not compared. Where PI answers UNKNOWN because its BMv2 backend failed,
or breaks the spec, this server answers the spec's code: tests/conformance/test_p4rt_shell.py
drives both with p4runtime-shell and lists each remaining difference with its reason
(docs/controlplane.md).

Classes:
    P4RuntimeServer: owns the grpc server; start / stop / serve_forever; one per SwitchState.
    ServerStartError: the server could not bind its address.

Behaviour worth knowing (PI's unless said otherwise):
    * Write, Read, Get/SetForwardingPipelineConfig answer FAILED_PRECONDITION "No forwarding
      pipeline config set for this device" before a pipeline is set. A device_id other than the
      SwitchState's is NOT_FOUND (the spec's code; PI would create a new device).
    * Write and SetForwardingPipelineConfig are for the primary only (PERMISSION_DENIED "Not
      primary"); with no stream open, requests without an election id are accepted (as PI).
      Only CONTINUE_ON_ERROR atomicity (others: UNIMPLEMENTED). A failed Write is gRPC UNKNOWN
      with a google.rpc.Status holding one p4.v1.Error per update (OK for the ones applied).
    * The device config (p4_device_config) is empty, the program being built in
      (refswitch.pipeline), or the BMv2 JSON of the program the P4Info describes; anything else
      is INVALID_ARGUMENT, at VERIFY too (schema.check_device_config).
    * SetForwardingPipelineConfig: VERIFY checks the P4Info and device config; VERIFY_AND_SAVE
      keeps it for a later COMMIT; VERIFY_AND_COMMIT installs it and clears all state;
      RECONCILE_AND_COMMIT installs it keeping entries, groups and digest configs whose P4 ids
      still exist (and fails with no change if one of them no longer validates); COMMIT
      installs the saved one.
    * Only the default (empty) role; arbitration with another role is UNIMPLEMENTED.
    * Reads: a table entry read with a match returns that entry or nothing; wildcard reads of
      digest entries and of direct counters over all tables are served (PI refuses them);
      counter writes without an index set every cell (PI refuses).
    * A bad PacketOut (unknown metadata id, value too wide) is dropped with a StreamError on the
      sender's stream (PI's error reporting is off by default and only drops it).

Not implemented (UNIMPLEMENTED, as PI for the last three): action profiles and one-shot action
sets, meters and direct meters, idle-timeout notifications (accepted, never sent), registers,
value sets, externs.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import queue
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent import futures
from types import TracebackType

import grpc
from finsy.proto import p4i, p4r, p4r_grpc, rpc_code, rpc_status
from google.protobuf import any_pb2

from refswitch.digests import DigestConfig
from refswitch.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    PermissionDeniedError,
    ResourceExhaustedError,
    SwitchStateError,
    UnimplementedError,
    WriteOp,
)
from refswitch.replication import CloneSession, Replica
from refswitch.schema import (
    CounterInfo,
    CounterUnit,
    MatchKind,
    PipelineSchema,
    TableInfo,
    check_device_config,
)
from refswitch.state import SwitchState
from refswitch.tables import ActionCall, Lpm, MatchSpec, Range, TableEntryView, Ternary

_LOG = logging.getLogger(__name__)

P4RUNTIME_API_VERSION = "1.3.0"
ERROR_SPACE = "ALL-sswitch-p4org"
"""p4.v1.Error.space of the errors PI reports for simple_switch_grpc."""
MAX_CONNECTIONS = 16
"""Open StreamChannels per device, as PI."""
STREAM_QUEUE_SIZE = 10000
"""Messages waiting for a slow client before PacketIn / DigestList are dropped."""
READ_CHUNK = 1000
"""Entities per ReadResponse."""
_MAX_MESSAGE = 256 * 1024 * 1024

_NO_PIPELINE = "No forwarding pipeline config set for this device"
_GRPC_CODES = {sc.value[0]: sc for sc in grpc.StatusCode}
_UPDATE_OPS = {p4r.Update.INSERT: WriteOp.INSERT, p4r.Update.MODIFY: WriteOp.MODIFY}
_UPDATE_OPS[p4r.Update.DELETE] = WriteOp.DELETE
_MATCH_ONEOF = {
    MatchKind.EXACT: "exact",
    MatchKind.LPM: "lpm",
    MatchKind.TERNARY: "ternary",
    MatchKind.RANGE: "range",
    MatchKind.OPTIONAL: "optional",
}
_Request = (
    p4r.WriteRequest
    | p4r.SetForwardingPipelineConfigRequest
    | p4r.ReadRequest
    | p4r.GetForwardingPipelineConfigRequest
)

DefaultsProvider = Callable[[p4i.P4Info], Mapping[str, ActionCall]]
PipelineCallback = Callable[[p4i.P4Info, bytes], None]


class ServerStartError(RuntimeError):
    """The gRPC server could not bind its address."""


# ------------------------------------------------------------------------------ bytestrings
def _int(data: bytes) -> int:
    return int.from_bytes(data, "big")


def _bytes(value: int) -> bytes:
    """Canonical P4Runtime bytestring: no leading zero bytes, at least one byte."""
    return value.to_bytes(max(1, (value.bit_length() + 7) // 8), "big")


def _u128(value: p4r.Uint128) -> int:
    return (value.high << 64) | value.low


def _to_u128(value: int) -> p4r.Uint128:
    return p4r.Uint128(high=value >> 64, low=value & ((1 << 64) - 1))


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
            fm.lpm.value, fm.lpm.prefix_len = _bytes(s.value), s.prefix_len
        elif isinstance(s, Ternary):
            fm.ternary.value, fm.ternary.mask = _bytes(s.value), _bytes(s.mask)
        elif isinstance(s, Range):
            fm.range.low, fm.range.high = _bytes(s.low), _bytes(s.high)
        elif f.kind == MatchKind.OPTIONAL:
            fm.optional.value = _bytes(s)
        else:
            fm.exact.value = _bytes(s)
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
            p4r.Action.Param(param_id=p.id, value=_bytes(call.params.get(p.name, 0)))
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
        p4r.Replica(port=_bytes(r.port), instance=r.instance)
        if r.port_bytes
        else p4r.Replica(egress_port=r.port, instance=r.instance)
        for r in replicas
    ]


def _error(exc: SwitchStateError | None) -> p4r.Error:
    if exc is None:
        return p4r.Error(canonical_code=rpc_code.OK)
    return p4r.Error(canonical_code=exc.code, message=str(exc), space=ERROR_SPACE)


class _WriteError(Exception):
    """Some updates of a Write failed; ``errors`` has one p4.v1.Error per update."""

    def __init__(self, errors: list[p4r.Error]) -> None:
        failed = sum(e.canonical_code != rpc_code.OK for e in errors)
        super().__init__(f"Write failed: {failed} of {len(errors)} updates")
        self.errors = errors


# ------------------------------------------------------------------------------ arbitration
_CLOSE = object()


class _Abort:
    """Ends a stream with a status (queued behind the messages already sent)."""

    def __init__(self, exc: SwitchStateError) -> None:
        self.code = _GRPC_CODES.get(exc.code, grpc.StatusCode.UNKNOWN)
        self.message = str(exc)


class _Connection:
    """One StreamChannel: its election id and the queue its response generator drains."""

    _ids = itertools.count(1)

    def __init__(self) -> None:
        self.id = next(self._ids)
        self.queue: queue.Queue[object] = queue.Queue(STREAM_QUEUE_SIZE)
        self.election_id = 0
        self.registered = False

    def send(self, msg: object) -> bool:
        try:
            self.queue.put_nowait(msg)
        except queue.Full:
            return False
        return True

    def close(self, item: object = _CLOSE) -> None:
        try:
            self.queue.put_nowait(item)
        except queue.Full:  # the generator is stuck behind a full queue: make room
            with contextlib.suppress(queue.Empty):
                self.queue.get_nowait()
            self.queue.put_nowait(item)


class _Arbiter:
    """Controller arbitration for the default role, as PI's DeviceState."""

    def __init__(self, device_id: int) -> None:
        self.device_id = device_id
        self.primary: _Connection | None = None  # read without the lock by the senders
        self._conns: list[_Connection] = []
        self._lock = threading.Lock()

    def arbitrate(self, conn: _Connection, update: p4r.MasterArbitrationUpdate) -> None:
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

    def remove(self, conn: _Connection) -> None:
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
        eid = _u128(request.election_id)
        with self._lock:
            if not self._conns:
                if request.HasField("election_id"):
                    raise PermissionDeniedError("Not primary")
                return
            if self.primary is None or self.primary.election_id != eid:
                raise PermissionDeniedError("Not primary")

    def close_all(self) -> None:
        with self._lock:
            for c in self._conns:
                c.close()

    def _elect(self) -> None:
        self.primary = max(self._conns, key=lambda c: c.election_id, default=None)

    def _notify(self, conn: _Connection) -> None:
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


# ---------------------------------------------------------------------------------- service
class _Service(p4r_grpc.P4RuntimeServicer):
    """The p4.v1.P4Runtime methods over one SwitchState."""

    def __init__(
        self,
        state: SwitchState,
        defaults_provider: DefaultsProvider | None,
        on_pipeline: PipelineCallback | None,
    ) -> None:
        self.state = state
        self.arbiter = _Arbiter(state.device_id)
        self.defaults_provider = defaults_provider
        self.on_pipeline = on_pipeline
        self.saved: p4r.ForwardingPipelineConfig | None = None

    # -------------------------------------------------------------- unary RPCs
    def Capabilities(  # noqa: N802 - gRPC method name
        self, request: p4r.CapabilitiesRequest, context: grpc.ServicerContext
    ) -> p4r.CapabilitiesResponse:
        """Reports the P4Runtime version PI reports."""
        return p4r.CapabilitiesResponse(p4runtime_api_version=P4RUNTIME_API_VERSION)

    def SetForwardingPipelineConfig(  # noqa: N802
        self, request: p4r.SetForwardingPipelineConfigRequest, context: grpc.ServicerContext
    ) -> p4r.SetForwardingPipelineConfigResponse:
        """Verifies, saves and / or installs a program (see the module docstring)."""
        try:
            self._check(request)
            self.arbiter.check_writer(request)
            self._set_pipeline(request)
        except SwitchStateError as exc:
            _abort(context, exc)
        except Exception as exc:  # a bug must not kill the server
            _internal(context, "SetForwardingPipelineConfig", exc)
        return p4r.SetForwardingPipelineConfigResponse()

    def GetForwardingPipelineConfig(  # noqa: N802
        self, request: p4r.GetForwardingPipelineConfigRequest, context: grpc.ServicerContext
    ) -> p4r.GetForwardingPipelineConfigResponse:
        """Returns the installed program (the parts response_type asks for) and its cookie."""
        R = p4r.GetForwardingPipelineConfigRequest  # noqa: N806
        try:
            self._check(request, need_pipeline=True)
            config = p4r.ForwardingPipelineConfig()
            kind = request.response_type
            if kind not in (R.ALL, R.COOKIE_ONLY, R.P4INFO_AND_COOKIE, R.DEVICE_CONFIG_AND_COOKIE):
                raise InvalidArgumentError(
                    "Invalid response_type in GetForwardingPipelineConfigRequest"
                )
            with self.state.lock:
                p4info, cookie = self.state.p4info, self.state.cookie
                if kind in (R.ALL, R.P4INFO_AND_COOKIE) and p4info is not None:
                    config.p4info.CopyFrom(p4info)
                if kind in (R.ALL, R.DEVICE_CONFIG_AND_COOKIE):
                    config.p4_device_config = self.state.device_config
            if cookie is not None:
                config.cookie.cookie = cookie
        except SwitchStateError as exc:
            _abort(context, exc)
        return p4r.GetForwardingPipelineConfigResponse(config=config)

    def Write(  # noqa: N802
        self, request: p4r.WriteRequest, context: grpc.ServicerContext
    ) -> p4r.WriteResponse:
        """Applies the updates in order; reports each one's error (CONTINUE_ON_ERROR)."""
        try:
            self._check(request)
            self.arbiter.check_writer(request)
            self._check(request, need_pipeline=True)
            if request.atomicity != p4r.WriteRequest.CONTINUE_ON_ERROR:
                raise UnimplementedError(
                    "Support for atomic write modes has not been implemented yet"
                )
            self._write(request.updates)
        except SwitchStateError as exc:
            _abort(context, exc)
        except _WriteError as failed:
            status = rpc_status.Status(code=rpc_code.UNKNOWN, message=str(failed))
            for err in failed.errors:
                detail = any_pb2.Any()
                detail.Pack(err)
                status.details.append(detail)
            context.set_trailing_metadata(
                (("grpc-status-details-bin", status.SerializeToString()),)
            )
            context.abort(grpc.StatusCode.UNKNOWN, status.message)
        except Exception as exc:
            _internal(context, "Write", exc)
        return p4r.WriteResponse()

    def Read(  # noqa: N802
        self, request: p4r.ReadRequest, context: grpc.ServicerContext
    ) -> Iterator[p4r.ReadResponse]:
        """Streams the requested entities (everything is read first, under the state lock)."""
        entities: list[p4r.Entity] = []
        try:
            self._check(request, need_pipeline=True)
            with self.state.lock:
                schema = self.state.schema
                assert schema is not None
                for entity in request.entities:
                    self._read(schema, entity, entities)
        except SwitchStateError as exc:
            _abort(context, exc)
        except Exception as exc:
            _internal(context, "Read", exc)
        for i in range(0, max(len(entities), 1), READ_CHUNK):
            yield p4r.ReadResponse(entities=entities[i : i + READ_CHUNK])

    def _check(self, request: _Request, *, need_pipeline: bool = False) -> None:
        if request.device_id != self.state.device_id:
            raise NotFoundError(f"Invalid device id {request.device_id}")
        if getattr(request, "role", ""):
            raise UnimplementedError("Only the default role is supported")
        if need_pipeline and not self.state.ready:
            raise FailedPreconditionError(_NO_PIPELINE)

    def _set_pipeline(self, request: p4r.SetForwardingPipelineConfigRequest) -> None:
        A = p4r.SetForwardingPipelineConfigRequest  # noqa: N806
        action = request.action
        if action == A.COMMIT:
            if self.saved is None:
                raise FailedPreconditionError("No saved forwarding pipeline config to commit")
            config = self.saved
        elif action in (A.VERIFY, A.VERIFY_AND_SAVE, A.VERIFY_AND_COMMIT, A.RECONCILE_AND_COMMIT):
            config = request.config
            if not config.HasField("p4info"):
                raise InvalidArgumentError("ForwardingPipelineConfig has no p4info")
            check_device_config(PipelineSchema(config.p4info), config.p4_device_config)
            if action == A.VERIFY:
                return
            if action == A.VERIFY_AND_SAVE:
                self.saved = p4r.ForwardingPipelineConfig()
                self.saved.CopyFrom(config)
                return
        else:
            raise InvalidArgumentError("Invalid SetForwardingPipeline action")
        defaults = self.defaults_provider(config.p4info) if self.defaults_provider else None
        cookie = config.cookie.cookie if config.HasField("cookie") else None
        self.state.set_pipeline(
            config.p4info,
            config.p4_device_config,
            defaults,
            cookie=cookie,
            reconcile=action == A.RECONCILE_AND_COMMIT,
        )
        self.saved = None
        if self.on_pipeline is not None:
            self.on_pipeline(config.p4info, config.p4_device_config)

    # -------------------------------------------------------------- Write
    def _write(self, updates: Sequence[p4r.Update]) -> None:
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
            raise _WriteError(errors)

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
        elif which in ("action_profile_member", "action_profile_group"):
            raise UnimplementedError("Action profiles are not supported by the reference target")
        elif which in ("meter_entry", "direct_meter_entry"):
            raise UnimplementedError("Meters are not supported by the reference target")
        elif which == "register_entry":
            raise UnimplementedError("Register writes are not supported yet")
        elif which == "value_set_entry":
            raise UnimplementedError("ValueSet writes are not supported yet")
        elif which == "extern_entry":
            raise UnimplementedError("No extern support yet")
        else:
            raise SwitchStateError("Incorrect entity type")

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
        elif which in ("meter_entry", "direct_meter_entry"):
            raise UnimplementedError("Meters are not supported by the reference target")
        elif which == "register_entry":
            raise UnimplementedError("Register reads are not supported yet")
        elif which == "value_set_entry":
            raise UnimplementedError("ValueSet reads are not supported yet")
        elif which == "extern_entry":
            raise UnimplementedError("No extern support yet")
        else:
            raise SwitchStateError("Incorrect entity type")

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
            groups = [g for g in self.state.multicast_groups() if gid in (0, g.group_id)]
            if gid and not groups:
                raise NotFoundError("Multicast group does not exist")
            for g in groups:
                mg = p4r.MulticastGroupEntry(
                    multicast_group_id=g.group_id,
                    replicas=_encode_replicas(g.replicas),
                    metadata=g.metadata,
                )
                out.append(
                    p4r.Entity(
                        packet_replication_engine_entry=p4r.PacketReplicationEngineEntry(
                            multicast_group_entry=mg
                        )
                    )
                )
        elif which == "clone_session_entry":
            sid = pre.clone_session_entry.session_id
            sessions = [s for s in self.state.clone_sessions() if sid in (0, s.session_id)]
            if sid and not sessions:
                raise NotFoundError("Clone session does not exist")
            for s in sessions:
                cs = p4r.CloneSessionEntry(
                    session_id=s.session_id,
                    replicas=_encode_replicas(s.replicas),
                    class_of_service=s.class_of_service,
                    packet_length_bytes=s.packet_length_bytes,
                )
                out.append(
                    p4r.Entity(
                        packet_replication_engine_entry=p4r.PacketReplicationEngineEntry(
                            clone_session_entry=cs
                        )
                    )
                )
        else:
            raise InvalidArgumentError("Invalid PRE operation")

    # -------------------------------------------------------------- StreamChannel
    def StreamChannel(  # noqa: N802
        self, request_iterator: Iterator[p4r.StreamMessageRequest], context: grpc.ServicerContext
    ) -> Iterator[p4r.StreamMessageResponse]:
        """Arbitration, PacketOut and DigestListAck in; arbitration, PacketIn, DigestList out."""
        conn = _Connection()
        context.add_callback(conn.close)
        reader = threading.Thread(
            target=self._read_stream,
            args=(conn, request_iterator),
            name=f"p4rt-stream-{conn.id}",
            daemon=True,
        )
        reader.start()
        while True:
            item = conn.queue.get()
            if item is _CLOSE:
                return
            if isinstance(item, _Abort):
                context.abort(item.code, item.message)
            assert isinstance(item, p4r.StreamMessageResponse)
            yield item

    def _read_stream(self, conn: _Connection, requests: Iterator[p4r.StreamMessageRequest]) -> None:
        try:
            for request in requests:
                which = request.WhichOneof("update")
                if which == "arbitration":
                    self.arbiter.arbitrate(conn, request.arbitration)
                elif not conn.registered:
                    continue  # PI ignores everything before arbitration
                elif which == "packet":
                    self._packet_out(conn, request.packet)
                elif which == "digest_ack" and conn is self.arbiter.primary:
                    ack = request.digest_ack
                    self.state.ack_digest_list(ack.digest_id, ack.list_id)
        except SwitchStateError as exc:
            self.arbiter.remove(conn)
            conn.close(_Abort(exc))
            return
        except Exception as exc:  # cancelled by the client or the server
            _LOG.debug("stream %d ended: %r", conn.id, exc)
        self.arbiter.remove(conn)
        conn.close()

    def _packet_out(self, conn: _Connection, packet: p4r.PacketOut) -> None:
        stats = self.state.stats
        schema = self.state.schema
        handler = self.state.packet_out_handler
        if conn is not self.arbiter.primary or schema is None or handler is None:
            stats.packet_outs_dropped += 1
            return
        try:
            metadata: dict[str, int] = {}
            cpm = schema.packet_out
            if cpm is None:
                if packet.metadata:
                    raise InvalidArgumentError("Unexpected metadata in PacketOut message")
            else:
                metadata = {f.name: 0 for f in cpm.fields}
                for md in packet.metadata:
                    f = cpm.by_id.get(md.metadata_id)
                    if f is None:
                        raise InvalidArgumentError("Unknown metadata id in PacketOut message")
                    metadata[f.name] = _width(_int(md.value), f.bitwidth)
        except SwitchStateError as exc:
            stats.packet_outs_dropped += 1
            error = p4r.StreamError(canonical_code=exc.code, message=str(exc), space=ERROR_SPACE)
            error.packet_out.packet_out.CopyFrom(packet)
            conn.send(p4r.StreamMessageResponse(error=error))
            return
        stats.packet_outs += 1
        try:
            handler(packet.payload, metadata)
        except Exception:  # the pipeline's problem, not the stream's
            _LOG.exception("packet_out_handler failed")

    def send_to_primary(self, msg: p4r.StreamMessageResponse) -> bool:
        """The SwitchState's stream sink: queues a PacketIn or DigestList for the primary."""
        primary = self.arbiter.primary
        return primary is not None and primary.send(msg)


def _counter_tuple(data: p4r.CounterData) -> tuple[int, int]:
    return data.packet_count, data.byte_count


def _abort(context: grpc.ServicerContext, exc: SwitchStateError) -> None:
    context.abort(_GRPC_CODES.get(exc.code, grpc.StatusCode.UNKNOWN), str(exc))


def _internal(context: grpc.ServicerContext, rpc: str, exc: Exception) -> None:
    _LOG.exception("%s failed", rpc)
    context.abort(grpc.StatusCode.INTERNAL, f"{rpc}: internal error: {exc!r}")


# ----------------------------------------------------------------------------------- server
class P4RuntimeServer:
    """A p4.v1.P4Runtime gRPC server over one SwitchState (usable as a context manager).

    Args:
        state: the switch.
        address: "host:port" to listen on; port 0 picks a free one (see :meth:`start`).
        defaults_provider: called with the P4Info on each pipeline install; returns the
            program's initial default actions by table name (P4Info does not carry them).
        on_pipeline: called with (P4Info, device config) after each install, so the pipeline
            can re-bind (reset its registers).
        max_workers: gRPC worker threads; each open StreamChannel holds one.
    """

    def __init__(
        self,
        state: SwitchState,
        address: str = "127.0.0.1:0",
        *,
        defaults_provider: DefaultsProvider | None = None,
        on_pipeline: PipelineCallback | None = None,
        max_workers: int = 2 * MAX_CONNECTIONS + 8,
    ) -> None:
        self.state = state
        self.address = address
        self._service = _Service(state, defaults_provider, on_pipeline)
        self._max_workers = max_workers
        self._server: grpc.Server | None = None
        self._port = 0

    @property
    def port(self) -> int:
        """The bound port (0 before start)."""
        return self._port

    def start(self) -> int:
        """Binds and starts serving; PacketIn / DigestList of the state go to the primary.

        Returns:
            The bound port.

        Raises:
            ServerStartError: the address cannot be bound.
        """
        if self._server is not None:
            return self._port
        server = grpc.server(
            futures.ThreadPoolExecutor(self._max_workers, thread_name_prefix="p4rt"),
            options=[
                ("grpc.max_receive_message_length", _MAX_MESSAGE),
                ("grpc.max_send_message_length", _MAX_MESSAGE),
            ],
        )
        p4r_grpc.add_P4RuntimeServicer_to_server(self._service, server)
        try:
            port = server.add_insecure_port(self.address)
        except RuntimeError as exc:
            raise ServerStartError(f"cannot listen on {self.address}: {exc}") from exc
        if port == 0:
            raise ServerStartError(f"cannot listen on {self.address}")
        self.state.set_stream_sink(self._service.send_to_primary)
        server.start()
        self._server, self._port = server, port
        _LOG.info("P4Runtime server on %s (port %d)", self.address, port)
        return port

    def stop(self, grace: float | None = None) -> None:
        """Stops serving; open streams end, PacketIn / DigestList are dropped from now on."""
        server, self._server = self._server, None
        if server is None:
            return
        self.state.set_stream_sink(None)
        self._service.arbiter.close_all()
        server.stop(grace).wait()

    def serve_forever(self) -> None:
        """Starts (if needed) and blocks until the server stops or Ctrl-C."""
        self.start()
        assert self._server is not None
        try:
            self._server.wait_for_termination()
        except KeyboardInterrupt:
            _LOG.info("interrupted")
        finally:
            self.stop(grace=1.0)

    def __enter__(self) -> P4RuntimeServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
