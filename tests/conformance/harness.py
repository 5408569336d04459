"""Targets the conformance vectors run against, behind one small interface.

- InProcessRefTarget: the reference pipeline called directly, programmed through its real
  P4Runtime server over loopback (fast; used for the fuzzing too).
- VethTarget: a switch process (reference target or BMv2) on veth pairs, programmed over
  P4Runtime, frames sent and captured on raw sockets.
"""

from __future__ import annotations

import queue
import select
import shutil
import socket
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from emulation.targets import SwitchProcess, VethPorts, load_p4info
from kvcast.tools.p4rt_client import P4RuntimeClient
from refswitch.p4rt_server import P4RuntimeServer
from refswitch.pipeline import PACKET_OUT_LEN, Pipeline, initial_defaults
from refswitch.state import SwitchState

from .vectors import CPU, DENY_PORT, HOSTS, POOL_PORT, UNKNOWN_PORT

PORTS = [*HOSTS, POOL_PORT, DENY_PORT, UNKNOWN_PORT]


class Target(Protocol):
    client: P4RuntimeClient

    def send(self, port: int, frame: bytes, out_port: int = 0) -> None: ...

    def collect(self, frames: int, packet_ins: int) -> list[tuple[int, bytes]]: ...

    def close(self) -> None: ...


class InProcessRefTarget:
    """The reference pipeline in this process, behind its P4Runtime server on loopback."""

    def __init__(self) -> None:
        self.state = SwitchState()
        self.pipeline = Pipeline(self.state)
        self._outputs: list[tuple[int, bytes]] = []
        self.state.packet_out_handler = self._packet_out
        self.server = P4RuntimeServer(
            self.state,
            "127.0.0.1:0",
            defaults_provider=lambda _p: initial_defaults(),
            on_pipeline=lambda _p, _c: self.pipeline.reset(),
        )
        port = self.server.start()
        self.client = P4RuntimeClient(f"127.0.0.1:{port}", election_id=10).connect()
        self.client.set_pipeline(load_p4info())

    def _packet_out(self, payload: bytes, metadata: Mapping[str, int]) -> None:
        header = ((metadata.get("egress_port", 0) & 0x1FF) << 7).to_bytes(PACKET_OUT_LEN, "big")
        self._deliver(self.pipeline.process(CPU, header + payload))

    def _deliver(self, outputs: list) -> None:  # type: ignore[type-arg]
        for out in outputs:
            if out.port == CPU:
                self.state.emit_packet_in(out.frame, {"ingress_port": out.ingress_port, "pad": 0})
            else:
                self._outputs.append((out.port, out.frame))

    def send(self, port: int, frame: bytes, out_port: int = 0) -> None:
        if port == CPU:
            self.client.packet_out(frame, out_port)
        else:
            self._deliver(self.pipeline.process(port, frame))

    def collect(self, frames: int, packet_ins: int) -> list[tuple[int, bytes]]:
        got = _drain_packet_ins(self.client, packet_ins, grace=0.02)
        out, self._outputs = self._outputs + got, []
        return out

    def close(self) -> None:
        self.client.close()
        self.server.stop()


class VethTarget:
    """A switch process on veth pairs."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.veths = VethPorts(PORTS, prefix="kc" + kind[0])
        self._logdir = Path(tempfile.mkdtemp(prefix=f"kvcast-{kind}-"))
        try:
            self.proc = SwitchProcess(
                kind, self.veths.interface_args(), self._logdir / "switch.log"
            )
        except Exception:
            self.veths.close()
            shutil.rmtree(self._logdir, ignore_errors=True)
            raise
        self.client = self.proc.client
        self.socks: dict[int, socket.socket] = {}
        for port, pair in self.veths.pairs.items():
            s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
            s.bind((pair.host_if, 0))
            s.setblocking(False)
            self.socks[port] = s
        self._by_fd = {s.fileno(): p for p, s in self.socks.items()}
        time.sleep(0.2)
        self._flush()

    def _flush(self) -> None:
        for s in self.socks.values():
            while True:
                try:
                    s.recv(65535)
                except BlockingIOError:
                    break

    def send(self, port: int, frame: bytes, out_port: int = 0) -> None:
        if port == CPU:
            self.client.packet_out(frame, out_port)
        else:
            self.socks[port].send(frame)

    def collect(self, frames: int, packet_ins: int) -> list[tuple[int, bytes]]:
        expected = frames
        got: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + 2.0
        # Wait for what is expected, then a short grace for anything unexpected.
        while time.monotonic() < deadline:
            remaining = (deadline - time.monotonic()) if len(got) < expected else 0.15
            ready, _, _ = select.select(list(self.socks.values()), [], [], remaining)
            if not ready:
                if len(got) >= expected:
                    break
                continue
            for s in ready:
                while True:
                    try:
                        frame, addr = s.recvfrom(65535)
                    except BlockingIOError:
                        break
                    if addr[2] == socket.PACKET_OUTGOING:
                        continue
                    got.append((self._by_fd[s.fileno()], frame))
            if len(got) >= expected:
                deadline = min(deadline, time.monotonic() + 0.15)
        return got + _drain_packet_ins(self.client, packet_ins, grace=0.05)

    def close(self) -> None:
        for s in self.socks.values():
            s.close()
        self.proc.close()
        self.veths.close()
        shutil.rmtree(self._logdir, ignore_errors=True)


def _drain_packet_ins(
    client: P4RuntimeClient, expected: int, grace: float
) -> list[tuple[int, bytes]]:
    got: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + 2.0
    while True:
        wait = max(0.0, deadline - time.monotonic()) if len(got) < expected else grace
        try:
            payload, _md = client.packet_ins.get(timeout=wait)
        except queue.Empty:
            return got
        got.append((CPU, payload))
