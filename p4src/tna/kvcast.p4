/*
 * kvcast for Tofino-1 (TNA): the same program as p4src/v1model/kvcast.p4, control for control and
 * with the same table, action, register and counter names, on TNA's externs. Hot prefix KV
 * chunks live in stateful-ALU registers; a GET that hits is answered from them (unicast or
 * multicast), a miss goes to the pool node that owns the key and is counted in a sketch that
 * reports hot uncached keys. WRITEs from the control plane (PacketOut on the CPU port) fill
 * fragment slots. What differs from BMv2, and why, is in docs/tofino.md.
 *
 * Compile: bf-p4c / p4c-barefoot --target tofino --arch tna -I p4src p4src/tna/kvcast.p4
 * (sizes.p4 sees __TARGET_TOFINO__: 96-byte fragments of 24 32-bit words, 32768 slots).
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
#include "tna/include/control/edge_guard.p4"
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
    EdgeGuard() edge_guard;
    KvpValidate() kvp_validate;
    CacheLookup() cache;
    FragmentStore() fragments;
    // The fragment's words, one register each (FragmentStore's, as on BMv2, by their names).
    @name("fragments.slice_00") ValueSlice_00() slice_00;
    @name("fragments.slice_01") ValueSlice_01() slice_01;
    @name("fragments.slice_02") ValueSlice_02() slice_02;
    @name("fragments.slice_03") ValueSlice_03() slice_03;
    @name("fragments.slice_04") ValueSlice_04() slice_04;
    @name("fragments.slice_05") ValueSlice_05() slice_05;
    @name("fragments.slice_06") ValueSlice_06() slice_06;
    @name("fragments.slice_07") ValueSlice_07() slice_07;
    @name("fragments.slice_08") ValueSlice_08() slice_08;
    @name("fragments.slice_09") ValueSlice_09() slice_09;
    @name("fragments.slice_10") ValueSlice_10() slice_10;
    @name("fragments.slice_11") ValueSlice_11() slice_11;
    @name("fragments.slice_12") ValueSlice_12() slice_12;
    @name("fragments.slice_13") ValueSlice_13() slice_13;
    @name("fragments.slice_14") ValueSlice_14() slice_14;
    @name("fragments.slice_15") ValueSlice_15() slice_15;
#if FRAG_WORDS > 16
    @name("fragments.slice_16") ValueSlice_16() slice_16;
    @name("fragments.slice_17") ValueSlice_17() slice_17;
    @name("fragments.slice_18") ValueSlice_18() slice_18;
    @name("fragments.slice_19") ValueSlice_19() slice_19;
    @name("fragments.slice_20") ValueSlice_20() slice_20;
    @name("fragments.slice_21") ValueSlice_21() slice_21;
    @name("fragments.slice_22") ValueSlice_22() slice_22;
    @name("fragments.slice_23") ValueSlice_23() slice_23;
#endif
#if FRAG_WORDS > 24
    @name("fragments.slice_24") ValueSlice_24() slice_24;
    @name("fragments.slice_25") ValueSlice_25() slice_25;
    @name("fragments.slice_26") ValueSlice_26() slice_26;
    @name("fragments.slice_27") ValueSlice_27() slice_27;
#endif
#if FRAG_WORDS > 28
    @name("fragments.slice_28") ValueSlice_28() slice_28;
    @name("fragments.slice_29") ValueSlice_29() slice_29;
    @name("fragments.slice_30") ValueSlice_30() slice_30;
    @name("fragments.slice_31") ValueSlice_31() slice_31;
#endif
    HotMissSketch() hot_sketch;
    @name("hot_sketch") SketchConfig() hot_sketch_config;
    PoolOwner() pool_owner;
    KvpReply() kvp_reply;
    Forwarding() forwarding;
    Stats() stats;

    action drop(bit<32> reason) {
        meta.drop = true;
        meta.drop_reason = reason;
    }

    // frag_count - frag_idx of a GET, saturating: 0 when the fragment is beyond the chunk. An
    // action of its own, so that the condition tests a field rather than the arithmetic.
    action fragments_left() {
        meta.frag_left = meta.frag_count |-| hdr.kvp.frag_idx;
    }

    action count_event(bit<32> event) {
        meta.count_event = true;
        meta.event = event;
    }

    // Tofino places a table in the stage after the last one that wrote what it reads, so the
    // order below is the dependency order: lookups on parsed fields first, all side by side;
    // the fragment store as soon as the cache lookup has given it a slot; the verdict last, in
    // the order of the v1model program's checks. The store may read a slot for a GET that the
    // verdict then refuses: the packet is dropped, and a read changes nothing.
    apply {
        // Egress needs the ingress port for PacketIn metadata.
        hdr.bridged.setValid();
        hdr.bridged.pad = 0;
        hdr.bridged.ingress_port = ig_intr_md.ingress_port;

        port_role.apply(hdr, meta, ig_intr_md.ingress_port);
        // Default-deny at the edge, on whatever the frame is: comparisons on parsed fields and
        // PortRole's verdict, in the stage after port_role (no table, no register).
        if (ig_intr_md.ingress_port != CPU_PORT_NUM) {
            edge_guard.apply(hdr, meta);
        }
        hot_sketch_config.apply(meta);
        if (hdr.kvp.isValid()) {
            kvp_validate.apply(hdr, meta);
            if (hdr.kvp.op == KVP_OP_GET && (hdr.kvp.flags & KVP_FLAG_NOCACHE) == 0) {
                cache.apply(hdr, meta);
            }
        }

        // A WRITE is stored where it comes back in from a fan-out port (never from a host:
        // PortRole gives that role only to loopback ports, and the WRITE's index was checked
        // where it entered from the CPU port); a GET that hit reads its slot.
        // (A hit implies a GET: the cache is looked up for GETs only.)
        if ((meta.op_write && meta.port_role == PORT_ROLE_FANOUT) || meta.hit) {
            fragments.apply(hdr, meta, meta.slot_addr, meta.op_write);
        }
        if (meta.drop) {
            // Refused at the edge.
        } else if (ig_prsr_md.parser_err != 0 || (hdr.ipv4.isValid() && meta.checksum_error)) {
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
        } else if (meta.bound && hdr.ipv4.isValid() && meta.src_mismatch != 0) {
            drop(DROP_SPOOFED);
        }

        if (!meta.drop && !meta.done && hdr.kvp.isValid()) {
            // Structural checks first (field-to-field comparisons as the saturating differences
            // and XORs KvpValidate computed, tested against constants).
            if (hdr.kvp.version != KVP_VERSION) {
                drop(DROP_MALFORMED);
            } else if (hdr.kvp.op < KVP_OP_GET || hdr.kvp.op > KVP_OP_NACK) {
                drop(DROP_MALFORMED);
            } else if (meta.len_mismatch != 0) {
                drop(DROP_MALFORMED);
            } else if (hdr.udp.length < UDP_HDR_BYTES + KVP_HDR_BYTES) {
                drop(DROP_MALFORMED);
            } else if ((meta.op_get || meta.op_write) && meta.kvp_bytes != FRAG_BYTES) {
                drop(DROP_MALFORMED);  // a GET or WRITE carries exactly one fragment
            } else if (meta.op_write &&
                       (hdr.kvp.payload_len[15:15] == 1 || meta.frag_over[15:15] == 0)) {
                drop(DROP_MALFORMED);  // payload_len > FRAG_BYTES
            } else if (!meta.op_get && !meta.op_write && meta.overrun != 0) {
                drop(DROP_MALFORMED);  // payload_len > the KVP bytes
            } else if (hdr.kvp.op == KVP_OP_WRITE) {
                if (meta.port_role == PORT_ROLE_FANOUT) {
                    // Stored in this pipe: acknowledge to the control plane (PacketIn from this
                    // pipe's fan-out port). The fragment bytes stay, as the store read them
                    // back: removing them would make this wait for every word's stage.
                    hdr.kvp.op = KVP_OP_WRITE_ACK;
                    hdr.udp.checksum = 0;
                    ig_tm_md.ucast_egress_port = CPU_PORT_NUM;
                    meta.done = true;
                } else if (!meta.from_cpu) {
                    drop(DROP_UNAUTHORIZED);
                } else if (hdr.kvp.index[31:SLOT_ADDR_BITS] != 0) {  // index >= NUM_FRAG_SLOTS
                    drop(DROP_BAD_FRAGMENT);
                } else {
                    // One copy to the fan-out port of every pipe, which stores it when it comes
                    // back in there.
                    ig_tm_md.mcast_grp_a = WRITE_FANOUT_GROUP;
                    meta.done = true;
                    count_event(EV_WRITE);
                }
            } else if (hdr.kvp.op == KVP_OP_GET) {
                // A host may only ask to skip the cache; every other flag bit is cleared.
                hdr.kvp.flags = hdr.kvp.flags & KVP_GET_FLAGS_ALLOWED;
                // A GET from the CPU port has no tenant binding: refused, as on BMv2.
                if (meta.from_cpu
                        || (meta.bound && meta.check_tenant != 0 && !meta.tenant_listed)) {
                    drop(DROP_BAD_TENANT);
                } else if (hdr.kvp.group != 0 && meta.port_role != PORT_ROLE_POOL &&
                           !meta.group_listed) {
                    drop(DROP_BAD_GROUP);
                } else if (meta.hit) {
                    fragments_left();
                    if (meta.frag_left == 0) {
                        drop(DROP_BAD_FRAGMENT);
                    } else if (meta.stale != 0) {
                        drop(DROP_BAD_EPOCH);
                    } else {
                        kvp_reply.apply(hdr, meta, ig_intr_md.ingress_port, ig_tm_md);
                        count_event(EV_GET_HIT);
                    }
                } else {
                    if ((hdr.kvp.flags & KVP_FLAG_NOCACHE) != 0) {
                        count_event(EV_GET_BYPASS);
                    } else {
                        meta.count_miss = true;
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

        hot_sketch.apply(hdr, meta, ig_dprsr_md);
        if (!meta.drop && !meta.done) {
            forwarding.apply(hdr, meta, ig_tm_md);
        }
        stats.apply(meta, ig_dprsr_md);

        // The words, each under the same condition in a block of its own: on Tofino-1 a block
        // is placed as a unit, and one block of 32 words would span 8 stages that the verdict
        // and the sketch below could then not share. One word each, they fill the stateful
        // ALUs those leave free (their tables have a lower placement priority).
        if ((meta.op_write && meta.port_role == PORT_ROLE_FANOUT) || meta.hit) {
            slice_00.apply(hdr.value.w00, meta.slot_addr, meta.op_write);
        }
        if ((meta.op_write && meta.port_role == PORT_ROLE_FANOUT) || meta.hit) {
            slice_01.apply(hdr.value.w01, meta.slot_addr, meta.op_write);
        }
        if ((meta.op_write && meta.port_role == PORT_ROLE_FANOUT) || meta.hit) {
            slice_02.apply(hdr.value.w02, meta.slot_addr, meta.op_write);
        }
        if ((meta.op_write && meta.port_role == PORT_ROLE_FANOUT) || meta.hit) {
            slice_03.apply(hdr.value.w03, meta.slot_addr, meta.op_write);
        }
        if ((meta.op_write && meta.port_role == PORT_ROLE_FANOUT) || meta.hit) {
            slice_04.apply(hdr.value.w04, meta.slot_addr, meta.op_write);
        }
        if ((meta.op_write && meta.port_role == PORT_ROLE_FANOUT) || meta.hit) {
            slice_05.apply(hdr.value.w05, meta.slot_addr, meta.op_write);
        }
        if ((meta.op_write && meta.port_role == PORT_ROLE_FANOUT) || meta.hit) {
            slice_06.apply(hdr.value.w06, meta.slot_addr, meta.op_write);
        }
        if ((meta.op_write && meta.port_role == PORT_ROLE_FANOUT) || meta.hit) {
            slice_07.apply(hdr.value.w07, meta.slot_addr, meta.op_write);
        }
        if ((meta.op_write && meta.port_role == PORT_ROLE_FANOUT) || meta.hit) {
            slice_08.apply(hdr.value.w08, meta.slot_addr, meta.op_write);
        }
        if ((meta.op_write && meta.port_role == PORT_ROLE_FANOUT) || meta.hit) {
            slice_09.apply(hdr.value.w09, meta.slot_addr, meta.op_write);
        }
        if ((meta.op_write && meta.port_role == PORT_ROLE_FANOUT) || meta.hit) {
            slice_10.apply(hdr.value.w10, meta.slot_addr, meta.op_write);
        }
        if ((meta.op_write && meta.port_role == PORT_ROLE_FANOUT) || meta.hit) {
            slice_11.apply(hdr.value.w11, meta.slot_addr, meta.op_write);
        }
        if ((meta.op_write && meta.port_role == PORT_ROLE_FANOUT) || meta.hit) {
            slice_12.apply(hdr.value.w12, meta.slot_addr, meta.op_write);
        }
        if ((meta.op_write && meta.port_role == PORT_ROLE_FANOUT) || meta.hit) {
            slice_13.apply(hdr.value.w13, meta.slot_addr, meta.op_write);
        }
        if ((meta.op_write && meta.port_role == PORT_ROLE_FANOUT) || meta.hit) {
            slice_14.apply(hdr.value.w14, meta.slot_addr, meta.op_write);
        }
        if ((meta.op_write && meta.port_role == PORT_ROLE_FANOUT) || meta.hit) {
            slice_15.apply(hdr.value.w15, meta.slot_addr, meta.op_write);
        }
#if FRAG_WORDS > 16
        if ((meta.op_write && meta.port_role == PORT_ROLE_FANOUT) || meta.hit) {
            slice_16.apply(hdr.value.w16, meta.slot_addr, meta.op_write);
        }
        if ((meta.op_write && meta.port_role == PORT_ROLE_FANOUT) || meta.hit) {
            slice_17.apply(hdr.value.w17, meta.slot_addr, meta.op_write);
        }
        if ((meta.op_write && meta.port_role == PORT_ROLE_FANOUT) || meta.hit) {
            slice_18.apply(hdr.value.w18, meta.slot_addr, meta.op_write);
        }
        if ((meta.op_write && meta.port_role == PORT_ROLE_FANOUT) || meta.hit) {
            slice_19.apply(hdr.value.w19, meta.slot_addr, meta.op_write);
        }
        if ((meta.op_write && meta.port_role == PORT_ROLE_FANOUT) || meta.hit) {
            slice_20.apply(hdr.value.w20, meta.slot_addr, meta.op_write);
        }
        if ((meta.op_write && meta.port_role == PORT_ROLE_FANOUT) || meta.hit) {
            slice_21.apply(hdr.value.w21, meta.slot_addr, meta.op_write);
        }
        if ((meta.op_write && meta.port_role == PORT_ROLE_FANOUT) || meta.hit) {
            slice_22.apply(hdr.value.w22, meta.slot_addr, meta.op_write);
        }
        if ((meta.op_write && meta.port_role == PORT_ROLE_FANOUT) || meta.hit) {
            slice_23.apply(hdr.value.w23, meta.slot_addr, meta.op_write);
        }
#endif
#if FRAG_WORDS > 24
        if ((meta.op_write && meta.port_role == PORT_ROLE_FANOUT) || meta.hit) {
            slice_24.apply(hdr.value.w24, meta.slot_addr, meta.op_write);
        }
        if ((meta.op_write && meta.port_role == PORT_ROLE_FANOUT) || meta.hit) {
            slice_25.apply(hdr.value.w25, meta.slot_addr, meta.op_write);
        }
        if ((meta.op_write && meta.port_role == PORT_ROLE_FANOUT) || meta.hit) {
            slice_26.apply(hdr.value.w26, meta.slot_addr, meta.op_write);
        }
        if ((meta.op_write && meta.port_role == PORT_ROLE_FANOUT) || meta.hit) {
            slice_27.apply(hdr.value.w27, meta.slot_addr, meta.op_write);
        }
#endif
#if FRAG_WORDS > 28
        if ((meta.op_write && meta.port_role == PORT_ROLE_FANOUT) || meta.hit) {
            slice_28.apply(hdr.value.w28, meta.slot_addr, meta.op_write);
        }
        if ((meta.op_write && meta.port_role == PORT_ROLE_FANOUT) || meta.hit) {
            slice_29.apply(hdr.value.w29, meta.slot_addr, meta.op_write);
        }
        if ((meta.op_write && meta.port_role == PORT_ROLE_FANOUT) || meta.hit) {
            slice_30.apply(hdr.value.w30, meta.slot_addr, meta.op_write);
        }
        if ((meta.op_write && meta.port_role == PORT_ROLE_FANOUT) || meta.hit) {
            slice_31.apply(hdr.value.w31, meta.slot_addr, meta.op_write);
        }
#endif
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
        // A WRITE's fan-out copies (replica id 0) go out unchanged.
        if (eg_intr_md.egress_rid != 0 && hdr.kvp.isValid()) {
            replica.apply(hdr, meta, eg_intr_md.egress_rid);
        }
        if (eg_intr_md.egress_port == CPU_PORT_NUM) {
            hdr.packet_in.setValid();
            hdr.packet_in.ingress_port = hdr.bridged.ingress_port;
            hdr.packet_in.pad = hdr.bridged.pad;
        }
        hdr.bridged.setInvalid();
        stats.apply(meta, eg_dprsr_md);
    }
}

Pipeline(KvcastIngressParser(), KvcastIngress(), KvcastIngressDeparser(),
         KvcastEgressParser(), KvcastEgress(), KvcastEgressDeparser()) pipe;

// Metadata is zero-initialized (the parsers assign none).
@pa_auto_init_metadata
Switch(pipe) main;
