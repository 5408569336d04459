"""Driver of multicast delivery: PRE groups for consumer sets and the egress replica_dst table.

A GET or pool DATA with ``group = G`` is replicated by the switch to every member of multicast
group G, each replica being ``(egress port, instance)`` where the instance is the member's
*replica id*; egress then rewrites each replica's MAC, IPv4 address and UDP port from the
``replica_dst`` entry of that replica id (docs/protocol.md, "Multicast groups"). A host may name
a group in a GET only from a member's port: with each group the driver writes one
``group_member`` entry per member port, and the switch drops a GET naming any other group
(docs/security.md).

So each host gets one replica id for its lifetime (and one replica_dst entry), and each consumer
set (hosts fetching the same prefix together) gets one group whose replicas are its members'
``(port, replica id)``. Group ids are handed out round-robin rather than lowest-first, so a
deleted group's id is not reused at once while a host may still put it in a GET.

On a leaf-spine fabric a group is one tree over several switches (controlplane.fabric), under
one id on all of them: there the caller names the id (:meth:`MulticastDriver.put_group`), the
switch's part of the tree is its member hosts plus fabric ports (replica id 0, sent as is:
a leaf's uplink, a spine's downlinks), and ``group_member`` entries are written port by port
in the tree change's order.

Classes:
    HostEndpoint: a host that can be a group member (where replicas go).
    GroupIds: multicast group ids handed out round-robin.
    MulticastDriver: hosts (replica ids, replica_dst), groups (create / update / delete, one
        per consumer set, or a fabric tree's part by id), re-installed after a reconnect.
"""

from __future__ import annotations

from collections.abc import Container, Iterable
from dataclasses import dataclass
from typing import Any

import finsy as fy

from controlplane.drivers.base import EntrySpec, MatchKey, TableMirror, ip_int, mac_int
from controlplane.errors import ConfigError, NotInstalledError, ResourceExhaustedError
from controlplane.p4rt import SessionInfo, SwitchClient
from kvcast import p4constants as c

TABLE = c.TABLE_EGRESS_REPLICA_REPLICA_DST
ACTION = c.ACTION_EGRESS_REPLICA_SET_REPLICA_DST
T_MEMBER = c.TABLE_INGRESS_PORT_ROLE_GROUP_MEMBER
A_MEMBER = c.ACTION_INGRESS_PORT_ROLE_MEMBER


@dataclass(frozen=True)
class HostEndpoint:
    """A host that can receive multicast replicas.

    Attributes:
        name: unique host name.
        port: the switch port it is reached through.
        mac: its MAC address.
        ip: its IPv4 address.
        udp_port: the UDP port its fetch client listens on.
    """

    name: str
    port: int
    mac: str
    ip: str
    udp_port: int


def _rid_key(rid: int) -> MatchKey:
    return (("rid", rid),)


def _member_key(gid: int, port: int) -> MatchKey:
    return (("group", gid), ("port", port))


class GroupIds:
    """Multicast group ids handed out round-robin, so a freed id is not reused at once.

    Args:
        ids: the ids it may hand out.
    """

    def __init__(self, ids: range) -> None:
        self.ids = ids
        self._next = 0  # index into ids of the next id to try

    def take(self, used: Container[int]) -> int:
        """The next id after the last one taken that is not in ``used``.

        Raises:
            ResourceExhaustedError: every id is used.
        """
        n = len(self.ids)
        for step in range(n):
            gid = self.ids[(self._next + step) % n]
            if gid not in used:
                self._next = (self._next + step + 1) % n
                return gid
        raise ResourceExhaustedError(f"all {n} multicast group ids are in use")


