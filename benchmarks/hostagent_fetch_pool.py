"""The hostagent_fetch lines against a pool node on loopback: Mooncake, a prefix, the keyed MAC.

``path=mooncake``, ``path=multi_chunk`` and ``path=mac`` of :mod:`benchmarks.hostagent_fetch`
(the lines are described there). The pool node runs as its own process
(:func:`pool_node`, also used behind the emulated switch) or, for the MAC line, in this one.

Functions:
    pool_node: runs ``python -m poolnode ...`` for a block and yields its port and pid.
    measure_mooncake: Mooncake ``get_into`` vs KVP loopback fetch.
    measure_multi: a multi-chunk prefix, one chunk at a time vs several in flight.
    measure_mac: a fetch with the chunk's keyed MAC checked vs one without.

Constants:
    JUMBO_MTU, LOOPBACK_FRAGS_PER_GET: the loopback lines' MTU and fragments per GET.
"""

from __future__ import annotations

import contextlib
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

from benchmarks.udp_feed import KEY, SEED, TENANT  # the feed's chunk is the suite's
from emulation.targets import REPO
from kvcast import procs
from kvcast.synthetic import synthetic_chunk

# Loopback carries jumbo frames: the pool node and the client both use a 9000-byte MTU, and a
# GET asks for 256 fragments (the pool node's maximum, answered in eight 34-fragment DATAs).
JUMBO_MTU = 9000
LOOPBACK_FRAGS_PER_GET = 256


@contextlib.contextmanager
def pool_node(cmd: list[str]) -> Iterator[tuple[int, int]]:
    """Runs ``python -m poolnode ...`` (``cmd``) until the block ends.

    Yields:
        ``(UDP port, pid)``. ``ip netns exec`` execs its command, so the pid is the pool node's.
    """
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=REPO)  # fmt: skip
    try:
        assert proc.stdout is not None
        seen: list[str] = []
        for line in proc.stdout:
            seen.append(line.rstrip())
            match = re.search(r"poolnode listening .*port=(\d+)", line)
            if match:
                break
        else:
            raise RuntimeError("poolnode exited before listening: " + " | ".join(seen[-5:]))
        # Keep reading its output so a chatty pool node never blocks on a full pipe.
        threading.Thread(target=proc.stdout.read, daemon=True).start()
        yield int(match.group(1)), proc.pid
    finally:
        procs.stop(proc, 5.0)


