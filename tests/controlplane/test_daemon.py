"""The controller daemon end to end, against the in-process reference switch.

Reports go in over the HTTP API, a tick runs, and the reference pipeline is asked with KVP GET
frames: the chosen chunk must be in SRAM with the right bytes. Chunk bytes come from a real
pool-node server on loopback (the daemon's KVP chunk source), or from a backend in process.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass
from ipaddress import IPv4Address
from typing import Any

import pytest

from controlplane.allocator import SlotRange
from controlplane.chunksource import BackendChunkSource, ChunkSource
from controlplane.config import parse_config
from controlplane.configspec import DaemonConfig
from controlplane.daemon import Controller
from kvcast import p4constants as c
from kvcast import wire
from kvcast.backend import InMemoryBackend
from kvcast.reports import AccessReport, ReportClient
from poolnode.server import PoolServer
from refswitch.tables import ActionCall, Lpm

from .test_p4rt_harness import (
    HOST_IP,
    HOST_MAC,
    HOST_PORT,
    POOL_IP,
    POOL_MAC,
    POOL_PORT,
    RefSwitch,
    refswitch_fixture,  # noqa: F401 - provides the refswitch fixture
    run,
)

F = c.FRAG_BYTES
TENANT = 5
T_CACHE = c.TABLE_INGRESS_CACHE_CACHE_TABLE
T_LPM = c.TABLE_INGRESS_FORWARDING_IPV4_LPM
DST_IP = wire.ETH_HDR_BYTES + 16


def chunk_bytes(key: int, n: int) -> bytes:
    return bytes((i * 31 + key) & 0xFF for i in range(n))


KEYS = {name: 0x1000_0000_0000_0000 + i * 0x101 for i, name in enumerate("ABCDEFGH")}
SIZE = 3 * F - 50  # three fragments, the last one short


@dataclass
class Env:
    sw: RefSwitch
    backend: InMemoryBackend
    pool: PoolServer

    def config(self, **overrides: Any) -> DaemonConfig:
        raw: dict[str, Any] = {
            "switches": [{"name": "s1", "address": self.sw.address, "election_id": 10}],
            "pools": [
                {
                    "name": "p1",
                    "ip": POOL_IP,
                    "mac": POOL_MAC,
                    "port": POOL_PORT,
                    "fetch_address": f"127.0.0.1:{self.pool.address[1]}",
                }
            ],
            "hosts": [
                {
                    "name": "h1",
                    "ip": HOST_IP,
                    "mac": HOST_MAC,
                    "port": HOST_PORT,
                    "tenants": [TENANT],
                }
            ],
            "tick_s": 3600,  # the tests tick by hand
            "metrics": {"listen": "127.0.0.1:0"},
            "report_api": {"listen": "127.0.0.1:0"},
        }
        raw.update(overrides)
        return parse_config(raw)


@pytest.fixture(name="env")
def env_fixture(refswitch: RefSwitch) -> Iterator[Env]:
    backend = InMemoryBackend()
    for key in KEYS.values():
        backend.put(TENANT, key, chunk_bytes(key, SIZE))
    pool = PoolServer(backend, "127.0.0.1", 0, cache_bytes=0)
    pool.start()
    yield Env(refswitch, backend, pool)
    pool.stop()


def report(key: int, *, hit: bool | None = False, t: float | None = None) -> AccessReport:
    return AccessReport(TENANT, key, SIZE, "h1", time.time() if t is None else t, hit)


async def post(ctl: Controller, *reports: AccessReport) -> tuple[int, dict[str, Any]]:
    address = ctl.report_address
    assert address is not None
    client = ReportClient(f"http://{address[0]}:{address[1]}")
    return await asyncio.to_thread(client.post, list(reports))


def get(sw: RefSwitch, key: int, frag: int) -> str:
    """One GET through the pipeline: "hit" (right bytes, CRC), "miss" (to the pool), or what."""
    outs = sw.get(TENANT, key, frag, req_id=frag)
    if len(outs) != 1:
        return f"{len(outs)} outputs"
    frame = outs[0].frame
    hdr = wire.KvpHeader.unpack(frame, wire.FRAME_KVP_OFFSET)
    if hdr.op == c.KVP_OP_DATA and hdr.flags & c.KVP_FLAG_HIT:
        payload = frame[wire.FRAME_KVP_OFFSET + c.KVP_HDR_BYTES :][: hdr.payload_len]
        want = chunk_bytes(key, SIZE)[frag * F : (frag + 1) * F]
        if payload != want or hdr.crc != wire.fragment_crc(TENANT, key, frag, payload):
            return "WRONG BYTES"
        return "hit"
    if hdr.op == c.KVP_OP_GET and outs[0].port == POOL_PORT:
        assert frame[DST_IP : DST_IP + 4] == wire.ip_bytes(POOL_IP)
        return "miss"
    return f"op {hdr.op} port {outs[0].port}"


def served(sw: RefSwitch, key: int) -> list[str]:
    return [get(sw, key, i) for i in range(-(-SIZE // F))]


def installed(sw: RefSwitch) -> dict[int, tuple[int, int, int]]:
    """The switch's cache table as it holds it: key -> (slot_base, frag_count, epoch)."""
    out: dict[int, tuple[int, int, int]] = {}
    for entry in sw.state.entries(T_CACHE):
        tenant, key = entry.match
        assert tenant == TENANT and isinstance(key, int) and key not in out
        p = entry.action.params
        out[key] = (p["slot_base"], p["frag_count"], p["epoch"])
    return out


