import shutil

import pytest

from controlplane.policies import available_policies
from experiments.sim.cluster import ClusterSim
from experiments.sim.cluster_config import ClusterConfig
from experiments.sim.hardware import H100, MODELS, WireFormat, bmv2, tofino1
from experiments.sim.workloads import (
    SimRequest,
    SimWorkload,
    burst_workload,
    load_trace,
    make_workload,
)
from experiments.traces import mix64

needs_cpp = pytest.mark.skipif(shutil.which("cpp") is None, reason="cpp not installed")


def _small(**kw):
    base = {"hosts": 64, "pools": 4, "model": MODELS["small-kv4"]}
    base.update(kw)
    return ClusterConfig(**base)


# ---------------------------------------------------------------------- hardware


def test_kv_bytes_per_token_follow_the_model_shape():
    assert MODELS["llama3-8b"].bytes_per_token == 128 * 1024
    assert MODELS["llama3-8b"].chunk_bytes(512) == 64 << 20
    assert MODELS["small"].bytes_per_token == 12 * 1024
    assert MODELS["small-kv4"].bytes_per_token == pytest.approx(12 * 1024 * 4.25 / 16)


@needs_cpp
def test_tofino_switch_sizes_come_from_sizes_p4():
    sw = tofino1()
    assert sw.frag_bytes == 96  # what p4c's Tofino backend placed (p4src/build/tofino)
    assert sw.sram_bytes == 32768 * 96
    assert not sw.fits(MODELS["llama3-8b"].chunk_bytes(512))
    assert not sw.fits(MODELS["small"].chunk_bytes(512))
    assert sw.fits(MODELS["small-kv4"].chunk_bytes(512))


def test_bmv2_switch_uses_the_generated_constants():
    from kvcast import p4constants as c

    assert bmv2().frag_bytes == c.FRAG_BYTES


def test_wire_overhead_of_one_fragment_frames_exceeds_jumbo_pool_frames():
    wire = WireFormat()
    assert wire.sram_coef(128) > 1.5
    assert 1.0 < wire.pool_coef(128) < 1.05


def test_prefill_cost_grows_with_context():
    m = MODELS["llama3-8b"]
    assert H100.prefill_s(m, 0, 512) < H100.prefill_s(m, 8192, 8704)
    assert H100.prefill_s(m, 100, 100) == 0


# ---------------------------------------------------------------------- workloads


def test_affinity_mapping_puts_a_conversation_on_one_host():
    w = load_trace(hosts=32, mapping="affinity", limit=2000)
    hosts = {}
    for r in w.requests:
        hosts.setdefault(r.blocks[:2], set()).add(r.host)
    assert all(len(h) == 1 for h in hosts.values())
    assert len({r.host for r in w.requests}) > 1


def test_round_robin_and_speedup():
    w = load_trace(hosts=4, mapping="round-robin", limit=8)
    assert [r.host for r in w.requests] == [0, 1, 2, 3, 0, 1, 2, 3]
    fast = w.sped_up(10.0)
    assert fast.requests[-1].time == pytest.approx(w.requests[-1].time / 10)


def test_burst_workload_warms_the_pool_then_sends_bursts_of_distinct_hosts():
    w = burst_workload(consumers=5, prefix_blocks=3, bursts=4, hosts=16, prefixes=2)
    assert w.warmup == 2
    bursts = w.requests[w.warmup :]
    assert len(bursts) == 20
    first = [r for r in bursts if r.time == bursts[0].time]
    assert len({r.host for r in first}) == 5
    assert len({r.blocks[:3] for r in bursts}) == 2


# ---------------------------------------------------------------------- cluster


def _same_prefix(n: int, blocks: int = 4) -> SimWorkload:
    w = burst_workload(consumers=n, prefix_blocks=blocks, bursts=1, hosts=64)
    return w


def test_unicast_sends_a_shared_prefix_n_times_and_multicast_once():
    n, blocks = 8, 4
    w = _same_prefix(n, blocks)
    chunk = _small().chunk_bytes
    warm_host = w.requests[0].host  # computed the prefix: holds it in HBM
    remote = sum(r.host != warm_host for r in w.requests[w.warmup :])
    uni = ClusterSim(_small(fabric="unicast"), w).run()
    mc = ClusterSim(_small(fabric="multicast"), w).run()
    assert uni.requests == mc.requests == len(w.requests)
    assert uni.pool_egress_bytes == pytest.approx(remote * blocks * chunk)
    assert mc.pool_egress_bytes == pytest.approx(blocks * chunk)
    assert mc.fetch_stat(-1) < uni.fetch_stat(-1)


