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
 * key hashed there was reported and its tenant, so a key is reported once from the threshold on,
 * even if another key already pushed its shared cells past it, and another tenant's key on the
 * cell cannot hide it.
 */
#ifndef _KVCAST_TNA_HOT_SKETCH_P4_
#define _KVCAST_TNA_HOT_SKETCH_P4_

// 16-bit halves: a row's count comes out of the stateful ALU next to its 12-bit hash index, and
// the two share a 32-bit immediate path.
struct sketch_cell_t {
    bit<16> count;
    bit<16> window;
}

typedef bit<12> cms_index_t;  // log2(CMS_WIDTH)

// One row of the sketch: bumps the key's cell and returns its count in the current window.
control SketchRow(in cms_index_t index, in bit<16> window, out bit<16> count) {
    Register<sketch_cell_t, cms_index_t>(CMS_WIDTH) cms_row;

    RegisterAction<sketch_cell_t, cms_index_t, bit<16>>(cms_row) bump = {
        void apply(inout sketch_cell_t cell, out bit<16> rv) {
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

// The sketch's configuration, read for every packet in the first stage. A control of its own
// so that it is placed there: the rows wait for the verdict. KvcastIngress names its instance
// hot_sketch, so the table is hot_sketch.sketch_config on both targets.
control SketchConfig(inout local_metadata_t meta) {
    action set_sketch_config(bit<16> threshold, bit<16> window) {
        meta.sketch_threshold = threshold;
        meta.sketch_window = window;
        meta.report_mark = 32w0x10000 | (bit<32>)window;
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
    }
}

// The rows count a GET when the caller has set meta.count_miss (a GET that missed and that no
// check refused), after SketchConfig has read the threshold and window.
// A report-row cell: the window mark (low) and the tenant reported (high).
struct report_cell_t {
    bit<32> lo;
    bit<32> hi;
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
    // Per cell, a pair: the low word 1 above the window id in which a key hashed here was last
    // reported, the high word the tenant it was reported for, so that another tenant's key on
    // the cell cannot mark it for a victim (docs/security.md, the report row's bound).
    Register<report_cell_t, cms_index_t>(CMS_WIDTH) reported;

    RegisterAction<report_cell_t, cms_index_t, bit<8>>(reported) mark_reported = {
        void apply(inout report_cell_t cell, out bit<8> first) {
            if (cell.lo != meta.report_mark || cell.hi != meta.report_tenant) {
                cell.lo = meta.report_mark;
                cell.hi = meta.report_tenant;
                first = 1;
            } else {
                first = 0;
            }
        }
    };

    // estimate >= threshold is min(c0, c1) >= threshold and c2 >= threshold: saturating
    // differences from the threshold, zero when a count reaches it; two in one stage, the
    // third in the next, and the condition tests fields rather than arithmetic.
    action short_of_threshold() {
        meta.report_tenant = (bit<32>)hdr.kvp.tenant;
        meta.sketch_min01 = min(meta.sketch_c0, meta.sketch_c1);
        meta.sketch_short2 = meta.sketch_threshold |-| meta.sketch_c2;
    }

    // And the estimate the digest carries, min(row 0, row 1, row 2): at or above the threshold
    // when reported, above it where other keys pushed the shared cells past it first.
    action short_of_threshold01() {
        meta.sketch_short01 = meta.sketch_threshold |-| meta.sketch_min01;
        meta.sketch_estimate = min(meta.sketch_min01, meta.sketch_c2);
    }

    action report() {
        ig_dprsr_md.digest_type = HOT_MISS_DIGEST_TYPE;
        meta.hot_reported = true;
    }

    // Flat statements rather than one block under meta.count_miss: Tofino-1 places a block as a
    // unit, and one spanning the sketch's five stages would make the fragment words below wait
    // for it, or it for them. Each statement is one or two stages.
    apply {
        if (meta.count_miss) {
            // Each row addresses its register with its hash directly (a hash output feeds a
            // stateful ALU's address without a PHV field; four 12-bit indices in PHV at once
            // would exceed the 32-bit immediate path of one action).
            row0.apply(hash0.get({ hdr.kvp.tenant, hdr.kvp.key }), meta.sketch_window,
                       meta.sketch_c0);
            row1.apply(hash1.get({ hdr.kvp.tenant, hdr.kvp.key }), meta.sketch_window,
                       meta.sketch_c1);
            row2.apply(hash2.get({ hdr.kvp.key[31:0], hdr.kvp.tenant, hdr.kvp.key[63:32] }),
                       meta.sketch_window, meta.sketch_c2);
        }
        short_of_threshold();
        short_of_threshold01();
        if (meta.count_miss && meta.sketch_short01 == 0 && meta.sketch_short2 == 0) {
            if (mark_reported.execute(
                    hash_r.get({ hdr.kvp.key[31:0], hdr.kvp.tenant, hdr.kvp.key[63:32] })) == 1) {
                report();
            }
        }
    }
}

#endif  // _KVCAST_TNA_HOT_SKETCH_P4_
