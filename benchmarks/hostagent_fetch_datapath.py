"""The hostagent_fetch lines of one data path alone: the agent's receive, the pool node's send.

``path=agent_receive`` and ``path=pool_send`` of :mod:`benchmarks.hostagent_fetch` (the lines
are described there): each side against a native loop that does only the I/O (the ceiling).

Functions:
    measure_receive: the agent's receive path vs a counting loop, fed by a native sender.
    measure_send: the pool node's send vs sending the same DATAs prebuilt.
"""

from __future__ import annotations

import socket
import statistics
import time

from benchmarks.hostagent_fetch_pool import JUMBO_MTU
from benchmarks.udp_feed import KEY, SEED, TENANT  # the feed's chunk is the suite's
from kvcast import p4constants as c
from kvcast import wire
from kvcast.kvp import frag_count
from kvcast.synthetic import synthetic_chunk


def _now() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def measure_receive(
    nbytes: int, frags_per_msg: int, rounds: int, mtu: int = JUMBO_MTU
) -> dict[str, dict[str, float]]:
    """The agent's receive rate alone vs a receive loop that only counts (the ceiling).

    A native sender in its own process (``benchmarks.udp_feed``: the chunk as multicast-replica
    DATA of ``frags_per_msg`` fragments, prebuilt, one ``sendmmsg`` call) feeds two receivers:
    a follower ``FetchClient`` set up for ``mtu`` (checks, CRC, the payload into the tensor;
    whichever data path ``KVCAST_NATIVE`` selects) and ``kvcast._native.recv_count`` on a plain
    socket. Two feeds, all four alternated each round, medians:

    ``stream``
        The sender starts while the receiver waits (the issue's "fed by a native sender on
        loopback"): the time from the sender's first datagram to the receiver's last. Each side
        has a core; the receiver keeps up or the sender waits for it (the socket buffer holds
        the whole chunk, so nothing is lost either way).
    ``drain``
        The whole chunk is queued in the receiving socket first, then the receiver alone is
        timed draining it: its CPU cost per byte, with no sender to wait for.

    Both are also timed in the receiving thread's CPU time (``time.thread_time``: the system
    calls included, the time other processes hold the core not): on a shared machine a 5 ms
    drain is more often interrupted than a 4 ms one, which the wall-clock ratio counts against
    the slower side.

    Returns:
        Per feed (``stream``, ``drain``): ``agent_MBps``, ``ceiling_MBps``,
        ``agent_frags_per_s``, ``ceiling_frags_per_s``, ``cpu_ratio`` (the ceiling's median
        CPU time over the agent's); ``stream`` also ``sender_MBps`` (the sender's own time).

    Raises:
        RuntimeError: kvcast._native is not built (the ceiling is native code), or a round
            lost datagrams (the socket buffer could not hold the chunk).
    """
    import torch

    from benchmarks.udp_feed import GROUP, SENDER, Feed
    from hostagent.fetch import FetchClient
    from kvcast.native import native

    if native is None:
        raise RuntimeError("kvcast._native not built: no native receive ceiling to compare with")
    frags = frag_count(nbytes)
    plain = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    plain.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 20)
    plain.bind(("127.0.0.1", 0))
    rxbuf = bytearray(65536 * native.MAX_BATCH)
    dst = torch.zeros(nbytes, dtype=torch.uint8)
    wall: dict[tuple[str, str], list[float]] = {}
    cpu: dict[tuple[str, str], list[float]] = {}
    sender_s: list[float] = []
    try:
        with (
            Feed() as feed,
            FetchClient(
                ("127.0.0.1", 9), group=GROUP, mtu=mtu, socket_buffer_bytes=16 << 20,
                deadline_s=10, pool_addrs=[SENDER],
            ) as client,
        ):  # fmt: skip
            count = feed.build(nbytes, frags_per_msg)

            def agent() -> None:
                report = client.follow(TENANT, KEY, dst, nbytes, stall_s=5.0, first_wait_s=5.0)
                if not report.ok or report.frags_stream != frags:
                    raise RuntimeError(f"the receive benchmark lost datagrams: {report}")

            def ceiling() -> None:
                got, _ = native.recv_count(plain.fileno(), rxbuf, 65536, count, 1000)
                if got != count:
                    raise RuntimeError(f"the ceiling loop got {got} of {count} datagrams")

            receivers = (
                ("agent", agent, client.address),
                ("ceiling", ceiling, plain.getsockname()),
            )
            for _ in range(rounds):
                for side, receive, to in receivers:
                    # stream: the sender starts, the receiver is already waiting.
                    feed.send(to)
                    c0 = time.thread_time()
                    receive()
                    t_end = _now()
                    cpu.setdefault(("stream", side), []).append(time.thread_time() - c0)
                    t0, t1, _ = feed.finish()
                    wall.setdefault(("stream", side), []).append(t_end - t0)
                    sender_s.append(t1 - t0)
                    # drain: the whole chunk is queued first.
                    feed.send(to)
                    feed.finish()
                    c0, t0 = time.thread_time(), _now()
                    receive()
                    wall.setdefault(("drain", side), []).append(_now() - t0)
                    cpu.setdefault(("drain", side), []).append(time.thread_time() - c0)
    finally:
        plain.close()
    out: dict[str, dict[str, float]] = {}
    for feed_kind in ("stream", "drain"):
        a = statistics.median(wall[(feed_kind, "agent")])
        z = statistics.median(wall[(feed_kind, "ceiling")])
        out[feed_kind] = {
            "agent_MBps": nbytes / a / 1e6,
            "ceiling_MBps": nbytes / z / 1e6,
            "agent_frags_per_s": frags / a,
            "ceiling_frags_per_s": frags / z,
            "cpu_ratio": statistics.median(cpu[(feed_kind, "ceiling")])
            / statistics.median(cpu[(feed_kind, "agent")]),
        }
    out["stream"]["sender_MBps"] = nbytes / statistics.median(sender_s) / 1e6
    return out


