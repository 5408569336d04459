/* KvpValidate: structural checks of a parsed KVP packet; anything off is a MALFORMED drop. */
#ifndef _KVCAST_TNA_KVP_VALIDATE_P4_
#define _KVCAST_TNA_KVP_VALIDATE_P4_

control KvpValidate(in headers_t hdr, inout local_metadata_t meta) {
    action malformed() {
        meta.drop = true;
        meta.drop_reason = DROP_MALFORMED;
    }

    apply {
        // Field-to-field comparisons as differences tested against constants, the form Tofino's
        // gateways evaluate.
        bit<16> kvp_bytes = hdr.udp.length - (UDP_HDR_BYTES + KVP_HDR_BYTES);
        bit<16> len_mismatch = hdr.udp.length ^ (hdr.ipv4.total_len - IPV4_HDR_BYTES);
        bit<17> room = (bit<17>)kvp_bytes - (bit<17>)hdr.kvp.payload_len;
        if (hdr.kvp.version != KVP_VERSION) {
            malformed();
        } else if (hdr.kvp.op < KVP_OP_GET || hdr.kvp.op > KVP_OP_NACK) {
            malformed();
        } else if (len_mismatch != 0) {
            malformed();
        } else if (hdr.udp.length < UDP_HDR_BYTES + KVP_HDR_BYTES) {
            malformed();
        } else if (hdr.kvp.op == KVP_OP_GET || hdr.kvp.op == KVP_OP_WRITE) {
            // Exactly one fragment follows: the placeholder or the data to store.
            if (kvp_bytes != FRAG_BYTES || !hdr.value.isValid()) {
                malformed();
            } else if (hdr.kvp.op == KVP_OP_WRITE && hdr.kvp.payload_len > FRAG_BYTES) {
                malformed();
            }
        } else if (room[16:16] == 1) {  // payload_len > kvp_bytes
            malformed();
        }
    }
}

#endif  // _KVCAST_TNA_KVP_VALIDATE_P4_
