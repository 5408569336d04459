"""The kvcast switch pipeline in Python: p4src/v1model/kvcast.p4, packet for packet.

This is the reference target's data plane. It keeps the same table, action, register, counter
and digest names and semantics as the P4 program (tables live in a P4Info-driven
:class:`~refswitch.state.SwitchState`, written over P4Runtime), and follows the program's
control flow block by block so that a reader can hold the two side by side. Conformance vectors
(tests/conformance) check that both give the same packets and counters.

Classes:
    Registers: the program's register arrays (fragment store and sketch rows).
    Pipeline: edge guard, parser, ingress, multicast replication, egress and deparser for one
        packet.
    Output: one packet the pipeline sends, with its egress port.
"""

from __future__ import annotations

import array
import logging
import struct
import zlib
from dataclasses import dataclass

from kvcast import p4constants as c
from kvcast.wire import KVP_STRUCT
from refswitch.edge import edge_verdict
from refswitch.state import SwitchState
from refswitch.tables import ActionCall

log = logging.getLogger(__name__)

_U16 = struct.Struct("!H")
_U32 = struct.Struct("!I")
_PORTS = struct.Struct("!HH")
_TENANT_GROUP_KEY = struct.Struct("!HHQ")
_IPV4_WORDS = struct.Struct("!10H")
# From the IPv4 header on: total_len (ip + 2), udp.length (ip + 24), kvp.payload_len (ip + 56).
_LENGTHS = struct.Struct("!2xH20xH30xH")
_IPV4 = struct.Struct("!BBHHHBBH4s4s")
_UDP = struct.Struct("!HHHH")
# The sketch rows' hash inputs: {tenant, key} and {key[31:0], tenant, key[63:32]}.
_SKETCH_TK = struct.Struct("!HQ")
_SKETCH_KTK = struct.Struct("!IHI")
_MAX16 = 0xFFFF
_REPORT_VALID = 1 << 32  # set in every report-row mark, so an all-zero cell is never a mark

ETH_LEN = 14
IPV4_LEN = c.IPV4_HDR_BYTES
UDP_LEN = c.UDP_HDR_BYTES
KVP_LEN = c.KVP_HDR_BYTES
PACKET_OUT_LEN = 2
PACKET_IN_LEN = 2
# Offsets in a frame from a host port (no packet_out header), for the fast path.
_IP = ETH_LEN
_UDP_AT = _IP + IPV4_LEN
_KVP = _UDP_AT + UDP_LEN
_VALUE = _KVP + KVP_LEN
_GET_FRAME_LEN = _VALUE + c.FRAG_BYTES
_GET_VERSION_OP = (c.KVP_VERSION << 4) | c.KVP_OP_GET
_NOCACHE = c.KVP_FLAG_NOCACHE

# Table names (from the generated constants: P4 is the single source).
T_PORT_ROLE = c.TABLE_INGRESS_PORT_ROLE_PORT_ROLE
T_TENANT_BINDING = c.TABLE_INGRESS_PORT_ROLE_TENANT_BINDING
T_GROUP_MEMBER = c.TABLE_INGRESS_PORT_ROLE_GROUP_MEMBER
T_CACHE = c.TABLE_INGRESS_CACHE_CACHE_TABLE
T_SKETCH_CONFIG = c.TABLE_INGRESS_HOT_SKETCH_SKETCH_CONFIG
T_POOL_OWNER = c.TABLE_INGRESS_POOL_OWNER_POOL_OWNER
T_IPV4_LPM = c.TABLE_INGRESS_FORWARDING_IPV4_LPM
T_L2_FWD = c.TABLE_INGRESS_FORWARDING_L2_FWD
T_REPLICA = c.TABLE_EGRESS_REPLICA_REPLICA_DST
A_CACHE_HIT = c.ACTION_INGRESS_CACHE_CACHE_HIT
A_SET_POOL = c.ACTION_INGRESS_POOL_OWNER_SET_POOL
A_ROUTE = c.ACTION_INGRESS_FORWARDING_ROUTE
A_L2_FORWARD = c.ACTION_INGRESS_FORWARDING_L2_FORWARD
A_SET_REPLICA_DST = c.ACTION_EGRESS_REPLICA_SET_REPLICA_DST
A_SET_PORT_ROLE = c.ACTION_INGRESS_PORT_ROLE_SET_PORT_ROLE
A_BIND_HOST = c.ACTION_INGRESS_PORT_ROLE_BIND_HOST
A_TENANT_OK = c.ACTION_INGRESS_PORT_ROLE_TENANT_OK
A_MEMBER = c.ACTION_INGRESS_PORT_ROLE_MEMBER
_KVP_PORTS = (c.KVP_UDP_PORT, c.KVP_AGENT_PORT)
A_SET_SKETCH_CONFIG = c.ACTION_INGRESS_HOT_SKETCH_SET_SKETCH_CONFIG
IG_DROPS = c.COUNTER_INGRESS_STATS_DROP_COUNTER
IG_EVENTS = c.COUNTER_INGRESS_STATS_KVP_EVENT_COUNTER
EG_DROPS = c.COUNTER_EGRESS_STATS_DROP_COUNTER
HOT_DIGEST = c.DIGEST_HOT_MISS_DIGEST_T


