/* kvcast TNA parsers and deparsers, ingress and egress. */
#ifndef _KVCAST_TNA_PARSER_P4_
#define _KVCAST_TNA_PARSER_P4_

// Digest type of hot-miss reports (ig_dprsr_md.digest_type).
const bit<3> HOT_MISS_DIGEST_TYPE = 1;

parser KvcastIngressParser(packet_in packet, out headers_t hdr, out local_metadata_t meta,
                           out ingress_intrinsic_metadata_t ig_intr_md) {
    Checksum() ipv4_checksum;

    state start {
        packet.extract(ig_intr_md);
        packet.advance(PORT_METADATA_SIZE);
        // Metadata starts at zero (false; PORT_ROLE_HOST), as main's @pa_auto_init_metadata
        // asks: assignments here would become a stage of their own that every table writing
        // these fields would wait for.
        transition select(ig_intr_md.ingress_port) {
            CPU_PORT_NUM: parse_packet_out;
            default: parse_ethernet;
        }
    }

    state parse_packet_out {
        packet.extract(hdr.packet_out);
        transition parse_ethernet;
    }

    state parse_ethernet {
        packet.extract(hdr.ethernet);
        // Nothing after a tag or any other EtherType is parsed: from a host port the edge
        // guard drops it by its class, from a pool port l2_fwd switches it.
        transition select(hdr.ethernet.ether_type) {
            ETHERTYPE_IPV4: parse_ipv4;
            ETHERTYPE_ARP: parse_arp;
            ETHERTYPE_VLAN: foreign_vlan;
            ETHERTYPE_QINQ: foreign_vlan;
            ETHERTYPE_QINQ_9100: foreign_vlan;
            ETHERTYPE_QINQ_9200: foreign_vlan;
            ETHERTYPE_IPV6: foreign_ipv6;
            ETHERTYPE_MPLS: foreign_mpls;
            ETHERTYPE_MPLS_MCAST: foreign_mpls;
            // 0x0000-0x05ff: an 802.3 length.
            16w0x0000 &&& 16w0xFC00: foreign_llc;
            16w0x0400 &&& 16w0xFE00: foreign_llc;
            default: foreign_other;
        }
    }

    // ARP for IPv4 over Ethernet, a request or a reply; anything else is malformed (the edge
    // guard drops it from a host port). The checks are the parser's, so that the guard's
    // conditions stay small; the sender address is kept for PortRole's comparison.
    state parse_arp {
        packet.extract(hdr.arp);
        meta.claimed_src = hdr.arp.spa;
        transition select(hdr.arp.htype, hdr.arp.ptype) {
            (ARP_HTYPE_ETHERNET, ETHERTYPE_IPV4): parse_arp_op;
            default: arp_malformed;
        }
    }

    state parse_arp_op {
        transition select(hdr.arp.hlen, hdr.arp.plen, hdr.arp.op) {
            (ARP_HLEN_ETHERNET, ARP_PLEN_IPV4, ARP_OP_REQUEST): accept;
            (ARP_HLEN_ETHERNET, ARP_PLEN_IPV4, ARP_OP_REPLY): accept;
            default: arp_malformed;
        }
    }

    state arp_malformed {
        meta.edge_foreign = true;
        meta.edge_reason = DROP_ARP_MALFORMED;
        transition accept;
    }

    // MF set or a non-zero offset: the switch cannot check what reassembles.
    state ipv4_fragment {
        meta.edge_foreign = true;
        meta.edge_reason = DROP_IPV4_FRAGMENT;
        transition accept;
    }

    state foreign_vlan {
        meta.edge_foreign = true;
        meta.edge_reason = DROP_VLAN;
        transition accept;
    }

    state foreign_ipv6 {
        meta.edge_foreign = true;
        meta.edge_reason = DROP_IPV6;
        transition accept;
    }

    state foreign_mpls {
        meta.edge_foreign = true;
        meta.edge_reason = DROP_MPLS;
        transition accept;
    }

    state foreign_llc {
        meta.edge_foreign = true;
        meta.edge_reason = DROP_LLC;
        transition accept;
    }

    state foreign_other {
        meta.edge_foreign = true;
        meta.edge_reason = DROP_OTHER_ETHERTYPE;
        transition accept;
    }

    state parse_ipv4 {
        packet.extract(hdr.ipv4);
        ipv4_checksum.add(hdr.ipv4);
        // bf-p4c sets this when the sum does not verify (Intel's switch.p4 names it
        // ipv4_checksum_err too). Option-carrying headers fail it (20 bytes are added) and are
        // dropped as malformed by ingress anyway, as on BMv2.
        meta.checksum_error = ipv4_checksum.verify();
        meta.claimed_src = hdr.ipv4.src_addr;
        transition select(hdr.ipv4.flags[0:0], hdr.ipv4.frag_offset, hdr.ipv4.ihl,
                          hdr.ipv4.protocol) {
            (1w0, 13w0, 4w5, IP_PROTO_UDP): parse_udp;
            (1w0, 13w0, _, _): accept;
            default: ipv4_fragment;
        }
    }

    state parse_udp {
        packet.extract(hdr.udp);
        transition select(hdr.udp.dst_port, hdr.udp.src_port) {
            (KVP_UDP_PORT, _): parse_kvp;
            (_, KVP_UDP_PORT): parse_kvp;
            (KVP_AGENT_PORT, _): parse_kvp;
            (_, KVP_AGENT_PORT): parse_kvp;
            default: accept;
        }
    }

    // The parser tells the fragment store what a packet asks of it, so that the store can run
    // from the first stage that knows whether the GET hit (or where the WRITE came in).
    state parse_kvp {
        packet.extract(hdr.kvp);
        transition select(hdr.kvp.op) {
            KVP_OP_GET: parse_get;
            KVP_OP_WRITE: parse_write;
            default: accept;
        }
    }

    state parse_get {
        meta.op_get = true;
        transition parse_value;
    }

    state parse_write {
        meta.op_write = true;
        meta.slot_addr = hdr.kvp.index[SLOT_ADDR_BITS - 1:0];
        meta.epoch = hdr.kvp.epoch;
        transition parse_value;
    }

    state parse_value {
        packet.extract(hdr.value);
        transition accept;
    }
}

