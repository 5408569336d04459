"""kvcast host agent: what runs on a GPU host beside the engine (a component).

It owns the GPU host's side of kvcast: naming a prompt's blocks as vLLM does, laying their KV out
as chunks and back into the engine's KV cache, fetching chunks into tensors (the fetch engine,
``kvcast.fetch``, does the protocol), putting computed chunks into the pool and reporting them,
and the two pieces that plug it into vLLM (a KV connector and a KV-event subscriber).

Modules:
    chunkkeys: chunk keys from token ids, exactly as vLLM hashes prefix-cache block hashes.
    layout: the contiguous per-chunk KV layout and its bridges to vLLM's paged KV cache and to
        Hugging Face's per-layer key/value tensors.
    fetch: the fetch engine on tensors (``FetchClient`` checks a destination tensor and adds
        ``fetch_block``), and the engine's records under the host agent's name.
    prefix: ``PrefixFetcher``: the longest available KV prefix of a request's token ids.
    producer: the producer path: a prompt's computed chunks into the pool, reported as stored.
    agent: ``python -m hostagent.agent fetch``: one fetch, one JSON line (for experiments).
    vllm_connector: ``KvcastConnector``, a vLLM 0.32 KV connector (loads prefix KV through the
        fetch client, publishes computed blocks through the producer path); a package split by
        vLLM's roles (scheduler side, worker side, metadata, metrics, settings).
    vllm_events: vLLM's KV cache events (ZMQ) into the controller's access records.

Imports: the shared layer ``kvcast`` only (the fetch engine, the pool backend and its Mooncake
client, the report record and client, the chunk MAC, the ports), besides torch, numpy, vLLM and
the other libraries it plugs into; never another component (``refswitch``, ``poolnode``,
``controlplane``) nor a layer above (``emulation``, ``experiments``, ``benchmarks``).
``tests/test_layers.py`` checks it.
"""
