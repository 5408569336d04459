"""Emulated cluster topologies, as pure descriptions (Mininet's Topo shape).

A topology only says which nodes exist, their addresses and how links are shaped; the network
is built from it by :mod:`emulation.network` with whichever switch class is wanted.

Classes:
    LinkSpec: shaping of one link (rate, delay, queue), applied with tc by Mininet's TCLink.
    ClusterSpec: how many GPU hosts and pool nodes, and their links.
    NodeAddr: one node's name, MAC, IP and switch port.
    StarTopo: one switch, N GPU hosts and M pool nodes; the pool links are the bottleneck.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mininet.topo import Topo

SWITCH_MAC = "02:00:00:00:00:fe"
EMULATION_MTU = 9000
"""IP MTU of every link of the emulated cluster by default: jumbo frames, as a GPU cluster's
fabric runs them. SRAM hits stay one fragment per packet; a pool node's DATA carries 34
fragments instead of 5 at 1500 bytes."""
MIN_MTU = 576
MAX_MTU = 9000
SERVICE_IP = "10.0.100.1"
HOST_PREFIX = "10.0.0."
POOL_PREFIX = "10.0.1."
NETMASK_BITS = 16


@dataclass(frozen=True)
class LinkSpec:
    """Shaping of one link.

    Attributes:
        bw_mbit: rate limit in Mbit/s (None: unshaped veth).
        delay: one-way delay, tc syntax (``"100us"``), or None.
        max_queue: queue length in packets, or None for tc's default.
    """

    bw_mbit: float | None = None
    delay: str | None = None
    max_queue: int | None = None

    def tc_params(self) -> dict[str, Any]:
        """Keyword arguments for Mininet's TCLink."""
        params: dict[str, Any] = {}
        if self.bw_mbit is not None:
            params["bw"] = self.bw_mbit
        if self.delay is not None:
            params["delay"] = self.delay
        if self.max_queue is not None:
            params["max_queue_size"] = self.max_queue
        return params


@dataclass(frozen=True)
class ClusterSpec:
    """A cluster to emulate.

    Attributes:
        n_hosts: GPU hosts.
        n_pools: DRAM pool nodes.
        host_link: shaping of each GPU host's link.
        pool_link: shaping of each pool node's link: the N-to-1 bottleneck, as in a cluster
            where many inference nodes read one pool node's NIC.
        tenants: the tenants every GPU host's port is bound to, or None for any tenant; each
            host port is bound to its address either way, and unknown ports are denied.
        mtu: IP MTU of every link (both ends of each veth), and the MTU the pool nodes and
            agents the experiments start are told to fill.
    """

    n_hosts: int = 4
    n_pools: int = 1
    host_link: LinkSpec = field(default_factory=lambda: LinkSpec(bw_mbit=200))
    pool_link: LinkSpec = field(default_factory=lambda: LinkSpec(bw_mbit=20))
    tenants: tuple[int, ...] | None = None
    mtu: int = EMULATION_MTU

    def __post_init__(self) -> None:
        if not MIN_MTU <= self.mtu <= MAX_MTU:
            raise ValueError(f"mtu must be {MIN_MTU}..{MAX_MTU}, got {self.mtu}")
        if not 1 <= self.n_hosts <= 200:
            raise ValueError(f"n_hosts must be 1..200, got {self.n_hosts}")
        if not 1 <= self.n_pools <= 50:
            raise ValueError(f"n_pools must be 1..50, got {self.n_pools}")


@dataclass(frozen=True)
class NodeAddr:
    """One node attached to the switch."""

    name: str
    mac: str
    ip: str
    port: int
    role: str  # "host" or "pool"


def addresses(spec: ClusterSpec) -> list[NodeAddr]:
    """Every node's addresses and switch port: hosts on ports 1..N, pools after them."""
    nodes = [
        NodeAddr(f"h{i}", f"00:00:00:00:00:{i:02x}", f"{HOST_PREFIX}{i}", i, "host")
        for i in range(1, spec.n_hosts + 1)
    ]
    nodes += [
        NodeAddr(f"p{j}", f"00:00:00:00:01:{j:02x}", f"{POOL_PREFIX}{j}", spec.n_hosts + j, "pool")
        for j in range(1, spec.n_pools + 1)
    ]
    return nodes


class StarTopo(Topo):  # type: ignore[misc]
    """One switch ``s1``, GPU hosts ``h1..hN`` and pool nodes ``p1..pM``.

    Args:
        spec: the cluster.
    """

    def build(self, spec: ClusterSpec) -> None:  # type: ignore[override]
        """Adds nodes and links (Mininet calls this from Topo.__init__)."""
        switch = self.addSwitch("s1")
        for node in addresses(spec):
            self.addHost(node.name, ip=f"{node.ip}/{NETMASK_BITS}", mac=node.mac)
            link = spec.host_link if node.role == "host" else spec.pool_link
            self.addLink(node.name, switch, port2=node.port, **link.tc_params())
