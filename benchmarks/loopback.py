"""Host-side fetch benchmarks: the loopback pool server, and a probe run inside an emulated host.

Two measurements live here, both of the fetch client writing chunks into a tensor. Neither is a
suite of its own: ``benchmarks.hostagent_fetch`` runs the loopback lines first and starts the
probe in its emulated host (so ``BENCHMARKS`` is empty and ``python -m benchmarks`` does not run
them twice).

``python -m benchmarks.loopback [--quick] [--repeat N]``
    Loopback: the pool server runs in its own process (so client and server do not share one
    interpreter lock), in each of its two transports, the blocking socket loop (``PoolServer``)
    and the asyncio endpoint (``serve_asyncio``); the client fetches one chunk repeatedly into
    the same tensor. One line ``bench fetch server=... MBps=...`` per configuration.

``python -m benchmarks.loopback probe ...``
    Run inside a host's network namespace by ``benchmarks.hostagent_fetch`` (which builds the
    veth pairs, the namespaces and the switch): alternately fetches one chunk through the
    switch (``FetchClient``) and moves the same bytes as plain UDP datagrams of the same
    payload size over the same switch ports (``udp_transfer``: a sender socket opened in a
    second namespace, the receiver in this one, one closed loop with the fetch's window), and
    prints one JSON line with both series. Interleaving the two puts them under the same load,
    so their ratio means something on a shared machine even when the absolute rates do not.

Absolute numbers depend on the machine; the ratios between lines of one run are what to compare.

Classes:
    NetnsError: a network namespace cannot be entered.
    UdpTransfer: what one plain-UDP transfer did (duration, resends, duplicates).
    ProbeError: the probe's fetch failed or returned wrong bytes.

Functions:
    socket_in_netns: a UDP socket created inside another network namespace.
    udp_datagrams: a chunk cut into sequence-numbered datagrams.
    udp_transfer: closed-loop plain-UDP transfer of a chunk into a tensor (the baseline).
    run_probe: interleaved fetch / plain-UDP measurement (the ``probe`` subcommand).
    run: the loopback configurations (result lines).
    main: command-line entry point.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import multiprocessing as mp
import os
import random
import select
import socket
import statistics
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks import Benchmark
from hostagent.fetch import FetchClient
from hostagent.layout import KVLayout
from kvcast import p4constants as c
from kvcast.backend import InMemoryBackend
from kvcast.kvp import frag_count
from kvcast.synthetic import parse_key, synthetic_chunk
from poolnode.server import PoolServer, serve_asyncio

BENCHMARKS: list[Benchmark] = []  # run by the hostagent_fetch suite, not as a suite of its own
TENANT, KEY = 1, 0xBE7C4
NETNS_DIR = Path("/var/run/netns")
_CLONE_NEWNET = 0x40000000
_SEQ = struct.Struct("!I")


class NetnsError(OSError):
    """A network namespace cannot be entered (missing, or not permitted)."""


class ProbeError(RuntimeError):
    """A probe measurement failed: a fetch did not complete or the bytes are wrong."""


# -- plain UDP: the baseline ---------------------------------------------------------------------


def socket_in_netns(netns: str, bind: tuple[str, int]) -> socket.socket:
    """A non-blocking UDP socket created inside network namespace ``netns``.

    The calling thread enters ``netns`` (``setns``), creates and binds the socket and returns to
    its own namespace; the socket stays in the namespace it was created in. This lets one
    process send from one emulated host and receive on another, so a closed loop across the
    switch needs no second process.

    Args:
        netns: name of a namespace made by ``ip netns add`` (``/var/run/netns/NAME``).
        bind: local address inside that namespace.

    Returns:
        The bound socket.

    Raises:
        NetnsError: the namespace does not exist or ``setns`` is not permitted (needs root).
        OSError: the address cannot be bound there.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        target = os.open(NETNS_DIR / netns, os.O_RDONLY)
    except OSError as exc:
        raise NetnsError(f"network namespace {netns!r} not found: {exc}") from exc
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        if libc.setns(target, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise NetnsError(err, f"setns into {netns!r} failed: {os.strerror(err)} (root?)")
        try:
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
                sock.bind(bind)
                sock.setblocking(False)
            except OSError:
                sock.close()
                raise
        finally:
            if libc.setns(own, _CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise NetnsError(err, f"cannot return to this namespace: {os.strerror(err)}")
    finally:
        os.close(target)
        os.close(own)
    return sock


def udp_datagrams(data: bytes, payload: int) -> list[bytes]:
    """Cuts ``data`` into datagrams of a 4-byte sequence number and ``payload`` bytes each.

    Args:
        data: the chunk.
        payload: chunk bytes per datagram (the last one may carry fewer).

    Returns:
        One datagram per piece, in order.
    """
    return [
        _SEQ.pack(i) + data[i * payload : (i + 1) * payload]
        for i in range(-(-len(data) // payload))
    ]


@dataclass(slots=True)
class UdpTransfer:
    """What one plain-UDP transfer did.

    Attributes:
        duration_s: wall time from the first send to the last datagram written.
        resent: datagrams sent again after a silence (lost on the way).
        duplicates: datagrams that arrived for a piece already written.
    """

    duration_s: float
    resent: int
    duplicates: int


def udp_transfer(
    tx: socket.socket,
    rx: socket.socket,
    datagrams: Sequence[bytes],
    payload: int,
    dst: np.ndarray[Any, np.dtype[np.uint8]],
    *,
    window: int = 32,
    timeout_s: float = 0.02,
    deadline_s: float = 10.0,
) -> UdpTransfer:
    """Moves ``datagrams`` from ``tx`` to ``rx`` with ``window`` in flight, into ``dst``.

    The receiver does what the fetch client does with a DATA, less the KVP checks: one
    ``recv_into`` a reusable buffer, the sequence number read, the payload copied once to
    ``seq * payload`` of the tensor. A datagram lost on the way is sent again when nothing has
    arrived for ``timeout_s`` (every piece still missing from the start of the window on).

    Args:
        tx: sending socket (may live in another namespace).
        rx: receiving socket; ``datagrams`` must be addressed to it (``tx`` is connected).
        datagrams: ``udp_datagrams(data, payload)``.
        payload: chunk bytes per datagram.
        dst: the uint8 array written.
        window: datagrams in flight at most.
        timeout_s: silence after which the pieces in flight are sent again.
        deadline_s: bound on the transfer.

    Returns:
        The transfer's duration and counters.

    Raises:
        ProbeError: the deadline passed before every piece arrived.
    """
    n = len(datagrams)
    present = bytearray(n)
    missing = n
    rbuf = bytearray(65536)
    rview = memoryview(rbuf)
    out = memoryview(dst.data).cast("B")
    hdr = _SEQ.size
    nxt = outstanding = resent = duplicates = 0
    start = time.monotonic()
    last_rx = start
    while missing:
        while outstanding < window and nxt < n:
            if not present[nxt]:
                try:
                    tx.send(datagrams[nxt])
                except BlockingIOError:
                    break
                outstanding += 1
            nxt += 1
        ready, _, _ = select.select([rx], [], [], timeout_s)
        now = time.monotonic()
        if not ready:
            if now - start > deadline_s:
                raise ProbeError(f"plain UDP transfer: {missing} of {n} datagrams never arrived")
            if now - last_rx >= timeout_s:  # lost in flight: send what is missing again
                first = present.find(0)
                resent += sum(1 for i in range(first, min(nxt, n)) if not present[i])
                nxt, outstanding = first, 0
            continue
        while True:
            try:
                got = rx.recv_into(rbuf)
            except (BlockingIOError, InterruptedError):
                break
            if got < hdr:
                continue
            seq = _SEQ.unpack_from(rbuf)[0]
            if seq >= n:
                continue
            outstanding = max(0, outstanding - 1)
            last_rx = now
            if present[seq]:
                duplicates += 1
                continue
            off = seq * payload
            out[off : off + got - hdr] = rview[hdr:got]
            present[seq] = 1
            missing -= 1
    return UdpTransfer(time.monotonic() - start, resent, duplicates)


def _proc_cpu_s(pid: int) -> float:
    """CPU seconds all threads of process ``pid`` ran so far (0.0 for pid 0 or a gone process).

    Read from the scheduler's per-thread nanosecond counters (``/proc/PID/task/*/schedstat``),
    not ``/proc/PID/stat``, whose clock ticks are too coarse for a fetch of a few milliseconds.
    """
    if pid <= 0:
        return 0.0
    total = 0
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return 0.0
    for task in tasks:
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
    return total / 1e9


# -- the probe: fetch and plain UDP, interleaved --------------------------------------------------


def run_probe(args: argparse.Namespace) -> dict[str, Any]:
    """Alternates fetches of one chunk and plain-UDP transfers of the same bytes.

    Args:
        args: the ``probe`` subcommand's arguments.

    Returns:
        The JSON record: ``fetch_s`` and ``udp_s`` (per-round durations), their medians,
        ``fetch_MBps``, ``udp_MBps``, ``ratio`` (of the medians), ``ratio_paired`` (the median
        of each round's ratio: robust to load that changes between rounds); CPU microseconds
        per 256-byte fragment of this process (``fetch_client_us``, ``udp_client_us``), of
        the ``--switch-pid`` process (``fetch_switch_us``, ``udp_switch_us``; 0 without one)
        and of the ``--pool-pid`` process while fetching (``fetch_pool_us``): on a shared
        machine the packet rate follows the CPU per packet; and the fetch counters summed
        over rounds.

    Raises:
        ProbeError: a fetch failed or either path delivered wrong bytes.
        NetnsError: the sender's namespace cannot be entered.
    """
    data = synthetic_chunk(args.tenant, args.key, args.nbytes, args.seed)
    dst = torch.zeros(args.nbytes, dtype=torch.uint8)
    dst_np = dst.numpy()
    datagrams = udp_datagrams(data, args.udp_payload)
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    rx.bind((args.udp_dst, 0))
    rx.setblocking(False)
    tx = socket_in_netns(args.udp_netns, (args.udp_src, 0))
    tx.connect(rx.getsockname())
    fetch_s: list[float] = []
    udp_s: list[float] = []
    totals = {"frags_hit": 0, "frags_pool": 0, "retries": 0, "timeouts": 0, "gets_sent": 0}
    udp_resent = udp_dups = 0
    fetch_cpu = udp_cpu = switch_fetch_cpu = switch_udp_cpu = pool_cpu = 0.0
    client = FetchClient(
        (args.service, c.KVP_UDP_PORT),
        window=args.window,
        frags_per_get=args.frags_per_get,
        nocache=args.nocache,
        timeout_s=args.get_timeout,
        max_timeout_s=max(0.25, args.get_timeout),
        deadline_s=30.0,
        pool_addrs=[(a, c.KVP_UDP_PORT) for a in args.trust_pool],
    )
    try:
        with client:
            for i in range(args.rounds + 1):  # the first round of each warms caches and ARP
                dst_np[:] = 0
                sw0, cpu0 = _proc_cpu_s(args.switch_pid), time.process_time()
                pool0 = _proc_cpu_s(args.pool_pid)
                report = client.fetch(args.tenant, args.key, dst, args.nbytes)
                sw1, cpu1 = _proc_cpu_s(args.switch_pid), time.process_time()
                pool_cpu += _proc_cpu_s(args.pool_pid) - pool0
                if not report.ok or dst_np.tobytes() != data:
                    raise ProbeError(f"fetch through the switch failed or differs: {report}")
                dst_np[:] = 0
                sw2, cpu2 = _proc_cpu_s(args.switch_pid), time.process_time()
                udp = udp_transfer(tx, rx, datagrams, args.udp_payload, dst_np, window=args.window)
                sw3, cpu3 = _proc_cpu_s(args.switch_pid), time.process_time()
                if dst_np.tobytes() != data:
                    raise ProbeError("plain UDP transfer delivered wrong bytes")
                if i == 0:
                    continue
                fetch_s.append(report.duration_s)
                udp_s.append(udp.duration_s)
                fetch_cpu += cpu1 - cpu0
                udp_cpu += cpu3 - cpu2
                switch_fetch_cpu += sw1 - sw0
                switch_udp_cpu += sw3 - sw2
                for name in totals:
                    totals[name] += int(getattr(report, name))
                udp_resent += udp.resent
                udp_dups += udp.duplicates
    finally:
        tx.close()
        rx.close()
    fetch_med, udp_med = statistics.median(fetch_s), statistics.median(udp_s)
    frags = args.rounds * frag_count(args.nbytes)
    return {
        "nbytes": args.nbytes,
        "rounds": args.rounds,
        "window": args.window,
        "frags_per_get": args.frags_per_get,
        "udp_payload": args.udp_payload,
        "fetch_s": fetch_s,
        "udp_s": udp_s,
        "fetch_median_s": fetch_med,
        "udp_median_s": udp_med,
        "fetch_MBps": args.nbytes / fetch_med / 1e6,
        "udp_MBps": args.nbytes / udp_med / 1e6,
        "ratio": udp_med / fetch_med,
        "ratio_paired": statistics.median(u / f for u, f in zip(udp_s, fetch_s, strict=True)),
        "fetch_client_us": fetch_cpu / frags * 1e6,
        "udp_client_us": udp_cpu / frags * 1e6,
        "fetch_switch_us": switch_fetch_cpu / frags * 1e6,
        "udp_switch_us": switch_udp_cpu / frags * 1e6,
        "fetch_pool_us": pool_cpu / frags * 1e6,
        **totals,
        "udp_resent": udp_resent,
        "udp_duplicates": udp_dups,
    }


# -- loopback: the fetch client against the pool server --------------------------------------------


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
                    raise ProbeError(f"benchmark fetch failed: {report}")
                times.append(report.duration_s)
                retries += report.retries
        if dst.numpy().tobytes() != _chunk(layout.chunk_bytes):
            raise ProbeError("benchmark fetch returned wrong bytes")
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
    """Runs every loopback configuration and prints one result line each.

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


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m benchmarks.loopback`` parser: loopback by default, ``probe`` subcommand."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.loopback")
    parser.add_argument("--repeat", type=int, default=20, help="loopback fetches per line")
    parser.add_argument("--quick", action="store_true", help="one small loopback configuration")
    sub = parser.add_subparsers(dest="command")
    p = sub.add_parser("probe", help="interleaved fetch / plain-UDP run inside a host namespace")
    p.add_argument("--service", required=True, help="switch VIP the GETs go to")
    p.add_argument(
        "--trust-pool",
        action="append",
        default=[],
        metavar="ADDR",
        help="a pool node the switch forwards misses to (the client takes its answers)",
    )
    p.add_argument("--tenant", type=int, required=True)
    p.add_argument("--key", type=parse_key, required=True)
    p.add_argument("--nbytes", type=int, required=True)
    p.add_argument("--seed", type=int, default=0, help="synthetic chunk seed the switch holds")
    p.add_argument("--rounds", type=int, default=10, help="measured rounds (plus one warm-up)")
    p.add_argument("--window", type=int, default=32, help="GETs / datagrams in flight")
    p.add_argument("--frags-per-get", type=int, default=1, help="1: switch SRAM hits")
    p.add_argument("--nocache", action="store_true", help="GETs bypass SRAM to the pool")
    p.add_argument("--get-timeout", type=float, default=0.02)
    p.add_argument("--udp-netns", required=True, help="namespace the plain-UDP sender lives in")
    p.add_argument("--udp-src", required=True, help="sender address in that namespace")
    p.add_argument("--udp-dst", required=True, help="this host's address (receiver)")
    p.add_argument("--udp-payload", type=int, default=c.FRAG_BYTES, help="chunk bytes/datagram")
    p.add_argument("--switch-pid", type=int, default=0, help="count the switch process's CPU")
    p.add_argument("--pool-pid", type=int, default=0, help="count the pool node's CPU")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the benchmark from the command line.

    Args:
        argv: ``[--quick] [--repeat N]`` for loopback, or ``probe ...``.

    Returns:
        0; 1 when the probe failed (its JSON line then has ``error``).
    """
    args = build_parser().parse_args(argv)
    if args.command == "probe":
        try:
            record = run_probe(args)
        except (ProbeError, OSError) as exc:
            print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
            return 1
        print(json.dumps(record), flush=True)
        return 0
    run(args.quick, args.repeat)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
