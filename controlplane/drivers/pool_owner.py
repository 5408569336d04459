"""Driver of the PoolOwner control: which DRAM pool node serves the keys of each bucket.

A GET that misses the switch cache goes to the pool node owning the key's low
``POOL_BUCKET_BITS`` bits (``POOL_BUCKETS`` buckets, p4src/v1model/include/control/pool_owner.p4).
Buckets are spread over pool nodes by consistent hashing with virtual nodes: every node puts
``vnodes`` points on a 64-bit ring, every bucket is hashed onto the ring too and belongs to the
node of the next point clockwise. A node joining takes over only the buckets its new points now
precede (about 1/N of them) and a node leaving hands over only its own, so pool nodes keep most
of their keys (and whatever they cached) when membership changes; the driver writes exactly the
buckets whose owner changed.

Buckets are hashed onto the ring rather than used as ring positions because the 256 bucket
numbers are consecutive integers: hashed, they spread like keys do.

Classes:
    PoolNode: a pool node (name and IPv4 address).
    ConsistentHashRing: buckets -> node names, with virtual nodes.
    PoolOwnerDriver: keeps pool_owner equal to the ring, writing only changed buckets.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

from controlplane.drivers.base import EntrySpec, MatchKey, TableMirror, ip_int
from controlplane.errors import ConfigError, NotInstalledError
from controlplane.p4rt import SessionInfo, SwitchClient
from kvcast import p4constants as c

TABLE = c.TABLE_INGRESS_POOL_OWNER_POOL_OWNER
ACTION = c.ACTION_INGRESS_POOL_OWNER_SET_POOL


def _point(label: str) -> int:
    return int.from_bytes(hashlib.blake2b(label.encode(), digest_size=8).digest(), "big")


@dataclass(frozen=True)
class PoolNode:
    """A DRAM pool node.

    Attributes:
        name: unique name (its ring identity: the same name keeps the same buckets).
        ip: the IPv4 address a missed GET is rewritten to.
    """

    name: str
    ip: str


class ConsistentHashRing:
    """Maps buckets to node names by consistent hashing with virtual nodes.

    Args:
        buckets: number of buckets (``POOL_BUCKETS``).
        vnodes: ring points per node; more points spread buckets more evenly.

    Raises:
        ConfigError: non-positive buckets or vnodes.
    """

    def __init__(self, buckets: int = c.POOL_BUCKETS, vnodes: int = 128) -> None:
        if buckets <= 0 or vnodes <= 0:
            raise ConfigError("buckets and vnodes must be positive")
        self._buckets = buckets
        self._vnodes = vnodes
        self._bucket_points = [_point(f"bucket/{b}") for b in range(buckets)]
        self._points: list[int] = []
        self._owners: list[str] = []  # parallel to _points
        self._nodes: set[str] = set()

    @property
    def vnodes(self) -> int:
        """Ring points per node."""
        return self._vnodes

    @property
    def nodes(self) -> frozenset[str]:
        """The node names on the ring."""
        return frozenset(self._nodes)

    def add(self, node: str) -> None:
        """Puts a node's virtual nodes on the ring (no-op if present)."""
        if node in self._nodes:
            return
        self._nodes.add(node)
        for i in range(self._vnodes):
            p = _point(f"node/{node}/{i}")
            at = bisect.bisect_left(self._points, p)
            self._points.insert(at, p)
            self._owners.insert(at, node)

    def remove(self, node: str) -> None:
        """Takes a node off the ring (no-op if absent)."""
        if node not in self._nodes:
            return
        self._nodes.discard(node)
        keep = [(p, o) for p, o in zip(self._points, self._owners, strict=True) if o != node]
        self._points = [p for p, _ in keep]
        self._owners = [o for _, o in keep]

    def owner(self, bucket: int) -> str | None:
        """The node owning a bucket (None when the ring is empty)."""
        if not self._points:
            return None
        at = bisect.bisect_right(self._points, self._bucket_points[bucket])
        return self._owners[at % len(self._points)]

    def assignment(self) -> list[str | None]:
        """The owner of every bucket, by bucket number."""
        return [self.owner(b) for b in range(self._buckets)]


def _bucket_key(bucket: int) -> MatchKey:
    return (("bucket", bucket),)


class PoolOwnerDriver:
    """Keeps the pool_owner table equal to a consistent-hash ring of pool nodes.

    Args:
        client: the switch.
        vnodes: ring points per pool node.
    """

    def __init__(self, client: SwitchClient, *, vnodes: int = 128) -> None:
        self._client = client
        self._ring = ConsistentHashRing(c.POOL_BUCKETS, vnodes)
        self._nodes: dict[str, PoolNode] = {}
        self._mirror = TableMirror(client, TABLE)

    def nodes(self) -> dict[str, PoolNode]:
        """The pool nodes by name."""
        return dict(self._nodes)

    def owners(self) -> dict[int, PoolNode]:
        """The bucket -> pool node map the switch holds (buckets of no node are absent)."""
        out: dict[int, PoolNode] = {}
        for b, name in enumerate(self._ring.assignment()):
            if name is not None:
                out[b] = self._nodes[name]
        return out

    async def add_node(self, node: PoolNode) -> int:
        """Adds a pool node, or changes its address.

        Returns:
            The number of buckets written.

        Raises:
            ConfigError: a bad address.
            SwitchError: the write failed (nothing changed).
        """
        others = [n for n in self._nodes.values() if n.name != node.name]
        return await self.set_nodes([*others, node])

    async def remove_node(self, name: str) -> int:
        """Removes a pool node; its buckets move to the remaining nodes.

        Returns:
            The number of buckets written.

        Raises:
            NotInstalledError: no such node.
            SwitchError: the write failed (nothing changed).
        """
        if name not in self._nodes:
            raise NotInstalledError(f"no pool node {name!r}")
        return await self.set_nodes(n for n in self._nodes.values() if n.name != name)

    async def set_nodes(self, nodes: Iterable[PoolNode]) -> int:
        """Makes the pool exactly these nodes, writing only the buckets whose owner changed.

        With no nodes left every bucket entry is deleted (misses keep their destination).

        Returns:
            The number of buckets written.

        Raises:
            ConfigError: duplicate names or a bad address.
            SwitchError: the write failed (nothing changed).
        """
        wanted: dict[str, PoolNode] = {}
        for node in nodes:
            if node.name in wanted:
                raise ConfigError(f"pool node {node.name!r} given twice")
            ip_int(node.ip)
            wanted[node.name] = node
        ring = ConsistentHashRing(c.POOL_BUCKETS, self._ring.vnodes)
        for name in wanted:
            ring.add(name)
        puts: list[EntrySpec] = []
        removes: list[MatchKey] = []
        for bucket, owner in enumerate(ring.assignment()):
            if owner is None:
                removes.append(_bucket_key(bucket))
            else:
                puts.append(self._spec(bucket, wanted[owner]))
        result = await self._mirror.apply(puts=puts, removes=removes)
        self._ring = ring
        self._nodes = wanted
        return result.deleted + result.modified + result.inserted

    async def reinstall(self, session: SessionInfo) -> None:
        """Makes the switch's pool_owner table equal to the ring.

        Raises:
            SwitchError: a read or write failed.
        """
        await self._mirror.reconcile()

    @staticmethod
    def _spec(bucket: int, node: PoolNode) -> EntrySpec:
        return EntrySpec.of(dict(_bucket_key(bucket)), ACTION, {"pool_ip": ip_int(node.ip)})