def initial_defaults() -> dict[str, ActionCall]:
    """The default actions the program gives its tables (P4Info does not carry them).

    As declared in p4src/v1model; a port without a ``port_role`` entry is a DENY port, so that
    a port nobody configured is denied by the data plane itself, not only by the controller's
    ``deny_unknown_ports`` (issue 27).

    Returns:
        Table name to default action.
    """
    return {
        T_PORT_ROLE: ActionCall(A_SET_PORT_ROLE, {"role": c.PORT_ROLE_DENY}),
        T_TENANT_BINDING: ActionCall(c.ACTION_INGRESS_PORT_ROLE_TENANT_DENIED, {}),
        T_GROUP_MEMBER: ActionCall(c.ACTION_INGRESS_PORT_ROLE_NOT_MEMBER, {}),
        T_CACHE: ActionCall(c.ACTION_INGRESS_CACHE_CACHE_MISS, {}),
        T_SKETCH_CONFIG: ActionCall(
            A_SET_SKETCH_CONFIG, {"threshold": c.HOT_MISS_THRESHOLD, "window": 0}
        ),
        T_POOL_OWNER: ActionCall(c.ACTION_NOACTION, {}),
        T_IPV4_LPM: ActionCall(c.ACTION_INGRESS_FORWARDING_NO_ROUTE, {}),
        T_L2_FWD: ActionCall(c.ACTION_INGRESS_FORWARDING_NO_ROUTE, {}),
        T_REPLICA: ActionCall(c.ACTION_EGRESS_REPLICA_REPLICA_UNKNOWN, {}),
    }


class Registers:
    """The program's register arrays.

    Fragment words are kept as one byte array of FRAG_BYTES per slot: FRAG_WORDS big-endian
    64-bit registers side by side hold exactly these bytes, so nothing is lost by the packing.

    Attributes:
        frag_words: NUM_FRAG_SLOTS x FRAG_BYTES bytes (FragmentStore.slice_NN.frag_word).
        frag_epoch: epoch of the load that wrote each slot (FragmentStore.frag_epoch).
        frag_crc: CRC stored with each slot (FragmentStore.frag_crc).
        frag_len: valid bytes of each slot (FragmentStore.frag_len).
        cms_rows: CMS_ROWS sketch rows of CMS_WIDTH cells (HotMissSketch.rowN.cms_row).
        reported: the sketch's report row (HotMissSketch.reported), one 64-bit cell each:
            a valid bit (bit 32), the tenant that was last reported there (bits 31-16) and the
            window it was reported in (bits 15-0). Per-tenant marks (issue 27): another
            tenant's key that hashes to a victim's cell cannot mark it reported for the victim,
            as in both P4 programs.
    """

    def __init__(self) -> None:
        self.frag_words = bytearray(c.NUM_FRAG_SLOTS * c.FRAG_BYTES)
        self.frag_epoch = array.array("I", bytes(4 * c.NUM_FRAG_SLOTS))
        self.frag_crc = array.array("I", bytes(4 * c.NUM_FRAG_SLOTS))
        self.frag_len = array.array("H", bytes(2 * c.NUM_FRAG_SLOTS))
        self.cms_rows = [array.array("I", bytes(4 * c.CMS_WIDTH)) for _ in range(c.CMS_ROWS)]
        self.reported = array.array("Q", bytes(8 * c.CMS_WIDTH))

    def snapshot(self) -> bytes:
        """All cache state (fragments and their metadata) as bytes, to compare before/after."""
        return (
            bytes(self.frag_words)
            + self.frag_epoch.tobytes()
            + self.frag_crc.tobytes()
            + self.frag_len.tobytes()
        )


@dataclass(frozen=True, slots=True)
class Output:
    """A packet the pipeline emits.

    Attributes:
        port: egress port; the CPU port means a PacketIn.
        frame: the frame bytes (for the CPU port, without the packet_in header).
        ingress_port: the port the original packet came in on (PacketIn metadata).
    """

    port: int
    frame: bytes
    ingress_port: int


class _Meta:
    """local_metadata_t plus the standard metadata the program uses."""

    __slots__ = (
        "port_role",
        "bound",
        "bound_addr",
        "check_tenant",
        "tenant_ok",
        "group_ok",
        "from_cpu",
        "done",
        "drop",
        "drop_reason",
        "event",
        "hot_reported",
        "egress_spec",
        "mcast_grp",
        "transit",
    )

    def __init__(self) -> None:
        self.port_role = c.PORT_ROLE_HOST
        self.bound = False
        self.bound_addr = 0
        self.check_tenant = False
        self.tenant_ok = True
        self.group_ok = True
        self.from_cpu = False
        self.done = False
        self.drop = False
        self.drop_reason = 0
        self.event = -1
        self.hot_reported = False
        self.egress_spec = -1
        self.mcast_grp = 0
        self.transit = False


