"""Workloads for policy evaluation: the Mooncake conversation trace and generated prefix traces.

A workload is a time-ordered list of requests; each request names the prefix blocks its prompt
consists of, block 0 first. Equal keys at the same position are the same reusable KV block,
and a block's key determines its whole prefix (keys are chained hashes), so every block has
one parent: the block before it.

Classes:
    Request: one request (arrival time, host, tenant, block keys).
    Workload: a named, immutable list of requests plus the block size, with the flattened
        per-block access stream that replays feed to policies.

Functions:
    load_mooncake_trace: a Mooncake-format JSONL trace (:mod:`experiments.traces`) as a
        workload, hosts drawn uniformly.
    zipf_prefix_workload: documents behind shared system prompts, Zipf popularity, optional
        popularity churn, unique per-request suffixes.
    agentic_fanout_workload: agent tasks that fan out into parallel branches on distinct hosts
        sharing a system prompt, a tool-definition prefix and the task context.
    multitenant_prompts_workload: many tenants, each with a few long system prompts (and
        few-shot examples) of its own, tenant traffic Zipf-skewed, short unique questions.
    chat_sessions_workload: multi-turn chat: each turn's prompt is the session's whole history
        plus the new message, turns separated by the user's think time.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from controlplane.policies.base import Access
from experiments.traces import mix64, read_trace

__all__ = [
    "DEFAULT_BLOCK_BYTES",
    "Request",
    "Workload",
    "agentic_fanout_workload",
    "chat_sessions_workload",
    "load_mooncake_trace",
    "multitenant_prompts_workload",
    "zipf_prefix_workload",
]

DEFAULT_BLOCK_BYTES = 64 * 1024
"""Nominal bytes per block. With equal-size blocks every byte ratio is independent of it."""


@dataclass(frozen=True, slots=True)
class Request:
    """One request of a workload.

    Attributes:
        time: arrival time in seconds.
        host: GPU host that serves it.
        tenant: tenant id.
        blocks: prefix block keys, block 0 first.
    """

    time: float
    host: int
    tenant: int
    blocks: tuple[int, ...]


@dataclass(frozen=True)
class Workload:
    """A named request stream with equal-size blocks.

    Attributes:
        name: short name used in result lines.
        requests: requests in arrival order.
        block_bytes: bytes per block.
        description: one line on how it was made.
    """

    name: str
    requests: tuple[Request, ...]
    block_bytes: int = DEFAULT_BLOCK_BYTES
    description: str = ""
    _accesses: list[Access] = field(default_factory=list, init=False, repr=False, compare=False)
    _first: list[bool] = field(default_factory=list, init=False, repr=False, compare=False)

    @property
    def n_refs(self) -> int:
        """Number of block references (accesses)."""
        return sum(len(r.blocks) for r in self.requests)

    def accesses(self) -> list[Access]:
        """The flattened access stream (built once; ``hit`` is None, parents and positions set).

        Returns:
            One :class:`~controlplane.policies.base.Access` per block reference, in order.
        """
        if not self._accesses:
            size = self.block_bytes
            out = self._accesses
            first = self._first
            for r in self.requests:
                parent: int | None = None
                for i, key in enumerate(r.blocks):
                    out.append(Access(key, r.tenant, size, r.host, r.time, None, parent, i))
                    first.append(i == 0)
                    parent = key
        return self._accesses

    def request_starts(self) -> list[bool]:
        """For each access of :meth:`accesses`, whether it is block 0 of its request."""
        self.accesses()
        return self._first

    def key_sequence(self) -> list[int]:
        """The key of every access, in order (the future an offline policy needs)."""
        return [a.key for a in self.accesses()]

    def head(self, n_requests: int) -> Workload:
        """The first ``n_requests`` requests as a new workload (for quick runs and tests)."""
        return Workload(
            f"{self.name}[:{n_requests}]",
            self.requests[:n_requests],
            self.block_bytes,
            self.description,
        )


def load_mooncake_trace(
    path: str | Path,
    *,
    hosts: int = 16,
    seed: int = 0,
    limit: int | None = None,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
    name: str | None = None,
) -> Workload:
    """Load a Mooncake-format JSONL trace.

    Each line holds ``timestamp`` (ms) and ``hash_ids`` (one id per 512-token block). The
    trace names no hosts, so each request is assigned a host uniformly at random (seeded):
    the load balancer is assumed not to be prefix-aware.

    Args:
        path: the ``.jsonl`` file.
        hosts: number of GPU hosts to spread requests over.
        seed: seed of the host assignment.
        limit: read only the first ``limit`` requests.
        block_bytes: bytes per block.
        name: workload name (default: the file's name without ``.jsonl`` and without a
            ``_trace`` suffix: ``conversation`` for ``conversation_trace.jsonl``).

    Returns:
        The workload (times in seconds, tenant 0).

    Raises:
        experiments.traces.TraceFormatError: for a malformed line (the message names the
            line).
        OSError: if the file cannot be read.
    """
    rng = random.Random(seed)
    requests = [
        Request(r.time, rng.randrange(hosts), 0, r.ids) for r in read_trace(path, limit=limit)
    ]
    requests.sort(key=lambda r: r.time)  # stable: equal timestamps keep file order
    if name is None:
        stem = Path(path).name.removesuffix(".jsonl")
        name = stem.removesuffix("_trace") or stem
    about = f"{path} ({len(requests)} requests, hosts uniform over {hosts}, seed {seed})"
    return _in_time_order(name, requests, block_bytes, about)


def _in_time_order(
    name: str, requests: list[Request], block_bytes: int, description: str
) -> Workload:
    """A workload of ``requests`` sorted by arrival time (stable: equal times keep their order)."""
    requests.sort(key=lambda r: r.time)
    return Workload(name, tuple(requests), block_bytes, description)


def _sources(seed: int) -> tuple[random.Random, _Keys]:
    """A generator's random numbers and its fresh keys, both from its seed."""
    return random.Random(seed), _Keys(seed * 2 + 1)


