/*
 * kvcast shared constants: the single source for opcodes, flags, ports, drop reasons and event
 * indices. kvcast/p4constants.py is generated from this file (`make constants`); never re-type
 * one of these values in Python.
 */
#ifndef _KVCAST_DEFINES_P4_
#define _KVCAST_DEFINES_P4_

const bit<16> ETHERTYPE_IPV4 = 0x0800;
const bit<16> ETHERTYPE_ARP = 0x0806;
// What a host port must not send (the edge guard drops each under its own reason): 802.1Q and
// 802.1ad tags with the pre-standard QinQ TPIDs still found in switches, IPv6, MPLS. Below
// 0x0600 the field is an 802.3 length (LLC/SNAP follows).
const bit<16> ETHERTYPE_VLAN = 0x8100;
const bit<16> ETHERTYPE_QINQ = 0x88A8;
const bit<16> ETHERTYPE_QINQ_9100 = 0x9100;
const bit<16> ETHERTYPE_QINQ_9200 = 0x9200;
const bit<16> ETHERTYPE_IPV6 = 0x86DD;
const bit<16> ETHERTYPE_MPLS = 0x8847;
const bit<16> ETHERTYPE_MPLS_MCAST = 0x8848;
const bit<16> MAX_8023_LENGTH = 0x05FF;
// ARP for IPv4 over Ethernet: the only ARP a host port may send (RFC 826).
const bit<16> ARP_HTYPE_ETHERNET = 1;
const bit<8>  ARP_HLEN_ETHERNET = 6;
const bit<8>  ARP_PLEN_IPV4 = 4;
const bit<16> ARP_OP_REQUEST = 1;
const bit<16> ARP_OP_REPLY = 2;
const bit<8>  IP_PROTO_UDP = 17;

// "KV" in ASCII; outside IANA's well-known range and unused by RoCE (4791) and VXLAN (4789).
const bit<16> KVP_UDP_PORT = 19286;
// The port host agents receive DATA and multicast replicas on (hostagent/ports.py). UDP to or
// from either port is parsed as KVP, so nothing reaches an agent around the switch's checks.
const bit<16> KVP_AGENT_PORT = 19287;
const bit<4>  KVP_VERSION = 1;
// Bytes of the fixed KVP header (kvp_t in headers.p4).
const bit<16> KVP_HDR_BYTES = 40;
const bit<16> UDP_HDR_BYTES = 8;
const bit<16> IPV4_HDR_BYTES = 20;

// Operations (kvp_t.op).
const bit<4> KVP_OP_GET = 1;        // host -> switch/pool: send me fragment frag_idx
const bit<4> KVP_OP_DATA = 2;       // switch/pool -> host(s): one or more fragments
const bit<4> KVP_OP_WRITE = 3;      // control plane -> switch (CPU port only): fill one slot
const bit<4> KVP_OP_WRITE_ACK = 4;  // switch -> control plane (PacketIn): slot written
const bit<4> KVP_OP_NACK = 5;       // pool -> host: not here / bad request (see status)

// Flags (kvp_t.flags), a bit set.
const bit<8> KVP_FLAG_HIT = 0x01;      // DATA served from switch SRAM
const bit<8> KVP_FLAG_POOL = 0x02;     // DATA served by a pool node
const bit<8> KVP_FLAG_NOCACHE = 0x04;  // GET: skip the switch cache, go to the pool owner
const bit<8> KVP_FLAG_REPLICA = 0x08;  // DATA is a multicast replica rewritten in egress

// NACK status codes (kvp_t.status); sent by pool nodes, the switch only drops and counts.
const bit<8> KVP_STATUS_OK = 0;
const bit<8> KVP_STATUS_NOT_FOUND = 1;
const bit<8> KVP_STATUS_BAD_REQUEST = 2;
const bit<8> KVP_STATUS_UNAVAILABLE = 3;

