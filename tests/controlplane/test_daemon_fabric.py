"""One controller for a leaf-spine fabric: its configuration and the base state it installs.

Three in-process reference switches (leaves s1 and s2, spine s3) are programmed by one daemon;
a host's GET is then carried through the three pipelines by hand, switch to switch, and must
reach the pool node under the other leaf, and the pool's DATA must come back.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from controlplane.config import parse_config
from controlplane.configspec import DaemonConfig
from controlplane.errors import ConfigError
from kvcast import p4constants as c
from kvcast import wire
from kvcast.wire import mac_int

from .test_daemon import started
from .test_p4rt_harness import RefSwitch, run

T_LPM = c.TABLE_INGRESS_FORWARDING_IPV4_LPM
T_ROLE = c.TABLE_INGRESS_PORT_ROLE_PORT_ROLE
MAC = {"s1": "02:00:00:00:00:01", "s2": "02:00:00:00:00:02", "s3": "02:00:00:00:00:03"}
H1 = ("10.0.0.1", "00:00:00:00:00:01")  # s1 port 1
H2 = ("10.0.0.2", "00:00:00:00:00:02")  # s2 port 1
P1 = ("10.0.1.1", "00:00:00:00:01:01")  # s1 port 2
UPLINK = 3  # each leaf's port to the spine; the spine's port l faces leaf l
TENANT = 4
SERVICE_IP = "10.0.100.1"


def fabric_config(addresses: dict[str, str], **overrides: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "switches": [
            {"name": "s1", "address": addresses["s1"], "router_mac": MAC["s1"]},
            {"name": "s2", "address": addresses["s2"], "router_mac": MAC["s2"]},
            {"name": "s3", "address": addresses["s3"], "router_mac": MAC["s3"], "role": "spine"},
        ],
        "fabric_links": [
            {"leaf": "s1", "leaf_port": UPLINK, "spine": "s3", "spine_port": 1},
            {"leaf": "s2", "leaf_port": UPLINK, "spine": "s3", "spine_port": 2},
        ],
        "pools": [{"name": "p1", "ip": P1[0], "mac": P1[1], "port": 2, "switch": "s1"}],
        "hosts": [
            {
                "name": "h1",
                "ip": H1[0],
                "mac": H1[1],
                "port": 1,
                "switch": "s1",
                "tenants": [TENANT],
            },
            {
                "name": "h2",
                "ip": H2[0],
                "mac": H2[1],
                "port": 1,
                "switch": "s2",
                "tenants": [TENANT],
            },
        ],  # fmt: skip
        "tick_s": 3600,
        "metrics": None,
        "report_api": {"listen": "127.0.0.1:0"},
    }
    raw.update(overrides)
    return raw


@pytest.fixture(name="switches")
def switches_fixture() -> Iterator[dict[str, RefSwitch]]:
    made = {name: RefSwitch() for name in ("s1", "s2", "s3")}
    yield made
    for sw in made.values():
        sw.stop()


def _config(switches: dict[str, RefSwitch], **overrides: Any) -> DaemonConfig:
    return parse_config(fabric_config({n: sw.address for n, sw in switches.items()}, **overrides))


def _route(sw: RefSwitch, ip: str) -> tuple[int, int]:
    call, _ = sw.state.lookup(T_LPM, (int.from_bytes(wire.ip_bytes(ip), "big"),))
    assert call.action == c.ACTION_INGRESS_FORWARDING_ROUTE, (ip, call)
    return call.params["port"], call.params["dmac"]


def _role(sw: RefSwitch, port: int) -> tuple[str, int | None]:
    call, _ = sw.state.lookup(T_ROLE, (port,))
    return call.action, call.params.get("role")


def test_the_daemon_routes_every_node_through_the_fabric(switches: dict[str, RefSwitch]) -> None:
    async def main() -> None:
        ctl = await started(_config(switches))
        await ctl.stop()

    run(main())
    s1, s2, s3 = switches["s1"], switches["s2"], switches["s3"]
    # A leaf: its own nodes straight out, the others up to the spine (next hop: its MAC).
    assert _route(s1, H1[0]) == (1, mac_int(H1[1]))
    assert _route(s1, H2[0]) == (UPLINK, mac_int(MAC["s3"]))
    assert _route(s2, P1[0]) == (UPLINK, mac_int(MAC["s3"]))
    # The spine: down to each node's leaf.
    assert _route(s3, H1[0]) == (1, mac_int(MAC["s1"]))
    assert _route(s3, H2[0]) == (2, mac_int(MAC["s2"]))
    assert _route(s3, P1[0]) == (1, mac_int(MAC["s1"]))
    # Fabric ports are trusted as a fabric switch's; everything else on the spine is denied.
    pool_role = (c.ACTION_INGRESS_PORT_ROLE_SET_PORT_ROLE, c.PORT_ROLE_POOL)
    assert _role(s1, UPLINK) == _role(s3, 1) == _role(s3, 2) == pool_role
    assert _role(s3, 7) == (c.ACTION_INGRESS_PORT_ROLE_SET_PORT_ROLE, c.PORT_ROLE_DENY)
    assert _role(s2, 1)[0] == c.ACTION_INGRESS_PORT_ROLE_BIND_HOST


def test_a_get_crosses_the_programmed_fabric_to_the_pool_and_its_data_comes_back(
    switches: dict[str, RefSwitch],
) -> None:
    async def main() -> None:
        ctl = await started(_config(switches))
        await ctl.stop()

    run(main())
    s1, s2, s3 = switches["s1"], switches["s2"], switches["s3"]
    get = wire.udp_frame(
        H2[1], MAC["s2"], H2[0], SERVICE_IP, 40000, c.KVP_UDP_PORT,
        wire.get_message(TENANT, 0x77, 0, req_id=1, flags=c.KVP_FLAG_NOCACHE),
    )  # fmt: skip
    (up,) = s2.process(1, get)
    assert up.port == UPLINK
    (across,) = s3.process(2, up.frame)
    assert across.port == 1
    (to_pool,) = s1.process(UPLINK, across.frame)
    assert to_pool.port == 2 and to_pool.frame[30:34] == wire.ip_bytes(P1[0])
    data = wire.udp_frame(
        P1[1], MAC["s1"], P1[0], H2[0], c.KVP_UDP_PORT, 40000,
        wire.data_message(TENANT, 0x77, 0, 1, b"kv"),
    )  # fmt: skip
    (back_up,) = s1.process(2, data)
    assert back_up.port == UPLINK
    (back_across,) = s3.process(1, back_up.frame)
    assert back_across.port == 2
    (home,) = s2.process(UPLINK, back_across.frame)
    assert home.port == 1 and home.frame[0:6] == wire.mac_bytes(H2[1])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"fabric_links": []}, "no link between leaf and spine"),
        ({"fabric_links": [{"leaf": "s3", "leaf_port": 1, "spine": "s1", "spine_port": 3}]},
         "is not a switch with role leaf"),
        ({"hosts": [{"name": "h9", "ip": "10.0.0.9", "mac": "00:00:00:00:00:09", "port": 5,
                     "switch": "s3", "tenants": [1]}]}, "is a spine"),
        ({"fabric_links": [{"leaf": "s1", "leaf_port": 3, "spine": "s3", "spine_port": 1}] * 2},
         "leaf-spine pair"),
    ],
)  # fmt: skip
def test_a_configuration_that_is_no_fabric_is_refused(change: dict[str, Any], message: str) -> None:
    addresses = {n: f"127.0.0.1:{9000 + i}" for i, n in enumerate(("s1", "s2", "s3"))}
    with pytest.raises(ConfigError, match=message):
        parse_config(fabric_config(addresses, **change))


def test_links_without_a_spine_are_refused() -> None:
    raw = fabric_config({n: "127.0.0.1:9559" for n in ("s1", "s2", "s3")})
    raw["switches"][2].pop("role")
    with pytest.raises(ConfigError, match="'s3' is not a switch with role spine"):
        parse_config(raw)
    raw["switches"][2]["role"] = "core"
    with pytest.raises(ConfigError, match="not one of leaf, spine"):
        parse_config(raw)