class _Keys:
    """Fresh, distinct 64-bit keys."""

    def __init__(self, salt: int) -> None:
        self._next = salt << 40

    def take(self, n: int) -> tuple[int, ...]:
        start = self._next
        self._next += n
        return tuple(mix64(start + i) for i in range(n))


def _geometric(rng: random.Random, mean: float) -> int:
    """A geometric count >= 1 with the given mean."""
    if mean <= 1:
        return 1
    p = 1.0 / mean
    return 1 + int(math.log(1.0 - rng.random()) / math.log(1.0 - p))


def _zipf_cdf(n: int, alpha: float) -> list[float]:
    weights = [1.0 / (i + 1) ** alpha for i in range(n)]
    total = sum(weights)
    acc = 0.0
    cdf = []
    for w in weights:
        acc += w / total
        cdf.append(acc)
    cdf[-1] = 1.0
    return cdf


def _pick(cdf: Sequence[float], u: float) -> int:
    lo, hi = 0, len(cdf) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if cdf[mid] < u:
            lo = mid + 1
        else:
            hi = mid
    return lo


def zipf_prefix_workload(
    *,
    n_requests: int = 12000,
    n_documents: int = 4000,
    alpha: float = 0.9,
    n_system_prompts: int = 8,
    system_blocks_max: int = 4,
    doc_blocks_mean: float = 8.0,
    suffix_blocks_mean: float = 3.0,
    rate_per_s: float = 4.0,
    churn_period_s: float | None = None,
    churn_fraction: float = 0.2,
    hosts: int = 16,
    tenants: int = 1,
    seed: int = 1,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
    name: str = "zipf",
) -> Workload:
    """Requests for documents behind shared system prompts, with Zipf popularity.

    Each document is one of ``n_system_prompts`` system-prompt chains (1 to
    ``system_blocks_max`` blocks) followed by its own blocks (geometric, mean
    ``doc_blocks_mean``). A request picks a document by Zipf(``alpha``) popularity and appends
    a unique suffix (geometric, mean ``suffix_blocks_mean``) that is never reused. Arrivals are
    Poisson; hosts and tenants uniform. With ``churn_period_s``, every period the popularity
    ranks of a random ``churn_fraction`` of the documents are shuffled among themselves, so
    yesterday's hot documents cool down and others heat up.

    Args:
        n_requests: number of requests.
        n_documents: number of distinct documents.
        alpha: Zipf exponent of document popularity.
        n_system_prompts: distinct system-prompt chains.
        system_blocks_max: longest system prompt, in blocks.
        doc_blocks_mean: mean document length in blocks.
        suffix_blocks_mean: mean unique suffix length in blocks.
        rate_per_s: request rate.
        churn_period_s: period of popularity churn (None: stationary).
        churn_fraction: share of documents whose ranks are shuffled each period.
        hosts: number of hosts.
        tenants: number of tenants.
        seed: random seed.
        block_bytes: bytes per block.
        name: workload name.

    Returns:
        The workload.
    """
    rng, keys = _sources(seed)
    systems = [keys.take(rng.randint(1, system_blocks_max)) for _ in range(n_system_prompts)]
    docs = [
        systems[rng.randrange(n_system_prompts)] + keys.take(_geometric(rng, doc_blocks_mean))
        for _ in range(n_documents)
    ]
    rank_to_doc = list(range(n_documents))
    rng.shuffle(rank_to_doc)
    cdf = _zipf_cdf(n_documents, alpha)
    t = 0.0
    next_churn = churn_period_s if churn_period_s else math.inf
    requests = []
    for _ in range(n_requests):
        t += rng.expovariate(rate_per_s)
        while t >= next_churn:
            k = max(2, int(churn_fraction * n_documents))
            ranks = rng.sample(range(n_documents), k)
            moved = [rank_to_doc[r] for r in ranks]
            rng.shuffle(moved)
            for r, d in zip(ranks, moved, strict=True):
                rank_to_doc[r] = d
            next_churn += churn_period_s or math.inf
        doc = docs[rank_to_doc[_pick(cdf, rng.random())]]
        blocks = doc + keys.take(_geometric(rng, suffix_blocks_mean))
        requests.append(Request(t, rng.randrange(hosts), rng.randrange(tenants), blocks))
    churn = f", churn {churn_fraction:g}/{churn_period_s:g}s" if churn_period_s else ""
    about = (
        f"Zipf({alpha:g}) over {n_documents} documents behind {n_system_prompts} system "
        f"prompts, {n_requests} requests at {rate_per_s:g}/s{churn}, seed {seed}"
    )
    return _in_time_order(name, requests, block_bytes, about)


