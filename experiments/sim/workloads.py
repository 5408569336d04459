"""Requests for the cluster model: the Mooncake trace and generated workloads.

A request arrives at a time on one GPU host with a prompt of ``tokens`` tokens whose prefix
blocks (512 tokens each in the trace) are named by ``blocks``, block 0 first; equal keys are
the same KV bytes (chained hashes), so the same key always has the same parent.

The trace names no hosts. :func:`load_trace` maps requests to hosts in one of three stated
ways: ``random`` (uniform, seeded: a load balancer that ignores prefixes; the default, as in
the policy evaluation), ``round-robin`` (in arrival order) or ``affinity`` (hash of the first
two block keys: block 0 is in every request of the trace, block 1 names the conversation, so a
conversation's turns land on one host, like a prefix-aware router).

Classes:
    SimRequest: one request (time, host, block keys, prompt tokens).
    SimWorkload: a named, time-ordered request list with its block size in tokens.

Functions:
    load_trace: the Mooncake JSONL trace (read by :mod:`experiments.traces`, whose ``mix64`` is
        the hash of the affinity mapping) with a host mapping and an optional speed-up.
    from_policy_workload: a workload of :mod:`experiments.policies.workloads` (Zipf, agentic)
        as simulator requests.
    zipf_workload: Zipf document popularity behind shared system prompts, on the cluster's hosts.
    agentic_workload: agent tasks fanning out to parallel branches on distinct hosts.
    burst_workload: synchronized groups of N hosts asking for one shared prefix (for Q4).
    make_workload: the experiments' named workloads (conversation, zipf, agentic).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiments.policies.workloads import (
    Workload,
    agentic_fanout_workload,
    zipf_prefix_workload,
)
from experiments.traces import BLOCK_TOKENS, default_trace_path, mix64, read_trace

__all__ = [
    "HOST_MAPPINGS",
    "SimRequest",
    "SimWorkload",
    "agentic_workload",
    "burst_workload",
    "from_policy_workload",
    "WORKLOADS",
    "load_trace",
    "make_workload",
    "zipf_workload",
]

HOST_MAPPINGS = ("random", "round-robin", "affinity")


@dataclass(frozen=True, slots=True)
class SimRequest:
    """One request.

    Attributes:
        time: arrival time in seconds.
        host: GPU host index.
        blocks: prefix block keys, block 0 first.
        tokens: prompt tokens (the last block may be partial).
    """

    time: float
    host: int
    blocks: tuple[int, ...]
    tokens: int


@dataclass(frozen=True)
class SimWorkload:
    """A time-ordered request list.

    Attributes:
        name: short name for result lines.
        requests: requests in arrival order.
        hosts: number of hosts the requests are spread over.
        block_tokens: tokens per block.
        description: how it was made (host mapping, seed, speed-up).
        warmup: leading requests that only prepare state (fill the pool) and are left out of
            fetch-time and TTFT statistics.
    """

    name: str
    requests: tuple[SimRequest, ...]
    hosts: int
    block_tokens: int = BLOCK_TOKENS
    description: str = ""
    warmup: int = 0

    @property
    def n_refs(self) -> int:
        """Block references."""
        return sum(len(r.blocks) for r in self.requests)

    @property
    def duration_s(self) -> float:
        """Time from the first to the last arrival."""
        return self.requests[-1].time - self.requests[0].time if self.requests else 0.0

    def head(self, n: int) -> SimWorkload:
        """The first ``n`` requests."""
        return SimWorkload(
            f"{self.name}[:{n}]",
            self.requests[:n],
            self.hosts,
            self.block_tokens,
            self.description,
            min(self.warmup, n),
        )

    def sped_up(self, factor: float) -> SimWorkload:
        """Arrival times divided by ``factor`` (more load on the same cluster)."""
        if factor == 1:
            return self
        reqs = tuple(SimRequest(r.time / factor, r.host, r.blocks, r.tokens) for r in self.requests)
        return SimWorkload(
            f"{self.name}x{factor:g}",
            reqs,
            self.hosts,
            self.block_tokens,
            f"{self.description}; arrivals sped up {factor:g}x",
            self.warmup,
        )


def _map_host(mapping: str, ids: Sequence[int], index: int, hosts: int, rng: random.Random) -> int:
    if mapping == "random":
        return rng.randrange(hosts)
    if mapping == "round-robin":
        return index % hosts
    if mapping == "affinity":
        h = 0
        for key in ids[:2]:
            h = mix64(h ^ key)
        return h % hosts
    raise ValueError(f"unknown host mapping {mapping!r}; known: {', '.join(HOST_MAPPINGS)}")


def load_trace(
    path: str | Path | None = None,
    *,
    hosts: int = 1024,
    mapping: str = "random",
    seed: int = 0,
    limit: int | None = None,
    speedup: float = 1.0,
) -> SimWorkload:
    """Load the Mooncake conversation trace (timestamp ms, input_length, hash_ids).

    Args:
        path: the JSONL file (default: :func:`default_trace_path`).
        hosts: GPU hosts to map requests to.
        mapping: ``random``, ``round-robin`` or ``affinity`` (see the module docstring).
        seed: seed of the ``random`` mapping.
        limit: read only the first ``limit`` requests.
        speedup: divide arrival times by this (1: the trace's own timing).

    Returns:
        The workload.

    Raises:
        FileNotFoundError: when no path is given and the trace is not found.
        experiments.traces.TraceFormatError: for a malformed line.
        ValueError: for an unknown mapping.
    """
    if mapping not in HOST_MAPPINGS:
        raise ValueError(f"unknown host mapping {mapping!r}; known: {', '.join(HOST_MAPPINGS)}")
    if path is None:
        path = default_trace_path()
        if path is None:
            raise FileNotFoundError(
                "conversation trace not found: data/traces/ is missing and KVCAST_TRACE unset"
            )
    rng = random.Random(seed)
    raw = sorted(read_trace(path, limit=limit, tokens=True), key=lambda r: r.time)
    requests = tuple(
        SimRequest(r.time, _map_host(mapping, r.ids, i, hosts, rng), r.ids, r.tokens or 0)
        for i, r in enumerate(raw)
    )
    w = SimWorkload(
        "conversation",
        requests,
        hosts,
        BLOCK_TOKENS,
        f"{path}: {len(requests)} requests, host mapping {mapping} over {hosts} (seed {seed})",
    )
    return w.sped_up(speedup)


def from_policy_workload(w: Workload, hosts: int, block_tokens: int = BLOCK_TOKENS) -> SimWorkload:
    """Requests of a generated policy workload; prompts are whole blocks.

    Args:
        w: the workload (its hosts must be below ``hosts``).
        hosts: cluster hosts.
        block_tokens: tokens per block.

    Returns:
        The simulator workload.
    """
    reqs = tuple(
        SimRequest(r.time, r.host % hosts, r.blocks, len(r.blocks) * block_tokens)
        for r in w.requests
    )
    return SimWorkload(w.name, reqs, hosts, block_tokens, w.description)


def zipf_workload(hosts: int, n_requests: int = 12000, seed: int = 1, **kw: Any) -> SimWorkload:
    """:func:`experiments.policies.workloads.zipf_prefix_workload` on ``hosts`` hosts.

    Args:
        hosts: cluster hosts (requests uniform over them).
        n_requests: requests.
        seed: random seed.
        **kw: other generator parameters (e.g. ``rate_per_s``, ``alpha``).

    Returns:
        The workload.
    """
    w = zipf_prefix_workload(n_requests=n_requests, hosts=hosts, seed=seed, **kw)
    return from_policy_workload(w, hosts)


def agentic_workload(hosts: int, n_tasks: int = 300, seed: int = 2, **kw: Any) -> SimWorkload:
    """:func:`experiments.policies.workloads.agentic_fanout_workload` on ``hosts`` hosts.

    Branches of one task run on distinct hosts and share the system prompt, the tool
    definitions and the task context (the multicast case).

    Args:
        hosts: cluster hosts.
        n_tasks: agent tasks.
        seed: random seed.
        **kw: other generator parameters (e.g. ``task_rate_per_s``, ``fanout_max``).

    Returns:
        The workload.
    """
    w = agentic_fanout_workload(n_tasks=n_tasks, hosts=hosts, seed=seed, **kw)
    return from_policy_workload(w, hosts)


def burst_workload(
    *,
    consumers: int,
    prefix_blocks: int,
    bursts: int,
    hosts: int,
    gap_s: float = 1.0,
    jitter_s: float = 0.0,
    prefixes: int = 1,
    seed: int = 3,
    block_tokens: int = BLOCK_TOKENS,
    warmup_s: float = 5.0,
) -> SimWorkload:
    """Synchronized consumers: each burst, ``consumers`` distinct hosts ask for one shared prefix.

    At time 0 one warm-up request per prefix (on a random host) computes it, so the pool holds
    it when the bursts begin at ``warmup_s``; warm-up requests are marked as such
    (``SimWorkload.warmup``). Prefix ``j`` (of ``prefixes``) is then requested in bursts ``j,
    j + prefixes, ...``; bursts start ``gap_s`` apart; each consumer of a burst arrives uniformly
    within ``jitter_s`` of its start. Each request is the prefix plus one unique block (its own
    question), so every consumer also computes something. ``bursts / prefixes`` is the reuse of
    a prefix over time.

    Args:
        consumers: N, hosts per burst (at most ``hosts``).
        prefix_blocks: shared prefix length in blocks.
        bursts: number of bursts.
        hosts: hosts to draw consumers from.
        gap_s: time between burst starts.
        jitter_s: spread of arrivals within a burst.
        prefixes: distinct prefixes, used in turn.
        seed: random seed.
        block_tokens: tokens per block.
        warmup_s: time between the warm-up requests and the first burst.

    Returns:
        The workload.

    Raises:
        ValueError: if ``consumers`` exceeds ``hosts`` or a count is not positive.
    """
    if not 0 < consumers <= hosts or prefix_blocks <= 0 or bursts <= 0 or prefixes <= 0:
        raise ValueError("need 0 < consumers <= hosts and positive prefix_blocks/bursts/prefixes")
    rng = random.Random(seed)
    base = mix64(seed) & 0xFFFFFFFF00000000
    prefix_keys = [
        tuple(mix64(base + j * 1000 + i) for i in range(prefix_blocks)) for j in range(prefixes)
    ]
    unique = 10**9
    warm: list[SimRequest] = []
    for keys in prefix_keys:
        unique += 1
        blocks = (*keys, mix64(base ^ unique))
        warm.append(SimRequest(0.0, rng.randrange(hosts), blocks, len(blocks) * block_tokens))
    reqs: list[SimRequest] = []
    for b in range(bursts):
        start = warmup_s + b * gap_s
        for host in rng.sample(range(hosts), consumers):
            unique += 1
            blocks = prefix_keys[b % prefixes] + (mix64(base ^ unique),)
            t = start + rng.uniform(0.0, jitter_s) if jitter_s > 0 else start
            reqs.append(SimRequest(t, host, blocks, len(blocks) * block_tokens))
    reqs.sort(key=lambda r: r.time)
    return SimWorkload(
        f"burst-n{consumers}",
        (*warm, *reqs),
        hosts,
        block_tokens,
        f"{bursts} bursts of {consumers} consumers, {prefixes} prefixes of {prefix_blocks} "
        f"blocks, gap {gap_s:g}s, jitter {jitter_s:g}s, seed {seed}",
        warmup=len(warm),
    )


WORKLOADS = ("conversation", "zipf", "agentic")


def make_workload(
    name: str,
    *,
    hosts: int,
    quick: bool = False,
    mapping: str = "random",
    speedup: float = 1.0,
    trace: Path | None = None,
) -> SimWorkload:
    """One of the experiments' named workloads.

    ``conversation`` is the whole Mooncake trace (600 requests with ``quick``); ``zipf`` is
    12,000 requests at 4/s (600 with ``quick``); ``agentic`` is 300 tasks at 0.5/s with 2-16
    branches each (20 tasks with ``quick``).

    Args:
        name: one of :data:`WORKLOADS`.
        hosts: cluster hosts.
        quick: a small slice for smoke runs.
        mapping: host mapping of the trace (generated workloads carry their own hosts).
        speedup: divide arrival times by this.
        trace: the trace file of ``conversation`` (default: :func:`default_trace_path`).

    Returns:
        The workload.

    Raises:
        ValueError: for an unknown name.
    """
    if name == "conversation":
        limit = 600 if quick else None
        return load_trace(trace, hosts=hosts, mapping=mapping, limit=limit).sped_up(speedup)
    if name == "zipf":
        return zipf_workload(hosts, n_requests=600 if quick else 12000).sped_up(speedup)
    if name == "agentic":
        return agentic_workload(hosts, n_tasks=20 if quick else 300).sped_up(speedup)
    raise ValueError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
