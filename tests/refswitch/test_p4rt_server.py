"""P4RuntimeServer driven by finsy (the project's client) and by raw gRPC stubs (exact codes).

The program is tests/refswitch/test_state.py's P4INFO_TEXT.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar, cast

import grpc
import pytest
from finsy import (
    P4ClientError,
    P4CounterData,
    P4CounterEntry,
    P4DigestEntry,
    P4DirectCounterEntry,
    P4MulticastGroupEntry,
    P4PacketOut,
    P4TableAction,
    P4TableEntry,
    P4TableMatch,
    Switch,
    SwitchOptions,
)
from finsy.grpcutil import GRPCStatusCode
from finsy.p4entity import P4Entity
from finsy.proto import p4r, p4r_grpc, rpc_code, rpc_status

from refswitch.errors import WriteOp
from refswitch.p4rt_server import P4RuntimeServer
from refswitch.replication import Replica
from refswitch.state import SwitchState
from refswitch.tables import ActionCall, Lpm
from tests.refswitch.test_state import (
    BLOB,
    CACHE,
    DEFAULTS,
    KEY,
    MAC,
    P4INFO_TEXT,
    ROUTE,
    fwd,
    hit,
    make_p4info,
)

T = TypeVar("T")
E = TypeVar("E", bound=P4Entity)
PORTS_ID, CACHE_ID, ROUTE_ID, CONFIG_ID, FIXED_ID = 33554433, 33554434, 33554435, 33554437, 33554438
FORWARD_ID, DROP_ID = 16777218, 16777220
DIGEST = "hot_miss_digest_t"
Set = p4r.SetForwardingPipelineConfigRequest
Get = p4r.GetForwardingPipelineConfigRequest
BLOB_V2 = BLOB.replace(b'"ingress"', b'"v2"')


# ------------------------------------------------------------------------------ fixtures
@pytest.fixture
def state() -> SwitchState:
    return SwitchState()


@pytest.fixture
def installs() -> list[bytes]:
    return []


@pytest.fixture
def server(state: SwitchState, installs: list[bytes]) -> Iterator[P4RuntimeServer]:
    srv = P4RuntimeServer(
        state,
        defaults_provider=lambda _p4info: DEFAULTS,
        on_pipeline=lambda _p4info, blob: installs.append(blob),
    )
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture
def addr(server: P4RuntimeServer) -> str:
    return f"127.0.0.1:{server.port}"


@pytest.fixture
def stub(addr: str) -> Iterator[p4r_grpc.P4RuntimeStub]:
    with grpc.insecure_channel(addr) as channel:
        yield p4r_grpc.P4RuntimeStub(channel)


@pytest.fixture
def installed(state: SwitchState) -> SwitchState:
    state.set_pipeline(make_p4info(), BLOB, DEFAULTS)
    return state


@pytest.fixture
def p4info_path(tmp_path: Path) -> Path:
    path = tmp_path / "test.p4info.txtpb"
    path.write_text(P4INFO_TEXT)
    return path


# ------------------------------------------------------------------------------ helpers
def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(asyncio.wait_for(coro, 15))


@asynccontextmanager
async def client(addr: str, p4info: Path, election_id: int = 10) -> AsyncIterator[Switch]:
    opts = SwitchOptions(p4info=p4info, p4blob=BLOB, initial_election_id=election_id)
    async with Switch(f"sw{election_id}", addr, opts) as sw:
        yield sw


async def until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


async def read_all(sw: Switch, query: E) -> list[E]:
    """finsy's read, typed (its overloads are declared as coroutines)."""
    return [e async for e in cast(AsyncIterator[E], sw.read(query))]


def cache_entry(key: int = KEY, slot: int = 1) -> P4TableEntry:
    return P4TableEntry(
        "cache",
        match=P4TableMatch({"hdr.kvp.key": key, "hdr.eth.dst": MAC}),
        action=P4TableAction("cache_hit", slot=slot, port=2),
    )


def route_entry(prefix: str, port: int) -> P4TableEntry:
    return P4TableEntry(
        "route",
        match=P4TableMatch({"hdr.ipv4.dst": prefix}),
        action=P4TableAction("forward", port=port),
    )