def agentic_fanout_workload(
    *,
    n_tasks: int = 600,
    n_system_prompts: int = 3,
    system_blocks: int = 4,
    n_toolsets: int = 6,
    toolset_blocks: int = 3,
    context_blocks_mean: float = 6.0,
    fanout_min: int = 2,
    fanout_max: int = 16,
    steps_mean: float = 4.0,
    step_blocks_max: int = 2,
    task_rate_per_s: float = 0.5,
    fanout_delay_s: float = 2.0,
    step_gap_mean_s: float = 6.0,
    hosts: int = 32,
    seed: int = 2,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
    name: str = "agentic",
) -> Workload:
    """Agent tasks whose parallel branches share a system prompt, tools and the task context.

    A task arrives (Poisson, ``task_rate_per_s``) with a system prompt and a toolset (uniform
    choices) and a fresh task context (geometric, mean ``context_blocks_mean`` blocks). A
    planner request for that prefix runs on one host; after about ``fanout_delay_s`` the task
    fans out into ``fanout_min..fanout_max`` branches on distinct hosts (the multicast case:
    the same prefix wanted by many hosts at once). Each branch runs a geometric number of
    steps (mean ``steps_mean``) spaced by exponential gaps (mean ``step_gap_mean_s``); every
    step's prompt is the shared prefix plus the branch's history so far plus 1 to
    ``step_blocks_max`` new blocks, so a branch's history is reused by its own later steps.

    Args:
        n_tasks: number of tasks.
        n_system_prompts: distinct system prompts.
        system_blocks: blocks per system prompt.
        n_toolsets: distinct tool-definition prefixes.
        toolset_blocks: blocks per toolset.
        context_blocks_mean: mean task-context length in blocks.
        fanout_min: fewest branches per task.
        fanout_max: most branches per task (at most ``hosts``).
        steps_mean: mean steps per branch.
        step_blocks_max: most new blocks per step.
        task_rate_per_s: task arrival rate.
        fanout_delay_s: mean delay from the planner request to the fan-out.
        step_gap_mean_s: mean gap between a branch's steps.
        hosts: number of hosts.
        seed: random seed.
        block_bytes: bytes per block.
        name: workload name.

    Returns:
        The workload.
    """
    rng, keys = _sources(seed)
    systems = [keys.take(system_blocks) for _ in range(n_system_prompts)]
    # Keys are chained hashes: the same tool definitions behind two different system prompts
    # are two different blocks, so each (system prompt, toolset) pair gets its own keys.
    toolsets = {
        (s, t): keys.take(toolset_blocks)
        for s in range(n_system_prompts)
        for t in range(n_toolsets)
    }
    fanout_max = min(fanout_max, hosts)
    requests: list[Request] = []
    t = 0.0
    for _ in range(n_tasks):
        t += rng.expovariate(task_rate_per_s)
        system = rng.randrange(n_system_prompts)
        prefix = (
            systems[system]
            + toolsets[system, rng.randrange(n_toolsets)]
            + keys.take(_geometric(rng, context_blocks_mean))
        )
        requests.append(Request(t, rng.randrange(hosts), 0, prefix))
        start = t + rng.expovariate(1.0 / fanout_delay_s)
        for host in rng.sample(range(hosts), rng.randint(fanout_min, fanout_max)):
            history: tuple[int, ...] = ()
            ts = start + rng.expovariate(10.0)  # branches start within ~100 ms of each other
            for _step in range(_geometric(rng, steps_mean)):
                history += keys.take(rng.randint(1, step_blocks_max))
                requests.append(Request(ts, host, 0, prefix + history))
                ts += rng.expovariate(1.0 / step_gap_mean_s)
    about = (
        f"{n_tasks} agent tasks at {task_rate_per_s:g}/s, fan-out {fanout_min}-{fanout_max} "
        f"over {hosts} hosts, {steps_mean:g} steps/branch, seed {seed}"
    )
    return _in_time_order(name, requests, block_bytes, about)


