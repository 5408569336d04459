"""kvcast host agent: chunk keys, KV layout and the fetch client of a GPU host.

Modules:
    chunkkeys: chunk keys from token ids, exactly as vLLM hashes prefix-cache blocks.
    layout: the contiguous per-chunk KV layout and its bridge to vLLM's paged KV cache.
    fetch: the fetch client (switch first, DRAM pool second, recompute last).
    bench: loopback throughput of the fetch client against the pool-node server.
"""
