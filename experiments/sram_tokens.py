"""How many tokens of KV one Tofino pipe's SRAM holds for real model shapes, and Q1 there.

The fragment store of one Tofino-1 pipe holds ``NUM_FRAG_SLOTS x FRAG_BYTES`` (3 MiB with the
sizes the Tofino backend places, read from ``p4src/shared/sizes.p4`` by
:func:`experiments.sim.hardware.tofino1`). A token's KV takes, in bf16, ``layers x KV heads x
head dim x 2 (K and V) x 2 bytes`` for grouped-query attention, and ``layers x (latent rank +
rope dim) x 2 bytes`` for multi-head latent attention (MLA caches one compressed latent and
one shared rope key per token and layer). The shapes are those of the models' public
``config.json`` (named in :data:`MODELS`).

At those budgets no 512-token block of the Mooncake traces fits, so Q1 ("which prefixes
deserve SRAM") is asked at the granularity a paged KV cache has, 16-token pages: SRAM holds
the first ``T`` tokens (whole pages) of *one* prefix, and a request is served ``min(T,
prompt)`` tokens from it when its first 512-token block is that prefix's (the traces give no
finer hashes, so two requests share their first ``T`` tokens exactly when they share their
first block, a lower bound on sharing). Three selections of the prefix to hold: the first
block that serves most in hindsight (the static optimum), the most frequent so far (LFU, online)
and the last request's (LRU, online).

Run: ``python -m experiments.sram_tokens`` (``--limit N``: the first N requests of each
trace). Prints one ``result sram-tokens ...`` line per model and one ``result
sram-tokens-q1 ...`` line per model, trace and selection.

Classes:
    ModelShape: a model's KV geometry.

Functions:
    kv_bytes_per_token: bytes of KV one token takes.
    tokens_that_fit: tokens (and whole pages) a budget holds.
    served_tokens: Q1 at a budget of T tokens: tokens served under each selection.
    main: command line.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from experiments.sim.hardware import tofino1
from experiments.sim.report import result_line
from experiments.traces import BLOCK_TOKENS, SHIPPED_TRACE, SYNTHETIC_TRACE, read_trace

__all__ = [
    "MODELS",
    "PAGE_TOKENS",
    "ModelShape",
    "kv_bytes_per_token",
    "main",
    "served_tokens",
    "tokens_that_fit",
]

PAGE_TOKENS = 16
"""Tokens per page of a paged KV cache (vLLM's default block size)."""


@dataclass(frozen=True)
class ModelShape:
    """A model's KV geometry (bf16).

    Attributes:
        name: model name.
        layers: decoder layers.
        kv_heads: key/value heads (grouped-query attention; 0 for MLA).
        head_dim: dimension per head (0 for MLA).
        latent: MLA's compressed KV rank plus its rope key dimension (0 without MLA).
        source: where the shape comes from.
        elem_bytes: bytes per element.
    """

    name: str
    layers: int
    kv_heads: int
    head_dim: int
    latent: int
    source: str
    elem_bytes: int = 2


MODELS = (
    ModelShape(
        "Llama-3-8B", 32, 8, 128, 0,
        "meta-llama/Meta-Llama-3-8B config.json: 32 layers, 8 KV heads, 4096 / 32 heads",
    ),
    ModelShape(
        "Llama-3.2-1B", 16, 8, 64, 0,
        "meta-llama/Llama-3.2-1B config.json: 16 layers, 8 KV heads, head_dim 64",
    ),
    ModelShape(
        "Qwen2.5-0.5B", 24, 2, 64, 0,
        "Qwen/Qwen2.5-0.5B config.json: 24 layers, 2 KV heads, 896 / 14 heads",
    ),
    ModelShape(
        "DeepSeek-V2-Lite", 27, 0, 0, 512 + 64,
        "deepseek-ai/DeepSeek-V2-Lite config.json: 27 layers, kv_lora_rank 512, "
        "qk_rope_head_dim 64 (MLA)",
    ),
)  # fmt: skip
"""The shapes of issue 29 (a GQA 8B, 1B and 0.5B model and an MLA model)."""


def kv_bytes_per_token(m: ModelShape) -> int:
    """Bytes of KV one token takes in every layer.

    Args:
        m: the model.

    Returns:
        ``layers x kv_heads x head_dim x 2 x elem_bytes`` (K and V), or for MLA
        ``layers x latent x elem_bytes`` (one latent vector with its rope key).
    """
    if m.latent:
        return m.layers * m.latent * m.elem_bytes
    return m.layers * m.kv_heads * m.head_dim * 2 * m.elem_bytes


def tokens_that_fit(budget_bytes: int, m: ModelShape) -> tuple[int, int]:
    """Tokens of ``m``'s KV a budget holds, and whole 16-token pages of them.

    Returns:
        ``(tokens, pages)``.
    """
    tokens = budget_bytes // kv_bytes_per_token(m)
    return tokens, tokens // PAGE_TOKENS


def _requests(path: Path, limit: int | None) -> list[tuple[int, int]]:
    """(first hash id, prompt tokens) of each request with blocks of a Mooncake-format trace.

    In the file's order; ``limit`` counts requests with blocks. A line without
    ``input_length`` counts whole blocks.
    """
    out = [
        (r.ids[0], r.tokens if r.tokens is not None else len(r.ids) * BLOCK_TOKENS)
        for r in read_trace(path)
        if r.ids
    ]
    return out[:limit]


def served_tokens(requests: Sequence[tuple[int, int]], tokens: int) -> dict[str, int]:
    """Q1 at a budget of ``tokens`` (at most one trace block): prompt tokens served from SRAM.

    SRAM holds the first ``tokens`` tokens of one prefix (one first block); a request whose
    first block it is gets ``min(tokens, prompt)`` tokens from SRAM. (With one held prefix, the
    best choice in hindsight is the first block whose requests take the most tokens.)

    Args:
        requests: (first block id, prompt tokens) in arrival order.
        tokens: the budget in tokens (whole pages), at most one trace block.

    Returns:
        Tokens served under ``static-best`` (in hindsight, the first block that serves most),
        ``lfu`` (the most frequent so far, first seen on ties) and ``lru`` (the previous
        request's), and ``prompt`` (all prompt tokens).
    """
    t = min(tokens, BLOCK_TOKENS)
    worth: Counter[int] = Counter()
    for first, length in requests:
        worth[first] += min(t, length)
    best = max(worth, key=lambda k: worth[k]) if worth else None
    served = {"static-best": 0, "lfu": 0, "lru": 0}
    seen: Counter[int] = Counter()
    lfu: int | None = None
    lru: int | None = None
    for first, length in requests:
        got = min(t, length)
        served["static-best"] += got if first == best else 0
        served["lfu"] += got if first == lfu else 0
        served["lru"] += got if first == lru else 0
        seen[first] += 1
        if lfu is None or seen[first] > seen[lfu]:
            lfu = first
        lru = first
    served["prompt"] = sum(length for _, length in requests)
    return served


def main(argv: Sequence[str] | None = None) -> int:
    """Command line.

    Returns:
        0.
    """
    ap = argparse.ArgumentParser(prog="python -m experiments.sram_tokens", description=__doc__)
    ap.formatter_class = argparse.RawDescriptionHelpFormatter
    ap.add_argument("--limit", type=int, default=None, help="first N requests of each trace")
    args = ap.parse_args(argv)
    budget = tofino1().sram_bytes
    traces = {p.name.removesuffix("_trace.jsonl"): p for p in (SHIPPED_TRACE, SYNTHETIC_TRACE)}
    loaded = {name: _requests(p, args.limit) for name, p in traces.items() if p.is_file()}
    for m in MODELS:
        per_token = kv_bytes_per_token(m)
        tokens, pages = tokens_that_fit(budget, m)
        result_line(
            "sram-tokens",
            model=m.name,
            kv_bytes_per_token=per_token,
            sram_bytes=budget,
            tokens=tokens,
            pages16=pages,
            blocks512=budget // (per_token * BLOCK_TOKENS),
        )
        for trace, requests in loaded.items():
            served = served_tokens(requests, pages * PAGE_TOKENS)
            for how in ("static-best", "lfu", "lru"):
                result_line(
                    "sram-tokens-q1",
                    model=m.name,
                    trace=trace,
                    tokens=pages * PAGE_TOKENS,
                    selection=how,
                    served_share=round(served[how] / served["prompt"], 5),
                    to_static_best=round(served[how] / max(served["static-best"], 1), 3),
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
