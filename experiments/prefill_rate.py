"""Prefill rate of a real-size model shape, and what loading its prefix KV instead costs.

The serving experiment (``experiments.serving``) scales its emulated links so that the ratio of
fetch time to prefill time per token matches a real deployment. This measures the deployment's
side on a GPU where one is lent (or on the CPU, slowly): a model of a named shape with random
weights (the shape, not the weights, sets the time), prefilled at several prompt lengths, and a
cached-prefix step: the prefix's KV copied from pinned host memory into the GPU (what a fetch
ends with) and only the suffix computed. It prints one line per measurement and a JSON summary.

With ``--pipeline`` it runs the cached-prefix step with the prefix's KV arriving over a network
of a given rate (``--rates``, Gb/s per host: a lone host's NIC share, or the pool NIC's rate over
N for N hosts reading by unicast at once): the bytes are released layer by layer at the times a
transfer of that rate would deliver them (layer-major order: every chunk's layer 0 first), each
layer copied into the GPU on a copy stream as it lands, and the suffix's forward run two ways:
``serial`` (the forward starts once the whole prefix is in, what a connector that waits for the
whole load on its first layer does) and ``layered`` (layer l's forward waits for layer l's KV
only, what ``wait_for_layer_load`` per layer allows). The last-token logits of both are compared
with the step's on KV already in place: a layer that ran before its KV landed reads zeros.

With ``--load-tokens N`` it also times the connector's copy path on the device: the KV of N
tokens, in vLLM blocks of 16, copied from pinned host memory into vLLM's paged per-layer caches,
chunk by chunk with ``hostagent.layout.scatter_to_paged`` and as one batch with
``scatter_many_to_paged``.

Run: ``python -m experiments.prefill_rate --shape llama-3-8b --out results/prefill``.

Functions:
    model_shape: the config of a named shape.
    measure: prefill and cached-prefix times for one shape.
    measure_scatter: the connector's chunk-to-paged-cache copy for one shape.
    measure_pipeline: the cached-prefix step with the KV arriving at a rate, serial and layered.
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


def _random_model(shape: str, device: str) -> tuple[Any, Any, int]:
    """A bf16 Llama of shape ``shape`` with random weights (seed 0) on ``device``.

    Returns:
        ``(model, config, KV bytes per token)``.
    """
    import torch
    import transformers

    cfg = model_shape(shape)
    torch.manual_seed(0)
    llama: Any = transformers.LlamaForCausalLM
    with torch.device(device):
        model = llama(cfg).to(torch.bfloat16).eval()
    kv_per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 2
    return model, cfg, kv_per_token


def _host_kv(cache: Any, device: str) -> list[tuple[Any, Any]]:
    """A cache's per-layer keys and values in host memory (pinned where ``device`` is CUDA)."""
    pin = device == "cuda"
    return [
        (layer.keys.to("cpu").pin_memory() if pin else layer.keys.clone(),
         layer.values.to("cpu").pin_memory() if pin else layer.values.clone())
        for layer in cache.layers
    ]  # fmt: skip


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

    model, cfg, kv_per_token = _random_model(shape, device)
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
            host = _host_kv(res.past_key_values, device)
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
    """Times moving ``tokens`` tokens of KV into paged caches on ``device``, two ways.

    ``per_block``: ``scatter_to_paged`` per block (two copies per block and layer);
    ``batched``: ``scatter_many_to_paged`` for the whole batch (one staging copy per chunk, one
    indexed copy per layer); ``gated_chunk`` and ``gated_layer``: what the connector's per-layer
    gate does, ``scatter_many_to_paged`` per chunk, for the whole chunk or one layer at a time,
    synchronized after each call.

    Returns:
        ``{"shape", "tokens", "blocks", "bytes", "<way>_s", "<way>_gbps" for each way, "s" and
        "gbps" (per block), "equal"}`` (medians of ``repeats``; ``equal``: every way left the
        same bytes).
    """
    import torch

    from hostagent.layout import KVLayout, scatter_many_to_paged, scatter_to_paged

    cfg = SHAPES[shape]
    block = 16
    layout = KVLayout(
        cfg["num_hidden_layers"], cfg["num_key_value_heads"], cfg["head_dim"], torch.bfloat16,
        block_size=block,
    )  # fmt: skip
    blocks = tokens // block

    def paged() -> list[Any]:
        shape = (blocks, cfg["num_key_value_heads"], block, 2 * cfg["head_dim"])
        return [torch.zeros(shape, dtype=torch.bfloat16, device=device)
                for _ in range(cfg["num_hidden_layers"])]  # fmt: skip

    caches, batched = paged(), paged()
    pin = device == "cuda"
    chunks = [layout.alloc_chunk(pin=pin) for _ in range(4)]
    for ch in chunks:
        ch.copy_(torch.randint(0, 256, ch.shape, dtype=torch.uint8))

    def run() -> None:
        for b in range(blocks):
            scatter_to_paged(layout, chunks[b % 4], caches, b, "bhnc", non_blocking=pin)

    batch = [chunks[b % 4] for b in range(blocks)]
    targets = [(b, b) for b in range(blocks)]

    def run_batched() -> None:
        scatter_many_to_paged(layout, batch, batched, targets, "bhnc", non_blocking=pin)

    gated = paged()
    n_layers = cfg["num_hidden_layers"]

    def run_gated(step: int) -> None:
        # The connector's per-layer gate: each chunk's verified layers, ``step`` at a time, one
        # call each, synchronized before the gate may release them.
        for b in range(blocks):
            for lo in range(0, n_layers, step):
                scatter_many_to_paged(
                    layout, [chunks[b % 4]], gated, [(0, b)], "bhnc",
                    layers=range(lo, min(lo + step, n_layers)), non_blocking=pin,
                )  # fmt: skip
                if pin:
                    torch.cuda.synchronize()

    nbytes = blocks * layout.chunk_bytes
    out: dict[str, Any] = {"shape": shape, "tokens": tokens, "blocks": blocks, "bytes": nbytes}
    for name, fn in (("per_block", run), ("batched", run_batched),
                     ("gated_chunk", lambda: run_gated(n_layers)),
                     ("gated_layer", lambda: run_gated(1))):  # fmt: skip
        _timed(fn, device, 1)
        med = statistics.median(_timed(fn, device, repeats))
        out[f"{name}_s"], out[f"{name}_gbps"] = med, nbytes * 8 / med / 1e9

    def same(x: list[Any]) -> bool:
        return all(torch.equal(a.view(torch.int16), b.view(torch.int16))
                   for a, b in zip(caches, x, strict=True))  # fmt: skip

    out["equal"] = same(batched) and same(gated)
    out["s"], out["gbps"] = out["per_block_s"], out["per_block_gbps"]
    print(f"scatter shape={shape} tokens={tokens} blocks={blocks} mib={nbytes / 2**20:.0f} "
          + " ".join(f"{k}={v:.4g}" for k, v in out.items() if k.endswith(("_s", "_gbps")))
          + f" equal={out['equal']}", flush=True)  # fmt: skip
    return out


