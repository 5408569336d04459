/*
 * Forwarding: L3 (IPv4 longest prefix) for IP traffic and L2 (destination MAC) for the rest. The
 * architecture's port type and the field that takes the unicast egress port are macros
 * (KVCAST_PORT_T, KVCAST_TM_MD_T, KVCAST_UCAST_PORT: include/arch.p4 of each architecture).
 */
#ifndef _KVCAST_SHARED_FORWARDING_P4_
#define _KVCAST_SHARED_FORWARDING_P4_

control Forwarding(inout headers_t hdr, inout local_metadata_t meta,
                   inout KVCAST_TM_MD_T tm_md) {
    action no_route() {
        meta.drop = true;
        meta.drop_reason = DROP_NO_ROUTE;
    }

    action route(KVCAST_PORT_T port, mac_addr_t smac, mac_addr_t dmac) {
        KVCAST_UCAST_PORT(tm_md) = port;
        hdr.ethernet.src_addr = smac;
        hdr.ethernet.dst_addr = dmac;
        hdr.ipv4.ttl = hdr.ipv4.ttl - 1;
    }

    table ipv4_lpm {
        key = { hdr.ipv4.dst_addr: lpm @name("dst_addr"); }
        actions = {
            route;
            @defaultonly no_route;
        }
        const default_action = no_route();
        size = IPV4_ROUTES;
    }

    action l2_forward(KVCAST_PORT_T port) {
        KVCAST_UCAST_PORT(tm_md) = port;
    }

    table l2_fwd {
        key = { hdr.ethernet.dst_addr: exact @name("dst_addr"); }
        actions = {
            l2_forward;
            @defaultonly no_route;
        }
        const default_action = no_route();
        size = L2_ENTRIES;
    }

    apply {
        if (hdr.ipv4.isValid()) {
            if (hdr.ipv4.ttl <= 1) {
                meta.drop = true;
                meta.drop_reason = DROP_TTL_EXPIRED;
            } else {
                ipv4_lpm.apply();
            }
        } else {
            l2_fwd.apply();
        }
    }
}

#endif  // _KVCAST_SHARED_FORWARDING_P4_
