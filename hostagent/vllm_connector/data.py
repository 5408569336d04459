"""What the scheduler side hands the worker side each step (pickled across processes).

Classes:
    ChunkLoad: one chunk to fetch and the engine blocks it goes to.
    ChunkSave: one request's newly full blocks to publish.
    KvcastConnectorMetadata: one step's loads and saves.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata

from kvcast.kvclass import KvClass

__all__ = ["ChunkLoad", "ChunkSave", "KvcastConnectorMetadata"]


@dataclass(slots=True)
class ChunkLoad:
    """One chunk to fetch, and the engine blocks it goes to.

    Attributes:
        tenant: wire tenant id.
        key: the key the chunk is read under: the low 64 bits of vLLM's block hash, or, where
            the request chose a replica, that replica's key (``LoadOptions.read_key``).
        parent: key of the previous block of the prefix (for the access report).
        position: the block's index in its prefix.
        targets: ``(request id, engine block id)`` for every request of the step that needs it.
        group: multicast group of the fetch (0: none; ``LoadOptions``).
        follower: receive the group's stream rather than ask.
        kv_class: its declared class (static when any request that needs it says so).
        budget_us: microseconds per token its load may take (the most patient of the requests
            that need it; None: no bound but the fetch client's).
    """

    tenant: int
    key: int
    parent: int | None
    position: int
    targets: list[tuple[str, int]] = field(default_factory=list)
    group: int = 0
    follower: bool = False
    kv_class: KvClass | None = None
    budget_us: float | None = None


@dataclass(slots=True)
class ChunkSave:
    """One request's prompt blocks that became full this step, to publish.

    Attributes:
        req_id: the request.
        tenant: wire tenant id.
        digests: vLLM's block hashes of blocks ``0 .. first + len(block_ids) - 1``.
        first: index of the first block to publish.
        block_ids: engine block ids of blocks ``first ..``.
        static_blocks: blocks ``0 .. static_blocks - 1`` are declared static.
        kv_class: the declared class of the other blocks (None: undeclared).
    """

    req_id: str
    tenant: int
    digests: list[bytes]
    first: int
    block_ids: list[int]
    static_blocks: int = 0
    kv_class: KvClass | None = None


@dataclass
class KvcastConnectorMetadata(KVConnectorMetadata):
    """What the scheduler side hands the worker side for one step.

    Attributes:
        loads: one entry per distinct chunk to fetch, in prefix order.
        load_reqs: the requests whose loads this step carries.
        saves: prompt blocks to publish after the step's forward pass.
    """

    loads: list[ChunkLoad] = field(default_factory=list)
    load_reqs: list[str] = field(default_factory=list)
    saves: list[ChunkSave] = field(default_factory=list)