@contextlib.contextmanager
def _stderr_to_file() -> Iterator[Any]:
    """Sends this process's file descriptor 2 to a temporary file for the block.

    Mooncake's C++ client logs every setup step to standard error, around Python's back.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as log:
        os.dup2(log.fileno(), 2)
        try:
            yield log
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def measure_mooncake(
    nbytes: int,
    rounds: int,
    warmup: int = 3,
    mtu: int = JUMBO_MTU,
    frags_per_get: int | None = LOOPBACK_FRAGS_PER_GET,
    gso: bool = True,
) -> dict[str, float]:
    """Mooncake ``get_into`` over TCP vs a KVP fetch from the same pool node, on loopback.

    Args:
        nbytes: chunk length.
        rounds: measured ``get_into`` / fetch pairs.
        warmup: pairs run first and not counted (the first reads set up connections).
        mtu: the pool node's and the client's MTU (loopback carries jumbo frames).
        frags_per_get: fragments per GET (None: one DATA's worth).
        gso: the pool node sends its DATAs as UDP GSO messages (``--gso``: loopback, like a
            NIC, cuts them into the same datagrams; Mooncake's TCP is segmented the same way).

    Returns:
        ``get_into_MBps``, ``kvp_MBps`` and medians.

    Raises:
        MooncakeUnavailableError: Mooncake is not installed.
        RuntimeError: a read or a fetch failed or returned wrong bytes.
    """
    import torch

    from hostagent.fetch import FetchClient
    from kvcast.mooncake import MooncakeBackend
    from poolnode.mooncake import MooncakeMaster

    data = synthetic_chunk(TENANT, KEY, nbytes, SEED)
    with MooncakeMaster() as master:
        pool = [
            sys.executable, "-m", "poolnode", "--master", master.address, "--segment-mib", "64",
            "--host", "127.0.0.1", "--port", "0", "--preload", f"{TENANT}:{KEY:#x}:{nbytes}:{SEED}",
            "--mtu", str(mtu), "--source-tenants", f"127.0.0.1={TENANT}",
            *(["--gso"] if gso else []),
        ]  # fmt: skip
        with pool_node(pool) as (port, _):
            with _stderr_to_file() as log:
                try:
                    reader = MooncakeBackend(master.address, global_segment_size=0,
                                             local_buffer_size=16 << 20)  # fmt: skip
                except Exception:
                    log.seek(0)
                    sys.stderr.write(log.read().decode(errors="replace")[-2000:])
                    raise
            dst = torch.zeros(nbytes, dtype=torch.uint8)
            view = dst.numpy().data
            mc_s: list[float] = []
            kvp_s: list[float] = []
            lone_s: list[float] = []
            lone_paths: set[str] = set()
            kwargs: dict[str, Any] = {
                "timeout_s": 0.05, "max_timeout_s": 0.5, "mtu": mtu,
                "frags_per_get": frags_per_get, "socket_buffer_bytes": 16 << 20,
            }  # fmt: skip
            try:
                with (
                    FetchClient(("127.0.0.1", port), **kwargs) as cl,
                    FetchClient(("127.0.0.1", port), direct=reader, window=1, **kwargs) as lone,
                ):
                    for i in range(-warmup, rounds):  # warm-up: handshakes, caches
                        dst.zero_()
                        t0 = time.perf_counter()
                        got = reader.get_into(TENANT, KEY, view)
                        t1 = time.perf_counter()
                        if got != nbytes or dst.numpy().tobytes() != data:
                            raise RuntimeError(f"Mooncake get_into returned {got} or wrong bytes")
                        dst.zero_()
                        report = cl.fetch(TENANT, KEY, dst, nbytes)
                        if not report.ok or dst.numpy().tobytes() != data:
                            raise RuntimeError(f"KVP loopback fetch failed: {report}")
                        dst.zero_()
                        # A lone miss: the agent sees the pool answer and reads the rest
                        # through Mooncake (one GET in flight, so the first answer is not
                        # already the whole chunk).
                        solo = lone.fetch(TENANT, KEY, dst, nbytes)
                        if not solo.ok or dst.numpy().tobytes() != data:
                            raise RuntimeError(f"lone-miss fetch failed: {solo}")
                        if i >= 0:
                            mc_s.append(t1 - t0)
                            kvp_s.append(report.duration_s)
                            lone_s.append(solo.duration_s)
                            lone_paths.add(solo.path)
            finally:
                reader.close()
    mc, kvp, solo_s = statistics.median(mc_s), statistics.median(kvp_s), statistics.median(lone_s)
    return {"get_into_MBps": nbytes / mc / 1e6, "kvp_MBps": nbytes / kvp / 1e6,
            "get_into_ms": mc * 1e3, "kvp_ms": kvp * 1e3, "lone_MBps": nbytes / solo_s / 1e6,
            "lone_direct": float(lone_paths == {"direct"})}  # fmt: skip


def measure_multi(
    nbytes: int,
    chunks: int,
    in_flight: int,
    rounds: int,
    warmup: int = 2,
    mtu: int = JUMBO_MTU,
    frags_per_get: int | None = LOOPBACK_FRAGS_PER_GET,
) -> dict[str, float]:
    """A prefix of ``chunks`` chunks from one pool node on loopback, one chunk vs several at once.

    ``fetch`` after ``fetch`` (one chunk at a time) and ``fetch_many`` with ``in_flight`` chunks
    in flight, alternated. The pool node runs in its own process with the in-memory backend (no
    Mooncake needed), as in the ``mooncake`` line otherwise (jumbo MTU, ``frags_per_get``
    fragments per GET).

    Args:
        nbytes: bytes per chunk.
        chunks: chunks per prefix.
        in_flight: ``max_chunks_in_flight`` of the windowed fetch.
        rounds: measured pairs.
        warmup: pairs run first and not counted.
        mtu: the pool node's and the client's MTU.
        frags_per_get: fragments per GET (None: one DATA's worth).

    Returns:
        ``serial_MBps``, ``windowed_MBps`` (medians over the rounds) and their ``ratio``.

    Raises:
        RuntimeError: a fetch failed or returned wrong bytes.
    """
    import torch

    from hostagent.fetch import FetchClient
    from kvcast.fetch import ChunkRequest

    keys = [KEY + 1 + i for i in range(chunks)]
    data = [synthetic_chunk(TENANT, k, nbytes, SEED) for k in keys]
    pool = [
        sys.executable, "-m", "poolnode", "--backend", "memory", "--host", "127.0.0.1",
        "--port", "0", "--mtu", str(mtu), "--cache-mib", "0",
        "--source-tenants", f"127.0.0.1={TENANT}",
        *(a for k in keys for a in ("--preload", f"{TENANT}:{k:#x}:{nbytes}:{SEED}")),
    ]  # fmt: skip
    dsts = [torch.zeros(nbytes, dtype=torch.uint8) for _ in keys]
    reqs = [ChunkRequest(TENANT, k, d, nbytes) for k, d in zip(keys, dsts, strict=True)]
    serial_s: list[float] = []
    windowed_s: list[float] = []

    def check(reports: list[Any], how: str) -> None:
        for r, d, want in zip(reports, dsts, data, strict=True):
            if not r.ok or d.numpy().tobytes() != want:
                raise RuntimeError(f"{how} fetch failed: {r}")
        for d in dsts:
            d.zero_()

    with pool_node(pool) as (port, _), FetchClient(
        ("127.0.0.1", port), timeout_s=0.05, max_timeout_s=0.5, mtu=mtu,
        frags_per_get=frags_per_get, socket_buffer_bytes=16 << 20,
        max_chunks_in_flight=in_flight,
    ) as cl:  # fmt: skip
        for i in range(-warmup, rounds):
            t0 = time.perf_counter()
            one = [cl.fetch(TENANT, r.key, r.dst, nbytes) for r in reqs]
            t1 = time.perf_counter()
            check(one, "serial")
            t2 = time.perf_counter()
            many = cl.fetch_many(reqs)
            t3 = time.perf_counter()
            check(many, "windowed")
            if i >= 0:
                serial_s.append(t1 - t0)
                windowed_s.append(t3 - t2)
    total = nbytes * chunks
    serial, windowed = statistics.median(serial_s), statistics.median(windowed_s)
    return {"serial_MBps": total / serial / 1e6, "windowed_MBps": total / windowed / 1e6,
            "ratio": serial / windowed}  # fmt: skip


def measure_mac(nbytes: int, rounds: int) -> dict[str, float]:
    """What the keyed chunk MAC costs a fetch: with and without the tenant key, alternated.

    Both fetch the same chunk from one pool-node server on loopback (in this process); the one
    with the key also fetches the MAC object (32 bytes per 16 KiB segment) and computes BLAKE2b
    over the chunk.

    Returns:
        ``plain_MBps``, ``mac_MBps`` (medians) and ``blake2b_us``, the MAC computation alone.

    Raises:
        RuntimeError: a fetch failed or returned wrong bytes.
    """
    import torch

    from hostagent.fetch import FetchClient
    from kvcast.backend import InMemoryBackend
    from kvcast.integrity import chunk_mac, mac_key_of
    from poolnode.server import PoolServer

    secret = bytes(range(32))
    data = synthetic_chunk(TENANT, KEY, nbytes, SEED)
    backend = InMemoryBackend()
    backend.put(TENANT, KEY, data)
    backend.put(TENANT, mac_key_of(KEY), chunk_mac(secret, TENANT, KEY, data))
    dst = torch.zeros(nbytes, dtype=torch.uint8)
    plain_s: list[float] = []
    mac_s: list[float] = []
    with (
        PoolServer(backend, "127.0.0.1", 0) as server,
        FetchClient(server.address, timeout_s=0.05, max_timeout_s=0.5) as plain,
        FetchClient(
            server.address, timeout_s=0.05, max_timeout_s=0.5, mac_keys={TENANT: secret}
        ) as keyed,
    ):
        for i in range(-2, rounds):
            for client, times in ((plain, plain_s), (keyed, mac_s)):
                dst.zero_()
                report = client.fetch(TENANT, KEY, dst)
                if not report.ok or dst.numpy().tobytes() != data:
                    raise RuntimeError(f"fetch for the MAC benchmark failed: {report}")
                if i >= 0:
                    times.append(report.duration_s)
    t0 = time.perf_counter()
    for _ in range(rounds):
        chunk_mac(secret, TENANT, KEY, data)
    mac_us = (time.perf_counter() - t0) / rounds * 1e6
    return {
        "plain_MBps": nbytes / statistics.median(plain_s) / 1e6,
        "mac_MBps": nbytes / statistics.median(mac_s) / 1e6,
        "blake2b_us": mac_us,
    }


__all__ = [
    "JUMBO_MTU",
    "LOOPBACK_FRAGS_PER_GET",
    "measure_mac",
    "measure_mooncake",
    "measure_multi",
    "pool_node",
]
