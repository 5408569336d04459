"""Per-layer loads in a real vLLM engine: how long the forward waits, pipelined or not.

One CPU engine of vLLM's CPU build per mode (``pipeline_layers`` on, then off), each in its own
process with the kvcast connector and a random Llama. Per mode the engine first computes a
prefix and a suffix and publishes the blocks into its pool client; those chunks then go to a
pool node in a process of its own, whose replies reach the engine through a pacing relay in
that process (they leave at ``mbit``, as over a link of that rate), so the engine's process
runs only the engine and its loader. Then, ``repeats`` times, its own prefix cache is dropped
and the prefix comes back through the connector with a new suffix to compute. Per step (the
prefill that loads) the connector's ``last_step`` gives the forward's waits for its layers
(``forward_wait_s``, summed over the layers), the wait after the forward for the rest of the
load (``end_wait_s``) and the load itself (``load_s``); the time to first token is the
request's wall time (one output token). Pipelined, layer ``l`` computes the suffix while later
layers arrive, so the forward waits less than the load takes; whole, the first layer waits for
all of it.

Lines: ``bench vllm_layers mode=pipelined|whole ttft_ms=... forward_wait_ms=... end_wait_ms=...
load_ms=... compute_ms=...`` (medians over the repeats; ``compute_ms``: the first request's
time to first token, every token computed, a publish's copy included), plus a table. Absolute
times depend on the machine; compare the two modes of one run. Skipped, with a line saying so,
where vLLM is not installed.

Subcommands (run by ``run``):
    ``pool``: a pool node holding the chunks of a file, behind the pacing relay.
    ``engine``: one mode's engine (prints one JSON line per repeat).

Functions:
    relay: forward GETs to the pool and its replies back, paced.
    serve_pool: the ``pool`` subcommand.
    engine: one mode's measurements.
    run: both modes side by side (result lines).
    main: command line.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pickle
import select
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import bench_line
from experiments.output import text_table
from experiments.serving_engine import BLOCK_SIZE

__all__ = ["engine", "main", "relay", "run"]

SUITE = "vllm_layers"
SHAPE: dict[str, Any] = {
    "hidden_size": 1024,
    "intermediate_size": 2048,
    "num_hidden_layers": 8,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": 4096,
}
"""8 layers, 2 KV heads of 64: 4 KiB of bf16 KV per token, 128 KiB per 32-token block."""
MODES = {"pipelined": True, "whole": False}


def serve_pool(chunks: Path, port: int, mbit: float) -> None:
    """A pool node with the chunks pickled in ``chunks``, behind ``relay`` on ``port``.

    ``chunks`` holds a list of ``(tenant, key, bytes)``; prints ``ready``, runs until killed.
    """
    from kvcast.backend import InMemoryBackend
    from poolnode.server import PoolServer

    backend = InMemoryBackend()
    for tenant, key, data in pickle.loads(chunks.read_bytes()):
        backend.put(tenant, key, data)
    with PoolServer(backend, "127.0.0.1", 0) as server:
        relay(server.address, mbit, port)


def relay(pool: tuple[str, int], mbit: float, port: int) -> None:
    """Forwards datagrams to ``pool`` and its replies back to their sender, paced at ``mbit``.

    Listens on ``port``, prints ``ready``, then runs until killed. Each reply leaves once the
    link would have carried the replies before it (a token bucket without burst), so a chunk
    takes what it would over a link of that rate.
    """
    front = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    front.bind(("127.0.0.1", port))
    back = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    back.connect(pool)
    for s in (front, back):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        s.setblocking(False)
    print("ready", flush=True)
    peer: tuple[str, int] | None = None
    queue: deque[bytes] = deque()
    free_at = time.monotonic()
    bytes_per_s = mbit * 1e6 / 8
    while True:
        now = time.monotonic()
        while queue and peer is not None and free_at <= now:
            data = queue.popleft()
            front.sendto(data, peer)
            free_at = max(free_at, now) + len(data) / bytes_per_s
        wait = max(0.0, free_at - now) if queue else 0.05
        ready, _, _ = select.select([front, back], [], [], wait)
        if front in ready:
            while True:
                try:
                    data, peer = front.recvfrom(65536)
                except BlockingIOError:
                    break
                back.send(data)
        if back in ready:
            while True:
                try:
                    queue.append(back.recv(65536))
                except BlockingIOError:
                    break


_BACKEND: Any = None


def pool_backend(_extra: Any) -> Any:
    """The engine's pool client (``pool_backend`` names this factory): the process's pool."""
    return _BACKEND


def engine(mode: str, model: Path, mbit: float, prefix: int, suffix: int, repeats: int) -> None:
    """One mode's engine: computes and publishes, then loads the prefix ``repeats`` times.

    Prints one JSON line per repeat: ``ttft_s`` and the connector's ``last_step``.
    """
    global _BACKEND
    from experiments.serving_engine import build_engine, engine_env

    os.environ.update(engine_env(None))
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from hostagent.vllm_connector.worker import worker_sides
    from kvcast.backend import InMemoryBackend

    _BACKEND = InMemoryBackend()
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # the pool process's relay takes this port once the chunks exist
    extra = {
        "service": f"127.0.0.1:{port}",
        "pool_backend": f"{__name__}:pool_backend",
        "host": mode,
        "pipeline_layers": MODES[mode],
        "fetch": {"timeout_s": 0.2, "max_timeout_s": 0.5, "deadline_s": 20.0},
    }
    llm = build_engine(str(model), extra, max_model_len=4096)
    (worker,) = worker_sides()
    params = SamplingParams(max_tokens=1, temperature=0.0)
    head = [(7 * i + 3) % 4000 + 1 for i in range(prefix)]

    def step(r: int) -> float:
        tail = [(11 * i + 97 * r + 5) % 4000 + 1 for i in range(suffix)]
        llm.reset_prefix_cache()
        t0 = time.monotonic()
        llm.generate([TokensPrompt(prompt_token_ids=head + tail)], params, use_tqdm=False)
        ttft = time.monotonic() - t0
        worker.flush_saves(30.0)
        return ttft

    print(json.dumps({"compute_s": step(0)}))  # every token computed; the prefix published
    chunks = [(t, k, _BACKEND.get(t, k)) for t, k in worker.saved[: prefix // BLOCK_SIZE]]
    with tempfile.NamedTemporaryFile(suffix=".pickle") as f:
        f.write(pickle.dumps(chunks))
        f.flush()
        cmd = [sys.executable, "-m", "benchmarks.vllm_layers", "pool", "--chunks", f.name]
        proc = subprocess.Popen(
            [*cmd, "--port", str(port), "--mbit", str(mbit)], stdout=subprocess.PIPE, text=True
        )
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
            for r in range(1, repeats + 1):
                ttft = step(r)
                loaded = sum(rep.ok for rep in worker.last_reports)
                print(json.dumps({"ttft_s": ttft, **worker.last_step, "chunks": loaded}))
                sys.stdout.flush()
        finally:
            proc.kill()
            proc.wait()


def run(quick: bool = False) -> list[str]:
    """Both modes, one after the other on the same model, prompt and link (result lines)."""
    if importlib.util.find_spec("vllm") is None:
        print(f"# {SUITE}: skipped: vllm is not installed (scripts/setup.sh installs it)")
        return []
    from experiments.serving_plan import make_model

    prefix, suffix = (512, 256) if quick else (1024, 512)
    repeats = 3 if quick else 7
    mbit = 200.0
    lines: list[str] = []
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        model = make_model(Path(tmp) / "llama", SHAPE)
        for mode in MODES:
            cmd = [sys.executable, "-m", "benchmarks.vllm_layers", "engine", "--mode", mode]
            cmd += ["--model", str(model), "--mbit", str(mbit), "--prefix", str(prefix)]
            cmd += ["--suffix", str(suffix), "--repeats", str(repeats)]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            parsed = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
            steps = [p for p in parsed if "ttft_s" in p]
            row: dict[str, Any] = {"mode": mode, "compute_s": 1e3 * parsed[0]["compute_s"]}
            for key in ("ttft_s", "forward_wait_s", "end_wait_s", "load_s"):
                row[key] = 1e3 * statistics.median(s[key] for s in steps)
            line = bench_line(
                SUITE, mode=mode, prefix=prefix, suffix=suffix, mbit=mbit,
                ttft_ms=row["ttft_s"], forward_wait_ms=row["forward_wait_s"],
                end_wait_ms=row["end_wait_s"], load_ms=row["load_s"], compute_ms=row["compute_s"],
                chunks=int(statistics.median(s["chunks"] for s in steps)), repeats=len(steps),
            )  # fmt: skip
            print(line, flush=True)
            lines.append(line)
            rows.append(row)

    def ms(key: str) -> Callable[[dict[str, Any]], str]:
        return lambda r: f"{r[key]:.1f}"

    cols: list[tuple[str, Callable[[dict[str, Any]], str]]] = [("mode", lambda r: r["mode"])]
    cols += [("TTFT ms", ms("ttft_s")), ("forward waited ms", ms("forward_wait_s"))]
    cols += [("waited after ms", ms("end_wait_s")), ("load ms", ms("load_s"))]
    cols += [("all computed ms", ms("compute_s"))]
    title = f"{prefix}-token prefix loaded at {mbit:g} Mbit/s, {suffix}-token suffix computed"
    print(text_table(title, cols, rows, left={0}, notes=[f"medians of {repeats} steps"]))
    return lines


def main(argv: list[str] | None = None) -> None:
    """Command line: ``[--quick]``, or the ``pool`` and ``engine`` subcommands."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", nargs="?", choices=["pool", "engine"])
    parser.add_argument("--chunks", type=Path)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--mbit", type=float, default=200.0)
    parser.add_argument("--mode", choices=list(MODES), default="pipelined")
    parser.add_argument("--model", type=Path)
    parser.add_argument("--prefix", type=int, default=1024)
    parser.add_argument("--suffix", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    if args.what == "pool":
        serve_pool(args.chunks, args.port, args.mbit)
    elif args.what == "engine":
        engine(args.mode, args.model, args.mbit, args.prefix, args.suffix, args.repeats)
    else:
        run(args.quick)


if __name__ == "__main__":
    main()
