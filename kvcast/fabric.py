"""A leaf-spine fabric's forwarding plan: routes, trees and cache placement, as pure data.

The controller daemon (controlplane) and the emulation (emulation.fabric) program a fabric from
the same plan, so what the emulation measures is what the controller installs.

- **Routes**: a leaf sends traffic for its own hosts and pool nodes out of their ports, and
  traffic for a node under another leaf up to one spine per destination leaf, spread over the
  spines in service (the ``(leaf index) mod (spines in service)``-th); a spine sends everything
  down to the node's leaf.
- **Fabric ports** (a leaf's uplinks, every spine port) are trusted as a fabric switch's: they
  have the pool role, so they may bring in what a switch of the fabric forwards (GETs already
  checked at their edge, DATA, NACKs) and never a WRITE.
- **Trees**: a multicast group is one replication group on each switch it crosses, all through
  one spine: the one the members' GETs cross toward the prefix's pool node, so that a GET meets
  that spine's cache and the tree on the same switch. On a leaf the group is its member hosts
  (replica id: the host's port, rewritten in egress) and the uplink (replica id 0: sent as is)
  where members sit under other leaves; on the spine it is the member leaves. The switches'
  egress never multicasts DATA back out of the port it came in on, so the tree carries one copy
  per link and cannot loop, whichever switch (the pool's leaf, a spine or leaf cache) the DATA
  starts from.
- **Placement**: a prefix a set of hosts shares is best held where their GETs toward its pool
  node first meet: their leaf when they share one; the pool node's leaf when some of them sit
  under it (their GETs never reach a spine); else the tree's spine. A hit there goes down the
  same tree. Where that switch is full, the next switch every GET crosses toward the pool node
  will do (``cache_path``); the pool node's leaf is always on it.
- **Tree changes** (hosts join or leave, a spine or link goes out of service or comes back):
  make before break, as the ordered writes ``tree_steps`` lists: the group created on every
  switch the new tree adds, new members' ports written into ``group_member``, the group
  changed in one update where both trees cross and differ, then the switches the tree leaves
  (their member ports, then their group) and last the ports of members that left.

Classes:
    Attachment: a host or pool node on a leaf port.
    Uplink: one leaf-spine link, with the port at each end.
    FabricPlan: the plan; which spines are in service is its only state.
    TreeStep: one write of a tree change.

Functions:
    tree_steps: the ordered writes that turn one tree into another, make before break.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Attachment:
    """A host or pool node attached to a leaf port.

    Attributes:
        name: the node's name (``h1``, ``p1``).
        switch: the leaf it is attached to.
        port: the leaf's port facing it.
        role: ``"host"`` or ``"pool"``.
    """

    name: str
    switch: str
    port: int
    role: str


@dataclass(frozen=True)
class Uplink:
    """One leaf-spine link: ``leaf_port`` on the leaf faces ``spine_port`` on the spine."""

    leaf: str
    leaf_port: int
    spine: str
    spine_port: int


class FabricPlan:
    """The forwarding plan of a two-tier leaf-spine fabric (module docstring).

    Args:
        leaves: leaf switch names, in order (a leaf's index decides its route spine).
        spines: spine switch names, in order.
        uplinks: every leaf-spine link (each leaf must reach each spine once).
        nodes: the hosts and pool nodes, each on a leaf.

    Raises:
        ValueError: a node on a switch that is not a leaf, a leaf without a link to some spine,
            a link between unknown switches, a repeated node name.

    Attributes:
        down_spines: spines out of service: no route or tree uses them.
        down_links: ``(leaf, spine)`` links out of service: no route or tree crosses them.
    """

    def __init__(
        self,
        leaves: Sequence[str],
        spines: Sequence[str],
        uplinks: Iterable[Uplink],
        nodes: Iterable[Attachment],
    ) -> None:
        self.leaves = list(leaves)
        self.spines = list(spines)
        if not self.leaves or not self.spines:
            raise ValueError("a fabric needs at least one leaf and one spine")
        if len(set(self.leaves) | set(self.spines)) != len(self.leaves) + len(self.spines):
            raise ValueError("a switch name appears twice among the leaves and spines")
        self._up: dict[tuple[str, str], Uplink] = {}
        for link in uplinks:
            if link.leaf not in self.leaves or link.spine not in self.spines:
                raise ValueError(f"uplink {link}: {link.leaf} is no leaf or {link.spine} no spine")
            self._up[(link.leaf, link.spine)] = link
        missing = [(lf, sp) for lf in self.leaves for sp in self.spines if (lf, sp) not in self._up]
        if missing:
            raise ValueError(f"no link between leaf and spine for {missing}")
        self.nodes: dict[str, Attachment] = {}
        for node in nodes:
            if node.switch not in self.leaves:
                raise ValueError(f"{node.name} is attached to {node.switch!r}, which is no leaf")
            if node.name in self.nodes:
                raise ValueError(f"node {node.name} appears twice")
            self.nodes[node.name] = node
        self.down_spines: set[str] = set()
        self.down_links: set[tuple[str, str]] = set()

    # ------------------------------------------------------------------ routes
    def is_spine(self, switch: str) -> bool:
        """Whether ``switch`` is a spine of this fabric."""
        return switch in self.spines

    def live_spines(self, leaves: Iterable[str] = ()) -> list[str]:
        """The spines in service, in order (with ``leaves``: only those linked up to all)."""
        wanted = list(leaves)
        return [
            s
            for s in self.spines
            if s not in self.down_spines and all((lf, s) not in self.down_links for lf in wanted)
        ]

    def cut_leaves(self) -> list[tuple[str, str]]:
        """The pairs of leaves that no spine in service connects over links in service."""
        return [
            (a, b)
            for i, a in enumerate(self.leaves)
            for b in self.leaves[i + 1 :]
            if not self.live_spines([a, b])
        ]

    def has_link(self, leaf: str, spine: str) -> bool:
        """Whether ``leaf``-``spine`` is a link of this fabric."""
        return (leaf, spine) in self._up

    def route_spine(self, dest_leaf: str, src_leaf: str | None = None) -> str:
        """The spine a leaf sends traffic for ``dest_leaf`` through.

        The ``(leaf index) mod (spines in service)``-th of the spines in service; with
        ``src_leaf``, of those whose links to both leaves are up. With every link up all leaves
        use the same spine for a destination leaf.

        Raises:
            RuntimeError: no spine in service connects the two leaves.
        """
        live = self.live_spines([dest_leaf] if src_leaf is None else [dest_leaf, src_leaf])
        if not live:
            raise RuntimeError(f"no spine in service reaches {dest_leaf} from {src_leaf}")
        return live[self.leaves.index(dest_leaf) % len(live)]

    def next_hop(self, switch: str, node: str) -> tuple[int, str | None]:
        """Where ``switch`` sends traffic for ``node``: (egress port, next switch).

        The next switch is None where the port faces the node itself.

        Raises:
            KeyError: an unknown node or switch.
        """
        target = self.nodes[node]
        if self.is_spine(switch):
            return self._up[(target.switch, switch)].spine_port, target.switch
        if switch not in self.leaves:
            raise KeyError(switch)
        if target.switch == switch:
            return target.port, None
        spine = self.route_spine(target.switch, switch)
        return self._up[(switch, spine)].leaf_port, spine

    def fabric_ports(self, switch: str) -> list[int]:
        """The ports of ``switch`` that face other switches of the fabric."""
        if self.is_spine(switch):
            return [self._up[(leaf, switch)].spine_port for leaf in self.leaves]
        return [self._up[(switch, spine)].leaf_port for spine in self.spines]

    def uplink_port(self, leaf: str, spine: str) -> int:
        """The port of ``leaf`` facing ``spine``."""
        return self._up[(leaf, spine)].leaf_port

    def downlink_port(self, spine: str, leaf: str) -> int:
        """The port of ``spine`` facing ``leaf``."""
        return self._up[(leaf, spine)].spine_port

    # ------------------------------------------------------------------ trees
    def tree_spine(self, pool: str, leaves: Iterable[str] = ()) -> str:
        """The spine of a tree whose DATA comes from ``pool``: the one GETs cross to it.

        With ``leaves`` (the tree's), a spine whose links to all of them are up: the GETs' one
        when it is, else the first such spine.

        Raises:
            RuntimeError: no spine in service reaches every one of them.
        """
        preferred = self.route_spine(self.nodes[pool].switch)
        usable = self.live_spines([*leaves, self.nodes[pool].switch])
        if preferred in usable:
            return preferred
        if not usable:
            raise RuntimeError(f"no spine in service reaches all of {sorted(leaves)}")
        return usable[0]

    def tree(self, members: Iterable[str], pool: str) -> dict[str, list[tuple[int, int]]]:
        """The replication group on each switch a group's tree crosses: ``(port, replica id)``.

        Args:
            members: the group's hosts.
            pool: the pool node the group's DATA comes from (every pool node's leaf gets the
                group too, so that DATA from any of them finds it).

        Raises:
            ValueError: a member that is not a host.
        """
        by_leaf: dict[str, list[Attachment]] = defaultdict(list)
        for name in members:
            node = self.nodes[name]
            if node.role != "host":
                raise ValueError(f"{name} is not a GPU host")
            by_leaf[node.switch].append(node)
        sources = set(by_leaf) | {n.switch for n in self.nodes.values() if n.role == "pool"}
        spine = self.tree_spine(pool, sources if len(sources) > 1 else ())
        tree: dict[str, list[tuple[int, int]]] = {}
        for leaf in (lf for lf in self.leaves if lf in sources):
            replicas = [(n.port, n.port) for n in by_leaf.get(leaf, [])]
            if set(by_leaf) - {leaf}:
                replicas.append((self.uplink_port(leaf, spine), 0))
            tree[leaf] = replicas
        if len(sources) > 1:
            tree[spine] = [
                (self.downlink_port(spine, leaf), 0) for leaf in self.leaves if leaf in by_leaf
            ]
        return tree

    def edge_ports(self, members: Iterable[str]) -> set[tuple[str, int]]:
        """The ``(leaf, port)`` of each of ``members``: where its ``group_member`` entry goes."""
        return {(self.nodes[h].switch, self.nodes[h].port) for h in members}

    def cache_switch(self, members: Iterable[str], pool: str) -> str:
        """Where the GETs of ``members`` toward ``pool`` first meet (module docstring)."""
        return self.cache_path(members, pool)[0]

    def cache_path(self, members: Iterable[str], pool: str) -> list[str]:
        """Every switch all the GETs of ``members`` toward ``pool`` cross, from where they meet.

        Any of them can answer every member; the first is the closest. A controller whose
        first choice is full takes the next (the pool node's leaf is always last: every GET
        reaches it).
        """
        leaves = {self.nodes[h].switch for h in members}
        pool_leaf = self.nodes[pool].switch
        if pool_leaf in leaves:
            return [pool_leaf]
        # A spine is on the path only if every member leaf's GETs cross it (they may not, with
        # a link down).
        spines = {self.route_spine(pool_leaf, leaf) for leaf in leaves}
        via = [spines.pop()] if len(spines) == 1 else []
        return [*leaves, *via, pool_leaf] if len(leaves) == 1 else [*via, pool_leaf]


TreeOp = Literal["create", "member", "modify", "unmember", "delete"]


@dataclass(frozen=True)
class TreeStep:
    """One write of a tree change on one switch.

    Attributes:
        op: ``create`` / ``modify`` (the switch's replication group: ``replicas``),
            ``delete`` (the group), ``member`` / ``unmember`` (the ``group_member`` entry of
            ``port``).
        switch: the switch written.
        replicas: the group's ``(port, replica id)`` (create and modify).
        port: the member port (member and unmember).
    """

    op: TreeOp
    switch: str
    replicas: tuple[tuple[int, int], ...] = ()
    port: int = 0


def tree_steps(
    old: Mapping[str, Sequence[tuple[int, int]]],
    new: Mapping[str, Sequence[tuple[int, int]]],
    old_members: Iterable[tuple[str, int]],
    new_members: Iterable[tuple[str, int]],
) -> list[TreeStep]:
    """The writes that turn tree ``old`` into ``new``, in make-before-break order.

    A new tree is ``old = {}``; a removed one ``new = {}``. No moment of the sequence leaves a
    member that stays without its group on its leaf or its path to the other members' leaves:
    every switch the new tree adds gets its group first, then new members their
    ``group_member`` entries, then the switches both trees cross change their group in one
    update (only where it differs), then the switches the tree leaves lose their member ports
    and their group, and last the members that left lose their ports.

    Args:
        old: the replication group on each switch of the tree now (``FabricPlan.tree``).
        new: the same for the tree wanted.
        old_members: ``(leaf, port)`` of each member now (``FabricPlan.edge_ports``).
        new_members: the same for the members wanted.
    """
    was, want = set(old_members), set(new_members)
    steps = [TreeStep("create", sw, tuple(reps)) for sw, reps in new.items() if sw not in old]
    steps += [TreeStep("member", sw, port=p) for sw, p in sorted(want - was)]
    steps += [
        TreeStep("modify", sw, tuple(reps))
        for sw, reps in new.items()
        if sw in old and sorted(old[sw]) != sorted(reps)
    ]
    for sw in (s for s in old if s not in new):
        steps += [TreeStep("unmember", sw, port=p) for s, p in sorted(was - want) if s == sw]
        steps.append(TreeStep("delete", sw))
    steps += [TreeStep("unmember", sw, port=p) for sw, p in sorted(was - want) if sw in new]
    return steps
