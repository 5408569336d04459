"""``python -m poolnode`` starts, answers GETs and stops cleanly on SIGTERM."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys

from kvcast import p4constants as c
from kvcast.wire import KvpHeader, get_message


def test_daemon_answers_a_get_and_stops_on_sigterm() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "poolnode", "--backend", "memory", "--host", "127.0.0.1"]
        + ["--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        match = re.search(r"port=(\d+)", proc.stdout.readline())
        assert match is not None
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.settimeout(10)
            sock.sendto(get_message(1, 2, 0, req_id=4), ("127.0.0.1", int(match.group(1))))
            hdr = KvpHeader.unpack(sock.recv(2048))
        assert (hdr.op, hdr.status, hdr.req_id) == (c.KVP_OP_NACK, c.KVP_STATUS_NOT_FOUND, 4)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=10)
        assert proc.returncode == 0
        assert "nack_not_found=1" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
