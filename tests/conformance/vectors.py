"""Packet-level conformance vectors for every kvcast switch target.

A vector is a list of steps: a frame sent on a port (or as a PacketOut from the controller),
the frames expected out on which ports (or as PacketIns), the counter changes and the digests.
Expected frames are built from the protocol specification with kvcast.wire, never by running a
target. The same vectors run against the reference target and BMv2 (tests/conformance).

The base program (:func:`program_switch`) is installed once per target: five ports (three hosts,
a pool node and a port the controller denies), routes, multicast groups with their members, the
hosts' source bindings (host 2 also bound to its tenant, hosts 1 and 3 to any tenant), and one
chunk loaded through WRITE PacketOuts.

The edge guard's vectors (:func:`edge_vectors`) send every class of frame a host can send;
each target drops them under the program's own drop reasons (EdgeGuard in p4src, refswitch/edge.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from kvcast import p4constants as c
from kvcast import wire
from kvcast.tools.p4rt_client import Lpm, P4RuntimeClient
from kvcast.wire import KvpHeader, ip_int, mac_int

CPU = c.CPU_PORT_NUM
SWITCH_MAC = "02:00:00:00:00:fe"
VIP = "10.0.100.1"
HOSTS = {i: (f"00:00:00:00:00:0{i}", f"10.0.0.{i}", 40000 + i) for i in (1, 2, 3)}
POOL_PORT = 4
POOL_MAC, POOL_IP = "00:00:00:00:01:01", "10.0.1.1"
GROUP = 7
GROUP_BROKEN = 8  # one replica id has no replica_dst entry; host 3 is not a member
# Host 1 and, unrewritten (replica id 0), the pool port: a group's copy toward the rest of a
# fabric, as on a leaf whose uplink is a member (emulation.fabric).
GROUP_FABRIC = 9
TENANT = 1
# Host 2's port is bound to its address and to TENANT only (PortRole.bind_host, tenant_binding).
BOUND_HOST = 2
# A port the controller denies (PORT_ROLE_DENY): nothing from it enters (edge guard).
DENY_PORT = 5
DENY_MAC, DENY_IP = "00:00:00:00:00:05", "10.0.0.5"
# A port with no port_role entry and no default written by the controller: the data plane's own
# default decides (DENY, on every target).
UNKNOWN_PORT = 6

# The chunk loaded by program_switch: three fragments, the last one short.
CHUNK_KEY = 0x1122334455667788
CHUNK_BASE = 16
CHUNK_EPOCH = 5
CHUNK_FRAGS = [
    bytes((i * 7 + j) % 251 for j in range(n))
    for i, n in enumerate((c.FRAG_BYTES, c.FRAG_BYTES, 100))
]
# A chunk whose entry names an epoch its slot was not written with.
STALE_KEY, STALE_BASE, STALE_ENTRY_EPOCH, STALE_SLOT_EPOCH = 0x5555, 40, 9, 8
HOT_TENANT, HOT_KEY, HOT_THRESHOLD = 2, 0xABCDEF0123, 3

IG_DROPS = c.COUNTER_INGRESS_STATS_DROP_COUNTER
IG_EVENTS = c.COUNTER_INGRESS_STATS_KVP_EVENT_COUNTER
EG_DROPS = c.COUNTER_EGRESS_STATS_DROP_COUNTER
COUNTERS = (IG_DROPS, IG_EVENTS, EG_DROPS)


@dataclass
class Step:
    """One packet in, what must come out.

    Attributes:
        port: ingress port; ``CPU`` sends the frame as a PacketOut with ``out_port`` metadata.
        frame: the frame sent.
        expect: (port, frame) expected out, any order; ``CPU`` is a PacketIn.
        counters: (counter, index) -> expected change.
        digests: expected hot-miss digest rows (tenant, key, estimate).
        out_port: packet_out egress_port metadata for CPU steps.
    """

    port: int
    frame: bytes
    expect: list[tuple[int, bytes]] = field(default_factory=list)
    counters: dict[tuple[str, int], int] = field(default_factory=dict)
    digests: list[tuple[int, int, int]] = field(default_factory=list)
    out_port: int = 0


@dataclass
class Vector:
    """A named sequence of steps.

    Attributes:
        name: the vector's name (the test id).
        steps: the packets, in order.
        setup: extra programming before the steps.
    """

    name: str
    steps: list[Step]
    setup: Callable[[P4RuntimeClient], None] | None = None


def drop(reason: int) -> dict[tuple[str, int], int]:
    """Counter change of one ingress drop."""
    return {(IG_DROPS, reason): 1}


def event(ev: int) -> dict[tuple[str, int], int]:
    """Counter change of one KVP event."""
    return {(IG_EVENTS, ev): 1}


def host_frame(
    i: int, dst_ip: str, payload: bytes, dport: int = c.KVP_UDP_PORT, ttl: int = 64
) -> bytes:
    """A frame from host i to the switch's MAC."""
    mac, ip, port = HOSTS[i]
    return wire.udp_frame(mac, SWITCH_MAC, ip, dst_ip, port, dport, payload, ttl=ttl)


def pool_frame(dst_host: int, payload: bytes) -> bytes:
    """A frame from the pool node to host ``dst_host``'s agent."""
    _, ip, port = HOSTS[dst_host]
    return wire.udp_frame(POOL_MAC, SWITCH_MAC, POOL_IP, ip, c.KVP_UDP_PORT, port, payload)


def routed(frame: bytes, port: int, dmac: str) -> tuple[int, bytes]:
    """What L3 forwarding makes of ``frame``: new MACs, TTL - 1, new IPv4 checksum."""
    out = bytearray(frame)
    out[0:6] = wire.mac_bytes(dmac)
    out[6:12] = wire.mac_bytes(SWITCH_MAC)
    out[22] -= 1
    _fix_checksum(out)
    return port, bytes(out)


