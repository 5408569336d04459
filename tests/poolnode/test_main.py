"""``python -m poolnode`` starts, answers GETs, preloads synthetic chunks, writes its counters
and stops cleanly on SIGTERM."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from kvcast import p4constants as c
from kvcast.synthetic import ChunkSpec, synthetic_chunk
from kvcast.wire import KvpHeader, fragment_crc, get_message
from tests.poolnode.conftest import needs_mooncake


@contextmanager
def daemon(*args: str) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """A pool node on 127.0.0.1 with ``args``; yields the process and its UDP port.

    Its tenant policy: the test's client, on the loopback, may name any tenant.
    """
    loopback = ["--source-tenants", "127.0.0.1=any"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "poolnode", "--host", "127.0.0.1", "--port", "0", *loopback, *args],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        port = 0
        for line in proc.stdout:
            match = re.search(r"listening .*port=(\d+)", line)
            if match:
                port = int(match.group(1))
                break
        assert port, "poolnode exited before listening"
        yield proc, port
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    return out


def fetch_all(port: int, tenant: int, key: int, nbytes: int, req_id: int = 1) -> bytes:
    """The chunk as DATA from the node: one GET for every fragment, CRCs checked."""
    nfrags = -(-nbytes // c.FRAG_BYTES)
    got = bytearray(nbytes)
    seen = 0
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(10)
        sock.sendto(get_message(tenant, key, 0, req_id=req_id, count=nfrags), ("127.0.0.1", port))
        while seen < nfrags:
            raw = sock.recv(65536)
            hdr = KvpHeader.unpack(raw)
            assert hdr.op == c.KVP_OP_DATA, hdr
            payload = raw[c.KVP_HDR_BYTES : c.KVP_HDR_BYTES + hdr.payload_len]
            assert fragment_crc(tenant, key, hdr.frag_idx, payload) == hdr.crc
            lo = hdr.frag_idx * c.FRAG_BYTES
            got[lo : lo + len(payload)] = payload
            seen += -(-hdr.payload_len // c.FRAG_BYTES)
    return bytes(got)


def test_daemon_answers_a_get_and_stops_on_sigterm() -> None:
    with daemon("--backend", "memory") as (proc, port):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.settimeout(10)
            sock.sendto(get_message(1, 2, 0, req_id=4), ("127.0.0.1", port))
            hdr = KvpHeader.unpack(sock.recv(2048))
        assert (hdr.op, hdr.status, hdr.req_id) == (c.KVP_OP_NACK, c.KVP_STATUS_NOT_FOUND, 4)
        assert "nack_not_found=1" in stop(proc)


@pytest.mark.parametrize("gso", [[], ["--gso", "--mtu", "9000"]])
def test_preloaded_synthetic_chunks_are_served(tmp_path: Path, gso: list[str]) -> None:
    # With --gso the DATAs leave as UDP GSO messages (native path) and arrive as datagrams.
    specs = ["3:0xabc:50000:1", "3:0xabd:700"]
    with daemon("--backend", "memory", "--preload", specs[0], "--preload", specs[1], *gso) as (
        proc,
        port,
    ):
        assert fetch_all(port, 3, 0xABC, 50000) == synthetic_chunk(3, 0xABC, 50000, 1)
        assert fetch_all(port, 3, 0xABD, 700) == synthetic_chunk(3, 0xABD, 700, 0)
        stop(proc)


def test_stats_file_is_written_periodically_and_finally_on_sigterm(tmp_path: Path) -> None:
    path = tmp_path / "stats.json"
    args = ["--backend", "memory", "--preload", "1:7:1000:2", "--stats-file", str(path)]
    with daemon(*args, "--stats-interval", "0") as (proc, port):
        first = json.loads(path.read_text())  # written before "listening"
        assert first["final"] is False and first["stats"]["data_sent"] == 0
        fetch_all(port, 1, 7, 1000)
        stop(proc)
    final = json.loads(path.read_text())
    assert final["final"] is True
    assert final["stats"]["data_sent"] == 1 and final["stats"]["data_payload_bytes"] == 1000
    assert final["preloaded"] == [{"tenant": 1, "key": "0x7", "nbytes": 1000, "seed": 2}]


def test_bad_preload_spec_is_refused() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "poolnode", "--backend", "memory", "--preload", "1:2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "TENANT:KEY:NBYTES" in proc.stderr


@needs_mooncake
@pytest.mark.slow
def test_preload_goes_through_mooncakes_put_path() -> None:
    spec = ChunkSpec(5, 0x5EED, 3000, 9)
    text = f"{spec.tenant}:{spec.key:#x}:{spec.nbytes}:{spec.seed}"
    args = ["--backend", "mooncake", "--start-master", "--segment-mib", "64"]
    with daemon(*args, "--preload", text) as (proc, port):
        assert fetch_all(port, spec.tenant, spec.key, spec.nbytes) == spec.data()
        assert "backend_reads=1" in stop(proc)


@needs_mooncake
@pytest.mark.slow
def test_a_killed_master_is_restarted_and_the_preloaded_chunks_are_served_again() -> None:
    spec = ChunkSpec(5, 0xDEAD, 3000, 4)
    text = f"{spec.tenant}:{spec.key:#x}:{spec.nbytes}:{spec.seed}"
    args = ["--backend", "mooncake", "--start-master", "--segment-mib", "64", "--cache-mib", "0"]
    with daemon(*args, "--preload", text) as (proc, port):
        assert proc.stdout is not None
        assert fetch_all(port, spec.tenant, spec.key, spec.nbytes) == spec.data()
        line = proc.stdout.readline()
        match = re.search(r"poolnode master pid=(\d+)", line)
        assert match, line
        os.kill(int(match.group(1)), signal.SIGKILL)
        restarted = proc.stdout.readline()
        match = re.search(r"master restarted pid=(\d+) down_s=\S+ reput=(\d+)", restarted)
        assert match, restarted
        assert int(match.group(2)) == 1
        os.kill(int(match.group(1)), 0)  # the new master runs
        # Read from the new master's store (no chunk cache): the chunk was put back. (Another
        # request id: the node drops a repeated GET as a duplicate.)
        assert fetch_all(port, spec.tenant, spec.key, spec.nbytes, req_id=2) == spec.data()
        assert "backend_reads=2" in stop(proc)