def multitenant_prompts_workload(
    *,
    n_requests: int = 12000,
    n_tenants: int = 40,
    tenant_alpha: float = 1.1,
    prompts_per_tenant: int = 3,
    prompt_blocks_mean: float = 6.0,
    examples_blocks_max: int = 4,
    question_blocks_mean: float = 1.5,
    rate_per_s: float = 6.0,
    hosts: int = 16,
    seed: int = 3,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
    name: str = "multitenant",
) -> Workload:
    """Many tenants behind one service, each with a few long system prompts of its own.

    A tenant is picked by Zipf(``tenant_alpha``) over ``n_tenants`` (a few large customers,
    a long tail), then one of its ``prompts_per_tenant`` prompts uniformly. A prompt is a
    system prompt (geometric, mean ``prompt_blocks_mean`` blocks) and, for half the requests,
    a few-shot example block set (1 to ``examples_blocks_max`` blocks) chosen from two per
    prompt; a unique question (geometric, mean ``question_blocks_mean``) ends the request. Keys
    are per tenant (the tenant salts the block hash), so no block is shared across tenants.

    Args:
        n_requests: number of requests.
        n_tenants: tenants.
        tenant_alpha: Zipf exponent of tenant traffic.
        prompts_per_tenant: distinct system prompts per tenant.
        prompt_blocks_mean: mean system-prompt length in blocks.
        examples_blocks_max: longest few-shot block set.
        question_blocks_mean: mean unique question length in blocks.
        rate_per_s: request rate (Poisson).
        hosts: number of hosts (uniform).
        seed: random seed.
        block_bytes: bytes per block.
        name: workload name.

    Returns:
        The workload.
    """
    rng, keys = _sources(seed)
    prompts = [
        [keys.take(_geometric(rng, prompt_blocks_mean)) for _ in range(prompts_per_tenant)]
        for _ in range(n_tenants)
    ]
    examples = {
        (t, p, e): keys.take(rng.randint(1, examples_blocks_max))
        for t in range(n_tenants)
        for p in range(prompts_per_tenant)
        for e in range(2)
    }
    order = list(range(n_tenants))
    rng.shuffle(order)
    cdf = _zipf_cdf(n_tenants, tenant_alpha)
    t = 0.0
    requests = []
    for _ in range(n_requests):
        t += rng.expovariate(rate_per_s)
        tenant = order[_pick(cdf, rng.random())]
        p = rng.randrange(prompts_per_tenant)
        blocks = prompts[tenant][p]
        if rng.random() < 0.5:
            blocks += examples[tenant, p, rng.randrange(2)]
        blocks += keys.take(_geometric(rng, question_blocks_mean))
        requests.append(Request(t, rng.randrange(hosts), tenant, blocks))
    about = (
        f"{n_tenants} tenants (Zipf {tenant_alpha:g}) x {prompts_per_tenant} system prompts, "
        f"{n_requests} requests at {rate_per_s:g}/s, seed {seed}"
    )
    return _in_time_order(name, requests, block_bytes, about)