def _fix_checksum(out: bytearray) -> None:
    out[24:26] = b"\0\0"
    out[24:26] = wire.ipv4_checksum(bytes(out[14:34])).to_bytes(2, "big")


def hit_reply(i: int, frag_idx: int, req_id: int, flags: int = 0, group: int = 0) -> bytes:
    """The DATA the switch makes of host i's GET for fragment ``frag_idx`` of the chunk."""
    mac, ip, port = HOSTS[i]
    data = CHUNK_FRAGS[frag_idx]
    hdr = KvpHeader(
        c.KVP_OP_DATA,
        flags=c.KVP_FLAG_HIT | flags,
        tenant=TENANT,
        group=group,
        key=CHUNK_KEY,
        req_id=req_id,
        epoch=CHUNK_EPOCH,
        frag_idx=frag_idx,
        frag_count=len(CHUNK_FRAGS),
        payload_len=len(data),
        crc=wire.fragment_crc(TENANT, CHUNK_KEY, frag_idx, data),
    )
    payload = hdr.pack() + data + bytes(c.FRAG_BYTES - len(data))
    return wire.udp_frame(SWITCH_MAC, mac, VIP, ip, c.KVP_UDP_PORT, port, payload)


def replica(frame: bytes, i: int) -> tuple[int, bytes]:
    """Egress rewrite of a multicast replica for host i (as set in replica_dst)."""
    mac, ip, port = HOSTS[i]
    out = bytearray(frame)
    out[0:6] = wire.mac_bytes(mac)
    out[30:34] = wire.ip_bytes(ip)
    out[36:38] = port.to_bytes(2, "big")
    out[40:42] = b"\0\0"
    out[42 + 1] |= c.KVP_FLAG_REPLICA
    _fix_checksum(out)
    return i, bytes(out)


def write_frame(
    key: int, frag_idx: int, slot: int, epoch: int, data: bytes, tenant: int = TENANT
) -> bytes:
    """A controller WRITE frame (sent as a PacketOut)."""
    payload = wire.write_message(tenant, key, frag_idx, slot, epoch, data, req_id=slot)
    return wire.udp_frame(SWITCH_MAC, SWITCH_MAC, VIP, VIP, c.KVP_UDP_PORT, c.KVP_UDP_PORT, payload)


def write_ack(frame: bytes) -> tuple[int, bytes]:
    """The PacketIn acknowledging a WRITE frame: op changed, fragment stripped, lengths cut."""
    out = bytearray(frame[: wire.FRAME_KVP_OFFSET + c.KVP_HDR_BYTES])
    out[wire.FRAME_KVP_OFFSET] = (out[wire.FRAME_KVP_OFFSET] & 0xF0) | c.KVP_OP_WRITE_ACK
    out[16:18] = (int.from_bytes(out[16:18], "big") - c.FRAG_BYTES).to_bytes(2, "big")
    out[38:40] = (int.from_bytes(out[38:40], "big") - c.FRAG_BYTES).to_bytes(2, "big")
    out[40:42] = b"\0\0"
    _fix_checksum(out)
    return CPU, bytes(out)


