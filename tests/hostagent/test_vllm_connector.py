"""KvcastConnector against vLLM 0.33's real classes on CPU: Scheduler, Request, connector metadata.

A real ``Scheduler`` is built from a ``VllmConfig`` whose model directory holds only a
``config.json`` (``VLLM_TARGET_DEVICE=cpu``, ``HF_HUB_OFFLINE=1``); it loads the connector
through ``kv_connector_module_path`` as an engine would. The worker side runs in-process on CPU
tensors shaped like vLLM 0.33's per-layer KV views. Chunks travel through the real pool-node
server and the reference switch pipeline (``RefSwitchBridge``), or a fake pool that corrupts.
"""

from __future__ import annotations

import json
import os
import pickle
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

vllm = pytest.importorskip("vllm", reason="vllm is not installed (scripts/setup.sh installs it)")

import torch  # noqa: E402
from vllm.config import (  # noqa: E402
    CacheConfig,
    DeviceConfig,
    KVTransferConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.lora.request import LoRARequest  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256_cbor  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.output import SchedulerOutput  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
)
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

from hostagent.chunkkeys import ChunkKeyer, wire_key  # noqa: E402
from hostagent.vllm_connector import KvcastConnector  # noqa: E402
from hostagent.vllm_connector.config import ConnectorConfigError  # noqa: E402
from hostagent.vllm_connector.data import KvcastConnectorMetadata  # noqa: E402
from hostagent.vllm_connector.worker import KvcastWorker  # noqa: E402
from kvcast import p4constants as c  # noqa: E402
from kvcast.backend import InMemoryBackend  # noqa: E402
from kvcast.reports import InMemorySink  # noqa: E402
from kvcast.wire import KvpHeader  # noqa: E402
from poolnode.server import PoolServer  # noqa: E402
from tests.hostagent.fakes import FakeServer, Gate, pool, silent  # noqa: E402
from tests.hostagent.refbridge import RefSwitchBridge  # noqa: E402

BS = 16
LAYERS, HEADS, HEAD_DIM = 2, 2, 16
NUM_BLOCKS = 64
TENANT, SALTED_TENANT = 3, 9
PROMPT = list(range(1000, 1070))  # 70 tokens: 4 full blocks and 6 tokens

# The connector builds its pool client and reporter through these factories (import paths in
# kv_connector_extra_config), so scheduler and worker sides of a test share one pool and sink.
CURRENT: dict[str, Any] = {}


def pool_backend(_extra: Any) -> InMemoryBackend:
    backend: InMemoryBackend = CURRENT["backend"]
    return backend


def report_sink(_extra: Any) -> InMemorySink:
    sink: InMemorySink = CURRENT["sink"]
    return sink


@pytest.fixture(autouse=True)
def _vllm_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("VLLM_TARGET_DEVICE", "cpu")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    CURRENT.update(backend=InMemoryBackend(), sink=InMemorySink())
    init_none_hash(sha256_cbor)
    yield
    CURRENT.clear()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tiny-llama")
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HEADS * 2 * HEAD_DIM,
        "intermediate_size": 128,
        "num_attention_heads": HEADS * 2,
        "num_key_value_heads": HEADS,
        "head_dim": HEAD_DIM,
        "num_hidden_layers": LAYERS,
        "vocab_size": 2000,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-6,
        "torch_dtype": "float32",
    }
    (d / "config.json").write_text(json.dumps(config))
    return d


FETCH: dict[str, Any] = {"timeout_s": 0.05, "max_timeout_s": 0.1, "max_retries": 2}
FETCH["deadline_s"] = 5.0