class Pipeline:
    """The v1model program for one switch, one packet at a time.

    Every frame from a data port first meets the edge guard (:mod:`refswitch.edge`, the P4
    program's EdgeGuard): a host port may send only ARP and unfragmented IPv4, a DENY port
    nothing. Its drops are counted in the program's ``drop_counter`` under their own reasons.

    Not thread-safe: one dataplane thread calls :meth:`process`; P4Runtime writes go to the
    :class:`SwitchState`, which is.

    Args:
        state: table entries, counters, multicast groups, digests.
        fast_path: serve the common cases in one pass (the results are the same).
    """

    def __init__(self, state: SwitchState, fast_path: bool = True):
        self.state = state
        self.regs = Registers()
        self.cpu_port = c.CPU_PORT_NUM
        self.fast_path = fast_path

    def reset(self) -> None:
        """Clears every register, as loading a new program does on BMv2."""
        self.regs = Registers()

    # ------------------------------------------------------------------ parser
    def process(self, ingress_port: int, frame: bytes) -> list[Output]:
        """Runs one packet through parser, ingress, replication, egress and deparser.

        Args:
            ingress_port: the port it arrived on (the CPU port for a PacketOut, whose frame
                then starts with the 2-byte packet_out header).
            frame: the bytes received.

        Returns:
            The packets to send, in replica order; empty if dropped.
        """
        if self.fast_path:
            fast = self._unicast_get_hit(ingress_port, frame)
            if fast is None:
                fast = self._routed_ipv4(ingress_port, frame)
            if fast is not None:
                return fast
        if ingress_port != self.cpu_port and not self._edge_guard(ingress_port, frame):
            return []
        pkt = bytearray(frame)
        n = len(pkt)
        meta = _Meta()
        off = 0
        error = False
        packet_out_port = -1
        if ingress_port == self.cpu_port:
            if n < PACKET_OUT_LEN:
                error = True
            else:
                packet_out_port = _U16.unpack_from(pkt, 0)[0] >> 7
                off = PACKET_OUT_LEN
        eth = off
        ip = udp = kvp = value = -1
        if not error:
            if n - off < ETH_LEN:
                error = True
            elif pkt[eth + 12] == 0x08 and pkt[eth + 13] == 0x00:
                ip = eth + ETH_LEN
                if n - ip < IPV4_LEN:
                    error = True
                    ip = -1
                else:
                    ver_ihl = pkt[ip]
                    # More-fragments flag and offset: only an unfragmented datagram carries UDP
                    # (and so KVP) the parser reads; a first fragment is plain IPv4 too.
                    fragment = _U16.unpack_from(pkt, ip + 6)[0] & 0x3FFF
                    if ver_ihl & 0xF == 5 and fragment == 0 and pkt[ip + 9] == c.IP_PROTO_UDP:
                        udp = ip + IPV4_LEN
                        if n - udp < UDP_LEN:
                            error = True
                            udp = -1
                        else:
                            sport, dport = _PORTS.unpack_from(pkt, udp)
                            if dport in _KVP_PORTS or sport in _KVP_PORTS:
                                kvp = udp + UDP_LEN
                                if n - kvp < KVP_LEN:
                                    error = True
                                    kvp = -1
                                elif pkt[kvp] & 0xF in (c.KVP_OP_GET, c.KVP_OP_WRITE):
                                    value = kvp + KVP_LEN
                                    if n - value < c.FRAG_BYTES:
                                        error = True
                                        value = -1
        checksum_error = False
        if not error and ip >= 0 and pkt[ip] & 0xF == 5:
            computed, stored = _ipv4_checksum_at(pkt, ip)
            checksum_error = computed != stored
        return self._ingress(
            ingress_port,
            pkt,
            meta,
            error or checksum_error,
            packet_out_port,
            eth,
            ip,
            udp,
            kvp,
            value,
        )

    def _edge_guard(self, port: int, frame: bytes) -> bool:
        """EdgeGuard (refswitch.edge): whether a data port's frame may enter the program.

        Counts the drop under its reason when it may not.
        """
        call, _ = self.state.lookup(T_PORT_ROLE, (port,))
        if call.action == A_BIND_HOST:
            role, bound_addr = c.PORT_ROLE_HOST, call.params["addr"]
        elif call.action == A_SET_PORT_ROLE:
            role, bound_addr = call.params["role"], None
        else:  # pragma: no cover - the table has no other action
            role, bound_addr = c.PORT_ROLE_DENY, None
        reason = edge_verdict(role, bound_addr, frame)
        if reason is None:
            return True
        self.state.count(IG_DROPS, reason)
        return False

    # ------------------------------------------------------------------ fast path
    def _unicast_get_hit(self, port: int, frame: bytes) -> list[Output] | None:
        """The common case in one pass: a well-formed unicast GET that hits, or None.

        Gives exactly what the general path gives for such a packet (the same reply bytes and
        the same counter updates: the cache entry's direct counter and EV_GET_HIT) with a
        fraction of its work, and returns None before changing anything for every other
        packet (another op, a miss, NOCACHE, a group, a fragment out of range, a stale epoch,
        anything malformed or of another length), which the general path then runs. The
        general path stays the block-for-block mirror of the P4 program;
        tests/refswitch/test_fast_path.py checks the two agree packet for packet.
        """
        if len(frame) != _GET_FRAME_LEN or port == self.cpu_port:
            return None
        if frame[12] != 0x08 or frame[13] != 0x00 or frame[_IP] != 0x45 or frame[_IP + 9] != 17:
            return None
        if frame[_IP + 6] & 0x3F or frame[_IP + 7] or frame[_KVP] != _GET_VERSION_OP:
            return None
        if _PORTS.unpack_from(frame, _UDP_AT)[1] != c.KVP_UDP_PORT or frame[_KVP + 1] & _NOCACHE:
            return None
        total_len, udp_len, _payload_len = _LENGTHS.unpack_from(frame, _IP)
        if udp_len != total_len - IPV4_LEN or udp_len != UDP_LEN + KVP_LEN + c.FRAG_BYTES:
            return None
        computed, stored = _ipv4_checksum_at(frame, _IP)
        if computed != stored:
            return None
        tenant, group, key = _TENANT_GROUP_KEY.unpack_from(frame, _KVP + 4)
        if group != 0:
            return None
        state = self.state
        if not self._may_send(port, frame, tenant):
            return None
        call, entry = state.lookup(T_CACHE, (tenant, key))
        if call.action != A_CACHE_HIT:
            return None
        params = call.params
        frag_idx = _U16.unpack_from(frame, _KVP + 24)[0]
        frag_count = params["frag_count"]
        epoch = params["epoch"]
        slot = (params["slot_base"] + frag_idx) & 0xFFFFFFFF
        regs = self.regs
        if frag_idx >= frag_count or slot >= c.NUM_FRAG_SLOTS or regs.frag_epoch[slot] != epoch:
            return None
        state.count_direct(entry)
        state.count(IG_EVENTS, c.EV_GET_HIT)
        # The reply: the GET rewritten in place, as FragmentStore, KvpReply and the deparser do.
        pkt = bytearray(frame)
        base = slot * c.FRAG_BYTES
        pkt[_VALUE : _VALUE + c.FRAG_BYTES] = regs.frag_words[base : base + c.FRAG_BYTES]
        _U32.pack_into(pkt, _KVP + 36, regs.frag_crc[slot])
        _U16.pack_into(pkt, _KVP + 28, regs.frag_len[slot])
        # The GET's flags less what a host may not set (here: all of them); KvpReply adds HIT.
        pkt[_KVP + 1] = 0
        self._reply(pkt, 0, _IP, _UDP_AT, _KVP, frag_count, epoch)
        _U16.pack_into(pkt, _IP + 10, _ipv4_checksum_at(pkt, _IP)[0])
        return [Output(port, bytes(pkt), port)]

    def _may_send(self, port: int, frame: bytes, tenant: int) -> bool:
        """Whether PortRole lets a host-port IPv4 packet through (for the fast paths).

        ``tenant`` is the GET's tenant, or -1 for a packet that is not KVP. True for an unbound
        host port, a pool port's non-KVP packet, and a bound host port when the source address
        is its own and (for a GET) the tenant is bound to it; False for every other case (a pool
        port's GET, a DENY port, a spoofed source, an unbound tenant), which the general path
        then handles.
        """
        call, _ = self.state.lookup(T_PORT_ROLE, (port,))
        if call.action == A_SET_PORT_ROLE:
            role = call.params["role"]
            return bool(role == c.PORT_ROLE_HOST or tenant < 0 and role == c.PORT_ROLE_POOL)
        if call.action != A_BIND_HOST:
            return False
        p = call.params
        if _U32.unpack_from(frame, _IP + 12)[0] != p["addr"]:
            return False
        if tenant < 0 or not p["check_tenant"]:
            return True
        return bool(self.state.lookup(T_TENANT_BINDING, (port, tenant))[0].action == A_TENANT_OK)

    def _routed_ipv4(self, port: int, frame: bytes) -> list[Output] | None:
        """The other common case in one pass: IPv4 that is not KVP and has a route, or None.

        Like ``_unicast_get_hit``: the same bytes out as the general path (no counter counts a
        routed packet), and None before changing anything for every other packet (KVP, a
        malformed or truncated header, options, a fragment, TTL 1, no route, the CPU port, not
        IPv4). Fragments go the general path, whose edge guard drops those from host ports.
        """
        n = len(frame)
        if n < _UDP_AT or port == self.cpu_port or frame[12] != 0x08 or frame[13] != 0x00:
            return None
        if frame[_IP] != 0x45 or frame[_IP + 8] <= 1 or frame[_IP + 6] & 0x3F or frame[_IP + 7]:
            return None
        if frame[_IP + 9] == 17:
            # An unfragmented UDP header the parser reads: not KVP, and complete.
            if n < _KVP:
                return None
            sport, dport = _PORTS.unpack_from(frame, _UDP_AT)
            if sport in _KVP_PORTS or dport in _KVP_PORTS:
                return None
        if not self._may_send(port, frame, -1):
            return None
        computed, stored = _ipv4_checksum_at(frame, _IP)
        if computed != stored:
            return None
        call, _ = self.state.lookup(T_IPV4_LPM, (_U32.unpack_from(frame, _IP + 16)[0],))
        if call.action != A_ROUTE:
            return None
        p = call.params
        pkt = bytearray(frame)
        pkt[0:6] = p["dmac"].to_bytes(6, "big")
        pkt[6:12] = p["smac"].to_bytes(6, "big")
        pkt[_IP + 8] -= 1
        _U16.pack_into(pkt, _IP + 10, _ipv4_checksum_at(pkt, _IP)[0])
        return [Output(p["port"], bytes(pkt), port)]

    # ------------------------------------------------------------------ ingress
    def _ingress(
        self,
        port: int,
        pkt: bytearray,
        meta: _Meta,
        bad: bool,
        packet_out_port: int,
        eth: int,
        ip: int,
        udp: int,
        kvp: int,
        value: int,
    ) -> list[Output]:
        state = self.state
        if bad or ip >= 0 and (pkt[ip] >> 4 != 4 or pkt[ip] & 0xF != 5):
            self._drop(meta, c.DROP_MALFORMED)
        elif packet_out_port >= 0:
            if packet_out_port != 0:
                meta.egress_spec = packet_out_port
                meta.done = True
            else:
                meta.from_cpu = True
                # PortRole does not run for the CPU port, so no tenant is bound to it: a GET
                # from the control plane is refused (BAD_TENANT), as on v1model and TNA.
                meta.tenant_ok = False
            # packet_out.setInvalid(): the deparser no longer emits it.
            del pkt[:PACKET_OUT_LEN]
            eth -= PACKET_OUT_LEN
            ip -= PACKET_OUT_LEN if ip >= 0 else 0
            udp -= PACKET_OUT_LEN if udp >= 0 else 0
            kvp -= PACKET_OUT_LEN if kvp >= 0 else 0
            value -= PACKET_OUT_LEN if value >= 0 else 0

        if not meta.drop and not meta.done and not meta.from_cpu:
            self._port_role(port, pkt, meta, kvp)
            if meta.bound and ip >= 0 and _U32.unpack_from(pkt, ip + 12)[0] != meta.bound_addr:
                self._drop(meta, c.DROP_SPOOFED)

        if not meta.drop and not meta.done and kvp >= 0:
            self._validate(pkt, meta, ip, udp, kvp, value)

        if not meta.drop and not meta.done and kvp >= 0:
            op = pkt[kvp] & 0xF
            if op == c.KVP_OP_WRITE:
                self._write(pkt, meta, ip, udp, kvp, value)
            elif op == c.KVP_OP_GET:
                # Only NOCACHE is a host's to set.
                pkt[kvp + 1] &= c.KVP_GET_FLAGS_ALLOWED
                if not meta.tenant_ok:
                    self._drop(meta, c.DROP_BAD_TENANT)
                elif not meta.group_ok:
                    self._drop(meta, c.DROP_BAD_GROUP)
                else:
                    self._get(port, pkt, meta, eth, ip, udp, kvp, value)
            elif op in (c.KVP_OP_DATA, c.KVP_OP_NACK):
                group = _U16.unpack_from(pkt, kvp + 6)[0]
                if meta.port_role != c.PORT_ROLE_POOL:
                    self._drop(meta, c.DROP_UNAUTHORIZED)
                elif op == c.KVP_OP_NACK:
                    pass  # routed to the requester below
                elif group == 0:
                    meta.event = c.EV_DATA_UNICAST
                else:
                    meta.mcast_grp = group
                    meta.transit = True
                    meta.done = True
                    meta.event = c.EV_DATA_MCAST
            elif op == c.KVP_OP_WRITE_ACK:
                self._drop(meta, c.DROP_UNAUTHORIZED)

        if not meta.drop and not meta.done:
            self._forwarding(pkt, meta, eth, ip)
        # Stats
        if meta.drop:
            state.count(IG_DROPS, meta.drop_reason)
            return []
        if meta.event >= 0:
            state.count(IG_EVENTS, meta.event)
        if meta.hot_reported:
            state.count(IG_EVENTS, c.EV_HOT_DIGEST)
        return self._replicate_and_egress(port, pkt, meta, kvp)

    def _port_role(self, port: int, pkt: bytearray, meta: _Meta, kvp: int) -> None:
        """PortRole: the port's role and binding, and the tenant and group checks."""
        state = self.state
        call, _ = state.lookup(T_PORT_ROLE, (port,))
        if call.action == A_SET_PORT_ROLE:
            meta.port_role = call.params["role"]
        elif call.action == A_BIND_HOST:
            meta.port_role = c.PORT_ROLE_HOST
            meta.bound = True
            meta.bound_addr = call.params["addr"]
            meta.check_tenant = call.params["check_tenant"] != 0
        if meta.bound and kvp >= 0 and meta.check_tenant:
            tenant = _U16.unpack_from(pkt, kvp + 4)[0]
            meta.tenant_ok = state.lookup(T_TENANT_BINDING, (port, tenant))[0].action == A_TENANT_OK
        if kvp >= 0 and meta.port_role != c.PORT_ROLE_POOL:
            group = _U16.unpack_from(pkt, kvp + 6)[0]
            if group != 0:
                meta.group_ok = state.lookup(T_GROUP_MEMBER, (group, port))[0].action == A_MEMBER

    @staticmethod
    def _drop(meta: _Meta, reason: int) -> None:
        meta.drop = True
        meta.drop_reason = reason

    def _validate(
        self, pkt: bytearray, meta: _Meta, ip: int, udp: int, kvp: int, value: int
    ) -> None:
        """KvpValidate."""
        total_len, udp_len, payload_len = _LENGTHS.unpack_from(pkt, ip)
        kvp_bytes = (udp_len - UDP_LEN - KVP_LEN) & 0xFFFF
        version, op = pkt[kvp] >> 4, pkt[kvp] & 0xF
        if version != c.KVP_VERSION or not c.KVP_OP_GET <= op <= c.KVP_OP_NACK:
            malformed = True
        elif udp_len != (total_len - IPV4_LEN) & 0xFFFF or udp_len < UDP_LEN + KVP_LEN:
            malformed = True
        elif op in (c.KVP_OP_GET, c.KVP_OP_WRITE):
            # Exactly one fragment follows: the placeholder or the data to store.
            malformed = kvp_bytes != c.FRAG_BYTES or value < 0
            malformed |= op == c.KVP_OP_WRITE and payload_len > c.FRAG_BYTES
        else:
            malformed = payload_len > kvp_bytes
        if malformed:
            self._drop(meta, c.DROP_MALFORMED)

    def _write(self, pkt: bytearray, meta: _Meta, ip: int, udp: int, kvp: int, value: int) -> None:
        """WRITE from the CPU port: store one fragment, acknowledge to the control plane."""
        if not meta.from_cpu:
            self._drop(meta, c.DROP_UNAUTHORIZED)
            return
        (
            _vo,
            _fl,
            _st,
            _r0,
            _tenant,
            _group,
            _key,
            _req,
            epoch,
            _fi,
            _fc,
            payload_len,
            _r1,
            index,
            crc,
        ) = KVP_STRUCT.unpack_from(pkt, kvp)
        if index >= c.NUM_FRAG_SLOTS:
            self._drop(meta, c.DROP_BAD_FRAGMENT)
            return
        regs = self.regs
        regs.frag_epoch[index] = epoch
        regs.frag_crc[index] = crc
        regs.frag_len[index] = payload_len
        base = index * c.FRAG_BYTES
        regs.frag_words[base : base + c.FRAG_BYTES] = pkt[value : value + c.FRAG_BYTES]
        pkt[kvp] = (pkt[kvp] & 0xF0) | c.KVP_OP_WRITE_ACK
        del pkt[value : value + c.FRAG_BYTES]
        _U16.pack_into(pkt, udp + 4, (_U16.unpack_from(pkt, udp + 4)[0] - c.FRAG_BYTES) & 0xFFFF)
        _U16.pack_into(pkt, ip + 2, (_U16.unpack_from(pkt, ip + 2)[0] - c.FRAG_BYTES) & 0xFFFF)
        _U16.pack_into(pkt, udp + 6, 0)
        meta.egress_spec = self.cpu_port
        meta.done = True
        meta.event = c.EV_WRITE

    def _get(
        self,
        port: int,
        pkt: bytearray,
        meta: _Meta,
        eth: int,
        ip: int,
        udp: int,
        kvp: int,
        value: int,
    ) -> None:
        """GET: cache lookup; a hit becomes a DATA reply, a miss goes to the pool owner."""
        state = self.state
        flags = pkt[kvp + 1]
        tenant, group, key = _TENANT_GROUP_KEY.unpack_from(pkt, kvp + 4)
        hit = False
        if flags & c.KVP_FLAG_NOCACHE == 0:
            call, entry = state.lookup(T_CACHE, (tenant, key))
            state.count_direct(entry)
            if call.action == A_CACHE_HIT:
                hit = True
                params = call.params
        if hit:
            frag_idx = _U16.unpack_from(pkt, kvp + 24)[0]
            frag_count = params["frag_count"]
            epoch = params["epoch"]
            slot = (params["slot_base"] + frag_idx) & 0xFFFFFFFF
            if frag_idx >= frag_count or slot >= c.NUM_FRAG_SLOTS:
                self._drop(meta, c.DROP_BAD_FRAGMENT)
                return
            regs = self.regs
            # FragmentStore read: the placeholder, CRC and length are overwritten even if the
            # epoch check below then drops the packet, as in the P4 program.
            base = slot * c.FRAG_BYTES
            pkt[value : value + c.FRAG_BYTES] = regs.frag_words[base : base + c.FRAG_BYTES]
            _U32.pack_into(pkt, kvp + 36, regs.frag_crc[slot])
            _U16.pack_into(pkt, kvp + 28, regs.frag_len[slot])
            if regs.frag_epoch[slot] != epoch:
                self._drop(meta, c.DROP_BAD_EPOCH)
                return
            self._reply(pkt, eth, ip, udp, kvp, frag_count, epoch)
            if group != 0:
                meta.mcast_grp = group
            else:
                meta.egress_spec = port
            meta.done = True
            meta.event = c.EV_GET_HIT
        elif flags & c.KVP_FLAG_NOCACHE:
            self._pool_owner(pkt, ip, udp, key)
            meta.event = c.EV_GET_BYPASS
        else:
            self._hot_sketch(meta, tenant, key)
            self._pool_owner(pkt, ip, udp, key)
            meta.event = c.EV_GET_MISS

    @staticmethod
    def _reply(
        pkt: bytearray, eth: int, ip: int, udp: int, kvp: int, frag_count: int, epoch: int
    ) -> None:
        """KvpReply's rewrite: the GET becomes a DATA hit to its sender (the caller routes it)."""
        pkt[kvp] = (pkt[kvp] & 0xF0) | c.KVP_OP_DATA
        pkt[kvp + 1] |= c.KVP_FLAG_HIT
        _U16.pack_into(pkt, kvp + 26, frag_count)
        _U32.pack_into(pkt, kvp + 20, epoch)
        _U32.pack_into(pkt, kvp + 32, 0)
        pkt[ip + 12 : ip + 20] = pkt[ip + 16 : ip + 20] + pkt[ip + 12 : ip + 16]
        pkt[ip + 8] = 64
        pkt[udp : udp + 4] = pkt[udp + 2 : udp + 4] + pkt[udp : udp + 2]
        _U16.pack_into(pkt, udp + 6, 0)
        pkt[eth : eth + 12] = pkt[eth + 6 : eth + 12] + pkt[eth : eth + 6]

    def _pool_owner(self, pkt: bytearray, ip: int, udp: int, key: int) -> None:
        """PoolOwner."""
        call, _ = self.state.lookup(T_POOL_OWNER, (key & (c.POOL_BUCKETS - 1),))
        if call.action == A_SET_POOL:
            _U32.pack_into(pkt, ip + 16, call.params["pool_ip"])
            _U16.pack_into(pkt, udp + 6, 0)

    def _hot_sketch(self, meta: _Meta, tenant: int, key: int) -> None:
        """HotMissSketch: count the miss, report the key once per window from the threshold on.

        "Once" is per tenant and report cell: the cell remembers which tenant it reported for,
        so a key of another tenant sharing the cell is still reported (and re-marks it).
        """
        call, _ = self.state.lookup(T_SKETCH_CONFIG, ())
        threshold = call.params["threshold"]
        window = call.params["window"]
        i0, i1, i2, ir = sketch_indices(tenant, key)
        regs = self.regs
        estimate = _MAX16 + 1
        for row, index in zip(regs.cms_rows, (i0, i1, i2), strict=True):
            cell = row[index]
            if cell >> 16 != window:
                count = 1
            elif cell & _MAX16 == _MAX16:
                count = _MAX16
            else:
                count = (cell & _MAX16) + 1
            row[index] = (window << 16) | count
            estimate = min(estimate, count)
        if estimate >= threshold:
            mark = _REPORT_VALID | (tenant << 16) | window
            if regs.reported[ir] != mark:
                regs.reported[ir] = mark
                self.state.emit_digest(HOT_DIGEST, (tenant, key, estimate))
                meta.hot_reported = True

    def _forwarding(self, pkt: bytearray, meta: _Meta, eth: int, ip: int) -> None:
        """Forwarding: IPv4 LPM or L2 exact."""
        state = self.state
        if ip >= 0:
            if pkt[ip + 8] <= 1:
                self._drop(meta, c.DROP_TTL_EXPIRED)
                return
            dst = _U32.unpack_from(pkt, ip + 16)[0]
            call, _ = state.lookup(T_IPV4_LPM, (dst,))
            if call.action != A_ROUTE:
                self._drop(meta, c.DROP_NO_ROUTE)
                return
            p = call.params
            meta.egress_spec = p["port"]
            pkt[eth + 6 : eth + 12] = p["smac"].to_bytes(6, "big")
            pkt[eth : eth + 6] = p["dmac"].to_bytes(6, "big")
            pkt[ip + 8] -= 1
        else:
            dst_mac = int.from_bytes(pkt[eth : eth + 6], "big")
            call, _ = state.lookup(T_L2_FWD, (dst_mac,))
            if call.action != A_L2_FORWARD:
                self._drop(meta, c.DROP_NO_ROUTE)
                return
            meta.egress_spec = call.params["port"]

    # ------------------------------------------------------------------ egress
    def _replicate_and_egress(
        self, port: int, pkt: bytearray, meta: _Meta, kvp: int
    ) -> list[Output]:
        if meta.mcast_grp:
            targets: list[tuple[int, int]] = list(self.state.multicast_group(meta.mcast_grp))
        elif meta.egress_spec >= 0:
            targets = [(meta.egress_spec, 0)]
        else:  # pragma: no cover - every path above sets one or drops
            return []
        if meta.transit:
            # DATA multicast from a pool or fabric port: no copy goes back out of the port it
            # came in on (the switch before it served that side), so that a tree of groups
            # across a fabric carries one copy per link and never loops. A hit's multicast is
            # not pruned: the requester's own side needs its copy.
            targets = [t for t in targets if t[0] != port]
        outputs = []
        for egress_port, rid in targets:
            out = bytearray(pkt) if len(targets) > 1 else pkt
            if rid != 0 and kvp >= 0 and not self._replica(out, kvp, rid):
                self.state.count(EG_DROPS, c.DROP_NO_ROUTE)
                continue
            self._fix_ipv4_checksum(out, kvp)
            outputs.append(Output(egress_port, bytes(out), port))
        return outputs

    def _replica(self, pkt: bytearray, kvp: int, rid: int) -> bool:
        """ReplicaRewrite; False when the replica has no destination (dropped)."""
        call, _ = self.state.lookup(T_REPLICA, (rid,))
        if call.action != A_SET_REPLICA_DST:
            return False
        p = call.params
        eth = 0
        ip = eth + ETH_LEN
        udp = ip + IPV4_LEN
        pkt[eth : eth + 6] = p["dmac"].to_bytes(6, "big")
        _U32.pack_into(pkt, ip + 16, p["dip"])
        _U16.pack_into(pkt, udp + 2, p["dport"])
        _U16.pack_into(pkt, udp + 6, 0)
        pkt[kvp + 1] |= c.KVP_FLAG_REPLICA
        return True

    @staticmethod
    def _fix_ipv4_checksum(pkt: bytearray, kvp: int) -> None:
        """KvcastComputeChecksum: recompute the IPv4 checksum of option-less headers."""
        if len(pkt) < ETH_LEN + IPV4_LEN or pkt[12] != 0x08 or pkt[13] != 0x00:
            return
        ip = ETH_LEN
        if pkt[ip] & 0xF != 5:
            return
        _U16.pack_into(pkt, ip + 10, _ipv4_checksum_at(pkt, ip)[0])


