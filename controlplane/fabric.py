"""The controller's multicast trees across a leaf-spine fabric, and its spine failover.

On a fabric (switches with ``role: leaf | spine`` and ``fabric_links``) a multicast group is
one tree: a replication group under one id on each switch that :meth:`FabricPlan.tree
<kvcast.fabric.FabricPlan.tree>` names (a leaf: its member hosts and the uplink to the tree's
spine; the spine: the member leaves; every leaf with a pool node), with ``group_member``
entries at the members' leaf ports only. Every change of a tree (hosts join or leave, a spine
goes out of service or comes back) is written make before break, in the order
:func:`~kvcast.fabric.tree_steps` gives, through each switch's
:class:`~controlplane.drivers.MulticastDriver`.

Spine failover: when a spine's P4Runtime session is lost (the stream went down: the switch
died, restarted or became unreachable), the spine is marked out of service in the plan that
every switch of the daemon shares; each tree that used it is created on the spine now chosen,
the leaves' groups switched to the new uplink in one update each, and the lost spine's group
forgotten (its next session deletes what it still holds); then the leaves' routes move, one
MODIFY each. When the spine's next session has re-pushed its state (as for any restarted
switch), it is put back in service and routes and trees spread again the same way.

A spine that has no session ``absent_grace_s`` after the daemon started (dead, or
unreachable, when the daemon came up) is taken out of service the same way, and comes back the
same way once a session of it is up.

Link failover: P4Runtime says which switches are in session, not which links carry packets
(a port's operational state is gNMI's, and counters that stop say nothing the traffic could not
also say), so the daemon learns of a leaf-spine link out of service, and back, from an operator
or a monitor: ``POST /v1/fabric/links`` with ``{"leaf", "spine", "up"}``. A link down is put in
the plan's ``down_links``; every tree that crossed it is moved to a spine whose links to all its
leaves are up, make before break as for a spine, and the leaves' routes that crossed it move,
one MODIFY each; a link up spreads them back. A spine or link whose loss would leave two leaves
with no spine in service between them is not taken out (there is nowhere to move to): a spine's
is logged, a link's refused (409).

A switch that is not reachable while a tree changes is skipped: its part is written by its
next session (this module's driver re-installs every tree's part on each switch after the
multicast driver reconciled it).

Classes:
    FabricTrees: the trees (create, update, delete by member set), failover and return of
        spines and links, their status and the links' HTTP routes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
from collections.abc import Coroutine, Iterable, Mapping
from http import HTTPStatus
from typing import Any

from controlplane.drivers.multicast import GroupIds
from controlplane.errors import (
    ConfigError,
    ControlPlaneError,
    FabricCutError,
    NotInstalledError,
    SwitchUnavailableError,
)
from controlplane.metrics import ControllerMetrics
from controlplane.p4rt import ConnectionState, SessionInfo
from controlplane.reports import Handler, Response
from controlplane.runtime import SwitchRuntime
from kvcast import p4constants as c
from kvcast.fabric import FabricPlan, TreeStep, tree_steps

__all__ = ["LINKS_PATH", "FabricTrees"]

_LOG = logging.getLogger("controlplane.daemon")

ABSENT_GRACE_S = 5.0
"""How long after the start a spine may take to reach its first session before it is taken
out of service (the others' first sessions take well under a second on loopback)."""

LINKS_PATH = "/v1/fabric/links"
"""``POST``: a leaf-spine link out of service or back; ``GET``: every link and its state."""

LINK_MOVE_TIMEOUT_S = 30.0
"""How long ``POST /v1/fabric/links`` waits for the move before it answers 504 (it goes on)."""

Tree = dict[str, list[tuple[int, int]]]


class FabricTrees:
    """Multicast trees across the fabric and spine failover (module docstring).

    Registers a driver on every switch's client (after the others: construct it before the
    fleet starts) and a session-lost handler on each.

    Args:
        plan: the fabric's plan, the one the switch runtimes route by.
        switches: every switch of the fabric, by name.
        metrics: where to count moves and show the spines in service.
        group_ids: the multicast group ids trees may use (one id on every switch).
        absent_grace_s: how long after :meth:`start` a spine may take to reach its first
            session before it is taken out of service.
    """

    def __init__(
        self,
        plan: FabricPlan,
        switches: Mapping[str, SwitchRuntime],
        metrics: ControllerMetrics,
        group_ids: range = range(1, c.WRITE_FANOUT_GROUP),
        absent_grace_s: float = ABSENT_GRACE_S,
    ) -> None:
        self.plan = plan
        self._absent_grace_s = absent_grace_s
        self._switches = switches
        self._metrics = metrics
        self._ids = GroupIds(group_ids)
        self._members: dict[int, frozenset[str]] = {}
        self._pools: dict[int, str] = {}
        self._trees: dict[int, Tree] = {}
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        # Switches whose tree driver ran in their current session: writable now.
        self._installed: set[str] = set()
        self._pool = next((n.name for n in plan.nodes.values() if n.role == "pool"), None)
        for name, rt in switches.items():
            rt.client.add_driver(_TreeDriver(self, name))
            rt.client.on_session_lost(functools.partial(self._lost, name))
            if plan.is_spine(name):
                metrics.spine_in_service.labels(name).set_function(
                    functools.partial(self._in_service, name)
                )
        for leaf in plan.leaves:
            for spine in plan.spines:
                metrics.fabric_link_up.labels(leaf, spine).set_function(
                    functools.partial(self._link_up, leaf, spine)
                )

    # ------------------------------------------------------------------ state
    def _in_service(self, spine: str) -> float:
        return float(spine not in self.plan.down_spines)

    def _link_up(self, leaf: str, spine: str) -> float:
        return float((leaf, spine) not in self.plan.down_links)

    def groups(self) -> dict[int, frozenset[str]]:
        """The trees: id -> member host names."""
        return dict(self._members)

    def group_of(self, members: Iterable[str]) -> int | None:
        """The id of the tree with exactly these members, if one exists."""
        wanted = frozenset(members)
        return next((gid for gid, m in self._members.items() if m == wanted), None)

    def tree(self, gid: int) -> Tree:
        """The replication group on each switch of tree ``gid``, as last written.

        Raises:
            NotInstalledError: no such tree.
        """
        try:
            return {sw: list(reps) for sw, reps in self._trees[gid].items()}
        except KeyError:
            raise NotInstalledError(f"no multicast group {gid}") from None

    def status(self) -> dict[str, Any]:
        """The spines and links in service and out, and how many trees each spine carries."""
        by_spine = dict.fromkeys(self.plan.spines, 0)
        for tree in self._trees.values():
            for sw in tree:
                if sw in by_spine:
                    by_spine[sw] += 1
        return {
            "spines_in_service": self.plan.live_spines(),
            "spines_down": sorted(self.plan.down_spines),
            "links_down": [{"leaf": lf, "spine": sp} for lf, sp in sorted(self.plan.down_links)],
            "trees": len(self._trees),
            "trees_by_spine": by_spine,
        }

    # ------------------------------------------------------------------ groups
    async def create_group(self, members: Iterable[str], pool: str | None = None) -> int:
        """Creates a tree over these hosts, make before break.

        Args:
            members: the hosts (any leaves).
            pool: the pool node its DATA comes from (its GETs' spine is the tree's); default:
                the first configured pool node.

        Returns:
            Its id, the same on every switch.

        Raises:
            ConfigError: no members, or no pool node.
            NotInstalledError: a member is not a configured host.
            ResourceExhaustedError: every group id is taken.
            SwitchError: a write failed.
        """
        wanted = self._check(members)
        pool = pool or self._pool
        if pool is None or pool not in self.plan.nodes:
            raise ConfigError(f"a fabric tree needs a configured pool node (got {pool!r})")
        async with self._lock:
            gid = self._ids.take(self._members)
            self._members[gid], self._pools[gid], self._trees[gid] = frozenset(), pool, {}
            try:
                await self._retree(gid, wanted)
            except BaseException:
                await self._scrub(gid, wanted)
                raise
        return gid

    async def _scrub(self, gid: int, members: frozenset[str]) -> None:
        """Undoes what a failed creation of tree ``gid`` wrote, as far as the switches answer.

        A group deleted goes with its member ports; one that cannot be deleted now is
        forgotten, and the switch's next session deletes it.
        """
        for switch in self.plan.tree(members, self._pools[gid]):
            drv = self._switches[switch].multicast
            if gid in drv.groups():
                try:
                    await drv.delete_group(gid)
                except ControlPlaneError:
                    drv.forget_group(gid)
        del self._trees[gid], self._members[gid], self._pools[gid]

    async def update_group(self, gid: int, members: Iterable[str]) -> None:
        """Hosts join and leave tree ``gid``, make before break.

        Raises:
            NotInstalledError: no such tree, or a member is not a configured host.
            ConfigError: no members (delete the group instead).
            SwitchError: a write failed.
        """
        wanted = self._check(members)
        async with self._lock:
            self.tree(gid)
            await self._retree(gid, wanted)

    async def delete_group(self, gid: int) -> None:
        """Deletes tree ``gid`` from every switch (member ports, then the group).

        Raises:
            NotInstalledError: no such tree.
            SwitchError: a write failed.
        """
        async with self._lock:
            self.tree(gid)
            await self._retree(gid, frozenset())

    def _check(self, members: Iterable[str]) -> frozenset[str]:
        wanted = frozenset(members)
        if not wanted:
            raise ConfigError("a multicast group needs at least one member")
        unknown = sorted(h for h in wanted if getattr(self.plan.nodes.get(h), "role", "") != "host")
        if unknown:
            raise NotInstalledError(f"{unknown} are not configured hosts of the fabric")
        return wanted

    async def _retree(self, gid: int, members: frozenset[str]) -> None:
        """Writes tree ``gid`` for ``members`` over the spines in service (empty: removes it)."""
        new: Tree = self.plan.tree(members, self._pools[gid]) if members else {}
        old = self._trees[gid]
        steps = tree_steps(
            old, new, self.plan.edge_ports(self._members[gid]), self.plan.edge_ports(members)
        )
        for step in steps:
            await self._write(gid, step, members)
        if members:
            self._trees[gid], self._members[gid] = new, members
        else:
            del self._trees[gid], self._members[gid], self._pools[gid]

    def _writable(self, switch: str) -> bool:
        state = self._switches[switch].client.state
        return switch in self._installed and state in (
            ConnectionState.SYNCING,
            ConnectionState.READY,
        )

    async def _write(self, gid: int, step: TreeStep, members: frozenset[str]) -> None:
        """One step on its switch; one that is unreachable is left to its next session."""
        drv = self._switches[step.switch].multicast
        try:
            if not self._writable(step.switch):
                raise SwitchUnavailableError(step.switch, "not in session")
            if step.op in ("create", "modify"):
                await drv.put_group(gid, self._hosts_on(step.switch, members), _fabric(step))
            elif step.op == "member":
                await drv.add_member_port(gid, step.port)
            elif step.op == "unmember":
                await drv.remove_member_port(gid, step.port)
            else:
                await drv.delete_group(gid)
        except SwitchUnavailableError:
            # What it should not hold any more is forgotten (its next session deletes it);
            # what it should hold, its next session writes (_TreeDriver).
            if step.op == "delete":
                drv.forget_group(gid)
            elif step.op == "unmember":
                drv.forget_member_port(gid, step.port)

    def _hosts_on(self, switch: str, members: Iterable[str]) -> list[str]:
        return sorted(h for h in members if self.plan.nodes[h].switch == switch)

    # ------------------------------------------------------------------ sessions
    async def reinstall_switch(self, name: str) -> None:
        """Writes ``name``'s part of every tree (a driver re-install; unchanged: nothing sent)."""
        async with self._lock:
            drv = self._switches[name].multicast
            for gid, tree in sorted(self._trees.items()):
                part = tree.get(name)
                if part is None:
                    continue
                members = self._members[gid]
                await drv.put_group(gid, self._hosts_on(name, members), _fabric_of(part))
                for leaf, port in sorted(self.plan.edge_ports(members)):
                    if leaf == name:
                        await drv.add_member_port(gid, port)
            self._installed.add(name)
        if name in self.plan.down_spines:
            self._schedule(self.bring_spine_up(name), f"{name}-back")

    def _lost(self, name: str) -> None:
        """A switch's session went down: a spine is taken out of service."""
        self._installed.discard(name)
        if self.plan.is_spine(name):
            self._schedule(self.take_spine_down(name), f"{name}-down")

    def _schedule(self, work: Coroutine[Any, Any, None], name: str) -> None:
        async def logged() -> None:
            try:
                await work
            except ControlPlaneError as exc:
                _LOG.error(
                    "fabric move failed: %s",
                    exc,
                    extra={"event": "fabric_error", "task": name},
                )

        task = asyncio.get_running_loop().create_task(logged(), name=f"fabric-{name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def start(self) -> None:
        """Starts watching for spines without a first session (after the fleet started)."""
        self._schedule(self._absent_spines(), "absent")

    async def _absent_spines(self) -> None:
        await asyncio.sleep(self._absent_grace_s)
        for spine in self.plan.spines:
            await self.take_spine_down(spine, unless_in_session=True)

    async def take_spine_down(self, spine: str, unless_in_session: bool = False) -> None:
        """Moves every route and tree off ``spine``, make before break (module docstring).

        The last spine in service stays, and so does one without which two leaves would have
        no spine in service between them (there is nowhere to move to); that is logged.

        Args:
            spine: the spine.
            unless_in_session: leave it in service if it has a session now.

        Raises:
            ConfigError: not a spine of this fabric.
        """
        if not self.plan.is_spine(spine):
            raise ConfigError(f"{spine!r} is not a spine")
        async with self._lock:
            if spine in self.plan.down_spines:
                return
            if unless_in_session and spine in self._installed:
                return
            self.plan.down_spines.add(spine)
            cut = self.plan.cut_leaves()
            if cut or not self.plan.live_spines():
                self.plan.down_spines.discard(spine)
                _LOG.error(
                    "spine %s lost, and no spine in service would be left (between %s): "
                    "nothing to move to",
                    spine,
                    cut or "any leaves",
                    extra={"event": "spine_down", "switch": spine, "moved": False},
                )
                return
            await self._move("spine_down", spine)

    async def bring_spine_up(self, spine: str) -> None:
        """Puts ``spine`` back in service once its session is READY; routes and trees spread."""
        await self._switches[spine].client.wait_ready()
        async with self._lock:
            if spine not in self.plan.down_spines or not self._writable(spine):
                return
            self.plan.down_spines.discard(spine)
            await self._move("spine_up", spine)

    # ------------------------------------------------------------------ links
    def _check_link(self, leaf: str, spine: str) -> None:
        if not self.plan.has_link(leaf, spine):
            raise ConfigError(f"{leaf!r}-{spine!r} is not a leaf-spine link of this fabric")

    async def take_link_down(self, leaf: str, spine: str) -> bool:
        """Moves every route and tree off the ``leaf``-``spine`` link, make before break.

        Returns:
            Whether it was in service (False: already out, nothing moved).

        Raises:
            ConfigError: no such link.
            FabricCutError: two leaves would have no spine in service between them; the link
                stays in service.
        """
        self._check_link(leaf, spine)
        async with self._lock:
            if (leaf, spine) in self.plan.down_links:
                return False
            self.plan.down_links.add((leaf, spine))
            cut = self.plan.cut_leaves()
            if cut:
                self.plan.down_links.discard((leaf, spine))
                raise FabricCutError(
                    f"taking {leaf}-{spine} out of service would leave no spine in service "
                    f"between the leaves of {cut}: it stays in service"
                )
            await self._move("link_down", f"{leaf}-{spine}")
        return True

    async def bring_link_up(self, leaf: str, spine: str) -> bool:
        """Puts the ``leaf``-``spine`` link back in service; routes and trees spread again.

        Returns:
            Whether it was out of service (False: already in, nothing moved).

        Raises:
            ConfigError: no such link.
        """
        self._check_link(leaf, spine)
        async with self._lock:
            if (leaf, spine) not in self.plan.down_links:
                return False
            self.plan.down_links.discard((leaf, spine))
            await self._move("link_up", f"{leaf}-{spine}")
        return True

    def links(self) -> list[dict[str, Any]]:
        """Every leaf-spine link and whether it is in service."""
        return [
            {"leaf": lf, "spine": sp, "up": (lf, sp) not in self.plan.down_links}
            for lf in self.plan.leaves
            for sp in self.plan.spines
        ]

    def routes(self, loop: asyncio.AbstractEventLoop) -> dict[tuple[str, str], Handler]:
        """``POST /v1/fabric/links`` (a link out of service or back) and ``GET`` (the links).

        The POST body is ``{"leaf": "s1", "spine": "s3", "up": false}``; it is answered once
        the routes and trees have moved: ``200 {"changed": bool, "links_down": [...]}``,
        ``400`` for a body that is not such an object or names no link of the fabric, ``409``
        when the link is the last between two leaves (it stays in service), ``504`` when the
        move takes longer than :data:`LINK_MOVE_TIMEOUT_S` (it goes on).

        Args:
            loop: the daemon's event loop (the HTTP server's threads hand the move to it).
        """

        def post(body: bytes) -> Response:
            try:
                leaf, spine, up = _parse_link(body)
                self._check_link(leaf, spine)
            except ConfigError as exc:
                return Response.json(HTTPStatus.BAD_REQUEST, {"error": str(exc)})
            work = self.bring_link_up(leaf, spine) if up else self.take_link_down(leaf, spine)
            moved = asyncio.run_coroutine_threadsafe(work, loop)
            try:
                changed = moved.result(LINK_MOVE_TIMEOUT_S)
            except FabricCutError as exc:
                return Response.json(HTTPStatus.CONFLICT, {"error": str(exc)})
            except TimeoutError:
                return Response.json(
                    HTTPStatus.GATEWAY_TIMEOUT,
                    {"error": f"not moved within {LINK_MOVE_TIMEOUT_S} s; the move goes on"},
                )
            return Response.json(
                HTTPStatus.OK, {"changed": changed, "links_down": self.status()["links_down"]}
            )

        def listing(_body: bytes) -> Response:
            return Response.json(HTTPStatus.OK, {"links": self.links()})

        return {("POST", LINKS_PATH): post, ("GET", LINKS_PATH): listing}

    async def _move(self, reason: str, subject: str) -> None:
        """Re-points every tree, then the leaves' routes, at the spines and links in service."""
        moved = 0
        for gid in sorted(self._trees):
            before = self._trees[gid]
            try:
                await self._retree(gid, self._members[gid])
            except ControlPlaneError as exc:
                _LOG.error(
                    "tree %d not moved: %s",
                    gid,
                    exc,
                    extra={"event": "fabric_error", "subject": subject, "group": gid},
                )
            moved += self._trees[gid] != before
        for leaf in self.plan.leaves:
            if self._writable(leaf):
                # If it went away meanwhile, its next session installs the plan's routes.
                with contextlib.suppress(SwitchUnavailableError):
                    await self._switches[leaf].fabric_routes()
        self._metrics.fabric_moves.labels(reason).inc()
        _LOG.warning(
            "fabric moved: %s %s",
            reason,
            subject,
            extra={
                "event": reason,
                "subject": subject,
                "trees_moved": moved,
                "spines_in_service": self.plan.live_spines(),
            },
        )

    async def stop(self) -> None:
        """Cancels the failover work in flight (the daemon stops)."""
        tasks, self._tasks = list(self._tasks), set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class _TreeDriver:
    """Re-installs a switch's part of every tree after each (re)connection."""

    def __init__(self, trees: FabricTrees, name: str) -> None:
        self._trees = trees
        self._name = name

    async def reinstall(self, session: SessionInfo) -> None:
        del session  # the multicast driver reconciled what the switch holds already
        await self._trees.reinstall_switch(self._name)


def _parse_link(body: bytes) -> tuple[str, str, bool]:
    """``{"leaf": str, "spine": str, "up": bool}`` from a request body.

    Raises:
        ConfigError: not JSON, not such an object, a field missing, of the wrong type, or extra.
    """
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"the body is not JSON: {exc}") from None
    if not isinstance(doc, dict) or set(doc) != {"leaf", "spine", "up"}:
        raise ConfigError('the body must be {"leaf": name, "spine": name, "up": true|false}')
    leaf, spine, up = doc["leaf"], doc["spine"], doc["up"]
    if not isinstance(leaf, str) or not isinstance(spine, str) or not isinstance(up, bool):
        raise ConfigError('"leaf" and "spine" must be names, "up" true or false')
    return leaf, spine, up


def _fabric_of(replicas: Iterable[tuple[int, int]]) -> list[int]:
    """The fabric ports of a switch's part of a tree (replica id 0: sent as is)."""
    return [port for port, rid in replicas if rid == 0]


def _fabric(step: TreeStep) -> list[int]:
    return _fabric_of(step.replicas)