class Engine:
    """A vLLM scheduler with the connector loaded from its module path, and a worker side."""

    def __init__(self, model_dir: Path, extra: dict[str, Any]) -> None:
        extra = {
            "pool_backend": f"{__name__}:pool_backend",
            "reporter": f"{__name__}:report_sink",
            "tenant": TENANT,
            "tenants": {"tenant-b": SALTED_TENANT},
            "host": "engine",
            "fetch": FETCH,
            **extra,
        }
        self.config = VllmConfig(
            model_config=ModelConfig(
                model=str(model_dir),
                dtype="float32",
                seed=0,
                max_model_len=1024,
                skip_tokenizer_init=True,
            ),
            cache_config=CacheConfig(block_size=BS, enable_prefix_caching=True),
            scheduler_config=SchedulerConfig(
                max_num_seqs=8,
                max_num_batched_tokens=1024,
                max_model_len=1024,
                is_encoder_decoder=False,
            ),
            kv_transfer_config=KVTransferConfig(
                kv_connector="KvcastConnector",
                kv_connector_module_path="hostagent.vllm_connector",
                kv_role="kv_both",
                kv_load_failure_policy="recompute",
                kv_connector_extra_config=extra,
            ),
            device_config=DeviceConfig("cpu"),
        )
        spec = FullAttentionSpec(
            block_size=BS, num_kv_heads=HEADS, head_size=HEAD_DIM, dtype=torch.float32
        )
        names = [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]
        self.kv_cache_config = KVCacheConfig(
            num_blocks=NUM_BLOCKS,
            kv_cache_tensors=[],
            kv_cache_groups=[KVCacheGroupSpec(names, spec)],
        )
        self.config.cache_config.num_gpu_blocks = NUM_BLOCKS
        self.scheduler = Scheduler(
            vllm_config=self.config,
            kv_cache_config=self.kv_cache_config,
            structured_output_manager=StructuredOutputManager(self.config),
            block_size=BS,
        )
        self.worker = KvcastConnector(self.config, KVConnectorRole.WORKER, self.kv_cache_config)
        # vLLM 0.33's per-layer view: [num_blocks, kv_heads, block_size, head_dim (K) + (V)]
        self.caches = {n: torch.zeros(NUM_BLOCKS, HEADS, BS, 2 * HEAD_DIM) for n in names}
        self.worker.register_kv_caches(self.caches)

    @property
    def kv(self) -> KvcastWorker:
        """The worker connector's worker side: its loads, saves and counters."""
        return self.worker.worker_side

    @property
    def connector(self) -> KvcastConnector:
        connector = self.scheduler.connector
        assert isinstance(connector, KvcastConnector)
        return connector

    def add(self, req_id: str, tokens: list[int], salt: str | None = None) -> Request:
        request = Request(
            req_id,
            tokens,
            SamplingParams(max_tokens=4),
            None,
            cache_salt=salt,
            block_hasher=get_request_block_hasher(BS, sha256_cbor),
        )
        self.scheduler.add_request(request)
        return request

    def blocks(self, req_id: str) -> list[int]:
        return list(self.scheduler.kv_cache_manager.get_blocks(req_id).get_block_ids()[0])

    def run_worker(self, out: SchedulerOutput) -> set[int]:
        """The worker's part of one step; returns the blocks reported as load errors."""
        meta = pickle.loads(pickle.dumps(out.kv_connector_metadata))  # crosses to the worker
        self.worker.bind_connector_metadata(meta)
        self.worker.start_load_kv(None)  # type: ignore[arg-type]
        for name in self.caches:
            self.worker.wait_for_layer_load(name)
        self.worker.wait_for_save()
        assert self.kv.flush_saves(10.0)  # publishes run off the step: the tests wait
        errors = self.worker.get_block_ids_with_load_errors()
        self.worker.clear_connector_metadata()
        return errors

    def block_bytes(self, block_id: int) -> list[bytes]:
        return [kv[block_id].numpy().tobytes() for kv in self.caches.values()]

    def close(self) -> None:
        self.worker.shutdown()
        self.connector.shutdown()


def meta_of(out: SchedulerOutput) -> KvcastConnectorMetadata:
    meta = out.kv_connector_metadata
    assert isinstance(meta, KvcastConnectorMetadata)
    return meta


def hashes(tokens: list[int], salt: str | None = None) -> list[int]:
    request = Request(
        "probe",
        tokens,
        SamplingParams(max_tokens=1),
        None,
        cache_salt=salt,
        block_hasher=get_request_block_hasher(BS, sha256_cbor),
    )
    return [wire_key(h) for h in request.block_hashes]


def hold(keys: list[int], tenant: int = TENANT) -> None:
    for key in keys:
        CURRENT["backend"].put(tenant, key, b"x")


