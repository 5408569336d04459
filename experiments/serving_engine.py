"""One real vLLM engine with the kvcast connector, driven by JSON lines (``experiments.serving``).

The serving experiment runs one of these per GPU host (a Mininet host): a vLLM engine (the CPU
build's model runner, paged KV cache, scheduler and sampler, in one process:
``VLLM_ENABLE_V1_MULTIPROCESSING=0`` and the ``uni`` executor) whose KV connector is
``hostagent.vllm_connector.KvcastConnector``. It prints ``{"ready": ...}`` once the engine is up,
then answers one JSON line per command read from standard input:

``{"cmd": "run", "prompt": [ids], "kvcast": {...}, "max_tokens": n, "start_at": t}``
    waits until wall-clock ``t``, submits the request (``kvcast`` goes to the connector as the
    request's ``kv_transfer_params``, ``hostagent.vllm_connector.config.LoadOptions``), steps the
    engine until it ends and answers the time to first token (from submission to the first output
    token), the greedy output tokens and the first token's log-probability, the prompt tokens
    the engine found cached (its own prefix cache plus what the connector loaded), and what the
    connector loaded for it (``worker_stats`` before and after).
``{"cmd": "reset"}``
    drops the engine's own prefix cache (every block it holds becomes a miss again) and
    anything waiting on the connector's socket (replicas of an earlier point).
``{"cmd": "read", "keys": [[tenant, key], ...], "path": p}``
    reads chunks from the DRAM pool through the connector's own pool client and writes them,
    concatenated, to ``p`` (the experiment loads them into switch SRAM, or corrupts one).
``{"cmd": "corrupt", "tenant": t, "key": k, "path": p}``
    replaces a chunk in the pool with the bytes in ``p`` (a pool whose copy went bad).
``{"cmd": "served"}``
    answers the ``run`` replies of the completions requests served over HTTP since the last
    ``served`` (``{"runs": [...]}``).
``{"cmd": "quit"}``
    shuts the engine down.

With ``--http PORT`` the engine also serves ``POST /v1/completions`` on that port, as an
OpenAI-compatible server would for what the controller's push sends
(``controlplane.pusher.completion_body``: token ids as the prompt, ``max_tokens``,
``kv_transfer_params``): each request becomes a ``run`` (no ``start_at``), in turn with the
commands from standard input; the answer is a completion with the run's reply under
``"kvcast"``.

Run: ``python -m experiments.serving_engine --model DIR --connector JSON [--core C] [--http P]``.

Classes:
    EngineError: an engine process failed or answered with an error.
    Engines: the experiment's side of these JSON lines: one engine process per GPU host.

Functions:
    engine_env: the environment an engine process needs.
    build_engine: the vLLM engine.
    serve: the command loop.
    main: command line.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import queue
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any, Literal

from kvcast import procs

BLOCK_SIZE = 32
"""Tokens per KV block: vLLM's CPU attention takes multiples of 32; one block is one chunk."""
KV_CACHE_GIB = 1
REPO = Path(__file__).resolve().parents[1]
ENGINE_CMD = [sys.executable, "-m", "experiments.serving_engine"]


def engine_env(core: int | None) -> dict[str, str]:
    """The environment variables an engine process runs with.

    One OpenMP thread that sleeps when idle: the engine's model runs in-process (the ``uni``
    executor), where vLLM's CPU thread binding (``VLLM_CPU_OMP_THREADS_BIND``, applied when it
    spawns worker processes) does not apply, and torch's default of one spinning OpenMP thread
    per core made N engines on a few cores spend their time spinning. ``main`` pins the process
    to ``core`` itself.

    Args:
        core: the CPU core the engine runs on; None: any.

    Returns:
        Variables to add to the process's environment.
    """
    env = {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_KVCACHE_SPACE": str(KV_CACHE_GIB),
        # Every engine must hash blocks alike (vLLM seeds its first block hash from it).
        "PYTHONHASHSEED": "0",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",
        "OMP_WAIT_POLICY": "PASSIVE",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind" if core is None else str(core),
    }
    return env