def cache_keys(sw: RefSwitch) -> set[int]:
    return set(installed(sw))


def sample(ctl: Controller, name: str, **labels: str) -> float:
    value = ctl.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


async def started(config: DaemonConfig, source: ChunkSource | None = None) -> Controller:
    ctl = Controller(config, chunk_source=source)
    await ctl.start()
    await ctl.wait_ready(10)
    return ctl


# ---------------------------------------------------------------------- loading
def test_a_reported_chunk_is_loaded_and_every_fragment_hits_with_its_bytes(env: Env) -> None:
    a = KEYS["A"]

    async def main() -> None:
        ctl = await started(env.config())
        try:
            assert served(env.sw, a) == ["miss"] * 3
            assert await post(ctl, report(a)) == (202, {"accepted": 1})
            summary = (await ctl.tick())["s1"]
            assert (summary.loaded, summary.applied) == (1, True)
            assert served(env.sw, a) == ["hit"] * 3
            assert sample(ctl, "kvcast_controller_loads_total", switch="s1") == 1
            assert sample(ctl, "kvcast_controller_load_bytes_total", switch="s1") == SIZE
            assert sample(ctl, "kvcast_controller_reports_received_total") == 1
            assert sample(ctl, "kvcast_controller_switch_connected", switch="s1") == 1
        finally:
            await ctl.stop()

    run(main())


def test_the_switch_ends_a_tick_holding_exactly_the_policy_resident_set(env: Env) -> None:
    async def main() -> None:
        ctl = await started(env.config())
        try:
            await post(ctl, *(report(KEYS[n]) for n in "ABCD"))
            await ctl.tick()
            rt = ctl.switches["s1"]
            assert cache_keys(env.sw) == set(rt.policy.resident_keys())
            assert cache_keys(env.sw) == {KEYS[n] for n in "ABCD"}
        finally:
            await ctl.stop()

    run(main())


def test_lru_evicts_the_older_chunk_with_drop_and_reuses_its_slots(env: Env) -> None:
    a, b = KEYS["A"], KEYS["B"]
    config = env.config(policy={"name": "lru"}, sram_budget_bytes=3 * F)

    async def main() -> None:
        ctl = await started(config)
        try:
            await post(ctl, report(a, t=time.time() - 2))
            await ctl.tick()
            slots_a = installed(env.sw)[a][0]
            await post(ctl, report(b))
            summary = (await ctl.tick())["s1"]
            assert summary.unloaded == {"drop": 1} and summary.loaded == 1
            assert served(env.sw, a) == ["miss"] * 3
            assert served(env.sw, b) == ["hit"] * 3
            assert installed(env.sw)[b][0] == slots_a
            assert sample(ctl, "kvcast_controller_evictions_total", switch="s1", action="drop") == 1
        finally:
            await ctl.stop()

    run(main())