@pytest.fixture
def pool_server() -> Iterator[PoolServer]:
    with PoolServer(CURRENT["backend"], "127.0.0.1", 0) as srv:
        yield srv


@pytest.fixture
def switch(pool_server: PoolServer) -> Iterator[RefSwitchBridge]:
    with RefSwitchBridge(pool_server.address) as bridge:
        yield bridge


def engine_on_switch(model_dir: Path, bridge: RefSwitchBridge, **extra: Any) -> Engine:
    host, port = bridge.vip
    eng = Engine(model_dir, {"service": f"{host}:{port}", **extra})
    bridge.register(eng.kv.fetch_client().address)
    return eng


def produce(model_dir: Path, bridge: RefSwitchBridge, tokens: list[int]) -> tuple[Engine, str]:
    """An engine that computes ``tokens`` (random KV) and publishes its blocks."""
    eng = engine_on_switch(model_dir, bridge, host="producer")
    for kv in eng.caches.values():
        kv.copy_(torch.randn(kv.shape))
    eng.add("p", tokens)
    out = eng.scheduler.schedule()
    assert not meta_of(out).loads and eng.run_worker(out) == set()
    return eng, "p"


# ------------------------------------------------------------------------------ scheduler side
def test_the_scheduler_loads_the_connector_from_its_module_path(model_dir: Path) -> None:
    eng = Engine(model_dir, {"pool": "127.0.0.1:9"})
    assert isinstance(eng.scheduler.connector, KvcastConnector)
    assert eng.connector.role == KVConnectorRole.SCHEDULER
    eng.close()


def test_matched_tokens_are_the_blocks_the_pool_holds_after_the_local_hit(
    model_dir: Path,
) -> None:
    keys = hashes(PROMPT)
    hold(keys[:3])  # blocks 0-2 in the pool, block 3 not
    eng = Engine(model_dir, {"pool": "127.0.0.1:9"})
    request = eng.add("r", PROMPT)
    assert eng.connector.get_num_new_matched_tokens(request, 0) == (3 * BS, False)
    assert eng.connector.get_num_new_matched_tokens(request, BS) == (2 * BS, False)
    assert CURRENT["backend"].get(TENANT, keys[0]) == b"x"  # asking moved no KV
    eng.close()


def test_a_prompt_held_whole_still_leaves_its_last_token_to_compute(model_dir: Path) -> None:
    tokens = PROMPT[: 4 * BS]  # exactly 4 full blocks, all held
    hold(hashes(tokens))
    eng = Engine(model_dir, {"pool": "127.0.0.1:9"})
    request = eng.add("r", tokens)
    assert eng.connector.get_num_new_matched_tokens(request, 0) == (3 * BS, False)
    eng.close()


def test_a_gap_ends_the_match_even_if_later_blocks_are_held(model_dir: Path) -> None:
    keys = hashes(PROMPT)
    hold([keys[0], keys[2], keys[3]])
    eng = Engine(model_dir, {"pool": "127.0.0.1:9"})
    request = eng.add("r", PROMPT)
    assert eng.connector.get_num_new_matched_tokens(request, 0) == (BS, False)
    eng.close()


def test_the_cache_salt_names_other_chunks_and_maps_to_its_tenant(model_dir: Path) -> None:
    hold(hashes(PROMPT))  # the unsalted chunks, tenant 3
    eng = Engine(model_dir, {"pool": "127.0.0.1:9"})
    salted = eng.add("s", PROMPT, salt="tenant-b")
    assert eng.connector.get_num_new_matched_tokens(salted, 0) == (0, False)
    salted_keys = hashes(PROMPT, salt="tenant-b")
    assert not set(salted_keys) & set(hashes(PROMPT))
    hold(salted_keys[:2], tenant=SALTED_TENANT)
    assert eng.connector.get_num_new_matched_tokens(salted, 0) == (2 * BS, False)
    eng.close()