def chat_sessions_workload(
    *,
    n_sessions: int = 1500,
    n_system_prompts: int = 4,
    system_blocks: int = 2,
    turns_mean: float = 5.0,
    message_blocks_max: int = 2,
    reply_blocks_max: int = 2,
    think_time_mean_s: float = 45.0,
    session_rate_per_s: float = 0.8,
    hosts: int = 16,
    affinity: float = 0.0,
    seed: int = 4,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
    name: str = "chat",
) -> Workload:
    """Multi-turn chat sessions with the user's think time between turns.

    Sessions arrive Poisson (``session_rate_per_s``) on one of ``n_system_prompts`` system
    prompts. A session runs a geometric number of turns (mean ``turns_mean``); each turn's
    prompt is the system prompt, every earlier message and reply of the session, and the new
    message (1 to ``message_blocks_max`` blocks); its reply (1 to ``reply_blocks_max`` blocks)
    joins the history. Turns are separated by exponential think times (mean
    ``think_time_mean_s``), so a session's prefix returns after tens of seconds, as in the
    conversation trace. With ``affinity`` p, a turn goes to the session's previous host with
    probability p (a prefix-aware router), else to a random one.

    Args:
        n_sessions: sessions.
        n_system_prompts: distinct system prompts.
        system_blocks: blocks per system prompt.
        turns_mean: mean turns per session.
        message_blocks_max: longest user message, in blocks.
        reply_blocks_max: longest reply, in blocks.
        think_time_mean_s: mean gap between a session's turns.
        session_rate_per_s: session arrival rate.
        hosts: number of hosts.
        affinity: probability that a turn stays on the session's host.
        seed: random seed.
        block_bytes: bytes per block.
        name: workload name.

    Returns:
        The workload.
    """
    rng, keys = _sources(seed)
    systems = [keys.take(system_blocks) for _ in range(n_system_prompts)]
    requests: list[Request] = []
    t = 0.0
    for _ in range(n_sessions):
        t += rng.expovariate(session_rate_per_s)
        history = systems[rng.randrange(n_system_prompts)]
        host = rng.randrange(hosts)
        ts = t
        for _turn in range(_geometric(rng, turns_mean)):
            history += keys.take(rng.randint(1, message_blocks_max))
            if rng.random() >= affinity:
                host = rng.randrange(hosts)
            requests.append(Request(ts, host, 0, history))
            history += keys.take(rng.randint(1, reply_blocks_max))
            ts += rng.expovariate(1.0 / think_time_mean_s)
    about = (
        f"{n_sessions} chat sessions at {session_rate_per_s:g}/s, {turns_mean:g} turns and "
        f"{think_time_mean_s:g} s think time on average, seed {seed}"
    )
    return _in_time_order(name, requests, block_bytes, about)
