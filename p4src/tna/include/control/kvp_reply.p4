/* KvpReply: turns a GET that hit into a DATA reply, unicast to the requester or to its group. */
#ifndef _KVCAST_TNA_KVP_REPLY_P4_
#define _KVCAST_TNA_KVP_REPLY_P4_

control KvpReply(inout headers_t hdr, inout local_metadata_t meta, in PortId_t ingress_port,
                 inout ingress_intrinsic_metadata_for_tm_t ig_tm_md) {
    // One action, so that the address swaps are one stage's parallel moves (the fragment store
    // has already overwritten the placeholder, and read the CRC and length into metadata). The
    // reply comes from the service address the GET was sent to.
    action make_reply() {
        hdr.kvp.op = KVP_OP_DATA;
        hdr.kvp.crc = meta.stored_crc;
        hdr.kvp.payload_len = meta.stored_len;
        hdr.kvp.flags = hdr.kvp.flags | KVP_FLAG_HIT;
        hdr.kvp.frag_count = meta.frag_count;
        hdr.kvp.epoch = meta.epoch;
        hdr.kvp.index = 0;
        ipv4_addr_t service_ip = hdr.ipv4.dst_addr;
        hdr.ipv4.dst_addr = hdr.ipv4.src_addr;
        hdr.ipv4.src_addr = service_ip;
        hdr.ipv4.ttl = 64;
        bit<16> requester_port = hdr.udp.src_port;
        hdr.udp.src_port = hdr.udp.dst_port;
        hdr.udp.dst_port = requester_port;
        hdr.udp.checksum = 0;
        mac_addr_t service_mac = hdr.ethernet.dst_addr;
        hdr.ethernet.dst_addr = hdr.ethernet.src_addr;
        hdr.ethernet.src_addr = service_mac;
        meta.done = true;
    }

    apply {
        make_reply();
        if (hdr.kvp.group != 0) {
            // Every member gets a replica; egress rewrites each one's destination.
            ig_tm_md.mcast_grp_a = hdr.kvp.group;
        } else {
            ig_tm_md.ucast_egress_port = ingress_port;
        }
    }
}

#endif  // _KVCAST_TNA_KVP_REPLY_P4_
