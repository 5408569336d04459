/*
 * HotMissSketch (TNA): a count-min sketch over GET misses that reports an uncached key to the
 * control plane (digest) once per window, when its estimated miss count reaches the threshold.
 * Same behaviour as the v1model program; the cell layout is the stateful ALU's: a register pair
 * (count, window id) instead of one 32-bit word with the window id in its top byte, because a
 * Tofino stateful ALU compares and updates the two halves of a pair but not bit slices of one
 * word. A cell last touched in another window restarts at 1, so cells age by themselves and
 * nothing has to be reset. The control plane opens a window by writing a new window id into
 * sketch_config's default action. The rows hash with different functions (CRC-32, CRC-16, and
 * CRC-32 over the fields in another order), and a fourth register marks the window in which a
 * key hashed there was reported, so a key is reported once from the threshold on, even if
 * another key already pushed its shared cells past it.
 */
#ifndef _KVCAST_TNA_HOT_SKETCH_P4_
#define _KVCAST_TNA_HOT_SKETCH_P4_

struct sketch_cell_t {
    bit<32> count;
    bit<32> window;
}

typedef bit<12> cms_index_t;  // log2(CMS_WIDTH)

// One row of the sketch: bumps the key's cell and returns its count in the current window.
control SketchRow(in cms_index_t index, in bit<32> window, out bit<32> count) {
    Register<sketch_cell_t, cms_index_t>(CMS_WIDTH) cms_row;

    RegisterAction<sketch_cell_t, cms_index_t, bit<32>>(cms_row) bump = {
        void apply(inout sketch_cell_t cell, out bit<32> rv) {
            if (cell.window != window) {
                cell.window = window;
                cell.count = 1;
            } else {
                cell.count = cell.count |+| 1;
            }
            rv = cell.count;
        }
    };

    apply {
        count = bump.execute(index);
    }
}

control HotMissSketch(in headers_t hdr, inout local_metadata_t meta,
                      inout ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md) {
    SketchRow() row0;
    SketchRow() row1;
    SketchRow() row2;
    Hash<cms_index_t>(HashAlgorithm_t.CRC32) hash0;
    Hash<cms_index_t>(HashAlgorithm_t.CRC16) hash1;
    Hash<cms_index_t>(HashAlgorithm_t.CRC32) hash2;
    Hash<cms_index_t>(HashAlgorithm_t.CRC16) hash_r;
    // Per cell: 1 above the window id in which a key hashed here was last reported.
    Register<bit<32>, cms_index_t>(CMS_WIDTH) reported;
    bit<32> report_mark;

    RegisterAction<bit<32>, cms_index_t, bit<8>>(reported) mark_reported = {
        void apply(inout bit<32> cell, out bit<8> first) {
            if (cell != report_mark) {
                cell = report_mark;
                first = 1;
            } else {
                first = 0;
            }
        }
    };

    action set_sketch_config(bit<16> threshold, bit<16> window) {
        meta.hot_threshold = (bit<32>)threshold;
        meta.sketch_window = (bit<32>)window;
    }

    // Keyless: the control plane sets the threshold and opens windows by modifying the default
    // action.
    table sketch_config {
        actions = { set_sketch_config; }
        default_action = set_sketch_config(HOT_MISS_THRESHOLD, 0);
        size = 1;
    }

    apply {
        sketch_config.apply();
        cms_index_t i0 = hash0.get({ hdr.kvp.tenant, hdr.kvp.key });
        cms_index_t i1 = hash1.get({ hdr.kvp.tenant, hdr.kvp.key });
        cms_index_t i2 = hash2.get({ hdr.kvp.key[31:0], hdr.kvp.tenant, hdr.kvp.key[63:32] });
        cms_index_t ir = hash_r.get({ hdr.kvp.key[31:0], hdr.kvp.tenant, hdr.kvp.key[63:32] });
        report_mark = 32w0x10000 | meta.sketch_window;
        bit<32> c0;
        bit<32> c1;
        bit<32> c2;
        row0.apply(i0, meta.sketch_window, c0);
        row1.apply(i1, meta.sketch_window, c1);
        row2.apply(i2, meta.sketch_window, c2);
        // One min per stage: an action whose result feeds itself cannot span stages.
        meta.sketch_min01 = min(c0, c1);
        bit<32> estimate = min(meta.sketch_min01, c2);
        // estimate >= threshold, as a sign test; then once per window per report cell.
        bit<33> over = (bit<33>)estimate - (bit<33>)meta.hot_threshold;
        if (over[32:32] == 0) {
            if (mark_reported.execute(ir) == 1) {
                ig_dprsr_md.digest_type = HOT_MISS_DIGEST_TYPE;
                meta.hot_reported = true;
            }
        }
    }
}

#endif  // _KVCAST_TNA_HOT_SKETCH_P4_
