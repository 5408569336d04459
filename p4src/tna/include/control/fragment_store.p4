/*
 * FragmentStore: switch SRAM for cached chunk fragments (TNA). A fragment is FRAG_WORDS words of
 * WORD_BITS = 32 bits, each word in its own register (one ValueSlice, one stateful ALU), so a
 * WRITE stores and a GET reads a whole fragment in one pass. With every fragment slot the store
 * keeps the epoch of the load that wrote it, the fragment's CRC (computed by the control plane,
 * checked by the host) and its length.
 *
 * Registers are per pipe. A WRITE from the control plane is multicast to one loopback port per
 * pipe (WRITE_FANOUT_GROUP) and stored by each pipe's ingress when it comes back in, so every
 * pipe holds the same fragments and a GET is served by the pipe of the host that sends it. The
 * store is in ingress, not egress as in NetCache: Tofino-1's egress parser reaches 160 bytes
 * into a packet, too short for a fragment behind the headers.
 */
#ifndef _KVCAST_TNA_FRAGMENT_STORE_P4_
#define _KVCAST_TNA_FRAGMENT_STORE_P4_

// One word of every fragment slot: read into the GET's placeholder word, or written from the
// WRITE's payload word. One RegisterAction does both (the stateful ALU tests the flag), so that
// each word is one table. Either way the word comes back as the slot now holds it, so a
// WRITE_ACK carries the fragment as stored.
//
// A control per word (generated below), each with an explicit table of low placement priority:
// Tofino-1 has 4 stateful ALUs per stage, and the words take what the slot fields (3, stage 1)
// and the sketch (4) leave in stages 1-11 once the ingress verdict, which needs all 16 logical
// tables of two stages, has been placed. KvcastIngress applies each word in a block of its own.
#define VALUE_SLICE(NN)                                                                         \
control ValueSlice_##NN(inout bit<WORD_BITS> word, in slot_addr_t slot, in bool write) {        \
    Register<bit<WORD_BITS>, slot_addr_t>(NUM_FRAG_SLOTS, 0) frag_word;                          \
    RegisterAction<bit<WORD_BITS>, slot_addr_t, bit<WORD_BITS>>(frag_word) access_word = {       \
        void apply(inout bit<WORD_BITS> value, out bit<WORD_BITS> rv) {                         \
            if (write) {                                                                        \
                value = word;                                                                   \
            }                                                                                   \
            rv = value;                                                                         \
        }                                                                                       \
    };                                                                                          \
    action access() {                                                                           \
        word = access_word.execute(slot);                                                       \
    }                                                                                           \
    @hidden @placement_priority(-1) table access_table {                                        \
        actions = { access; }                                                                   \
        const default_action = access();                                                        \
        size = 1;                                                                               \
    }                                                                                           \
    apply {                                                                                     \
        access_table.apply();                                                                   \
    }                                                                                           \
}

VALUE_SLICE(00)
VALUE_SLICE(01)
VALUE_SLICE(02)
VALUE_SLICE(03)
VALUE_SLICE(04)
VALUE_SLICE(05)
VALUE_SLICE(06)
VALUE_SLICE(07)
VALUE_SLICE(08)
VALUE_SLICE(09)
VALUE_SLICE(10)
VALUE_SLICE(11)
VALUE_SLICE(12)
VALUE_SLICE(13)
VALUE_SLICE(14)
VALUE_SLICE(15)
#if FRAG_WORDS > 16
VALUE_SLICE(16)
VALUE_SLICE(17)
VALUE_SLICE(18)
VALUE_SLICE(19)
VALUE_SLICE(20)
VALUE_SLICE(21)
VALUE_SLICE(22)
VALUE_SLICE(23)
#endif
#if FRAG_WORDS > 24
VALUE_SLICE(24)
VALUE_SLICE(25)
VALUE_SLICE(26)
VALUE_SLICE(27)
#endif
#if FRAG_WORDS > 28
VALUE_SLICE(28)
VALUE_SLICE(29)
VALUE_SLICE(30)
VALUE_SLICE(31)
#endif

// The slot's epoch, CRC and length: read (GET hit) or written (a WRITE's copy in this pipe);
// the read also tells whether the slot holds the load the cache entry's epoch names
// (meta.stale). The words are ValueSlice instances that KvcastIngress applies after its
// verdict, under the same condition, named fragments.slice_NN as on BMv2: nothing in the verdict
// reads them, so the compiler may spread them over any stage from the first.
control FragmentStore(inout headers_t hdr, inout local_metadata_t meta,
                      in slot_addr_t slot, in bool write) {
    Register<epoch_t, slot_addr_t>(NUM_FRAG_SLOTS, 0) frag_epoch;
    Register<bit<32>, slot_addr_t>(NUM_FRAG_SLOTS, 0) frag_crc;
    Register<bit<16>, slot_addr_t>(NUM_FRAG_SLOTS, 0) frag_len;

    // Read or written by one RegisterAction each, as the words. The epoch is compared in the
    // stateful ALU with meta.epoch, the cache entry's on a GET and the WRITE's own on a WRITE
    // (the parser sets it): 1 when the slot holds another load. The CRC and length go to
    // metadata, from where the reply takes them (validation still reads the GET's length).
    RegisterAction<epoch_t, slot_addr_t, bit<8>>(frag_epoch) access_epoch = {
        void apply(inout epoch_t value, out bit<8> rv) {
            if (value != meta.epoch) {
                rv = 1;
            } else {
                rv = 0;
            }
            if (write) {
                value = meta.epoch;
            }
        }
    };
    RegisterAction<bit<32>, slot_addr_t, bit<32>>(frag_crc) access_crc = {
        void apply(inout bit<32> value, out bit<32> rv) {
            rv = value;
            if (write) {
                value = hdr.kvp.crc;
            }
        }
    };
    RegisterAction<bit<16>, slot_addr_t, bit<16>>(frag_len) access_len = {
        void apply(inout bit<16> value, out bit<16> rv) {
            rv = value;
            if (write) {
                value = hdr.kvp.payload_len;
            }
        }
    };

    apply {
        meta.stale = access_epoch.execute(slot);
        meta.stored_crc = access_crc.execute(slot);
        meta.stored_len = access_len.execute(slot);
    }
}

#endif  // _KVCAST_TNA_FRAGMENT_STORE_P4_
