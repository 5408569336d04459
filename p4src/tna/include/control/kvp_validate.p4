/*
 * KvpValidate: the lengths the structural checks of a KVP packet compare (KvcastIngress makes the
 * checks; anything off is a MALFORMED drop).
 */
#ifndef _KVCAST_TNA_KVP_VALIDATE_P4_
#define _KVCAST_TNA_KVP_VALIDATE_P4_

control KvpValidate(in headers_t hdr, inout local_metadata_t meta) {
    // Field-to-field comparisons become saturating differences and XORs in metadata (of the
    // operands' own width: an ALU works within one container size), tested against constants in
    // separate conditions: the form Tofino's gateways evaluate (a gateway reads
    // at most 4 bytes and 12 bits of PHV). Two actions, as the second uses what the first wrote.
    action lengths() {
        meta.kvp_bytes = hdr.udp.length - (UDP_HDR_BYTES + KVP_HDR_BYTES);
        meta.ip_payload = hdr.ipv4.total_len - IPV4_HDR_BYTES;
        // payload_len - (FRAG_BYTES + 1): its top bit is clear when payload_len > FRAG_BYTES (for
        // lengths below 2^15; the caller tests the length's own top bit for the rest). A
        // saturating difference from a constant would need the constant in a PHV container,
        // written in a stage of its own.
        meta.frag_over = hdr.kvp.payload_len - (FRAG_BYTES + 1);
    }

    action compare_lengths() {
        meta.len_mismatch = hdr.udp.length ^ meta.ip_payload;
        meta.overrun = hdr.kvp.payload_len |-| meta.kvp_bytes;
    }

    // The lengths only: the checks on them open the ingress verdict chain (KvcastIngress),
    // where they cost no stage of their own.
    apply {
        lengths();
        compare_lengths();
    }
}

#endif  // _KVCAST_TNA_KVP_VALIDATE_P4_