def test_a_demoted_chunk_the_pool_lost_is_written_back(env: Env) -> None:
    a, b = KEYS["A"], KEYS["B"]
    config = env.config(policy={"name": "lru"}, sram_budget_bytes=3 * F)

    async def main() -> None:
        ctl = await started(config, BackendChunkSource(env.backend))
        try:
            await post(ctl, report(a, t=time.time() - 3))
            await ctl.tick()
            await post(ctl, report(a, hit=True, t=time.time() - 2))  # a hit while resident
            await ctl.tick()
            env.backend.delete(TENANT, a)
            await post(ctl, report(b))
            summary = (await ctl.tick())["s1"]
            assert summary.unloaded == {"demote": 1}
            assert env.backend.get(TENANT, a) == chunk_bytes(a, SIZE)
            status = ctl.status()["switches"]["s1"]
            (demotion,) = status["recent_demotions"]
            assert demotion["in_pool"] and demotion["written_back"]
            assert (
                sample(ctl, "kvcast_controller_evictions_total", switch="s1", action="demote") == 1
            )
        finally:
            await ctl.stop()

    run(main())


def test_a_demote_that_kvp_cannot_return_is_counted(env: Env) -> None:
    a, b = KEYS["A"], KEYS["B"]
    config = env.config(policy={"name": "lru"}, sram_budget_bytes=3 * F)

    async def main() -> None:
        ctl = await started(config)
        try:
            await post(ctl, report(a, t=time.time() - 3))
            await ctl.tick()
            await post(ctl, report(a, hit=True, t=time.time() - 2))
            await ctl.tick()
            env.backend.delete(TENANT, a)
            await post(ctl, report(b))
            await ctl.tick()
            assert sample(ctl, "kvcast_controller_demotions_unreturned_total", switch="s1") == 1
            (demotion,) = ctl.status()["switches"]["s1"]["recent_demotions"]
            assert demotion["in_pool"] is False and "no PUT" in demotion["error"]
        finally:
            await ctl.stop()

    run(main())


def test_a_chunk_the_pool_does_not_hold_is_not_asked_for_again_at_once(env: Env) -> None:
    ghost = 0x7777_0000_0000_0001

    async def main() -> None:
        ctl = await started(env.config())
        try:
            await post(ctl, report(ghost, hit=None))
            summary = (await ctl.tick())["s1"]
            assert summary.skipped == {"not_in_pool": 1} and summary.loaded == 0
            assert (await ctl.tick())["s1"].skipped == {}  # backing off
            env.backend.put(TENANT, ghost, chunk_bytes(ghost, SIZE))
            await post(ctl, report(ghost, hit=False))  # a host fetched it: try again
            assert (await ctl.tick())["s1"].loaded == 1
            assert served(env.sw, ghost) == ["hit"] * 3
        finally:
            await ctl.stop()

    run(main())


def test_what_does_not_fit_is_skipped_and_loaded_once_room_exists(env: Env) -> None:
    a, b = KEYS["A"], KEYS["B"]

    async def main() -> None:
        ctl = await started(env.config())
        rt = ctl.switches["s1"]
        try:
            # Someone else holds all but two slots: the policy's budget is not the SRAM left.
            rt.loader.allocator.reserve(0, c.NUM_FRAG_SLOTS - 2)
            await post(ctl, report(a), report(b))
            summary = (await ctl.tick())["s1"]
            assert summary.skipped == {"no_fit": 2} and cache_keys(env.sw) == set()
            rt.loader.allocator.free_range(SlotRange(0, c.NUM_FRAG_SLOTS - 2))
            summary = (await ctl.tick())["s1"]
            assert summary.loaded == 2 and cache_keys(env.sw) == {a, b}
        finally:
            await ctl.stop()

    run(main())


def test_dry_run_decides_but_never_changes_the_cache(env: Env) -> None:
    config = env.config(policy={"name": "kvcast", "dry_run": True})

    async def main() -> None:
        ctl = await started(config)
        try:
            await post(ctl, report(KEYS["A"]), report(KEYS["B"]))
            summary = (await ctl.tick())["s1"]
            assert summary.admitted == 2 and not summary.applied
            assert cache_keys(env.sw) == set()
            assert sample(ctl, "kvcast_controller_decisions_total", switch="s1", kind="admit") == 2
            assert sample(ctl, "kvcast_controller_loads_total", switch="s1") == 0
            assert served(env.sw, KEYS["A"]) == ["miss"] * 3
        finally:
            await ctl.stop()

    run(main())


