"""The reference target's packet I/O: raw sockets on veth/Mininet interfaces.

Classes:
    PortMap: parses ``PORT@IFNAME`` arguments (simple_switch_grpc's ``-i`` syntax).
    Dataplane: one thread that receives from every port, runs the :class:`Pipeline` and sends
        the outputs; PacketOut from the controller is queued into the same thread, and outputs
        to the CPU port become PacketIn messages.
"""

from __future__ import annotations

import logging
import os
import queue
import select
import socket
import struct
import threading
from collections.abc import Iterable, Mapping

from refswitch.impair import Impairment
from refswitch.pipeline import PACKET_OUT_LEN, Output, Pipeline

log = logging.getLogger(__name__)

ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4  # sll_pkttype of frames this host sent itself
_MAX_FRAME = 65535
# The kernel takes an 802.1Q/802.1ad tag off a received frame before a packet socket sees it and
# reports it in PACKET_AUXDATA; the switch must see the frame as it was on the wire (a tagged
# frame is dropped at the edge), so the tag is put back, as libpcap does.
SOL_PACKET = 263
PACKET_AUXDATA = 8
TP_STATUS_VLAN_VALID = 0x10
TP_STATUS_VLAN_TPID_VALID = 0x40
_AUXDATA = struct.Struct("=IIIHHHH")  # struct tpacket_auxdata
_CMSG_SPACE = socket.CMSG_SPACE(_AUXDATA.size)


def restore_vlan_tag(frame: bytes, ancdata: list[tuple[int, int, bytes]]) -> bytes:
    """The frame with the VLAN tag the kernel reported in PACKET_AUXDATA put back, if any.

    Args:
        frame: the bytes a packet socket received.
        ancdata: the ancillary data of that ``recvmsg``.

    Returns:
        ``frame``, or ``frame`` with a 4-byte tag inserted after the MAC addresses.
    """
    for level, kind, data in ancdata:
        if level != SOL_PACKET or kind != PACKET_AUXDATA or len(data) < _AUXDATA.size:
            continue
        status, _len, _snap, _mac, _net, tci, tpid = _AUXDATA.unpack_from(data)
        if not status & TP_STATUS_VLAN_VALID or len(frame) < 12:
            continue
        if not status & TP_STATUS_VLAN_TPID_VALID or tpid == 0:
            tpid = 0x8100
        return frame[:12] + struct.pack("!HH", tpid, tci) + frame[12:]
    return frame


class DataplaneError(RuntimeError):
    """An interface cannot be opened or a port is given twice."""


class PortMap(dict[int, str]):
    """Port number to interface name."""

    @classmethod
    def parse(cls, specs: Iterable[str]) -> PortMap:
        """Parses ``["1@veth1", "2@veth3"]``.

        Args:
            specs: ``PORT@IFNAME`` strings.

        Returns:
            The map.

        Raises:
            DataplaneError: a spec is malformed or a port repeats.
        """
        ports = cls()
        for spec in specs:
            num, sep, ifname = spec.partition("@")
            if not sep or not num.isdigit() or not ifname:
                raise DataplaneError(f"interface spec {spec!r} is not PORT@IFNAME")
            if int(num) in ports:
                raise DataplaneError(f"port {num} given twice")
            ports[int(num)] = ifname
        return ports


