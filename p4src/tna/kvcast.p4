/*
 * kvcast for Tofino-1 (TNA): the same program as p4src/v1model/kvcast.p4, control for control and
 * with the same table, action, register and counter names, on TNA's externs. Hot prefix KV
 * chunks live in stateful-ALU registers; a GET that hits is answered from them (unicast or
 * multicast), a miss goes to the pool node that owns the key and is counted in a sketch that
 * reports hot uncached keys. WRITEs from the control plane (PacketOut on the CPU port) fill
 * fragment slots. What differs from BMv2, and why, is in docs/tofino.md.
 *
 * Compile: bf-p4c / p4c-barefoot --target tofino --arch tna -I p4src p4src/tna/kvcast.p4
 * (sizes.p4 sees __TARGET_TOFINO__: 128-byte fragments, 32768 slots).
 */
#include <core.p4>
#include <tna.p4>

#include "shared/defines.p4"
#include "shared/sizes.p4"
#include "shared/headers.p4"
#include "tna/include/metadata.p4"
#include "tna/include/parser.p4"
#include "tna/include/control/stats.p4"
#include "tna/include/control/port_role.p4"
#include "tna/include/control/kvp_validate.p4"
#include "tna/include/control/cache.p4"
#include "tna/include/control/fragment_store.p4"
#include "tna/include/control/hot_sketch.p4"
#include "tna/include/control/pool_owner.p4"
#include "tna/include/control/kvp_reply.p4"
#include "tna/include/control/forwarding.p4"
#include "tna/include/control/replica.p4"

