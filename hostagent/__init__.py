"""kvcast host agent: what runs on a GPU host beside the engine (a component).

It owns the GPU host's side of kvcast: naming a prompt's blocks as vLLM does, laying their KV out
as chunks and back into the engine's KV cache, fetching chunks (switch SRAM first, the DRAM pool
second, recompute last), putting computed chunks into the pool, reporting both to the
controller, and the two pieces that plug it into vLLM (a KV connector and a KV-event
subscriber).

Modules:
    chunkkeys: chunk keys from token ids, exactly as vLLM hashes prefix-cache block hashes.
    layout: the contiguous per-chunk KV layout and its bridges to vLLM's paged KV cache and to
        Hugging Face's per-layer key/value tensors.
    fetch: the fetch client (switch first, DRAM pool second, recompute last; group fetch as
        leader or follower of a multicast stream).
    prefix: ``PrefixFetcher``: the longest available KV prefix of a request's token ids.
    producer: the producer path: a prompt's computed chunks into the pool, reported as stored.
    integrity: end-to-end chunk integrity, a keyed MAC per chunk for tenants that hold a key.
    reports: the access records and the client that posts them to the controller.
    agent: ``python -m hostagent.agent fetch``: one fetch, one JSON line (for experiments).
    ports: ``AGENT_PORT``, importable without torch.
    vllm_connector: ``KvcastConnector``, a vLLM 0.32 KV connector (loads prefix KV through the
        fetch client, publishes computed blocks through the producer path); a package split by
        vLLM's roles (scheduler side, worker side, metadata, metrics, settings).
    vllm_events: vLLM's KV cache events (ZMQ) into the controller's access records.

Imports: the shared layer ``kvcast`` only, besides torch, numpy, vLLM and the other libraries
it plugs into; never another component (``refswitch``, ``poolnode``, ``controlplane``) nor a
layer above (``emulation``, ``experiments``, ``benchmarks``). Still to move (the arrows that
remain): ``fetch``, ``agent``, ``producer`` and ``vllm_connector`` import the pool backend
interface and the KVP framing numbers from ``poolnode``, and ``vllm_connector`` opens its
default pool client (``pool_backend: "mooncake"``) from ``poolnode.mooncake``.
"""