def test_allocation_puts_the_loads_into_the_blocks_vllm_allocated(model_dir: Path) -> None:
    keys = hashes(PROMPT)
    hold(keys[:3])
    eng = Engine(model_dir, {"pool": "127.0.0.1:9"})
    eng.add("r", PROMPT)
    out = eng.scheduler.schedule()
    assert out.num_scheduled_tokens["r"] == len(PROMPT) - 3 * BS  # vLLM computes the rest
    assert out.has_sync_kv_loads  # so the worker starts the load before the forward pass
    meta = meta_of(pickle.loads(pickle.dumps(out)))
    blocks = eng.blocks("r")
    assert [ld.key for ld in meta.loads] == keys[:3]
    assert [ld.targets for ld in meta.loads] == [[("r", b)] for b in blocks[:3]]
    assert [ld.parent for ld in meta.loads] == [None, keys[0], keys[1]]
    assert [ld.position for ld in meta.loads] == [0, 1, 2]
    assert all(ld.tenant == TENANT for ld in meta.loads)
    assert meta.load_reqs == ["r"]
    # Block 3 (computed now, full after the step) is to be published; the loaded ones are not.
    assert [(s.req_id, s.first, s.block_ids) for s in meta.saves] == [("r", 3, blocks[3:4])]
    assert [wire_key(d) for d in meta.saves[0].digests] == keys
    # The next step carries neither again.
    assert meta_of(eng.scheduler.schedule()).loads == []
    eng.close()


def test_nothing_held_loads_nothing_and_every_full_prompt_block_is_saved(
    model_dir: Path,
) -> None:
    eng = Engine(model_dir, {"pool": "127.0.0.1:9"})
    eng.add("r", PROMPT)
    meta = meta_of(eng.scheduler.schedule())
    assert meta.loads == [] and meta.load_reqs == []
    assert [(s.first, s.block_ids) for s in meta.saves] == [(0, eng.blocks("r")[:4])]
    eng.close()


def test_a_role_that_only_consumes_saves_nothing(model_dir: Path) -> None:
    eng = Engine(model_dir, {"pool": "127.0.0.1:9", "save": False})
    eng.add("r", PROMPT)
    assert meta_of(eng.scheduler.schedule()).saves == []
    eng.close()


def test_unknown_settings_and_missing_addresses_are_refused(model_dir: Path) -> None:
    with pytest.raises(ConnectorConfigError, match="unknown kvcast setting 'servce'"):
        Engine(model_dir, {"servce": "127.0.0.1:9"})
    with pytest.raises(ConnectorConfigError, match="needs 'service'"):
        Engine(model_dir, {})
    with pytest.raises(ConnectorConfigError, match="load_budget_us_per_token must be positive"):
        Engine(model_dir, {"service": "127.0.0.1:9", "load_budget_us_per_token": -1})
    with pytest.raises(ConnectorConfigError, match=r"pools\[1\]: 'x' is not 'host:port'"):
        Engine(model_dir, {"service": "127.0.0.1:9", "pools": ["10.0.1.2:9", "x"]})
    with pytest.raises(ConnectorConfigError, match="pools: '10.0.1.2:9' is not a list"):
        Engine(model_dir, {"service": "127.0.0.1:9", "pools": "10.0.1.2:9"})


def test_the_other_pool_nodes_are_read_from_the_config() -> None:
    from hostagent.vllm_connector.config import ConnectorConfig

    cfg = ConnectorConfig.from_extra(
        {"service": "127.0.0.1:9", "pool": "10.0.1.1:19286", "pools": ["10.0.1.2:19286"]}
    )
    assert cfg.pool == ("10.0.1.1", 19286) and cfg.pools == (("10.0.1.2", 19286),)


# ------------------------------------------------------------------------------ worker side
def test_loaded_blocks_hold_the_producers_bytes(
    model_dir: Path, switch: RefSwitchBridge, pool_server: PoolServer
) -> None:
    producer, pid = produce(model_dir, switch, PROMPT)
    keys = hashes(PROMPT)
    assert all(CURRENT["backend"].contains(TENANT, k) for k in keys)  # published, all 4 blocks
    stored = [e for e in CURRENT["sink"].entries if e.event == "stored"]
    assert [e.key for e in stored] == keys and {e.host for e in stored} == {"producer"}

    consumer = engine_on_switch(model_dir, switch, host="consumer")
    consumer.add("c", PROMPT)
    out = consumer.scheduler.schedule()
    assert [ld.key for ld in meta_of(out).loads] == keys  # 64 of 70 tokens loaded
    assert consumer.run_worker(out) == set()
    for mine, theirs in zip(consumer.blocks("c")[:4], producer.blocks(pid)[:4], strict=True):
        assert consumer.block_bytes(mine) == producer.block_bytes(theirs)
    reports = consumer.kv.last_reports
    assert [r.key for r in reports] == keys and all(r.ok for r in reports)
    accesses = [e for e in CURRENT["sink"].entries if e.host == "consumer"]
    assert [(e.key, e.position) for e in accesses] == [(k, i) for i, k in enumerate(keys)]
    producer.close()
    consumer.close()


