"""Deterministic synthetic chunks, so pool nodes and agents agree on bytes without sharing files.

A synthetic chunk is named by ``(tenant, key, nbytes, seed)``; its bytes are the SHAKE-256 output
of those four numbers (``synthetic_chunk``): reproducible on any machine and Python version, fast
enough for megabytes, and different for every name. The pool node preloads such chunks
(``python -m poolnode --preload TENANT:KEY:NBYTES:SEED``) and the host agent verifies what it
fetched against the same pattern (``python -m hostagent.agent fetch --verify-seed SEED``).

Classes:
    ChunkSpec: a synthetic chunk's name, parsed from ``TENANT:KEY:NBYTES:SEED``.

Functions:
    synthetic_chunk: the bytes of a synthetic chunk.
    parse_key: a chunk key from decimal or hexadecimal text.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

_DOMAIN = b"kvcast-synthetic-chunk-v1"
_NAME = struct.Struct("!HQQQ")
MAX_KEY = (1 << 64) - 1
MAX_SEED = (1 << 64) - 1


def parse_key(text: str) -> int:
    """A 64-bit chunk key from text.

    Args:
        text: decimal (``"1234"``), ``0x``-prefixed hex (``"0xbeef"``), or bare hex digits that
            are not a decimal number (``"beef"``).

    Returns:
        The key.

    Raises:
        ValueError: not a number, or not a 64-bit unsigned integer.
    """
    text = text.strip()
    try:
        key = int(text, 0)
    except ValueError:
        key = int(text, 16)
    if not 0 <= key <= MAX_KEY:
        raise ValueError(f"key {text!r} is not a 64-bit unsigned integer")
    return key


def synthetic_chunk(tenant: int, key: int, nbytes: int, seed: int = 0) -> bytes:
    """The bytes of synthetic chunk ``(tenant, key, nbytes, seed)``.

    Args:
        tenant: 16-bit tenant id.
        key: 64-bit chunk key.
        nbytes: chunk length (> 0).
        seed: 64-bit pattern seed (two seeds give two different chunks under one key).

    Returns:
        ``nbytes`` bytes of SHAKE-256 over the domain tag and the four numbers.

    Raises:
        ValueError: a number out of range.
    """
    if not 0 <= tenant <= 0xFFFF or not 0 <= key <= MAX_KEY or not 0 <= seed <= MAX_SEED:
        raise ValueError(f"tenant {tenant}, key {key} or seed {seed} out of range")
    if nbytes <= 0:
        raise ValueError(f"a chunk needs at least one byte, got nbytes={nbytes}")
    return hashlib.shake_256(_DOMAIN + _NAME.pack(tenant, key, nbytes, seed)).digest(nbytes)


@dataclass(frozen=True, slots=True)
class ChunkSpec:
    """A synthetic chunk's name.

    Attributes:
        tenant: tenant id.
        key: chunk key.
        nbytes: chunk length.
        seed: pattern seed.
    """

    tenant: int
    key: int
    nbytes: int
    seed: int = 0

    @classmethod
    def parse(cls, text: str) -> ChunkSpec:
        """Parses ``TENANT:KEY:NBYTES[:SEED]`` (key as in ``parse_key``; seed 0 by default).

        Raises:
            ValueError: not four (or three) fields, or a field out of range.
        """
        fields = text.split(":")
        if len(fields) not in (3, 4):
            raise ValueError(f"chunk spec {text!r} is not TENANT:KEY:NBYTES[:SEED]")
        try:
            spec = cls(
                int(fields[0], 0),
                parse_key(fields[1]),
                int(fields[2], 0),
                int(fields[3], 0) if len(fields) == 4 else 0,
            )
        except ValueError as exc:
            raise ValueError(f"chunk spec {text!r}: {exc}") from None
        synthetic_chunk(spec.tenant, spec.key, 1, spec.seed)  # range checks
        if spec.nbytes <= 0:
            raise ValueError(f"chunk spec {text!r}: NBYTES must be positive")
        return spec

    def data(self) -> bytes:
        """The chunk's bytes (``synthetic_chunk`` of this name)."""
        return synthetic_chunk(self.tenant, self.key, self.nbytes, self.seed)
