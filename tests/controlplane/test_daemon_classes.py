"""The controller's KV classes end to end, against the in-process reference switch.

Declared (a record's ``class``, ``POST /v1/classes``) and detected static chunks stay in SRAM
while transient ones are evicted, and the per-class figures are counted.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import urllib.error
import urllib.request
from typing import Any

from controlplane.daemon import Controller
from kvcast.kvclass import KvClass

from .test_daemon import (
    KEYS,
    SIZE,
    TENANT,
    Env,
    F,
    env_fixture,  # noqa: F401 - provides the env fixture
    post,
    report,
    sample,
    served,
    started,
)
from .test_p4rt_harness import (
    HOST_IP,
    HOST_MAC,
    refswitch_fixture,  # noqa: F401 - provides the refswitch fixture
    run,
)


def http(
    ctl: Controller, method: str, path: str, doc: object = None, timeout_s: float = 5.0
) -> tuple[int, Any]:
    address = ctl.report_address
    assert address is not None
    data = None if doc is None else json.dumps(doc).encode()
    req = urllib.request.Request(f"http://{address[0]}:{address[1]}{path}", data, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as reply:
            return int(reply.status), json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return int(exc.code), json.loads(exc.read())


def test_a_transient_chunk_is_evicted_before_an_older_static_one(env: Env) -> None:
    a, b, cc = KEYS["A"], KEYS["B"], KEYS["C"]
    config = env.config(
        policy={"name": "lru", "min_accesses": 1}, sram_budget_bytes=6 * F
    )  # room for two chunks of three fragments

    async def main() -> None:
        ctl = await started(config)
        try:
            now = time.time()
            static_a = dataclasses.replace(report(a, t=now - 10), kv_class=KvClass.STATIC)
            assert (await post(ctl, static_a, report(b, t=now - 5)))[0] == 202
            assert (await ctl.tick())["s1"].loaded == 2
            # C is the newest: LRU alone would evict A, the oldest; A is static.
            assert (await post(ctl, report(cc, t=now, hit=None)))[0] == 202
            summary = (await ctl.tick())["s1"]
            assert summary.unloaded == {"drop": 1} and summary.loaded == 1
            assert served(env.sw, a) == ["hit"] * 3
            assert served(env.sw, b) == ["miss"] * 3
            assert served(env.sw, cc) == ["hit"] * 3
            ev = "kvcast_controller_class_evictions_total"
            assert sample(ctl, ev, switch="s1", **{"class": "transient"}) == 1
            assert sample(ctl, ev, switch="s1", **{"class": "static"}) == 0
            figures = ctl.status()["switches"]["s1"]["classes"]
            assert figures["static"]["accesses"] == 1 and figures["transient"]["accesses"] == 2
            assert figures["transient"]["evictions"] == 1 and figures["static"]["evictions"] == 0
            assert figures["static"]["resident_bytes"] == 3 * F
            assert figures["transient"]["resident_bytes"] == 3 * F
            assert figures["static"]["load_bytes"] > 0
            gauge = "kvcast_controller_class_resident_bytes"
            assert sample(ctl, gauge, switch="s1", **{"class": "static"}) == 3 * F
        finally:
            await ctl.stop()

    run(main())


def test_hits_are_counted_per_class(env: Env) -> None:
    a, b = KEYS["A"], KEYS["B"]
    config = env.config(policy={"name": "lru", "min_accesses": 1})

    async def main() -> None:
        ctl = await started(config)
        try:
            static_hit = dataclasses.replace(report(a, hit=True), kv_class=KvClass.STATIC)
            await post(ctl, static_hit, static_hit, report(b, hit=True), report(b, hit=False))
            await ctl.tick()
            hits = "kvcast_controller_class_hits_total"
            assert sample(ctl, hits, switch="s1", **{"class": "static"}) == 2
            assert sample(ctl, hits, switch="s1", **{"class": "transient"}) == 1
            accesses = "kvcast_controller_class_accesses_total"
            assert sample(ctl, accesses, switch="s1", **{"class": "transient"}) == 2
        finally:
            await ctl.stop()

    run(main())


def test_the_class_api_declares_lists_and_refuses_bad_input(env: Env) -> None:
    a = KEYS["A"]

    async def main() -> None:
        ctl = await started(env.config())
        try:
            doc = {"tenant": 5, "keys": [f"{a:#x}"], "class": "static", "ttl_s": 60}
            assert await asyncio.to_thread(http, ctl, "POST", "/v1/classes", doc) == (
                200,
                {"declared": 1, "class": "static"},
            )
            await ctl.tick()
            assert ctl.switches["s1"].policy.kv_class(a) is KvClass.STATIC
            code, listing = await asyncio.to_thread(http, ctl, "GET", "/v1/classes")
            assert code == 200 and [e["key"] for e in listing["static"]] == [f"{a:#x}"]
            assert listing["static"][0]["reason"] == "declared"
            for bad, field in (
                ({**doc, "class": "hot"}, "class: expected one of static, transient"),
                ({**doc, "keys": []}, "keys"),
                ({**doc, "keys": ["0xzz"]}, "keys[0]"),
                ({**doc, "tenant": -1}, "tenant"),
                ({**doc, "ttl_s": 0}, "ttl_s"),
                ({**doc, "colour": 1}, "unknown field 'colour'"),
            ):
                code, answer = await asyncio.to_thread(http, ctl, "POST", "/v1/classes", bad)
                assert code == 400 and field in answer["error"], (bad, answer)
            declarations = "kvcast_controller_class_declarations_total"
            assert sample(ctl, declarations, code="400") == 6
            # Revoked: transient again at the next tick.
            revoke = {**doc, "class": "transient"}
            assert (await asyncio.to_thread(http, ctl, "POST", "/v1/classes", revoke))[0] == 200
            await ctl.tick()
            assert ctl.switches["s1"].policy.kv_class(a) is KvClass.TRANSIENT
        finally:
            await ctl.stop()

    run(main())


def test_a_prefix_reused_over_the_window_is_promoted_by_the_controller(env: Env) -> None:
    a = KEYS["A"]
    config = env.config(classes={"min_uses": 3, "window_s": 100.0, "min_span_s": 20.0})

    async def main() -> None:
        ctl = await started(config)
        try:
            now = time.time()
            await post(ctl, report(a, t=now - 30), report(a, t=now - 25))
            await ctl.tick()
            assert ctl.switches["s1"].policy.kv_class(a) is KvClass.TRANSIENT
            await post(ctl, report(a, t=now))  # the third use, 30 s after the first
            await ctl.tick()
            assert ctl.switches["s1"].policy.kv_class(a) is KvClass.STATIC
            promotions = "kvcast_controller_static_promotions_total"
            assert sample(ctl, promotions, reason="detected") == 1
            assert ctl.status()["static_chunks"] == 1
        finally:
            await ctl.stop()

    run(main())


def test_a_static_prefix_is_planned_once_to_each_host_of_its_tenant_and_counted(
    env: Env,
) -> None:
    a, b = KEYS["A"], KEYS["B"]
    hosts = [
        {"name": "h1", "ip": HOST_IP, "mac": HOST_MAC, "port": 1, "tenants": [TENANT]},
        {"name": "h2", "ip": "10.0.2.2", "mac": "00:00:00:00:02:02", "port": 2,
         "tenants": [TENANT]},
        {"name": "h3", "ip": "10.0.3.3", "mac": "00:00:00:00:03:03", "port": 3,
         "tenants": [TENANT + 1]},
    ]  # fmt: skip
    config = env.config(hosts=hosts, push={"budget_bytes_per_tick": 4 * SIZE})

    async def main() -> None:
        ctl = await started(config)
        try:
            now = time.time()
            ra = dataclasses.replace(report(a, t=now), kv_class=KvClass.STATIC)
            rb = dataclasses.replace(report(b, t=now), kv_class=KvClass.STATIC, parent=a)
            # h1 pulled both from the pool (hit False): 2 SIZE of the 4 SIZE budget are taken.
            await post(ctl, ra, rb)
            await ctl.tick()
            push = ctl.status()["switches"]["s1"]["last_push"]
            assert push["budget_bytes"] == 2 * SIZE
            assert (push["chunks"], push["deliveries"]) == (2, 2)  # to h2 only: h1 holds them,
            assert push["pool_bytes"] == push["unicast_bytes"] == 2 * SIZE  # h3 is another tenant
            assert sample(ctl, "kvcast_controller_push_pool_bytes_total", switch="s1") == 2 * SIZE
            await ctl.tick()  # nothing left to push
            assert ctl.status()["switches"]["s1"]["last_push"]["chunks"] == 0
            assert sample(ctl, "kvcast_controller_push_deliveries_total", switch="s1") == 2
        finally:
            await ctl.stop()

    run(main())


def test_a_static_chunk_passes_the_doorkeeper_at_its_first_use(env: Env) -> None:
    a, b = KEYS["A"], KEYS["B"]
    config = env.config(policy={"name": "lru", "min_accesses": 3})

    async def main() -> None:
        ctl = await started(config)
        try:
            static_a = dataclasses.replace(report(a), kv_class=KvClass.STATIC)
            await post(ctl, static_a, report(b))
            summary = (await ctl.tick())["s1"]
            assert summary.loaded == 1
            assert served(env.sw, a) == ["hit"] * 3 and served(env.sw, b) == ["miss"] * 3
        finally:
            await ctl.stop()

    run(main())