def test_min_accesses_keeps_chunks_used_once_out_of_the_policy(env: Env) -> None:
    a, b = KEYS["A"], KEYS["B"]
    config = env.config(policy={"name": "kvcast", "min_accesses": 2})

    async def main() -> None:
        ctl = await started(config)
        rt = ctl.switches["s1"]
        try:
            await post(ctl, report(a, hit=None), report(b, hit=None))
            summary = (await ctl.tick())["s1"]
            assert summary.accesses == {} and cache_keys(env.sw) == set()
            assert sample(ctl, "kvcast_controller_accesses_held_total", switch="s1") == 2
            await post(ctl, report(a))  # a is reused: both its accesses reach the policy
            summary = (await ctl.tick())["s1"]
            assert summary.accesses == {"report": 2} and summary.loaded == 1
            assert cache_keys(env.sw) == {a} and b not in rt.policy.resident_keys()
            await post(ctl, report(a, hit=True))  # known now: passes at once
            assert (await ctl.tick())["s1"].accesses == {"report": 1}
        finally:
            await ctl.stop()

    run(main())


def test_learned_admission_holds_one_off_chunks_back_once_the_reports_say_so(env: Env) -> None:
    config = env.config(policy={"name": "kvcast", "min_accesses": "auto"})

    async def main() -> None:
        ctl = await started(config)
        rt = ctl.switches["s1"]
        try:
            await post(ctl, report(KEYS["A"]))  # nothing learned yet: admitted at once
            assert (await ctl.tick())["s1"].loaded == 1
            assert sample(ctl, "kvcast_controller_min_accesses", switch="s1") == 1
            # The reports then show 300 chunks used once and none used again: a load would
            # never pay, so new chunks are held back.
            for key in range(300):
                rt.admission.observe(0x7000 + key)
            await post(ctl, report(KEYS["B"], hit=None))
            summary = (await ctl.tick())["s1"]
            assert summary.accesses == {} and KEYS["B"] not in cache_keys(env.sw)
            assert sample(ctl, "kvcast_controller_min_accesses", switch="s1") > 1
        finally:
            await ctl.stop()

    run(main())