def _ipv4_checksum_at(pkt: bytes | bytearray, ip: int) -> tuple[int, int]:
    """(checksum computed over the option-less IPv4 header at ``ip``, checksum stored there).

    The computed value is what ``kvcast.wire.ipv4_checksum`` gives for the header with its
    checksum field zeroed: the ones'-complement sum of the nine other 16-bit words.
    """
    words = _IPV4_WORDS.unpack_from(pkt, ip)
    stored = words[5]
    total = sum(words) - stored
    total = (total & 0xFFFF) + (total >> 16)
    total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF, stored


def _crc16_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0xA001 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_CRC16_TABLE = _crc16_table()


def crc16(data: bytes) -> int:
    """CRC-16/ARC (polynomial 0x8005 reflected, init 0, no final XOR): v1model's ``crc16``."""
    crc = 0
    table = _CRC16_TABLE
    for b in data:
        crc = (crc >> 8) ^ table[(crc ^ b) & 0xFF]
    return crc


def sketch_indices(tenant: int, key: int) -> tuple[int, int, int, int]:
    """The cells a (tenant, key) hashes to in sketch rows 0, 1, 2 and the report row.

    Row 0 is CRC-32 over ``{tenant, key}``, row 1 CRC-16 over the same bytes, row 2 CRC-32 and
    the report row CRC-16 over ``{key[31:0], tenant, key[63:32]}``, each modulo CMS_WIDTH, as
    HotMissSketch computes them.
    """
    tk = _SKETCH_TK.pack(tenant, key)
    ktk = _SKETCH_KTK.pack(key & 0xFFFFFFFF, tenant, key >> 32)
    width = c.CMS_WIDTH
    return (
        zlib.crc32(tk) % width,
        crc16(tk) % width,
        zlib.crc32(ktk) % width,
        crc16(ktk) % width,
    )
