"""kvcast host agent: chunk keys, KV layout and the fetch client of a GPU host.

Modules:
    chunkkeys: chunk keys from token ids, exactly as vLLM hashes prefix-cache block hashes.
    layout: the contiguous per-chunk KV layout and its bridges to vLLM's paged KV cache and to
        Hugging Face's per-layer key/value tensors.
    fetch: the fetch client (switch first, DRAM pool second, recompute last; group fetch as
        leader or follower of a multicast stream).
    agent: ``python -m hostagent.agent fetch``: one fetch, one JSON line (for experiments).
    ports: ``AGENT_PORT``, importable without torch.
    vllm_connector: ``KvcastConnector``, a vLLM 0.32 KV connector (loads prefix KV through the
        fetch client, publishes computed blocks through the producer path).
    vllm_events: vLLM's KV cache events (ZMQ) into the controller's access records.
"""
