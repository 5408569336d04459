"""Per-layer loads: ``LayerGate``, and the worker side releasing each layer as it arrives.

The gate is tested alone (threads only). The worker side runs against vLLM's real scheduler
(``test_vllm_connector.Engine``) with a pool that withholds a chunk's later layers: the forward's
wait for layer 0 returns while they are missing, a chunk that then fails still releases its
layers and is reported, and vLLM, told so, discards the step's output for its request.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from hostagent.vllm_connector.layers import LayerGate


def test_a_layer_is_released_once_every_chunk_has_settled_it() -> None:
    gate = LayerGate(2, 3)
    gate.settle(0, 2)
    assert gate.released == 0 and not gate.wait(0, timeout_s=0.01)
    gate.settle(1, 1)
    assert gate.released == 1 and gate.wait(0, timeout_s=0) and not gate.wait(1, timeout_s=0)
    gate.settle(1, 3)
    assert gate.released == 2 and gate.settled(1) == 3


def test_settling_never_takes_a_layer_back() -> None:
    gate = LayerGate(1, 4)
    gate.settle(0, 3)
    gate.settle(0, 1)
    assert gate.settled(0) == 3 and gate.released == 3


def test_closing_releases_every_layer_and_the_layer_beyond() -> None:
    gate = LayerGate(3, 2)
    assert not gate.wait(5, timeout_s=0)
    gate.close()
    assert gate.closed and gate.released == 2 and gate.wait(1) and gate.wait(5)


def test_a_load_without_chunks_is_released_at_once() -> None:
    assert LayerGate(0, 4).released == 4


def test_bad_settles_are_refused() -> None:
    gate = LayerGate(1, 2)
    with pytest.raises(ValueError, match="layers"):
        gate.settle(0, 3)
    with pytest.raises(IndexError):
        gate.settle(1, 1)
    with pytest.raises(ValueError):
        LayerGate(1, 0)


def test_a_waiter_wakes_when_its_layer_is_released_and_shows_what_it_waits_for() -> None:
    gate = LayerGate(1, 2)
    woke: list[bool] = []
    waiter = threading.Thread(target=lambda: woke.append(gate.wait(1, timeout_s=10)))
    waiter.start()
    deadline = time.monotonic() + 5
    while gate.waiting != 1 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert gate.waiting == 1
    gate.settle(0, 1)
    assert not woke  # layer 0 does not release a wait for layer 1
    gate.settle(0, 2)
    waiter.join(5)
    assert woke == [True] and gate.waiting == -1


# ------------------------------------------------------------------------- the worker side

vllm = pytest.importorskip("vllm", reason="vllm is not installed (scripts/setup.sh installs it)")

import torch  # noqa: E402
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput  # noqa: E402

from kvcast import p4constants as c  # noqa: E402
from kvcast.backend import InMemoryBackend  # noqa: E402
from kvcast.fetch import RecomputeReason  # noqa: E402
from kvcast.wire import KvpHeader  # noqa: E402
from tests.hostagent.fakes import FakeServer, pool  # noqa: E402
from tests.hostagent.refbridge import RefSwitchBridge  # noqa: E402
from tests.hostagent.test_vllm_connector import (  # noqa: E402
    BS,
    CURRENT,
    FETCH,
    LAYERS,
    PROMPT,
    TENANT,
    Engine,
    _vllm_env,  # noqa: F401 - the autouse fixture: pool, sink, vLLM's environment
    engine_on_switch,
    hashes,
    meta_of,
    model_dir,  # noqa: F401 - the model directory fixture
    pool_server,  # noqa: F401
    produce,
    switch,  # noqa: F401
)


class Withhold:
    """The pool node; chunk ``key``'s fragments from ``upto`` on only once ``open`` is set."""

    def __init__(self, backend: InMemoryBackend, key: int, upto: int) -> None:
        self.inner = pool(backend)
        self.key, self.upto = key, upto
        self.open = threading.Event()
        self.withheld = 0

    def __call__(self, datagram: bytes) -> list[bytes]:
        hdr = KvpHeader.unpack(datagram)
        if hdr.key != self.key or self.open.is_set() or hdr.frag_idx + hdr.frag_count <= self.upto:
            return self.inner(datagram)
        self.withheld += 1
        if hdr.frag_idx >= self.upto:
            return []
        count = self.upto - hdr.frag_idx
        return self.inner(datagram[:26] + count.to_bytes(2, "big") + datagram[28:])


