/*
 * EdgeGuard: default-deny at the switch's edge. A check that applies only to what the parser
 * takes as IPv4 is no check: a Linux host hands VLAN-tagged, 802.1ad and other frames to an
 * ordinary UDP socket with their source port intact. So a host port may send only ARP for IPv4
 * over Ethernet from its own address, and IPv4 that is not a fragment (PortRole, KvpValidate
 * and the rest then check it); a DENY port sends nothing. Pool and fan-out ports are trusted
 * parties and pass. Each drop is counted under its own reason (docs/security.md). The same on
 * both architectures: it reads parsed headers, the parser's classification and PortRole's
 * metadata only.
 */
#ifndef _KVCAST_SHARED_EDGE_GUARD_P4_
#define _KVCAST_SHARED_EDGE_GUARD_P4_

control EdgeGuard(in headers_t hdr, inout local_metadata_t meta) {
    // No action of its own (one would be a P4Info entity with nothing to program): the verdict
    // goes to meta.drop and meta.drop_reason, which Stats counts. The parser has done the
    // field checks (a foreign EtherType, ARP other than a request or reply for IPv4 over
    // Ethernet, an IPv4 fragment: meta.edge_foreign with its reason) and PortRole's bind_host
    // the address comparison (meta.src_mismatch, the claimed source XOR the bound one), so that
    // every condition here is one small comparison: on Tofino the guard is a few gateways in
    // the stage after port_role, beside nothing that waits for it.
    apply {
        if (meta.port_role == PORT_ROLE_DENY) {
            meta.drop = true;
            meta.drop_reason = DROP_PORT_DENIED;
        } else if (meta.port_role != PORT_ROLE_HOST) {
            // Pool and fan-out ports: trusted.
        } else if (meta.edge_foreign) {
            meta.drop = true;
            meta.drop_reason = meta.edge_reason;
        } else if (hdr.ethernet.isValid() && hdr.ethernet.ether_type == ETHERTYPE_ARP
                   && !hdr.arp.isValid()) {
            // Too short for an ARP header.
            meta.drop = true;
            meta.drop_reason = DROP_ARP_MALFORMED;
        } else if (hdr.arp.isValid() && meta.bound && meta.src_mismatch != 0) {
            meta.drop = true;
            meta.drop_reason = DROP_ARP_SPOOFED;
        }
    }
}

#endif  // _KVCAST_SHARED_EDGE_GUARD_P4_
