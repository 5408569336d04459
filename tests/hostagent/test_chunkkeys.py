"""Chunk keys: vLLM's sha256_cbor block hashes, pinned vectors and vLLM's own functions."""

from __future__ import annotations

import hashlib
import struct
from typing import Any

import pytest

from hostagent.chunkkeys import (
    ChunkKeyer,
    HashSeedError,
    hash_block_tokens,
    none_hash,
    sha256_cbor,
    wire_key,
)

# Computed once with this module (seed "0", block size 16, tokens 0..39) and pinned: a change of
# the encoding, the chaining or the salt placement changes them.
NONE_HASH_SEED_0 = "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e"
DIGESTS_SEED_0 = [
    "d830de3d42c00f25a2949b5d12d98642664a44872c1614c5b0147556276afc9c",
    "fedd9e4abebebbe6f6cf96b682f08d316063fe2f22a5c552192dd62904fcccac",
]
DIGESTS_SEED_0_SALT = [
    "15287a680bef1520d25f036a3b4aa562de14b018ff39a6c8c9bca2170f52fce3",
    "a8ecf621c9281177fd3c335cff5823810794e3653f1901dea0b259aa25dc4423",
]
KEYS_SEED_0 = [0xB0147556276AFC9C, 0x192DD62904FCCCAC]


def _cbor(obj: Any) -> bytes:
    """A minimal canonical CBOR encoder, independent of cbor2 (ints < 2**32 only)."""

    def head(major: int, n: int) -> bytes:
        if n < 24:
            return bytes([major << 5 | n])
        if n < 1 << 8:
            return bytes([major << 5 | 24, n])
        if n < 1 << 16:
            return bytes([major << 5 | 25]) + struct.pack(">H", n)
        return bytes([major << 5 | 26]) + struct.pack(">I", n)

    if obj is None:
        return b"\xf6"
    if isinstance(obj, int):
        return head(0, obj)
    if isinstance(obj, bytes):
        return head(2, len(obj)) + obj
    if isinstance(obj, str):
        raw = obj.encode()
        return head(3, len(raw)) + raw
    if isinstance(obj, tuple):
        return head(4, len(obj)) + b"".join(_cbor(x) for x in obj)
    raise TypeError(obj)


def test_none_hash_is_sha256_of_the_seed_as_cbor_text() -> None:
    assert none_hash("0") == hashlib.sha256(b"\x61\x30").digest()
    assert none_hash("0").hex() == NONE_HASH_SEED_0


def test_block_hash_is_sha256_of_canonical_cbor_tuple() -> None:
    parent = bytes(range(32))
    tokens = [0, 23, 24, 255, 256, 65535, 65536, 128000]
    for extra in (None, ("salt",), ("lora", "salt")):
        expected = hashlib.sha256(_cbor((parent, tuple(tokens), extra))).digest()
        assert hash_block_tokens(parent, tokens, extra) == expected
        assert sha256_cbor((parent, tuple(tokens), extra)) == expected


def test_pinned_vectors_without_salt() -> None:
    keys = ChunkKeyer(16, "0").keys(list(range(40)))
    assert [k.digest.hex() for k in keys] == DIGESTS_SEED_0
    assert [k.key for k in keys] == KEYS_SEED_0


def test_pinned_vectors_with_salt() -> None:
    digests = ChunkKeyer(16, "0", cache_salt="tenant-7").digests(list(range(40)))
    assert [d.hex() for d in digests] == DIGESTS_SEED_0_SALT


def test_blocks_chain_on_the_parent_hash() -> None:
    d0, d1 = ChunkKeyer(16, "0").digests(list(range(32)))
    assert d0 == hash_block_tokens(none_hash("0"), range(16), None)
    assert d1 == hash_block_tokens(d0, range(16, 32), None)


def test_partial_last_block_gets_no_key() -> None:
    keyer = ChunkKeyer(16, "0")
    assert len(keyer.keys(list(range(15)))) == 0
    keys = keyer.keys(list(range(40)))
    assert [(k.index, k.start, k.end) for k in keys] == [(0, 0, 16), (1, 16, 32)]


def test_shared_prefix_gives_shared_keys() -> None:
    keyer = ChunkKeyer(4, "7")
    a = keyer.wire_keys([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12])
    b = keyer.wire_keys([1, 2, 3, 4, 5, 6, 7, 8, 99, 10, 11, 12])
    assert a[:2] == b[:2]
    assert a[2] != b[2]


def test_salt_is_an_extra_key_of_the_first_block_only() -> None:
    keyer = ChunkKeyer(16, "0", cache_salt="tenant-7")
    assert keyer.extra_keys(0) == ("tenant-7",)
    assert keyer.extra_keys(1) is None


def test_empty_salt_adds_no_extra_key_as_in_vllm() -> None:
    assert ChunkKeyer(16, "0", cache_salt="").digests(list(range(16))) == ChunkKeyer(
        16, "0"
    ).digests(list(range(16)))


def test_lora_name_is_an_extra_key_of_every_block_before_the_salt() -> None:
    keyer = ChunkKeyer(16, "0", cache_salt="s", lora_name="adapter")
    assert keyer.extra_keys(0) == ("adapter", "s")
    assert keyer.extra_keys(3) == ("adapter",)


def test_wire_key_is_the_last_8_digest_bytes_big_endian() -> None:
    digest = bytes(range(32))
    assert wire_key(digest) == int.from_bytes(digest, "big") & (2**64 - 1)
    assert wire_key(digest).to_bytes(8, "big") == digest[24:]


def test_seed_changes_every_key() -> None:
    tokens = list(range(16))
    assert ChunkKeyer(16, "0").digests(tokens) != ChunkKeyer(16, "1").digests(tokens)


def test_block_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="block_size"):
        ChunkKeyer(0, "0")


def test_from_env_refuses_a_missing_pythonhashseed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    with pytest.raises(HashSeedError, match="PYTHONHASHSEED"):
        ChunkKeyer.from_env(16)


def test_from_env_seeds_from_pythonhashseed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    assert ChunkKeyer.from_env(16).root.hex() == NONE_HASH_SEED_0


def test_matches_vllm_block_hashes(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("vllm", reason="vllm not installed")
    from vllm.utils.hashing import sha256_cbor as vllm_sha256_cbor  # type: ignore[import-not-found]
    from vllm.v1.core import kv_cache_utils  # type: ignore[import-not-found]

    monkeypatch.setenv("PYTHONHASHSEED", "0")
    kv_cache_utils.init_none_hash(vllm_sha256_cbor)
    tokens = list(range(40))
    for salt in (None, "tenant-7"):
        parent: bytes | None = None
        expected = []
        for i in range(2):
            extra = (salt,) if (i == 0 and salt) else None
            parent = kv_cache_utils.hash_block_tokens(
                vllm_sha256_cbor, parent, tokens[i * 16 : (i + 1) * 16], extra
            )
            expected.append(bytes(parent))
        assert ChunkKeyer(16, "0", cache_salt=salt).digests(tokens) == expected
