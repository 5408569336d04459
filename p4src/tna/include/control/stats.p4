/*
 * Stats: the one place where drops are counted (by reason) and KVP events are counted. The drop
 * counter's index is 5 bits wide: DROP_REASON_COUNT is 18 (4 bits would count reasons 16 and 17,
 * ARP_SPOOFED and IPV4_FRAGMENT, under 0 and 1).
 */
#ifndef _KVCAST_TNA_STATS_P4_
#define _KVCAST_TNA_STATS_P4_

control Stats(in local_metadata_t meta,
              inout ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md) {
    // Packets only, as on BMv2: Tofino counts bytes after parsing, BMv2 as received.
    Counter<bit<32>, bit<5>>(DROP_REASON_COUNT, CounterType_t.PACKETS) drop_counter;
    Counter<bit<32>, bit<3>>(EV_COUNT, CounterType_t.PACKETS) kvp_event_counter;
    // A Tofino counter is executed at most once per pass, so a GET miss that also reports a hot
    // key cannot count EV_HOT_DIGEST in kvp_event_counter as BMv2 does; it counts here.
    Counter<bit<32>, bit<1>>(1, CounterType_t.PACKETS) hot_digest_counter;

    apply {
        if (meta.drop) {
            drop_counter.count((bit<5>)meta.drop_reason);
            ig_dprsr_md.drop_ctl = 1;
        } else {
            if (meta.count_event) {
                kvp_event_counter.count((bit<3>)meta.event);
            }
            if (meta.hot_reported) {
                hot_digest_counter.count(0);
            }
        }
    }
}

// Egress drops: a multicast replica with no destination, a stale slot, a fragment cut short.
control EgressStats(in egress_metadata_t meta,
                    inout egress_intrinsic_metadata_for_deparser_t eg_dprsr_md) {
    Counter<bit<32>, bit<5>>(DROP_REASON_COUNT, CounterType_t.PACKETS) drop_counter;

    apply {
        if (meta.drop) {
            drop_counter.count((bit<5>)meta.drop_reason);
            eg_dprsr_md.drop_ctl = 1;
        }
    }
}

#endif  // _KVCAST_TNA_STATS_P4_
