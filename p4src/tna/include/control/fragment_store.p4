/*
 * FragmentStore: switch SRAM for cached chunk fragments (TNA). A fragment is FRAG_WORDS words of
 * WORD_BITS = 32 bits, each word in its own register (one ValueSlice, one stateful ALU), so a
 * WRITE stores and a GET reads a whole fragment in one pass: 32 stateful ALUs, 4 per stage, in
 * 8 stages. With every fragment slot the store keeps the epoch of the load that wrote it, the
 * fragment's CRC (computed by the control plane, checked by the host) and its length.
 */
#ifndef _KVCAST_TNA_FRAGMENT_STORE_P4_
#define _KVCAST_TNA_FRAGMENT_STORE_P4_

// One word of every fragment slot: read into the GET's placeholder word, or written from the
// WRITE's payload word.
control ValueSlice(inout bit<WORD_BITS> word, in slot_addr_t slot, in bool write) {
    Register<bit<WORD_BITS>, slot_addr_t>(NUM_FRAG_SLOTS, 0) frag_word;

    RegisterAction<bit<WORD_BITS>, slot_addr_t, bit<WORD_BITS>>(frag_word) read_word = {
        void apply(inout bit<WORD_BITS> value, out bit<WORD_BITS> rv) {
            rv = value;
        }
    };

    RegisterAction<bit<WORD_BITS>, slot_addr_t, bit<WORD_BITS>>(frag_word) write_word = {
        void apply(inout bit<WORD_BITS> value) {
            value = word;
        }
    };

    apply {
        if (write) {
            write_word.execute(slot);
        } else {
            word = read_word.execute(slot);
        }
    }
}

// Reads (GET hit) or writes (WRITE from the CPU port) fragment slot meta.slot_addr, which the
// caller has bounds-checked against NUM_FRAG_SLOTS.
control FragmentStore(inout headers_t hdr, inout local_metadata_t meta) {
    Register<epoch_t, slot_addr_t>(NUM_FRAG_SLOTS, 0) frag_epoch;
    Register<bit<32>, slot_addr_t>(NUM_FRAG_SLOTS, 0) frag_crc;
    Register<bit<16>, slot_addr_t>(NUM_FRAG_SLOTS, 0) frag_len;

    RegisterAction<epoch_t, slot_addr_t, epoch_t>(frag_epoch) read_epoch = {
        void apply(inout epoch_t value, out epoch_t rv) {
            rv = value;
        }
    };
    RegisterAction<epoch_t, slot_addr_t, epoch_t>(frag_epoch) write_epoch = {
        void apply(inout epoch_t value) {
            value = hdr.kvp.epoch;
        }
    };
    RegisterAction<bit<32>, slot_addr_t, bit<32>>(frag_crc) read_crc = {
        void apply(inout bit<32> value, out bit<32> rv) {
            rv = value;
        }
    };
    RegisterAction<bit<32>, slot_addr_t, bit<32>>(frag_crc) write_crc = {
        void apply(inout bit<32> value) {
            value = hdr.kvp.crc;
        }
    };
    RegisterAction<bit<16>, slot_addr_t, bit<16>>(frag_len) read_len = {
        void apply(inout bit<16> value, out bit<16> rv) {
            rv = value;
        }
    };
    RegisterAction<bit<16>, slot_addr_t, bit<16>>(frag_len) write_len = {
        void apply(inout bit<16> value) {
            value = hdr.kvp.payload_len;
        }
    };

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
            write_epoch.execute(meta.slot_addr);
            write_crc.execute(meta.slot_addr);
            write_len.execute(meta.slot_addr);
        } else {
            meta.frag_epoch = read_epoch.execute(meta.slot_addr);
            hdr.kvp.crc = read_crc.execute(meta.slot_addr);
            hdr.kvp.payload_len = read_len.execute(meta.slot_addr);
        }
        slice_00.apply(hdr.value.w00, meta.slot_addr, write);
        slice_01.apply(hdr.value.w01, meta.slot_addr, write);
        slice_02.apply(hdr.value.w02, meta.slot_addr, write);
        slice_03.apply(hdr.value.w03, meta.slot_addr, write);
        slice_04.apply(hdr.value.w04, meta.slot_addr, write);
        slice_05.apply(hdr.value.w05, meta.slot_addr, write);
        slice_06.apply(hdr.value.w06, meta.slot_addr, write);
        slice_07.apply(hdr.value.w07, meta.slot_addr, write);
        slice_08.apply(hdr.value.w08, meta.slot_addr, write);
        slice_09.apply(hdr.value.w09, meta.slot_addr, write);
        slice_10.apply(hdr.value.w10, meta.slot_addr, write);
        slice_11.apply(hdr.value.w11, meta.slot_addr, write);
        slice_12.apply(hdr.value.w12, meta.slot_addr, write);
        slice_13.apply(hdr.value.w13, meta.slot_addr, write);
        slice_14.apply(hdr.value.w14, meta.slot_addr, write);
        slice_15.apply(hdr.value.w15, meta.slot_addr, write);
        slice_16.apply(hdr.value.w16, meta.slot_addr, write);
        slice_17.apply(hdr.value.w17, meta.slot_addr, write);
        slice_18.apply(hdr.value.w18, meta.slot_addr, write);
        slice_19.apply(hdr.value.w19, meta.slot_addr, write);
        slice_20.apply(hdr.value.w20, meta.slot_addr, write);
        slice_21.apply(hdr.value.w21, meta.slot_addr, write);
        slice_22.apply(hdr.value.w22, meta.slot_addr, write);
        slice_23.apply(hdr.value.w23, meta.slot_addr, write);
        slice_24.apply(hdr.value.w24, meta.slot_addr, write);
        slice_25.apply(hdr.value.w25, meta.slot_addr, write);
        slice_26.apply(hdr.value.w26, meta.slot_addr, write);
        slice_27.apply(hdr.value.w27, meta.slot_addr, write);
        slice_28.apply(hdr.value.w28, meta.slot_addr, write);
        slice_29.apply(hdr.value.w29, meta.slot_addr, write);
        slice_30.apply(hdr.value.w30, meta.slot_addr, write);
        slice_31.apply(hdr.value.w31, meta.slot_addr, write);
    }
}

#endif  // _KVCAST_TNA_FRAGMENT_STORE_P4_
