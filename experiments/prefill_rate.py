"""Prefill rate of a real-size model shape, and what loading its prefix KV instead costs.

The serving experiment (``experiments.serving``) scales its emulated links so that the ratio of
fetch time to prefill time per token matches a real deployment. This measures the deployment's
side on a GPU where one is lent (or on the CPU, slowly): a model of a named shape with random
weights (the shape, not the weights, sets the time), prefilled at several prompt lengths, and a
cached-prefix step: the prefix's KV copied from pinned host memory into the GPU (what a fetch
ends with) and only the suffix computed. It prints one line per measurement and a JSON summary.

With ``--load-tokens N`` it also times the connector's own copy path on the device: the KV of N
tokens, in vLLM blocks of 16, copied chunk by chunk from pinned host memory into vLLM's paged
per-layer caches with ``hostagent.layout.scatter_to_paged`` (what ``KvcastConnector`` does with
every fetched chunk).

Run: ``python -m experiments.prefill_rate --shape llama-3-8b --out results/prefill``.

Functions:
    model_shape: the config of a named shape.
    measure: prefill and cached-prefix times for one shape.
    measure_scatter: the connector's chunk-to-paged-cache copy for one shape.
    main: command line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

SHAPES: dict[str, dict[str, Any]] = {
    # Llama-3-8B: 32 layers, 8 KV heads of 128 dims: 128 KiB of KV per token in bf16.
    "llama-3-8b": dict(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=128256,
    ),
    # Llama-3.2-1B: 16 layers, 8 KV heads of 64 dims: 32 KiB per token in bf16.
    "llama-3.2-1b": dict(
        hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=32, num_key_value_heads=8, head_dim=64, vocab_size=128256,
    ),
    # A tiny shape for checking the script on a CPU.
    "tiny": dict(
        hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1, head_dim=64, vocab_size=1024,
    ),
}  # fmt: skip


def model_shape(name: str) -> Any:
    """The transformers ``LlamaConfig`` of shape ``name`` (a key of ``SHAPES``)."""
    import transformers

    return transformers.LlamaConfig(max_position_embeddings=16384, **SHAPES[name])


def _timed(fn: Any, device: str, repeats: int) -> list[float]:
    import torch

    times = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return times


def measure(
    shape: str, lengths: list[int], suffix: int, repeats: int, device: str
) -> dict[str, Any]:
    """Prefill times at ``lengths`` and the cached-prefix step for shape ``shape``.

    Returns:
        ``{"shape", "device", "kv_bytes_per_token", "prefill": [...], "cached": [...]}``; each
        entry has the prompt length and the median seconds of ``repeats`` runs.
    """
    import torch
    import transformers

    cfg = model_shape(shape)
    dtype = torch.bfloat16
    torch.manual_seed(0)
    llama: Any = transformers.LlamaForCausalLM
    with torch.device(device):
        model = llama(cfg).to(dtype).eval()
    kv_per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 2
    gen = torch.Generator().manual_seed(1)
    out: dict[str, Any] = {
        "shape": shape,
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "params": sum(p.numel() for p in model.parameters()),
        "kv_bytes_per_token": kv_per_token,
        "prefill": [],
        "cached": [],
    }
    with torch.inference_mode():
        for n in lengths:
            ids = torch.randint(0, cfg.vocab_size, (1, n), generator=gen).to(device)
            _timed(lambda ids=ids: model(input_ids=ids, use_cache=False), device, 1)  # warm-up
            t = _timed(lambda ids=ids: model(input_ids=ids, use_cache=False), device, repeats)
            med = statistics.median(t)
            out["prefill"].append({"tokens": n, "s": med, "us_per_token": med / n * 1e6})
            print(f"prefill shape={shape} tokens={n} s={med:.4f} us_per_token={med / n * 1e6:.1f}",
                  flush=True)  # fmt: skip
            # The cached-prefix step: the first n - suffix tokens' KV from pinned host memory,
            # then the suffix computed on top of it.
            pre = n - suffix
            res = model(input_ids=ids[:, :pre], use_cache=True)
            host = [
                (layer.keys.to("cpu").pin_memory() if device == "cuda" else layer.keys.clone(),
                 layer.values.to("cpu").pin_memory() if device == "cuda" else layer.values.clone())
                for layer in res.past_key_values.layers
            ]  # fmt: skip
            del res

            def cached(ids: Any = ids, pre: int = pre, host: Any = host) -> None:
                cache = transformers.DynamicCache()
                for i, (k, v) in enumerate(host):
                    cache.update(
                        k.to(device, non_blocking=True), v.to(device, non_blocking=True), i
                    )
                model(input_ids=ids[:, pre:], past_key_values=cache, use_cache=True)

            _timed(cached, device, 1)
            t = _timed(cached, device, repeats)
            med = statistics.median(t)
            nbytes = pre * kv_per_token
            out["cached"].append(
                {"tokens": n, "prefix": pre, "suffix": suffix, "s": med, "kv_bytes": nbytes}
            )
            print(f"cached shape={shape} tokens={n} prefix={pre} suffix={suffix} s={med:.4f} "
                  f"kv_mib={nbytes / 2**20:.1f}", flush=True)  # fmt: skip
            del host
    return out


def measure_scatter(shape: str, tokens: int, device: str, repeats: int) -> dict[str, Any]:
    """Times ``scatter_to_paged`` of ``tokens`` tokens of KV into paged caches on ``device``.

    Returns:
        ``{"shape", "tokens", "blocks", "bytes", "s", "gbps"}`` (median of ``repeats``).
    """
    import torch

    from hostagent.layout import KVLayout, scatter_to_paged

    cfg = SHAPES[shape]
    block = 16
    layout = KVLayout(
        cfg["num_hidden_layers"], cfg["num_key_value_heads"], cfg["head_dim"], torch.bfloat16,
        block_size=block,
    )  # fmt: skip
    blocks = tokens // block
    caches = [
        torch.zeros(
            blocks,
            cfg["num_key_value_heads"],
            block,
            2 * cfg["head_dim"],
            dtype=torch.bfloat16,
            device=device,
        )  # fmt: skip
        for _ in range(cfg["num_hidden_layers"])
    ]
    pin = device == "cuda"
    chunks = [layout.alloc_chunk(pin=pin) for _ in range(4)]
    for ch in chunks:
        ch.copy_(torch.randint(0, 256, ch.shape, dtype=torch.uint8))

    def run() -> None:
        for b in range(blocks):
            scatter_to_paged(layout, chunks[b % 4], caches, b, "bhnc", non_blocking=pin)

    _timed(run, device, 1)
    med = statistics.median(_timed(run, device, repeats))
    nbytes = blocks * layout.chunk_bytes
    out = {"shape": shape, "tokens": tokens, "blocks": blocks, "bytes": nbytes, "s": med,
           "gbps": nbytes * 8 / med / 1e9}  # fmt: skip
    print(f"scatter shape={shape} tokens={tokens} blocks={blocks} mib={nbytes / 2**20:.0f} "
          f"s={med:.4f} gbps={out['gbps']:.1f}", flush=True)  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m experiments.prefill_rate``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", action="append", choices=sorted(SHAPES), help="repeatable")
    p.add_argument("--lengths", default="1024,2048,4096,8192", help="prompt lengths, tokens")
    p.add_argument("--suffix", type=int, default=64, help="tokens computed on a cached prefix")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda where present)")
    p.add_argument("--load-tokens", type=int, default=0, help="also time scatter_to_paged")
    p.add_argument("--out", type=Path, default=Path("results/prefill"))
    args = p.parse_args(argv)
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    lengths = [int(x) for x in args.lengths.split(",") if x]
    results = []
    for s in args.shape or ["llama-3-8b"]:
        if lengths:
            results.append(measure(s, lengths, args.suffix, args.repeats, device))
        if args.load_tokens:
            results.append(measure_scatter(s, args.load_tokens, device, args.repeats))
        if device == "cuda":
            torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "prefill.json").write_text(json.dumps(results, indent=1))
    print(f"wrote {args.out / 'prefill.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
