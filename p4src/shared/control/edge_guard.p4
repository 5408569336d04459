/*
 * EdgeGuard: default-deny at the switch's edge. A check that applies only to what the parser
 * takes as IPv4 is no check: a Linux host hands VLAN-tagged, 802.1ad and other frames to an
 * ordinary UDP socket with their source port intact. So a host port may send only ARP for IPv4
 * over Ethernet from its own address, and IPv4 that is not a fragment (PortRole, KvpValidate
 * and the rest then check it); a DENY port sends nothing. Pool and fan-out ports are trusted
 * parties and pass. Each drop is counted under its own reason (docs/security.md). The same on
 * both architectures: it reads parsed headers and PortRole's metadata only.
 */
#ifndef _KVCAST_SHARED_EDGE_GUARD_P4_
#define _KVCAST_SHARED_EDGE_GUARD_P4_

control EdgeGuard(in headers_t hdr, inout local_metadata_t meta) {
    // No action of its own (one would be a P4Info entity with nothing to program): the verdict
    // goes to meta.drop and meta.drop_reason, which Stats counts.
    apply {
        if (meta.port_role == PORT_ROLE_DENY) {
            meta.drop = true;
            meta.drop_reason = DROP_PORT_DENIED;
        } else if (meta.port_role != PORT_ROLE_HOST) {
            // Pool and fan-out ports: trusted.
        } else if (meta.edge_foreign) {
            meta.drop = true;
            meta.drop_reason = meta.edge_reason;
        } else if (hdr.ipv4.isValid()) {
            if (hdr.ipv4.flags[0:0] == 1 || hdr.ipv4.frag_offset != 0) {
                meta.drop = true;
                meta.drop_reason = DROP_IPV4_FRAGMENT;
            }
        } else if (hdr.ethernet.isValid() && hdr.ethernet.ether_type == ETHERTYPE_ARP) {
            if (!hdr.arp.isValid() || hdr.arp.htype != ARP_HTYPE_ETHERNET
                    || hdr.arp.ptype != ETHERTYPE_IPV4 || hdr.arp.hlen != ARP_HLEN_ETHERNET
                    || hdr.arp.plen != ARP_PLEN_IPV4
                    || (hdr.arp.op != ARP_OP_REQUEST && hdr.arp.op != ARP_OP_REPLY)) {
                meta.drop = true;
                meta.drop_reason = DROP_ARP_MALFORMED;
            } else if (meta.bound && hdr.arp.spa != meta.bound_addr) {
                meta.drop = true;
                meta.drop_reason = DROP_ARP_SPOOFED;
            }
        }
    }
}

#endif  // _KVCAST_SHARED_EDGE_GUARD_P4_
