/* CacheLookup: (tenant, chunk key) -> where the chunk's fragments live in switch SRAM. */
#ifndef _KVCAST_TNA_CACHE_P4_
#define _KVCAST_TNA_CACHE_P4_

control CacheLookup(in headers_t hdr, inout local_metadata_t meta) {
    // Per-entry hits: the control plane's reuse signal for chunks already in SRAM.
    DirectCounter<bit<32>>(CounterType_t.PACKETS) cache_counter;

    // frag_count bounds the GET's fragment index; epoch must equal the epoch stored with
    // every fragment of the slot, so a half-reloaded slot is never served under this key. The
    // action itself computes the slot the GET reads, so the fragment store can follow in the
    // next stage; slot_base keeps its 32-bit P4Runtime width (the v1model program's), and as
    // the control plane keeps slot_base + frag_count within NUM_FRAG_SLOTS, its low
    // SLOT_ADDR_BITS address the slot (frag_idx < frag_count is checked by the caller).
    action cache_hit(slot_index_t slot_base, bit<16> frag_count, epoch_t epoch) {
        cache_counter.count();
        meta.hit = true;
        meta.slot_addr = slot_base[SLOT_ADDR_BITS - 1:0] + hdr.kvp.frag_idx[SLOT_ADDR_BITS - 1:0];
        meta.frag_count = frag_count;
        meta.epoch = epoch;
    }

    action cache_miss() {
        cache_counter.count();
        meta.hit = false;
    }

    table cache_table {
        key = {
            hdr.kvp.tenant: exact @name("tenant");
            hdr.kvp.key: exact @name("key");
        }
        actions = {
            cache_hit;
            @defaultonly cache_miss;
        }
        const default_action = cache_miss();
        counters = cache_counter;
        size = CACHE_ENTRIES;
    }

    apply {
        cache_table.apply();
    }
}

#endif  // _KVCAST_TNA_CACHE_P4_