def ports_update(
    port: bytes, out: bytes, kind: p4r.Update.Type.ValueType = p4r.Update.INSERT
) -> p4r.Update:
    entry = p4r.TableEntry(
        table_id=PORTS_ID,
        match=[p4r.FieldMatch(field_id=1, exact=p4r.FieldMatch.Exact(value=port))],
    )
    entry.action.action.CopyFrom(
        p4r.Action(action_id=FORWARD_ID, params=[p4r.Action.Param(param_id=1, value=out)])
    )
    return p4r.Update(type=kind, entity=p4r.Entity(table_entry=entry))


def write(stub: p4r_grpc.P4RuntimeStub, *updates: p4r.Update, **fields: Any) -> None:
    stub.Write(p4r.WriteRequest(device_id=1, updates=list(updates), **fields))


def set_config(
    stub: p4r_grpc.P4RuntimeStub, action: int, config: p4r.ForwardingPipelineConfig
) -> p4r.SetForwardingPipelineConfigResponse:
    """SetForwardingPipelineConfig of ``config`` on device 1 with ``action`` (a ``Set`` action)."""
    return stub.SetForwardingPipelineConfig(Set(device_id=1, action=action, config=config))


def status_of(call: Callable[[], object]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()
    assert isinstance(info.value, grpc.RpcError)
    return info.value


def update_codes(err: grpc.RpcError) -> list[int]:
    """The canonical code of each p4.v1.Error in a failed Write's google.rpc.Status."""
    for md in err.trailing_metadata():  # type: ignore[attr-defined]
        if md.key == "grpc-status-details-bin":
            status = rpc_status.Status.FromString(md.value)
            errors = [p4r.Error() for _ in status.details]
            for detail, error in zip(status.details, errors, strict=True):
                detail.Unpack(error)
            return [e.canonical_code for e in errors]
    raise AssertionError("no status details")


def read(stub: p4r_grpc.P4RuntimeStub, entity: p4r.Entity) -> list[p4r.Entity]:
    request = p4r.ReadRequest(device_id=1, entities=[entity])
    return [e for response in stub.Read(request) for e in response.entities]


class RawStream:
    """A StreamChannel driven from the test thread, with a receive timeout."""

    def __init__(self, stub: p4r_grpc.P4RuntimeStub) -> None:
        self._requests: queue.Queue[p4r.StreamMessageRequest | None] = queue.Queue()
        self._responses: queue.Queue[p4r.StreamMessageResponse | grpc.RpcError] = queue.Queue()
        self.call = stub.StreamChannel(iter(self._requests.get, None))
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        try:
            for response in self.call:
                self._responses.put(response)
        except grpc.RpcError as err:
            self._responses.put(err)

    def send(self, msg: p4r.StreamMessageRequest) -> None:
        self._requests.put(msg)

    def arbitrate(self, election_id: int, device_id: int = 1, role: str = "") -> None:
        update = p4r.MasterArbitrationUpdate(
            device_id=device_id, election_id=p4r.Uint128(low=election_id)
        )
        if role:
            update.role.name = role
        self.send(p4r.StreamMessageRequest(arbitration=update))

    def recv(self, timeout: float = 3.0) -> p4r.StreamMessageResponse:
        item = self._responses.get(timeout=timeout)
        assert isinstance(item, p4r.StreamMessageResponse), item
        return item

    def recv_error(self, timeout: float = 3.0) -> grpc.RpcError:
        item = self._responses.get(timeout=timeout)
        assert isinstance(item, grpc.RpcError), item
        return item

    def idle(self, wait: float = 0.2) -> bool:
        time.sleep(wait)
        return self._responses.empty()

    def close(self) -> None:
        self._requests.put(None)
        self.call.cancel()  # type: ignore[no-untyped-call]


@pytest.fixture
def streams(stub: p4r_grpc.P4RuntimeStub) -> Iterator[Callable[[], RawStream]]:
    opened: list[RawStream] = []

    def open_stream() -> RawStream:
        opened.append(RawStream(stub))
        return opened[-1]

    yield open_stream
    for s in opened:
        s.close()


def arbitration(msg: p4r.StreamMessageResponse) -> tuple[int, int]:
    """(status code, primary's election id) of an arbitration reply."""
    assert msg.WhichOneof("update") == "arbitration"
    return msg.arbitration.status.code, msg.arbitration.election_id.low


# ------------------------------------------------------------------------------ pipeline config
def test_capabilities_reports_p4runtime_1_3_0(stub: p4r_grpc.P4RuntimeStub) -> None:
    assert stub.Capabilities(p4r.CapabilitiesRequest()).p4runtime_api_version == "1.3.0"


def test_get_pipeline_before_any_is_failed_precondition(stub: p4r_grpc.P4RuntimeStub) -> None:
    err = status_of(lambda: stub.GetForwardingPipelineConfig(Get(device_id=1)))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "No forwarding pipeline config" in (err.details() or "")


def test_finsy_installs_pipeline_and_get_returns_each_part(
    addr: str, p4info_path: Path, stub: p4r_grpc.P4RuntimeStub, installs: list[bytes]
) -> None:
    async def connect() -> int:
        async with client(addr, p4info_path) as sw:
            return sw.p4info.p4cookie

    cookie = run(connect())
    assert installs == [BLOB]
    full = stub.GetForwardingPipelineConfig(Get(device_id=1, response_type=Get.ALL)).config
    assert full.p4info == make_p4info() and full.p4_device_config == BLOB
    assert full.cookie.cookie == cookie
    only = stub.GetForwardingPipelineConfig(Get(device_id=1, response_type=Get.COOKIE_ONLY))
    assert not only.config.HasField("p4info") and only.config.p4_device_config == b""
    assert only.config.cookie.cookie == cookie
    dev = stub.GetForwardingPipelineConfig(
        Get(device_id=1, response_type=Get.DEVICE_CONFIG_AND_COOKIE)
    ).config
    assert not dev.HasField("p4info") and dev.p4_device_config == BLOB


def test_verify_checks_without_installing(stub: p4r_grpc.P4RuntimeStub, state: SwitchState) -> None:
    config = p4r.ForwardingPipelineConfig(p4info=make_p4info())
    set_config(stub, Set.VERIFY, config)
    assert not state.ready
    config.p4info.tables[0].action_refs.add(id=0x01FFFFFF)
    err = status_of(lambda: set_config(stub, Set.VERIFY, config))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_verify_and_save_installs_only_on_commit(
    stub: p4r_grpc.P4RuntimeStub, state: SwitchState
) -> None:
    config = p4r.ForwardingPipelineConfig(p4info=make_p4info(), p4_device_config=BLOB_V2)
    set_config(stub, Set.VERIFY_AND_SAVE, config)
    assert not state.ready
    stub.SetForwardingPipelineConfig(Set(device_id=1, action=Set.COMMIT))
    assert state.ready and state.device_config == BLOB_V2
    assert state.lookup("Ingress.config", ())[0] == DEFAULTS["Ingress.config"]


def test_commit_with_nothing_saved_is_failed_precondition(stub: p4r_grpc.P4RuntimeStub) -> None:
    err = status_of(lambda: stub.SetForwardingPipelineConfig(Set(device_id=1, action=Set.COMMIT)))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_reconcile_and_commit_keeps_entries_while_verify_and_commit_clears(
    stub: p4r_grpc.P4RuntimeStub, installed: SwitchState
) -> None:
    installed.insert_entry(CACHE, [KEY, MAC], hit(3))
    config = p4r.ForwardingPipelineConfig(p4info=make_p4info())
    set_config(stub, Set.RECONCILE_AND_COMMIT, config)
    assert installed.lookup(CACHE, (KEY, MAC))[0] == hit(3)
    set_config(stub, Set.VERIFY_AND_COMMIT, config)
    assert installed.lookup(CACHE, (KEY, MAC))[1] is None


# ------------------------------------------------------------------------------ table entries
def test_exact_entry_insert_is_read_back_and_hit_by_lookup(
    addr: str, p4info_path: Path, state: SwitchState
) -> None:
    async def body() -> list[P4TableEntry]:
        async with client(addr, p4info_path) as sw:
            await sw.write([+cache_entry()])
            return await read_all(sw, P4TableEntry("cache"))

    (entry,) = run(body())
    assert entry.match == P4TableMatch({"key": KEY, "dst": MAC})  # finsy decodes to aliases
    assert entry.action == P4TableAction("cache_hit", slot=1, port=2)
    assert state.lookup(CACHE, (KEY, MAC))[0] == hit(1, 2)


def test_lpm_entry_modify_and_delete_change_lookups(
    addr: str, p4info_path: Path, state: SwitchState
) -> None:
    async def body() -> None:
        async with client(addr, p4info_path) as sw:
            await sw.write([+route_entry("10.0.0.0/8", 1), +route_entry("10.1.0.0/16", 2)])
            assert state.lookup(ROUTE, (0x0A010101,))[0] == fwd(2)
            await sw.write([~route_entry("10.1.0.0/16", 5)])
            assert state.lookup(ROUTE, (0x0A010101,))[0] == fwd(5)
            await sw.write([-route_entry("10.1.0.0/16", 5)])
            assert state.lookup(ROUTE, (0x0A010101,))[0] == fwd(1)

    run(body())


def test_read_with_a_match_returns_only_that_entry(
    addr: str, p4info_path: Path, state: SwitchState
) -> None:
    async def body() -> list[P4TableEntry]:
        async with client(addr, p4info_path) as sw:
            state.insert_entry(ROUTE, [Lpm(0x0A000000, 8)], fwd(1))
            state.insert_entry(ROUTE, [Lpm(0x0B000000, 8)], fwd(2))
            query = P4TableEntry("route", match=P4TableMatch({"hdr.ipv4.dst": "11.0.0.0/8"}))
            return await read_all(sw, query)

    (entry,) = run(body())
    assert entry.action == P4TableAction("forward", port=2)


def test_duplicate_insert_fails_only_that_update(
    stub: p4r_grpc.P4RuntimeStub, installed: SwitchState
) -> None:
    err = status_of(
        lambda: write(stub, ports_update(b"\x01", b"\x02"), ports_update(b"\x01", b"\x03"))
    )
    assert err.code() == grpc.StatusCode.UNKNOWN
    assert update_codes(err) == [rpc_code.OK, rpc_code.ALREADY_EXISTS]
    assert installed.lookup("Ingress.port_role", (1,))[0] == fwd(2)


def test_finsy_sees_already_exists_in_the_update_details(addr: str, p4info_path: Path) -> None:
    async def body() -> P4ClientError:
        async with client(addr, p4info_path) as sw:
            await sw.write([+cache_entry()])
            with pytest.raises(P4ClientError) as info:
                await sw.write([+cache_entry(key=KEY + 1), +cache_entry()])
            return info.value

    err = run(body())
    assert err.code == GRPCStatusCode.UNKNOWN
    assert {i: e.canonical_code for i, e in err.details.items()} == {
        1: GRPCStatusCode.ALREADY_EXISTS
    }


def test_modify_and_delete_of_missing_entry_are_not_found(
    stub: p4r_grpc.P4RuntimeStub, installed: SwitchState
) -> None:
    err = status_of(
        lambda: write(
            stub,
            ports_update(b"\x07", b"\x01", p4r.Update.MODIFY),
            ports_update(b"\x07", b"\x01", p4r.Update.DELETE),
        )
    )
    assert update_codes(err) == [rpc_code.NOT_FOUND, rpc_code.NOT_FOUND]


def test_value_wider_than_9_bits_is_invalid_argument(
    stub: p4r_grpc.P4RuntimeStub, installed: SwitchState
) -> None:
    err = status_of(lambda: write(stub, ports_update(b"\x02\x00", b"\x01")))
    assert update_codes(err) == [rpc_code.INVALID_ARGUMENT]


def test_leading_zero_bytes_are_accepted_and_read_back_canonical(
    stub: p4r_grpc.P4RuntimeStub, installed: SwitchState
) -> None:
    write(stub, ports_update(b"\x00\x00\x05", b"\x00\x01"))
    (entity,) = read(stub, p4r.Entity(table_entry=p4r.TableEntry(table_id=PORTS_ID)))
    assert entity.table_entry.match[0].exact.value == b"\x05"
    assert entity.table_entry.action.action.params[0].value == b"\x01"


def test_unknown_table_and_missing_action_are_invalid_argument(
    stub: p4r_grpc.P4RuntimeStub, installed: SwitchState
) -> None:
    bad_table = ports_update(b"\x01", b"\x01")
    bad_table.entity.table_entry.table_id = 0x02FFFFFF
    no_action = ports_update(b"\x01", b"\x01")
    no_action.entity.table_entry.ClearField("action")
    err = status_of(lambda: write(stub, bad_table, no_action))
    assert update_codes(err) == [rpc_code.INVALID_ARGUMENT, rpc_code.INVALID_ARGUMENT]


def test_default_entry_modify_then_read(addr: str, p4info_path: Path, state: SwitchState) -> None:
    new_default = P4TableAction("set_config", threshold=99, mode=2)

    async def body() -> list[P4TableEntry]:
        async with client(addr, p4info_path) as sw:
            await sw.write([~P4TableEntry("config", action=new_default, is_default_action=True)])
            return await read_all(sw, P4TableEntry("config", is_default_action=True))

    (entry,) = run(body())
    assert entry.is_default_action and entry.action == new_default
    assert state.lookup("Ingress.config", ()) == (
        ActionCall("Ingress.set_config", {"threshold": 99, "mode": 2}),
        None,
    )


def test_const_default_action_modify_is_permission_denied(
    stub: p4r_grpc.P4RuntimeStub, installed: SwitchState
) -> None:
    entry = p4r.TableEntry(table_id=FIXED_ID, is_default_action=True)
    entry.action.action.action_id = DROP_ID
    update = p4r.Update(type=p4r.Update.MODIFY, entity=p4r.Entity(table_entry=entry))
    assert update_codes(status_of(lambda: write(stub, update))) == [rpc_code.PERMISSION_DENIED]


# ------------------------------------------------------------------------------ counters
def test_direct_counter_is_read_and_reset(addr: str, p4info_path: Path, state: SwitchState) -> None:
    async def body() -> None:
        async with client(addr, p4info_path) as sw:
            await sw.write([+cache_entry()])
            _, handle = state.lookup(CACHE, (KEY, MAC))
            state.count_direct(handle, 3, 300)
            query = P4DirectCounterEntry(table_entry=cache_entry())
            (counted,) = await read_all(sw, query)
            assert (counted.packet_count, counted.byte_count) == (3, 300)
            with_data = P4TableEntry("cache", counter_data=P4CounterData())
            (entry,) = await read_all(sw, with_data)
            assert entry.counter_data == P4CounterData(packet_count=3, byte_count=300)
            await sw.write([P4DirectCounterEntry(table_entry=cache_entry(), data=P4CounterData())])
            assert state.direct_counter_value(CACHE, (KEY, MAC)) == (0, 0)

    run(body())


def test_indirect_counter_read_one_all_and_reset(
    addr: str, p4info_path: Path, state: SwitchState
) -> None:
    async def body() -> None:
        async with client(addr, p4info_path) as sw:
            state.count("Ingress.port_counter", 2, 1, 64)
            (cell,) = await read_all(sw, P4CounterEntry("port_counter", index=2))
            assert (cell.packet_count, cell.byte_count) == (1, 64)
            cells = await read_all(sw, P4CounterEntry("port_counter"))
            assert [c.index for c in cells] == list(range(16))
            await sw.write([P4CounterEntry("port_counter", index=2, data=P4CounterData())])
            assert state.counter_value("Ingress.port_counter", 2) == (0, 0)

    run(body())


# ------------------------------------------------------------------------------ multicast
def test_multicast_group_insert_read_modify_delete(
    addr: str, p4info_path: Path, state: SwitchState
) -> None:
    async def body() -> None:
        async with client(addr, p4info_path) as sw:
            await sw.write([+P4MulticastGroupEntry(7, replicas=[1, (2, 1)])])
            assert list(state.multicast_group(7)) == [(1, 0), (2, 1)]
            (group,) = await read_all(sw, P4MulticastGroupEntry())
            assert group.multicast_group_id == 7 and len(group.replicas) == 2
            await sw.write([~P4MulticastGroupEntry(7, replicas=[3])])
            assert list(state.multicast_group(7)) == [(3, 0)]
            await sw.write([-P4MulticastGroupEntry(7)])
            assert state.multicast_group(7) == ()

    run(body())


def test_multicast_group_errors_are_per_update(
    addr: str, p4info_path: Path, state: SwitchState
) -> None:
    async def body() -> Mapping[int, Any]:
        async with client(addr, p4info_path) as sw:
            state.write_multicast_group(WriteOp.INSERT, 1, [Replica(1)])
            with pytest.raises(P4ClientError) as info:
                await sw.write([+P4MulticastGroupEntry(1, replicas=[1]), -P4MulticastGroupEntry(2)])
            return {i: e.canonical_code for i, e in info.value.details.items()}

    assert run(body()) == {0: GRPCStatusCode.ALREADY_EXISTS, 1: GRPCStatusCode.NOT_FOUND}


# ------------------------------------------------------------------------------ digests
def test_digest_reaches_client_only_after_digest_entry(
    addr: str, p4info_path: Path, state: SwitchState
) -> None:
    async def body() -> None:
        async with client(addr, p4info_path) as sw:
            digests = sw.read_digests(DIGEST)
            first = asyncio.ensure_future(anext(digests))
            await asyncio.sleep(0.05)
            state.emit_digest(DIGEST, (111, 1))
            await asyncio.sleep(0.1)
            assert not first.done() and state.stats.digests_unconfigured == 1
            await sw.write([+P4DigestEntry(DIGEST)])
            (config,) = await read_all(sw, P4DigestEntry(DIGEST))
            assert config.digest_id == DIGEST
            state.emit_digest(DIGEST, (222, 2))
            got = await first
            assert got.list_id == 1 and list(got) == [{"key": 222, "port": 2}]
            await sw.write([got.ack()])

    run(body())


# ------------------------------------------------------------------------------ packet I/O
def test_packet_out_reaches_handler_with_metadata(
    addr: str, p4info_path: Path, state: SwitchState
) -> None:
    got: list[tuple[bytes, dict[str, int]]] = []
    state.packet_out_handler = lambda payload, md: got.append((payload, dict(md)))

    async def body() -> None:
        async with client(addr, p4info_path) as sw:
            await sw.write([P4PacketOut(b"\x01\x02", egress_port=300, _pad=0)])
            await until(lambda: bool(got))

    run(body())
    assert got == [(b"\x01\x02", {"egress_port": 300, "_pad": 0})]


def test_packet_in_reaches_primary_with_metadata(
    addr: str, p4info_path: Path, state: SwitchState
) -> None:
    async def body() -> None:
        async with client(addr, p4info_path) as sw:
            packets = sw.read_packets()
            first = asyncio.ensure_future(anext(packets))
            await asyncio.sleep(0.05)
            state.emit_packet_in(b"frame", {"ingress_port": 260})
            packet = await first
            assert packet.payload == b"frame"
            assert packet.metadata == {"ingress_port": 260, "_pad": 0}

    run(body())


def test_packet_out_with_unknown_metadata_gets_a_stream_error(
    streams: Callable[[], RawStream], installed: SwitchState
) -> None:
    installed.packet_out_handler = lambda payload, md: pytest.fail("must be dropped")
    s = streams()
    s.arbitrate(1)
    s.recv()
    bad = p4r.PacketOut(payload=b"x", metadata=[p4r.PacketMetadata(metadata_id=9, value=b"\x01")])
    s.send(p4r.StreamMessageRequest(packet=bad))
    error = s.recv().error
    assert error.canonical_code == rpc_code.INVALID_ARGUMENT
    assert error.packet_out.packet_out == bad


# ------------------------------------------------------------------------------ arbitration
def test_lower_election_id_joins_as_backup(streams: Callable[[], RawStream]) -> None:
    a, b = streams(), streams()
    a.arbitrate(5)
    assert arbitration(a.recv()) == (rpc_code.OK, 5)
    b.arbitrate(3)
    assert arbitration(b.recv()) == (rpc_code.ALREADY_EXISTS, 5)
    assert a.idle()


def test_higher_election_id_takes_over_and_all_are_told(streams: Callable[[], RawStream]) -> None:
    a, b = streams(), streams()
    a.arbitrate(5)
    a.recv()
    b.arbitrate(9)
    assert arbitration(b.recv()) == (rpc_code.OK, 9)
    assert arbitration(a.recv()) == (rpc_code.ALREADY_EXISTS, 9)


def test_only_the_primary_may_write(
    stub: p4r_grpc.P4RuntimeStub, streams: Callable[[], RawStream], installed: SwitchState
) -> None:
    a, b = streams(), streams()
    a.arbitrate(5)
    a.recv()
    b.arbitrate(3)
    b.recv()
    backup = status_of(
        lambda: write(stub, ports_update(b"\x01", b"\x01"), election_id=p4r.Uint128(low=3))
    )
    assert backup.code() == grpc.StatusCode.PERMISSION_DENIED
    write(stub, ports_update(b"\x01", b"\x01"), election_id=p4r.Uint128(low=5))


def test_write_without_any_stream_needs_no_election_id(
    stub: p4r_grpc.P4RuntimeStub, installed: SwitchState
) -> None:
    write(stub, ports_update(b"\x01", b"\x01"))
    err = status_of(
        lambda: write(stub, ports_update(b"\x02", b"\x01"), election_id=p4r.Uint128(low=1))
    )
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED


def test_primary_disconnect_promotes_the_backup(
    streams: Callable[[], RawStream],
) -> None:
    a, b, c = streams(), streams(), streams()
    for s, eid in ((a, 9), (b, 5), (c, 2)):
        s.arbitrate(eid)
        s.recv()
    a.close()
    assert arbitration(b.recv()) == (rpc_code.OK, 5)
    assert arbitration(c.recv()) == (rpc_code.ALREADY_EXISTS, 5)


def test_finsy_backup_is_denied_then_promoted_when_primary_leaves(
    addr: str, p4info_path: Path, state: SwitchState
) -> None:
    async def body() -> None:
        async with client(addr, p4info_path, election_id=10) as b:
            async with client(addr, p4info_path, election_id=20) as a:
                await until(lambda: a.is_primary and not b.is_primary)
                with pytest.raises(P4ClientError) as info:
                    await b.write([+cache_entry()])
                assert info.value.code == GRPCStatusCode.PERMISSION_DENIED
            await until(lambda: b.is_primary)
            await b.write([+cache_entry()])

    run(body())
    assert state.lookup(CACHE, (KEY, MAC))[1] is not None


def test_duplicate_election_id_ends_the_stream(streams: Callable[[], RawStream]) -> None:
    a, b = streams(), streams()
    a.arbitrate(5)
    a.recv()
    b.arbitrate(5)
    err = b.recv_error()
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "Election id already exists" in (err.details() or "")


def test_non_default_role_and_wrong_device_are_refused(streams: Callable[[], RawStream]) -> None:
    a, b = streams(), streams()
    a.arbitrate(5, role="sdn")
    assert a.recv_error().code() == grpc.StatusCode.UNIMPLEMENTED
    b.arbitrate(5, device_id=7)
    assert b.recv_error().code() == grpc.StatusCode.NOT_FOUND


# ------------------------------------------------------------------------------ misc requests
def test_rollback_atomicity_is_unimplemented(
    stub: p4r_grpc.P4RuntimeStub, installed: SwitchState
) -> None:
    err = status_of(
        lambda: write(
            stub, ports_update(b"\x01", b"\x01"), atomicity=p4r.WriteRequest.ROLLBACK_ON_ERROR
        )
    )
    assert err.code() == grpc.StatusCode.UNIMPLEMENTED


def test_wrong_device_id_is_not_found(stub: p4r_grpc.P4RuntimeStub, installed: SwitchState) -> None:
    err = status_of(lambda: list(stub.Read(p4r.ReadRequest(device_id=2))))
    assert err.code() == grpc.StatusCode.NOT_FOUND


def test_finsy_delete_all_empties_the_switch(
    addr: str, p4info_path: Path, state: SwitchState
) -> None:
    async def body() -> None:
        async with client(addr, p4info_path) as sw:
            await sw.write([+cache_entry(), +route_entry("10.0.0.0/8", 1)])
            await sw.write([+P4MulticastGroupEntry(3, replicas=[1]), +P4DigestEntry(DIGEST)])
            await sw.write(
                [~P4TableEntry("route", action=P4TableAction("drop"), is_default_action=True)]
            )
            await sw.delete_all()

    run(body())
    assert state.entries(CACHE) == [] and state.entries(ROUTE) == []
    assert state.multicast_groups() == [] and state.digest_config(DIGEST) is None
    assert state.lookup(ROUTE, (1,))[0] == ActionCall("NoAction", {})


def test_p4info_of_unsupported_match_kind_is_unimplemented(
    stub: p4r_grpc.P4RuntimeStub,
) -> None:
    p4info = make_p4info()
    p4info.tables[0].match_fields[0].other_match_type = "selector"
    config = p4r.ForwardingPipelineConfig(p4info=p4info)
    err = status_of(lambda: set_config(stub, Set.VERIFY_AND_COMMIT, config))
    assert err.code() == grpc.StatusCode.UNIMPLEMENTED


# ------------------------------------------------- what a foreign client found (issue 17)
def test_default_entry_of_a_keyed_table_reads_back_without_a_key(
    stub: p4r_grpc.P4RuntimeStub, installed: SwitchState
) -> None:
    query = p4r.Entity(table_entry=p4r.TableEntry(table_id=CACHE_ID, is_default_action=True))
    (entity,) = read(stub, query)
    te = entity.table_entry
    assert te.is_default_action and not te.match and te.table_id == CACHE_ID
    assert te.action.action.action_id != 0


def test_a_normal_entry_in_a_keyless_table_is_invalid_argument(
    stub: p4r_grpc.P4RuntimeStub, installed: SwitchState
) -> None:
    upd = p4r.Update(type=p4r.Update.INSERT)
    upd.entity.table_entry.table_id = CONFIG_ID
    default = read(
        stub, p4r.Entity(table_entry=p4r.TableEntry(table_id=CONFIG_ID, is_default_action=True))
    )[0]
    upd.entity.table_entry.action.CopyFrom(default.table_entry.action)
    err = status_of(lambda: write(stub, upd))
    assert update_codes(err) == [rpc_code.INVALID_ARGUMENT]
    assert installed.entries("Ingress.config") == []


@pytest.mark.parametrize(
    "blob",
    [
        b"garbage",
        b"\xff\x00",
        b"[1, 2]",
        b'{"no": "pipelines"}',
        b'{"pipelines": [{"name": "ingress", "tables": [{"name": "Other.table"}]}]}',
    ],
)
def test_a_device_config_that_is_not_this_programs_bmv2_json_is_refused(
    stub: p4r_grpc.P4RuntimeStub, state: SwitchState, blob: bytes
) -> None:
    config = p4r.ForwardingPipelineConfig(p4info=make_p4info(), p4_device_config=blob)
    err = status_of(lambda: set_config(stub, Set.VERIFY_AND_COMMIT, config))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "device_config" in (err.details() or "")
    assert not state.ready


def test_verify_checks_the_device_config_too(stub: p4r_grpc.P4RuntimeStub) -> None:
    config = p4r.ForwardingPipelineConfig(p4info=make_p4info(), p4_device_config=b"garbage")
    err = status_of(lambda: set_config(stub, Set.VERIFY, config))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_an_empty_device_config_is_the_reference_targets_own(
    stub: p4r_grpc.P4RuntimeStub, state: SwitchState
) -> None:
    config = p4r.ForwardingPipelineConfig(p4info=make_p4info())
    set_config(stub, Set.VERIFY_AND_COMMIT, config)
    assert state.ready and state.device_config == b""


def test_direct_counter_of_the_default_entry_reads_back_with_its_action(
    stub: p4r_grpc.P4RuntimeStub, installed: SwitchState
) -> None:
    query = p4r.Entity()
    query.direct_counter_entry.table_entry.table_id = CACHE_ID
    query.direct_counter_entry.table_entry.is_default_action = True
    (entity,) = read(stub, query)
    te = entity.direct_counter_entry.table_entry
    assert te.is_default_action and not te.match and te.action.action.action_id != 0
