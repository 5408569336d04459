/*
 * FragmentStore: switch SRAM for cached chunk fragments. A fragment is FRAG_WORDS words,
 * each word in its own register array (one ValueSlice), so a WRITE stores and a GET reads a whole
 * fragment in one pass. With every fragment slot the store keeps the epoch of the load that wrote
 * it, the fragment's CRC (computed by the control plane, checked by the host) and its length.
 */
#ifndef _KVCAST_FRAGMENT_STORE_P4_
#define _KVCAST_FRAGMENT_STORE_P4_

// One word of every fragment slot.
control ValueSlice(inout bit<WORD_BITS> word, in slot_index_t slot, in bool write) {
    register<bit<WORD_BITS>>(NUM_FRAG_SLOTS) frag_word;

    apply {
        if (write) {
            frag_word.write(slot, word);
        } else {
            frag_word.read(word, slot);
        }
    }
}

// Reads (GET hit) or writes (WRITE from the CPU port) fragment slot meta.slot, which the caller
// has bounds-checked against NUM_FRAG_SLOTS.
control FragmentStore(inout headers_t hdr, inout local_metadata_t meta) {
    register<epoch_t>(NUM_FRAG_SLOTS) frag_epoch;
    register<bit<32>>(NUM_FRAG_SLOTS) frag_crc;
    register<bit<16>>(NUM_FRAG_SLOTS) frag_len;

    ValueSlice() slice_00;
    ValueSlice() slice_01;
    ValueSlice() slice_02;
    ValueSlice() slice_03;
    ValueSlice() slice_04;
    ValueSlice() slice_05;
    ValueSlice() slice_06;
    ValueSlice() slice_07;
    ValueSlice() slice_08;
    ValueSlice() slice_09;
    ValueSlice() slice_10;
    ValueSlice() slice_11;
    ValueSlice() slice_12;
    ValueSlice() slice_13;
    ValueSlice() slice_14;
    ValueSlice() slice_15;
    ValueSlice() slice_16;
    ValueSlice() slice_17;
    ValueSlice() slice_18;
    ValueSlice() slice_19;
    ValueSlice() slice_20;
    ValueSlice() slice_21;
    ValueSlice() slice_22;
    ValueSlice() slice_23;
    ValueSlice() slice_24;
    ValueSlice() slice_25;
    ValueSlice() slice_26;
    ValueSlice() slice_27;
    ValueSlice() slice_28;
    ValueSlice() slice_29;
    ValueSlice() slice_30;
    ValueSlice() slice_31;

    apply {
        bool write = hdr.kvp.op == KVP_OP_WRITE;
        if (write) {
            frag_epoch.write(meta.slot, hdr.kvp.epoch);
            frag_crc.write(meta.slot, hdr.kvp.crc);
            frag_len.write(meta.slot, hdr.kvp.payload_len);
        } else {
            frag_epoch.read(meta.frag_epoch, meta.slot);
            frag_crc.read(hdr.kvp.crc, meta.slot);
            frag_len.read(hdr.kvp.payload_len, meta.slot);
        }
        slice_00.apply(hdr.value.w00, meta.slot, write);
        slice_01.apply(hdr.value.w01, meta.slot, write);
        slice_02.apply(hdr.value.w02, meta.slot, write);
        slice_03.apply(hdr.value.w03, meta.slot, write);
        slice_04.apply(hdr.value.w04, meta.slot, write);
        slice_05.apply(hdr.value.w05, meta.slot, write);
        slice_06.apply(hdr.value.w06, meta.slot, write);
        slice_07.apply(hdr.value.w07, meta.slot, write);
        slice_08.apply(hdr.value.w08, meta.slot, write);
        slice_09.apply(hdr.value.w09, meta.slot, write);
        slice_10.apply(hdr.value.w10, meta.slot, write);
        slice_11.apply(hdr.value.w11, meta.slot, write);
        slice_12.apply(hdr.value.w12, meta.slot, write);
        slice_13.apply(hdr.value.w13, meta.slot, write);
        slice_14.apply(hdr.value.w14, meta.slot, write);
        slice_15.apply(hdr.value.w15, meta.slot, write);
        slice_16.apply(hdr.value.w16, meta.slot, write);
        slice_17.apply(hdr.value.w17, meta.slot, write);
        slice_18.apply(hdr.value.w18, meta.slot, write);
        slice_19.apply(hdr.value.w19, meta.slot, write);
        slice_20.apply(hdr.value.w20, meta.slot, write);
        slice_21.apply(hdr.value.w21, meta.slot, write);
        slice_22.apply(hdr.value.w22, meta.slot, write);
        slice_23.apply(hdr.value.w23, meta.slot, write);
        slice_24.apply(hdr.value.w24, meta.slot, write);
        slice_25.apply(hdr.value.w25, meta.slot, write);
        slice_26.apply(hdr.value.w26, meta.slot, write);
        slice_27.apply(hdr.value.w27, meta.slot, write);
        slice_28.apply(hdr.value.w28, meta.slot, write);
        slice_29.apply(hdr.value.w29, meta.slot, write);
        slice_30.apply(hdr.value.w30, meta.slot, write);
        slice_31.apply(hdr.value.w31, meta.slot, write);
    }
}

#endif  // _KVCAST_FRAGMENT_STORE_P4_
