"""A leaf-spine fabric of P4 switches: the emulated cluster beyond one rack.

Every leaf and spine of a :class:`~emulation.topo.FabricSpec` is one P4 switch process (BMv2
where installed, the reference target otherwise) running the same program as the star's single
switch. They are programmed from one :class:`~kvcast.fabric.FabricPlan` (routes per destination
leaf over the spines in service, fabric ports trusted as a fabric switch's, one multicast tree
per group through one spine, a shared prefix cached where its GETs first meet), the plan the
controller daemon installs too. Host ports are bound to their host (address, tenants, group
membership, default deny) exactly as on the star's switch.

Functions:
    bmv2_prunes_transit: whether the compiled BMv2 program can run a fabric.
    default_fabric_switch_class: the switch class a fabric gets by default.

Classes:
    FabricCluster: a running fabric (a :class:`~emulation.network.Cluster` with several
        switches): its trees (made, joined and left), spine failover and return, its per-link
        byte counts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from finsy.proto import p4r

from emulation.network import Cluster
from emulation.switches import P4Switch, RefSwitch, default_switch_class
from emulation.targets import BMV2_JSON_PATH
from emulation.topo import SWITCH_MAC, FabricSpec, LeafSpineTopo, NodeAddr, fabric_addresses
from kvcast import p4constants as c
from kvcast.fabric import Attachment, FabricPlan, TreeStep, Uplink, tree_steps
from kvcast.tools.p4rt_client import Lpm, P4RuntimeClient
from kvcast.wire import ip_int, mac_int

T_MEMBER = c.TABLE_INGRESS_PORT_ROLE_GROUP_MEMBER


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
        switch_cls = switch_cls or default_fabric_switch_class()
        if switch_cls.kind == "bmv2" and not bmv2_prunes_transit():
            raise ValueError(
                f"BMv2's compiled program ({BMV2_JSON_PATH}) predates the egress prune a fabric "
                "needs (its trees would loop): rebuild it with make p4, or use the reference "
                "target (--switch refswitch)"
            )
        super().__init__(spec, switch_cls, quiet, lock_timeout_s)
        self._trees: dict[int, dict[str, list[tuple[int, int]]]] = {}
        self._members: dict[int, list[str]] = {}
        f = spec
        self.plan = FabricPlan(
            [f.leaf_name(i) for i in range(1, f.leaves + 1)],
            [f.spine_name(i) for i in range(1, f.spines + 1)],
            [
                Uplink(f.leaf_name(lf), f.uplink_port(sp), f.spine_name(sp), lf)
                for lf in range(1, f.leaves + 1)
                for sp in range(1, f.spines + 1)
            ],
            [Attachment(n.name, n.switch, n.port, n.role) for n in self.nodes.values()],
        )

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
        return self.plan.leaves + self.plan.spines

    def switch_node(self, name: str) -> P4Switch:
        """A switch node by name."""
        return self.net.get(name)  # type: ignore[no-any-return]

    def clients(self) -> list[P4RuntimeClient]:
        """Every running switch's primary client, leaves first (a dead one has no state)."""
        return [self.switch_node(n).client for n in self.switch_names() if self._alive(n)]

    def hosts(self) -> list[NodeAddr]:
        """GPU hosts round-robin over the leaves: the first N of them spread over every leaf."""
        by_leaf: dict[str, list[NodeAddr]] = {leaf: [] for leaf in self.plan.leaves}
        for n in self.nodes.values():
            if n.role == "host":
                by_leaf[n.switch].append(n)
        order: list[NodeAddr] = []
        for k in range(self.fabric.hosts_per_leaf):
            order += [by_leaf[leaf][k] for leaf in self.plan.leaves]
        return order

    @property
    def first_pool(self) -> str:
        """Pool node ``p1``: the experiments' prefixes (replica 0) live there."""
        return self.pools()[0].name

    def tree_spine(self) -> str:
        """The spine of every tree: the one the GETs cross toward :attr:`first_pool`."""
        return self.plan.tree_spine(self.first_pool)

    def tree(self, hosts: list[str]) -> dict[str, list[tuple[int, int]]]:
        """The replication group of a tree over ``hosts`` on each switch it crosses."""
        return self.plan.tree(hosts, self.first_pool)

    def tree_spine_of(self, hosts: list[str]) -> str | None:
        """The spine of the tree over ``hosts`` (None: the tree needs none)."""
        spines = [s for s in self.tree(hosts) if self.plan.is_spine(s)]
        return spines[0] if spines else None

    def cache_switch(self, hosts: list[str]) -> str:
        """Where the GETs of ``hosts`` toward :attr:`first_pool` first meet."""
        return self.plan.cache_switch(hosts, self.first_pool)

    def cache_client(self, hosts: list[str]) -> P4RuntimeClient:
        """The client of :meth:`cache_switch`."""
        return self.switch_node(self.cache_switch(hosts)).client

    # ------------------------------------------------------------------ links
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
        cl = self.switch_node(name).client
        for node in self.nodes.values():
            self._program_node(cl, node, self._route(name, node), attached=node.switch == name)
        self._program_defaults(cl, self.plan.fabric_ports(name))

    def _route(self, switch: str, node: NodeAddr) -> dict[str, int]:
        """The ``route`` action's parameters on ``switch`` toward ``node``."""
        port, via = self.plan.next_hop(switch, node.name)
        smac = mac_int(SWITCH_MAC)
        return {"port": port, "smac": smac, "dmac": mac_int(node.mac) if via is None else smac}

    def take_spine_down(self, spine: str) -> None:
        """Moves every route and tree off ``spine`` (dead, or to be serviced).

        Make before break (:meth:`update_group` for each tree: its group created on the new
        spine, each leaf's switched to the new uplink in one update, the old spine's deleted
        where it still answers); the leaves' routes move one MODIFY at a time (no moment
        without a route).

        Raises:
            ValueError: not a spine of this fabric.
            RuntimeError: it is the last spine in service.
        """
        if not self.plan.is_spine(spine):
            raise ValueError(f"{spine!r} is not a spine")
        if set(self.plan.live_spines()) <= {spine}:
            raise RuntimeError(f"{spine} is the last spine in service")
        self.plan.down_spines.add(spine)
        self._move()

    def bring_spine_up(self, spine: str) -> None:
        """Starts ``spine`` again (programmed) if its process died, and puts it back in service.

        Routes and trees spread over the spines in service again, make before break (as
        :meth:`take_spine_down`).
        """
        if not self._alive(spine):
            self.switch_node(spine).restart(install=True)
            self._program_one(spine)
        self.plan.down_spines.discard(spine)
        self._move()

    def take_link_down(self, leaf: str, spine: str) -> None:
        """Moves every route and tree off the ``leaf``-``spine`` link, make before break.

        Raises:
            ValueError: no such link.
            RuntimeError: it would leave some leaf without a path to another.
        """
        if leaf not in self.plan.leaves or not self.plan.is_spine(spine):
            raise ValueError(f"no link between {leaf!r} and {spine!r}")
        self.plan.down_links.add((leaf, spine))
        cut = self.plan.cut_leaves()
        if cut:
            self.plan.down_links.discard((leaf, spine))
            raise RuntimeError(f"{leaf}-{spine} down would leave no spine between {cut[0]}")
        self._move()

    def bring_link_up(self, leaf: str, spine: str) -> None:
        """Puts the ``leaf``-``spine`` link back in service (routes and trees spread again)."""
        self.plan.down_links.discard((leaf, spine))
        self._move()

    def _move(self) -> None:
        """Re-points every tree and the leaves' routes at the spines and links in service."""
        for group_id, hosts in list(self._members.items()):
            self._retree(group_id, hosts)
        for leaf in self.plan.leaves:
            cl = self.switch_node(leaf).client
            for node in self.nodes.values():
                if node.switch != leaf:
                    cl.modify(
                        c.TABLE_INGRESS_FORWARDING_IPV4_LPM,
                        {"dst_addr": Lpm(ip_int(node.ip), 32)},
                        c.ACTION_INGRESS_FORWARDING_ROUTE,
                        self._route(leaf, node),
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
    def add_group(self, group_id: int, hosts: list[str]) -> None:
        """Creates multicast group ``group_id`` over the named GPU hosts as one tree.

        Each member's port on its leaf is written into ``group_member`` there: a leaf takes a
        GET naming the group only from a member.
        """
        self._trees[group_id] = {}
        self._members[group_id] = []
        self._retree(group_id, hosts)

    def update_group(self, group_id: int, hosts: list[str]) -> None:
        """Hosts join and leave a tree made by :meth:`add_group`, make before break.

        The writes of :func:`~kvcast.fabric.tree_steps`: the group created on every switch the
        new tree adds, new members' ports written into ``group_member``, the group changed in
        one update where both trees cross, deleted from the switches the new tree leaves, and
        the ports of members that left removed last.

        Raises:
            KeyError: no such tree.
        """
        self._retree(group_id, hosts)

    def _retree(self, group_id: int, hosts: list[str]) -> None:
        """:meth:`update_group`'s work; a switch that is dead is only forgotten."""
        tree = self.tree(hosts)
        self._write_steps(
            group_id,
            tree_steps(
                self._trees[group_id],
                tree,
                self.plan.edge_ports(self._members[group_id]),
                self.plan.edge_ports(hosts),
            ),
        )
        self._trees[group_id] = tree
        self._members[group_id] = list(hosts)

    def _write_steps(self, group_id: int, steps: list[TreeStep]) -> None:
        """Writes a tree change over P4Runtime (removals on a dead switch are skipped)."""
        for step in steps:
            if step.op in ("unmember", "delete") and not self._alive(step.switch):
                continue  # a dead switch lost its groups with its state
            cl = self.switch_node(step.switch).client
            member = {"group": group_id, "port": step.port}
            if step.op == "create":
                cl.multicast_group(group_id, step.replicas)
            elif step.op == "modify":
                cl.multicast_group(group_id, step.replicas, update=p4r.Update.MODIFY)
            elif step.op == "delete":
                cl.multicast_group(group_id, [], update=p4r.Update.DELETE)
            elif step.op == "member":
                cl.insert(T_MEMBER, member, c.ACTION_INGRESS_PORT_ROLE_MEMBER, {})
            else:
                cl.delete(T_MEMBER, member)

    def remove_group(self, group_id: int) -> None:
        """Deletes a tree made by :meth:`add_group` and its membership entries."""
        old = self._trees.pop(group_id, {})
        members = self._members.pop(group_id, [])
        self._write_steps(group_id, tree_steps(old, {}, self.plan.edge_ports(members), ()))


def bmv2_prunes_transit() -> bool:
    """Whether the compiled BMv2 program has the egress prune of transit DATA (docs/fabric.md).

    The prune's metadata field is named in the compiled JSON once p4c built it from the
    current source.
    """
    try:
        return '.transit"' in BMV2_JSON_PATH.read_text()
    except OSError:
        return False


def default_fabric_switch_class() -> type[P4Switch]:
    """BMv2 where installed with a program that prunes transit DATA, else the reference target."""
    cls = default_switch_class()
    return cls if cls.kind != "bmv2" or bmv2_prunes_transit() else RefSwitch


def _tx(intf: str) -> int:
    return int(Path(f"/sys/class/net/{intf}/statistics/tx_bytes").read_text())