def test_a_failing_policy_is_logged_as_a_tick_error_and_the_next_tick_recovers(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def main() -> None:
        ctl = await started(env.config())
        rt = ctl.switches["s1"]
        try:
            await post(ctl, report(KEYS["A"]))

            def broken(now: float) -> object:
                raise RuntimeError("policy bug")

            with monkeypatch.context() as patch:
                patch.setattr(rt.policy, "on_tick", broken)
                assert (await ctl.tick())["s1"].errors == 1
            assert cache_keys(env.sw) == set()
            assert (await ctl.tick())["s1"].loaded == 1  # recorded before the failure
        finally:
            await ctl.stop()

    run(main())


# ---------------------------------------------------------------------- switch inputs
def test_counter_hits_no_host_reported_become_observer_accesses(env: Env) -> None:
    a = KEYS["A"]

    async def main() -> None:
        ctl = await started(env.config())
        try:
            await post(ctl, report(a))
            await ctl.tick()
            for _ in range(2):  # two whole fetches nobody reports
                assert served(env.sw, a) == ["hit"] * 3
            first = (await ctl.tick())["s1"]  # counters read; reports get one tick to arrive
            second = (await ctl.tick())["s1"]
            assert "counter" not in first.accesses
            assert second.accesses == {"counter": 2}
            assert sample(ctl, "kvcast_controller_hits_total", switch="s1", source="counter") == 2
            assert (await ctl.tick())["s1"].accesses == {}
        finally:
            await ctl.stop()

    run(main())


def test_counter_hits_that_hosts_reported_are_not_counted_twice(env: Env) -> None:
    a = KEYS["A"]

    async def main() -> None:
        ctl = await started(env.config())
        try:
            await post(ctl, report(a))
            await ctl.tick()
            assert served(env.sw, a) == ["hit"] * 3
            await post(ctl, report(a, hit=True))
            for _ in range(3):
                summary = (await ctl.tick())["s1"]
                assert "counter" not in summary.accesses
            assert sample(ctl, "kvcast_controller_hits_total", switch="s1", source="report") == 1
        finally:
            await ctl.stop()

    run(main())


def test_a_hot_miss_digest_of_an_unreported_key_gets_it_loaded(env: Env) -> None:
    a = KEYS["A"]
    config = env.config(sketch={"window_s": 3600, "threshold": 2})

    async def main() -> None:
        ctl = await started(config)
        rt = ctl.switches["s1"]
        try:
            for _ in range(2):
                assert get(env.sw, a, 0) == "miss"
            for _ in range(200):  # the digest crosses the P4Runtime stream: wait for it
                if rt.digests:
                    break
                await asyncio.sleep(0.01)
            summary = (await ctl.tick())["s1"]
            assert summary.accesses == {"digest": 2} and summary.loaded == 1
            assert served(env.sw, a) == ["hit"] * 3  # its length came from the pool
            assert sample(ctl, "kvcast_controller_digests_total", switch="s1", kind="unexplained")
        finally:
            await ctl.stop()

    run(main())


def test_reports_from_unknown_hosts_are_refused_and_the_daemon_carries_on(env: Env) -> None:
    async def main() -> None:
        ctl = await started(env.config())
        try:
            stranger = AccessReport(TENANT, KEYS["A"], SIZE, "h99", time.time(), False)
            code, doc = await post(ctl, stranger)
            assert code == 400 and "unknown host 'h99'" in doc["error"]
            assert (await post(ctl, report(KEYS["A"])))[0] == 202
            assert (await ctl.tick())["s1"].loaded == 1
            assert sample(ctl, "kvcast_controller_report_requests_total", code="400") == 1
        finally:
            await ctl.stop()

    run(main())


def test_without_configured_hosts_any_reporter_is_accepted(env: Env) -> None:
    async def main() -> None:
        ctl = await started(env.config(hosts=[]))
        try:
            for name in ("alpha", "beta", 7):
                r = AccessReport(TENANT, KEYS["A"], SIZE, name, time.time(), False)
                assert (await post(ctl, r))[0] == 202
                await ctl.tick()
            assert cache_keys(env.sw) == {KEYS["A"]}
        finally:
            await ctl.stop()

    run(main())


def test_report_times_in_the_future_are_clamped_and_counted(env: Env) -> None:
    async def main() -> None:
        ctl = await started(env.config())
        try:
            await post(ctl, report(KEYS["A"], t=time.time() + 3600))
            assert (await ctl.tick())["s1"].loaded == 1
            assert sample(ctl, "kvcast_controller_report_clock_skew_total") == 1
        finally:
            await ctl.stop()

    run(main())


# ---------------------------------------------------------------------- restarts
def test_a_restarted_controller_adopts_the_cache_without_orphans_or_duplicates(env: Env) -> None:
    a, b, z = KEYS["A"], KEYS["B"], KEYS["C"]
    config = env.config()

    async def first() -> None:
        ctl = await started(config)
        try:
            await post(ctl, report(a), report(b))
            await ctl.tick()
        finally:
            await ctl.stop()

    run(first())
    before = installed(env.sw)
    assert set(before) == {a, b}
    # While no controller is connected, someone leaves an orphan route behind.
    env.sw.state.insert_entry(
        T_LPM,
        [Lpm(0x0A090909, 32)],
        ActionCall(c.ACTION_INGRESS_FORWARDING_ROUTE, {"port": 9, "smac": 1, "dmac": 2}),
    )
    mark = env.sw.mark()
    writes_before = len(env.sw.packet_outs)

    async def second() -> None:
        ctl = await started(config)
        rt = ctl.switches["s1"]
        try:
            summary = (await ctl.tick())["s1"]
            assert summary.accesses == {"adopted": 2}
            assert summary.loaded == 0 and summary.unloaded == {}
            # A status of a tick after the session's re-install says so, and counts the adopted.
            status = ctl.status()["switches"]["s1"]
            assert (status["generation"], status["synced_generation"]) == (1, 1)
            assert status["resident_chunks"] == 2
            assert installed(env.sw) == before  # same slots, same epochs: nothing reloaded
            assert len(env.sw.packet_outs) == writes_before  # no WRITE was sent
            assert set(rt.policy.resident_keys()) == {a, b}
            assert served(env.sw, a) == ["hit"] * 3 and served(env.sw, b) == ["hit"] * 3
            # The orphan route is gone; the configured ones are there once each.
            routes = [e.match for e in env.sw.state.entries(T_LPM)]
            assert sorted(routes, key=repr) == sorted(
                [(Lpm(int(IPv4Address(ip)), 32),) for ip in (HOST_IP, POOL_IP)], key=repr
            )  # the host and the pool node, once each
            assert env.sw.pipeline_pushes(mark) == []
            # A new chunk goes into free slots: the adopted ones keep their bytes.
            await post(ctl, report(z))
            assert (await ctl.tick())["s1"].loaded == 1
            for key in (a, b, z):
                assert served(env.sw, key) == ["hit"] * 3
            assert cache_keys(env.sw) == {a, b, z} == set(rt.policy.resident_keys())
        finally:
            await ctl.stop()

    run(second())


def test_a_restarted_controller_evicts_adopted_chunks_its_policy_does_not_want(
    env: Env,
) -> None:
    keys = [KEYS[n] for n in "ABCD"]

    async def first() -> None:
        ctl = await started(env.config())
        try:
            await post(ctl, *(report(k) for k in keys))
            await ctl.tick()
        finally:
            await ctl.stop()

    run(first())
    assert cache_keys(env.sw) == set(keys)

    async def second() -> None:
        # Half the budget: the new policy keeps two of the four adopted chunks.
        ctl = await started(env.config(sram_budget_bytes=2 * 3 * F))
        rt = ctl.switches["s1"]
        try:
            summary = (await ctl.tick())["s1"]
            assert summary.unloaded == {"drop": 2}
            kept = cache_keys(env.sw)
            assert len(kept) == 2 and kept == set(rt.policy.resident_keys())
            for key in kept:
                assert served(env.sw, key) == ["hit"] * 3
            assert rt.loader.allocator.stats().used == 2 * 3
        finally:
            await ctl.stop()

    run(second())


def test_a_restarted_switch_gets_its_chunks_and_base_state_back(env: Env) -> None:
    a = KEYS["A"]

    async def main() -> None:
        ctl = await started(env.config())
        rt = ctl.switches["s1"]
        try:
            await post(ctl, report(a))
            await ctl.tick()
            generation = rt.client.generation
            env.sw.restart()
            await rt.client.wait_synced(generation, timeout=10)
            assert served(env.sw, a) == ["hit"] * 3
            assert served(env.sw, KEYS["B"]) == ["miss"] * 3  # routes and pool owners are back
        finally:
            await ctl.stop()

    run(main())


def test_an_adopted_chunk_lost_in_a_switch_restart_is_reloaded_from_the_pool(env: Env) -> None:
    a = KEYS["A"]

    async def first() -> None:
        ctl = await started(env.config())
        try:
            await post(ctl, report(a))
            await ctl.tick()
        finally:
            await ctl.stop()

    run(first())

    async def second() -> None:
        ctl = await started(env.config())
        rt = ctl.switches["s1"]
        try:
            await ctl.tick()  # adopted, bytes unknown
            generation = rt.client.generation
            env.sw.restart()
            await rt.client.wait_synced(generation, timeout=10)
            assert sample(ctl, "kvcast_controller_chunks_lost_total", switch="s1") == 1
            summary = (await ctl.tick())["s1"]
            assert summary.loaded == 1  # its length probed, its bytes read from the pool
            assert served(env.sw, a) == ["hit"] * 3
        finally:
            await ctl.stop()

    run(second())


def stored(key: int) -> AccessReport:
    """What a host's producer path reports after putting chunk ``key`` into the pool."""
    return AccessReport(TENANT, key, SIZE, "h1", time.time(), event="stored")


def test_a_stored_record_alone_is_no_access_and_loads_nothing(env: Env) -> None:
    async def main() -> None:
        ctl = await started(env.config())
        try:
            assert (await post(ctl, stored(KEYS["A"])))[0] == 202
            summary = (await ctl.tick())["s1"]
            assert summary.accesses == {} and summary.loaded == 0
            assert cache_keys(env.sw) == set()
            assert sample(ctl, "kvcast_controller_chunks_stored_reported_total") == 1
        finally:
            await ctl.stop()

    run(main())


def test_a_stored_record_ends_the_wait_for_a_chunk_the_pool_lacked(env: Env) -> None:
    key = KEYS["H"] + 1  # not in the pool yet

    async def main() -> None:
        ctl = await started(env.config())  # the pool is asked again after max(30 s, 10 ticks)
        try:
            assert (await post(ctl, report(key)))[0] == 202
            assert (await ctl.tick())["s1"].loaded == 0  # nothing to read from the pool
            assert (await ctl.tick())["s1"].loaded == 0  # and not asked again so soon
            env.backend.put(TENANT, key, chunk_bytes(key, SIZE))  # the host's put ...
            assert (await post(ctl, stored(key)))[0] == 202  # ... and its report
            summary = (await ctl.tick())["s1"]
            assert "report" not in summary.accesses and summary.loaded == 1
            assert served(env.sw, key) == ["hit"] * 3
        finally:
            await ctl.stop()

    run(main())


# ---------------------------------------------------------------------- security base state
def test_host_ports_are_bound_unknown_ports_denied_and_groups_served_to_pools(env: Env) -> None:
    from poolnode.groups import GroupRegistry
    from poolnode.tenants import SourceTenants

    async def main() -> None:
        host = {"name": "h1", "ip": HOST_IP, "mac": HOST_MAC, "port": HOST_PORT}
        ctl = await started(env.config(hosts=[{**host, "tenants": [TENANT]}]))
        try:
            st = env.sw.state
            bind, _ = st.lookup(c.TABLE_INGRESS_PORT_ROLE_PORT_ROLE, (HOST_PORT,))
            assert bind == ActionCall(
                c.ACTION_INGRESS_PORT_ROLE_BIND_HOST,
                {"addr": int(IPv4Address(HOST_IP)), "check_tenant": 1},
            )
            pool, _ = st.lookup(c.TABLE_INGRESS_PORT_ROLE_PORT_ROLE, (POOL_PORT,))
            assert pool.params == {"role": c.PORT_ROLE_POOL}
            unknown, _ = st.lookup(c.TABLE_INGRESS_PORT_ROLE_PORT_ROLE, (HOST_PORT + 40,))
            assert unknown.params == {"role": c.PORT_ROLE_DENY}
            tenant_ok, _ = st.lookup(c.TABLE_INGRESS_PORT_ROLE_TENANT_BINDING, (HOST_PORT, TENANT))
            assert tenant_ok.action == c.ACTION_INGRESS_PORT_ROLE_TENANT_OK
            other, _ = st.lookup(c.TABLE_INGRESS_PORT_ROLE_TENANT_BINDING, (HOST_PORT, TENANT + 1))
            assert other.action == c.ACTION_INGRESS_PORT_ROLE_TENANT_DENIED

            address = ctl.report_address
            assert address is not None
            url = f"http://{address[0]}:{address[1]}/v1/groups/s1"
            registry = GroupRegistry(url, min_refresh_s=0.0)
            assert await asyncio.to_thread(registry.refresh) and registry.groups == frozenset()
            gid = await ctl.switches["s1"].multicast.group_for(["h1"])
            # A group made after the last read is found by the read on demand.
            assert await asyncio.to_thread(registry.allows, gid)
            assert not await asyncio.to_thread(registry.allows, gid + 1)
            member, _ = st.lookup(c.TABLE_INGRESS_PORT_ROLE_GROUP_MEMBER, (gid, HOST_PORT))
            assert member.action == c.ACTION_INGRESS_PORT_ROLE_MEMBER

            # What the switch vouches for, served to pool nodes (--source-tenants-url).
            url = f"http://{address[0]}:{address[1]}/v1/sources"
            sources = await asyncio.to_thread(SourceTenants.fetch, url)
            host_ip = int(IPv4Address(HOST_IP))
            assert sources.allows(host_ip, TENANT) and not sources.allows(host_ip, TENANT + 1)
        finally:
            await ctl.stop()

    run(main())


def test_a_host_of_any_tenant_is_marked_in_the_status_and_the_metrics(env: Env) -> None:
    async def main() -> None:
        host = {"name": "h1", "ip": HOST_IP, "mac": HOST_MAC, "port": HOST_PORT}
        ctl = await started(env.config(hosts=[{**host, "tenants": "any"}]))
        try:
            assert ctl.status()["unisolated"] == [{"setting": "tenants_any", "name": "h1"}]
            marked = "kvcast_controller_unisolated"
            assert sample(ctl, marked, setting="tenants_any", node="h1") == 1
            # Its port is bound to its address, with no tenant check.
            bind, _ = env.sw.state.lookup(c.TABLE_INGRESS_PORT_ROLE_PORT_ROLE, (HOST_PORT,))
            assert bind.params == {"addr": int(IPv4Address(HOST_IP)), "check_tenant": 0}
        finally:
            await ctl.stop()
        secure = await started(env.config())
        try:
            assert secure.status()["unisolated"] == []
            assert b"kvcast_controller_unisolated{" not in secure.metrics.exposition()
        finally:
            await secure.stop()

    run(main())
