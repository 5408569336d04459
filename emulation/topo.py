"""Emulated cluster topologies, as pure descriptions (Mininet's Topo shape).

A topology only says which nodes exist, their addresses and how links are shaped; the network
is built from it by :mod:`emulation.network` with whichever switch class is wanted.

Classes:
    LinkSpec: shaping of one link (rate, delay, queue), applied with tc by Mininet's TCLink.
    ClusterSpec: how many GPU hosts and pool nodes, and their links.
    NodeAddr: one node's name, MAC, IP and switch port.
    StarTopo: one switch, N GPU hosts and M pool nodes; the pool links are the bottleneck.
    FabricSpec: a leaf-spine fabric: spines, leaves, GPU hosts and pool nodes per leaf, links.
    LeafSpineTopo: that fabric as a topology, one switch per spine and leaf.

Functions:
    addresses: every node of a star cluster, with its switch port.
    fabric_addresses: every node of a fabric, with its leaf and port there.
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


def _check_size(mtu: int, n_hosts: int, n_pools: int) -> None:
    """The limits of every emulated cluster, star or fabric.

    Args:
        mtu: IP MTU of every link.
        n_hosts: GPU hosts in all.
        n_pools: pool nodes in all.

    Raises:
        ValueError: the MTU is outside ``MIN_MTU..MAX_MTU``, or not 1..200 GPU hosts, or not
            1..50 pool nodes.
    """
    if not MIN_MTU <= mtu <= MAX_MTU:
        raise ValueError(f"mtu must be {MIN_MTU}..{MAX_MTU}, got {mtu}")
    if not 1 <= n_hosts <= 200:
        raise ValueError(f"1..200 GPU hosts in all, got {n_hosts}")
    if not 1 <= n_pools <= 50:
        raise ValueError(f"1..50 pool nodes in all, got {n_pools}")


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
        _check_size(self.mtu, self.n_hosts, self.n_pools)


@dataclass(frozen=True)
class NodeAddr:
    """One node attached to a switch: ``port`` on ``switch`` (``s1`` in a star)."""

    name: str
    mac: str
    ip: str
    port: int
    role: str  # "host" or "pool"
    switch: str = "s1"


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


@dataclass(frozen=True)
class FabricSpec:
    """A leaf-spine fabric to emulate: every leaf links to every spine.

    Hosts and pool nodes are numbered leaf by leaf (``h1..hK`` under the first leaf). A leaf's
    ports are its hosts (1..K), then its pool nodes, then one uplink per spine; a spine's port
    ``l`` faces leaf ``l``. Leaves are switches ``s1..sL``, spines ``s(L+1)..s(L+S)``.

    Attributes:
        spines: spine switches.
        leaves: leaf switches.
        hosts_per_leaf: GPU hosts under each leaf.
        pools_per_leaf: pool nodes under each leaf, or, with ``pool_leaves``, under each of
            those leaves only.
        pool_leaves: the leaves (from 1) that have pool nodes; empty: every leaf.
        host_link: each GPU host's link.
        pool_link: each pool node's link (the N-to-1 bottleneck, as in a star).
        uplink: each leaf-spine link.
        tenants: as :class:`ClusterSpec`'s.
        mtu: IP MTU of every link.
    """

    spines: int = 2
    leaves: int = 4
    hosts_per_leaf: int = 8
    pools_per_leaf: int = 1
    pool_leaves: tuple[int, ...] = ()
    host_link: LinkSpec = field(default_factory=lambda: LinkSpec(bw_mbit=200))
    pool_link: LinkSpec = field(default_factory=lambda: LinkSpec(bw_mbit=20))
    uplink: LinkSpec = field(default_factory=lambda: LinkSpec(bw_mbit=400))
    tenants: tuple[int, ...] | None = None
    mtu: int = EMULATION_MTU

    def __post_init__(self) -> None:
        if not 1 <= self.spines <= 8 or not 1 <= self.leaves <= 16:
            raise ValueError(f"1..8 spines and 1..16 leaves, got {self.spines}, {self.leaves}")
        _check_size(self.mtu, self.n_hosts, self.n_pools)
        if any(not 1 <= leaf <= self.leaves for leaf in self.pool_leaves):
            raise ValueError(f"pool_leaves must name leaves 1..{self.leaves}")

    @property
    def n_hosts(self) -> int:
        """GPU hosts in all."""
        return self.leaves * self.hosts_per_leaf

    @property
    def n_pools(self) -> int:
        """Pool nodes in all."""
        return len(self.leaves_with_pools()) * self.pools_per_leaf

    def leaves_with_pools(self) -> list[int]:
        """The leaves (from 1) that have pool nodes."""
        return sorted(set(self.pool_leaves)) or list(range(1, self.leaves + 1))

    def leaf_name(self, leaf: int) -> str:
        """Leaf ``leaf``'s switch (from 1)."""
        return f"s{leaf}"

    def spine_name(self, spine: int) -> str:
        """Spine ``spine``'s switch (from 1)."""
        return f"s{self.leaves + spine}"

    def uplink_port(self, spine: int) -> int:
        """The port of every leaf that faces spine ``spine`` (from 1)."""
        return self.hosts_per_leaf + self.pools_per_leaf + spine


def fabric_addresses(spec: FabricSpec) -> list[NodeAddr]:
    """Every node of a fabric: hosts leaf by leaf, then pool nodes; ``switch`` is the leaf."""
    nodes: list[NodeAddr] = []
    for leaf in range(1, spec.leaves + 1):
        for k in range(1, spec.hosts_per_leaf + 1):
            i = (leaf - 1) * spec.hosts_per_leaf + k
            nodes.append(
                NodeAddr(f"h{i}", f"00:00:00:00:00:{i:02x}", f"{HOST_PREFIX}{i}", k, "host",
                         spec.leaf_name(leaf))
            )  # fmt: skip
    j = 0
    for leaf in spec.leaves_with_pools():
        for k in range(1, spec.pools_per_leaf + 1):
            j += 1
            port = spec.hosts_per_leaf + k
            nodes.append(
                NodeAddr(f"p{j}", f"00:00:00:00:01:{j:02x}", f"{POOL_PREFIX}{j}", port, "pool",
                         spec.leaf_name(leaf))
            )  # fmt: skip
    return nodes


class LeafSpineTopo(Topo):  # type: ignore[misc]
    """A :class:`FabricSpec` as a topology: leaves ``s1..sL``, spines after them.

    Args:
        spec: the fabric.
    """

    def build(self, spec: FabricSpec) -> None:  # type: ignore[override]
        """Adds switches, nodes and links (Mininet calls this from Topo.__init__)."""
        for leaf in range(1, spec.leaves + 1):
            self.addSwitch(spec.leaf_name(leaf))
        for spine in range(1, spec.spines + 1):
            self.addSwitch(spec.spine_name(spine))
        for node in fabric_addresses(spec):
            self.addHost(node.name, ip=f"{node.ip}/{NETMASK_BITS}", mac=node.mac)
            link = spec.host_link if node.role == "host" else spec.pool_link
            self.addLink(node.name, node.switch, port2=node.port, **link.tc_params())
        for leaf in range(1, spec.leaves + 1):
            for spine in range(1, spec.spines + 1):
                self.addLink(
                    spec.leaf_name(leaf),
                    spec.spine_name(spine),
                    port1=spec.uplink_port(spine),
                    port2=leaf,
                    **spec.uplink.tc_params(),
                )
