/*
 * ReplicaRewrite (egress): gives each multicast replica of a DATA packet its own destination.
 * Egress's header and metadata types are macros (KVCAST_EG_HEADERS_T, KVCAST_EG_METADATA_T:
 * include/arch.p4 of each architecture); the replica id comes in as a value.
 */
#ifndef _KVCAST_SHARED_REPLICA_P4_
#define _KVCAST_SHARED_REPLICA_P4_

control ReplicaRewrite(inout KVCAST_EG_HEADERS_T hdr, inout KVCAST_EG_METADATA_T meta,
                       in bit<16> egress_rid) {
    action set_replica_dst(mac_addr_t dmac, ipv4_addr_t dip, bit<16> dport) {
        hdr.ethernet.dst_addr = dmac;
        hdr.ipv4.dst_addr = dip;
        hdr.udp.dst_port = dport;
        hdr.udp.checksum = 0;
        hdr.kvp.flags = hdr.kvp.flags | KVP_FLAG_REPLICA;
    }

    // A replica with no destination would reach the original requester a second time.
    action replica_unknown() {
        meta.drop = true;
        meta.drop_reason = DROP_NO_ROUTE;
    }

    // The replica id is the P4Runtime Replica.instance the control plane gave this host.
    table replica_dst {
        key = { egress_rid: exact @name("rid"); }
        actions = {
            set_replica_dst;
            @defaultonly replica_unknown;
        }
        const default_action = replica_unknown();
        size = REPLICA_ENTRIES;
    }

    apply {
        replica_dst.apply();
    }
}

#endif  // _KVCAST_SHARED_REPLICA_P4_
