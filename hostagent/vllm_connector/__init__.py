"""kvcast as a vLLM KV connector: prefix KV from the switch (or the DRAM pool) into vLLM's cache.

vLLM's v1 engine loads external KV through a ``KVConnectorBase_V1``; ``KvcastConnector`` is one,
written for vLLM 0.32.0 (the connector API changes between releases; 0.33's is the same for what
it uses), loaded with::

    --kv-transfer-config '{"kv_connector": "KvcastConnector",
        "kv_connector_module_path": "hostagent.vllm_connector", "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"service": "10.0.0.100:19286", "pool": "10.0.1.1:19286",
                                      "mooncake": {"master_addr": "10.0.1.1:50051"}}}'

A chunk is the KV of one full vLLM block; its key is the low 64 bits of vLLM's own block hash of
that block (``request.block_hashes``, the hash prefix caching uses, chained over the prefix with
the request's ``cache_salt`` in the first block), so every engine of a tenant names a prefix
block the same way. The connector runs in two places:

Scheduler side (``role == SCHEDULER``), per step:

* ``get_num_new_matched_tokens`` asks the pool which of the request's blocks after the local
  prefix-cache hit it holds (an existence check, no KV moves) and answers the longest run as
  tokens to load, leaving at least one prompt token to compute. The switch caches only chunks
  the control plane loaded from the pool, so the pool's answer covers the switch's too.
* ``update_state_after_alloc`` records which vLLM block ids the loaded blocks go to.
* ``build_connector_meta`` hands the worker one ``ChunkLoad`` per distinct chunk of the step:
  requests of one step that share a prefix share its fetches (one fetch, copied into every
  request's block); and one ``ChunkSave`` per request whose prompt blocks became full in the step
  and are not yet known to be in the pool.

Worker side (``role == WORKER``):

* ``register_kv_caches`` takes vLLM's per-layer views ``[num_blocks, kv_heads, block_size,
  2 x head_dim]`` and derives the chunk layout from them.
* ``start_load_kv`` hands the step's loads to a loader thread, which fetches the chunks with the
  host agent's ``FetchClient.fetch_many`` (the step's chunks in flight at once; switch first,
  the pool behind it, the pool directly last; every fragment CRC-checked), layer 0 of every
  chunk first, and copies each chunk's layers into every destination block as its verified
  prefix grows (a chunk is layer-major: ``hostagent.layout``). A request may ask for a
  multicast group fetch (``LoadOptions``: its ``kv_transfer_params``): the leader's GETs name
  the group and the switch replicates the replies to every member; a follower takes the
  stream (``FetchClient.follow``) and repairs gaps by unicast.
* KV classes (``kvcast.kvclass``): a request may declare its prompt's class (``"class":
  "static"`` or ``"transient"``) and that its first ``static_tokens`` tokens are static (the
  blocks wholly inside them: a system prompt and tool definitions every branch reuses). The
  declared class of each block goes with its access record and its ``"stored"`` record to the
  controller, and static blocks are put into the pool as static (Mooncake's soft pin).
* ``wait_for_layer_load(layer_name)`` waits until that layer (its index in
  ``register_kv_caches``' order) of every chunk of the step is copied from verified bytes or
  its chunk has failed (``layers.LayerGate``), so the forward runs layer ``l`` while later
  layers arrive (``pipeline_layers``, on by default). Verified: CRC-checked fragments and, for
  a tenant with MAC keys, segments that match their MACs (``kvcast.integrity``: one per 16 KiB,
  the MAC object fetched beside the chunk). With ``load_async``
  the engine goes on and ``get_finished`` reports the requests whose loads ended.
* A chunk that does not arrive complete and verified is never reported as loaded: its blocks, and
  every later block of the same request, are returned by ``get_block_ids_with_load_errors``
  (after the forward, which waits for the whole load there) and vLLM recomputes from the first
  of them (``kv_load_failure_policy: recompute``). The forward may have run layers on such a
  chunk's first layers: vLLM 0.32's scheduler (``_handle_invalid_blocks``) then skips the
  step's sampled tokens of every affected request, so none reaches an output.
* ``wait_for_save`` copies the step's newly full prompt blocks out of the KV cache and publishes
  them through the producer path (``Producer.publish_keyed``: one batched put of the chunks the
  pool lacks, ``"stored"`` records to the controller).

Modules (split by role, as vLLM's own Mooncake store connector is):
    connector: ``KvcastConnector``, the class vLLM loads: a thin front that validates the engine
        and delegates to the side of its role.
    scheduler: ``KvcastScheduler``, the scheduler side.
    worker: ``KvcastWorker``, the worker side; ``worker_stats`` for an in-process engine.
    data: the connector metadata the scheduler side hands the worker side each step.
    layers: ``LayerGate``, each layer of a step's load released once every chunk settled it.
    metrics: the worker side's counters and their form for vLLM's connector metrics.
    config: ``ConnectorConfig`` (``kv_connector_extra_config``), ``LoadOptions`` (a request's
        ``kv_transfer_params``), the pool client and report sink they name.

The package may import vLLM, torch, ``kvcast`` (the fetch engine, the pool backend interface
and, for the default ``pool_backend: "mooncake"``, ``kvcast.mooncake``) and the host agent's
own modules. This module
exports ``KvcastConnector`` so that ``kv_connector_module_path: hostagent.vllm_connector`` names
the package.
"""

from hostagent.vllm_connector.connector import KvcastConnector

__all__ = ["KvcastConnector"]
