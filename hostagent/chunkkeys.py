"""Chunk keys from token ids, computed exactly as vLLM computes prefix-cache block hashes.

A chunk is the KV of one full block of ``block_size`` tokens. Its key is vLLM's block hash
(``vllm/v1/core/kv_cache_utils.py``, hash algorithm ``sha256_cbor``), so a host agent, the
control plane and a vLLM engine started with the same ``PYTHONHASHSEED`` name the same prefix
block with the same bytes:

* ``sha256_cbor(obj) = sha256(cbor2.dumps(obj, canonical=True))`` (``vllm/utils/hashing.py``);
* ``NONE_HASH`` (the parent of the first block) ``= sha256_cbor(os.environ["PYTHONHASHSEED"])``,
  the seed hashed as a CBOR *text string*; vLLM draws 32 random bytes instead when
  ``PYTHONHASHSEED`` is unset, which no two processes can share, so kvcast always requires a seed;
* block ``i`` hashes the tuple ``(parent_hash, tuple(token_ids[i*B:(i+1)*B]), extra_keys)``,
  chained: the parent of block ``i`` is the hash of block ``i - 1``;
* only full blocks are hashed: a partial last block gets no key;
* ``extra_keys`` is ``None`` unless the request has extra keys; kvcast supports the two that are
  not multimodal: the LoRA name (on every block) and the cache salt (first block only), in vLLM's
  order ``lora + mm + cache_salt + prompt_embeds``. A tenant's salt is vLLM's ``cache_salt``.
  Older vLLM releases hash them bare (``"name"``, ``"salt"``); vLLM 0.32 and 0.33 tag each with
  its source (``("lora", name, path)``, ``("cache_salt", salt)``): ``tagged_extra_keys=True``.

The 64-bit wire key is the low 64 bits of the 32-byte digest read as a big-endian integer, i.e.
digest bytes ``[24:32]`` in order, exactly as vLLM's ``maybe_convert_block_hash`` derives its
integer block hashes for KV events (``int.from_bytes(h, "big") & (2**64 - 1)``). The KVP header
carries the key in network byte order, so the wire bytes are the digest's last 8 bytes verbatim.

Classes:
    ChunkKey: one block's full digest, 64-bit wire key and token range.
    ChunkKeyer: computes the keys of a token sequence for one tenant salt and hash seed.
    HashSeedError: no shared hash seed was configured.

Functions:
    sha256_cbor: vLLM's ``sha256_cbor``.
    none_hash: vLLM's ``NONE_HASH`` for a given ``PYTHONHASHSEED``.
    hash_block_tokens: vLLM's ``hash_block_tokens`` for one block.
    wire_key: the 64-bit wire key of a digest.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import cbor2

DIGEST_BYTES = 32
"""Length of a sha256 block hash."""

WIRE_KEY_MASK = (1 << 64) - 1


class HashSeedError(ValueError):
    """No shared hash seed: keys would differ between processes."""


def sha256_cbor(obj: Any) -> bytes:
    """SHA-256 over the canonical CBOR encoding of ``obj`` (vLLM's ``sha256_cbor``).

    Args:
        obj: bytes, str, int, None, and tuples/lists of those.

    Returns:
        The 32-byte digest.
    """
    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


def none_hash(hash_seed: str) -> bytes:
    """The parent hash of every prefix's first block: vLLM's ``NONE_HASH``.

    vLLM's ``init_none_hash`` sets ``NONE_HASH = hash_fn(os.getenv("PYTHONHASHSEED"))``, the seed
    being the environment variable's *string* value.

    Args:
        hash_seed: the value of ``PYTHONHASHSEED`` the engines run with (e.g. ``"0"``).

    Returns:
        The 32-byte seed hash.
    """
    return sha256_cbor(hash_seed)


def hash_block_tokens(
    parent_hash: bytes,
    token_ids: Sequence[int],
    extra_keys: tuple[Any, ...] | None = None,
) -> bytes:
    """One block's hash, chained on its parent (vLLM's ``hash_block_tokens`` with sha256_cbor).

    Args:
        parent_hash: the previous block's hash, or ``none_hash(seed)`` for the first block.
        token_ids: the block's token ids (a full block).
        extra_keys: vLLM's extra keys for this block, or ``None``.

    Returns:
        The 32-byte block hash.
    """
    return sha256_cbor((parent_hash, tuple(token_ids), extra_keys))


def wire_key(digest: bytes) -> int:
    """The 64-bit KVP key of a block hash: its last 8 bytes read big-endian.

    Args:
        digest: a 32-byte block hash.

    Returns:
        ``int.from_bytes(digest, "big") & (2**64 - 1)``.
    """
    return int.from_bytes(digest[-8:], "big")


@dataclass(frozen=True, slots=True)
class ChunkKey:
    """The key of one full block.

    Attributes:
        index: block number within the sequence (0 = first block).
        digest: vLLM's 32-byte block hash.
        key: the 64-bit wire key (``wire_key(digest)``).
        start: first token position of the block.
        end: one past the last token position.
    """

    index: int
    digest: bytes
    key: int
    start: int
    end: int


class ChunkKeyer:
    """Computes chunk keys for token sequences the way vLLM hashes prefix-cache blocks.

    Args:
        block_size: tokens per block (vLLM's ``--block-size``, 16 by default).
        hash_seed: the ``PYTHONHASHSEED`` shared by every engine and host agent.
        cache_salt: the tenant's salt (vLLM's per-request ``cache_salt``); ``None`` or ``""``
            adds no extra key, as in vLLM.
        lora_name: the LoRA adapter name when the engine serves one (an extra key of every
            block in vLLM); ``None`` for the base model.
        tagged_extra_keys: hash the extra keys as vLLM 0.32 and 0.33 do, tagged with their
            source (``("cache_salt", salt)``, ``("lora", name, path)``); False: bare, as older
            releases did.
        lora_path: the LoRA adapter's path (part of the tagged LoRA key).

    Raises:
        ValueError: ``block_size`` is not positive.
    """

    def __init__(
        self,
        block_size: int,
        hash_seed: str,
        cache_salt: str | None = None,
        lora_name: str | None = None,
        *,
        tagged_extra_keys: bool = False,
        lora_path: str = "",
    ) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.block_size = block_size
        self.hash_seed = hash_seed
        self.cache_salt = cache_salt
        self.lora_name = lora_name
        self.tagged_extra_keys = tagged_extra_keys
        self.lora_path = lora_path
        self.root = none_hash(hash_seed)

    @classmethod
    def from_env(
        cls,
        block_size: int,
        cache_salt: str | None = None,
        lora_name: str | None = None,
    ) -> ChunkKeyer:
        """A keyer seeded from ``PYTHONHASHSEED``, as vLLM seeds ``NONE_HASH``.

        Args:
            block_size: tokens per block.
            cache_salt: the tenant's salt.
            lora_name: the LoRA adapter name, if any.

        Returns:
            The keyer.

        Raises:
            HashSeedError: ``PYTHONHASHSEED`` is unset; vLLM would then use a random root that
                no other process can reproduce. Set the same ``PYTHONHASHSEED`` on every engine
                and host agent.
        """
        seed = os.environ.get("PYTHONHASHSEED")
        if seed is None:
            raise HashSeedError(
                "PYTHONHASHSEED is not set: vLLM then roots block hashes in random bytes that "
                "no other host can reproduce. Set the same PYTHONHASHSEED for every vLLM engine "
                "and kvcast host agent."
            )
        return cls(block_size, seed, cache_salt, lora_name)

    def extra_keys(self, block_index: int) -> tuple[Any, ...] | None:
        """The ``extra_keys`` vLLM hashes into block ``block_index`` of a text-only request.

        Args:
            block_index: block number within the sequence.

        Returns:
            ``(lora?, cache_salt?)`` in vLLM's order (bare or tagged), or ``None`` when empty.
        """
        keys: list[Any] = []
        tagged = self.tagged_extra_keys
        if self.lora_name:
            keys.append(("lora", self.lora_name, self.lora_path) if tagged else self.lora_name)
        if block_index == 0 and self.cache_salt:
            keys.append(("cache_salt", self.cache_salt) if tagged else self.cache_salt)
        return tuple(keys) if keys else None

    def digests(self, token_ids: Sequence[int]) -> list[bytes]:
        """Block hashes of every full block of ``token_ids``.

        Args:
            token_ids: the prompt's token ids.

        Returns:
            One 32-byte digest per full block; a partial last block has none.
        """
        bs = self.block_size
        parent = self.root
        out: list[bytes] = []
        for i in range(len(token_ids) // bs):
            parent = hash_block_tokens(parent, token_ids[i * bs : (i + 1) * bs], self.extra_keys(i))
            out.append(parent)
        return out

    def keys(self, token_ids: Sequence[int]) -> list[ChunkKey]:
        """Chunk keys of every full block of ``token_ids``.

        Args:
            token_ids: the prompt's token ids.

        Returns:
            One ``ChunkKey`` per full block, in order.
        """
        bs = self.block_size
        return [
            ChunkKey(i, d, wire_key(d), i * bs, (i + 1) * bs)
            for i, d in enumerate(self.digests(token_ids))
        ]

    def wire_keys(self, token_ids: Sequence[int]) -> list[int]:
        """The 64-bit wire keys of every full block of ``token_ids``."""
        return [wire_key(d) for d in self.digests(token_ids)]
