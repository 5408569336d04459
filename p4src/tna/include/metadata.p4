/* kvcast TNA: header instances, bridged and per-packet metadata. */
#ifndef _KVCAST_TNA_METADATA_P4_
#define _KVCAST_TNA_METADATA_P4_

#include "shared/headers.p4"

typedef bit<SLOT_ADDR_BITS> slot_addr_t;

// What ingress tells egress, in front of every packet it sends on: the port the packet came in
// on (the PacketIn metadata of packets to the CPU port). The port sits where it sits in the
// ingress intrinsic metadata; egress copies both fields into packet_in_t (a rotation of one PHV
// source, which Tofino's ALUs do as long as no constant joins it).
header bridged_md_t {
    bit<7>   pad;
    PortId_t ingress_port;
}

struct headers_t {
    bridged_md_t bridged;
    packet_out_t packet_out;
    packet_in_t  packet_in;
    ethernet_t   ethernet;
    arp_t        arp;
    ipv4_t       ipv4;
    udp_t        udp;
    kvp_t        kvp;
    kvp_value_t  value;
}

struct local_metadata_t {
    bit<8>       port_role;
    // Set by the parser for a frame a host port must not send (neither IPv4 nor ARP), with the
    // drop reason of its EtherType class; the edge guard drops it.
    bool         edge_foreign;
    bit<32>      edge_reason;
    // Source binding of a host port (PortRole), whether the GET's tenant and group are listed
    // for the port, the source address the frame claims (the parser's: IPv4 source or ARP
    // sender) and its XOR with the bound one (bind_host's).
    bool         bound;
    ipv4_addr_t  bound_addr;
    bit<8>       check_tenant;
    bool         tenant_listed;
    bool         group_listed;
    ipv4_addr_t  claimed_src;
    ipv4_addr_t  src_mismatch;
    bool         from_cpu;
    // Set when ingress has chosen the egress (a reply, a multicast, a PacketOut) so that the
    // L2/L3 lookup is skipped.
    bool         done;
    bool         drop;
    bit<32>      drop_reason;
    bool         count_event;
    bit<32>      event;
    bool         hot_reported;
    bool         checksum_error;
    // Set by the parser: a KVP GET, a KVP WRITE (whose slot_addr it sets from the index).
    bool         op_get;
    bool         op_write;
    // Cache lookup result.
    bool         hit;
    bit<16>      frag_count;
    epoch_t      epoch;
    // The fragment slot a GET that hit reads (computed by the cache entry's action) or a WRITE
    // stores, and whether the slot holds another load than the entry's epoch names.
    slot_addr_t  slot_addr;
    bit<8>       stale;
    // The slot's CRC and length, for the reply.
    bit<32>      stored_crc;
    bit<16>      stored_len;
    // KvpValidate's lengths: KVP bytes by the UDP length, IPv4 payload bytes, their XOR with
    // the UDP length, and by how much the payload overruns the KVP bytes (saturating at 0).
    bit<16>      kvp_bytes;
    bit<16>      ip_payload;
    bit<16>      len_mismatch;
    bit<16>      overrun;
    bit<16>      frag_over;  // payload_len - (FRAG_BYTES + 1) (KvpValidate)
    // frag_count - frag_idx of a GET that hit, saturating (0: beyond the chunk).
    bit<16>      frag_left;
    // The sketch: whether this GET is counted (a miss no check refused), the configuration
    // (threshold, window id, and the report register's mark for this window), and the
    // threshold minus min(row 0, row 1) and minus row 2, saturating (both 0: report).
    bool         count_miss;
    bit<16>      sketch_threshold;
    bit<16>      sketch_window;
    bit<32>      report_mark;
    bit<32>      report_tenant;  // the GET's tenant, as the report row's high word keeps it
    bit<16>      sketch_c0;  // the rows' counts of this key in this window
    bit<16>      sketch_c1;
    bit<16>      sketch_c2;
    bit<16>      sketch_min01;
    bit<16>      sketch_short01;
    bit<16>      sketch_short2;
    bit<16>      sketch_estimate;  // min of the three rows, as the digest carries it
}

// Egress parses the packet again; it needs the KVP header only (replica rewrite). Tofino-1's
// egress parser reaches 160 bytes into a packet, counting its intrinsic metadata, which leaves no
// room for a fragment behind the headers: the fragment store lives in ingress.
struct egress_headers_t {
    bridged_md_t bridged;
    packet_in_t  packet_in;
    ethernet_t   ethernet;
    ipv4_t       ipv4;
    udp_t        udp;
    kvp_t        kvp;
}

struct egress_metadata_t {
    bool    drop;
    bit<32> drop_reason;
}

#endif  // _KVCAST_TNA_METADATA_P4_
