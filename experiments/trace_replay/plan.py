"""What a trace replay replays: a slice of the trace as requests with their fetched prefix.

Classes:
    ReplayRequest: one request as replayed (host, blocks fetched, blocks computed).

Functions:
    block_key: the chunk key of a trace block.
    plan_requests: a slice of a trace as replay requests.
    distinct_blocks: every key of a slice, once.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

TENANT = 9
SEED = 20261123
DEFAULT_BLOCK_BYTES = 2048


def block_key(hash_id: int) -> int:
    """The 64-bit chunk key of trace block ``hash_id`` (BLAKE2b-64, spread over pool buckets)."""
    digest = hashlib.blake2b(f"kvcast-trace/{hash_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


@dataclass(frozen=True)
class ReplayRequest:
    """One request as replayed.

    Attributes:
        index: position in the replayed slice (0 first).
        time: arrival time in the trace, seconds.
        host: index of the GPU host serving it (0-based).
        fetch: keys of its reusable prefix, fetched by the host's agent.
        computed: keys of the rest, computed by prefill (reported, not fetched).
    """

    index: int
    time: float
    host: int
    fetch: tuple[int, ...]
    computed: tuple[int, ...]


def plan_requests(
    path: Path, *, max_requests: int, start: int = 0, hosts: int = 8, seed: int = 0
) -> list[ReplayRequest]:
    """Reads a slice of a Mooncake-format trace as replay requests.

    Hosts are assigned uniformly at random with ``seed`` over the whole file prefix read (so a
    slice's hosts do not depend on where it starts). A request fetches its leading blocks that
    an earlier request of the slice used; the rest are computed.

    Args:
        path: the ``.jsonl`` trace.
        max_requests: requests in the slice.
        start: index of the first request of the slice.
        hosts: GPU hosts to spread requests over.
        seed: seed of the host assignment.

    Returns:
        The requests, in arrival order.

    Raises:
        ValueError: a bad slice or host count.
        TraceFormatError: a malformed trace line.
        OSError: the trace cannot be read.
    """
    from experiments.policies.workloads import load_mooncake_trace

    if max_requests < 1 or start < 0 or hosts < 1:
        raise ValueError(f"need max_requests >= 1, start >= 0, hosts >= 1; got {max_requests}, "
                         f"{start}, {hosts}")  # fmt: skip
    workload = load_mooncake_trace(path, hosts=hosts, seed=seed, limit=start + max_requests)
    seen: set[int] = set()
    out: list[ReplayRequest] = []
    for i, req in enumerate(workload.requests[start:]):
        keys = [block_key(h) for h in req.blocks]
        n = 0
        while n < len(keys) and keys[n] in seen:
            n += 1
        out.append(ReplayRequest(i, req.time, req.host, tuple(keys[:n]), tuple(keys[n:])))
        seen.update(keys)
    return out


def distinct_blocks(requests: Sequence[ReplayRequest]) -> list[int]:
    """Every key of the slice, once, in first-use order."""
    return list(dict.fromkeys(k for r in requests for k in (*r.fetch, *r.computed)))