def test_a_late_joiner_fetches_only_what_it_missed():
    prefix = tuple(mix64(i) for i in range(4))
    reqs = (
        SimRequest(0.0, 0, (*prefix, 1), 5 * 512),
        SimRequest(10.0, 1, (*prefix, 2), 5 * 512),
        SimRequest(10.0005, 2, (*prefix, 3), 5 * 512),
    )
    w = SimWorkload("late", reqs, 64, warmup=1)
    cfg = _small(fabric="multicast", pool_gbps=10.0)
    r = ClusterSim(cfg, w).run()
    assert r.coalesced_joins > 0
    assert 0 < r.repair_bytes < 4 * cfg.chunk_bytes
    assert r.pool_egress_bytes < 2 * 4 * cfg.chunk_bytes


def test_every_request_completes_with_non_negative_times():
    w = make_workload("agentic", hosts=64, quick=True)
    r = ClusterSim(_small(), w).run()
    assert r.requests == len(w.requests)
    assert (r.fetch_s >= 0).all()
    assert (r.ttft_s >= r.fetch_s).all()
    assert sum(r.tier_refs) + r.computed_blocks == r.block_refs


def test_a_chunk_larger_than_the_sram_is_never_served_from_it():
    w = _same_prefix(4)
    r = ClusterSim(_small(model=MODELS["llama3-8b"], fabric="kvcast"), w).run()
    assert r.admissions == 0
    assert r.tier_refs[2] == 0


def test_reused_small_chunks_are_served_from_sram():
    w = burst_workload(consumers=4, prefix_blocks=2, bursts=6, hosts=64, prefixes=1)
    r = ClusterSim(_small(fabric="kvcast", instant_load=True), w).run()
    assert r.admissions > 0
    assert r.tier_refs[2] > 0
    assert r.write_packets == r.admissions * tofino1().frags(r.config.chunk_bytes) * 4


@pytest.mark.parametrize("policy", available_policies(include_offline=False))
def test_the_offline_optimum_hits_at_least_as_often_as_each_online_policy(policy):
    w = make_workload("agentic", hosts=64, quick=True)
    cfg = _small(fabric="kvcast", instant_load=True, sram_bytes=64 << 20)
    future = ClusterSim.network_stream(cfg, w)
    opt = ClusterSim(cfg.with_(policy="belady"), w, future=future).run()
    online = ClusterSim(cfg.with_(policy=policy), w).run()
    assert opt.tier_refs[2] >= online.tier_refs[2]


def test_exclusive_rule_demotes_hbm_victims_to_dram():
    w = make_workload("agentic", hosts=8, quick=True)
    tiny = {"hbm_cache_gib": 0.02, "dram_cache_gib": 1.0, "hosts": 8}
    ex = ClusterSim(_small(tier_rule="exclusive", **tiny), w).run()
    only = ClusterSim(_small(tier_rule="hbm-only", **tiny), w).run()
    assert ex.hbm_to_dram > 0
    assert ex.tier_refs[1] > 0
    assert only.tier_refs[1] == 0


def test_without_pool_writes_nothing_is_fetched_from_the_pool():
    w = make_workload("agentic", hosts=64, quick=True)
    r = ClusterSim(_small(pool_write="none"), w).run()
    assert r.tier_refs[3] == 0
    assert r.pool_write_bytes == 0


def test_bounded_pool_evicts_and_demotion_writes_host_victims():
    w = make_workload("agentic", hosts=4, quick=True)
    cfg = _small(
        hosts=4, hbm_cache_gib=0.01, dram_cache_gib=0.02, pool_gib=0.01, pool_write="demote"
    )
    r = ClusterSim(cfg, w).run()
    assert r.host_demotions > 0
    assert r.pool_evictions > 0
    assert r.pool_write_bytes == r.host_demotions * cfg.chunk_bytes


def test_unknown_knobs_are_refused():
    with pytest.raises(ValueError):
        ClusterConfig(fabric="teleport")
    with pytest.raises(ValueError):
        ClusterConfig(tier_rule="random")
    with pytest.raises(ValueError):
        ClusterSim(_small(hosts=2), _same_prefix(4))


def test_an_oversubscribed_rack_link_slows_unicast_fetches_into_one_rack():
    prefix = tuple(mix64(i) for i in range(4))
    warm = SimRequest(0.0, 40, (*prefix, 99), 5 * 512)
    reqs = tuple(SimRequest(5.0, h, (*prefix, 100 + h), 5 * 512) for h in range(8))
    w = SimWorkload("rack", (warm, *reqs), 64, warmup=1)
    flat = ClusterSim(_small(fabric="unicast", hosts_per_rack=8, pools=16), w).run()
    over = ClusterSim(
        _small(fabric="unicast", hosts_per_rack=8, pools=16, rack_oversub=8.0), w
    ).run()
    assert over.fetch_stat(-1) > flat.fetch_stat(-1)