def program_switch(client: P4RuntimeClient) -> None:
    """Installs the base program every vector assumes, loading the chunk with WRITEs.

    Raises:
        AssertionError: a WRITE was not acknowledged as specified.
    """
    t = c
    for i, (mac, ip, _) in HOSTS.items():
        client.insert(
            t.TABLE_INGRESS_FORWARDING_IPV4_LPM,
            {"dst_addr": Lpm(ip_int(ip), 32)},
            t.ACTION_INGRESS_FORWARDING_ROUTE,
            {"port": i, "smac": mac_int(SWITCH_MAC), "dmac": mac_int(mac)},
        )
        client.insert(
            t.TABLE_INGRESS_FORWARDING_L2_FWD,
            {"dst_addr": mac_int(mac)},
            t.ACTION_INGRESS_FORWARDING_L2_FORWARD,
            {"port": i},
        )
        client.insert(
            t.TABLE_EGRESS_REPLICA_REPLICA_DST,
            {"rid": i},
            t.ACTION_EGRESS_REPLICA_SET_REPLICA_DST,
            {"dmac": mac_int(mac), "dip": ip_int(ip), "dport": HOSTS[i][2]},
        )
    client.insert(
        t.TABLE_INGRESS_FORWARDING_IPV4_LPM,
        {"dst_addr": Lpm(ip_int("10.0.1.0"), 24)},
        t.ACTION_INGRESS_FORWARDING_ROUTE,
        {"port": POOL_PORT, "smac": mac_int(SWITCH_MAC), "dmac": mac_int(POOL_MAC)},
    )
    client.set_pool_node(POOL_PORT, ip_int(POOL_IP))
    client.multicast_group(GROUP, [(i, i) for i in HOSTS])
    client.multicast_group(GROUP_BROKEN, [(1, 1), (2, 99)])
    client.multicast_group(GROUP_FABRIC, [(1, 1), (POOL_PORT, 0)])
    for gid, ports in ((GROUP, list(HOSTS)), (GROUP_BROKEN, [1, 2]), (GROUP_FABRIC, [1])):
        for port in ports:
            client.insert(
                t.TABLE_INGRESS_PORT_ROLE_GROUP_MEMBER,
                {"group": gid, "port": port},
                t.ACTION_INGRESS_PORT_ROLE_MEMBER,
                {},
            )
    # Every host port is bound to its address; host 2 also to TENANT, hosts 1 and 3 to any
    # tenant (the config's explicit ``tenants: any``).
    for i, (_, ip, _) in HOSTS.items():
        client.insert(
            t.TABLE_INGRESS_PORT_ROLE_PORT_ROLE,
            {"port": i},
            t.ACTION_INGRESS_PORT_ROLE_BIND_HOST,
            {"addr": ip_int(ip), "check_tenant": int(i == BOUND_HOST)},
        )
    client.insert(
        t.TABLE_INGRESS_PORT_ROLE_TENANT_BINDING,
        {"port": BOUND_HOST, "tenant": TENANT},
        t.ACTION_INGRESS_PORT_ROLE_TENANT_OK,
        {},
    )
    client.insert(
        t.TABLE_INGRESS_PORT_ROLE_PORT_ROLE,
        {"port": DENY_PORT},
        t.ACTION_INGRESS_PORT_ROLE_SET_PORT_ROLE,
        {"role": c.PORT_ROLE_DENY},
    )
    client.set_default(
        t.TABLE_INGRESS_HOT_SKETCH_SKETCH_CONFIG,
        t.ACTION_INGRESS_HOT_SKETCH_SET_SKETCH_CONFIG,
        {"threshold": HOT_THRESHOLD, "window": 1},
    )
    client.configure_digest(t.DIGEST_HOT_MISS_DIGEST_T)
    # The safe load order: fragments first (acknowledged), then the entry.
    for idx, data in enumerate(CHUNK_FRAGS):
        frame = write_frame(CHUNK_KEY, idx, CHUNK_BASE + idx, CHUNK_EPOCH, data)
        client.packet_out(frame)
        got, md = client.wait_packet_in(timeout=5)
        assert (CPU, got) == write_ack(frame), "WRITE_ACK differs from the specification"
        assert md.get("ingress_port") == CPU
    client.insert(
        t.TABLE_INGRESS_CACHE_CACHE_TABLE,
        {"tenant": TENANT, "key": CHUNK_KEY},
        t.ACTION_INGRESS_CACHE_CACHE_HIT,
        {"slot_base": CHUNK_BASE, "frag_count": len(CHUNK_FRAGS), "epoch": CHUNK_EPOCH},
    )
    stale = write_frame(STALE_KEY, 0, STALE_BASE, STALE_SLOT_EPOCH, b"stale")
    client.packet_out(stale)
    client.wait_packet_in(timeout=5)
    client.insert(
        t.TABLE_INGRESS_CACHE_CACHE_TABLE,
        {"tenant": TENANT, "key": STALE_KEY},
        t.ACTION_INGRESS_CACHE_CACHE_HIT,
        {"slot_base": STALE_BASE, "frag_count": 1, "epoch": STALE_ENTRY_EPOCH},
    )


def _get(
    i: int,
    key: int,
    frag_idx: int,
    req_id: int,
    group: int = 0,
    flags: int = 0,
    tenant: int = TENANT,
) -> bytes:
    return host_frame(i, VIP, wire.get_message(tenant, key, frag_idx, req_id, group, flags))


def _pool_get(frame: bytes) -> tuple[int, bytes]:
    """A GET that missed: destination rewritten to the pool owner, UDP checksum 0, routed."""
    out = bytearray(frame)
    out[30:34] = wire.ip_bytes(POOL_IP)
    out[40:42] = b"\0\0"
    return routed(bytes(out), POOL_PORT, POOL_MAC)


def _mutate(frame: bytes, offset: int, value: bytes, fix_checksum: bool = True) -> bytes:
    out = bytearray(frame)
    out[offset : offset + len(value)] = value
    if fix_checksum:
        _fix_checksum(out)
    return bytes(out)