def build_engine(
    model: str,
    connector: dict[str, Any] | None,
    max_model_len: int,
    dtype: Literal["bfloat16", "float32"] = "bfloat16",
) -> Any:
    """A vLLM ``LLM`` on ``model`` (token ids in, token ids out) with the kvcast connector.

    Args:
        model: a model directory (``config.json`` and weights; no tokenizer needed).
        connector: ``kv_connector_extra_config``
            (``hostagent.vllm_connector.config.ConnectorConfig``); None: no connector.
        max_model_len: longest prompt plus output.
        dtype: the model's (and KV cache's) dtype.

    Returns:
        The ``vllm.LLM``.
    """
    from vllm import LLM

    kwargs: dict[str, Any] = {}
    if connector is not None:
        kwargs["kv_transfer_config"] = {
            "kv_connector": "KvcastConnector",
            "kv_connector_module_path": "hostagent.vllm_connector",
            "kv_role": "kv_both",
            "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": connector,
        }
    return LLM(
        model=model,
        skip_tokenizer_init=True,
        dtype=dtype,
        block_size=BLOCK_SIZE,
        enable_prefix_caching=True,
        max_model_len=max_model_len,
        max_num_batched_tokens=max_model_len,
        enforce_eager=True,
        distributed_executor_backend="uni",
        seed=0,
        **kwargs,
    )


def _connector_worker() -> Any:
    """The process's kvcast worker side (the engine runs in-process)."""
    from hostagent.vllm_connector.worker import worker_sides

    workers = worker_sides()
    return workers[0] if workers else None


def _run(llm: Any, cmd: dict[str, Any], seq: int) -> dict[str, Any]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from hostagent.vllm_connector.worker import worker_stats

    extra = {"kv_transfer_params": {"kvcast": cmd["kvcast"]}} if cmd.get("kvcast") else None
    params = SamplingParams(
        max_tokens=int(cmd.get("max_tokens", 8)), temperature=0.0, logprobs=0, extra_args=extra
    )
    prompt = [int(t) for t in cmd["prompt"]]
    before = worker_stats()
    worker = _connector_worker()
    saved_before = len(worker.saved) if worker is not None else 0
    wait = float(cmd.get("start_at", 0.0)) - time.time()
    if wait > 0:
        time.sleep(wait)
    engine = llm.llm_engine
    t0 = time.perf_counter()
    started = time.time()
    req_id = f"r{seq}"
    engine.add_request(req_id, TokensPrompt(prompt_token_ids=prompt), params)
    ttft = None
    final = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.request_id != req_id:
                continue
            if ttft is None and out.outputs and out.outputs[0].token_ids:
                ttft = time.perf_counter() - t0
            if out.finished:
                final = out
    e2e = time.perf_counter() - t0
    if worker is not None:  # the request's publishes (off its steps) land before the reply
        worker.flush_saves(60.0)
    if final is None or ttft is None:
        raise RuntimeError(f"request {req_id} ended without output")
    after = worker_stats()
    completion = final.outputs[0]
    first_lp = None
    if completion.logprobs:
        first = completion.logprobs[0]
        first_lp = float(first[completion.token_ids[0]].logprob)
    cached = int(final.num_cached_tokens or 0)
    loaded = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    # vLLM counts the tokens it found cached when it first scheduled the request (its own hits
    # plus what the connector matched); blocks whose load failed were computed after all.
    failed_tokens = int(loaded.get("blocks_failed", 0)) * BLOCK_SIZE
    return {
        "ttft_s": ttft,
        "e2e_s": e2e,
        "started": started,
        "tokens": list(completion.token_ids),
        "first_logprob": first_lp,
        "prompt_tokens": len(prompt),
        "cached_tokens": cached,
        "computed_tokens": len(prompt) - cached + failed_tokens,
        "loaded_tokens": int(loaded.get("chunks_loaded", 0)) * BLOCK_SIZE,
        "connector": loaded,
        # (tenant, key) of the prompt blocks this request handed the pool, in order.
        "saved": [list(k) for k in worker.saved[saved_before:]] if worker is not None else [],
    }


def _reset(llm: Any) -> dict[str, Any]:
    ok = bool(llm.reset_prefix_cache())
    worker = _connector_worker()
    dropped = 0
    if worker is not None and worker._client is not None:
        dropped = worker._client.discard_pending()
    return {"reset": ok, "dropped": dropped}


def _required_worker() -> Any:
    worker = _connector_worker()
    if worker is None:
        raise RuntimeError("no kvcast connector in this engine")
    return worker


def _read(cmd: dict[str, Any]) -> dict[str, Any]:
    worker = _required_worker()
    sizes = []
    with open(cmd["path"], "wb") as f:
        for tenant, key in cmd["keys"]:
            data = worker.backend.get(int(tenant), int(key))
            if data is None:
                raise RuntimeError(f"chunk {int(key):#x} of tenant {tenant} is not in the pool")
            f.write(data)
            sizes.append(len(data))
    return {"sizes": sizes}


def _corrupt(cmd: dict[str, Any]) -> dict[str, Any]:
    worker = _required_worker()
    tenant, key = int(cmd["tenant"]), int(cmd["key"])
    data = Path(cmd["path"]).read_bytes()
    worker.backend.delete(tenant, key)
    worker.backend.put(tenant, key, data)
    return {"corrupted": f"{key:#x}", "bytes": len(data)}


