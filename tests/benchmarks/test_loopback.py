"""benchmarks.loopback: loopback lines, the plain-UDP baseline and the probe's failure paths."""

from __future__ import annotations

import json
import re
import socket
import threading
from collections.abc import Iterator

import numpy as np
import pytest

from benchmarks import loopback as bench
from kvcast import p4constants as c

DATA = bytes(range(256)) * 40 + b"tail"  # 10 244 bytes: 40 full pieces and a short one


def test_quick_benchmark_prints_a_result_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--quick"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("bench fetch")]
    assert len(lines) == 1
    assert re.search(r"server=socket .*MBps=\d+\.\d .*retries=\d+", lines[0])


def test_udp_datagrams_number_every_piece_and_cover_the_chunk() -> None:
    grams = bench.udp_datagrams(DATA, c.FRAG_BYTES)
    assert len(grams) == 41
    assert [int.from_bytes(g[:4], "big") for g in grams] == list(range(41))
    assert b"".join(g[4:] for g in grams) == DATA
    assert len(grams[-1]) == 4 + 4


@pytest.fixture
def rx() -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    yield sock
    sock.close()


def _sender(to: tuple[str, int]) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.connect(to)
    sock.setblocking(False)
    return sock


def test_udp_transfer_writes_every_piece_at_its_offset(rx: socket.socket) -> None:
    dst = np.zeros(len(DATA), dtype=np.uint8)
    with _sender(rx.getsockname()) as tx:
        result = bench.udp_transfer(
            tx, rx, bench.udp_datagrams(DATA, c.FRAG_BYTES), c.FRAG_BYTES, dst, window=8
        )
    assert dst.tobytes() == DATA
    assert result.duration_s > 0


class _LossyRelay:
    """Forwards datagrams to ``to``, dropping the first copy of the listed sequence numbers."""

    def __init__(self, to: tuple[str, int], drop: set[int]) -> None:
        self.to = to
        self.drop = set(drop)
        self.dropped: list[int] = []
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.05)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                gram = self.sock.recv(65536)
            except TimeoutError:
                continue
            seq = int.from_bytes(gram[:4], "big")
            if seq in self.drop:
                self.drop.discard(seq)
                self.dropped.append(seq)
                continue
            self.sock.sendto(gram, self.to)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


def test_udp_transfer_sends_lost_pieces_again(rx: socket.socket) -> None:
    relay = _LossyRelay(rx.getsockname(), {0, 7, 40})
    dst = np.zeros(len(DATA), dtype=np.uint8)
    try:
        with _sender(relay.sock.getsockname()) as tx:
            result = bench.udp_transfer(
                tx, rx, bench.udp_datagrams(DATA, c.FRAG_BYTES), c.FRAG_BYTES, dst, window=4
            )
    finally:
        relay.close()
    assert sorted(relay.dropped) == [0, 7, 40]
    assert dst.tobytes() == DATA
    assert result.resent >= 3


def test_udp_transfer_raises_when_nothing_arrives(rx: socket.socket) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as hole:
        hole.bind(("127.0.0.1", 0))
        with _sender(hole.getsockname()) as tx, pytest.raises(bench.ProbeError, match="never"):
            bench.udp_transfer(
                tx,
                rx,
                bench.udp_datagrams(DATA, c.FRAG_BYTES),
                c.FRAG_BYTES,
                np.zeros(len(DATA), dtype=np.uint8),
                deadline_s=0.1,
            )


def test_socket_in_a_missing_namespace_is_a_netns_error() -> None:
    with pytest.raises(bench.NetnsError, match="kvcast-no-such-ns"):
        bench.socket_in_netns("kvcast-no-such-ns", ("127.0.0.1", 0))


def test_probe_that_cannot_start_prints_an_error_record(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["probe", "--service", "127.0.0.1", "--tenant", "1", "--key", "0x5", "--nbytes", "512"]
    argv += ["--udp-netns", "kvcast-no-such-ns", "--udp-src", "127.0.0.1"]
    argv += ["--udp-dst", "127.0.0.1"]
    assert bench.main(argv) == 1
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert "NetnsError" in record["error"]
