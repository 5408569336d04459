"""The secure defaults, played against the reference target with nothing configured.

A switch whose controller installed nothing (a fresh pipeline, or ``program_forwarding: false``)
takes nothing from any port: the data plane's own default (``port_role`` -> DENY) drops every
frame a host could send, each counted as ``PORT_DENIED``, and nothing leaves any port. The
other defaults are played where their layer is tested: the controller's refusal of a host
without tenants (tests/controlplane/test_daemon_config.py), the agent's trust
(test_agent_trust.py), the pool node's group and tenant checks (test_pool_groups.py).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kvcast import p4constants as c
from kvcast import wire
from tests.conformance.harness import InProcessRefTarget
from tests.conformance.vectors import HOSTS, POOL_IP, POOL_MAC, SWITCH_MAC, VIP, arp_frame

TENANT, KEY, GROUP = 3, 0xDEF0, 6
IG_DROPS = c.COUNTER_INGRESS_STATS_DROP_COUNTER


@pytest.fixture
def target() -> Iterator[InProcessRefTarget]:
    t = InProcessRefTarget()
    try:
        yield t
    finally:
        t.close()


def _what_a_host_may_send() -> list[bytes]:
    """A GET, a forged replica, a NACK, a WRITE, ARP and IPv6, from host 1."""
    mac, ip, port = HOSTS[1]
    get = wire.get_message(TENANT, KEY, 0, req_id=1, group=GROUP)
    replica = wire.data_message(
        TENANT, KEY, 0, 1, b"forged", group=GROUP, flags=c.KVP_FLAG_REPLICA, req_id=1
    )
    nack = wire.nack_message(wire.KvpHeader.unpack(get), c.KVP_STATUS_NOT_FOUND)
    kvp = [
        wire.udp_frame(mac, SWITCH_MAC, ip, VIP, port, c.KVP_UDP_PORT, get),
        wire.udp_frame(mac, SWITCH_MAC, ip, HOSTS[2][1], c.KVP_UDP_PORT, port, replica),
        wire.udp_frame(mac, SWITCH_MAC, ip, HOSTS[2][1], c.KVP_UDP_PORT, port, nack),
        wire.udp_frame(mac, POOL_MAC, ip, POOL_IP, port, c.KVP_UDP_PORT, get),
    ]
    ipv6 = wire.mac_bytes(POOL_MAC) + wire.mac_bytes(mac) + b"\x86\xdd" + bytes(46)
    return [*kvp, arp_frame(1, HOSTS[2][0], ip, HOSTS[2][1]), ipv6]


@pytest.mark.parametrize("port", [1, 4, 77, 510])
def test_a_switch_nobody_programmed_lets_nothing_in(target: InProcessRefTarget, port: int) -> None:
    frames = _what_a_host_may_send()
    for frame in frames:
        assert target.pipeline.process(port, frame) == []
    drops = target.state.counter_values(IG_DROPS)
    assert drops[c.DROP_PORT_DENIED][0] == len(frames)
    assert sum(packets for packets, _ in drops) == len(frames)  # under no other reason
