"""kvcast.fetch: the KVP fetch engine, torch-free, on writable buffers.

One chunk from the switch, else the DRAM pool, else "recompute"; group fetches (leader and
followers of a multicast stream); windows of chunks (``fetch_many``); keyed MAC checks. The
host agent (``hostagent.fetch``) wraps it for tensors; the controller's chunk source uses it
as it is, so the controller needs no torch.

Modules:
    client: ``FetchClient``, the public side (construction, fetch, follow, fetch_many).
    transport: sockets, paths, the fetch loop and batched GETs.
    receive: every datagram checked and placed (Python and native paths).
    recovery: retries, fast retransmits, tail probes, path changes, MAC checks.
    state: one fetch in progress, the tuning constants, what the parts share.
    report: the outcome of a fetch and its access record.

Imports only the rest of ``kvcast`` (and numpy).
"""

from kvcast.fetch.client import FetchClient
from kvcast.fetch.report import (
    FetchError,
    FetchOutcome,
    FetchReport,
    RecomputeReason,
    entry_from_fetch,
)
from kvcast.fetch.state import (
    DEFAULT_CHUNKS_IN_FLIGHT,
    GAP_FRAGMENTS,
    MAX_FETCHES,
    MIN_RETRY_TIMEOUT_S,
    STASH_MAX_BYTES,
    Address,
    Array,
    ChunkRequest,
)

__all__ = [
    "DEFAULT_CHUNKS_IN_FLIGHT",
    "GAP_FRAGMENTS",
    "MAX_FETCHES",
    "MIN_RETRY_TIMEOUT_S",
    "STASH_MAX_BYTES",
    "Address",
    "Array",
    "ChunkRequest",
    "FetchClient",
    "FetchError",
    "FetchOutcome",
    "FetchReport",
    "RecomputeReason",
    "entry_from_fetch",
]
