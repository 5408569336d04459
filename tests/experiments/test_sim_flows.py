import math
import random

import pytest

from experiments.sim.flows import FlowError, FlowNetwork, max_min_rates
from experiments.sim.incast import IncastParams, predict, relief


def test_a_single_flow_takes_size_over_rate():
    net = FlowNetwork()
    link = net.link("l", 250.0)
    flow = net.start(1000.0, [(link, 1.0)])
    net.advance(math.inf)
    assert flow.finish == pytest.approx(4.0)


def test_a_coefficient_scales_the_link_cost():
    net = FlowNetwork()
    link = net.link("l", 100.0)
    flow = net.start(100.0, [(link, 2.0)])  # 2 link units per payload byte
    net.advance(math.inf)
    assert flow.finish == pytest.approx(2.0)
    assert link.moved == pytest.approx(200.0)


def test_equal_flows_share_a_bottleneck_equally_and_fill_it():
    rates = max_min_rates([90.0], [[(0, 1.0)]] * 3)
    assert rates == pytest.approx([30.0, 30.0, 30.0])
    assert sum(rates) == pytest.approx(90.0)


def test_max_min_gives_leftover_capacity_to_unconstrained_flows():
    # flow 1 crosses both links; link 1 limits it and flow 2 to 2 each, flow 0 takes the rest.
    rates = max_min_rates([10.0, 4.0], [[(0, 1.0)], [(0, 1.0), (1, 1.0)], [(1, 1.0)]])
    assert rates == pytest.approx([8.0, 2.0, 2.0])


def _random_instance(rng: random.Random) -> tuple[list[float], list[list[tuple[int, float]]]]:
    n_links = rng.randint(1, 8)
    caps = [rng.uniform(1.0, 100.0) for _ in range(n_links)]
    paths = []
    for _ in range(rng.randint(1, 12)):
        links = rng.sample(range(n_links), rng.randint(1, n_links))
        paths.append([(i, rng.choice([1.0, 1.0, 0.5, 1.8])) for i in links])
    return caps, paths


@pytest.mark.parametrize("seed", range(25))
def test_max_min_rates_respect_capacities_and_every_flow_has_a_bottleneck(seed):
    caps, paths = _random_instance(random.Random(seed))
    rates = max_min_rates(caps, paths)
    load = [0.0] * len(caps)
    for rate, path in zip(rates, paths, strict=True):
        for i, c in path:
            load[i] += c * rate
    for i, cap in enumerate(caps):
        assert load[i] <= cap * (1 + 1e-9)
    # Max-min certificate: each flow crosses a saturated link on which no flow is faster.
    for rate, path in zip(rates, paths, strict=True):
        assert rate > 0
        assert any(
            load[i] >= caps[i] * (1 - 1e-9)
            and all(
                r <= rate * (1 + 1e-9) for r, p in zip(rates, paths, strict=True) if i in dict(p)
            )
            for i, _ in path
        )


@pytest.mark.parametrize("seed", range(10))
def test_bytes_are_conserved_and_no_link_carries_more_than_its_capacity(seed):
    rng = random.Random(seed)
    net = FlowNetwork()
    links = [net.link(f"l{i}", rng.uniform(10.0, 100.0)) for i in range(6)]
    flows = []
    t = 0.0
    for _ in range(40):
        t += rng.expovariate(2.0)
        net.advance(t)
        path = [(link, rng.choice([1.0, 1.5])) for link in rng.sample(links, rng.randint(1, 3))]
        flows.append(net.start(rng.uniform(1.0, 200.0), path))
    net.advance(math.inf)
    assert all(f.done and f.remaining == 0 for f in flows)
    for link in links:
        assert link.moved == pytest.approx(link.committed, rel=1e-9)
        expected = sum(f.path.get(link, 0.0) * f.size for f in flows)
        assert link.moved == pytest.approx(expected, rel=1e-9)
        assert link.moved <= link.capacity * net.now * (1 + 1e-9)


def test_multicast_costs_the_pool_link_once_and_unicast_n_times():
    n, size = 8, 1000.0
    uni = FlowNetwork()
    pool = uni.link("pool", 100.0)
    hosts = [uni.link(f"h{i}", 1000.0) for i in range(n)]
    for h in hosts:
        uni.start(size, [(pool, 1.0), (h, 1.0)])
    uni.advance(math.inf)
    assert pool.moved == pytest.approx(n * size)
    assert uni.now == pytest.approx(n * size / 100.0)

    mc = FlowNetwork()
    pool = mc.link("pool", 100.0)
    hosts = [mc.link(f"h{i}", 1000.0) for i in range(n)]
    mc.start(size, [(pool, 1.0), *[(h, 1.0) for h in hosts]])
    mc.advance(math.inf)
    assert pool.moved == pytest.approx(size)
    assert all(h.moved == pytest.approx(size) for h in hosts)
    assert mc.now == pytest.approx(size / 100.0)


