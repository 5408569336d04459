"""An in-process reference switch that records every request, for the control-plane tests.

The pattern of tests/conformance/harness.py's InProcessRefTarget: the reference pipeline runs in
this process behind its real P4Runtime server on loopback. In addition, this harness

* records every WriteRequest and SetForwardingPipelineConfigRequest the server receives, and
  every PacketOut payload (to assert the exact requests a driver sends, as p4runtime-shell's
  test.py does);
* runs hooks right after each Write is applied and after each PacketOut went through the
  pipeline, with the switch held still (the next request waits), so a test can probe the data
  plane between any two steps of a control-plane operation;
* restarts: stop the server and start a fresh switch (empty state) on the same port, or a new
  server over the same state (a reconnect to a switch that kept everything);
* builds the expected P4Runtime messages by name from the P4Info the switch runs.

The tests at the bottom check the harness itself.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Iterator, Mapping
from typing import Any, TypeVar

import pytest
from finsy.proto import p4r
from google.protobuf.message import Message

from controlplane.drivers import ForwardingDriver
from controlplane.p4rt import SwitchClient, SwitchConfig
from emulation.targets import P4INFO_PATH
from kvcast import p4constants as c
from kvcast import wire
from refswitch.p4rt_server import P4RuntimeServer
from refswitch.pipeline import PACKET_OUT_LEN, Output, Pipeline, initial_defaults
from refswitch.state import SwitchState
from refswitch.tables import ActionCall

CPU = c.CPU_PORT_NUM
HOST_PORT = 1
POOL_PORT = 4
HOST_MAC = "00:00:00:00:01:01"
SWITCH_MAC = "00:00:00:00:00:fe"
POOL_MAC = "00:00:00:00:04:04"
HOST_IP = "10.0.1.1"
SERVICE_IP = "10.0.0.100"
POOL_IP = "10.0.4.4"
HOST_UDP = 40000

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T], limit_s: float = 20.0) -> T:
    """Runs a test coroutine; ``limit_s`` only bounds a hang, it asserts nothing."""

    async def bounded() -> T:
        return await asyncio.wait_for(coro, limit_s)

    return asyncio.run(bounded())


def canonical(value: int) -> bytes:
    """A P4Runtime bytestring in canonical form (no leading zero bytes, at least one byte)."""
    return value.to_bytes(max(1, (value.bit_length() + 7) // 8), "big")


def driver_test_defaults() -> dict[str, ActionCall]:
    """The reference target's table defaults, but an unknown port is an unbound host port.

    The drivers' tests send GETs from ``HOST_PORT`` without a ForwardingDriver binding it; the
    reference target itself denies such a port (refswitch/edge.py). Port security has its own
    tests (tests/conformance and tests/security on the real defaults; test_daemon's base-state
    test checks that the daemon writes DENY over this default); here the switch keeps the
    committed P4 programs' default, as a controller with ``deny_unknown_ports: false`` would.
    """
    defaults = initial_defaults()
    defaults[c.TABLE_INGRESS_PORT_ROLE_PORT_ROLE] = ActionCall(
        c.ACTION_INGRESS_PORT_ROLE_SET_PORT_ROLE, {"role": c.PORT_ROLE_HOST}
    )
    return defaults


class RefSwitch:
    """The reference switch in this process, recording requests, restartable on one port."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.requests: list[Message] = []
        self.packet_outs: list[bytes] = []
        # Writes and PacketOuts in the order the switch applied them.
        self.log: list[p4r.WriteRequest | bytes] = []
        self.outputs: list[Output] = []
        self.after_write: list[Callable[[p4r.WriteRequest], None]] = []
        self.after_packet_out: list[Callable[[bytes], None]] = []
        self.drop_packet_out: Callable[[bytes], bool] | None = None
        self.port = 0
        self.state = SwitchState(device_id=1, cpu_port=CPU)
        self.pipeline = Pipeline(self.state)
        self.server = self._serve(self.state, self.pipeline)

    # ------------------------------------------------------------------ lifecycle
    def _serve(self, state: SwitchState, pipeline: Pipeline) -> P4RuntimeServer:
        state.packet_out_handler = self._packet_out
        server = P4RuntimeServer(
            state,
            f"127.0.0.1:{self.port}",
            defaults_provider=lambda _p: driver_test_defaults(),
            on_pipeline=lambda _p, _c: pipeline.reset(),
        )
        # The servicer's methods are bound when the server starts: wrap them to record.
        service = server._service  # noqa: SLF001 - test instrumentation
        service.Write = self._recording(service.Write, self.after_write)  # type: ignore[method-assign]
        service.SetForwardingPipelineConfig = self._recording(  # type: ignore[method-assign]
            service.SetForwardingPipelineConfig, []
        )
        self.port = server.start()
        return server

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def restart(self) -> None:
        """A switch restart: the server goes away and comes back empty (no pipeline)."""
        self.server.stop()
        with self.lock:
            self.state = SwitchState(device_id=1, cpu_port=CPU)
            self.pipeline = Pipeline(self.state)
        self.server = self._serve(self.state, self.pipeline)

    def reconnect(self, while_away: Callable[[SwitchState], None] | None = None) -> None:
        """Drops every connection; the switch keeps its pipeline, tables and registers.

        Args:
            while_away: changes the switch state while no controller is connected.
        """
        self.server.stop()
        if while_away is not None:
            while_away(self.state)
        self.server = self._serve(self.state, self.pipeline)

    def stop(self) -> None:
        self.server.stop()

    # ------------------------------------------------------------------ recording
    def _recording(self, method: Any, hooks: list[Callable[[Any], None]]) -> Any:
        def wrapper(request: Any, context: Any) -> Any:
            with self.lock:
                copy = type(request)()
                copy.CopyFrom(request)
                self.requests.append(copy)
                response = method(request, context)
                if isinstance(copy, p4r.WriteRequest):
                    self.log.append(copy)
                for hook in hooks:
                    hook(request)
                return response

        return wrapper

    def mark(self) -> int:
        """A position in the request log."""
        return len(self.requests)

    def writes(self, since: int = 0) -> list[list[p4r.Update]]:
        """The updates of each WriteRequest received since ``since``."""
        return [list(r.updates) for r in self.requests[since:] if isinstance(r, p4r.WriteRequest)]

    def pipeline_pushes(self, since: int = 0) -> list[p4r.SetForwardingPipelineConfigRequest]:
        return [
            r
            for r in self.requests[since:]
            if isinstance(r, p4r.SetForwardingPipelineConfigRequest)
        ]

    # ------------------------------------------------------------------ data plane
    def _packet_out(self, payload: bytes, metadata: Mapping[str, int]) -> None:
        with self.lock:
            self.packet_outs.append(payload)
            self.log.append(payload)
            if self.drop_packet_out is not None and self.drop_packet_out(payload):
                return
            header = ((metadata.get("egress_port", 0) & 0x1FF) << 7).to_bytes(PACKET_OUT_LEN, "big")
            self.process(CPU, header + payload)
            for hook in self.after_packet_out:
                hook(payload)

    def process(self, port: int, frame: bytes) -> list[Output]:
        """Runs a frame through the pipeline; PacketIns go to the controller."""
        with self.lock:
            outputs = self.pipeline.process(port, frame)
            frames = []
            for out in outputs:
                if out.port == CPU:
                    self.state.emit_packet_in(out.frame, {"ingress_port": out.ingress_port})
                else:
                    frames.append(out)
            self.outputs.extend(frames)
            return frames

    def get(
        self, tenant: int, key: int, frag_idx: int, req_id: int = 0, group: int = 0
    ) -> list[Output]:
        """A host's GET for one fragment, sent to the service address."""
        payload = wire.get_message(tenant, key, frag_idx, req_id=req_id, group=group)
        frame = wire.udp_frame(
            HOST_MAC, SWITCH_MAC, HOST_IP, SERVICE_IP, HOST_UDP, c.KVP_UDP_PORT, payload
        )
        return self.process(HOST_PORT, frame)

    def drops(self, reason: int) -> int:
        return self.state.counter_value(c.COUNTER_INGRESS_STATS_DROP_COUNTER, reason)[0]

    def events(self, event: int) -> int:
        return self.state.counter_value(c.COUNTER_INGRESS_STATS_KVP_EVENT_COUNTER, event)[0]


