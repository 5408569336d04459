"""KvcastConnector as N serving engines use it: per-request options, group fetch, stats.

The same real vLLM ``Scheduler`` and in-process worker side as ``test_vllm_connector.py``;
chunks travel through the real pool-node server and the reference switch pipeline.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from kvcast.kvclass import KvClass

pytest.importorskip("vllm", reason="vllm is not installed (scripts/setup.sh installs it)")

from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256_cbor  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher  # noqa: E402
from vllm.v1.request import Request  # noqa: E402

from controlplane.pusher import StaticPrefix, completion_body  # noqa: E402
from hostagent.vllm_connector.config import ConnectorConfigError, LoadOptions  # noqa: E402
from hostagent.vllm_connector.metrics import KvcastConnectorStats  # noqa: E402
from hostagent.vllm_connector.worker import worker_stats  # noqa: E402
from kvcast.backend import InMemoryBackend  # noqa: E402
from poolnode.groups import StaticGroups  # noqa: E402
from poolnode.server import PoolServer  # noqa: E402
from tests.hostagent.refbridge import RefSwitchBridge  # noqa: E402
from tests.hostagent.test_vllm_connector import (  # noqa: E402
    BS,
    CURRENT,
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

S, T = KvClass.STATIC, KvClass.TRANSIENT


def add(eng: Engine, req_id: str, tokens: list[int], kvcast: dict[str, Any] | None) -> Request:
    """A request whose sampling params carry ``kv_transfer_params={"kvcast": kvcast}``."""
    extra = {"kv_transfer_params": {"kvcast": kvcast}} if kvcast is not None else None
    request = Request(
        req_id,
        tokens,
        SamplingParams(max_tokens=4, extra_args=extra),
        None,
        block_hasher=get_request_block_hasher(BS, sha256_cbor),
    )
    eng.scheduler.add_request(request)
    return request


def test_request_options_are_read_and_checked() -> None:
    assert LoadOptions.of(None) == LoadOptions()
    assert LoadOptions.of({"other": 1}) == LoadOptions()
    opts = LoadOptions.of({"kvcast": {"load": True, "group": 5, "role": "follower", "save": 0}})
    assert opts == LoadOptions(load=True, group=5, follower=True, save=False)
    for bad in (
        {"group": 5, "role": "watcher"},
        {"group": 70000},
        {"group": True},
        {"role": "follower"},  # a follower without a group
        {"prefetch": True},
        "load",
    ):
        with pytest.raises(ConnectorConfigError):
            LoadOptions.of({"kvcast": bad})


def test_replica_options_are_read_and_checked() -> None:
    opts = LoadOptions.of({"kvcast": {"replica": 2, "replicas": 4}})
    assert (opts.replica, opts.replicas) == (2, 4)
    assert opts.read_key(0xABCD_0100) == 0xABCD_0102
    assert opts.read_key(0xABCD_01FF) == 0xABCD_01FE
    assert LoadOptions.of(None).read_key(0xABCD_01FF) == 0xABCD_01FF
    for bad, message in (
        ({"replica": 1}, "replica 1 is not in 0..0"),
        ({"replica": 4, "replicas": 4}, "not in 0..3"),
        ({"replica": 0, "replicas": 3}, "power of two"),
        ({"replica": 0, "replicas": 512}, "power of two"),
        ({"replica": "0", "replicas": 2}, "not an integer"),
        ({"replica": 0, "replicas": 2, "group": 7}, "do not go together"),
    ):
        with pytest.raises(ConnectorConfigError, match=message):
            LoadOptions.of({"kvcast": bad})


def test_a_request_with_a_replica_is_looked_up_under_its_keys_and_read_under_the_replicas(
    model_dir: Path,  # noqa: F811
) -> None:
    eng = Engine(model_dir, {"service": "127.0.0.1:9"})
    own = hashes(PROMPT)[:4]
    for key in own:  # the publisher's pool holds the blocks under their own keys
        CURRENT["backend"].put(TENANT, key, b"x")
    add(eng, "r", PROMPT, {"replica": 3, "replicas": 4})
    loads = meta_of(eng.scheduler.schedule()).loads
    assert [ld.key for ld in loads] == [k - k % 4 + 3 for k in own]
    assert [ld.parent for ld in loads] == [None, *own[:3]]
    eng.close()


def test_the_controllers_push_orders_are_options_the_connector_reads() -> None:
    prefix = StaticPrefix(1, TENANT, (1, 2, 3), None, 3)
    leader = completion_body(prefix, group=9, leader=True, model=None)["kv_transfer_params"]
    follower = completion_body(prefix, group=9, leader=False, model=None)["kv_transfer_params"]
    alone = completion_body(prefix, group=0, leader=True, model=None)["kv_transfer_params"]
    assert LoadOptions.of(leader) == LoadOptions(group=9, save=False, kv_class=S)
    assert LoadOptions.of(follower) == LoadOptions(group=9, follower=True, save=False, kv_class=S)
    assert LoadOptions.of(alone) == LoadOptions(save=False, kv_class=S)


def test_class_options_are_read_and_checked() -> None:
    opts = LoadOptions.of({"kvcast": {"class": "transient", "static_tokens": 2 * BS + 3}})
    assert (opts.kv_class, opts.static_blocks(BS)) == (KvClass.TRANSIENT, 2)
    assert [opts.class_of(i, BS) for i in range(3)] == [S, S, KvClass.TRANSIENT]
    assert LoadOptions.of(None).class_of(0, BS) is None
    for bad, message in (
        ({"class": "hot"}, "expected one of static, transient"),
        ({"static_tokens": -1}, "static_tokens"),
        ({"static_tokens": "all"}, "static_tokens"),
        ({"static_tokens": True}, "static_tokens"),
    ):
        with pytest.raises(ConnectorConfigError, match=message):
            LoadOptions.of({"kvcast": bad})


def test_a_request_budget_is_read_checked_and_overrides_the_engines(
    model_dir: Path,  # noqa: F811
) -> None:
    assert LoadOptions.of({"kvcast": {"budget_us_per_token": 800}}).budget_us_per_token == 800.0
    for bad in (0, -5, float("inf"), True, "fast"):
        with pytest.raises(ConnectorConfigError, match="budget_us_per_token"):
            LoadOptions.of({"kvcast": {"budget_us_per_token": bad}})
    eng = Engine(model_dir, {"service": "127.0.0.1:9", "load_budget_us_per_token": 100.0})
    for key in hashes(PROMPT)[:4]:
        CURRENT["backend"].put(TENANT, key, b"x")
    add(eng, "own", PROMPT, {"budget_us_per_token": 700.0})
    add(eng, "default", PROMPT, None)
    loads = meta_of(eng.scheduler.schedule()).loads
    # One chunk for both requests: the more patient budget holds.
    assert [ld.budget_us for ld in loads] == [700.0] * 4
    eng.close()


def test_declared_classes_reach_the_pool_and_every_record(
    model_dir: Path,  # noqa: F811
    switch: RefSwitchBridge,  # noqa: F811
) -> None:
    producer = engine_on_switch(model_dir, switch, host="producer")
    for kv in producer.caches.values():
        kv.copy_(torch.randn(kv.shape))
    add(producer, "p", PROMPT, {"static_tokens": 2 * BS + 3})  # blocks 0 and 1 are static
    assert producer.run_worker(producer.scheduler.schedule()) == set()
    keys, backend, sink = hashes(PROMPT), CURRENT["backend"], CURRENT["sink"]
    assert [backend.kv_class(TENANT, k) for k in keys] == [S, S, T, T]
    stored = {e.key: e for e in sink.entries if e.event == "stored"}
    assert [stored[k].kv_class for k in keys] == [S, S, None, None]
    assert (
        stored[keys[0]].as_json()["class"] == "static" and "class" not in stored[keys[2]].as_json()
    )
    consumer = engine_on_switch(model_dir, switch, host="consumer")
    add(consumer, "c", PROMPT, {"class": "static", "save": False})
    out = consumer.scheduler.schedule()
    assert [ld.kv_class for ld in meta_of(out).loads] == [S] * 4
    assert consumer.run_worker(out) == set()
    used = [e for e in sink.entries if e.host == "consumer"]
    assert [e.key for e in used] == keys and all(e.kv_class is S for e in used)
    for e in (producer, consumer):
        e.close()


def test_a_request_that_asks_for_nothing_loads_and_saves_nothing(
    model_dir: Path,  # noqa: F811
    switch: RefSwitchBridge,  # noqa: F811
) -> None:
    producer, _ = produce(model_dir, switch, PROMPT)
    consumer = engine_on_switch(model_dir, switch, host="consumer")
    add(consumer, "c", PROMPT + [7] * 20, {"load": False, "save": False})
    out = consumer.scheduler.schedule()
    meta = meta_of(out)
    assert meta.loads == [] and meta.saves == []  # the pool holds 4 of its blocks: not asked
    # the same prompt with the defaults, on another engine: it loads the 4 blocks the pool
    # holds and saves the new full one
    other = engine_on_switch(model_dir, switch, host="other")
    add(other, "d", PROMPT + [7] * 20, None)
    meta = meta_of(other.scheduler.schedule())
    assert [ld.key for ld in meta.loads] == hashes(PROMPT)
    assert [s.first for s in meta.saves] == [4]
    for e in (producer, consumer, other):
        e.close()


def test_a_bad_request_option_computes_every_token(model_dir: Path) -> None:  # noqa: F811
    CURRENT["backend"].put(TENANT, hashes(PROMPT)[0], b"x")
    eng = Engine(model_dir, {"service": "127.0.0.1:9"})
    request = add(eng, "r", PROMPT, {"group": 3, "role": "follower", "extra": 1})
    assert eng.connector.get_num_new_matched_tokens(request, 0) == (0, False)
    eng.close()


class CountingBackend(InMemoryBackend):
    """Counts single and batched existence queries."""

    def __init__(self) -> None:
        super().__init__()
        self.single = 0
        self.batched: list[int] = []

    def contains(self, tenant: int, key: int) -> bool:
        self.single += 1
        return super().contains(tenant, key)

    def contains_many(self, tenant: int, keys: Any) -> list[bool]:
        self.batched.append(len(keys))
        return [super(CountingBackend, self).contains(tenant, k) for k in keys]


def test_the_pool_is_asked_once_per_request_for_all_its_blocks(model_dir: Path) -> None:  # noqa: F811
    backend = CURRENT["backend"] = CountingBackend()
    keys = hashes(PROMPT)
    for k in keys[:3]:
        backend.put(TENANT, k, b"x")
    eng = Engine(model_dir, {"service": "127.0.0.1:9"})
    request = add(eng, "r", PROMPT, None)
    # 70 tokens: 4 full blocks, all of them may be matched (the last token stays to compute)
    assert eng.connector.get_num_new_matched_tokens(request, 0) == (3 * BS, False)
    assert backend.batched == [4] and backend.single == 0
    eng.close()


def test_a_follower_engine_takes_the_leaders_multicast_stream(
    model_dir: Path,  # noqa: F811
    switch: RefSwitchBridge,  # noqa: F811
    pool_server: PoolServer,  # noqa: F811
) -> None:
    pool_server.handler.groups = StaticGroups({21})  # the pool node echoes only known groups
    producer, pid = produce(model_dir, switch, PROMPT)
    leader = engine_on_switch(model_dir, switch, host="leader")
    follower = engine_on_switch(model_dir, switch, host="follower")
    lead_port, follow_port = (
        switch._hosts[e.kv.fetch_client().address[1]] for e in (leader, follower)
    )
    switch.add_group(21, [lead_port, follow_port])
    add(leader, "l", PROMPT, {"group": 21, "role": "leader", "save": False})
    add(follower, "f", PROMPT, {"group": 21, "role": "follower", "save": False})
    lead_out, follow_out = leader.scheduler.schedule(), follower.scheduler.schedule()
    assert {(ld.group, ld.follower) for ld in meta_of(follow_out).loads} == {(21, True)}
    # The leader fetches first; its replicas wait in the follower's socket until it follows.
    assert leader.run_worker(lead_out) == set()
    assert follower.run_worker(follow_out) == set()
    reports = follower.kv.last_reports
    assert len(reports) == 4 and all(r.ok for r in reports)
    assert sum(r.frags_stream for r in reports) == sum(r.frag_count for r in reports)
    assert sum(r.repairs for r in reports) == 0  # it sent no GET of its own
    for mine, theirs in zip(follower.blocks("f")[:4], producer.blocks(pid)[:4], strict=True):
        assert follower.block_bytes(mine) == producer.block_bytes(theirs)
    assert follower.kv.fetch_client().group == 0  # the group was the request's only
    for e in (producer, leader, follower):
        e.close()


def test_a_follower_whose_leader_never_comes_repairs_by_itself(
    model_dir: Path,  # noqa: F811
    switch: RefSwitchBridge,  # noqa: F811
) -> None:
    producer, _ = produce(model_dir, switch, PROMPT)
    follower = engine_on_switch(
        model_dir, switch, host="follower", follow_first_wait_s=0.2, follow_stall_s=0.2
    )
    port = switch._hosts[follower.kv.fetch_client().address[1]]
    switch.add_group(22, [port])
    add(follower, "f", PROMPT, {"group": 22, "role": "follower", "save": False})
    assert follower.run_worker(follower.scheduler.schedule()) == set()
    reports = follower.kv.last_reports
    assert all(r.ok and r.stalled for r in reports)
    assert sum(r.frags_stream for r in reports) == 0
    producer.close()
    follower.close()


def test_the_connector_counts_what_it_loaded_for_vllms_metrics(
    model_dir: Path,  # noqa: F811
    switch: RefSwitchBridge,  # noqa: F811
) -> None:
    producer, _ = produce(model_dir, switch, PROMPT)
    consumer = engine_on_switch(model_dir, switch, host="consumer")
    before = worker_stats()
    add(consumer, "c", PROMPT, None)
    assert consumer.run_worker(consumer.scheduler.schedule()) == set()
    stats = consumer.worker.get_kv_connector_stats()
    assert isinstance(stats, KvcastConnectorStats)
    chunk = consumer.kv.layout.chunk_bytes
    assert stats.data["chunks_loaded"] == 4 and stats.data["bytes_loaded"] == 4 * chunk
    assert stats.data["chunks_failed"] == 0 and stats.data["load_jobs"] == 1
    reduced = stats.reduce()
    assert reduced["load_gbps"] > 0
    assert consumer.worker.get_kv_connector_stats() is None  # nothing new since
    after = worker_stats()
    assert after["chunks_loaded"] - before.get("chunks_loaded", 0) == 4
    merged = KvcastConnectorStats(data={"chunks_loaded": 1}).aggregate(stats)
    assert merged.data["chunks_loaded"] == 5
    assert type(consumer.worker).build_kv_connector_stats(stats.data).data == stats.data
    # the producer's saves are recorded in order: what the experiment loads into SRAM
    assert [k for _, k in producer.kv.saved] == hashes(PROMPT)
    producer.close()
    consumer.close()


def test_a_dead_pool_turns_the_load_into_recompute_and_the_engine_goes_on(
    model_dir: Path,  # noqa: F811
    switch: RefSwitchBridge,  # noqa: F811
    pool_server: Any,  # noqa: F811
) -> None:
    producer, _ = produce(model_dir, switch, PROMPT)
    consumer = engine_on_switch(model_dir, switch, host="consumer")
    add(consumer, "c", PROMPT, {"save": False})
    out = consumer.scheduler.schedule()
    assert len(meta_of(out).loads) == 4  # the pool held every block when the scheduler asked
    pool_server.stop()  # then it died, before the worker fetched
    failed = consumer.run_worker(out)
    assert failed == set(consumer.blocks("c")[:4])  # all four blocks go back to be computed
    reports = consumer.kv.last_reports
    assert reports and all(not r.ok and r.reason.value == "no_answer" for r in reports)
    # The engine serves on: the next request's lookup still answers (the pool's existence
    # check is what the scheduler asks), and a request that loads nothing is unaffected.
    add(consumer, "d", [9] * 40, {"load": False})
    assert meta_of(consumer.scheduler.schedule()).loads == []
    producer.close()
    consumer.close()


class SlowPool(InMemoryBackend):
    """A pool whose puts wait until ``release`` is set (a slow or congested pool node)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def put_many(self, items: Any, *, kv_class: KvClass = KvClass.TRANSIENT) -> None:
        items = list(items)
        assert self.release.wait(10.0)
        super().put_many(items, kv_class=kv_class)


