"""The daemon moves the trees and routes off a leaf-spine link it is told is down, and back.

Four reference-target switch processes (leaves s1 and s2, spines s3 and s4; the layout of
``test_daemon_fabric_trees``), started for real, are driven by one daemon, told of links over
its HTTP API (``POST /v1/fabric/links``) as an operator or a monitor would; the groups, group
members and routes are read back from each switch over P4Runtime.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from controlplane.daemon import Controller
from controlplane.fabric import LINKS_PATH

from .test_daemon import started
from .test_daemon_classes import http
from .test_daemon_fabric_trees import MAC, UP, Fabric, _mac, _rid, _sample, moves, two_trees
from .test_p4rt_harness import run


@pytest.fixture(name="fabric", scope="module")
def fabric_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fabric]:
    made = Fabric(tmp_path_factory.mktemp("fabric-link-switches"))
    yield made
    made.close()


async def link(ctl: Controller, leaf: str, spine: str, up: Any) -> tuple[int, Any]:
    """POSTs a link's state from another thread (the handler waits for the daemon's loop)."""
    doc = {"leaf": leaf, "spine": spine, "up": up}
    return await asyncio.to_thread(http, ctl, "POST", LINKS_PATH, doc, 60.0)


def _link_up(ctl: Controller, leaf: str, spine: str) -> float | None:
    return _sample(ctl, "kvcast_controller_fabric_link_up", leaf=leaf, spine=spine)


def test_a_link_down_moves_the_trees_and_routes_that_crossed_it_and_back_when_up(
    fabric: Fabric,
) -> None:
    async def main() -> None:
        ctl = await started(fabric.config)
        try:
            trees, g1, g2 = await two_trees(ctl)  # through s3 and s4
            assert fabric.groups("s3") == {g1: [(1, 0), (2, 0)]}
            assert fabric.route("s2", "h1") == (UP["s3"], _mac(MAC["s3"]))
            assert _link_up(ctl, "s2", "s3") == 1

            # s2-s3 down: g1 crossed it, so it goes through s4 (both leaves' groups switched to
            # their s4 uplink); s2's routes to s1's nodes, which crossed it, go through s4.
            assert await link(ctl, "s2", "s3", False) == (
                200,
                {"changed": True, "links_down": [{"leaf": "s2", "spine": "s3"}]},
            )
            assert moves(ctl, "link_down") == 1
            assert fabric.groups("s3") == {}
            assert fabric.groups("s4") == {g1: [(1, 0), (2, 0)], g2: [(1, 0), (2, 0)]}
            assert fabric.groups("s1")[g1] == sorted([(1, _rid(ctl, "h1")), (UP["s4"], 0)])
            assert fabric.groups("s2")[g1] == sorted([(1, _rid(ctl, "h3")), (UP["s4"], 0)])
            assert fabric.members("s1") == {(g1, 1), (g2, 2)}
            assert fabric.members("s2") == {(g1, 1), (g2, 2)}
            assert fabric.route("s2", "h1") == (UP["s4"], _mac(MAC["s4"]))
            assert fabric.route("s1", "h3") == (UP["s4"], _mac(MAC["s4"]))
            # Told again: nothing to move.
            assert (await link(ctl, "s2", "s3", False))[1]["changed"] is False
            assert moves(ctl, "link_down") == 1
            await ctl.tick()
            status = ctl.status()["fabric"]
            assert status["links_down"] == [{"leaf": "s2", "spine": "s3"}]
            assert status["trees_by_spine"] == {"s3": 0, "s4": 2}
            assert _link_up(ctl, "s2", "s3") == 0 and _link_up(ctl, "s1", "s3") == 1
            code, listed = await asyncio.to_thread(http, ctl, "GET", LINKS_PATH)
            assert code == 200
            assert [(x["leaf"], x["spine"]) for x in listed["links"] if not x["up"]] == [
                ("s2", "s3")
            ]

            # s1-s4 as well would leave s1 and s2 no spine between them: refused, nothing
            # moves; and s4's loss now would too: it stays in service.
            code, answer = await link(ctl, "s1", "s4", False)
            assert code == 409 and "s1" in answer["error"]
            assert trees.status()["links_down"] == [{"leaf": "s2", "spine": "s3"}]
            await trees.take_spine_down("s4")
            assert trees.status()["spines_down"] == [] and moves(ctl, "spine_down") is None
            assert fabric.route("s1", "h3") == (UP["s4"], _mac(MAC["s4"]))
            # What is not a link of the fabric, or not such a body, is refused.
            for leaf, spine, up in (("s1", "s2", False), ("s1", "s9", True), ("s1", "s3", 0)):
                assert (await link(ctl, leaf, spine, up))[0] == 400
            assert trees.status()["links_down"] == [{"leaf": "s2", "spine": "s3"}]

            # Up again: g1 and s2's routes spread back over s3.
            assert (await link(ctl, "s2", "s3", True))[0] == 200
            assert moves(ctl, "link_up") == 1
            assert fabric.groups("s3") == {g1: [(1, 0), (2, 0)]}
            assert fabric.groups("s4") == {g2: [(1, 0), (2, 0)]}
            assert fabric.groups("s1")[g1] == sorted([(1, _rid(ctl, "h1")), (UP["s3"], 0)])
            assert fabric.groups("s2")[g1] == sorted([(1, _rid(ctl, "h3")), (UP["s3"], 0)])
            assert fabric.route("s2", "h1") == (UP["s3"], _mac(MAC["s3"]))
            assert trees.status()["links_down"] == [] and _link_up(ctl, "s2", "s3") == 1
        finally:
            await ctl.stop()

    run(main(), limit_s=180)