def build_vectors() -> list[Vector]:
    """Every conformance vector."""
    k = wire.FRAME_KVP_OFFSET
    v: list[Vector] = []

    plain = host_frame(1, HOSTS[2][1], b"hello", dport=5000)
    v.append(Vector("non_kvp_udp_is_routed", [Step(1, plain, [routed(plain, 2, HOSTS[2][0])])]))
    arp = arp_frame(1, HOSTS[3][0], HOSTS[1][1], HOSTS[3][1])
    v.append(Vector("arp_from_a_host_is_switched_by_mac", [Step(1, arp, [(3, arp)])]))
    nowhere = host_frame(1, "10.9.9.9", b"x", dport=5000)
    v.append(Vector("ip_without_route_is_dropped", [Step(1, nowhere, [], drop(c.DROP_NO_ROUTE))]))
    ttl1 = host_frame(1, HOSTS[2][1], b"x", dport=5000, ttl=1)
    v.append(Vector("ttl_expiry_is_dropped", [Step(1, ttl1, [], drop(c.DROP_TTL_EXPIRED))]))
    bad_sum = _mutate(plain, 24, b"\xde\xad", fix_checksum=False)
    v.append(
        Vector("bad_ipv4_checksum_is_malformed", [Step(1, bad_sum, [], drop(c.DROP_MALFORMED))])
    )
    options = _mutate(plain, 14, b"\x46")
    v.append(Vector("ipv4_options_are_malformed", [Step(1, options, [], drop(c.DROP_MALFORMED))]))
    truncated_ip = plain[: 14 + 12]
    v.append(
        Vector("truncated_ipv4_is_malformed", [Step(1, truncated_ip, [], drop(c.DROP_MALFORMED))])
    )

    get0 = _get(1, CHUNK_KEY, 0, req_id=11)
    v.append(
        Vector(
            "get_hit_is_answered_from_sram",
            [Step(1, get0, [(1, hit_reply(1, 0, 11))], event(c.EV_GET_HIT))],
        )
    )
    get2 = _get(2, CHUNK_KEY, 2, req_id=12)
    v.append(
        Vector(
            "get_hit_on_short_last_fragment",
            [Step(2, get2, [(2, hit_reply(2, 2, 12))], event(c.EV_GET_HIT))],
        )
    )
    getg = _get(1, CHUNK_KEY, 1, req_id=13, group=GROUP)
    base_reply = hit_reply(1, 1, 13, group=GROUP)
    v.append(
        Vector(
            "get_hit_with_group_is_multicast_to_every_member",
            [Step(1, getg, [replica(base_reply, i) for i in HOSTS], event(c.EV_GET_HIT))],
        )
    )
    getb = _get(1, CHUNK_KEY, 0, req_id=14, group=GROUP_BROKEN)
    v.append(
        Vector(
            "replica_without_destination_is_dropped_in_egress",
            [
                Step(
                    1,
                    getb,
                    [replica(hit_reply(1, 0, 14, group=GROUP_BROKEN), 1)],
                    {(IG_EVENTS, c.EV_GET_HIT): 1, (EG_DROPS, c.DROP_NO_ROUTE): 1},
                )
            ],
        )
    )
    miss = _get(3, 0x0BADC0DE, 0, req_id=15)
    v.append(
        Vector(
            "get_miss_goes_to_the_pool_owner",
            [Step(3, miss, [_pool_get(miss)], event(c.EV_GET_MISS))],
        )
    )
    bypass = _get(3, CHUNK_KEY, 0, req_id=16, flags=c.KVP_FLAG_NOCACHE)
    v.append(
        Vector(
            "nocache_get_bypasses_the_cache",
            [Step(3, bypass, [_pool_get(bypass)], event(c.EV_GET_BYPASS))],
        )
    )
    other_tenant = _get(3, CHUNK_KEY, 0, req_id=17, tenant=TENANT + 1)
    v.append(
        Vector(
            "get_of_another_tenant_misses",
            [Step(3, other_tenant, [_pool_get(other_tenant)], event(c.EV_GET_MISS))],
        )
    )
    beyond = _get(1, CHUNK_KEY, len(CHUNK_FRAGS), req_id=18)
    v.append(
        Vector(
            "fragment_index_beyond_chunk_is_dropped",
            [Step(1, beyond, [], drop(c.DROP_BAD_FRAGMENT))],
        )
    )
    stale = _get(1, STALE_KEY, 0, req_id=19)
    v.append(Vector("stale_epoch_is_never_served", [Step(1, stale, [], drop(c.DROP_BAD_EPOCH))]))

    new_data = bytes(range(200))
    wr = write_frame(0x77, 0, 100, 3, new_data)
    v.append(
        Vector(
            "write_from_cpu_port_is_stored_and_acknowledged",
            [Step(CPU, wr, [write_ack(wr)], event(c.EV_WRITE))],
        )
    )
    wr_host = host_frame(
        2, VIP, wire.write_message(TENANT, CHUNK_KEY, 0, CHUNK_BASE, CHUNK_EPOCH, b"poison")
    )
    v.append(
        Vector(
            "write_from_host_port_is_refused",
            [
                Step(2, wr_host, [], drop(c.DROP_UNAUTHORIZED)),
                Step(1, get0, [(1, hit_reply(1, 0, 11))], event(c.EV_GET_HIT)),
            ],
        )
    )
    wr_far = write_frame(0x78, 0, c.NUM_FRAG_SLOTS, 3, b"x")
    v.append(
        Vector(
            "write_beyond_slot_array_is_dropped", [Step(CPU, wr_far, [], drop(c.DROP_BAD_FRAGMENT))]
        )
    )
    # The CPU port has no tenant binding: a GET the control plane sends (PacketOut to the
    # pipeline) is refused on every target (the TNA program checks it as v1model does).
    v.append(
        Vector(
            "get_from_cpu_port_is_refused_as_bad_tenant",
            [Step(CPU, get0, [], drop(c.DROP_BAD_TENANT))],
        )
    )
    direct = host_frame(1, HOSTS[2][1], b"raw", dport=5000)
    v.append(
        Vector(
            "packet_out_with_port_goes_straight_out",
            [Step(CPU, direct, [(2, direct)], {}, out_port=2)],
        )
    )

    data_g = pool_frame(1, wire.data_message(TENANT, 0x99, 0, 1, b"pooldata", group=GROUP))
    v.append(
        Vector(
            "pool_data_with_group_is_multicast",
            [Step(POOL_PORT, data_g, [replica(data_g, i) for i in HOSTS], event(c.EV_DATA_MCAST))],
        )
    )
    # The first fragment of a DATA (MF set, offset 0) is plain IPv4 to both programs' parsers:
    # only unfragmented UDP carries KVP. It is routed to its destination, never multicast (the
    # reference target once parsed it as KVP: found by replaying p4testgen's tests of the TNA
    # program, tests/p4src/test_tna_testgen.py).
    first_fragment = _mutate(data_g, 20, (0x2000).to_bytes(2, "big"))
    v.append(
        Vector(
            "a_first_fragment_from_the_pool_is_plain_ipv4",
            [Step(POOL_PORT, first_fragment, [routed(first_fragment, 1, HOSTS[1][0])])],
        )
    )
    # A group whose members include the port the DATA came in on: that copy is pruned (the
    # switch before it served that side), the others go; a hit's copies are not pruned.
    data_f = pool_frame(1, wire.data_message(TENANT, 0x99, 0, 1, b"fabric", group=GROUP_FABRIC))
    getf = _get(1, CHUNK_KEY, 0, req_id=15, group=GROUP_FABRIC)
    reply_f = hit_reply(1, 0, 15, group=GROUP_FABRIC)
    v.append(
        Vector(
            "pool_data_is_never_multicast_back_out_of_its_ingress_port",
            [
                Step(POOL_PORT, data_f, [replica(data_f, 1)], event(c.EV_DATA_MCAST)),
                Step(1, getf, [replica(reply_f, 1), (POOL_PORT, reply_f)], event(c.EV_GET_HIT)),
            ],
        )
    )
    data_host = host_frame(
        1, HOSTS[2][1], wire.data_message(TENANT, 0x99, 0, 1, b"evil", group=GROUP)
    )
    v.append(
        Vector(
            "host_data_with_group_is_refused", [Step(1, data_host, [], drop(c.DROP_UNAUTHORIZED))]
        )
    )
    data_u = pool_frame(2, wire.data_message(TENANT, 0x99, 0, 1, b"unicast"))
    v.append(
        Vector(
            "pool_data_without_group_is_routed",
            [Step(POOL_PORT, data_u, [routed(data_u, 2, HOSTS[2][0])], event(c.EV_DATA_UNICAST))],
        )
    )
    nack = pool_frame(
        3, wire.nack_message(KvpHeader(c.KVP_OP_GET, key=0x42, req_id=5), c.KVP_STATUS_NOT_FOUND)
    )
    v.append(Vector("pool_nack_is_routed", [Step(POOL_PORT, nack, [routed(nack, 3, HOSTS[3][0])])]))
    ack_host = host_frame(1, VIP, KvpHeader(c.KVP_OP_WRITE_ACK).pack())
    v.append(
        Vector("write_ack_from_host_is_refused", [Step(1, ack_host, [], drop(c.DROP_UNAUTHORIZED))])
    )

    v.append(
        Vector(
            "truncated_kvp_header_is_malformed",
            [Step(1, _truncate_udp(get0, k + 20), [], drop(c.DROP_MALFORMED))],
        )
    )
    v.append(
        Vector(
            "get_without_placeholder_is_malformed",
            [
                Step(
                    1,
                    host_frame(1, VIP, wire.get_message(TENANT, CHUNK_KEY, 0)[: c.KVP_HDR_BYTES]),
                    [],
                    drop(c.DROP_MALFORMED),
                )
            ],
        )
    )
    v.append(
        Vector(
            "get_with_short_placeholder_is_malformed",
            [
                Step(
                    1,
                    host_frame(1, VIP, wire.get_message(TENANT, CHUNK_KEY, 0)[:-8]),
                    [],
                    drop(c.DROP_MALFORMED),
                )
            ],
        )
    )
    v.append(
        Vector(
            "bad_version_is_malformed",
            [
                Step(
                    1,
                    _mutate(get0, k, bytes([(2 << 4) | c.KVP_OP_GET])),
                    [],
                    drop(c.DROP_MALFORMED),
                )
            ],
        )
    )
    v.append(
        Vector(
            "unknown_op_is_malformed",
            [Step(1, _mutate(get0, k, bytes([(1 << 4) | 9])), [], drop(c.DROP_MALFORMED))],
        )
    )
    v.append(
        Vector(
            "udp_length_disagreeing_with_ip_is_malformed",
            [Step(1, _mutate(get0, 38, (8 + 40).to_bytes(2, "big")), [], drop(c.DROP_MALFORMED))],
        )
    )
    lying = pool_frame(2, wire.data_message(TENANT, 0x99, 0, 1, b"short"))
    v.append(
        Vector(
            "data_claiming_more_payload_than_sent_is_malformed",
            [
                Step(
                    POOL_PORT,
                    _mutate(lying, k + 28, (999).to_bytes(2, "big")),
                    [],
                    drop(c.DROP_MALFORMED),
                )
            ],
        )
    )

    hot = _get(3, HOT_KEY, 0, req_id=20, tenant=HOT_TENANT)
    hot_steps = [
        Step(3, hot, [_pool_get(hot)], event(c.EV_GET_MISS)) for _ in range(HOT_THRESHOLD + 2)
    ]
    hot_steps[HOT_THRESHOLD - 1] = Step(
        3,
        hot,
        [_pool_get(hot)],
        {(IG_EVENTS, c.EV_GET_MISS): 1, (IG_EVENTS, c.EV_HOT_DIGEST): 1},
        digests=[(HOT_TENANT, HOT_KEY, HOT_THRESHOLD)],
    )
    v.append(Vector("hot_uncached_key_is_reported_once", hot_steps))
    v.extend(_security_vectors())
    v.extend(edge_vectors())
    v.append(_report_row_vector())
    v.append(_independent_rows_vector())
    return v


