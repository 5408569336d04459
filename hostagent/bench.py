"""Loopback benchmark of the fetch client against the pool-node server.

Run as ``python -m hostagent.bench``. The pool server runs in its own process (so client and
server do not share one interpreter lock), in each of its two transports: the blocking socket
loop (``PoolServer``) and the asyncio endpoint (``serve_asyncio``); the client fetches one chunk
repeatedly into the same tensor. Each result is one line ``bench <name> key=value ...``;
absolute numbers depend on the machine, the ratios between lines of one run are what to compare.

Functions:
    run: run the configurations, print and return the result lines (for ``python -m benchmarks``).
    main: command-line entry point.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import random
import statistics
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection

import torch

from hostagent.fetch import FetchClient
from hostagent.layout import KVLayout
from kvcast import p4constants as c
from poolnode.backend import InMemoryBackend
from poolnode.server import PoolServer, serve_asyncio

TENANT, KEY = 1, 0xBE7C4


def _chunk(nbytes: int) -> bytes:
    return random.Random(7).randbytes(nbytes)


def _serve(transport: str, nbytes: int, mtu: int, conn: Connection) -> None:
    backend = InMemoryBackend()
    backend.put(TENANT, KEY, _chunk(nbytes))
    if transport == "socket":
        server = PoolServer(backend, "127.0.0.1", 0, mtu=mtu)
        server.bind()
        conn.send(server.address)
        server.start()
        conn.recv()
        server.stop()
        return

    async def run() -> None:
        udp, _ = await serve_asyncio(backend, "127.0.0.1", 0, mtu=mtu)
        conn.send(udp.get_extra_info("sockname")[:2])
        await asyncio.get_running_loop().run_in_executor(None, conn.recv)
        udp.close()

    asyncio.run(run())


def _bench(
    transport: str, layout: KVLayout, window: int, mtu: int, repeat: int
) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(transport, layout.chunk_bytes, mtu, child), daemon=True)
    proc.start()
    try:
        addr = parent.recv()
        dst = layout.alloc_chunk()
        times: list[float] = []
        retries = 0
        client = FetchClient(addr, window=window, mtu=mtu, timeout_s=0.05, max_timeout_s=0.5)
        with client:
            client.fetch_block(TENANT, KEY, layout, dst)  # warm the server's chunk cache
            for _ in range(repeat):
                report = client.fetch_block(TENANT, KEY, layout, dst)
                if not report.ok:
                    raise RuntimeError(f"benchmark fetch failed: {report}")
                times.append(report.duration_s)
                retries += report.retries
        if dst.numpy().tobytes() != _chunk(layout.chunk_bytes):
            raise RuntimeError("benchmark fetch returned wrong bytes")
        median = statistics.median(times)
        return {
            "chunk_bytes": layout.chunk_bytes,
            "window": window,
            "mtu": mtu,
            "median_ms": median * 1e3,
            "MBps": layout.chunk_bytes / median / 1e6,
            "frags_per_s": layout.frag_count / median,
            "retries": retries,
        }
    finally:
        parent.send("stop")
        proc.join(5)
        if proc.is_alive():
            proc.kill()
            proc.join()


def run(quick: bool = False, repeat: int = 20) -> list[str]:
    """Runs every configuration and prints one result line each.

    Args:
        quick: one small configuration with 3 fetches (a smoke run).
        repeat: fetches per configuration otherwise.

    Returns:
        The printed lines, ``bench fetch server=... frag_bytes=... median_ms=... MBps=...``.
    """
    small = KVLayout(24, 2, 64, torch.bfloat16, 16)  # 192 KiB chunk, DESIGN.md's small model
    llama = KVLayout(32, 8, 128, torch.bfloat16, 16)  # 2 MiB chunk, Llama-3-8B
    configs = [("socket", small, 32, 1500)]
    if not quick:
        configs += [
            ("asyncio", small, 32, 1500),
            ("socket", small, 8, 1500),
            ("socket", small, 128, 1500),
            ("socket", llama, 32, 1500),
            ("asyncio", llama, 32, 1500),
            ("socket", llama, 32, 9000),
        ]
    lines = []
    for transport, layout, window, mtu in configs:
        t0 = time.monotonic()
        result = _bench(transport, layout, window, mtu, 3 if quick else repeat)
        fields = " ".join(
            f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in result.items()
        )
        line = (
            f"bench fetch server={transport} frag_bytes={c.FRAG_BYTES} {fields} "
            f"wall_s={time.monotonic() - t0:.1f}"
        )
        print(line, flush=True)
        lines.append(line)
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the benchmark from the command line.

    Args:
        argv: ``--repeat N`` fetches per configuration, ``--quick`` for a smoke run.

    Returns:
        0.
    """
    parser = argparse.ArgumentParser(prog="python -m hostagent.bench")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="one small configuration")
    args = parser.parse_args(argv)
    run(args.quick, args.repeat)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