control KvcastIngressDeparser(packet_out packet, inout headers_t hdr, in local_metadata_t meta,
                              in ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md) {
    Checksum() ipv4_checksum;
    Digest<hot_miss_digest_t>(HOT_MISS_DIGEST_TYPE) hot_miss_digest;

    apply {
        if (hdr.ipv4.isValid()) {
            hdr.ipv4.hdr_checksum = ipv4_checksum.update({
                hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.dscp_ecn, hdr.ipv4.total_len,
                hdr.ipv4.identification, hdr.ipv4.flags, hdr.ipv4.frag_offset, hdr.ipv4.ttl,
                hdr.ipv4.protocol, hdr.ipv4.src_addr, hdr.ipv4.dst_addr });
        }
        if (ig_dprsr_md.digest_type == HOT_MISS_DIGEST_TYPE) {
            hot_miss_digest.pack({ hdr.kvp.tenant, hdr.kvp.key, meta.sketch_estimate });
        }
        packet.emit(hdr.bridged);
        packet.emit(hdr.ethernet);
        packet.emit(hdr.arp);
        packet.emit(hdr.ipv4);
        packet.emit(hdr.udp);
        packet.emit(hdr.kvp);
        packet.emit(hdr.value);
    }
}

parser KvcastEgressParser(packet_in packet, out egress_headers_t hdr, out egress_metadata_t meta,
                          out egress_intrinsic_metadata_t eg_intr_md) {
    state start {
        packet.extract(eg_intr_md);
        packet.extract(hdr.bridged);
        transition parse_ethernet;
    }

    state parse_ethernet {
        packet.extract(hdr.ethernet);
        transition select(hdr.ethernet.ether_type) {
            ETHERTYPE_IPV4: parse_ipv4;
            default: accept;
        }
    }

    state parse_ipv4 {
        packet.extract(hdr.ipv4);
        transition select(hdr.ipv4.ihl, hdr.ipv4.frag_offset, hdr.ipv4.protocol) {
            (4w5, 13w0, IP_PROTO_UDP): parse_udp;
            default: accept;
        }
    }

    state parse_udp {
        packet.extract(hdr.udp);
        transition select(hdr.udp.dst_port, hdr.udp.src_port) {
            (KVP_UDP_PORT, _): parse_kvp;
            (_, KVP_UDP_PORT): parse_kvp;
            (KVP_AGENT_PORT, _): parse_kvp;
            (_, KVP_AGENT_PORT): parse_kvp;
            default: accept;
        }
    }

    // The fragment (if any) stays in the payload: egress never touches it.
    state parse_kvp {
        packet.extract(hdr.kvp);
        transition accept;
    }
}

control KvcastEgressDeparser(packet_out packet, inout egress_headers_t hdr,
                             in egress_metadata_t meta) {
    Checksum() ipv4_checksum;

    apply {
        if (hdr.ipv4.isValid()) {
            hdr.ipv4.hdr_checksum = ipv4_checksum.update({
                hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.dscp_ecn, hdr.ipv4.total_len,
                hdr.ipv4.identification, hdr.ipv4.flags, hdr.ipv4.frag_offset, hdr.ipv4.ttl,
                hdr.ipv4.protocol, hdr.ipv4.src_addr, hdr.ipv4.dst_addr });
        }
        packet.emit(hdr.packet_in);
        packet.emit(hdr.ethernet);
        packet.emit(hdr.ipv4);
        packet.emit(hdr.udp);
        packet.emit(hdr.kvp);
    }
}

#endif  // _KVCAST_TNA_PARSER_P4_
