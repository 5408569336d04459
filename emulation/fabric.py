"""A leaf-spine fabric of P4 switches: the emulated cluster beyond one rack.

Every leaf and spine of a :class:`~emulation.topo.FabricSpec` is one P4 switch process (BMv2
where installed, the reference target otherwise) running the same program as the star's single
switch; this module programs them as one fabric.

- **Forwarding**: a leaf routes its own hosts and pool nodes to their ports, everything else up
  to one spine per destination leaf (spine ``leaf mod S``); a spine routes every address to its
  leaf. Every leaf holds the same pool-owner map, so the first switch a GET meets sends it on
  toward its pool node.
- **Trust**: a leaf's host ports are bound to their host (address, tenants, group membership,
  default deny) exactly as on the star's switch; a fabric port (a leaf's uplink, every spine
  port) has the pool role: it may bring in what a switch of the fabric forwards (GETs already
  checked at their edge, DATA and NACKs) and never a WRITE (the CPU port's only).
- **Multicast trees**: a group is one replication group on each switch it crosses, all through
  one spine (the spine the members' GETs cross toward the first pool node, so that a GET meets
  the spine's cache and the tree on the same switch). On a leaf the group is its member hosts,
  plus the uplink where members sit under other leaves; on the spine it is the member leaves.
  DATA that arrives from a fabric or pool port is never multicast back out of that port (the
  switches' egress prune), so the tree carries one copy per link and cannot loop, whichever
  switch (pool leaf, spine cache, member leaf cache) the DATA starts from.
- **Placement**: a prefix the hosts share goes into the SRAM of the switch where their GETs
  toward its pool node first meet: their leaf when they share one, else the pool node's leaf
  when some of them sit under it (their GETs never reach a spine), else the tree's spine
  (:meth:`FabricCluster.cache_switch`). A hit there is multicast down the same tree.

Classes:
    FabricCluster: a running fabric (a :class:`~emulation.network.Cluster` with several
        switches), its trees and its per-link byte counts.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from finsy.proto import p4r

from emulation.network import Cluster, _ip, _mac
from emulation.switches import P4Switch
from emulation.topo import SWITCH_MAC, FabricSpec, LeafSpineTopo, NodeAddr, fabric_addresses
from hostagent.ports import AGENT_PORT
from kvcast import p4constants as c
from kvcast.p4rt_client import Lpm, P4RuntimeClient


class FabricCluster(Cluster):
    """A running leaf-spine fabric (module docstring).

    :attr:`switch` and :attr:`client` are the first leaf's (where host ``h1`` and, by default,
    pool node ``p1`` sit); :meth:`clients` are every switch's.

    Args:
        spec: the fabric.
        switch_cls: the switch node class.
        quiet: silence Mininet's own logging.
        lock_timeout_s: how long ``start`` waits for another cluster of this machine to stop.
    """

    def __init__(
        self,
        spec: FabricSpec,
        switch_cls: type[P4Switch] | None = None,
        quiet: bool = True,
        lock_timeout_s: float = 1800.0,
    ):
        self.fabric = spec
        super().__init__(spec, switch_cls, quiet, lock_timeout_s)
        self._trees: dict[int, dict[str, list[int]]] = {}
        self._members: dict[int, list[str]] = {}
        self.down_spines: set[int] = set()
        """Spines (from 1) taken out of service: no route and no tree uses them."""

    def _addresses(self) -> list[NodeAddr]:
        return fabric_addresses(self.fabric)

    def _topology(self) -> Any:
        return LeafSpineTopo(spec=self.fabric)

    # ------------------------------------------------------------------ access
    @property
    def switch(self) -> P4Switch:
        """The first leaf."""
        return self.net.get(self.fabric.leaf_name(1))  # type: ignore[no-any-return]

    def switch_names(self) -> list[str]:
        """Leaves, then spines."""
        f = self.fabric
        leaves = [f.leaf_name(i) for i in range(1, f.leaves + 1)]
        return leaves + [f.spine_name(i) for i in range(1, f.spines + 1)]

    def switch_node(self, name: str) -> P4Switch:
        """A switch node by name."""
        return self.net.get(name)  # type: ignore[no-any-return]

    def clients(self) -> list[P4RuntimeClient]:
        """Every running switch's primary client, leaves first (a dead one has no state)."""
        return [self.switch_node(n).client for n in self.switch_names() if self._alive(n)]

    def hosts(self) -> list[NodeAddr]:
        """GPU hosts round-robin over the leaves: the first N of them spread over every leaf."""
        by_leaf: dict[str, list[NodeAddr]] = defaultdict(list)
        for n in self.nodes.values():
            if n.role == "host":
                by_leaf[n.switch].append(n)
        order: list[NodeAddr] = []
        for k in range(self.fabric.hosts_per_leaf):
            order += [by_leaf[leaf][k] for leaf in sorted(by_leaf, key=_switch_number)]
        return order

    def leaf_number(self, node: str) -> int:
        """The leaf (from 1) a host or pool node sits under."""
        return _switch_number(self.nodes[node].switch)

    def route_spine(self, dest_leaf: int) -> int:
        """The spine (from 1) every leaf sends traffic for ``dest_leaf`` through.

        Spread over the spines in service (``leaf mod S``).

        Raises:
            RuntimeError: no spine is in service.
        """
        live = [k for k in range(1, self.fabric.spines + 1) if k not in self.down_spines]
        if not live:
            raise RuntimeError("every spine is out of service")
        return live[(dest_leaf - 1) % len(live)]

    def tree_spine(self) -> int:
        """The spine of every multicast tree: the one the GETs cross toward pool node ``p1``."""
        return self.route_spine(self.leaf_number(self.pools()[0].name))

    def cache_switch(self, hosts: list[str]) -> str:
        """Where the GETs of ``hosts`` toward pool node ``p1`` first meet (module docstring).

        Their leaf when they share one; else the pool node's leaf when some of them sit under
        it (their GETs never reach a spine); else the spine the others cross toward it.
        """
        leaves = {self.nodes[h].switch for h in hosts}
        pool_leaf = self.pools()[0].switch
        if len(leaves) == 1:
            return leaves.pop()
        if pool_leaf in leaves:
            return pool_leaf
        return self.fabric.spine_name(self.tree_spine())

    def cache_client(self, hosts: list[str]) -> P4RuntimeClient:
        """The client of :meth:`cache_switch`."""
        return self.switch_node(self.cache_switch(hosts)).client

    # ------------------------------------------------------------------ links
    def fabric_links(self) -> list[tuple[str, str]]:
        """Every (leaf, spine) pair, each one link."""
        f = self.fabric
        return [
            (f.leaf_name(leaf), f.spine_name(spine))
            for leaf in range(1, f.leaves + 1)
            for spine in range(1, f.spines + 1)
        ]

    def link_tx_bytes(self) -> dict[str, int]:
        """Bytes each fabric link has carried, per direction (``"s1>s3"``: leaf s1 to spine s3).

        Read from the switches' interfaces in the root namespace, no node shell involved.
        """
        f = self.fabric
        out: dict[str, int] = {}
        for leaf in range(1, f.leaves + 1):
            for spine in range(1, f.spines + 1):
                up = f"{f.leaf_name(leaf)}-eth{f.uplink_port(spine)}"
                down = f"{f.spine_name(spine)}-eth{leaf}"
                out[f"{f.leaf_name(leaf)}>{f.spine_name(spine)}"] = _tx(up)
                out[f"{f.spine_name(spine)}>{f.leaf_name(leaf)}"] = _tx(down)
        return out

    # ------------------------------------------------------------------ setup
    def _program_switch(self) -> None:
        for name in self.switch_names():
            self._program_one(name)

    def _program_one(self, name: str) -> None:
        """Installs one switch's base program: routes, port roles, replicas, pool owners."""
        f = self.fabric
        cl = self.switch_node(name).client
        number = _switch_number(name)
        is_leaf = number <= f.leaves
        fabric_ports = (
            [f.uplink_port(s) for s in range(1, f.spines + 1)]
            if is_leaf
            else list(range(1, f.leaves + 1))
        )
        for node in self.nodes.values():
            cl.insert(
                c.TABLE_INGRESS_FORWARDING_IPV4_LPM,
                {"dst_addr": Lpm(_ip(node.ip), 32)},
                c.ACTION_INGRESS_FORWARDING_ROUTE,
                self._route(name, node),
            )
            if node.switch != name:
                continue
            cl.insert(
                c.TABLE_INGRESS_FORWARDING_L2_FWD,
                {"dst_addr": _mac(node.mac)},
                c.ACTION_INGRESS_FORWARDING_L2_FORWARD,
                {"port": node.port},
            )
            if node.role == "pool":
                cl.insert(
                    c.TABLE_INGRESS_PORT_ROLE_PORT_ROLE,
                    {"port": node.port},
                    c.ACTION_INGRESS_PORT_ROLE_SET_PORT_ROLE,
                    {"role": c.PORT_ROLE_POOL},
                )
                continue
            cl.insert(
                c.TABLE_EGRESS_REPLICA_REPLICA_DST,
                {"rid": node.port},
                c.ACTION_EGRESS_REPLICA_SET_REPLICA_DST,
                {"dmac": _mac(node.mac), "dip": _ip(node.ip), "dport": AGENT_PORT},
            )
            tenants = f.tenants
            cl.insert(
                c.TABLE_INGRESS_PORT_ROLE_PORT_ROLE,
                {"port": node.port},
                c.ACTION_INGRESS_PORT_ROLE_BIND_HOST,
                {"addr": _ip(node.ip), "check_tenant": int(tenants is not None)},
            )
            for tenant in tenants or ():
                cl.insert(
                    c.TABLE_INGRESS_PORT_ROLE_TENANT_BINDING,
                    {"port": node.port, "tenant": tenant},
                    c.ACTION_INGRESS_PORT_ROLE_TENANT_OK,
                    {},
                )
        for port in fabric_ports:
            # Fabric ports bring in what a switch of the fabric forwards (module docstring).
            cl.insert(
                c.TABLE_INGRESS_PORT_ROLE_PORT_ROLE,
                {"port": port},
                c.ACTION_INGRESS_PORT_ROLE_SET_PORT_ROLE,
                {"role": c.PORT_ROLE_POOL},
            )
        cl.set_default(
            c.TABLE_INGRESS_PORT_ROLE_PORT_ROLE,
            c.ACTION_INGRESS_PORT_ROLE_SET_PORT_ROLE,
            {"role": c.PORT_ROLE_DENY},
        )
        pools = self.pools()
        for bucket in range(c.POOL_BUCKETS):
            owner = pools[bucket % len(pools)]
            cl.insert(
                c.TABLE_INGRESS_POOL_OWNER_POOL_OWNER,
                {"bucket": bucket},
                c.ACTION_INGRESS_POOL_OWNER_SET_POOL,
                {"pool_ip": _ip(owner.ip)},
            )

    def _route(self, switch: str, node: NodeAddr) -> dict[str, int]:
        """The ``route`` action's parameters on ``switch`` toward ``node``."""
        f = self.fabric
        smac = _mac(SWITCH_MAC)
        leaf = _switch_number(node.switch)
        if _switch_number(switch) > f.leaves:
            return {"port": leaf, "smac": smac, "dmac": smac}
        if node.switch == switch:
            return {"port": node.port, "smac": smac, "dmac": _mac(node.mac)}
        return {"port": f.uplink_port(self.route_spine(leaf)), "smac": smac, "dmac": smac}

    def take_spine_down(self, spine: int) -> None:
        """Moves every route and tree off spine ``spine`` (dead or to be serviced).

        Make before break: each moved tree's group is created on its new spine, then each
        leaf's group is switched to the new uplink in one update, then the old spine's group is
        deleted where that spine still answers; the leaves' routes move one entry at a time,
        each a single MODIFY (no moment without a route).

        Raises:
            ValueError: an unknown spine.
            RuntimeError: it is the last spine in service.
        """
        if not 1 <= spine <= self.fabric.spines:
            raise ValueError(f"no spine {spine}")
        if len(self.down_spines | {spine}) >= self.fabric.spines:
            raise RuntimeError(f"spine {spine} is the last one in service")
        old_spine = self.fabric.spine_name(self.tree_spine())
        self.down_spines.add(spine)
        self._move(old_spine)

    def bring_spine_up(self, spine: int) -> None:
        """Starts spine ``spine`` again (programmed) if its process died, and puts it back.

        Routes and trees spread over the spines in service again (make before break, as
        :meth:`take_spine_down`).
        """
        name = self.fabric.spine_name(spine)
        if not self._alive(name):
            self.switch_node(name).restart(install=True)
            self._program_one(name)
        old_spine = self.fabric.spine_name(self.tree_spine())
        self.down_spines.discard(spine)
        self._move(old_spine)

    def _move(self, old_spine: str) -> None:
        """Re-points the leaves' routes and every tree at the spines now in service."""
        new_spine = self.fabric.spine_name(self.tree_spine())
        for group_id, hosts in self._members.items():
            tree = self.tree(group_id, hosts)
            made = self._trees[group_id]
            if new_spine in tree and new_spine not in made:
                self.switch_node(new_spine).client.multicast_group(group_id, tree[new_spine])
                made[new_spine] = []
            for switch, replicas in tree.items():
                if switch != new_spine:
                    self.switch_node(switch).client.multicast_group(
                        group_id, replicas, update=p4r.Update.MODIFY
                    )
            if old_spine != new_spine and old_spine in made:
                del made[old_spine]
                if self._alive(old_spine):
                    self.switch_node(old_spine).client.multicast_group(
                        group_id, [], update=p4r.Update.DELETE
                    )
        for number in range(1, self.fabric.leaves + 1):
            name = self.fabric.leaf_name(number)
            cl = self.switch_node(name).client
            for node in self.nodes.values():
                if node.switch != name:
                    cl.modify(
                        c.TABLE_INGRESS_FORWARDING_IPV4_LPM,
                        {"dst_addr": Lpm(_ip(node.ip), 32)},
                        c.ACTION_INGRESS_FORWARDING_ROUTE,
                        self._route(name, node),
                    )

    def switch_alive(self) -> bool:
        """Whether every switch process is still running."""
        return all(self._alive(n) for n in self.switch_names())

    def _alive(self, name: str) -> bool:
        process = self.switch_node(name).process
        return process is not None and process.proc.poll() is None

    def restart_switch(self) -> None:
        """Starts every dead switch again and programs it as at start (groups are per point)."""
        for name in self.switch_names():
            if not self._alive(name):
                self.switch_node(name).restart(install=True)
                self._program_one(name)

    # ------------------------------------------------------------------ trees
    def tree(self, group_id: int, hosts: list[str]) -> dict[str, list[tuple[int, int]]]:
        """The replication group of ``group_id`` on each switch it crosses: (port, replica id).

        Host replicas carry the host's port as replica id (their destination is rewritten in
        egress); fabric copies carry 0 (sent as they are).
        """
        f = self.fabric
        members: dict[str, list[NodeAddr]] = defaultdict(list)
        for h in hosts:
            node = self.nodes[h]
            if node.role != "host":
                raise ValueError(f"{h} is not a GPU host")
            members[node.switch].append(node)
        sources = set(members) | {p.switch for p in self.pools()}
        spine = self.tree_spine()
        uplink = f.uplink_port(spine)
        tree: dict[str, list[tuple[int, int]]] = {}
        for leaf in sorted(sources, key=_switch_number):
            replicas = [(n.port, n.port) for n in members.get(leaf, [])]
            if set(members) - {leaf}:
                replicas.append((uplink, 0))
            tree[leaf] = replicas
        if len(sources) > 1:
            tree[f.spine_name(spine)] = [
                (_switch_number(leaf), 0) for leaf in sorted(members, key=_switch_number)
            ]
        return tree

    def add_group(self, group_id: int, hosts: list[str]) -> None:
        """Creates multicast group ``group_id`` over the named GPU hosts as one tree.

        Each member's port on its leaf is written into ``group_member`` there: a leaf takes a
        GET naming the group only from a member.
        """
        tree = self.tree(group_id, hosts)
        made: dict[str, list[int]] = {}
        for name, replicas in tree.items():
            self.switch_node(name).client.multicast_group(group_id, replicas)
            made[name] = []
        for h in hosts:
            node = self.nodes[h]
            self.switch_node(node.switch).client.insert(
                c.TABLE_INGRESS_PORT_ROLE_GROUP_MEMBER,
                {"group": group_id, "port": node.port},
                c.ACTION_INGRESS_PORT_ROLE_MEMBER,
                {},
            )
            made[node.switch].append(node.port)
        self._trees[group_id] = made
        self._members[group_id] = list(hosts)

    def remove_group(self, group_id: int) -> None:
        """Deletes a tree made by :meth:`add_group` and its membership entries."""
        self._members.pop(group_id, None)
        for name, ports in self._trees.pop(group_id, {}).items():
            if not self._alive(name):
                continue  # a dead switch lost its groups with its state
            cl = self.switch_node(name).client
            cl.multicast_group(group_id, [], update=p4r.Update.DELETE)
            for port in ports:
                cl.delete(c.TABLE_INGRESS_PORT_ROLE_GROUP_MEMBER, {"group": group_id, "port": port})


def _switch_number(name: str) -> int:
    return int(name[1:])


def _tx(intf: str) -> int:
    return int(Path(f"/sys/class/net/{intf}/statistics/tx_bytes").read_text())
