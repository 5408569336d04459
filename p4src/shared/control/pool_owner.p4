/*
 * PoolOwner: a GET that misses the cache goes to the pool node that owns the key. The same on
 * both architectures: it touches headers only.
 */
#ifndef _KVCAST_SHARED_POOL_OWNER_P4_
#define _KVCAST_SHARED_POOL_OWNER_P4_

control PoolOwner(inout headers_t hdr) {
    // The pool node's address replaces the service address; L3 forwarding then routes it.
    action set_pool(ipv4_addr_t pool_ip) {
        hdr.ipv4.dst_addr = pool_ip;
        hdr.udp.checksum = 0;
    }

    // Chunk keys are hash outputs, so their low bits spread keys evenly over the buckets; the
    // control plane maps buckets to pool nodes by consistent hashing.
    table pool_owner {
        key = { hdr.kvp.key[POOL_BUCKET_BITS - 1:0]: exact @name("bucket"); }
        actions = {
            set_pool;
            @defaultonly NoAction;
        }
        const default_action = NoAction();
        size = POOL_BUCKETS;
    }

    apply {
        pool_owner.apply();
    }
}

#endif  // _KVCAST_SHARED_POOL_OWNER_P4_
