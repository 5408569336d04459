"""Mininet smoke test of the incast experiment: N = 2, a small prefix, every mode.

It fails if the modes stop differing as they should. The checks are on bytes and counters,
which the modes fix exactly, not on times, which a shared machine makes noisy: the pool sends
the prefix once per host by unicast (a), once in all with multicast (b), and not at all when the
switch serves from SRAM (c, d), and once per host spread over two pool nodes (r2); the switch
answers from SRAM only in c and d. Each GPU host runs one agent for the whole sweep, over two
repeats.
"""

from __future__ import annotations

import pytest

from emulation.switches import RefSwitch
from emulation.topo import EMULATION_MTU, ClusterSpec, LinkSpec
from kvcast import p4constants as c
from kvcast.kvp import frags_per_data
from tests.mininet_env import MININET_MISSING
from tests.poolnode.conftest import MOONCAKE_MISSING

pytestmark = [pytest.mark.slow, pytest.mark.netns]

N = 2
PREFIX = 32 * 1024


@pytest.fixture(scope="module")
def results() -> dict[str, object]:
    if MININET_MISSING:
        pytest.skip(MININET_MISSING)
    from experiments.incast import TENANT, run_sweep

    # Host ports bound to their address and the experiment's tenant, as `make demo` runs it.
    spec = ClusterSpec(
        n_hosts=N,
        n_pools=2,
        host_link=LinkSpec(bw_mbit=200),
        pool_link=LinkSpec(bw_mbit=20),
        tenants=(TENANT,),
    )
    # The pool node as `make demo` runs it: Mooncake Store where it is installed.
    backend = "memory" if MOONCAKE_MISSING else "mooncake"
    got = run_sweep(
        spec, RefSwitch, ["a", "b", "c", "d", "r2"], [N], [PREFIX], repeats=2,
        progress=lambda _s: None, pool_backend=backend,
    )  # fmt: skip
    assert [r.repeat for r in got] == [0] * 5 + [1] * 5
    return {r.mode: r for r in got}  # the second repeat of each


def test_every_host_ends_with_the_verified_prefix_in_every_mode(results: dict) -> None:
    for mode, r in results.items():
        assert r.all_ok, f"mode {mode}: {r.hosts}"


def test_pool_unicast_sends_the_prefix_once_per_host(results: dict) -> None:
    assert results["a"].pool_tx_bytes >= N * PREFIX
    assert results["a"].pool_tx_bytes < N * PREFIX * 1.3


def test_pool_multicast_sends_the_prefix_once_in_all(results: dict) -> None:
    assert PREFIX <= results["b"].pool_tx_bytes < PREFIX * 1.3
    assert results["b"].counters["data_mcast"] > 0


def test_pool_data_fill_the_jumbo_mtu(results: dict) -> None:
    # The cluster runs 9000-byte links: a pool node's DATA carries 34 fragments, so the 128
    # fragments of the prefix take 4 DATAs per host in mode a (26 at a 1500-byte MTU).
    per_host = -(-PREFIX // c.FRAG_BYTES // frags_per_data(EMULATION_MTU))
    assert per_host == 4
    assert N * per_host <= results["a"].counters["data_unicast"] < 2 * N * per_host


def test_sram_modes_take_nothing_from_the_pool(results: dict) -> None:
    for mode in ("c", "d"):
        assert results[mode].pool_tx_bytes < PREFIX * 0.05, mode
        assert results[mode].counters["get_hit"] > 0, mode


def test_only_sram_modes_hit_the_switch_cache(results: dict) -> None:
    assert results["a"].counters["get_hit"] == 0
    assert results["b"].counters["get_hit"] == 0


def test_multicast_needs_fewer_switch_hits_than_unicast(results: dict) -> None:
    # c: one leader's GETs serve both hosts; d: each host asks for every fragment itself.
    assert results["d"].counters["get_hit"] >= N * results["c"].counters["get_hit"] * 0.9


def test_replicas_spread_the_hosts_over_two_pool_nodes(results: dict) -> None:
    r2 = results["r2"]
    assert [(h["host"], h["replica"]) for h in r2.hosts] == [("h1", 0), ("h2", 1)]
    assert N * PREFIX <= r2.pool_tx_bytes < N * PREFIX * 1.3
    assert r2.counters["get_hit"] == 0 and r2.counters["get_bypass"] > 0


def test_rows_name_hosts_by_mininet_name_and_keep_the_role(results: dict) -> None:
    roles = [(h["host"], h["role"]) for h in results["c"].hosts]
    assert roles == [("h1", "leader"), ("h2", "follower")]


def test_a_switch_that_dies_mid_sweep_fails_its_points_not_the_sweep(monkeypatch) -> None:
    if MININET_MISSING:
        pytest.skip(MININET_MISSING)
    import experiments.incast as incast

    clusters: list[object] = []

    class Recorded(incast.Cluster):  # type: ignore[misc,name-defined]
        def __enter__(self):
            clusters.append(self)
            return super().__enter__()

    def kill_switch_after_first_point(line: str) -> None:
        if line.startswith("[  1/"):
            clusters[0].switch.process.proc.kill()  # type: ignore[attr-defined]

    monkeypatch.setattr(incast, "Cluster", Recorded)
    spec = ClusterSpec(
        n_hosts=N, n_pools=1, host_link=LinkSpec(bw_mbit=200), pool_link=LinkSpec(bw_mbit=20)
    )
    got = incast.run_sweep(
        spec, RefSwitch, ["c", "d"], [N], [PREFIX], repeats=1,
        progress=kill_switch_after_first_point, pool_backend="memory",
    )  # fmt: skip
    assert [r.mode for r in got] == ["c", "d"]
    assert got[0].all_ok and not got[0].error
    assert not got[1].all_ok and got[1].error.startswith("switch")