def _security_vectors() -> list[Vector]:
    """Source binding, tenant binding, group authorization, roles and flags (docs/security.md)."""
    k = wire.FRAME_KVP_OFFSET
    v: list[Vector] = []
    b_mac, b_ip, b_port = HOSTS[BOUND_HOST]
    # A bound port may only send from its own address: plain IP and KVP alike.
    spoofed = wire.udp_frame(b_mac, SWITCH_MAC, HOSTS[1][1], HOSTS[3][1], b_port, 5000, b"x")
    v.append(
        Vector("bound_port_spoofed_source_is_dropped", [Step(2, spoofed, [], drop(c.DROP_SPOOFED))])
    )
    # Reflection: a GET naming a victim as its source, with a large fragment range.
    reflect = wire.udp_frame(
        b_mac,
        SWITCH_MAC,
        HOSTS[3][1],
        VIP,
        c.KVP_UDP_PORT,
        c.KVP_UDP_PORT,
        wire.get_message(TENANT, 0x7777, 0, 1, flags=c.KVP_FLAG_NOCACHE, count=1024),
    )
    v.append(
        Vector("bound_port_reflection_get_is_dropped", [Step(2, reflect, [], drop(c.DROP_SPOOFED))])
    )
    own = host_frame(BOUND_HOST, HOSTS[3][1], b"own", dport=5000)
    v.append(
        Vector("bound_port_own_source_is_routed", [Step(2, own, [routed(own, 3, HOSTS[3][0])])])
    )
    # Another tenant's cached chunk, asked for from a port bound to TENANT only.
    other_tenant_hit = _get(BOUND_HOST, CHUNK_KEY, 0, req_id=31, tenant=TENANT + 1)
    other_tenant_miss = _get(BOUND_HOST, 0x3131, 0, req_id=32, tenant=TENANT + 1)
    v.append(
        Vector(
            "tenant_not_bound_to_port_is_dropped",
            [
                Step(2, other_tenant_hit, [], drop(c.DROP_BAD_TENANT)),
                Step(2, other_tenant_miss, [], drop(c.DROP_BAD_TENANT)),
            ],
        )
    )
    bound_hit = _get(BOUND_HOST, CHUNK_KEY, 1, req_id=33)
    v.append(
        Vector(
            "bound_tenant_get_is_served",
            [Step(2, bound_hit, [(2, hit_reply(2, 1, 33))], event(c.EV_GET_HIT))],
        )
    )
    # A group the requester is not a member of, on a hit and on a miss.
    v.append(
        Vector(
            "get_naming_a_group_without_membership_is_dropped",
            [
                Step(3, _get(3, CHUNK_KEY, 0, 34, group=GROUP_BROKEN), [], drop(c.DROP_BAD_GROUP)),
                Step(3, _get(3, 0x3434, 0, 35, group=GROUP_BROKEN), [], drop(c.DROP_BAD_GROUP)),
                Step(1, _get(1, CHUNK_KEY, 0, 36, group=99), [], drop(c.DROP_BAD_GROUP)),
            ],
        )
    )
    # Only pool ports answer: DATA (unicast, replica-flagged) and NACK from a host are refused.
    forged = host_frame(1, HOSTS[2][1], wire.data_message(TENANT, CHUNK_KEY, 0, 3, b"evil"))
    forged_replica = host_frame(
        1,
        HOSTS[2][1],
        wire.data_message(TENANT, CHUNK_KEY, 0, 3, b"evil", group=GROUP, flags=c.KVP_FLAG_REPLICA),
        dport=c.KVP_AGENT_PORT,
    )
    forged_nack = host_frame(
        1,
        HOSTS[3][1],
        wire.nack_message(KvpHeader(c.KVP_OP_GET, key=CHUNK_KEY, req_id=5), c.KVP_STATUS_NOT_FOUND),
    )
    v.append(
        Vector(
            "host_data_and_nack_are_refused",
            [
                Step(1, forged, [], drop(c.DROP_UNAUTHORIZED)),
                Step(1, forged_replica, [], drop(c.DROP_UNAUTHORIZED)),
                Step(1, forged_nack, [], drop(c.DROP_UNAUTHORIZED)),
            ],
        )
    )
    # Flags a host may not set are cleared: the reply carries HIT and nothing the host chose.
    evil_flags = c.KVP_FLAG_HIT | c.KVP_FLAG_POOL | c.KVP_FLAG_REPLICA | 0x80
    v.append(
        Vector(
            "get_flags_a_host_may_not_set_are_cleared",
            [
                Step(
                    1,
                    _get(1, CHUNK_KEY, 0, 37, flags=evil_flags),
                    [(1, hit_reply(1, 0, 37))],
                    event(c.EV_GET_HIT),
                )
            ],
        )
    )
    # Anything to or from the agents' port is KVP: not KVP-shaped means malformed, not routed.
    to_agent = host_frame(1, HOSTS[2][1], b"not kvp but long enough" * 3, dport=c.KVP_AGENT_PORT)
    from_agent = wire.udp_frame(
        HOSTS[1][0], SWITCH_MAC, HOSTS[1][1], HOSTS[2][1], c.KVP_AGENT_PORT, 6000, b"x" * 60
    )
    v.append(
        Vector(
            "udp_to_or_from_the_agent_port_is_kvp",
            [
                Step(1, to_agent, [], drop(c.DROP_MALFORMED)),
                Step(1, from_agent, [], drop(c.DROP_MALFORMED)),
            ],
        )
    )
    assert all(len(step.frame) > k for vec in v for step in vec.steps)
    return v


