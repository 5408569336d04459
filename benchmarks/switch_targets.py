"""Benchmark: GET -> DATA hits per second through each switch target on veth.

One cached chunk is loaded through WRITE PacketOuts; a closed-loop generator on the host end of
a veth pair keeps a window of GETs outstanding and counts the DATA replies. The same load runs
against the reference target and, where installed, BMv2, side by side in one run; the result is
each target's hit rate and their ratio. Absolute rates depend on this machine: only the ratio
measured in one run means anything.

Functions:
    measure_target: hit rate of one target.
    run: the benchmark entry point (prints ``bench switch ...`` lines).
"""

from __future__ import annotations

import select
import shutil
import socket
import tempfile
import time
from pathlib import Path

from emulation.targets import (
    SwitchProcess,
    TargetUnavailableError,
    VethPorts,
    bmv2_binary,
)
from kvcast import p4constants as c
from kvcast import wire

HOST_MAC, HOST_IP, HOST_PORT = "00:00:00:00:00:01", "10.0.0.1", 40001
SWITCH_MAC, VIP = "02:00:00:00:00:fe", "10.0.100.1"
TENANT, KEY, FRAGS, EPOCH = 1, 0xC0FFEE, 8, 1


def _load_chunk(sw: SwitchProcess) -> None:
    # The host's port bound to its address: the reference target denies an unknown port.
    sw.client.insert(
        c.TABLE_INGRESS_PORT_ROLE_PORT_ROLE,
        {"port": 1},
        c.ACTION_INGRESS_PORT_ROLE_BIND_HOST,
        {"addr": int.from_bytes(wire.ip_bytes(HOST_IP), "big"), "check_tenant": 0},
    )
    data = b"".join(bytes([idx]) * c.FRAG_BYTES for idx in range(FRAGS))
    sw.client.load_chunk(TENANT, KEY, data, slot_base=0, epoch=EPOCH)


def _closed_loop(
    sock: socket.socket, frames: list[bytes], seconds: float, window: int
) -> tuple[int, float]:
    """Keeps ``window`` GETs outstanding for ``seconds``; returns (replies, elapsed)."""
    sent = replies = 0
    outstanding = 0
    deadline = time.perf_counter() + seconds
    start = time.perf_counter()
    last_progress = start
    while True:
        now = time.perf_counter()
        if now >= deadline:
            break
        while outstanding < window:
            sock.send(frames[sent % len(frames)])
            sent += 1
            outstanding += 1
        ready, _, _ = select.select([sock], [], [], 0.05)
        if not ready:
            # Lost packets (queue overflow) would stall a closed loop: refill the window.
            if now - last_progress > 0.2:
                outstanding = 0
            continue
        while True:
            try:
                frame, addr = sock.recvfrom(65535)
            except BlockingIOError:
                break
            if addr[2] == socket.PACKET_OUTGOING:
                continue
            if (
                len(frame) > wire.FRAME_KVP_OFFSET
                and frame[wire.FRAME_KVP_OFFSET] & 0xF == c.KVP_OP_DATA
            ):
                replies += 1
                outstanding = max(0, outstanding - 1)
                last_progress = time.perf_counter()
    return replies, time.perf_counter() - start


def measure_target(kind: str, seconds: float = 3.0, window: int = 32) -> float:
    """GET -> DATA hits per second through one target.

    Args:
        kind: ``"refswitch"`` or ``"bmv2"``.
        seconds: measuring time.
        window: GETs kept outstanding.

    Returns:
        Replies per second.

    Raises:
        TargetUnavailableError: the target cannot run here.
    """
    veths = VethPorts([1], prefix="kb" + kind[0])
    logdir = Path(tempfile.mkdtemp(prefix=f"kvcast-bench-{kind}-"))
    sw = None
    sock = None
    try:
        sw = SwitchProcess(kind, veths.interface_args(), logdir / "switch.log")
        _load_chunk(sw)
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
        sock.bind((veths.pairs[1].host_if, 0))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        sock.setblocking(False)
        frames = [
            wire.udp_frame(
                HOST_MAC,
                SWITCH_MAC,
                HOST_IP,
                VIP,
                HOST_PORT,
                c.KVP_UDP_PORT,
                wire.get_message(TENANT, KEY, i % FRAGS, req_id=i),
            )
            for i in range(64)
        ]
        _closed_loop(sock, frames, 0.5, window)  # warm-up
        replies, elapsed = _closed_loop(sock, frames, seconds, window)
        return replies / elapsed
    finally:
        if sock is not None:
            sock.close()
        if sw is not None:
            sw.close()
        veths.close()
        shutil.rmtree(logdir, ignore_errors=True)


def run(quick: bool = False) -> list[str]:
    """Measures every target present and prints one line each plus the ratio.

    Args:
        quick: shorter measurement.

    Returns:
        The printed lines.
    """
    seconds = 1.5 if quick else 4.0
    lines: list[str] = []
    rates: dict[str, float] = {}
    for kind in ("refswitch", "bmv2"):
        if kind == "bmv2" and bmv2_binary() is None:
            lines.append("bench switch target=bmv2 skipped=simple_switch_grpc-not-installed")
            continue
        try:
            rates[kind] = measure_target(kind, seconds)
        except TargetUnavailableError as exc:
            lines.append(f"bench switch target={kind} skipped={str(exc).replace(' ', '-')}")
            continue
        lines.append(
            f"bench switch target={kind} get_hit_pps={rates[kind]:.0f} frag_bytes={c.FRAG_BYTES}"
        )
    if "refswitch" in rates and "bmv2" in rates:
        lines.append(f"bench switch ratio refswitch/bmv2={rates['refswitch'] / rates['bmv2']:.2f}")
    for line in lines:
        print(line, flush=True)
    return lines