class Dataplane:
    """Moves packets between interfaces and the pipeline.

    Args:
        pipeline: the switch pipeline.
        ports: port number to interface name.
        impairment: faults to inject into frames sent to data ports (refswitch.impair), or None.

    Raises:
        DataplaneError: a port is the CPU port or not a 9-bit port number.
    """

    def __init__(
        self, pipeline: Pipeline, ports: Mapping[int, str], impairment: Impairment | None = None
    ):
        if pipeline.cpu_port in ports:
            # A frame from that interface would be taken for a PacketOut from the controller,
            # and could WRITE switch SRAM.
            raise DataplaneError(
                f"port {pipeline.cpu_port} is the CPU port; no interface may be mapped to it"
            )
        bad = sorted(p for p in ports if not 0 <= p < 1 << 9)
        if bad:
            raise DataplaneError(f"ports {bad} are not 9-bit port numbers")
        self.pipeline = pipeline
        self.ports = dict(ports)
        self._socks: dict[int, socket.socket] = {}
        self._by_fd: dict[int, int] = {}
        self._outq: queue.SimpleQueue[tuple[bytes, Mapping[str, int]]] = queue.SimpleQueue()
        self._wake_r, self._wake_w = os.pipe()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.rx_packets = 0
        self.tx_packets = 0
        self.tx_errors = 0
        self.impairment = impairment
        pipeline.state.packet_out_handler = self.packet_out

    def open(self) -> None:
        """Opens one raw socket per port.

        Raises:
            DataplaneError: an interface does not exist or raw sockets are not permitted.
        """
        for port, ifname in self.ports.items():
            try:
                sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
                sock.bind((ifname, 0))
                sock.setsockopt(SOL_PACKET, PACKET_AUXDATA, 1)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
                sock.setblocking(False)
            except OSError as exc:
                self.close()
                raise DataplaneError(f"cannot open port {port} on {ifname}: {exc}") from exc
            self._socks[port] = sock
            self._by_fd[sock.fileno()] = port

    def packet_out(self, payload: bytes, metadata: Mapping[str, int]) -> None:
        """PacketOut from the controller (any thread): runs it as if it came in on the CPU port.

        Args:
            payload: the frame.
            metadata: decoded packet_out metadata (``egress_port``).
        """
        self._outq.put((payload, metadata))
        os.write(self._wake_w, b"x")

    def start(self) -> None:
        """Opens the ports (if needed) and starts the forwarding thread."""
        if not self._socks:
            self.open()
        self._thread = threading.Thread(target=self._run, name="refswitch-dataplane", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stops the thread and closes the sockets."""
        self._stop.set()
        os.write(self._wake_w, b"x")
        if self._thread:
            self._thread.join(timeout=5)
        self.close()

    def close(self) -> None:
        """Closes every socket."""
        for sock in self._socks.values():
            sock.close()
        self._socks.clear()
        self._by_fd.clear()

    def _emit(self, outputs: list[Output]) -> None:
        state = self.pipeline.state
        for out in outputs:
            if out.port == self.pipeline.cpu_port:
                state.emit_packet_in(out.frame, {"ingress_port": out.ingress_port, "pad": 0})
                continue
            if self.impairment is not None:
                self.impairment.send(out.port, out.frame, self._send)
            else:
                self._send(out.port, out.frame)

    def _send(self, port: int, frame: bytes) -> None:
        sock = self._socks.get(port)
        if sock is None:
            self.tx_errors += 1
            return
        try:
            sock.send(frame)
            self.tx_packets += 1
        except OSError:
            self.tx_errors += 1

    def _run(self) -> None:
        poller = select.epoll()
        for fd in self._by_fd:
            poller.register(fd, select.EPOLLIN)
        poller.register(self._wake_r, select.EPOLLIN)
        try:
            while not self._stop.is_set():
                timeout = 0.5
                if self.impairment is not None:
                    due = self.impairment.next_due()
                    timeout = 0.01 if due is None else min(0.01, due)
                events = poller.poll(timeout)
                if self.impairment is not None:
                    if not events:
                        self.impairment.flush(self._send)  # idle: release frames held back
                    else:
                        self.impairment.release_due(self._send)  # delayed frames now due
                for fd, _ in events:
                    if fd == self._wake_r:
                        os.read(self._wake_r, 4096)
                        self._drain_packet_out()
                        continue
                    port = self._by_fd.get(fd)
                    if port is None:
                        continue
                    self._drain_port(port)
        finally:
            poller.close()

    def _drain_port(self, port: int) -> None:
        sock = self._socks[port]
        for _ in range(256):
            try:
                frame, ancdata, _flags, addr = sock.recvmsg(_MAX_FRAME, _CMSG_SPACE)
            except BlockingIOError:
                return
            except OSError:
                return
            if addr[2] == PACKET_OUTGOING:
                continue
            frame = restore_vlan_tag(frame, ancdata)
            self.rx_packets += 1
            if not self.pipeline.state.ready:
                continue  # no program yet: dropped, as BMv2 does before its pipeline is set
            try:
                self._emit(self.pipeline.process(port, frame))
            except Exception:  # a pipeline bug must not stop the switch
                log.exception("pipeline failed on a packet from port %d", port)

    def _drain_packet_out(self) -> None:
        cpu = self.pipeline.cpu_port
        while True:
            try:
                payload, metadata = self._outq.get_nowait()
            except queue.Empty:
                return
            header = ((metadata.get("egress_port", 0) & 0x1FF) << 7).to_bytes(PACKET_OUT_LEN, "big")
            try:
                self._emit(self.pipeline.process(cpu, header + payload))
            except Exception:
                log.exception("pipeline failed on a PacketOut")