# Two keys of HOT_TENANT whose sketch row 0 cells are equal but whose rows 1 and 2 and report
# cells differ (found by search with sketch_indices; the test checks they still are).
ROW0_TWIN_KEYS = (0x18E0BECD7B0, 0x12A6B0A18E8)


def _independent_rows_vector() -> Vector:
    """A key sharing one sketch row's cell with a hot key is not reported with it."""
    first, twin = ROW0_TWIN_KEYS
    steps = []
    for n in range(1, HOT_THRESHOLD):
        f = _get(3, first, 0, req_id=40 + n, tenant=HOT_TENANT)
        steps.append(Step(3, f, [_pool_get(f)], event(c.EV_GET_MISS)))
    t = _get(3, twin, 0, req_id=50, tenant=HOT_TENANT)
    # The twin's row-0 cell already holds HOT_THRESHOLD - 1; its other rows hold 0: estimate 1.
    steps.append(Step(3, t, [_pool_get(t)], event(c.EV_GET_MISS)))
    f = _get(3, first, 0, req_id=60, tenant=HOT_TENANT)
    steps.append(
        Step(
            3,
            f,
            [_pool_get(f)],
            {(IG_EVENTS, c.EV_GET_MISS): 1, (IG_EVENTS, c.EV_HOT_DIGEST): 1},
            digests=[(HOT_TENANT, first, HOT_THRESHOLD)],
        )
    )
    return Vector("sketch_rows_do_not_share_collisions", steps)


