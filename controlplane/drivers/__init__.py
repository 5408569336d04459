"""One driver per P4 control, each a class bound to one :class:`~controlplane.p4rt.SwitchClient`.

Every driver keeps the state it wants the switch to hold and implements
``reinstall(session)`` so the P4Runtime layer can make a reconnected or restarted switch hold it
again (register drivers with ``client.add_driver``).

Classes:
    CacheTableDriver: cache_table entries and their direct hit counters (owned by the loader).
    FragmentLoader: loads chunks into fragment slots with WRITE PacketOuts, in the safe order.
    EpochClock: epochs for loads, never reused.
    MulticastDriver: replica ids, replica_dst entries and multicast groups for consumer sets.
    PoolOwnerDriver: pool_owner buckets by consistent hashing with virtual nodes.
    ForwardingDriver: ipv4_lpm, l2_fwd and port_role.
    SketchDriver: sketch_config threshold and windows.
    StatsDriver: drop / event counters, cache hits, hot-miss digests.
"""

from controlplane.drivers.base import EntrySpec, ReconcileResult, TableMirror
from controlplane.drivers.cache_table import CacheEntry, CacheTableDriver, ChunkId
from controlplane.drivers.forwarding import ForwardingDriver, Route
from controlplane.drivers.fragments import CpuEndpoint, EpochClock, FragmentLoader
from controlplane.drivers.multicast import HostEndpoint, MulticastDriver
from controlplane.drivers.pool_owner import ConsistentHashRing, PoolNode, PoolOwnerDriver
from controlplane.drivers.sketch import SketchDriver
from controlplane.drivers.stats import HotMiss, StatsDriver, SwitchCounters

__all__ = [
    "CacheEntry",
    "CacheTableDriver",
    "ChunkId",
    "ConsistentHashRing",
    "CpuEndpoint",
    "EntrySpec",
    "EpochClock",
    "ForwardingDriver",
    "FragmentLoader",
    "HostEndpoint",
    "HotMiss",
    "MulticastDriver",
    "PoolNode",
    "PoolOwnerDriver",
    "ReconcileResult",
    "Route",
    "SketchDriver",
    "StatsDriver",
    "SwitchCounters",
    "TableMirror",
]
