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

The servicer here owns the requests (device id, role, primary, pipeline actions, streams);
the entities a Write or Read carries are translated in :mod:`refswitch.p4rt_entities`, and the
streams' arbitration lives in :mod:`refswitch.p4rt_arbitration`.

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

import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent import futures

import grpc
from finsy.proto import p4i, p4r, p4r_grpc, rpc_code, rpc_status
from google.protobuf import any_pb2

from kvcast.lifecycle import Service
from refswitch.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    SwitchStateError,
    UnimplementedError,
)
from refswitch.p4rt_arbitration import (
    CLOSE,
    MAX_CONNECTIONS,
    Abort,
    Arbiter,
    Connection,
    status_code,
)
from refswitch.p4rt_entities import ERROR_SPACE, EntityIO, WriteError, decode_packet_out
from refswitch.schema import PipelineSchema, check_device_config
from refswitch.state import SwitchState
from refswitch.tables import ActionCall

_LOG = logging.getLogger(__name__)

P4RUNTIME_API_VERSION = "1.3.0"
READ_CHUNK = 1000
"""Entities per ReadResponse."""
_MAX_MESSAGE = 256 * 1024 * 1024

_NO_PIPELINE = "No forwarding pipeline config set for this device"
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
        self.arbiter = Arbiter(state.device_id)
        self.entities = EntityIO(state)
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
            self._check(request, primary_only=True)
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
            self._check(request, need_pipeline=True, primary_only=True)
            if request.atomicity != p4r.WriteRequest.CONTINUE_ON_ERROR:
                raise UnimplementedError(
                    "Support for atomic write modes has not been implemented yet"
                )
            self.entities.write(request.updates)
        except SwitchStateError as exc:
            _abort(context, exc)
        except WriteError as failed:
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
            entities = self.entities.read(request.entities)
        except SwitchStateError as exc:
            _abort(context, exc)
        except Exception as exc:
            _internal(context, "Read", exc)
        for i in range(0, max(len(entities), 1), READ_CHUNK):
            yield p4r.ReadResponse(entities=entities[i : i + READ_CHUNK])

    def _check(
        self, request: _Request, *, need_pipeline: bool = False, primary_only: bool = False
    ) -> None:
        """What every request must pass, in PI's order: device, role, primary, pipeline.

        Args:
            request: the request.
            need_pipeline: refuse it before a pipeline is set.
            primary_only: refuse it from anyone but the primary (Write and
                SetForwardingPipelineConfig).

        Raises:
            SwitchStateError: the first check that fails, with PI's code and wording.
        """
        if request.device_id != self.state.device_id:
            raise NotFoundError(f"Invalid device id {request.device_id}")
        if getattr(request, "role", ""):
            raise UnimplementedError("Only the default role is supported")
        if primary_only:
            assert isinstance(request, p4r.WriteRequest | p4r.SetForwardingPipelineConfigRequest)
            self.arbiter.check_writer(request)
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

    # -------------------------------------------------------------- StreamChannel
    def StreamChannel(  # noqa: N802
        self, request_iterator: Iterator[p4r.StreamMessageRequest], context: grpc.ServicerContext
    ) -> Iterator[p4r.StreamMessageResponse]:
        """Arbitration, PacketOut and DigestListAck in; arbitration, PacketIn, DigestList out."""
        conn = Connection()
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
            if item is CLOSE:
                return
            if isinstance(item, Abort):
                context.abort(item.code, item.message)
            assert isinstance(item, p4r.StreamMessageResponse)
            yield item

    def _read_stream(self, conn: Connection, requests: Iterator[p4r.StreamMessageRequest]) -> None:
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
            conn.close(Abort(exc))
            return
        except Exception as exc:  # cancelled by the client or the server
            _LOG.debug("stream %d ended: %r", conn.id, exc)
        self.arbiter.remove(conn)
        conn.close()

    def _packet_out(self, conn: Connection, packet: p4r.PacketOut) -> None:
        stats = self.state.stats
        schema = self.state.schema
        handler = self.state.packet_out_handler
        if conn is not self.arbiter.primary or schema is None or handler is None:
            stats.packet_outs_dropped += 1
            return
        try:
            metadata = decode_packet_out(schema, packet)
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


def _abort(context: grpc.ServicerContext, exc: SwitchStateError) -> None:
    context.abort(status_code(exc), str(exc))


def _internal(context: grpc.ServicerContext, rpc: str, exc: Exception) -> None:
    _LOG.exception("%s failed", rpc)
    context.abort(grpc.StatusCode.INTERNAL, f"{rpc}: internal error: {exc!r}")


# ----------------------------------------------------------------------------------- server
class P4RuntimeServer(Service):
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
