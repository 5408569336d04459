"""What a serving sweep runs: the emulation's model, the link scaling, the prompts and the plan.

Classes:
    Deployment: the real deployment the link rates are scaled to.
    Plan: what one sweep does.
    TracePlan: requests from a Mooncake-format trace, replayed on the engines.

Functions:
    emu_kv_bytes_per_token: KV bytes per token of the emulation's model.
    make_model: the emulation's model directory.
    link_mbit: the link rate that keeps the deployment's fetch/prefill ratio.
    tokens: random prompt tokens.
    trace_requests: a trace's first requests as timed prompts.
    mode_options: the connector's options of one engine in a mode.
    replicas: how many pool nodes hold the prefix in a mode.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiments.serving_engine import BLOCK_SIZE

REPO = Path(__file__).resolve().parents[1]
TENANT = 7
MODES = ("recompute", "pool", "r2", "r4", "multicast", "sram", "local")
DEFAULT_MODES = ",".join(MODES)

EMU_SHAPE: dict[str, Any] = {
    "hidden_size": 1024,
    "intermediate_size": 4096,
    "num_hidden_layers": 4,
    "num_attention_heads": 16,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "vocab_size": 4096,
}
"""The emulation's model: 68M parameters, 1 KiB of bf16 KV per token (4 layers x 1 KV head x
64 dims x K and V x 2 bytes), so a 1,024-token prefix is 1 MiB: 32 vLLM blocks of 32 tokens,
4,096 256-byte fragments, within the switch's 8,192 SRAM slots."""


@dataclass(frozen=True)
class Deployment:
    """The real deployment whose fetch/prefill ratio the emulated links keep.

    Attributes:
        model: the model and its KV dtype.
        gpu: where the prefill rate comes from.
        prefill_us_per_token: prefill time per prompt token.
        kv_bytes_per_token: KV bytes per token (2 x layers x KV heads x head dim x bytes).
        nic_gbps: a GPU host's NIC rate (the pool node's too).
    """

    model: str
    gpu: str
    prefill_us_per_token: float
    kv_bytes_per_token: int
    nic_gbps: float

    @property
    def fetch_us_per_token(self) -> float:
        """Time to move one token's KV through the NIC."""
        return self.kv_bytes_per_token * 8 / (self.nic_gbps * 1e3)

    @property
    def ratio(self) -> float:
        """Fetch time per token over prefill time per token."""
        return self.fetch_us_per_token / self.prefill_us_per_token


DEPLOYMENT = Deployment(
    model="Llama-3-8B, bf16 KV (32 layers x 8 KV heads x 128 dims)",
    # experiments.prefill_rate on one NVIDIA H100 80GB HBM3 (transformers 5.17, SDPA, batch 1,
    # random weights): 31.2-32.9 us per token for 1,024-8,192-token prompts
    # (docs/data/prefill_h100.json).
    gpu="H100 80GB HBM3, measured with experiments.prefill_rate",
    prefill_us_per_token=32.0,
    kv_bytes_per_token=131072,
    nic_gbps=400.0,
)


def emu_kv_bytes_per_token(shape: dict[str, Any] = EMU_SHAPE) -> int:
    """KV bytes per token of the emulation's model (bf16)."""
    return int(
        2 * shape["num_hidden_layers"] * shape["num_key_value_heads"] * shape["head_dim"] * 2
    )


def make_model(path: Path, shape: dict[str, Any] = EMU_SHAPE, seed: int = 0) -> Path:
    """Writes a Llama of ``shape`` with random weights (seeded) to ``path`` unless it is there.

    Returns:
        ``path``.
    """
    import torch
    import transformers

    config_file = path / "config.json"
    if config_file.exists() and (path / "model.safetensors").exists():
        have = json.loads(config_file.read_text())
        if all(have.get(k) == v for k, v in shape.items()):
            return path
    cfg = transformers.LlamaConfig(max_position_embeddings=8192, tie_word_embeddings=False, **shape)
    torch.manual_seed(seed)
    llama: Any = transformers.LlamaForCausalLM
    model = llama(cfg).to(torch.bfloat16)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    return path