PATIENT = {**FETCH, "max_retries": 40, "deadline_s": 10.0}  # withheld GETs are asked again
NAMES = [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]


def layer_of(eng: Engine, block_id: int, layer: int) -> bytes:
    return eng.caches[NAMES[layer]][block_id].numpy().tobytes()


@dataclass
class Withheld:
    """A producer's prompt being loaded by a consumer whose pool withholds one chunk's layers."""

    producer: Engine
    theirs: list[int]
    responder: Withhold
    consumer: Engine
    out: Any
    blocks: list[int]


@contextmanager
def withheld(model: Path, bridge: RefSwitchBridge, block: int, **extra: Any) -> Iterator[Withheld]:
    """Publishes ``PROMPT``, then starts a consumer's load of it; block ``block``'s chunk has
    only its first layer answered until ``responder.open`` is set."""
    producer, pid = produce(model, bridge, PROMPT)
    upto = producer.kv.layout.layer_bytes // c.FRAG_BYTES
    responder = Withhold(CURRENT["backend"], hashes(PROMPT)[block], upto)
    with FakeServer(responder) as srv:
        host, port = srv.address
        consumer = Engine(model, {"pool": f"{host}:{port}", "host": "consumer", **extra})
        consumer.add("c", PROMPT)
        out = consumer.scheduler.schedule()
        assert len(meta_of(out).loads) == 4
        consumer.worker.bind_connector_metadata(meta_of(out))
        consumer.worker.start_load_kv(None)  # type: ignore[arg-type]
        try:
            yield Withheld(
                producer, producer.blocks(pid), responder, consumer, out, consumer.blocks("c")
            )
        finally:
            consumer.close()
            producer.close()


def test_layer_0_is_released_while_a_chunks_later_layers_are_on_their_way(
    model_dir: Path,  # noqa: F811
    switch: RefSwitchBridge,  # noqa: F811
) -> None:
    with withheld(model_dir, switch, 2, fetch=PATIENT) as w:
        w.consumer.worker.wait_for_layer_load(NAMES[0])
        job = w.consumer.kv._sync_job
        assert job is not None and not job.gate.closed  # the withheld chunk is not whole
        for mine, src in zip(w.blocks[:4], w.theirs[:4], strict=True):
            assert layer_of(w.consumer, mine, 0) == layer_of(w.producer, src, 0)
        assert layer_of(w.consumer, w.blocks[2], 1) != layer_of(w.producer, w.theirs[2], 1)
        # Its later layers are asked for (layer by layer, after layer 0 of every chunk) and
        # held back; only then is the pool let answer them.
        deadline = time.monotonic() + 10.0
        while w.responder.withheld == 0:
            assert time.monotonic() < deadline, "no GET for the withheld layers within 10 s"
            time.sleep(0.005)
        w.responder.open.set()
        w.consumer.worker.wait_for_layer_load(NAMES[1])
        assert w.consumer.worker.get_block_ids_with_load_errors() == set()
        for mine, src in zip(w.blocks[:4], w.theirs[:4], strict=True):
            assert w.consumer.block_bytes(mine) == w.producer.block_bytes(src)
        step = w.consumer.kv.last_step
        assert step["forward_wait_s"] > 0 and step["load_s"] >= step["forward_wait_s"]
        stats = w.consumer.kv.stats
        assert stats["load_steps"] == 1 and stats["forward_wait_s"] == step["forward_wait_s"]


def test_without_pipelining_the_first_layer_waits_for_every_chunk_whole(
    model_dir: Path,  # noqa: F811
    switch: RefSwitchBridge,  # noqa: F811
) -> None:
    with withheld(model_dir, switch, 2, fetch=PATIENT, pipeline_layers=False) as w:
        opener = threading.Timer(0.3, w.responder.open.set)
        opener.start()
        w.consumer.worker.wait_for_layer_load(NAMES[0])
        assert w.responder.open.is_set()
        # Every layer of every chunk is in place before the first layer runs.
        for mine, src in zip(w.blocks[:4], w.theirs[:4], strict=True):
            assert w.consumer.block_bytes(mine) == w.producer.block_bytes(src)
        assert w.consumer.worker.get_block_ids_with_load_errors() == set()
        opener.join()


