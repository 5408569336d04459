"""Jumbo frames in the emulated cluster: every link's MTU, a full-size datagram across the switch.

A GPU host sends one UDP datagram that fills the 9000-byte MTU to a pool node through the switch
(the switch's L3 path, as the pool node's DATA take); the pool node must receive it whole. A veth
with the default 1500-byte MTU drops it (and the sender's kernel refuses it with EMSGSIZE), so
this fails if any hop keeps the old MTU. Run on the reference target, and on BMv2 where it is
installed.
"""

from __future__ import annotations

import sys

import pytest

from emulation.topo import EMULATION_MTU, ClusterSpec, LinkSpec
from tests.mininet_env import MININET_MISSING

pytestmark = [pytest.mark.slow, pytest.mark.netns]

# IPv4 (20) + UDP (8) headers: the payload that fills the MTU exactly.
PAYLOAD = EMULATION_MTU - 28
PORT = 39001

# Runs in the pool node's namespace: receives one datagram, prints its size and a checksum.
RECEIVER = (
    "import socket,sys,zlib;s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);"
    f"s.bind(('0.0.0.0',{PORT}));s.settimeout(10);print('ready',flush=True);"
    "d=s.recv(65535);print(len(d),zlib.crc32(d),flush=True)"
)
# Runs in a GPU host's namespace: sends one datagram of PAYLOAD bytes with DF set (Linux's
# IP_MTU_DISCOVER = 10, IP_PMTUDISC_DO = 2: never fragmented by the sender's kernel).
SENDER = (
    "import socket,sys;s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);"
    "s.setsockopt(socket.IPPROTO_IP,10,2);"
    f"s.sendto(bytes(range(256))*{PAYLOAD // 256}+bytes({PAYLOAD % 256}),(sys.argv[1],{PORT}))"
)


def test_the_default_mtu_is_jumbo_and_bounded() -> None:
    assert ClusterSpec().mtu == EMULATION_MTU == 9000
    with pytest.raises(ValueError, match="mtu"):
        ClusterSpec(mtu=9001)
    with pytest.raises(ValueError, match="mtu"):
        ClusterSpec(mtu=500)


@pytest.mark.skipif(bool(MININET_MISSING), reason=MININET_MISSING or "runs")
@pytest.mark.parametrize("kind", ["refswitch", "bmv2"])
def test_a_datagram_filling_the_mtu_crosses_the_switch_whole(kind: str) -> None:
    import zlib

    from emulation.network import Cluster
    from emulation.switches import BMv2Switch, RefSwitch, default_switch_class

    if kind == "bmv2" and default_switch_class() is not BMv2Switch:
        pytest.skip("BMv2 not installed: simple_switch_grpc or its compiled JSON not found")
    switch_cls = RefSwitch if kind == "refswitch" else BMv2Switch
    spec = ClusterSpec(n_hosts=1, n_pools=1, host_link=LinkSpec(), pool_link=LinkSpec())
    payload = bytes(range(256)) * (PAYLOAD // 256) + bytes(PAYLOAD % 256)
    with Cluster(spec, switch_cls) as cluster:
        assert [cluster.interface_mtu(n) for n in ("h1", "p1", "s1")] == [EMULATION_MTU] * 3
        pool_ip = cluster.pools()[0].ip
        receiver = cluster.host("p1").popen([sys.executable, "-c", RECEIVER], text=True)
        try:
            assert receiver.stdout is not None
            assert receiver.stdout.readline().strip() == "ready"
            sent = cluster.host("h1").cmd(f'{sys.executable} -c "{SENDER}" {pool_ip}; echo rc=$?')
            assert "rc=0" in sent, sent
            out, _ = receiver.communicate(timeout=15)
        finally:
            if receiver.poll() is None:
                receiver.kill()
    assert out.split() == [str(PAYLOAD), str(zlib.crc32(payload))], out
