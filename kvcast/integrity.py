"""End-to-end chunk integrity that does not depend on the fabric: a keyed MAC per chunk.

The fragment CRC catches corruption, not forgery: anyone can compute it. A tenant that wants
more gives its producers and agents a secret key; the producer then stores, next to each chunk,
a BLAKE2b MAC of the chunk under that key (as a 32-byte object of its own, under a key derived
from the chunk's), and the agent fetches it after the chunk's last fragment and compares before
it hands the tensor over. A switch, a pool node or a host that rewrites a chunk's bytes, even
with a correct CRC, makes the fetch end in RECOMPUTE (``MAC_MISMATCH``), and a chunk whose MAC
is missing is not trusted either (``MAC_MISSING``). docs/security.md gives the threat model.

Constants:
    MAC_BYTES: length of a MAC object.

Functions:
    mac_key_of: the chunk key a chunk's MAC object is stored under.
    chunk_mac: the MAC of a chunk's bytes.
    load_tenant_keys: a ``tenant:hexkey`` file into a mapping.
    check_keys: a checked copy of a tenant-key mapping.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping
from pathlib import Path

MAC_BYTES = 32
_PERSON_KEY = b"kvcast-mac-key"
_PERSON_MAC = b"kvcast-mac"
_NAME = struct.Struct("!HQ")
_KEY = struct.Struct("!Q")

__all__ = ["MAC_BYTES", "check_keys", "chunk_mac", "load_tenant_keys", "mac_key_of"]


def mac_key_of(key: int) -> int:
    """The 64-bit chunk key under which the MAC of chunk ``key`` is stored.

    A hash of the chunk key, so it spreads over pool buckets like any chunk key and cannot be
    chosen to equal another chunk's key without breaking BLAKE2b.
    """
    digest = hashlib.blake2b(_KEY.pack(key), digest_size=8, person=_PERSON_KEY).digest()
    return int.from_bytes(digest, "big")


def chunk_mac(secret: bytes, tenant: int, key: int, data: bytes | memoryview) -> bytes:
    """BLAKE2b-256 of ``{tenant, key} || data`` keyed with the tenant's secret.

    The tenant and key are inside the MAC, so a valid chunk cannot be replayed under another
    name.

    Raises:
        ValueError: the secret is empty or longer than 64 bytes (BLAKE2b's key limit).
    """
    if not 0 < len(secret) <= 64:
        raise ValueError(f"a tenant key must be 1..64 bytes, got {len(secret)}")
    h = hashlib.blake2b(key=secret, digest_size=MAC_BYTES, person=_PERSON_MAC)
    h.update(_NAME.pack(tenant, key))
    h.update(data)
    return h.digest()


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
