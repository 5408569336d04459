/*
 * HotMissSketch: a count-min sketch over GET misses that reports an uncached key to the control
 * plane (digest) once per window, when its estimated miss count reaches the threshold. Each cell
 * holds a 16-bit window id above a 16-bit count, so cells age by themselves (a cell last touched
 * in another window restarts at 1) and no register reset is needed, which BMv2's P4Runtime
 * server could not do anyway; 65536 windows pass before an id comes back. The control plane
 * opens a new window by writing a new window id into sketch_config: windows follow the
 * controller's clock, not the switch's, so their length is a control-plane setting and a test
 * can hold one window open as long as it needs.
 *
 * The rows use different hash functions (CRC-32, CRC-16, and CRC-32 over the fields in another
 * order): with one function and a per-row salt, CRC being affine, two keys that collide in one
 * row collide in all. A key is reported when its estimate is at or above the threshold and the
 * report row (a fourth hash) has not yet reported it for its tenant in this window, so a key
 * whose shared cells another key already pushed past the threshold is still reported, and a key
 * of another tenant on the same report cell cannot hide it (docs/security.md, the report row's
 * bound).
 */
#ifndef _KVCAST_HOT_SKETCH_P4_
#define _KVCAST_HOT_SKETCH_P4_

// One row of the sketch: bumps the key's cell and returns its count in the current window.
control SketchRow(in bit<32> index, in bit<16> window, out bit<16> count) {
    register<bit<32>>(CMS_WIDTH) cms_row;

    apply {
        bit<32> cell;
        cms_row.read(cell, index);
        if (cell[31:16] != window) {
            count = 1;
        } else if (cell[15:0] == 16w0xffff) {
            count = cell[15:0];
        } else {
            count = cell[15:0] + 1;
        }
        cms_row.write(index, window ++ count);
    }
}

control HotMissSketch(in headers_t hdr, inout local_metadata_t meta) {
    SketchRow() row0;
    SketchRow() row1;
    SketchRow() row2;
    // Per cell: a valid bit (bit 32), the tenant last reported here (bits 31-16) and the window
    // id it was reported in (bits 15-0).
    register<bit<64>>(CMS_WIDTH) reported;

    action set_sketch_config(bit<16> threshold, bit<16> window) {
        meta.hot_threshold = threshold;
        meta.sketch_window = window;
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
        bit<16> window = meta.sketch_window;
        bit<32> i0;
        bit<32> i1;
        bit<32> i2;
        bit<32> ir;
        hash(i0, HashAlgorithm.crc32, 32w0, { hdr.kvp.tenant, hdr.kvp.key },
             (bit<32>)CMS_WIDTH);
        hash(i1, HashAlgorithm.crc16, 32w0, { hdr.kvp.tenant, hdr.kvp.key },
             (bit<32>)CMS_WIDTH);
        hash(i2, HashAlgorithm.crc32, 32w0, { hdr.kvp.key[31:0], hdr.kvp.tenant,
             hdr.kvp.key[63:32] }, (bit<32>)CMS_WIDTH);
        hash(ir, HashAlgorithm.crc16, 32w0, { hdr.kvp.key[31:0], hdr.kvp.tenant,
             hdr.kvp.key[63:32] }, (bit<32>)CMS_WIDTH);
        bit<16> c0;
        bit<16> c1;
        bit<16> c2;
        row0.apply(i0, window, c0);
        row1.apply(i1, window, c1);
        row2.apply(i2, window, c2);
        bit<16> estimate = c0;
        if (c1 < estimate) {
            estimate = c1;
        }
        if (c2 < estimate) {
            estimate = c2;
        }
        if (estimate >= meta.hot_threshold) {
            bit<64> mark;
            bit<64> own = 31w0 ++ 1w1 ++ hdr.kvp.tenant ++ window;
            reported.read(mark, ir);
            if (mark != own) {
                reported.write(ir, own);
                digest<hot_miss_digest_t>(HOT_MISS_DIGEST_RECEIVER,
                    { hdr.kvp.tenant, hdr.kvp.key, estimate });
                meta.hot_reported = true;
            }
        }
    }
}

#endif  // _KVCAST_HOT_SKETCH_P4_
