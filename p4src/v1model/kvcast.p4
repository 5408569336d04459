/*
 * kvcast for BMv2 (v1model): an in-network KV-cache pool. Hot prefix KV chunks live in switch
 * registers; a GET that hits is answered from them (unicast or multicast), a miss goes to the
 * pool node that owns the key and is counted in a sketch that reports hot uncached keys. WRITEs
 * from the control plane (PacketOut on the CPU port) fill fragment slots. docs/protocol.md
 * describes the wire format and every drop reason.
 */
#include <core.p4>
#include <v1model.p4>

#include "shared/defines.p4"
#include "shared/sizes.p4"
#include "shared/headers.p4"
#include "v1model/include/metadata.p4"
#include "v1model/include/parser.p4"
#include "v1model/include/control/stats.p4"
#include "v1model/include/control/port_role.p4"
#include "v1model/include/control/edge_guard.p4"
#include "v1model/include/control/kvp_validate.p4"
#include "v1model/include/control/cache.p4"
#include "v1model/include/control/fragment_store.p4"
#include "v1model/include/control/hot_sketch.p4"
#include "v1model/include/control/pool_owner.p4"
#include "v1model/include/control/kvp_reply.p4"
#include "v1model/include/control/forwarding.p4"
#include "v1model/include/control/replica.p4"