# A key of HOT_TENANT and one of REPORT_ATTACKER_TENANT that share the report cell and no sketch
# row cell, and no cell with the other vectors' keys (found by search with sketch_indices; the
# test checks they still do).
REPORT_ATTACKER_TENANT = 9  # host 1's port may ask for any tenant
REPORT_VICTIM_KEY, REPORT_ATTACKER_KEY = 0xED1BBBB90B, 0x7DB793FB82


def _report_row_vector() -> Vector:
    """Another tenant's key reported first on a victim's report cell does not hide the victim."""
    steps = []
    for host, tenant, key, req in (
        (1, REPORT_ATTACKER_TENANT, REPORT_ATTACKER_KEY, 70),
        (3, HOT_TENANT, REPORT_VICTIM_KEY, 80),
    ):
        for n in range(HOT_THRESHOLD):
            f = _get(host, key, 0, req_id=req + n, tenant=tenant)
            steps.append(Step(host, f, [_pool_get(f)], event(c.EV_GET_MISS)))
        last = steps[-1]
        last.counters = {(IG_EVENTS, c.EV_GET_MISS): 1, (IG_EVENTS, c.EV_HOT_DIGEST): 1}
        last.digests = [(tenant, key, HOT_THRESHOLD)]
    return Vector("another_tenants_key_on_the_report_cell_does_not_hide_a_key", steps)


def arp_frame(
    i: int, dst_mac: str, sender_ip: str, target_ip: str, op: int = 2, ptype: int = 0x0800
) -> bytes:
    """An ARP frame from host i's MAC (padded to the Ethernet minimum).

    Args:
        i: the sending host.
        dst_mac: the frame's (and the ARP target's) MAC.
        sender_ip: the ARP sender protocol address.
        target_ip: the ARP target protocol address.
        op: 1 request, 2 reply.
        ptype: the ARP protocol type (IPv4 unless testing a malformed one).
    """
    src_mac = wire.mac_bytes(HOSTS[i][0])
    body = (
        (1).to_bytes(2, "big")
        + ptype.to_bytes(2, "big")
        + bytes((6, 4))
        + op.to_bytes(2, "big")
        + src_mac
        + wire.ip_bytes(sender_ip)
        + wire.mac_bytes(dst_mac)
        + wire.ip_bytes(target_ip)
    )
    return (wire.mac_bytes(dst_mac) + src_mac + b"\x08\x06" + body).ljust(60, b"\0")


def _l2(i: int, ether_type: int, payload: bytes, dst_mac: str = "") -> bytes:
    """A frame from host i to ``dst_mac`` (the switch) with any EtherType (or 802.3 length)."""
    dst = wire.mac_bytes(dst_mac or SWITCH_MAC)
    frame = dst + wire.mac_bytes(HOSTS[i][0]) + ether_type.to_bytes(2, "big") + payload
    return frame.ljust(60, b"\0")


def _tagged(frame: bytes, *tags: tuple[int, int]) -> bytes:
    """``frame`` with (TPID, TCI) tags inserted after its MAC addresses, outermost first."""
    inserted = b"".join(tpid.to_bytes(2, "big") + tci.to_bytes(2, "big") for tpid, tci in tags)
    return frame[:12] + inserted + frame[12:]