def test_saves_run_off_the_step_and_land_once_flushed(model_dir: Path) -> None:  # noqa: F811
    backend = CURRENT["backend"] = SlowPool()
    eng = Engine(model_dir, {"service": "127.0.0.1:9"})
    add(eng, "p", PROMPT, None)
    out = eng.scheduler.schedule()
    assert [s.first for s in meta_of(out).saves] == [0]
    eng.worker.bind_connector_metadata(meta_of(out))
    eng.worker.wait_for_save()  # returns while the pool still holds the put back
    eng.worker.clear_connector_metadata()
    keys = hashes(PROMPT)
    assert [k for _, k in eng.kv.saved] == keys
    assert not any(backend.contains(TENANT, k) for k in keys)
    assert not eng.kv.flush_saves(0.05)  # still queued
    backend.release.set()
    assert eng.kv.flush_saves(10.0)
    assert all(backend.contains(TENANT, k) for k in keys)
    eng.close()


def test_synchronous_saves_land_within_the_step(model_dir: Path) -> None:  # noqa: F811
    eng = Engine(model_dir, {"service": "127.0.0.1:9", "save_async": False})
    add(eng, "p", PROMPT, None)
    out = eng.scheduler.schedule()
    eng.worker.bind_connector_metadata(meta_of(out))
    eng.worker.wait_for_save()
    eng.worker.clear_connector_metadata()
    assert all(CURRENT["backend"].contains(TENANT, k) for k in hashes(PROMPT))
    eng.close()