control KvcastIngress(inout headers_t hdr, inout local_metadata_t meta,
                      inout standard_metadata_t std) {
    PortRole() port_role;
    EdgeGuard() edge_guard;
    KvpValidate() kvp_validate;
    CacheLookup() cache;
    FragmentStore() fragments;
    HotMissSketch() hot_sketch;
    PoolOwner() pool_owner;
    KvpReply() kvp_reply;
    Forwarding() forwarding;
    Stats() stats;

    action drop(bit<32> reason) {
        meta.drop = true;
        meta.drop_reason = reason;
    }

    action count_event(bit<32> event) {
        meta.count_event = true;
        meta.event = event;
    }

    apply {
        if (std.ingress_port != CPU_PORT_NUM) {
            // Every packet from a data port: its role, and for a bound host port the address
            // it must send from. The edge guard runs first, on whatever the frame is: a DENY
            // port sends nothing, a host port only ARP and unfragmented IPv4.
            port_role.apply(hdr, meta, std);
            edge_guard.apply(hdr, meta);
        }

        if (meta.drop) {
            // Refused at the edge.
        } else if (std.parser_error != error.NoError || std.checksum_error == 1) {
            drop(DROP_MALFORMED);
        } else if (hdr.ipv4.isValid() && (hdr.ipv4.version != 4 || hdr.ipv4.ihl != 5)) {
            drop(DROP_MALFORMED);
        } else if (hdr.packet_out.isValid()) {
            if (hdr.packet_out.egress_port != 0) {
                std.egress_spec = hdr.packet_out.egress_port;
                meta.done = true;
            } else {
                meta.from_cpu = true;
            }
            hdr.packet_out.setInvalid();
        }

        if (!meta.drop && !meta.done && !meta.from_cpu) {
            // Anti-spoofing for all IPv4 from a bound host port, not only KVP.
            if (meta.bound && hdr.ipv4.isValid() && hdr.ipv4.src_addr != meta.bound_addr) {
                drop(DROP_SPOOFED);
            }
        }

        if (!meta.drop && !meta.done && hdr.kvp.isValid()) {
            kvp_validate.apply(hdr, meta);
        }

        if (!meta.drop && !meta.done && hdr.kvp.isValid()) {
            if (hdr.kvp.op == KVP_OP_WRITE) {
                if (!meta.from_cpu) {
                    drop(DROP_UNAUTHORIZED);
                } else if (hdr.kvp.index >= NUM_FRAG_SLOTS) {
                    drop(DROP_BAD_FRAGMENT);
                } else {
                    meta.slot = hdr.kvp.index;
                    fragments.apply(hdr, meta);
                    // Acknowledge to the control plane (PacketIn) without the fragment bytes.
                    hdr.kvp.op = KVP_OP_WRITE_ACK;
                    hdr.value.setInvalid();
                    hdr.udp.length = hdr.udp.length - FRAG_BYTES;
                    hdr.ipv4.total_len = hdr.ipv4.total_len - FRAG_BYTES;
                    hdr.udp.checksum = 0;
                    std.egress_spec = CPU_PORT_NUM;
                    meta.done = true;
                    count_event(EV_WRITE);
                }
            } else if (hdr.kvp.op == KVP_OP_GET) {
                // A host may only ask to skip the cache: HIT, POOL, REPLICA and unknown bits
                // are cleared, so no reply carries a flag its requester chose.
                hdr.kvp.flags = hdr.kvp.flags & KVP_GET_FLAGS_ALLOWED;
                if (!meta.tenant_ok) {
                    drop(DROP_BAD_TENANT);
                } else if (!meta.group_ok) {
                    drop(DROP_BAD_GROUP);
                } else if ((hdr.kvp.flags & KVP_FLAG_NOCACHE) == 0) {
                    cache.apply(hdr, meta);
                }
                if (meta.drop) {
                    // Refused above: neither served nor counted as a miss.
                } else if (meta.hit) {
                    meta.slot = meta.slot_base + (slot_index_t)hdr.kvp.frag_idx;
                    if (hdr.kvp.frag_idx >= meta.frag_count || meta.slot >= NUM_FRAG_SLOTS) {
                        drop(DROP_BAD_FRAGMENT);
                    } else {
                        fragments.apply(hdr, meta);
                        if (meta.frag_epoch != meta.epoch) {
                            drop(DROP_BAD_EPOCH);
                        } else {
                            kvp_reply.apply(hdr, meta, std);
                            count_event(EV_GET_HIT);
                        }
                    }
                } else {
                    if ((hdr.kvp.flags & KVP_FLAG_NOCACHE) != 0) {
                        count_event(EV_GET_BYPASS);
                    } else {
                        hot_sketch.apply(hdr, meta);
                        count_event(EV_GET_MISS);
                    }
                    // One call site: BMv2 (and Tofino) apply each table once per pass.
                    pool_owner.apply(hdr);
                }
            } else if (hdr.kvp.op == KVP_OP_DATA || hdr.kvp.op == KVP_OP_NACK) {
                // Only pool nodes answer (the switch's own replies were made above): a host
                // could otherwise push bytes of its choosing into another host's tensor, or
                // abort its fetch with a NACK.
                if (meta.port_role != PORT_ROLE_POOL) {
                    drop(DROP_UNAUTHORIZED);
                } else if (hdr.kvp.op == KVP_OP_NACK) {
                    // Routed to the requester below.
                } else if (hdr.kvp.group == 0) {
                    count_event(EV_DATA_UNICAST);
                } else {
                    std.mcast_grp = hdr.kvp.group;
                    meta.transit = true;
                    meta.done = true;
                    count_event(EV_DATA_MCAST);
                }
            } else if (hdr.kvp.op == KVP_OP_WRITE_ACK) {
                // Only the switch makes acknowledgements.
                drop(DROP_UNAUTHORIZED);
            }
        }

        if (!meta.drop && !meta.done) {
            forwarding.apply(hdr, meta, std);
        }
        stats.apply(meta, std);
    }
}

control KvcastEgress(inout headers_t hdr, inout local_metadata_t meta,
                     inout standard_metadata_t std) {
    ReplicaRewrite() replica;
    Stats() stats;

    apply {
        // Ingress events were counted there.
        meta.count_event = false;
        meta.hot_reported = false;
        if (meta.transit && std.egress_port == std.ingress_port) {
            // Pruned, not a drop reason: the switch before this one served that side.
            mark_to_drop(std);
            exit;
        }
        if (std.egress_rid != 0 && hdr.kvp.isValid()) {
            replica.apply(hdr, meta, std.egress_rid);
        }
        if (std.egress_port == CPU_PORT_NUM) {
            hdr.packet_in.setValid();
            hdr.packet_in.ingress_port = std.ingress_port;
            hdr.packet_in.pad = 0;
        }
        stats.apply(meta, std);
    }
}

V1Switch(KvcastParser(), KvcastVerifyChecksum(), KvcastIngress(), KvcastEgress(),
         KvcastComputeChecksum(), KvcastDeparser()) main;