def edge_vectors() -> list[Vector]:
    """Default-deny at the edge: one vector per class of frame a host can send.

    Every frame carries an attack that the IPv4 checks stop (a forged DATA or NACK into host 2,
    a GET for a tenant host 2 is not bound to) or is otherwise nothing a host needs to send; each
    must be dropped with nothing out and counted under its own drop reason (EdgeGuard).
    """
    v: list[Vector] = []
    forged_data = host_frame(
        1,
        HOSTS[2][1],
        wire.data_message(TENANT, CHUNK_KEY, 0, 3, b"evil"),
        dport=HOSTS[2][2],
    )
    forged_nack = host_frame(
        1,
        HOSTS[2][1],
        wire.nack_message(KvpHeader(c.KVP_OP_GET, key=CHUNK_KEY, req_id=5), c.KVP_STATUS_NOT_FOUND),
        dport=HOSTS[2][2],
    )
    other_tenant = _get(BOUND_HOST, CHUNK_KEY, 0, req_id=70, tenant=TENANT + 1)
    # The same attacks behind every tag a Linux host can put on a frame.
    tag_steps = [
        Step(1, _tagged(forged_data, (0x8100, 0)), counters=drop(c.DROP_VLAN)),
        Step(1, _tagged(forged_data, (0x8100, 42)), counters=drop(c.DROP_VLAN)),
        Step(1, _tagged(forged_nack, (0x88A8, 7)), counters=drop(c.DROP_VLAN)),
        Step(1, _tagged(forged_data, (0x88A8, 7), (0x8100, 42)), counters=drop(c.DROP_VLAN)),
        Step(1, _tagged(forged_data, (0x9100, 7)), counters=drop(c.DROP_VLAN)),
        Step(2, _tagged(other_tenant, (0x8100, 1)), counters=drop(c.DROP_VLAN)),
    ]
    v.append(Vector("vlan_tagged_frames_from_a_host_are_dropped", tag_steps))
    ipv6_udp = _ipv6_udp(
        1, c.KVP_UDP_PORT, HOSTS[2][2], wire.data_message(TENANT, CHUNK_KEY, 0, 3, b"evil")
    )
    v.append(Vector("ipv6_from_a_host_is_dropped", [Step(1, ipv6_udp, counters=drop(c.DROP_IPV6))]))
    label = (16 << 12 | 1 << 8 | 64).to_bytes(4, "big")  # label 16, bottom of stack, TTL 64
    v.append(
        Vector(
            "mpls_from_a_host_is_dropped",
            [
                Step(1, _l2(1, 0x8847, label + forged_data[14:]), counters=drop(c.DROP_MPLS)),
                Step(1, _l2(1, 0x8848, label + forged_nack[14:]), counters=drop(c.DROP_MPLS)),
            ],
        )
    )
    llc = b"\xaa\xaa\x03\x00\x00\x00\x08\x00" + forged_data[14:]  # SNAP carrying IPv4
    v.append(
        Vector(
            "llc_frames_from_a_host_are_dropped",
            [Step(1, _l2(1, len(llc), llc, HOSTS[2][0]), counters=drop(c.DROP_LLC))],
        )
    )
    pppoe = b"\x11\x00\x00\x01" + (len(forged_data) - 12).to_bytes(2, "big") + b"\x00\x21"
    others = [
        _l2(1, 0x8864, pppoe + forged_data[14:], HOSTS[2][0]),  # PPPoE session, IPv4 inside
        _l2(1, 0x88CC, bytes(40), "01:80:c2:00:00:0e"),  # LLDP
        _l2(1, 0x88B5, forged_data[14:], HOSTS[2][0]),  # local experimental
        _l2(1, 0x8035, arp_frame(1, HOSTS[2][0], HOSTS[1][1], HOSTS[2][1])[14:], HOSTS[2][0]),
    ]
    v.append(
        Vector(
            "other_ethertypes_from_a_host_are_dropped",
            [Step(1, f, counters=drop(c.DROP_OTHER_ETHERTYPE)) for f in others],
        )
    )
    spoofed_arp = arp_frame(1, HOSTS[2][0], POOL_IP, HOSTS[2][1])
    not_ipv4_arp = arp_frame(1, HOSTS[2][0], HOSTS[1][1], HOSTS[2][1], ptype=0x86DD)
    zero_arp = _l2(1, 0x0806, bytes(46), HOSTS[3][0])
    v.append(
        Vector(
            "arp_that_is_malformed_or_spoofed_is_dropped",
            [
                Step(1, spoofed_arp, counters=drop(c.DROP_ARP_SPOOFED)),
                Step(1, not_ipv4_arp, counters=drop(c.DROP_ARP_MALFORMED)),
                Step(1, zero_arp, counters=drop(c.DROP_ARP_MALFORMED)),
            ],
        )
    )
    first = _mutate(forged_data, 20, (0x2000).to_bytes(2, "big"))  # MF, offset 0
    later = _mutate(forged_data, 20, (0x0001).to_bytes(2, "big"))  # offset 8, last
    plain_later = _mutate(host_frame(1, HOSTS[2][1], b"x" * 32, dport=5000), 20, b"\x20\x03")
    v.append(
        Vector(
            "ipv4_fragments_from_a_host_are_dropped",
            [
                Step(1, first, counters=drop(c.DROP_IPV4_FRAGMENT)),
                Step(1, later, counters=drop(c.DROP_IPV4_FRAGMENT)),
                Step(1, plain_later, counters=drop(c.DROP_IPV4_FRAGMENT)),
            ],
        )
    )
    # IPv4 with options: both programs drop it as malformed (they cannot fix its checksum).
    options = bytearray(forged_data[:34] + b"\x01\x01\x01\x00" + forged_data[34:])
    options[14] = 0x46
    options[16:18] = (len(options) - 14).to_bytes(2, "big")
    options[24:26] = b"\0\0"
    options[24:26] = wire.ipv4_checksum(bytes(options[14:38])).to_bytes(2, "big")
    v.append(
        Vector(
            "ipv4_with_options_from_a_host_is_malformed",
            [Step(1, bytes(options), [], drop(c.DROP_MALFORMED))],
        )
    )
    deny_get = wire.udp_frame(
        DENY_MAC,
        SWITCH_MAC,
        DENY_IP,
        VIP,
        40005,
        c.KVP_UDP_PORT,
        wire.get_message(TENANT, CHUNK_KEY, 0, 38),
    )
    deny_plain = wire.udp_frame(DENY_MAC, SWITCH_MAC, DENY_IP, HOSTS[1][1], 40005, 5000, b"hi")
    deny_arp = (
        wire.mac_bytes(HOSTS[1][0])
        + wire.mac_bytes(DENY_MAC)
        + arp_frame(1, HOSTS[1][0], DENY_IP, HOSTS[1][1])[12:]
    )
    denied = [deny_get, deny_plain, deny_arp]
    v.append(
        Vector(
            "denied_port_sends_nothing",
            [Step(DENY_PORT, f, counters=drop(c.DROP_PORT_DENIED)) for f in denied],
        )
    )
    v.append(
        Vector(
            "unknown_port_is_denied_by_the_data_plane",
            [Step(UNKNOWN_PORT, f, counters=drop(c.DROP_PORT_DENIED)) for f in denied],
        )
    )
    return v


def _ipv6_udp(i: int, sport: int, dport: int, payload: bytes) -> bytes:
    """An IPv6/UDP frame from host i's MAC to host 2's (link-local addresses)."""
    udp = sport.to_bytes(2, "big") + dport.to_bytes(2, "big")
    udp += (8 + len(payload)).to_bytes(2, "big") + b"\0\0" + payload
    src = bytes.fromhex("fe800000000000000000000000000001")
    dst = bytes.fromhex("fe800000000000000000000000000002")
    ip6 = b"\x60\0\0\0" + len(udp).to_bytes(2, "big") + bytes((17, 64)) + src + dst
    return _l2(i, 0x86DD, ip6 + udp, HOSTS[2][0])


def _truncate_udp(frame: bytes, length: int) -> bytes:
    """Cuts a frame after ``length`` bytes with consistent IPv4/UDP lengths."""
    out = bytearray(frame[:length])
    out[16:18] = (length - 14).to_bytes(2, "big")
    out[38:40] = (length - 34).to_bytes(2, "big")
    _fix_checksum(out)
    return bytes(out)


VECTORS = build_vectors()
