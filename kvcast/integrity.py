"""End-to-end chunk integrity that does not depend on the fabric: keyed MACs per chunk segment.

The fragment CRC catches corruption, not forgery: anyone can compute it. A tenant that wants
more gives its producers and agents a secret key; the producer then stores, next to each chunk,
its MAC object under a key derived from the chunk's: one BLAKE2b MAC under that key per
``SEGMENT_BYTES`` segment of the chunk (the last one may be shorter), each naming the tenant,
the chunk key, the segment's index and the segment count. The agent compares each segment
with its MAC before it hands that segment on, so a chunk can be used segment by segment as it
arrives (the vLLM connector releases a layer once its segments are verified) and no unverified
byte is ever used. A switch, a pool node or a host that rewrites a chunk's bytes, even with a
correct CRC, makes the fetch end in RECOMPUTE (``MAC_MISMATCH``), and a chunk whose MAC object
is missing is not trusted either (``MAC_MISSING``). docs/security.md gives the threat model.

Constants:
    MAC_BYTES: length of one segment's MAC.
    SEGMENT_BYTES: bytes of chunk one MAC covers (a whole number of fragments).

Functions:
    mac_key_of: the chunk key a chunk's MAC object is stored under.
    mac_count: how many segments (MACs) a chunk of a given length has.
    mac_object_bytes: the length of a chunk's MAC object.
    segment_mac: the MAC of one segment.
    chunk_mac: a chunk's MAC object (every segment's MAC, in order).
    load_tenant_keys: a ``tenant:hexkey`` file into a mapping.
    check_keys: a checked copy of a tenant-key mapping.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping
from pathlib import Path

MAC_BYTES = 32
SEGMENT_BYTES = 16 << 10
"""64 fragments of 256 bytes: a Llama-3-8B layer of a 32-token block (128 KiB) is 8 segments,
and the MAC object of its 4 MiB chunk 8 KiB (0.2 % more to fetch)."""
_PERSON_KEY = b"kvcast-mac-key"
_PERSON_MAC = b"kvcast-seg-mac"
_NAME = struct.Struct("!HQII")
_KEY = struct.Struct("!Q")

__all__ = [
    "MAC_BYTES",
    "SEGMENT_BYTES",
    "check_keys",
    "chunk_mac",
    "load_tenant_keys",
    "mac_count",
    "mac_key_of",
    "mac_object_bytes",
    "segment_mac",
]


def mac_key_of(key: int) -> int:
    """The 64-bit chunk key under which the MAC of chunk ``key`` is stored.

    A hash of the chunk key, so it spreads over pool buckets like any chunk key and cannot be
    chosen to equal another chunk's key without breaking BLAKE2b.
    """
    digest = hashlib.blake2b(_KEY.pack(key), digest_size=8, person=_PERSON_KEY).digest()
    return int.from_bytes(digest, "big")


def mac_count(nbytes: int) -> int:
    """Segments (MACs) of a chunk of ``nbytes`` bytes: at least one."""
    return max(1, -(-nbytes // SEGMENT_BYTES))


def mac_object_bytes(nbytes: int) -> int:
    """Length of the MAC object of a chunk of ``nbytes`` bytes."""
    return MAC_BYTES * mac_count(nbytes)


def segment_mac(
    secret: bytes, tenant: int, key: int, index: int, count: int, data: bytes | memoryview
) -> bytes:
    """BLAKE2b-256 of ``{tenant, key, index, count} || segment`` keyed with the tenant's secret.

    The tenant and key are inside the MAC, so a valid chunk cannot be replayed under another
    name; the index and count, so segments cannot be reordered, dropped or moved between
    chunks of other lengths.

    Raises:
        ValueError: the secret is empty or longer than 64 bytes (BLAKE2b's key limit).
    """
    if not 0 < len(secret) <= 64:
        raise ValueError(f"a tenant key must be 1..64 bytes, got {len(secret)}")
    h = hashlib.blake2b(key=secret, digest_size=MAC_BYTES, person=_PERSON_MAC)
    h.update(_NAME.pack(tenant, key, index, count))
    h.update(data)
    return h.digest()


def chunk_mac(secret: bytes, tenant: int, key: int, data: bytes | memoryview) -> bytes:
    """A chunk's MAC object: ``segment_mac`` of each ``SEGMENT_BYTES`` segment, in order.

    Returns:
        ``mac_object_bytes(len(data))`` bytes.

    Raises:
        ValueError: the secret is empty or longer than 64 bytes (BLAKE2b's key limit).
    """
    view = memoryview(data).cast("B")
    count = mac_count(len(view))
    return b"".join(
        segment_mac(
            secret, tenant, key, i, count, view[i * SEGMENT_BYTES : (i + 1) * SEGMENT_BYTES]
        )
        for i in range(count)
    )


def load_tenant_keys(path: Path) -> dict[int, bytes]:
    """Reads ``tenant:hexkey`` lines (``#`` comments and blank lines allowed).

    Raises:
        ValueError: a malformed line, a tenant outside 16 bits, or a bad key, naming the line.
    """
    keys: dict[int, bytes] = {}
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        tenant_text, sep, hex_key = line.partition(":")
        try:
            tenant = int(tenant_text, 0)
            secret = bytes.fromhex(hex_key.strip())
        except ValueError:
            raise ValueError(f"{path}:{n}: expected tenant:hexkey") from None
        if not sep or not 0 <= tenant <= 0xFFFF or not 0 < len(secret) <= 64:
            raise ValueError(f"{path}:{n}: tenant must be 16-bit and the key 1..64 bytes")
        keys[tenant] = secret
    return keys


def check_keys(keys: Mapping[int, bytes]) -> dict[int, bytes]:
    """A copy of ``keys`` after checking every tenant and secret.

    Raises:
        ValueError: a tenant outside 16 bits or a secret of the wrong length.
    """
    for tenant, secret in keys.items():
        if not 0 <= tenant <= 0xFFFF or not 0 < len(secret) <= 64:
            raise ValueError(f"tenant {tenant}: 16-bit tenant and a 1..64-byte key needed")
    return dict(keys)