def measure_send(nbytes: int, mtu: int, rounds: int, gso: bool = False) -> dict[str, float]:
    """The pool node's send rate for one chunk vs sending the same datagrams prebuilt (ceiling).

    The pool node's side, as its server loop does it: ``KvpGetHandler.answer`` of GETs for the
    whole chunk (256 fragments each), then, where kvcast._native is in use, ``send_data``
    (headers, CRCs and ``sendmmsg`` in C), else ``data_replies`` and one ``sendmsg`` per DATA,
    into a socket whose buffer holds the whole chunk. The
    ceiling: ``kvcast._native.send_batch`` of the same datagrams built beforehand, one datagram
    per message. With ``gso`` the pool node sends as ``PoolServer(gso=True)`` does (UDP GSO
    messages of up to ``GSO_DATAS`` DATAs, the same datagrams on the wire). Alternated, medians.

    Returns:
        ``pool_MBps``, ``ceiling_MBps``.

    Raises:
        RuntimeError: kvcast._native is not built.
    """
    from kvcast.backend import InMemoryBackend
    from kvcast.native import enabled, native
    from poolnode.server import GSO_DATAS, MAX_GET_FRAGMENTS, DataAnswer, KvpGetHandler

    if native is None:
        raise RuntimeError("kvcast._native not built: no native send ceiling to compare with")
    nat = enabled()
    if gso and nat is None:
        raise RuntimeError("UDP GSO sends need the native data path (KVCAST_NATIVE=0 is set)")
    data = synthetic_chunk(TENANT, KEY, nbytes, SEED)
    backend = InMemoryBackend()
    backend.put(TENANT, KEY, data)
    handler = KvpGetHandler(backend, mtu=mtu, dedup_window=0)
    n = frag_count(nbytes)
    gets = [
        wire.get_message(TENANT, KEY, f, req_id=f, count=min(MAX_GET_FRAGMENTS, n - f))
        for f in range(0, n, MAX_GET_FRAGMENTS)
    ]
    prebuilt = [r for g in gets for r in handler.handle(g)]
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 20)
    rx.bind(("127.0.0.1", 0))
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16 << 20)
    to = rx.getsockname()
    ip = int.from_bytes(socket.inet_aton(to[0]), "big")
    rxbuf = bytearray(65536 * native.MAX_BATCH)
    pool_s: list[float] = []
    ceiling_s: list[float] = []
    try:
        for _ in range(rounds):
            t0 = time.perf_counter()
            for g in gets:
                answer = handler.answer(g)
                if not isinstance(answer, DataAnswer):
                    raise RuntimeError(f"the pool node did not serve GET {g[:40]!r}: {answer}")
                if nat is not None:
                    header, chunk, first, end, _, crcs = answer
                    nat.send_data(
                        tx.fileno(), (ip, to[1]), header, chunk, first, end,
                        handler.frags_per_data, c.FRAG_BYTES, crcs, GSO_DATAS if gso else 0,
                    )  # fmt: skip
                else:
                    for header, payload in handler.data_replies(answer):
                        tx.sendmsg((header, payload), (), 0, to)
            pool_s.append(time.perf_counter() - t0)
            native.recv_count(rx.fileno(), rxbuf, 65536, len(prebuilt), 1000)
            t0 = time.perf_counter()
            native.send_batch(tx.fileno(), (ip, to[1]), prebuilt)
            ceiling_s.append(time.perf_counter() - t0)
            native.recv_count(rx.fileno(), rxbuf, 65536, len(prebuilt), 1000)
    finally:
        rx.close()
        tx.close()
    return {
        "pool_MBps": nbytes / statistics.median(pool_s) / 1e6,
        "ceiling_MBps": nbytes / statistics.median(ceiling_s) / 1e6,
    }


__all__ = ["measure_receive", "measure_send"]