def test_a_chunk_that_fails_after_layer_0_ran_is_reported_and_its_step_discarded(
    model_dir: Path,  # noqa: F811
    switch: RefSwitchBridge,  # noqa: F811
) -> None:
    with withheld(model_dir, switch, 1, fetch=FETCH) as w:  # never opened
        request = w.consumer.scheduler.requests["c"]
        w.consumer.worker.wait_for_layer_load(NAMES[0])
        # Layer 0 of the chunk that will fail is in place: the forward may use it now.
        assert layer_of(w.consumer, w.blocks[1], 0) == layer_of(w.producer, w.theirs[1], 0)
        w.consumer.worker.wait_for_layer_load(NAMES[1])  # returns once the chunk has failed
        errors = w.consumer.worker.get_block_ids_with_load_errors()
        assert errors == set(w.blocks[1:4])  # the failed block and the ones after it
        stats = w.consumer.kv.stats
        assert stats["chunks_failed"] == 1 and stats["chunks_loaded"] == 1
        assert stats["chunks_discarded"] == 2  # in flight with it, arrived for a failed request
        # vLLM, told so, drops the step's output for the request and recomputes from block 1
        # on: nothing computed from the partly loaded block reaches an output.
        result = ModelRunnerOutput(
            req_ids=["c"],
            req_id_to_index={"c": 0},
            sampled_token_ids=[[5]],
            kv_connector_output=KVConnectorOutput(invalid_block_ids=errors),
        )
        w.consumer.scheduler.update_from_output(w.out, result)
        assert request.num_computed_tokens == BS and request.num_output_tokens == 0
        again = w.consumer.scheduler.schedule()
        assert again.num_scheduled_tokens["c"] == len(PROMPT) - BS


def test_a_name_that_is_no_registered_layer_waits_for_the_whole_load(
    model_dir: Path,  # noqa: F811
    switch: RefSwitchBridge,  # noqa: F811
) -> None:
    with withheld(model_dir, switch, 3, fetch=PATIENT) as w:
        opener = threading.Timer(0.3, w.responder.open.set)
        opener.start()
        w.consumer.worker.wait_for_layer_load("model.layers.9.mlp")
        assert w.consumer.kv._sync_job is None  # the job has ended and been collected
        assert w.consumer.block_bytes(w.blocks[3]) == w.producer.block_bytes(w.theirs[3])
        opener.join()


def test_with_mac_keys_a_forged_chunk_reaches_no_block_and_the_ones_before_it_load(
    model_dir: Path,  # noqa: F811
    switch: RefSwitchBridge,  # noqa: F811
) -> None:
    keys = {str(TENANT): bytes(range(32)).hex()}
    producer = engine_on_switch(model_dir, switch, host="producer", mac_keys=keys)
    for kv in producer.caches.values():
        kv.copy_(torch.randn(kv.shape))
    producer.add("p", PROMPT)
    assert producer.run_worker(producer.scheduler.schedule()) == set()
    theirs = producer.blocks("p")
    # The pool's copy of the third block goes bad (a rewrite with valid CRCs).
    backend = CURRENT["backend"]
    third = hashes(PROMPT)[2]
    backend.put(TENANT, third, b"\x5a" * len(backend.get(TENANT, third)))
    consumer = engine_on_switch(model_dir, switch, host="consumer", mac_keys=keys)
    consumer.add("c", PROMPT)
    out = consumer.scheduler.schedule()
    errors = consumer.run_worker(out)
    blocks = consumer.blocks("c")
    assert errors == set(blocks[2:4])
    reports = consumer.kv.last_reports
    assert [r.mac_verified for r in reports[:2]] == [True, True]
    assert reports[2].reason is RecomputeReason.MAC_MISMATCH
    for mine, src in zip(blocks[:2], theirs[:2], strict=True):
        assert consumer.block_bytes(mine) == producer.block_bytes(src)
    # Nothing of the forged chunk reached the cache: its block still holds the zeros it had.
    assert not any(any(b) for b in consumer.block_bytes(blocks[2]))
    assert consumer.kv.stats["chunks_failed"] == 1
    producer.close()
    consumer.close()
