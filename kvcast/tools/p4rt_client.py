"""A small blocking P4Runtime client for tests, benchmarks and tools.

The controller's P4Runtime layer (controlplane/) is asynchronous and built on finsy; this client
is for code that wants one blocking call per step: the conformance harness that programs BMv2
and the reference target identically, the benchmarks and the emulation's bring-up. It speaks
names, not ids: every table, action, field and counter is looked up in the P4Info.

Classes:
    P4RuntimeClient: one primary connection to one switch (stream, Write, Read).
    P4RuntimeClientError: a call failed; carries the gRPC code and per-update errors.
    Match: helpers to build match values (exact, lpm).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from finsy.proto import p4i, p4r, p4r_grpc, rpc_status


class P4RuntimeClientError(RuntimeError):
    """A P4Runtime call failed.

    Attributes:
        code: the gRPC status code.
        details: per-update error messages, where the server sent them.
    """

    def __init__(
        self, message: str, code: grpc.StatusCode | None = None, details: Sequence[str] = ()
    ):
        super().__init__(message if not details else f"{message}: {'; '.join(details)}")
        self.code = code
        self.details = list(details)

    @property
    def not_found(self) -> bool:
        """Every failed update failed with NOT_FOUND (e.g. deleting an absent entry)."""
        code = str(grpc.StatusCode.NOT_FOUND.value[0])
        return bool(self.details) and all(d.startswith(f"{code}:") for d in self.details)


@dataclass(frozen=True)
class Lpm:
    """An LPM match value."""

    value: int
    prefix_len: int


def _enc(value: int, bitwidth: int) -> bytes:
    if value < 0 or value >> bitwidth:
        raise P4RuntimeClientError(f"value {value} does not fit {bitwidth} bits")
    raw = value.to_bytes((bitwidth + 7) // 8, "big")
    return raw.lstrip(b"\0") or b"\0"


def _dec(raw: bytes) -> int:
    return int.from_bytes(raw, "big")


class P4RuntimeClient:
    """One primary P4Runtime connection to one switch.

    Args:
        address: ``host:port`` of the P4Runtime server.
        device_id: the switch's device id.
        election_id: this client's election id (the highest one is primary).
        timeout: seconds for each unary call and for arbitration.
    """

    def __init__(
        self, address: str, device_id: int = 1, election_id: int = 1, timeout: float = 10.0
    ):
        self.address = address
        self.device_id = device_id
        self.election_id = election_id
        self.timeout = timeout
        self.p4info: p4i.P4Info | None = None
        self._channel = grpc.insecure_channel(address)
        self._stub = p4r_grpc.P4RuntimeStub(self._channel)
        self._requests: queue.SimpleQueue[p4r.StreamMessageRequest | None] = queue.SimpleQueue()
        self.packet_ins: queue.SimpleQueue[tuple[bytes, dict[str, int]]] = queue.SimpleQueue()
        self.digests: queue.SimpleQueue[tuple[str, list[list[int]]]] = queue.SimpleQueue()
        self._arbitrated = threading.Event()
        self._arbitration_error: str | None = None
        self._stream_thread: threading.Thread | None = None
        self._names: dict[tuple[str, str], Any] = {}
        self._ids: dict[int, str] = {}

    # ------------------------------------------------------------------ connection
    def connect(self, wait_ready: float = 30.0) -> P4RuntimeClient:
        """Waits for the server, opens the stream channel and becomes primary.

        Args:
            wait_ready: seconds to wait for the server to accept connections.

        Returns:
            self.

        Raises:
            P4RuntimeClientError: the server does not answer or refuses arbitration.
        """
        try:
            grpc.channel_ready_future(self._channel).result(timeout=wait_ready)
        except grpc.FutureTimeoutError as exc:
            raise P4RuntimeClientError(f"no P4Runtime server at {self.address}") from exc
        self._stream_thread = threading.Thread(
            target=self._stream, daemon=True, name=f"p4rt-stream-{self.address}"
        )
        self._stream_thread.start()
        arb = p4r.StreamMessageRequest()
        arb.arbitration.device_id = self.device_id
        arb.arbitration.election_id.low = self.election_id
        self._requests.put(arb)
        if not self._arbitrated.wait(self.timeout):
            raise P4RuntimeClientError(
                f"no arbitration answer from {self.address}: {self._arbitration_error}"
            )
        if self._arbitration_error:
            raise P4RuntimeClientError(self._arbitration_error)
        return self

    def close(self) -> None:
        """Closes the stream and the channel."""
        self._requests.put(None)
        self._channel.close()
        if self._stream_thread:
            self._stream_thread.join(timeout=2)

    def __enter__(self) -> P4RuntimeClient:
        return self.connect()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request_iter(self) -> Iterator[p4r.StreamMessageRequest]:
        while True:
            msg = self._requests.get()
            if msg is None:
                return
            yield msg

    def _stream(self) -> None:
        try:
            for resp in self._stub.StreamChannel(self._request_iter()):
                which = resp.WhichOneof("update")
                if which == "arbitration":
                    if resp.arbitration.status.code != 0:
                        self._arbitration_error = (
                            f"not primary: {resp.arbitration.status.message or 'backup'}"
                        )
                    self._arbitrated.set()
                elif which == "packet":
                    md = {
                        self._ids.get(m.metadata_id, str(m.metadata_id)): _dec(m.value)
                        for m in resp.packet.metadata
                    }
                    self.packet_ins.put((resp.packet.payload, md))
                elif which == "digest":
                    self._on_digest(resp.digest)
        except grpc.RpcError as exc:
            self._arbitration_error = f"stream closed: {exc.code()}"
            self._arbitrated.set()

    def _on_digest(self, digest: p4r.DigestList) -> None:
        name = self._ids.get(digest.digest_id, str(digest.digest_id))
        rows = [[_dec(m.bitstring) for m in d.struct.members] for d in digest.data]
        self.digests.put((name, rows))
        ack = p4r.StreamMessageRequest()
        ack.digest_ack.digest_id = digest.digest_id
        ack.digest_ack.list_id = digest.list_id
        self._requests.put(ack)

    # ------------------------------------------------------------------ pipeline
    def set_pipeline(self, p4info: p4i.P4Info, device_config: bytes = b"") -> None:
        """Installs a program (VERIFY_AND_COMMIT).

        Args:
            p4info: the program's P4Info.
            device_config: target-specific config (BMv2 JSON; empty for the reference target).

        Raises:
            P4RuntimeClientError: the server refused it.
        """
        req = p4r.SetForwardingPipelineConfigRequest(
            device_id=self.device_id,
            action=p4r.SetForwardingPipelineConfigRequest.VERIFY_AND_COMMIT,
        )
        req.election_id.low = self.election_id
        req.config.p4info.CopyFrom(p4info)
        req.config.p4_device_config = device_config
        self._call(self._stub.SetForwardingPipelineConfig, req)
        self.use_p4info(p4info)

    def use_p4info(self, p4info: p4i.P4Info) -> None:
        """Indexes a P4Info without installing it (the switch already runs the program)."""
        self.p4info = p4info
        names: dict[tuple[str, str], Any] = {}
        ids: dict[int, str] = {}
        for kind in ("tables", "actions", "counters", "direct_counters", "digests", "registers"):
            for ent in getattr(p4info, kind):
                names[(kind, ent.preamble.name)] = ent
                ids[ent.preamble.id] = ent.preamble.name
        for cpm in p4info.controller_packet_metadata:
            names[("controller_packet_metadata", cpm.preamble.name)] = cpm
            if cpm.preamble.name == "packet_in":
                for md in cpm.metadata:
                    ids[md.id] = md.name
        self._names = names
        self._ids = ids

    def _entity(self, kind: str, name: str) -> Any:
        try:
            return self._names[(kind, name)]
        except KeyError:
            raise P4RuntimeClientError(f"no {kind[:-1]} named {name!r} in the P4Info") from None

    # ------------------------------------------------------------------ writes
    def _call(self, method: Any, request: Any) -> Any:
        try:
            return method(request, timeout=self.timeout)
        except grpc.RpcError as exc:
            raise P4RuntimeClientError(
                f"{type(request).__name__} failed ({exc.code()}): {exc.details()}",
                exc.code(),
                _update_errors(exc),
            ) from exc

    def write(self, updates: Sequence[p4r.Update]) -> None:
        """Sends one WriteRequest.

        Raises:
            P4RuntimeClientError: any update failed (details list each error).
        """
        req = p4r.WriteRequest(device_id=self.device_id, updates=list(updates))
        req.election_id.low = self.election_id
        self._call(self._stub.Write, req)

    def table_entry(
        self,
        table: str,
        match: Mapping[str, int | Lpm],
        action: str | None,
        params: Mapping[str, int] | None = None,
        priority: int = 0,
        default: bool = False,
    ) -> p4r.TableEntry:
        """Builds a TableEntry from names and integers.

        Args:
            table: table name.
            match: match field name to value (an :class:`Lpm` for lpm fields).
            action: action name; None for an entry that only names its match (delete, read).
            params: action parameter name to value.
            priority: for ternary tables.
            default: build the default entry (match must be empty).

        Returns:
            The TableEntry message.

        Raises:
            P4RuntimeClientError: an unknown name or a value too wide.
        """
        tinfo = self._entity("tables", table)
        entry = p4r.TableEntry(
            table_id=tinfo.preamble.id, priority=priority, is_default_action=default
        )
        fields = {mf.name: mf for mf in tinfo.match_fields}
        for fname, val in match.items():
            if fname not in fields:
                raise P4RuntimeClientError(f"table {table} has no match field {fname!r}")
            mf = fields[fname]
            fm = entry.match.add(field_id=mf.id)
            if isinstance(val, Lpm):
                fm.lpm.value = _enc(val.value, mf.bitwidth)
                fm.lpm.prefix_len = val.prefix_len
            else:
                fm.exact.value = _enc(val, mf.bitwidth)
        if action is not None:
            entry.action.action.CopyFrom(self._action(action, params or {}))
        return entry

    def _action(self, action: str, params: Mapping[str, int]) -> p4r.Action:
        ainfo = self._entity("actions", action)
        msg = p4r.Action(action_id=ainfo.preamble.id)
        known = {p.name: p for p in ainfo.params}
        if set(params) != set(known):
            raise P4RuntimeClientError(
                f"action {action} takes {sorted(known)}, got {sorted(params)}"
            )
        for p in ainfo.params:
            msg.params.add(param_id=p.id, value=_enc(params[p.name], p.bitwidth))
        return msg

    def insert(
        self,
        table: str,
        match: Mapping[str, int | Lpm],
        action: str,
        params: Mapping[str, int] | None = None,
        priority: int = 0,
    ) -> None:
        """Inserts one table entry."""
        self._update(p4r.Update.INSERT, self.table_entry(table, match, action, params, priority))

    def modify(
        self,
        table: str,
        match: Mapping[str, int | Lpm],
        action: str,
        params: Mapping[str, int] | None = None,
        priority: int = 0,
    ) -> None:
        """Modifies one table entry."""
        self._update(p4r.Update.MODIFY, self.table_entry(table, match, action, params, priority))

    def delete(self, table: str, match: Mapping[str, int | Lpm], priority: int = 0) -> None:
        """Deletes one table entry (the action is irrelevant to a delete)."""
        self._update(p4r.Update.DELETE, self.table_entry(table, match, None, priority=priority))

    def set_default(self, table: str, action: str, params: Mapping[str, int] | None = None) -> None:
        """Modifies a table's default action."""
        self._update(p4r.Update.MODIFY, self.table_entry(table, {}, action, params, default=True))

    def _update(self, kind: int, entry: p4r.TableEntry) -> None:
        upd = p4r.Update(type=kind)  # type: ignore[arg-type]
        upd.entity.table_entry.CopyFrom(entry)
        self.write([upd])

    def multicast_group(
        self, group_id: int, replicas: Sequence[tuple[int, int]], update: int = p4r.Update.INSERT
    ) -> None:
        """Writes a multicast group of (egress_port, instance) replicas."""
        upd = p4r.Update(type=update)  # type: ignore[arg-type]
        mg = upd.entity.packet_replication_engine_entry.multicast_group_entry
        mg.multicast_group_id = group_id
        for port, instance in replicas:
            mg.replicas.add(egress_port=port, instance=instance)
        self.write([upd])

    def set_pool_node(self, port: int, pool_ip: int) -> None:
        """Gives ``port`` the pool role and every pool-owner bucket to the node at ``pool_ip``.

        The buckets go in one write request.
        """
        from kvcast import p4constants as c

        self.insert(
            c.TABLE_INGRESS_PORT_ROLE_PORT_ROLE,
            {"port": port},
            c.ACTION_INGRESS_PORT_ROLE_SET_PORT_ROLE,
            {"role": c.PORT_ROLE_POOL},
        )
        updates = []
        for bucket in range(c.POOL_BUCKETS):
            upd = p4r.Update(type=p4r.Update.INSERT)
            upd.entity.table_entry.CopyFrom(
                self.table_entry(
                    c.TABLE_INGRESS_POOL_OWNER_POOL_OWNER,
                    {"bucket": bucket},
                    c.ACTION_INGRESS_POOL_OWNER_SET_POOL,
                    {"pool_ip": pool_ip},
                )
            )
            updates.append(upd)
        self.write(updates)

    def configure_digest(
        self,
        digest: str,
        max_list_size: int = 1,
        max_timeout_ns: int = 0,
        ack_timeout_ns: int = 1_000_000_000,
    ) -> None:
        """Enables delivery of a digest (servers send none until configured)."""
        dinfo = self._entity("digests", digest)
        upd = p4r.Update(type=p4r.Update.INSERT)
        upd.entity.digest_entry.digest_id = dinfo.preamble.id
        cfg = upd.entity.digest_entry.config
        cfg.max_list_size = max_list_size
        cfg.max_timeout_ns = max_timeout_ns
        cfg.ack_timeout_ns = ack_timeout_ns
        self.write([upd])

    def packet_out(self, payload: bytes, egress_port: int = 0) -> None:
        """Sends a PacketOut (egress_port 0: run it through the pipeline from the CPU port)."""
        cpm = self._entity("controller_packet_metadata", "packet_out")
        msg = p4r.StreamMessageRequest()
        msg.packet.payload = payload
        for md in cpm.metadata:
            value = egress_port if md.name == "egress_port" else 0
            msg.packet.metadata.add(metadata_id=md.id, value=_enc(value, md.bitwidth))
        self._requests.put(msg)

    def load_chunk(
        self,
        tenant: int,
        key: int,
        data: bytes,
        slot_base: int,
        epoch: int,
        service_mac: str = "02:00:00:00:00:fe",
        service_ip: str = "10.0.100.1",
    ) -> int:
        """Loads one chunk into switch SRAM in the safe order, blocking.

        Deletes the chunk's cache entry if present, WRITEs every fragment into slots
        ``slot_base..`` with ``epoch`` and waits for each WRITE_ACK, then inserts the entry. The
        controller's FragmentLoader (controlplane) does the same asynchronously; this is for
        tests, benchmarks and experiments that hold a blocking client.

        Args:
            tenant: tenant id.
            key: chunk key.
            data: the chunk's bytes.
            slot_base: first fragment slot.
            epoch: epoch of this load (must differ from the slots' previous one).
            service_mac: MAC the WRITE frames carry (the switch ignores it).
            service_ip: IPv4 address the WRITE frames carry.

        Returns:
            The number of fragments written.

        Raises:
            P4RuntimeClientError: a WRITE was not acknowledged or the entry was refused.
        """
        from kvcast import p4constants as c
        from kvcast import wire

        frag = c.FRAG_BYTES
        count = max(1, -(-len(data) // frag))
        match = {"tenant": tenant, "key": key}
        try:
            self.delete(c.TABLE_INGRESS_CACHE_CACHE_TABLE, match)
        except P4RuntimeClientError as exc:
            if not exc.not_found:
                raise
        for idx in range(count):
            payload = wire.write_message(
                tenant,
                key,
                idx,
                slot_base + idx,
                epoch,
                data[idx * frag : (idx + 1) * frag],
                req_id=idx,
            )
            self.packet_out(
                wire.udp_frame(
                    service_mac,
                    service_mac,
                    service_ip,
                    service_ip,
                    c.KVP_UDP_PORT,
                    c.KVP_UDP_PORT,
                    payload,
                )
            )
            ack, _md = self.wait_packet_in(timeout=10)
            hdr = wire.KvpHeader.unpack(ack, wire.FRAME_KVP_OFFSET)
            if hdr.op != c.KVP_OP_WRITE_ACK or hdr.index != slot_base + idx:
                raise P4RuntimeClientError(f"unexpected WRITE_ACK for slot {hdr.index}")
        self.insert(
            c.TABLE_INGRESS_CACHE_CACHE_TABLE,
            match,
            c.ACTION_INGRESS_CACHE_CACHE_HIT,
            {"slot_base": slot_base, "frag_count": count, "epoch": epoch},
        )
        return count

    # ------------------------------------------------------------------ reads
    def _read(self, entity: p4r.Entity) -> list[p4r.Entity]:
        req = p4r.ReadRequest(device_id=self.device_id, entities=[entity])
        out: list[p4r.Entity] = []
        try:
            for resp in self._stub.Read(req, timeout=self.timeout):
                out.extend(resp.entities)
        except grpc.RpcError as exc:
            raise P4RuntimeClientError(
                f"Read failed ({exc.code()}): {exc.details()}", exc.code()
            ) from exc
        return out

    def counter(self, counter: str, index: int) -> tuple[int, int]:
        """Reads one indirect counter cell as (packets, bytes)."""
        cinfo = self._entity("counters", counter)
        ent = p4r.Entity()
        ent.counter_entry.counter_id = cinfo.preamble.id
        ent.counter_entry.index.index = index
        for e in self._read(ent):
            d = e.counter_entry.data
            return d.packet_count, d.byte_count
        raise P4RuntimeClientError(f"counter {counter}[{index}] not returned")

    def counters(self, counter: str) -> dict[int, int]:
        """Reads every cell of an indirect counter as index -> packets."""
        cinfo = self._entity("counters", counter)
        ent = p4r.Entity()
        ent.counter_entry.counter_id = cinfo.preamble.id
        return {
            e.counter_entry.index.index: e.counter_entry.data.packet_count for e in self._read(ent)
        }

    def table_entries(self, table: str) -> list[p4r.TableEntry]:
        """Reads every entry of a table."""
        ent = p4r.Entity()
        ent.table_entry.table_id = self._entity("tables", table).preamble.id
        return [e.table_entry for e in self._read(ent)]

    def multicast_groups(self) -> dict[int, list[tuple[int, int]]]:
        """Reads every multicast group as id -> sorted (egress port, instance) replicas."""
        ent = p4r.Entity()
        ent.packet_replication_engine_entry.multicast_group_entry.multicast_group_id = 0
        return {
            mg.multicast_group_id: sorted(
                (_dec(r.port) if r.port else r.egress_port, r.instance) for r in mg.replicas
            )
            for mg in (
                e.packet_replication_engine_entry.multicast_group_entry for e in self._read(ent)
            )
        }

    def direct_counter(self, table: str, match: Mapping[str, int | Lpm]) -> int:
        """Reads the direct counter (packets) of one entry."""
        ent = p4r.Entity()
        ent.direct_counter_entry.table_entry.CopyFrom(self.table_entry(table, match, None))
        for e in self._read(ent):
            return int(e.direct_counter_entry.data.packet_count)
        raise P4RuntimeClientError(f"no direct counter for {match} in {table}")

    def wait_packet_in(self, timeout: float = 2.0) -> tuple[bytes, dict[str, int]]:
        """Returns the next PacketIn.

        Raises:
            P4RuntimeClientError: none arrived in time.
        """
        try:
            return self.packet_ins.get(timeout=timeout)
        except queue.Empty:
            raise P4RuntimeClientError(f"no PacketIn within {timeout} s") from None


def _update_errors(exc: grpc.RpcError) -> list[str]:
    """The per-update errors a P4Runtime server packs into the status details."""
    out: list[str] = []
    metadata: Any = exc.trailing_metadata() or ()  # type: ignore[attr-defined]
    for item in metadata:
        key, value = item[0], item[1]
        if key != "grpc-status-details-bin":
            continue
        status = rpc_status.Status()
        status.ParseFromString(value)
        for detail in status.details:
            err = p4r.Error()
            if detail.Unpack(err) and err.canonical_code != 0:
                out.append(f"{err.canonical_code}: {err.message}")
    return out