class Expect:
    """Expected P4Runtime updates, built by name from the P4Info the switch runs."""

    def __init__(self, sw: RefSwitch) -> None:
        p4info = sw.state.p4info
        assert p4info is not None, "no pipeline installed yet"
        self.tables = {t.preamble.name: t for t in p4info.tables}
        self.actions = {a.preamble.name: a for a in p4info.actions}
        self.digests = {d.preamble.name: d for d in p4info.digests}

    def entry(
        self,
        table: str,
        match: Mapping[str, int | tuple[int, int]] | None = None,
        action: str | None = None,
        params: Mapping[str, int] | None = None,
        *,
        default: bool = False,
    ) -> p4r.TableEntry:
        info = self.tables[table]
        te = p4r.TableEntry(table_id=info.preamble.id, is_default_action=default)
        fields = {f.name: f for f in info.match_fields}
        for name, value in (match or {}).items():
            fm = te.match.add(field_id=fields[name].id)
            if isinstance(value, tuple):
                fm.lpm.value, fm.lpm.prefix_len = canonical(value[0]), value[1]
            else:
                fm.exact.value = canonical(value)
        if action is not None:
            ainfo = self.actions[action]
            te.action.action.action_id = ainfo.preamble.id
            for p in ainfo.params:
                te.action.action.params.add(param_id=p.id, value=canonical((params or {})[p.name]))
        return te

    @staticmethod
    def _update(kind: int, **entity: Any) -> p4r.Update:
        return p4r.Update(type=kind, entity=p4r.Entity(**entity))  # type: ignore[arg-type]

    def insert(
        self,
        table: str,
        match: Mapping[str, Any],
        action: str,
        params: Mapping[str, int] | None = None,
    ) -> p4r.Update:
        return self._update(p4r.Update.INSERT, table_entry=self.entry(table, match, action, params))

    def modify(
        self,
        table: str,
        match: Mapping[str, Any],
        action: str,
        params: Mapping[str, int] | None = None,
    ) -> p4r.Update:
        return self._update(p4r.Update.MODIFY, table_entry=self.entry(table, match, action, params))

    def delete(self, table: str, match: Mapping[str, Any]) -> p4r.Update:
        return self._update(p4r.Update.DELETE, table_entry=self.entry(table, match))

    def set_default(self, table: str, action: str, params: Mapping[str, int]) -> p4r.Update:
        te = self.entry(table, None, action, params, default=True)
        return self._update(p4r.Update.MODIFY, table_entry=te)

    def group(self, kind: int, gid: int, replicas: list[tuple[int, int]] = []) -> p4r.Update:  # noqa: B006
        mg = p4r.MulticastGroupEntry(
            multicast_group_id=gid,
            replicas=[p4r.Replica(egress_port=port, instance=rid) for port, rid in replicas],
        )
        pre = p4r.PacketReplicationEngineEntry(multicast_group_entry=mg)
        return self._update(kind, packet_replication_engine_entry=pre)

    def digest(self, kind: int, name: str, size: int, timeout_ns: int, ack_ns: int) -> p4r.Update:
        de = p4r.DigestEntry(digest_id=self.digests[name].preamble.id)
        de.config.max_list_size = size
        de.config.max_timeout_ns = timeout_ns
        de.config.ack_timeout_ns = ack_ns
        return self._update(kind, digest_entry=de)


