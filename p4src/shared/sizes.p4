/*
 * kvcast sizes, per target. Each size names the limit that sets it. Macros (not consts) because
 * FRAG_WORDS shapes a header type and a sequence of control instances at preprocessing time.
 */
#ifndef _KVCAST_SIZES_P4_
#define _KVCAST_SIZES_P4_

#ifdef __TARGET_TOFINO__
// A Tofino-1 stage has 4 stateful ALUs, each updating one 64-bit register pair per pass, so one
// pass over 4 of the 12 stages returns 16 x 8 B = 128 B: the value size NetCache and FarReach
// reach in practice once lookup and metadata stages are paid for.
#define FRAG_WORDS 16
#define FRAG_BYTES 128
// 32768 x 128 B = 4 MiB of fragments per pipe: 16384 64-bit cells per register is the largest
// power of two that fits one stage's SRAM with the slice's match table, two stages per slice.
#define NUM_FRAG_SLOTS 32768
#define CACHE_ENTRIES 16384
#define CPU_PORT_NUM 192
#else
// BMv2 has no per-stage register budget; 32 words (256 B) keep the 32 register reads per pass
// cheap next to BMv2's per-packet overhead, and a GET with its 256 B placeholder stays far under
// a 1500 B MTU. The packet size does not change on a hit: the switch overwrites the placeholder,
// because BMv2 can grow a packet by at most 512 B per pass and Tofino by far less.
#define FRAG_WORDS 32
#define FRAG_BYTES 256
// 8192 x 256 B = 2 MiB: the order of one Tofino pipe's value SRAM, so emulation runs see the
// same scarcity the control plane's policies are built for.
#define NUM_FRAG_SLOTS 8192
// One cache entry per cached chunk; 4096 chunks of >= 2 fragments fill the slot array.
#define CACHE_ENTRIES 4096
// simple_switch_grpc --cpu-port 255 (the P4Runtime PacketIn/PacketOut port).
#define CPU_PORT_NUM 255
#endif

// Count-min sketch over misses: 3 rows x 4096 32-bit cells (8-bit window id, 24-bit count).
// 3 rows keep the over-count of a 4096-wide row small for the few hundred keys that miss in one
// window; 4096 x 32 bit is one Tofino register per row in one stage.
#define CMS_ROWS 3
#define CMS_WIDTH 4096
// Misses of one key in one window before it is reported once (default of sketch_config).
#define HOT_MISS_THRESHOLD 8
// Keys are spread over pool nodes by their low 8 bits: 256 buckets give consistent hashing
// enough granularity to move 1/N of the keys when a pool node joins or leaves.
#define POOL_BUCKETS 256
#define POOL_BUCKET_BITS 8
// One replica destination per (host) replica id; the PRE's 64K groups are not the limit here.
#define REPLICA_ENTRIES 1024
#define IPV4_ROUTES 1024
#define L2_ENTRIES 1024
#define PORT_ENTRIES 512

#endif  // _KVCAST_SIZES_P4_
