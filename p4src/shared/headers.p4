/*
 * kvcast header types (types only; instances live in the per-architecture metadata file).
 * Byte order on the wire is network order (big-endian) for every field, as P4 deparses them.
 */
#ifndef _KVCAST_HEADERS_P4_
#define _KVCAST_HEADERS_P4_

#include "shared/sizes.p4"

typedef bit<48> mac_addr_t;
typedef bit<32> ipv4_addr_t;
typedef bit<64> chunk_key_t;
typedef bit<16> tenant_t;
typedef bit<16> group_t;
typedef bit<32> epoch_t;
typedef bit<32> slot_index_t;

header ethernet_t {
    mac_addr_t dst_addr;
    mac_addr_t src_addr;
    bit<16>    ether_type;
}

header ipv4_t {
    bit<4>      version;
    bit<4>      ihl;
    bit<8>      dscp_ecn;
    bit<16>     total_len;
    bit<16>     identification;
    bit<3>      flags;
    bit<13>     frag_offset;
    bit<8>      ttl;
    bit<8>      protocol;
    bit<16>     hdr_checksum;
    ipv4_addr_t src_addr;
    ipv4_addr_t dst_addr;
}

// ARP for IPv4 over Ethernet (28 bytes); the edge guard checks it, l2_fwd switches it.
header arp_t {
    bit<16>     htype;
    bit<16>     ptype;
    bit<8>      hlen;
    bit<8>      plen;
    bit<16>     op;
    mac_addr_t  sha;
    ipv4_addr_t spa;
    mac_addr_t  tha;
    ipv4_addr_t tpa;
}

header udp_t {
    bit<16> src_port;
    bit<16> dst_port;
    bit<16> length;
    bit<16> checksum;
}

// The KVP header, 40 bytes; docs/protocol.md describes every field.
header kvp_t {
    bit<4>       version;
    bit<4>       op;
    bit<8>       flags;
    bit<8>       status;
    bit<8>       rsvd0;
    tenant_t     tenant;
    group_t      group;
    chunk_key_t  key;
    bit<32>      req_id;
    epoch_t      epoch;
    bit<16>      frag_idx;
    bit<16>      frag_count;
    bit<16>      payload_len;
    bit<16>      rsvd1;
    slot_index_t index;
    bit<32>      crc;
}

// One fragment as FRAG_WORDS words of WORD_BITS bits (32 x 64 on BMv2, 24 x 32 on Tofino): the
// GET placeholder the switch overwrites on a hit, and the payload of a WRITE. Words are
// big-endian, so the payload bytes keep their order.
header kvp_value_t {
    bit<WORD_BITS> w00;
    bit<WORD_BITS> w01;
    bit<WORD_BITS> w02;
    bit<WORD_BITS> w03;
    bit<WORD_BITS> w04;
    bit<WORD_BITS> w05;
    bit<WORD_BITS> w06;
    bit<WORD_BITS> w07;
    bit<WORD_BITS> w08;
    bit<WORD_BITS> w09;
    bit<WORD_BITS> w10;
    bit<WORD_BITS> w11;
    bit<WORD_BITS> w12;
    bit<WORD_BITS> w13;
    bit<WORD_BITS> w14;
    bit<WORD_BITS> w15;
#if FRAG_WORDS > 16
    bit<WORD_BITS> w16;
    bit<WORD_BITS> w17;
    bit<WORD_BITS> w18;
    bit<WORD_BITS> w19;
    bit<WORD_BITS> w20;
    bit<WORD_BITS> w21;
    bit<WORD_BITS> w22;
    bit<WORD_BITS> w23;
#endif
#if FRAG_WORDS > 24
    bit<WORD_BITS> w24;
    bit<WORD_BITS> w25;
    bit<WORD_BITS> w26;
    bit<WORD_BITS> w27;
#endif
#if FRAG_WORDS > 28
    bit<WORD_BITS> w28;
    bit<WORD_BITS> w29;
    bit<WORD_BITS> w30;
    bit<WORD_BITS> w31;
#endif
}

// P4Runtime PacketOut metadata: egress_port 0 means "run the packet through ingress as if it
// arrived on the CPU port" (how the control plane injects WRITEs); any other port sends it there.
@controller_header("packet_out")
header packet_out_t {
    bit<9> egress_port;
    bit<7> pad;
}

// P4Runtime PacketIn metadata: the port the packet came in on.
@controller_header("packet_in")
header packet_in_t {
    bit<9> ingress_port;
    bit<7> pad;
}

// Hot uncached key report (digest), sent once per sketch window when the key's estimated miss
// count reaches the threshold.
struct hot_miss_digest_t {
    tenant_t    tenant;
    chunk_key_t key;
    bit<16>     estimate;  // the rows count in 16 bits on both targets
}

#endif  // _KVCAST_HEADERS_P4_
