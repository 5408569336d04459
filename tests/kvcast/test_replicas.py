"""Reader-chosen replica keys: each replica's key falls in a bucket that replica owns."""

from __future__ import annotations

import random

import pytest

from kvcast import p4constants as c
from kvcast.replicas import check_replica, replica_key


@pytest.mark.parametrize("count", [1, 2, 4, 8, c.POOL_BUCKETS])
def test_each_replicas_key_is_in_a_bucket_the_owner_map_gives_that_replica(count: int) -> None:
    rnd = random.Random(count)
    for _ in range(500):
        key = rnd.getrandbits(64)
        keys = [replica_key(key, r, count) for r in range(count)]
        for r, k in enumerate(keys):
            bucket = k & (c.POOL_BUCKETS - 1)
            assert bucket % count == r  # owners b -> b mod count send it to replica r
            assert k >> 8 == key >> 8  # only the bucket changes
        assert len(set(keys)) == count
        assert key in keys  # one replica reads the block's own key
    assert replica_key(0x1234, 0, 1) == 0x1234


@pytest.mark.parametrize(
    ("replica", "count", "message"),
    [
        (0, 0, "power of two"),
        (0, 3, "power of two"),
        (0, 2 * c.POOL_BUCKETS, "power of two"),
        (2, 2, "not in 0..1"),
        (-1, 2, "not in 0..1"),
        (True, 2, "not an integer"),
        (0, 2.0, "not an integer"),
    ],
)
def test_a_bad_replica_is_refused(replica: int, count: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_replica(replica, count)


def test_a_key_that_is_not_64_bits_is_refused() -> None:
    with pytest.raises(ValueError, match="64-bit"):
        replica_key(1 << 64, 0, 2)
    with pytest.raises(ValueError, match="64-bit"):
        replica_key(-1, 0, 2)
