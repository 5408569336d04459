/* kvcast v1model: header instances and per-packet metadata. */
#ifndef _KVCAST_METADATA_P4_
#define _KVCAST_METADATA_P4_

#include "shared/headers.p4"

struct headers_t {
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
    // Source binding of a host port (PortRole): its address, whether its tenants are checked,
    // and the verdicts of the tenant and group checks for this packet. The source address the
    // frame claims (the parser's: IPv4 source or ARP sender) and its XOR with the bound one
    // (bind_host's), which the edge guard tests.
    bool         bound;
    ipv4_addr_t  bound_addr;
    ipv4_addr_t  claimed_src;
    ipv4_addr_t  src_mismatch;
    bool         check_tenant;
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
    // DATA multicast that came in from a pool or fabric port: its replicas never leave by the
    // port it came in on (egress prunes them), so a tree of groups across switches carries one
    // copy per link and cannot loop. A hit's multicast is not pruned.
    bool         transit;
    // Cache lookup result.
    bool         hit;
    slot_index_t slot_base;
    bit<16>      frag_count;
    epoch_t      epoch;
    // The fragment slot this packet reads or writes, and the epoch stored with it.
    slot_index_t slot;
    epoch_t      frag_epoch;
    bit<16>      hot_threshold;
    bit<16>      sketch_window;
}

#endif  // _KVCAST_METADATA_P4_