class _Arrival:
    """Releases a prefix's per-layer KV into device buffers at the times a link would deliver it.

    A thread sleeps until layer l's last byte would have arrived (``start + (l + 1) *
    fetch_s / layers``), then copies the layer's keys and values into their device buffers (on its
    own CUDA stream where the device has one) and marks the layer ready. ``wait(l)`` blocks the
    caller until layer l is ready and makes the caller's stream wait for the copy.
    """

    def __init__(self, host: list[tuple[Any, Any]], dev: list[tuple[Any, Any]], device: str):
        import threading

        import torch

        self._host, self._dev, self._device = host, dev, device
        self._ready = [threading.Event() for _ in host]
        self._events: list[Any] = [None] * len(host)
        self._stream = torch.cuda.Stream() if device == "cuda" else None  # type: ignore[no-untyped-call]
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def start(self, t0: float, fetch_s: float) -> None:
        """Starts releasing layers as a transfer of ``fetch_s`` seconds that began at ``t0``."""
        import threading

        self._thread = threading.Thread(target=self._run, args=(t0, fetch_s), daemon=True)
        self._thread.start()

    def _run(self, t0: float, fetch_s: float) -> None:
        import torch

        try:
            with torch.inference_mode():
                self._release(t0, fetch_s)
        except BaseException as e:  # the forward waiting on a layer must not hang
            self._error = e
            for ev in self._ready:
                ev.set()
            raise

    def _release(self, t0: float, fetch_s: float) -> None:
        import torch

        n = len(self._host)
        for i, ((hk, hv), (dk, dv)) in enumerate(zip(self._host, self._dev, strict=True)):
            delay = t0 + (i + 1) * fetch_s / n - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            if self._stream is not None:
                with torch.cuda.stream(self._stream):
                    dk.copy_(hk, non_blocking=True)
                    dv.copy_(hv, non_blocking=True)
                    ev = torch.cuda.Event()  # type: ignore[no-untyped-call]
                    ev.record(self._stream)
                self._events[i] = ev
            else:
                dk.copy_(hk)
                dv.copy_(hv)
            self._ready[i].set()

    def wait(self, layer: int) -> None:
        """Blocks until ``layer`` has landed; on CUDA the current stream waits for its copy."""
        import torch

        self._ready[layer].wait()
        if self._error is not None:
            raise RuntimeError(f"layer {layer} never landed") from self._error
        if self._events[layer] is not None:
            torch.cuda.current_stream().wait_event(self._events[layer])

    def wait_all(self) -> None:
        """Blocks until every layer has landed."""
        for layer in range(len(self._ready)):
            self.wait(layer)

    def join(self) -> None:
        """Waits for the release thread to end."""
        if self._thread is not None:
            self._thread.join()