_Work = tuple[dict[str, Any], "concurrent.futures.Future[dict[str, Any]] | None"]


def _completions_server(port: int, work: queue.Queue[_Work | None]) -> ThreadingHTTPServer:
    """``POST /v1/completions`` on ``port``: each request a ``run`` queued for the engine."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            status = 404
            doc: dict[str, Any] = {"error": f"no route {self.path}"}
            if self.path == "/v1/completions":
                try:
                    body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                    cmd = {"cmd": "run", "prompt": [int(t) for t in body["prompt"]],
                           "max_tokens": int(body.get("max_tokens", 16))}  # fmt: skip
                    kvcast = (body.get("kv_transfer_params") or {}).get("kvcast")
                    if kvcast:
                        cmd["kvcast"] = kvcast
                except (KeyError, TypeError, ValueError) as exc:
                    status, doc = 400, {"error": f"bad request: {exc}"}
                else:
                    done: concurrent.futures.Future[dict[str, Any]] = concurrent.futures.Future()
                    work.put((cmd, done))
                    reply = done.result()
                    status = 500 if "error" in reply else 200
                    doc = {"object": "text_completion", "kvcast": reply,
                           "choices": [{"index": 0, "text": "",
                                        "token_ids": reply.get("tokens", [])}]}  # fmt: skip
            data = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *_args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("0.0.0.0", port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="completions", daemon=True).start()
    return server


def serve(llm: Any, inp: IO[str], out: IO[str], http_port: int | None = None) -> None:
    """Answers commands from ``inp`` (one JSON object a line) on ``out`` until ``quit``/EOF.

    With ``http_port``, completions requests on that port are run in turn with them.
    """
    work: queue.Queue[_Work | None] = queue.Queue()

    def read_lines() -> None:
        for line in inp:
            if line.strip():
                work.put((json.loads(line), None))
        work.put(None)

    threading.Thread(target=read_lines, name="stdin", daemon=True).start()
    server = _completions_server(http_port, work) if http_port is not None else None
    served: list[dict[str, Any]] = []
    seq = 0
    try:
        while (item := work.get()) is not None:
            cmd, done = item
            op = cmd.get("cmd")
            try:
                if op == "quit":
                    break
                if op == "run":
                    seq += 1
                    reply = _run(llm, cmd, seq)
                elif op == "reset":
                    reply = _reset(llm)
                elif op == "read":
                    reply = _read(cmd)
                elif op == "corrupt":
                    reply = _corrupt(cmd)
                elif op == "served":
                    reply, served = {"runs": served}, []
                else:
                    reply = {"error": f"unknown command {op!r}"}
            except Exception as exc:  # noqa: BLE001 - the driver gets the error, the engine lives
                reply = {"error": f"{type(exc).__name__}: {exc}"}
            if done is not None:
                served.append(reply)
                done.set_result(reply)
                continue
            out.write(json.dumps({"cmd": op, **reply}) + "\n")
            out.flush()
    finally:
        if server is not None:
            server.shutdown()


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m experiments.serving_engine``."""
    p = argparse.ArgumentParser(prog="python -m experiments.serving_engine", description=__doc__)
    p.add_argument("--model", required=True, help="model directory")
    p.add_argument("--connector", help="kv_connector_extra_config as JSON (none: no connector)")
    p.add_argument("--core", type=int, help="CPU core for the engine's one OpenMP thread")
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--http", type=int, help="also serve POST /v1/completions on this port")
    args = p.parse_args(argv)
    os.environ.update(engine_env(args.core))
    if args.core is not None:
        os.sched_setaffinity(0, {args.core})
    t0 = time.monotonic()
    connector = json.loads(args.connector) if args.connector else None
    # vLLM logs to stdout: the replies keep stdout to themselves.
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    llm = build_engine(args.model, connector, args.max_model_len)
    replies.write(json.dumps({"ready": True, "startup_s": time.monotonic() - t0}) + "\n")
    replies.flush()
    try:
        serve(llm, sys.stdin, replies, args.http)
    finally:
        del llm
    return 0


class EngineError(RuntimeError):
    """An engine process failed or answered with an error."""


