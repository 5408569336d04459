/* kvcast TNA: header instances, bridged and per-packet metadata. */
#ifndef _KVCAST_TNA_METADATA_P4_
#define _KVCAST_TNA_METADATA_P4_

#include "shared/headers.p4"

typedef bit<SLOT_ADDR_BITS> slot_addr_t;

// What ingress tells egress, in front of every packet it sends on: the port the packet came in
// on (the PacketIn metadata of packets to the CPU port).
header bridged_md_t {
    bit<7>   pad;
    PortId_t ingress_port;
}

struct headers_t {
    bridged_md_t bridged;
    packet_out_t packet_out;
    packet_in_t  packet_in;
    ethernet_t   ethernet;
    ipv4_t       ipv4;
    udp_t        udp;
    kvp_t        kvp;
    kvp_value_t  value;
}

struct local_metadata_t {
    bit<8>       port_role;
    // Source binding of a host port (PortRole) and the verdicts of its tenant and group checks.
    bool         bound;
    ipv4_addr_t  bound_addr;
    bit<8>       check_tenant;
    bool         tenant_ok;
    bool         group_ok;
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
    // Cache lookup result.
    bool         hit;
    slot_index_t slot_base;
    bit<16>      frag_count;
    epoch_t      epoch;
    // The fragment slot this packet reads or writes (bounds-checked), its register address,
    // and the epoch stored with it.
    slot_index_t slot;
    slot_addr_t  slot_addr;
    epoch_t      frag_epoch;
    bit<32>      hot_threshold;
    bit<32>      sketch_window;
    bit<32>      sketch_min01;
}

// Egress parses the packet again; it needs the KVP header only (replica rewrite).
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
