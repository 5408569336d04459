/* kvcast v1model parser, checksum controls and deparser. */
#ifndef _KVCAST_PARSER_P4_
#define _KVCAST_PARSER_P4_

parser KvcastParser(packet_in packet, out headers_t hdr, inout local_metadata_t meta,
                    inout standard_metadata_t std) {
    state start {
        transition select(std.ingress_port) {
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
        // Only unfragmented option-less UDP can carry KVP; anything else is plain IP traffic
        // (ingress drops option-carrying headers as malformed because it cannot fix their
        // checksum after a TTL decrement).
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
        // Requests go to the KVP port; replies come from it to the agent's port. Anything to or
        // from either port is KVP: it meets every check or is dropped as malformed.
        transition select(hdr.udp.dst_port, hdr.udp.src_port) {
            (KVP_UDP_PORT, _): parse_kvp;
            (_, KVP_UDP_PORT): parse_kvp;
            (KVP_AGENT_PORT, _): parse_kvp;
            (_, KVP_AGENT_PORT): parse_kvp;
            default: accept;
        }
    }

    state parse_kvp {
        packet.extract(hdr.kvp);
        // GET carries a one-fragment placeholder and WRITE one fragment of data; both are
        // parsed so that the fragment store can overwrite or read them word by word.
        transition select(hdr.kvp.op) {
            KVP_OP_GET: parse_value;
            KVP_OP_WRITE: parse_value;
            default: accept;
        }
    }

    state parse_value {
        packet.extract(hdr.value);
        transition accept;
    }
}

control KvcastVerifyChecksum(inout headers_t hdr, inout local_metadata_t meta) {
    apply {
        verify_checksum(hdr.ipv4.isValid() && hdr.ipv4.ihl == 5,
            { hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.dscp_ecn, hdr.ipv4.total_len,
              hdr.ipv4.identification, hdr.ipv4.flags, hdr.ipv4.frag_offset, hdr.ipv4.ttl,
              hdr.ipv4.protocol, hdr.ipv4.src_addr, hdr.ipv4.dst_addr },
            hdr.ipv4.hdr_checksum, HashAlgorithm.csum16);
    }
}

control KvcastComputeChecksum(inout headers_t hdr, inout local_metadata_t meta) {
    apply {
        update_checksum(hdr.ipv4.isValid() && hdr.ipv4.ihl == 5,
            { hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.dscp_ecn, hdr.ipv4.total_len,
              hdr.ipv4.identification, hdr.ipv4.flags, hdr.ipv4.frag_offset, hdr.ipv4.ttl,
              hdr.ipv4.protocol, hdr.ipv4.src_addr, hdr.ipv4.dst_addr },
            hdr.ipv4.hdr_checksum, HashAlgorithm.csum16);
    }
}

control KvcastDeparser(packet_out packet, in headers_t hdr) {
    apply {
        packet.emit(hdr.packet_in);
        packet.emit(hdr.ethernet);
        packet.emit(hdr.arp);
        packet.emit(hdr.ipv4);
        packet.emit(hdr.udp);
        packet.emit(hdr.kvp);
        packet.emit(hdr.value);
    }
}

#endif  // _KVCAST_PARSER_P4_