class Engines:
    """One ``experiments.serving_engine`` process per GPU host, driven by JSON lines.

    Args:
        popen: ``popen(host, cmd, **kwargs)`` starts a process on a host (in its namespace).
        names: the hosts.
        connectors: each host's ``kv_connector_extra_config`` (None: no connector).
        model: the model directory.
        log_dir: where each engine's stderr goes.
        max_model_len: the engines' longest prompt plus output.
        http_port: each engine also serves completions requests on this port (in its host's
            namespace; None: not).
    """

    def __init__(
        self,
        popen: Callable[..., subprocess.Popen[str]],
        names: Sequence[str],
        connectors: dict[str, dict[str, Any] | None],
        model: Path,
        log_dir: Path,
        max_model_len: int = 4096,
        http_port: int | None = None,
    ) -> None:
        self.names = list(names)
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self.logs: dict[str, Path] = {}
        self.startup_s: dict[str, float] = {}
        log_dir.mkdir(parents=True, exist_ok=True)
        for i, name in enumerate(self.names):
            log = log_dir / f"engine-{name}.log"
            self.logs[name] = log
            cmd = [
                *ENGINE_CMD, "--model", str(model), "--core", str(i % (os.cpu_count() or 1)),
                "--max-model-len", str(max_model_len),
            ]  # fmt: skip
            if connectors[name] is not None:
                cmd += ["--connector", json.dumps(connectors[name])]
            if http_port is not None:
                cmd += ["--http", str(http_port)]
            with log.open("w") as err:
                self.procs[name] = popen(
                    name, cmd, cwd=REPO, text=True, bufsize=1,
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                )  # fmt: skip

    def wait_ready(self, timeout_s: float) -> None:
        """Waits for every engine's ready line.

        Raises:
            EngineError: an engine exited or stayed silent (its log's tail in the message).
        """
        deadline = time.monotonic() + timeout_s
        for name in self.names:
            rec = self._read(name, deadline)
            if not rec.get("ready"):
                raise EngineError(f"engine {name} did not start: {rec}")
            self.startup_s[name] = float(rec["startup_s"])

    def _read(self, name: str, deadline: float) -> dict[str, Any]:
        proc = self.procs[name]
        assert proc.stdout is not None
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise EngineError(f"engine {name}: no answer in time; {self.tail(name)}")
            ready, _, _ = select.select([proc.stdout], [], [], left)
            if not ready:
                continue
            line = proc.stdout.readline()
            if not line:
                raise EngineError(f"engine {name} exited ({proc.poll()}); {self.tail(name)}")
            if line.startswith("{"):
                rec: dict[str, Any] = json.loads(line)
                return rec

    def tail(self, name: str, chars: int = 3000) -> str:
        """The end of an engine's log."""
        return f"log {self.logs[name]}:\n{self.logs[name].read_text(errors='replace')[-chars:]}"

    def ask(
        self, commands: dict[str, dict[str, Any]], timeout_s: float = 300.0
    ) -> dict[str, dict[str, Any]]:
        """Sends one command to each named engine and returns each one's answer.

        Raises:
            EngineError: an engine died, did not answer in time, or answered with an error.
        """
        for name, cmd in commands.items():
            self.send(name, cmd)
        deadline = time.monotonic() + timeout_s
        out = {name: self._read(name, deadline) for name in commands}
        for name, rec in out.items():
            if "error" in rec:
                raise EngineError(f"engine {name}: {rec['error']}")
        return out

    def send(self, name: str, cmd: dict[str, Any]) -> None:
        """Sends one command to an engine without waiting for its answer."""
        stdin = self.procs[name].stdin
        assert stdin is not None
        stdin.write(json.dumps(cmd) + "\n")
        stdin.flush()

    def wait_any(self, names: Sequence[str], timeout_s: float) -> list[tuple[str, dict[str, Any]]]:
        """The answers of those of ``names`` that answer first (at least one).

        Raises:
            EngineError: none answered in time, one died, or one answered with an error.
        """
        streams: dict[Any, str] = {self.procs[n].stdout: n for n in names}
        ready, _, _ = select.select(list(streams), [], [], timeout_s)
        if not ready:
            raise EngineError(f"no answer from {sorted(names)} in {timeout_s:.0f} s")
        out = []
        for stream in ready:
            name = streams[stream]
            rec = self._read(name, time.monotonic() + timeout_s)
            if "error" in rec:
                raise EngineError(f"engine {name}: {rec['error']}")
            out.append((name, rec))
        return out

    def close(self) -> None:
        """Asks every engine to quit, then ends those that do not."""
        for proc in self.procs.values():
            if proc.poll() is None and proc.stdin is not None:
                try:
                    proc.stdin.write('{"cmd": "quit"}\n')
                    proc.stdin.flush()
                except (BrokenPipeError, OSError):
                    pass
        deadline = time.monotonic() + 20
        for proc in self.procs.values():
            procs.stop(proc, max(0.1, deadline - time.monotonic()), signal_first=False)


if __name__ == "__main__":
    raise SystemExit(main())