def config(sw: RefSwitch, name: str = "s1", election_id: int = 10) -> SwitchConfig:
    """A fast-reconnecting client configuration for a test switch."""
    return SwitchConfig(
        name=name,
        address=sw.address,
        p4info=P4INFO_PATH,
        election_id=election_id,
        reconnect_initial_s=0.02,
        reconnect_max_s=0.1,
        ready_timeout_s=10.0,
    )


@pytest.fixture(name="refswitch")
def refswitch_fixture() -> Iterator[RefSwitch]:
    sw = RefSwitch()
    yield sw
    sw.stop()


# ---------------------------------------------------------------------- the harness itself
def test_harness_records_the_pipeline_push_and_writes(refswitch: RefSwitch) -> None:
    async def main() -> None:
        async with SwitchClient(config(refswitch)) as client:
            await ForwardingDriver(client).set_port_role(POOL_PORT, c.PORT_ROLE_POOL)

    run(main())
    assert len(refswitch.pipeline_pushes()) == 1
    expect = Expect(refswitch)
    assert refswitch.writes() == [
        [
            expect.insert(
                c.TABLE_INGRESS_PORT_ROLE_PORT_ROLE,
                {"port": POOL_PORT},
                c.ACTION_INGRESS_PORT_ROLE_SET_PORT_ROLE,
                {"role": c.PORT_ROLE_POOL},
            )
        ]
    ]


def test_harness_restart_leaves_an_empty_switch_on_the_same_port(refswitch: RefSwitch) -> None:
    port = refswitch.port

    async def main() -> None:
        async with SwitchClient(config(refswitch)):
            pass

    run(main())
    assert refswitch.state.ready
    refswitch.restart()
    assert refswitch.port == port
    assert not refswitch.state.ready
