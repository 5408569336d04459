"""Reader-chosen replicas: the key a chunk's replica is stored and read under.

The switch sends a GET to the pool node that owns the key's bucket (its low 8 bits,
``POOL_BUCKETS`` buckets; the pool-owner table). With a prefix replicated on ``count`` pool
nodes and the buckets spread ``bucket -> owners[bucket mod count]``, a reader that wants replica
``r`` (engine ``i`` reading replica ``i mod count``, so that N readers spread over the count
pool links as Mooncake's replica-aware client spreads them) names the key whose bucket is in
``r``'s residue class: the chunk's key with only the bucket's low bits changed. Each replica
holds the chunk under its own key (and, where MACs are on, a MAC object made for that key:
a MAC names the key it was made for), so the switch needs no per-reader state. Two chunks whose
keys differ only in their low ``log2(count)`` bits share replica keys; chunk keys are hashes,
so a pair does with odds of ``2**-(64 - log2(count))``, and whoever makes the copies refuses
such a pair rather than store one under the other's key.

Functions:
    check_replica: validates a ``(replica, count)`` pair.
    replica_key: the key replica ``replica`` of ``count`` holds chunk ``key`` under.
"""

from __future__ import annotations

from kvcast import p4constants as c

__all__ = ["check_replica", "replica_key"]


def check_replica(replica: int, count: int) -> None:
    """Raises ValueError unless ``count`` divides the buckets and ``0 <= replica < count``.

    ``count`` must be a power of two no larger than ``POOL_BUCKETS`` so that every bucket's
    residue class under ``count`` lies inside the bucket range.
    """
    for name, v in (("replica", replica), ("replica count", count)):
        if not isinstance(v, int) or isinstance(v, bool):
            raise ValueError(f"{name} {v!r} is not an integer")
    if not 1 <= count <= c.POOL_BUCKETS or count & (count - 1):
        raise ValueError(f"replica count {count} is not a power of two in 1..{c.POOL_BUCKETS}")
    if not 0 <= replica < count:
        raise ValueError(f"replica {replica} is not in 0..{count - 1}")


def replica_key(key: int, replica: int, count: int) -> int:
    """The key replica ``replica`` of ``count`` holds chunk ``key`` under.

    The bucket ``b = key mod POOL_BUCKETS`` becomes ``b - (b mod count) + replica``; every
    other bit is kept, so the replicas of one chunk differ only in their low bits and a
    bucket owner map ``b -> b mod count`` sends each reader's GETs to its replica.
    ``replica_key(key, r, 1) == key``.

    Raises:
        ValueError: ``key`` is not a 64-bit key, or ``(replica, count)`` is not valid
            (:func:`check_replica`).
    """
    check_replica(replica, count)
    if not 0 <= key < 1 << 64:
        raise ValueError(f"key {key!r} is not a 64-bit chunk key")
    return key - (key % count) + replica