def test_a_multicast_stream_runs_at_its_slowest_receivers_rate():
    net = FlowNetwork()
    pool = net.link("pool", 100.0)
    fast, slow = net.link("fast", 1000.0), net.link("slow", 10.0)
    flow = net.start(100.0, [(pool, 1.0), (fast, 1.0), (slow, 1.0)])
    net.advance(math.inf)
    assert flow.finish == pytest.approx(10.0)


def test_a_receiver_joining_later_adds_only_the_remaining_bytes_to_its_link():
    net = FlowNetwork()
    pool = net.link("pool", 10.0)
    a, b = net.link("a", 100.0), net.link("b", 100.0)
    flow = net.start(100.0, [(pool, 1.0), (a, 1.0)])
    net.advance(4.0)
    net.extend(flow, [(b, 1.0)])
    net.advance(math.inf)
    assert b.moved == pytest.approx(60.0)
    assert pool.moved == pytest.approx(100.0)
    assert flow.finish == pytest.approx(10.0)


def test_split_moves_bytes_to_a_new_flow_without_changing_link_bytes():
    net = FlowNetwork()
    link = net.link("l", 10.0)
    flow = net.start(100.0, [(link, 1.0)])
    net.advance(2.0)
    new = net.split(flow, 30.0)
    net.advance(math.inf)
    assert flow.size + new.size == pytest.approx(100.0)
    assert link.moved == pytest.approx(100.0)
    assert link.committed == pytest.approx(100.0)
    assert max(flow.finish, new.finish) == pytest.approx(10.0)


def test_callbacks_may_start_flows_at_the_completion_instant():
    net = FlowNetwork()
    link = net.link("l", 10.0)
    done: list[float] = []

    def chain(flow, t):
        done.append(t)
        if len(done) < 3:
            net.start(10.0, [(link, 1.0)], on_done=chain)

    net.start(10.0, [(link, 1.0)], on_done=chain)
    net.advance(math.inf)
    assert done == pytest.approx([1.0, 2.0, 3.0])


def test_invalid_links_and_flows_are_refused():
    net = FlowNetwork()
    with pytest.raises(FlowError):
        net.link("zero", 0.0)
    link = net.link("l", 1.0)
    with pytest.raises(FlowError):
        net.start(1.0, [])
    with pytest.raises(FlowError):
        net.start(0.0, [(link, 1.0)])
    with pytest.raises(FlowError):
        net.start(1.0, [(link, -1.0)])
    net.advance(5.0)
    with pytest.raises(FlowError):
        net.advance(1.0)


def test_incast_model_relief_of_pool_multicast_is_n_when_the_pool_link_is_the_bottleneck():
    p = IncastParams(pool_mbit=20.0, host_mbit=200.0)
    for n in (1, 2, 4, 8):
        assert relief(n, 256 * 1024, p)["a/b"] == pytest.approx(n)


def test_incast_model_pool_bytes_are_n_times_for_unicast_and_once_for_multicast():
    p = IncastParams(pool_mbit=20.0, host_mbit=200.0, switch_pps=50_000.0)
    a = predict("a", 8, 100_000, p)
    b = predict("b", 8, 100_000, p)
    c = predict("c", 8, 100_000, p)
    assert a.pool_tx_bytes == 8 * b.pool_tx_bytes
    assert b.pool_tx_bytes > 100_000  # headers are counted
    assert c.pool_tx_bytes == 0


def test_incast_model_switch_packet_rate_limits_the_sram_modes():
    fast = IncastParams(pool_mbit=20.0, host_mbit=200.0)
    slow = IncastParams(pool_mbit=20.0, host_mbit=200.0, switch_pps=10_000.0)
    assert predict("d", 8, 262144, slow).max_s > predict("d", 8, 262144, fast).max_s
    # d: every host's GETs pass the switch, so its time grows with N; c replicates one stream
    assert predict("d", 8, 262144, slow).max_s > predict("c", 8, 262144, slow).max_s