def test_a_chunk_in_switch_sram_is_served_by_the_switch(
    model_dir: Path, switch: RefSwitchBridge
) -> None:
    producer, pid = produce(model_dir, switch, PROMPT)
    key0 = hashes(PROMPT)[0]
    chunk0 = CURRENT["backend"].get(TENANT, key0)
    assert chunk0 is not None
    switch.load_chunk(TENANT, key0, chunk0, slot_base=0, epoch=1)
    consumer = engine_on_switch(model_dir, switch)
    consumer.add("c", PROMPT)
    out = consumer.scheduler.schedule()
    assert consumer.run_worker(out) == set()
    first = consumer.kv.last_reports[0]
    assert first.frags_hit == first.frag_count and first.frags_pool == 0
    assert consumer.block_bytes(consumer.blocks("c")[0]) == producer.block_bytes(
        producer.blocks(pid)[0]
    )
    producer.close()
    consumer.close()


class CorruptFragment:
    """The pool node, but fragment ``frag`` of chunk ``key`` is always sent with a flipped byte."""

    def __init__(self, backend: InMemoryBackend, key: int, frag: int) -> None:
        self.inner = pool(backend)
        self.key, self.frag = key, frag
        self.corrupted = 0

    def __call__(self, datagram: bytes) -> list[bytes]:
        out = []
        for reply in self.inner(datagram):
            hdr = KvpHeader.unpack(reply)
            n = -(-hdr.payload_len // c.FRAG_BYTES)
            if hdr.op == c.KVP_OP_DATA and hdr.key == self.key:
                if hdr.frag_idx <= self.frag < hdr.frag_idx + n:
                    flip = bytearray(reply)
                    flip[c.KVP_HDR_BYTES + (self.frag - hdr.frag_idx) * c.FRAG_BYTES] ^= 0xFF
                    reply = bytes(flip)
                    self.corrupted += 1
            out.append(reply)
        return out


@pytest.mark.parametrize("in_flight", [1, 4])
def test_a_corrupted_fragment_makes_its_block_and_the_later_ones_recompute(
    model_dir: Path, switch: RefSwitchBridge, in_flight: int
) -> None:
    producer, _ = produce(model_dir, switch, PROMPT)
    keys = hashes(PROMPT)
    responder = CorruptFragment(CURRENT["backend"], keys[1], frag=1)
    with FakeServer(responder) as bad_pool:
        host, port = bad_pool.address
        fetch = {**FETCH, "max_chunks_in_flight": in_flight}
        consumer = Engine(model_dir, {"pool": f"{host}:{port}", "host": "consumer", "fetch": fetch})
        request = consumer.add("c", PROMPT)
        out = consumer.scheduler.schedule()
        blocks = consumer.blocks("c")
        assert len(meta_of(out).loads) == 4
        errors = consumer.run_worker(out)
    assert responder.corrupted >= 1
    assert errors == set(blocks[1:4])  # block 1 failed its CRC; 2 and 3 depend on it
    reports = consumer.kv.last_reports
    assert [r.ok for r in reports[:2]] == [True, False] and reports[1].crc_failures >= 1
    if in_flight == 1:
        assert len(reports) == 2  # blocks 2 and 3 only the failed request needed: not fetched
    else:
        # Blocks 2 and 3 were in flight with block 1 (fetched, but not loaded: see errors).
        assert [r.key for r in reports] == keys
    assert consumer.block_bytes(blocks[0]) == producer.block_bytes(producer.blocks("p")[0])
    # vLLM, told so, drops the step's output and recomputes from block 1 (token 16) on.
    result = ModelRunnerOutput(
        req_ids=["c"],
        req_id_to_index={"c": 0},
        sampled_token_ids=[[5]],
        kv_connector_output=KVConnectorOutput(invalid_block_ids=errors),
    )
    consumer.scheduler.update_from_output(out, result)
    assert request.num_computed_tokens == BS and request.num_output_tokens == 0
    again = consumer.scheduler.schedule()
    assert again.num_scheduled_tokens["c"] == len(PROMPT) - BS
    assert meta_of(again).loads == []  # nothing is fetched again: it is computed
    producer.close()
    consumer.close()


def test_two_requests_sharing_a_prefix_in_one_step_fetch_it_once(
    model_dir: Path, switch: RefSwitchBridge, pool_server: PoolServer
) -> None:
    producer, pid = produce(model_dir, switch, PROMPT)
    keys = hashes(PROMPT)
    consumer = engine_on_switch(model_dir, switch, load_async=True)
    consumer.add("a", PROMPT)
    consumer.add("b", PROMPT[: 3 * BS] + [7] * 20)  # shares blocks 0-2, then differs
    out = consumer.scheduler.schedule()
    loads = meta_of(out).loads
    a, b = consumer.blocks("a"), consumer.blocks("b")
    assert [ld.key for ld in loads] == keys  # blocks 0-2 once each, block 3 for "a" only
    assert [len(ld.targets) for ld in loads] == [2, 2, 2, 1]
    assert loads[0].targets == [("a", a[0]), ("b", b[0])]
    assert set(meta_of(out).load_reqs) == {"a", "b"}
    gets_before = pool_server.stats.gets
    consumer.run_worker(out)
    finished: set[str] = set()
    for _ in range(200):
        _, done = consumer.worker.get_finished(set())
        finished |= done or set()
        if finished == {"a", "b"}:
            break
        time.sleep(0.05)
    assert finished == {"a", "b"}
    assert consumer.worker.get_block_ids_with_load_errors() == set()
    assert len(consumer.kv.last_reports) == 4  # four fetches for seven blocks
    gets = pool_server.stats.gets - gets_before
    frags = sum(r.frag_count for r in consumer.kv.last_reports)
    assert 0 < gets <= frags  # what four chunks take, not seven
    for i in range(3):
        want = producer.block_bytes(producer.blocks(pid)[i])
        assert consumer.block_bytes(a[i]) == want and consumer.block_bytes(b[i]) == want
    producer.close()
    consumer.close()


def test_the_agents_keyer_names_blocks_as_vllms_hasher_does() -> None:
    """The agent's ChunkKeyer (sha256_cbor) against vLLM 0.33's own block hasher."""
    seed = os.environ.get("PYTHONHASHSEED", "vllm-none-hash")  # vLLM's seed without the variable
    assert ChunkKeyer(BS, seed).wire_keys(PROMPT) == hashes(PROMPT)
    salted = ChunkKeyer(BS, seed, cache_salt="tenant-b", tagged_extra_keys=True)
    assert salted.wire_keys(PROMPT) == hashes(PROMPT, salt="tenant-b")
    lora = LoRARequest("adapter", 1, "/models/adapter")
    with_lora = Request(
        "l",
        PROMPT,
        SamplingParams(max_tokens=1),
        None,
        lora_request=lora,
        cache_salt="tenant-b",
        block_hasher=get_request_block_hasher(BS, sha256_cbor),
    )
    keyer = ChunkKeyer(
        BS, seed, "tenant-b", "adapter", tagged_extra_keys=True, lora_path="/models/adapter"
    )
    assert keyer.wire_keys(PROMPT) == [wire_key(h) for h in with_lora.block_hashes]
    # Before 0.33 the salt was hashed bare: those keys name other chunks.
    bare = ChunkKeyer(BS, seed, cache_salt="tenant-b")
    assert bare.wire_keys(PROMPT)[0] != hashes(PROMPT, salt="tenant-b")[0]


def test_a_steps_chunks_are_fetched_together(model_dir: Path, switch: RefSwitchBridge) -> None:
    producer, pid = produce(model_dir, switch, PROMPT)
    gate = Gate(CURRENT["backend"], need=4)
    with FakeServer(gate) as gated_pool:
        host, port = gated_pool.address
        # A deadline long enough for nothing, if the chunks were fetched one after the other.
        fetch = {**FETCH, "max_retries": 1, "deadline_s": 2.0}
        consumer = Engine(model_dir, {"pool": f"{host}:{port}", "fetch": fetch})
        consumer.add("c", PROMPT)
        out = consumer.scheduler.schedule()
        assert len(meta_of(out).loads) == 4
        assert consumer.run_worker(out) == set()
    assert len(gate.keys) == 4  # GETs of all four chunks were out before any answer
    for mine, theirs in zip(consumer.blocks("c")[:4], producer.blocks(pid)[:4], strict=True):
        assert consumer.block_bytes(mine) == producer.block_bytes(theirs)
    assert all(r.ok for r in consumer.kv.last_reports)
    producer.close()
    consumer.close()


@pytest.mark.parametrize("in_flight", [1, 2, 4])
def test_a_failed_request_does_not_stop_another_requests_chunks(
    model_dir: Path, switch: RefSwitchBridge, in_flight: int
) -> None:
    other = list(range(1100, 1170))  # a second prompt: no block in common with PROMPT
    producer_a, _ = produce(model_dir, switch, PROMPT)
    producer_b, _ = produce(model_dir, switch, other)
    ka, kb = hashes(PROMPT), hashes(other)
    responder = CorruptFragment(CURRENT["backend"], ka[0], frag=0)
    with FakeServer(responder) as bad_pool:
        host, port = bad_pool.address
        fetch = {**FETCH, "max_chunks_in_flight": in_flight}
        consumer = Engine(model_dir, {"pool": f"{host}:{port}", "host": "consumer", "fetch": fetch})
        consumer.add("a", PROMPT)
        consumer.add("b", other)
        out = consumer.scheduler.schedule()
        # In block order: a0 b0 a1 b1 a2 b2 a3 b3.
        assert [ld.key for ld in meta_of(out).loads] == [
            k for pair in zip(ka, kb, strict=True) for k in pair
        ]
        a, b = consumer.blocks("a"), consumer.blocks("b")
        errors = consumer.run_worker(out)
    assert errors == set(a[:4])  # block 0 of "a" failed its CRC: all of "a" recomputes
    # After a0 fails, a chunk only "a" needs is fetched only if it was in flight with a0; the
    # chunks of "b" not yet started are started after it, and all of "b" is loaded.
    fetched = [r.key for r in consumer.kv.last_reports]
    if in_flight == 4:
        assert fetched == [ka[0], kb[0], ka[1], kb[1], kb[2], kb[3]]
    else:
        assert fetched == [ka[0], *kb]
    for mine, theirs in zip(b[:4], producer_b.blocks("p")[:4], strict=True):
        assert consumer.block_bytes(mine) == producer_b.block_bytes(theirs)
    producer_a.close()
    producer_b.close()
    consumer.close()


def test_a_load_that_outlasts_recomputing_its_tokens_is_cut_and_recomputed(
    model_dir: Path,
) -> None:
    import time

    keys = hashes(PROMPT)[:4]
    hold(keys)
    with FakeServer(silent) as dead_pool:  # a pool node (or switch) that never answers
        host, port = dead_pool.address
        # Retries that would go on for half a minute; recomputing 4 x 16 tokens costs this
        # engine (say) 64 x 3 ms = 0.19 s.
        fetch = {"timeout_s": 0.5, "max_timeout_s": 1.0, "max_retries": 50, "deadline_s": 30.0,
                 "max_chunks_in_flight": 1}  # fmt: skip
        consumer = Engine(
            model_dir,
            {"pool": f"{host}:{port}", "fetch": fetch, "load_budget_us_per_token": 3000.0},
        )
        consumer.add("c", PROMPT)
        out = consumer.scheduler.schedule()
        assert len(meta_of(out).loads) == 4
        t0 = time.monotonic()
        errors = consumer.run_worker(out)
        took = time.monotonic() - t0
    assert errors == set(consumer.blocks("c")[:4])  # every block recomputed
    # The first chunk was cut at the budget; the three after it were never started.
    assert consumer.kv.stats["chunks_over_budget"] == 3
    assert consumer.kv.stats["chunks_failed"] == 1
    assert took < 10.0  # a bound on a hang (the fetch client alone would retry for 30 s)
    consumer.close()