def measure_pipeline(
    shape: str, lengths: list[int], suffix: int, rates_gbps: list[float], repeats: int,
    device: str,
) -> dict[str, Any]:  # fmt: skip
    """The cached-prefix step with the prefix's KV arriving at each rate, serial and layered.

    Returns:
        ``{"shape", "device", "kv_bytes_per_token", "points": [...]}``; a point has the prompt
        length, the rate, the transfer time, ``serial_s`` and ``layered_s`` (medians of
        ``repeats``, from the transfer's start to the last-token logits), ``compute_s`` (the step
        with the KV already in place), ``equal`` (both modes' last-token logits equal that
        step's) and ``max_diff`` (their largest difference).
    """
    import torch
    import transformers

    model, cfg, kv_per_token = _random_model(shape, device)
    layers = model.model.layers
    gen = torch.Generator().manual_seed(2)
    out: dict[str, Any] = {
        "shape": shape,
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "kv_bytes_per_token": kv_per_token,
        "points": [],
    }

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    with torch.inference_mode():
        for n in lengths:
            pre = n - suffix
            ids = torch.randint(0, cfg.vocab_size, (1, n), generator=gen).to(device)
            res = model(input_ids=ids[:, :pre], use_cache=True)
            host = _host_kv(res.past_key_values, device)
            del res

            def prepared(dev: list[Any]) -> tuple[Any, list[tuple[Any, Any]]]:
                """A cache holding ``dev``'s KV, and its own tensors (``update`` copies)."""
                cache: Any = transformers.DynamicCache()
                for i, (k, v) in enumerate(dev):
                    cache.update(k, v, i)
                return cache, [(lay.keys, lay.values) for lay in cache.layers]

            def step(
                cache: Any, arrival: _Arrival | None, layered: bool, ids: Any = ids, pre: int = pre
            ) -> Any:
                hooks = []
                if arrival is not None and layered:
                    hooks = [
                        mod.register_forward_pre_hook(
                            lambda _m, _a, i=i: arrival.wait(i)  # type: ignore[misc]
                        )
                        for i, mod in enumerate(layers)
                    ]
                elif arrival is not None:
                    hooks = [layers[0].register_forward_pre_hook(
                        lambda _m, _a: arrival.wait_all()  # type: ignore[misc]
                    )]  # fmt: skip
                try:
                    return model(input_ids=ids[:, pre:], past_key_values=cache, use_cache=True)
                finally:
                    for h in hooks:
                        h.remove()

            full = [(k.to(device), v.to(device)) for k, v in host]
            compute = []
            for r in range(repeats + 1):
                cache, _ = prepared(full)
                sync()
                t0 = time.perf_counter()
                ref = step(cache, None, False).logits[0, -1].float().cpu()
                sync()
                if r:
                    compute.append(time.perf_counter() - t0)
            empty = [(torch.zeros_like(k), torch.zeros_like(v)) for k, v in full]
            del full, cache
            for rate in rates_gbps:
                fetch_s = pre * kv_per_token * 8 / (rate * 1e9)
                point: dict[str, Any] = {
                    "tokens": n, "prefix": pre, "suffix": suffix, "rate_gbps": rate,
                    "kv_bytes": pre * kv_per_token, "fetch_s": fetch_s,
                    "compute_s": statistics.median(compute),
                }  # fmt: skip
                logits: dict[str, Any] = {}
                for mode in ("serial", "layered"):
                    times = []
                    for r in range(repeats + 1):
                        cache, land = prepared(empty)
                        arrival = _Arrival(host, land, device)
                        sync()
                        t0 = time.perf_counter()
                        arrival.start(t0, fetch_s)
                        res = step(cache, arrival, mode == "layered")
                        sync()
                        dt = time.perf_counter() - t0
                        arrival.join()
                        if r:
                            times.append(dt)
                    logits[mode] = res.logits[0, -1].float().cpu()
                    del cache, land, res
                    point[f"{mode}_s"] = statistics.median(times)
                point["max_diff"] = max(float((x - ref).abs().max()) for x in logits.values())
                point["equal"] = all(bool(torch.equal(x, ref)) for x in logits.values())
                out["points"].append(point)
                print(f"pipeline shape={shape} tokens={n} rate_gbps={rate:g} "
                      f"fetch_ms={fetch_s * 1e3:.1f} compute_ms={point['compute_s'] * 1e3:.1f} "
                      f"serial_ms={point['serial_s'] * 1e3:.1f} "
                      f"layered_ms={point['layered_s'] * 1e3:.1f} equal={point['equal']} "
                      f"max_diff={point['max_diff']:.3g}",
                      flush=True)  # fmt: skip
            del host, empty
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
    p.add_argument("--pipeline", action="store_true", help="also the layered cached step")
    p.add_argument("--rates", default="400,50,12.5", help="--pipeline's link rates, Gb/s")
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
        if args.pipeline:
            rates = [float(x) for x in args.rates.split(",") if x]
            results.append(measure_pipeline(s, lengths, args.suffix, rates, args.repeats, device))
        if device == "cuda":
            torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "prefill.json").write_text(json.dumps(results, indent=1))
    print(f"wrote {args.out / 'prefill.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