// Index into drop_counter: every reason the switch drops a packet.
const bit<32> DROP_MALFORMED = 0;      // parser error, bad checksum, version, op or length
const bit<32> DROP_BAD_EPOCH = 1;      // fragment slot holds another load than the entry names
const bit<32> DROP_BAD_FRAGMENT = 2;   // fragment index beyond the chunk or the slot array
const bit<32> DROP_UNAUTHORIZED = 3;   // op not allowed from the ingress port's role (docs/security.md)
const bit<32> DROP_NO_ROUTE = 4;       // no L2/L3 entry, or a replica with no destination
const bit<32> DROP_TTL_EXPIRED = 5;
const bit<32> DROP_SPOOFED = 6;        // source address is not the one bound to the host port
const bit<32> DROP_BAD_TENANT = 7;     // tenant not bound to the host port
const bit<32> DROP_BAD_GROUP = 8;      // GET names a group its ingress port is not a member of
// The edge guard (docs/security.md): what a host port may not send, and a DENY port at all.
const bit<32> DROP_PORT_DENIED = 9;    // anything from a DENY port (the default for an unknown one)
const bit<32> DROP_VLAN = 10;          // an 802.1Q or 802.1ad (QinQ) tag from a host port
const bit<32> DROP_IPV6 = 11;          // the switch checks and routes IPv4 only
const bit<32> DROP_MPLS = 12;
const bit<32> DROP_LLC = 13;           // an 802.3 length frame (LLC/SNAP)
const bit<32> DROP_OTHER_ETHERTYPE = 14;  // PPPoE, LLDP, 802.1X, MACsec, RARP, experimental, ...
const bit<32> DROP_ARP_MALFORMED = 15; // ARP that is not a well-formed IPv4-over-Ethernet op 1/2
const bit<32> DROP_ARP_SPOOFED = 16;   // ARP from a bound host port with another sender address
const bit<32> DROP_IPV4_FRAGMENT = 17; // MF or an offset: the switch cannot check what reassembles
const bit<32> DROP_REASON_COUNT = 18;

// Index into kvp_event_counter: what happened to KVP packets that were not dropped.
const bit<32> EV_GET_HIT = 0;
const bit<32> EV_GET_MISS = 1;
const bit<32> EV_GET_BYPASS = 2;      // GET with KVP_FLAG_NOCACHE
const bit<32> EV_DATA_MCAST = 3;      // pool DATA replicated to a group
const bit<32> EV_DATA_UNICAST = 4;
const bit<32> EV_WRITE = 5;
const bit<32> EV_HOT_DIGEST = 6;      // a hot uncached key was reported to the control plane
const bit<32> EV_COUNT = 7;

// Port roles (port_role table). An unknown port is DENY (the program's default): nothing from
// it enters. The controller binds each host port to its address and tenants (bind_host); a
// host port sends only ARP and unfragmented IPv4 (docs/security.md).
const bit<8> PORT_ROLE_HOST = 0;
const bit<8> PORT_ROLE_POOL = 1;
const bit<8> PORT_ROLE_DENY = 2;
// A loopback port of the WRITE fan-out (Tofino): a WRITE coming back in on it is the control
// plane's, multicast to this pipe to be stored here. Hosts cannot reach such a port.
const bit<8> PORT_ROLE_FANOUT = 3;

// GET flags a host may set; the switch clears every other bit of a GET's flags.
const bit<8> KVP_GET_FLAGS_ALLOWED = 0x04;

// Multicast group of the WRITE fan-out on a switch with several pipes (Tofino): one loopback
// port per pipe, so that every pipe stores the fragment. Never a host group: the controller
// allocates host groups below it and no group_member entry names it. The highest id that
// P4Runtime servers built on PI accept (they keep the ids from 2^15 on for themselves).
const bit<16> WRITE_FANOUT_GROUP = 0x7FFF;

// Receiver id of hot-miss digests.
const bit<32> HOT_MISS_DIGEST_RECEIVER = 1;

#endif  // _KVCAST_DEFINES_P4_