class MulticastDriver:
    """Replica ids and replica_dst entries for hosts; multicast groups for consumer sets.

    Args:
        client: the switch.
        group_ids: the multicast group ids this driver may use for hosts (the KVP ``group``
            field and v1model's ``mcast_grp`` are 16 bits; 0 means "no group", and
            ``WRITE_FANOUT_GROUP`` is the WRITE fan-out's).
        replica_ids: the replica ids it may give hosts (0 means "not a replica"; the
            replica_dst table has ``REPLICA_ENTRIES`` entries).

    Raises:
        ConfigError: a range includes 0.
    """

    def __init__(
        self,
        client: SwitchClient,
        *,
        group_ids: range = range(1, c.WRITE_FANOUT_GROUP),
        replica_ids: range = range(1, c.REPLICA_ENTRIES + 1),
    ) -> None:
        if 0 in group_ids or 0 in replica_ids or not group_ids or not replica_ids:
            raise ConfigError("group and replica id ranges must be non-empty and exclude 0")
        if c.WRITE_FANOUT_GROUP in group_ids:
            raise ConfigError(f"group {c.WRITE_FANOUT_GROUP} is the WRITE fan-out's, not a host's")
        self._client = client
        self._replica_dst = TableMirror(client, TABLE)
        self._members = TableMirror(client, T_MEMBER)
        self._group_ids = GroupIds(group_ids)
        self._replica_ids = replica_ids
        self._hosts: dict[str, HostEndpoint] = {}
        self._rids: dict[str, int] = {}
        self._groups: dict[int, frozenset[str]] = {}
        # A fabric tree's fabric ports on this switch, by group (replica id 0).
        self._fabric: dict[int, tuple[int, ...]] = {}
        self._fanout: tuple[int, ...] = ()  # the WRITE fan-out ports (Tofino), one per pipe

    # ------------------------------------------------------------------ state
    def hosts(self) -> dict[str, HostEndpoint]:
        """The registered hosts by name."""
        return dict(self._hosts)

    def replica_id(self, host: str) -> int:
        """A host's replica id.

        Raises:
            NotInstalledError: no such host.
        """
        try:
            return self._rids[host]
        except KeyError:
            raise NotInstalledError(f"no host {host!r}") from None

    def groups(self) -> dict[int, frozenset[str]]:
        """The installed groups: id -> member host names."""
        return dict(self._groups)

    def group_of(self, members: Iterable[str]) -> int | None:
        """The id of the group with exactly these members, if one exists."""
        wanted = frozenset(members)
        return next((gid for gid, m in self._groups.items() if m == wanted), None)

    # ------------------------------------------------------------------ hosts
    async def add_host(self, host: HostEndpoint) -> int:
        """Registers a host (or changes its address): replica id and replica_dst entry.

        A host whose switch port changed is also moved in every group it belongs to.

        Returns:
            The host's replica id.

        Raises:
            ResourceExhaustedError: every replica id is taken.
            ConfigError: a bad address.
            SwitchError: a write failed (nothing changed).
        """
        rid = self._rids.get(host.name)
        if rid is None:
            used = set(self._rids.values())
            rid = next((r for r in self._replica_ids if r not in used), None)
            if rid is None:
                raise ResourceExhaustedError(
                    f"all {len(self._replica_ids)} replica ids are in use; remove a host"
                )
        spec = EntrySpec.of(
            dict(_rid_key(rid)),
            ACTION,
            {"dmac": mac_int(host.mac), "dip": ip_int(host.ip), "dport": host.udp_port},
        )
        await self._replica_dst.apply(puts=[spec])
        old = self._hosts.get(host.name)
        self._hosts[host.name] = host
        self._rids[host.name] = rid
        if old is not None and old.port != host.port:
            moved = [(gid, m) for gid, m in self._groups.items() if host.name in m]
            await self._write_groups(moved, modify=True)
            for gid, m in moved:
                await self._write_members(gid, m)
        return rid

    async def remove_host(self, name: str) -> None:
        """Removes a host: from every group (deleting groups left empty), then its entry.

        Raises:
            NotInstalledError: no such host.
            SwitchError: a write failed.
        """
        rid = self.replica_id(name)
        for gid, members in sorted(self._groups.items()):
            if name in members:
                rest = members - {name}
                if rest:
                    await self.update_group(gid, rest)
                else:
                    await self.delete_group(gid)
        await self._replica_dst.apply(removes=[_rid_key(rid)])
        del self._hosts[name]
        del self._rids[name]

    # ------------------------------------------------------------------ groups
    async def group_for(self, members: Iterable[str]) -> int:
        """The group of this consumer set: the existing one, or a new one.

        Raises:
            NotInstalledError: a member is not a registered host.
            ResourceExhaustedError: every group id is taken.
            SwitchError: a write failed.
        """
        wanted = frozenset(members)
        gid = self.group_of(wanted)
        return gid if gid is not None else await self.create_group(wanted)

    async def create_group(self, members: Iterable[str]) -> int:
        """Creates a group of these hosts.

        Returns:
            Its id.

        Raises:
            ConfigError: no members.
            NotInstalledError: a member is not a registered host.
            ResourceExhaustedError: every group id is taken.
            SwitchError: a write failed.
        """
        wanted = self._check_members(members)
        gid = self._free_group_id()
        await self._write_groups([(gid, wanted)], modify=False)
        self._groups[gid] = wanted
        await self._write_members(gid, wanted)
        return gid

    async def update_group(self, gid: int, members: Iterable[str]) -> None:
        """Replaces a group's members.

        Raises:
            NotInstalledError: no such group, or a member is not a registered host.
            ConfigError: no members (delete the group instead).
            SwitchError: a write failed.
        """
        if gid not in self._groups:
            raise NotInstalledError(f"no multicast group {gid}")
        wanted = self._check_members(members)
        if wanted != self._groups[gid]:
            await self._write_groups([(gid, wanted)], modify=True)
            self._groups[gid] = wanted
            await self._write_members(gid, wanted)

    async def delete_group(self, gid: int) -> None:
        """Deletes a group: GETs and DATA naming it are no longer replicated.

        Raises:
            NotInstalledError: no such group.
            SwitchError: a write failed.
        """
        if gid not in self._groups:
            raise NotInstalledError(f"no multicast group {gid}")
        await self._client.write([-fy.P4MulticastGroupEntry(gid)])
        del self._groups[gid]
        self._fabric.pop(gid, None)
        await self._write_members(gid, frozenset())

    # ------------------------------------------------------------------ fabric trees
    async def put_group(self, gid: int, hosts: Iterable[str], fabric_ports: Iterable[int]) -> None:
        """Makes group ``gid`` replicate to these hosts and fabric ports: a tree's part here.

        Inserted when new, modified in one update when it differs, nothing sent when it does
        not. ``group_member`` is left alone (:meth:`add_member_port`).

        Raises:
            NotInstalledError: a host is not registered.
            ConfigError: neither hosts nor fabric ports.
            SwitchError: the write failed (nothing changed).
        """
        wanted = frozenset(hosts)
        ports = tuple(sorted(set(fabric_ports)))
        if not ports:
            wanted = self._check_members(wanted)
        elif wanted - set(self._hosts):
            raise NotInstalledError(f"hosts {sorted(wanted - set(self._hosts))} not registered")
        known = gid in self._groups
        if known and self._groups[gid] == wanted and self._fabric.get(gid, ()) == ports:
            return
        entry = fy.P4MulticastGroupEntry(gid, replicas=self._replicas(wanted, ports))
        await self._client.write([~entry if known else +entry])
        self._groups[gid] = wanted
        self._fabric[gid] = ports

    async def add_member_port(self, gid: int, port: int) -> None:
        """Lets the host on ``port`` name group ``gid`` in a GET (its ``group_member`` entry).

        Raises:
            SwitchError: the write failed.
        """
        await self._members.apply(puts=[EntrySpec.of(dict(_member_key(gid, port)), A_MEMBER, {})])

    async def remove_member_port(self, gid: int, port: int) -> None:
        """Removes the ``group_member`` entry of ``port`` for group ``gid``.

        Raises:
            SwitchError: the write failed.
        """
        await self._members.apply(removes=[_member_key(gid, port)])

    def forget_member_port(self, gid: int, port: int) -> None:
        """Drops one ``group_member`` entry from what the switch should hold, writing nothing."""
        self._members.forget(_member_key(gid, port))

    def forget_group(self, gid: int) -> None:
        """Drops group ``gid`` and its member ports from what the switch should hold.

        Writes nothing: the switch is unreachable, and its next session deletes what it still
        has.
        """
        self._groups.pop(gid, None)
        self._fabric.pop(gid, None)
        for spec in self._members.specs():
            if dict(spec.match)["group"] == gid:
                self._members.forget(spec.match)

    async def set_write_fanout(self, ports: Iterable[int]) -> None:
        """Makes group ``WRITE_FANOUT_GROUP`` replicate a WRITE to these ports (one per pipe).

        On a Tofino the fragment store is per pipe: the program multicasts each WRITE from the
        CPU port to this group, and every pipe stores the copy that comes back in on its port.
        The replicas carry replica id 0, which egress leaves unchanged. An empty list removes
        the group.

        Raises:
            SwitchError: the write failed.
        """
        wanted = tuple(sorted(set(ports)))
        if wanted == self._fanout:
            return
        entry = fy.P4MulticastGroupEntry(c.WRITE_FANOUT_GROUP, replicas=[(p, 0) for p in wanted])
        if not wanted:
            update = -fy.P4MulticastGroupEntry(c.WRITE_FANOUT_GROUP)
        else:
            update = ~entry if self._fanout else +entry
        await self._client.write([update])
        self._fanout = wanted

    # ------------------------------------------------------------------ reinstall
    async def reinstall(self, session: SessionInfo) -> None:
        """Makes the switch hold exactly this driver's replica_dst entries and groups.

        Raises:
            SwitchError: a read or write failed.
        """
        await self._replica_dst.reconcile()
        await self._members.reconcile()
        installed: dict[int, tuple[tuple[int, int], ...]] = {}
        if not session.pipeline_pushed:
            for ent in await self._client.read([fy.P4MulticastGroupEntry()]):
                installed[ent.multicast_group_id] = tuple(
                    sorted(_replica_tuple(r) for r in ent.replicas)
                )
        wanted = {
            g: tuple(self._replicas(m, self._fabric.get(g, ()))) for g, m in self._groups.items()
        }
        if self._fanout:
            wanted[c.WRITE_FANOUT_GROUP] = tuple((p, 0) for p in self._fanout)
        orphans = sorted(set(installed) - set(wanted))
        differ = [g for g in sorted(wanted) if g in installed and installed[g] != wanted[g]]
        missing = [g for g in sorted(wanted) if g not in installed]

        def entry(g: int) -> fy.P4MulticastGroupEntry:
            return fy.P4MulticastGroupEntry(g, replicas=list(wanted[g]))

        updates: list[Any] = [-fy.P4MulticastGroupEntry(g) for g in orphans]
        updates += [~entry(g) for g in differ]
        updates += [+entry(g) for g in missing]
        if updates:
            await self._client.write(updates)

    # ------------------------------------------------------------------ internals
    def _check_members(self, members: Iterable[str]) -> frozenset[str]:
        wanted = frozenset(members)
        if not wanted:
            raise ConfigError("a multicast group needs at least one member")
        unknown = sorted(wanted - set(self._hosts))
        if unknown:
            raise NotInstalledError(f"hosts {unknown} are not registered (add_host first)")
        return wanted

    def _free_group_id(self) -> int:
        return self._group_ids.take(self._groups)

    def _replicas(
        self, members: frozenset[str], fabric_ports: Iterable[int] = ()
    ) -> list[tuple[int, int]]:
        hosts = [(self._hosts[h].port, self._rids[h]) for h in members]
        return sorted(hosts + [(port, 0) for port in fabric_ports])

    async def _write_members(self, gid: int, members: frozenset[str]) -> None:
        """Makes ``group_member`` hold exactly the member ports of group ``gid``."""
        ports = {self._hosts[h].port for h in members}
        held = {m for m in (s.match for s in self._members.specs()) if dict(m)["group"] == gid}
        wanted = {(("group", gid), ("port", port)) for port in ports}
        await self._members.apply(
            puts=[EntrySpec.of(dict(m), A_MEMBER, {}) for m in sorted(wanted)],
            removes=sorted(held - wanted),
        )

    def _group_entry(self, gid: int, members: frozenset[str]) -> fy.P4MulticastGroupEntry:
        return fy.P4MulticastGroupEntry(
            gid, replicas=self._replicas(members, self._fabric.get(gid, ()))
        )

    async def _write_groups(
        self, groups: list[tuple[int, frozenset[str]]], *, modify: bool
    ) -> None:
        entries = [self._group_entry(g, m) for g, m in groups]
        if entries:
            await self._client.write([~e if modify else +e for e in entries])


def _replica_tuple(replica: Any) -> tuple[int, int]:
    if isinstance(replica, int):
        return (replica, 0)
    if isinstance(replica, tuple):
        return (int(replica[0]), int(replica[1]))
    return (int(replica.port), int(replica.instance))
