/* Stats: the one place where drops are counted (by reason) and KVP events are counted. */
#ifndef _KVCAST_STATS_P4_
#define _KVCAST_STATS_P4_

control Stats(inout local_metadata_t meta, inout standard_metadata_t std) {
    // Packets only: byte counts differ between targets (BMv2 counts the packet as received,
    // Tofino after parsing), and every KVP fragment has a known size anyway.
    counter(DROP_REASON_COUNT, CounterType.packets) drop_counter;
    counter(EV_COUNT, CounterType.packets) kvp_event_counter;

    apply {
        if (meta.drop) {
            drop_counter.count(meta.drop_reason);
            mark_to_drop(std);
        } else {
            if (meta.count_event) {
                kvp_event_counter.count(meta.event);
            }
            if (meta.hot_reported) {
                kvp_event_counter.count(EV_HOT_DIGEST);
            }
        }
    }
}

#endif  // _KVCAST_STATS_P4_
