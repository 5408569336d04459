"""The daemon sends its push orders to the engines, against fake OpenAI-compatible servers.

A static prefix registered with ``POST /v1/static`` is pushed to every host of its tenant that
has an ``engine_url``: one completions request per engine, ``max_tokens: 1``, the group fetch's
options, one multicast group of exactly those hosts on the (in-process reference) switch for
the order's life. Pushes are paced by the budget after the tick's pulls, never reach a host of
another tenant, a dead or hung engine never stalls a tick and is tried again later, and a host
that joins later gets the prefixes at the tick after its first report.
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from controlplane.configspec import DaemonConfig
from controlplane.daemon import Controller
from controlplane.push import PushOrder

from .fake_engine import FakeEngine
from .test_daemon import (
    SIZE,
    TENANT,
    Env,
    env_fixture,  # noqa: F401 - provides the env fixture
    post,
    report,
    sample,
)
from .test_daemon_classes import http
from .test_p4rt_harness import (
    HOST_IP,
    HOST_MAC,
    refswitch_fixture,  # noqa: F401 - provides the refswitch fixture
    run,
)

BPT = 1000  # KV bytes per token
PREFIX = 16  # tokens per prefix: 16,000 bytes
OTHER = TENANT + 1


@pytest.fixture(name="engines")
def engines_fixture() -> Iterator[dict[str, FakeEngine]]:
    engines = {name: FakeEngine() for name in ("h1", "h2", "h3")}
    yield engines
    for e in engines.values():
        e.close()


def dead_url() -> str:
    """A loopback URL nothing listens on (connections are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def push_config(env: Env, urls: dict[str, str], **push: Any) -> DaemonConfig:
    """h1 and h2 of TENANT, h3 of OTHER, each with the engine in ``urls`` (if any)."""
    hosts: list[dict[str, Any]] = [
        {"name": "h1", "ip": HOST_IP, "mac": HOST_MAC, "port": 1, "tenants": [TENANT]},
        {"name": "h2", "ip": "10.0.2.2", "mac": "00:00:00:00:02:02", "port": 2,
         "tenants": [TENANT]},
        {"name": "h3", "ip": "10.0.3.3", "mac": "00:00:00:00:03:03", "port": 3,
         "tenants": [OTHER]},
    ]  # fmt: skip
    for h in hosts:
        if h["name"] in urls:
            h["engine_url"] = urls[h["name"]]
    section = {"budget_bytes_per_tick": 4 * PREFIX * BPT, "bytes_per_token": BPT,
               "timeout_s": 10.0, "retry_s": 3600.0, "model": "m", **push}  # fmt: skip
    return env.config(hosts=hosts, push=section)


class Clock:
    """Wall time plus an offset the test moves forward."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


def play(
    config: DaemonConfig,
    scenario: Callable[[Controller], Awaitable[None]],
    clock: Clock | None = None,
) -> None:
    """Runs ``scenario`` against a started controller, then stops it."""

    async def main() -> None:
        ctl = Controller(config, clock=clock or Clock())
        await ctl.start()
        try:
            await ctl.wait_ready(10)
            await scenario(ctl)
        finally:
            await ctl.stop()

    run(main())


async def register(ctl: Controller, tokens: list[int], tenant: int = TENANT, **more: Any) -> str:
    code, doc = await asyncio.to_thread(
        http, ctl, "POST", "/v1/static", {"tenant": tenant, "tokens": tokens, **more}
    )
    assert code == 200, doc
    return str(doc["id"])


async def settled(ctl: Controller) -> None:
    """Waits until every push request sent has its answer (or failure)."""
    assert ctl.pusher is not None
    deadline = time.monotonic() + 10
    while ctl.pusher.inflight() and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert ctl.pusher.inflight() == 0


def requests(ctl: Controller, outcome: str) -> float:
    return sample(ctl, "kvcast_controller_push_requests_total", switch="s1", outcome=outcome)


def toks(base: int) -> list[int]:
    return list(range(base, base + PREFIX))


def test_a_prefix_goes_to_each_engine_of_its_tenant_once_as_one_group_fetch(
    env: Env, engines: dict[str, FakeEngine]
) -> None:
    config = push_config(env, {n: e.url for n, e in engines.items()})

    async def scenario(ctl: Controller) -> None:
        engines["h1"].hold.clear()  # the order stays in flight until released
        pid = await register(ctl, toks(100), cache_salt="salt-1")
        await ctl.tick()
        bodies = {n: e.wait_requests(1) for n, e in engines.items() if n != "h3"}
        groups = ctl.switches["s1"].multicast.groups()
        assert list(groups.values()) == [frozenset({"h1", "h2"})]  # exactly the targets
        (gid,) = groups
        for name, role in (("h1", "leader"), ("h2", "follower")):
            (body,) = bodies[name]
            assert body == {
                "model": "m",
                "prompt": toks(100),
                "max_tokens": 1,
                "temperature": 0.0,
                "cache_salt": "salt-1",
                "kv_transfer_params": {
                    "kvcast": {"save": False, "class": "static", "group": gid, "role": role}
                },
            }
        await ctl.tick()  # in flight: not sent again, the group stays
        assert ctl.switches["s1"].multicast.groups() == groups
        engines["h1"].hold.set()
        await settled(ctl)
        await ctl.tick()  # collected: counted, the group deleted
        assert ctl.switches["s1"].multicast.groups() == {}
        assert (requests(ctl, "sent"), requests(ctl, "succeeded")) == (2, 2)
        assert requests(ctl, "failed") == requests(ctl, "refused") == 0
        pushed = "kvcast_controller_push_prefix_pool_bytes_total"
        assert sample(ctl, pushed, switch="s1") == PREFIX * BPT  # one copy for two hosts
        await ctl.tick()
        assert [len(e.bodies()) for e in engines.values()] == [1, 1, 0]  # h3: other tenant
        code, listing = await asyncio.to_thread(http, ctl, "GET", "/v1/static", None)
        assert code == 200
        assert listing["prefixes"] == [
            {"id": pid, "tenant": TENANT, "tokens": PREFIX, "nbytes": PREFIX * BPT,
             "hosts": ["h1", "h2"]}
        ]  # fmt: skip

    play(config, scenario)


def test_a_tenants_prefix_never_reaches_a_host_of_another_tenant(
    env: Env, engines: dict[str, FakeEngine]
) -> None:
    config = push_config(env, {n: e.url for n, e in engines.items()})

    async def scenario(ctl: Controller) -> None:
        await register(ctl, toks(100))
        await register(ctl, toks(500), tenant=OTHER)
        await ctl.tick()
        await settled(ctl)
        await ctl.tick()
        assert [b["prompt"] for b in engines["h3"].bodies()] == [toks(500)]
        for name in ("h1", "h2"):
            assert [b["prompt"] for b in engines[name].bodies()] == [toks(100)]
        # h3 alone: no group, a plain leader's fetch.
        assert engines["h3"].bodies()[0]["kv_transfer_params"]["kvcast"] == {
            "save": False,
            "class": "static",
        }
        assert requests(ctl, "succeeded") == 3
        # An order naming a host of another tenant (a planner bug) is refused at sending.
        assert ctl.pusher is not None
        order = PushOrder(OTHER, 1, PREFIX * BPT, ("h1", "h3"))
        assert ctl.pusher.admit("s1", order) == ("h3",)
        assert requests(ctl, "refused") == 1

    play(config, scenario)


def test_pushes_take_only_what_the_ticks_pulls_left_of_the_budget(
    env: Env, engines: dict[str, FakeEngine]
) -> None:
    config = push_config(env, {"h1": engines["h1"].url}, budget_bytes_per_tick=2 * PREFIX * BPT)

    async def scenario(ctl: Controller) -> None:
        for base in (100, 200, 300):
            await register(ctl, toks(base))
        await post(ctl, report(0x77, hit=False))  # h1 read SIZE bytes from the pool
        await ctl.tick()
        assert len(engines["h1"].wait_requests(1)) == 1  # 2 prefixes less SIZE: one fits
        await settled(ctl)
        await ctl.tick()  # a quiet tick: the two others
        assert len(engines["h1"].wait_requests(3)) == 3
        await settled(ctl)
        await ctl.tick()
        assert len(engines["h1"].bodies()) == 3 and requests(ctl, "succeeded") == 3
        assert SIZE < PREFIX * BPT

    play(config, scenario)


def test_registrations_that_cannot_be_pushed_are_refused(
    env: Env, engines: dict[str, FakeEngine]
) -> None:
    config = push_config(env, {"h1": engines["h1"].url}, max_prefixes=1)

    async def scenario(ctl: Controller) -> None:
        cases: list[tuple[object, str]] = [
            ({"tenant": TENANT, "tokens": list(range(4 * PREFIX + 1))}, "budget"),
            ({"tenant": TENANT, "tokens": []}, "tokens"),
            ({"tenant": TENANT, "tokens": [1, -2]}, "tokens[1]"),
            ({"tenant": 1 << 16, "tokens": [1]}, "tenant"),
            ({"tenant": TENANT, "tokens": [1], "text": "hi"}, "'text'"),
        ]
        for doc, word in cases:
            code, answer = await asyncio.to_thread(http, ctl, "POST", "/v1/static", doc)
            assert code == 400 and word in answer["error"], (doc, answer)
        await register(ctl, toks(100))
        await register(ctl, toks(100))  # the same again: no change
        code, answer = await asyncio.to_thread(
            http, ctl, "POST", "/v1/static", {"tenant": TENANT, "tokens": toks(200)}
        )
        assert code == 503 and "max_prefixes" in answer["error"]
        reg = "kvcast_controller_static_registrations_total"
        assert sample(ctl, reg, code="400") == 5 and sample(ctl, reg, code="200") == 2

    play(config, scenario)


def test_a_dead_or_hung_engine_never_stalls_a_tick_and_is_tried_again_later(
    env: Env, engines: dict[str, FakeEngine]
) -> None:
    clock = Clock()
    urls = {"h1": engines["h1"].url, "h2": dead_url()}
    config = push_config(env, urls, retry_s=60.0, timeout_s=30.0)

    async def scenario(ctl: Controller) -> None:
        engines["h1"].hold.clear()  # h1 hangs, h2 refuses connections
        await register(ctl, toks(100))
        await ctl.tick()
        assert len(engines["h1"].wait_requests(1)) == 1
        await ctl.tick()  # returns while h1's request still hangs
        assert ctl.pusher is not None and ctl.pusher.inflight() == 1
        engines["h1"].status = 503  # when h1 answers, it fails too
        engines["h1"].hold.set()
        await settled(ctl)
        await ctl.tick()
        assert (requests(ctl, "sent"), requests(ctl, "failed")) == (2, 2)
        assert set(ctl.status()["push_engines"]["waiting"]) == {"h1", "h2"}
        await ctl.tick()  # both wait for their retry
        assert requests(ctl, "sent") == 2 and ctl.switches["s1"].multicast.groups() == {}
        engines["h1"].status = 200
        clock.offset += 61
        await ctl.tick()  # retried; h2 is still dead
        assert len(engines["h1"].wait_requests(2)) == 2
        await settled(ctl)
        await ctl.tick()
        assert (requests(ctl, "sent"), requests(ctl, "succeeded")) == (4, 1)
        assert requests(ctl, "failed") == 3
        assert set(ctl.status()["push_engines"]["waiting"]) == {"h2"}

    play(config, scenario, clock)


def test_a_host_that_joins_later_gets_its_tenants_prefixes_at_the_next_tick(
    env: Env, engines: dict[str, FakeEngine]
) -> None:
    config = push_config(env, {n: e.url for n, e in engines.items()})  # retry_s: an hour

    async def scenario(ctl: Controller) -> None:
        engines["h2"].status = 503  # h2's engine is not up yet
        await register(ctl, toks(100))
        await ctl.tick()
        await settled(ctl)
        await ctl.tick()
        assert requests(ctl, "failed") == 1 and requests(ctl, "succeeded") == 1
        engines["h2"].status = 200  # h2 comes up and reports for the first time
        h2 = dataclasses.replace(report(0x77), host="h2")
        assert (await post(ctl, h2))[0] == 202
        await ctl.tick()  # pushed at once, not an hour later
        bodies = engines["h2"].wait_requests(2)
        assert [b["prompt"] for b in bodies] == [toks(100)] * 2
        # Alone now: no group, h2 leads its own fetch.
        assert "group" not in bodies[1]["kv_transfer_params"]["kvcast"]
        await settled(ctl)
        await ctl.tick()
        assert requests(ctl, "succeeded") == 2
        assert len(engines["h1"].bodies()) == 1 and engines["h3"].bodies() == []
        await post(ctl, dataclasses.replace(report(0x78), host="h2"))
        await ctl.tick()  # a later report is no new join: nothing more
        assert requests(ctl, "sent") == 3

    play(config, scenario)


def test_without_engines_the_daemon_has_no_pusher_and_no_static_api(env: Env) -> None:
    async def scenario(ctl: Controller) -> None:
        assert ctl.pusher is None and ctl.status()["push_engines"] is None
        code, _ = await asyncio.to_thread(http, ctl, "GET", "/v1/static", None)
        assert code == 404

    play(env.config(), scenario)