control KvcastIngress(inout headers_t hdr, inout local_metadata_t meta,
                      in ingress_intrinsic_metadata_t ig_intr_md,
                      in ingress_intrinsic_metadata_from_parser_t ig_prsr_md,
                      inout ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md,
                      inout ingress_intrinsic_metadata_for_tm_t ig_tm_md) {
    PortRole() port_role;
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
        // Egress needs the ingress port for PacketIn metadata.
        hdr.bridged.setValid();
        hdr.bridged.pad = 0;
        hdr.bridged.ingress_port = ig_intr_md.ingress_port;

        if (ig_prsr_md.parser_err != 0 || (hdr.ipv4.isValid() && meta.checksum_error)) {
            drop(DROP_MALFORMED);
        } else if (hdr.ipv4.isValid() && (hdr.ipv4.version != 4 || hdr.ipv4.ihl != 5)) {
            drop(DROP_MALFORMED);
        } else if (hdr.packet_out.isValid()) {
            if (hdr.packet_out.egress_port != 0) {
                ig_tm_md.ucast_egress_port = hdr.packet_out.egress_port;
                meta.done = true;
            } else {
                meta.from_cpu = true;
            }
            hdr.packet_out.setInvalid();
        }

        if (!meta.drop && !meta.done && !meta.from_cpu) {
            port_role.apply(hdr, meta, ig_intr_md.ingress_port);
            if (meta.bound && hdr.ipv4.isValid() && hdr.ipv4.src_addr != meta.bound_addr) {
                drop(DROP_SPOOFED);
            }
        }

        if (!meta.drop && !meta.done && hdr.kvp.isValid()) {
            kvp_validate.apply(hdr, meta);
        }

        // Decide; the fragment store is then applied from one call site (on Tofino each register
        // is driven by one stateful ALU, which one table placement uses).
        bool store_write = false;
        bool store_read = false;
        if (!meta.drop && !meta.done && hdr.kvp.isValid()) {
            if (meta.port_role == PORT_ROLE_DENY && !meta.from_cpu) {
                drop(DROP_UNAUTHORIZED);
            } else if (hdr.kvp.op == KVP_OP_WRITE) {
                if (!meta.from_cpu) {
                    drop(DROP_UNAUTHORIZED);
                } else if (hdr.kvp.index >= NUM_FRAG_SLOTS) {
                    drop(DROP_BAD_FRAGMENT);
                } else {
                    meta.slot = hdr.kvp.index;
                    store_write = true;
                }
            } else if (hdr.kvp.op == KVP_OP_GET) {
                // A host may only ask to skip the cache; every other flag bit is cleared.
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
                    // frag_idx < frag_count, as a sign test (gateways compare with constants).
                    bit<17> left = (bit<17>)meta.frag_count - (bit<17>)hdr.kvp.frag_idx;
                    if (left[16:16] == 1 || left == 0 || meta.slot >= NUM_FRAG_SLOTS) {
                        drop(DROP_BAD_FRAGMENT);
                    } else {
                        store_read = true;
                    }
                } else {
                    if ((hdr.kvp.flags & KVP_FLAG_NOCACHE) != 0) {
                        count_event(EV_GET_BYPASS);
                    } else {
                        hot_sketch.apply(hdr, meta, ig_dprsr_md);
                        count_event(EV_GET_MISS);
                    }
                    pool_owner.apply(hdr);
                }
            } else if (hdr.kvp.op == KVP_OP_DATA || hdr.kvp.op == KVP_OP_NACK) {
                // Only pool nodes answer (the switch's own replies are made above).
                if (meta.port_role != PORT_ROLE_POOL) {
                    drop(DROP_UNAUTHORIZED);
                } else if (hdr.kvp.op == KVP_OP_NACK) {
                    // Routed to the requester below.
                } else if (hdr.kvp.group == 0) {
                    count_event(EV_DATA_UNICAST);
                } else {
                    ig_tm_md.mcast_grp_a = hdr.kvp.group;
                    meta.done = true;
                    count_event(EV_DATA_MCAST);
                }
            } else if (hdr.kvp.op == KVP_OP_WRITE_ACK) {
                // Only the switch makes acknowledgements.
                drop(DROP_UNAUTHORIZED);
            }
        }

        if (store_write || store_read) {
            meta.slot_addr = (slot_addr_t)meta.slot;
            fragments.apply(hdr, meta);
        }

        if (store_write) {
            // Acknowledge to the control plane (PacketIn) without the fragment bytes.
            hdr.kvp.op = KVP_OP_WRITE_ACK;
            hdr.value.setInvalid();
            hdr.udp.length = hdr.udp.length - FRAG_BYTES;
            hdr.ipv4.total_len = hdr.ipv4.total_len - FRAG_BYTES;
            hdr.udp.checksum = 0;
            ig_tm_md.ucast_egress_port = CPU_PORT_NUM;
            meta.done = true;
            count_event(EV_WRITE);
        } else if (store_read) {
            if ((meta.frag_epoch ^ meta.epoch) != 0) {
                drop(DROP_BAD_EPOCH);
            } else {
                kvp_reply.apply(hdr, meta, ig_intr_md.ingress_port, ig_tm_md);
                count_event(EV_GET_HIT);
            }
        }

        if (!meta.drop && !meta.done) {
            forwarding.apply(hdr, meta, ig_tm_md);
        }
        stats.apply(meta, ig_dprsr_md);
    }
}

control KvcastEgress(inout egress_headers_t hdr, inout egress_metadata_t meta,
                     in egress_intrinsic_metadata_t eg_intr_md,
                     in egress_intrinsic_metadata_from_parser_t eg_prsr_md,
                     inout egress_intrinsic_metadata_for_deparser_t eg_dprsr_md,
                     inout egress_intrinsic_metadata_for_output_port_t eg_oport_md) {
    ReplicaRewrite() replica;
    EgressStats() stats;

    apply {
        if (eg_intr_md.egress_rid != 0 && hdr.kvp.isValid()) {
            replica.apply(hdr, meta, eg_intr_md.egress_rid);
        }
        if (eg_intr_md.egress_port == CPU_PORT_NUM) {
            hdr.packet_in.setValid();
            hdr.packet_in.ingress_port = hdr.bridged.ingress_port;
            hdr.packet_in.pad = 0;
        }
        hdr.bridged.setInvalid();
        stats.apply(meta, eg_dprsr_md);
    }
}

Pipeline(KvcastIngressParser(), KvcastIngress(), KvcastIngressDeparser(),
         KvcastEgressParser(), KvcastEgress(), KvcastEgressDeparser()) pipe;

Switch(pipe) main;
