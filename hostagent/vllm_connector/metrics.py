"""The worker side's counters, and their form for vLLM's connector metrics.

Classes:
    KvcastConnectorStats: the counters of one interval as vLLM's ``KVConnectorStats`` (summed
        over workers on the scheduler side; ``load_gbps`` derived when reduced).
    LoadCounters: one worker side's counters, over its life and since vLLM last asked.

Functions:
    load_job_counts: the counters one load job adds.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats

from kvcast.fetch import FetchReport

__all__ = ["KvcastConnectorStats", "LoadCounters", "load_job_counts"]


@dataclass
class KvcastConnectorStats(KVConnectorStats):
    """kvcast's counters for vLLM's connector metrics (``data``: counter -> sum)."""

    def reset(self) -> None:  # noqa: D102
        self.data = {}

    def aggregate(self, other: KVConnectorStats) -> KvcastConnectorStats:  # noqa: D102
        for k, v in other.data.items():
            self.data[k] = self.data.get(k, 0) + v
        return self

    def reduce(self) -> dict[str, int | float]:  # noqa: D102
        out: dict[str, int | float] = dict(self.data)
        if out.get("load_s"):
            out["load_gbps"] = round(out.get("bytes_loaded", 0) * 8 / out["load_s"] / 1e9, 3)
        return out

    def is_empty(self) -> bool:  # noqa: D102
        return not self.data


def load_job_counts(
    reports: Sequence[FetchReport],
    failed_blocks: int,
    seconds: float,
    chunk_bytes: int,
    cut: int = 0,
    loaded: int | None = None,
) -> dict[str, float]:
    """The counters one load job adds.

    Args:
        reports: the job's fetch reports, one per chunk started.
        failed_blocks: engine blocks the job left to recompute.
        seconds: how long the job ran.
        chunk_bytes: bytes of one chunk.
        cut: chunks not started because the job's load budget was spent.
        loaded: chunks that went into at least one block not left to recompute; default: every
            chunk that arrived. The others that arrived (``chunks_discarded``) were in flight
            when an earlier chunk of their requests failed.

    Returns:
        Counter name -> what the job adds to it.
    """
    ok = [r for r in reports if r.ok]
    used = len(ok) if loaded is None else loaded
    return {
        "load_jobs": 1,
        "chunks_loaded": used,
        "bytes_loaded": used * chunk_bytes,
        "chunks_discarded": len(ok) - used,
        "chunks_failed": len(reports) - len(ok),
        "blocks_failed": failed_blocks,
        "frags_hit": sum(r.frags_hit for r in reports),
        "frags_pool": sum(r.frags_pool for r in reports),
        "frags_stream": sum(r.frags_stream for r in reports),
        "repairs": sum(r.repairs for r in reports),
        "load_s": seconds,
        "chunks_over_budget": cut,
    }


class LoadCounters:
    """One worker side's counters: over its life, and since vLLM's stat loggers last asked.

    The loader thread adds; the engine thread and drivers read.
    """

    def __init__(self) -> None:
        self.life: dict[str, float] = {}
        """Counters over the worker's life: load jobs, chunks and bytes loaded, chunks and
        blocks failed, fragments from SRAM, the pool and a group's stream, repairs, seconds."""
        self._interval: dict[str, float] = {}
        self._lock = threading.Lock()

    def add(self, delta: dict[str, float]) -> None:
        """Adds ``delta`` to both the life and the interval counters."""
        with self._lock:
            for k, v in delta.items():
                self.life[k] = self.life.get(k, 0) + v
                self._interval[k] = self._interval.get(k, 0) + v

    def snapshot(self) -> dict[str, float]:
        """A copy of the life counters."""
        with self._lock:
            return dict(self.life)

    def take_interval(self) -> KvcastConnectorStats | None:
        """The counters since the last call (None: nothing new), for vLLM's stat loggers."""
        with self._lock:
            if not self._interval:
                return None
            data, self._interval = self._interval, {}
        return KvcastConnectorStats(data=data)