def link_mbit(prefill_us_per_token: float, deployment: Deployment = DEPLOYMENT) -> float:
    """The link rate at which a token's KV takes ``deployment.ratio`` of its prefill time.

    Args:
        prefill_us_per_token: this machine's prefill time per token for the emulation's model.
        deployment: the deployment to match.

    Returns:
        Mbit/s.
    """
    fetch_us = deployment.ratio * prefill_us_per_token
    return emu_kv_bytes_per_token() * 8 / fetch_us


def tokens(rnd: random.Random, n: int) -> list[int]:
    """``n`` random tokens of the emulation's vocabulary."""
    return [rnd.randrange(EMU_SHAPE["vocab_size"]) for _ in range(n)]


@dataclass
class Plan:
    """What one sweep does.

    Attributes:
        ns: engine counts.
        modes: mode names, in the order each point runs them.
        repeats: runs of every point.
        prefix: shared prompt tokens (a multiple of the block size).
        suffix: each request's own tokens after the prefix.
        max_tokens: greedy output tokens per request.
        seed: the prompts' seed.
    """

    ns: Sequence[int] = (1, 2, 4, 8)
    modes: Sequence[str] = MODES
    repeats: int = 3
    prefix: int = 1024
    suffix: int = 16
    max_tokens: int = 8
    seed: int = 20261127


@dataclass
class TracePlan:
    """Requests from a Mooncake-format trace, replayed on the engines at their arrival times.

    Attributes:
        path: the trace (``data/traces/conversation_trace.jsonl``: timestamp in ms, hash_ids).
        requests: how many of its first requests.
        max_blocks: a request's blocks are cut to this many (CPU engines' prefill time).
        speed: arrival times divided by this.
        seed: the tokens' seed.
    """

    path: Path = REPO / "data" / "traces" / "conversation_trace.jsonl"
    requests: int = 30
    max_blocks: int = 24
    speed: float = 1.0
    seed: int = 7


TRACE_MODES = ("trace-pool", "trace-local")
"""With the connector (every request's new blocks published, earlier ones loaded through the
switch) and without (each engine's own prefix cache only); the pool mode runs first."""


def trace_requests(trace: TracePlan, suffix: int) -> list[tuple[float, list[int]]]:
    """``(arrival s, prompt tokens)`` of the trace's first requests.

    Each trace block (one ``hash_id``) becomes one vLLM block of 32 tokens drawn from a
    generator seeded by the hash id, so requests that share hash ids share token prefixes;
    each prompt ends with ``suffix`` tokens of its own.
    """
    out = []
    with trace.path.open() as f:
        for i, line in enumerate(f):
            if i >= trace.requests:
                break
            rec = json.loads(line)
            prompt: list[int] = []
            for h in rec["hash_ids"][: trace.max_blocks]:
                prompt += tokens(random.Random((trace.seed << 40) ^ int(h)), BLOCK_SIZE)
            prompt += tokens(random.Random((trace.seed << 40) ^ (1 << 39) ^ i), suffix)
            out.append((float(rec["timestamp"]) / 1e3 / trace.speed, prompt))
    return out


def mode_options(mode: str, i: int, group: int) -> dict[str, Any]:
    """The connector's request options of engine ``i`` in ``mode`` (``group``: its group)."""
    if mode in ("recompute", "local"):
        return {"load": False, "save": False}
    if mode == "pool":
        return {"save": False}
    if replicas(mode) > 1:  # engine i reads replica i mod k
        return {"save": False, "replica": i % replicas(mode), "replicas": replicas(mode)}
    return {"save": False, "group": group, "role": "leader" if i == 0 else "follower"}


def replicas(mode: str) -> int:
    """How many pool nodes hold the prefix in ``mode``: k in ``rk`` (Mooncake replicas), else 1.

    Raises:
        ValueError: a mode that is not one of ``MODES``.
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; modes: {', '.join(MODES)}")
    return int(mode[1:]) if mode.startswith("r") and mode[1:].isdigit() else 1
