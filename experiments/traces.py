"""The Mooncake trace format: the one parser every experiment, benchmark and simulation reads.

A trace is a JSONL file, one request a line: ``timestamp`` (ms since the trace began),
``hash_ids`` (one id per 512-token prefix block, block 0 first; equal ids are the same KV
bytes) and, in the shipped traces, ``input_length`` (prompt tokens). The policy evaluation
(:mod:`experiments.policies.workloads`), the cluster simulation
(:mod:`experiments.sim.workloads`) and :mod:`experiments.sram_tokens` each map the records to
their own request type; all read them here.

Classes:
    TraceRecord: one parsed line (arrival time in seconds, prompt tokens, block ids).
    TraceFormatError: a line that is not a trace record.

Functions:
    default_trace_path: the trace to replay: $KVCAST_TRACE, else the one shipped in data/.
    read_trace: the records of a trace file, in the file's order.
    mix64: splitmix64's finalizer, the one 64-bit integer hash of the experiments (generated
        block keys, host affinity, pool ownership).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "BLOCK_TOKENS",
    "SHIPPED_TRACE",
    "SYNTHETIC_TRACE",
    "TRACE_ENV",
    "TraceFormatError",
    "TraceRecord",
    "default_trace_path",
    "mix64",
    "read_trace",
]

BLOCK_TOKENS = 512
"""Tokens per block in the Mooncake traces (their README: one hash id per 512-token block)."""

TRACE_ENV = "KVCAST_TRACE"
"""Environment variable that names another trace file in the same format."""

SHIPPED_TRACE = Path(__file__).resolve().parents[1] / "data" / "traces" / "conversation_trace.jsonl"
"""The Mooncake conversation trace the repository ships (data/README.md says where it is from)."""

SYNTHETIC_TRACE = SHIPPED_TRACE.with_name("synthetic_trace.jsonl")
"""Mooncake's FAST'25 synthetic trace (public datasets, Poisson arrivals), shipped beside it."""

_M64 = 0xFFFFFFFFFFFFFFFF


def mix64(x: int) -> int:
    """splitmix64 finalizer: a well-spread 64-bit hash of an integer.

    Args:
        x: any non-negative integer.

    Returns:
        The hash, below 2**64.
    """
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def default_trace_path() -> Path | None:
    """The trace the tools replay by default.

    ``$KVCAST_TRACE`` when set, else the conversation trace shipped in ``data/traces/``.

    Returns:
        The path, or None when the file named is missing (a clone without its data).
    """
    env = os.environ.get(TRACE_ENV)
    path = Path(env) if env else SHIPPED_TRACE
    return path if path.is_file() else None


class TraceFormatError(ValueError):
    """A trace line is not a JSON object with ``timestamp`` and a list of ``hash_ids``."""


@dataclass(frozen=True, slots=True)
class TraceRecord:
    """One request of a trace.

    Attributes:
        time: arrival time in seconds.
        tokens: prompt tokens (``input_length``), or None where the line has none.
        ids: prefix block ids, block 0 first.
    """

    time: float
    tokens: int | None
    ids: tuple[int, ...]


def read_trace(
    path: str | Path, *, limit: int | None = None, tokens: bool = False
) -> list[TraceRecord]:
    """The records of a Mooncake-format JSONL trace, in the file's order.

    Blank lines are skipped. A trace is not always sorted: callers that assign something per
    record (a host drawn from a seeded generator) do it in this order, then sort stably by time.

    Args:
        path: the ``.jsonl`` file.
        limit: read only the first ``limit`` requests.
        tokens: require ``input_length`` on every line (else it is parsed where present).

    Returns:
        The records, in the file's order.

    Raises:
        TraceFormatError: for a malformed line (the message names the file and line).
        OSError: if the file cannot be read.
    """
    out: list[TraceRecord] = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if limit is not None and len(out) >= limit:
                break
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                ts = float(obj["timestamp"]) / 1000.0
                n = int(obj["input_length"]) if tokens or "input_length" in obj else None
                ids = tuple(int(x) for x in obj["hash_ids"])
            except (ValueError, KeyError, TypeError) as exc:
                raise TraceFormatError(f"{path}:{lineno}: not a trace record ({exc})") from None
            out.append(TraceRecord(ts, n, ids))
    return out
