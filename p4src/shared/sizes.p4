/*
 * kvcast sizes, per target. Each size names the limit that sets it. Macros (not consts) because
 * WORD_BITS shapes a header type and FRAG_WORDS a sequence of control instances at
 * preprocessing time. A fragment is FRAG_WORDS words of WORD_BITS bits on every target.
 */
#ifndef _KVCAST_SIZES_P4_
#define _KVCAST_SIZES_P4_

#ifdef __TARGET_TOFINO__
// A Tofino-1 stage has 4 stateful ALUs and each returns one 32-bit value per pass (TNA's
// RegisterAction has a single output; wider outputs are Tofino-2's RegisterAction2..4), so a
// fragment is FRAG_WORDS words of 32 bits, one stateful ALU each. What the compiler placed
// (p4src/build/tofino/summary.json, docs/tofino.md): in stages 1-11 the fragment store's slot
// fields take 3 stateful ALUs and the sketch 4, and the ingress verdict fills the logical tables
// of two stages, which leaves room for 24 words (96 B): 28 words took 13 stages.
#define WORD_BITS 32
#define FRAG_WORDS 24
#define FRAG_BYTES 96
// 32768 x 32 bit = 128 KiB per word register (8 SRAM blocks), so that a stage holds four
// (65536 slots take 16 blocks each and the compiler then places two per stage); 24 registers
// hold 32768 x 96 B = 3 MiB of fragments per pipe.
#define NUM_FRAG_SLOTS 32768
#define SLOT_ADDR_BITS 15
#define CACHE_ENTRIES 16384
// The CPU (PCIe) port: 192 on a 2-pipe Tofino-1, 320 on a 4-pipe one (pipe 2); it differs by
// part and board, so `make p4-tofino CPU_PORT=320` compiles for another one.
#ifndef CPU_PORT_NUM
#define CPU_PORT_NUM 192
#endif
#else
// BMv2 has no per-stage register budget; 32 words (256 B) keep the 32 register reads per pass
// cheap next to BMv2's per-packet overhead, and a GET with its 256 B placeholder stays far under
// a 1500 B MTU. The packet size does not change on a hit: the switch overwrites the placeholder,
// because BMv2 can grow a packet by at most 512 B per pass and Tofino by far less.
#define WORD_BITS 64
#define FRAG_WORDS 32
#define FRAG_BYTES 256
// 8192 x 256 B = 2 MiB: the order of one Tofino pipe's value SRAM, so emulation runs see the
// same scarcity the control plane's policies are built for.
#define NUM_FRAG_SLOTS 8192
#define SLOT_ADDR_BITS 13
// One cache entry per cached chunk; 4096 chunks of >= 2 fragments fill the slot array.
#define CACHE_ENTRIES 4096
// simple_switch_grpc --cpu-port 255 (the P4Runtime PacketIn/PacketOut port).
#define CPU_PORT_NUM 255
#endif

// Count-min sketch over misses: 3 rows x 4096 32-bit cells (16-bit window id, 16-bit count:
// 65536 windows of the controller's period before an id comes back, counts saturate at 65535).
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
// (port, tenant) pairs a host port may ask for, and (group, port) memberships a GET may name.
#define TENANT_BINDINGS 4096
#define GROUP_MEMBERS 16384

// Sizes that must agree with each other: a wrong combination stops the preprocessor (p4c, and
// `make constants`, which reads this file through cpp) instead of building a program whose
// fragments, slot addresses or buckets do not line up.
#if FRAG_WORDS * WORD_BITS != FRAG_BYTES * 8
#error "FRAG_BYTES must be FRAG_WORDS words of WORD_BITS bits"
#endif
#if (1 << SLOT_ADDR_BITS) != NUM_FRAG_SLOTS
#error "NUM_FRAG_SLOTS must be 2^SLOT_ADDR_BITS (slot addresses are SLOT_ADDR_BITS wide)"
#endif
#if (1 << POOL_BUCKET_BITS) != POOL_BUCKETS
#error "POOL_BUCKETS must be 2^POOL_BUCKET_BITS"
#endif
#if FRAG_WORDS != 32 && FRAG_WORDS != 28 && FRAG_WORDS != 24 && FRAG_WORDS != 16
#error "FRAG_WORDS must be 16, 24, 28 or 32 (kvp_value_t and the word slices come in fours)"
#endif
#if CACHE_ENTRIES > NUM_FRAG_SLOTS
#error "more cache entries than fragment slots: some entries could never hold a fragment"
#endif

#endif  // _KVCAST_SIZES_P4_
