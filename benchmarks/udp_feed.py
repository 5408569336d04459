"""A native sender of prebuilt KVP DATA streams, in a process of its own (benchmark feed).

``benchmarks.hostagent_fetch`` measures the agent's receive path "fed by a native sender on
loopback" (issue 13): the datagrams are built once, then each round sends them with one
``kvcast._native.send_batch`` call (``sendmmsg`` in C, no Python per datagram). Running it as a
separate process puts the sender on its own core and keeps it off the receiver's interpreter
lock, so what the receiver measures is its own cost against a sender at full speed.

The parent talks to it over stdin/stdout, one line per command:

``build NBYTES FRAGS_PER_DATAGRAM``
    Builds the chunk's multicast-replica DATAs (``stream_messages``); answers ``ok N`` (N
    datagrams).
``send IP PORT``
    Sends them to IP:PORT; answers ``sent T0_NS T1_NS BYTES``: ``CLOCK_MONOTONIC`` right before
    the first datagram and after the last, the same clock the parent reads.

It binds ``SENDER`` (the KVP port on a loopback address of its own), which the agent is given
as a pool node (``pool_addrs``), so its source check takes the datagrams.

Functions:
    stream_messages: a chunk as multicast-replica DATA messages.
    main: the command loop (``python -m benchmarks.udp_feed``).

Classes:
    Feed: the parent's handle on the process (a ``kvcast.lifecycle.Service``: ``with`` runs it).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time

from kvcast import p4constants as c
from kvcast import wire
from kvcast.kvp import frag_count
from kvcast.lifecycle import Service
from kvcast.synthetic import synthetic_chunk

TENANT, KEY, SEED = 1, 0xBE7C5, 3
GROUP = 77
SENDER = ("127.0.0.3", c.KVP_UDP_PORT)


def stream_messages(nbytes: int, frags_per_msg: int) -> list[tuple[bytes, memoryview]]:
    """A chunk as multicast-replica DATA messages of ``frags_per_msg`` fragments each.

    Args:
        nbytes: chunk size.
        frags_per_msg: fragments per DATA (1: the SRAM path's one fragment per packet).

    Returns:
        ``(header, payload)`` pairs, as ``kvcast._native.send_batch`` takes them.
    """
    data = synthetic_chunk(TENANT, KEY, nbytes, SEED)
    n = frag_count(nbytes)
    out = []
    for first in range(0, n, frags_per_msg):
        lo = first * c.FRAG_BYTES
        hi = min((first + frags_per_msg) * c.FRAG_BYTES, nbytes)
        msg = wire.data_message(
            TENANT, KEY, first, n, data[lo:hi], group=GROUP,
            flags=c.KVP_FLAG_POOL | c.KVP_FLAG_REPLICA,
        )  # fmt: skip
        out.append((msg[: c.KVP_HDR_BYTES], memoryview(msg)[c.KVP_HDR_BYTES :]))
    return out


def main() -> int:
    """Serves ``build`` and ``send`` commands from stdin until it closes.

    Returns:
        0 at end of input; 2 when kvcast._native is not built (nothing native to send with).
    """
    from kvcast.native import native

    if native is None:
        print("error kvcast._native-not-built", flush=True)
        return 2
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16 << 20)
    sock.bind(SENDER)
    msgs: list[tuple[bytes, memoryview]] = []
    for line in sys.stdin:
        words = line.split()
        if words[:1] == ["build"]:
            msgs = stream_messages(int(words[1]), int(words[2]))
            print(f"ok {len(msgs)}", flush=True)
        elif words[:1] == ["send"]:
            to = (int.from_bytes(socket.inet_aton(words[1]), "big"), int(words[2]))
            t0 = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
            sent = native.send_batch(sock.fileno(), to, msgs)
            t1 = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
            print(f"sent {t0} {t1} {sent}", flush=True)
        else:
            print(f"error unknown-command-{words[:1]}", flush=True)
    sock.close()
    return 0


class Feed(Service):
    """The feed process (``python -m benchmarks.udp_feed``), started and stopped by ``with``.

    Raises:
        RuntimeError: the process answered an error or nothing (its stderr is in the message).
    """

    def __init__(self) -> None:
        self._proc: subprocess.Popen[str] | None = None
        self._pending = False

    def start(self) -> None:
        """Starts the process."""
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.udp_feed"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

    def stop(self) -> None:
        """Ends the command loop (its stdin closed) and reaps the process (killed after 10 s)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:  # closes its stdin (the command loop ends), reads and closes its pipes, reaps it
            proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()

    def _answer(self) -> list[str]:
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        words = proc.stdout.readline().split()
        if not words or words[0] == "error":
            err = ""
            if proc.poll() is not None and proc.stderr is not None:
                err = proc.stderr.read()[-500:]
            raise RuntimeError(f"the feed process answered {words}: {err}")
        return words

    def _command(self, line: str) -> None:
        proc = self._proc
        if proc is None or proc.stdin is None:
            raise RuntimeError("the feed process is not running (use it in a with block)")
        proc.stdin.write(line + "\n")
        proc.stdin.flush()

    def build(self, nbytes: int, frags_per_msg: int) -> int:
        """Has the process build a chunk's DATAs; returns how many datagrams they are."""
        self._command(f"build {nbytes} {frags_per_msg}")
        return int(self._answer()[1])

    def send(self, to: tuple[str, int]) -> None:
        """Has the process send the built DATAs to ``to`` and returns at once (``finish``)."""
        self._command(f"send {to[0]} {to[1]}")
        self._pending = True

    def finish(self) -> tuple[float, float, int]:
        """Waits for the send ``send`` began.

        Returns:
            ``CLOCK_MONOTONIC`` seconds before its first datagram and after its last, and the
            bytes sent.
        """
        if not self._pending:
            raise RuntimeError("finish() without send()")
        self._pending = False
        words = self._answer()
        return int(words[1]) / 1e9, int(words[2]) / 1e9, int(words[3])


if __name__ == "__main__":
    sys.exit(main())
