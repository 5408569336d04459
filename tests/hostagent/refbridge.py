"""The reference switch pipeline, in this process, between real UDP sockets on loopback.

``RefSwitchBridge`` runs ``InProcessRefTarget`` (the reference pipeline behind its real
P4Runtime server) as the switch between fetch clients and a real pool-node server, without root:

- a client's datagram to the bridge's VIP socket becomes an Ethernet/IPv4/UDP frame from an
  emulated host (``10.0.0.i``, the client's own UDP port) to the service VIP, entering the
  pipeline on switch port ``i``;
- a frame the pipeline sends out of the pool's port (a GET that missed, or bypassed the cache)
  is sent as UDP to the real pool server, from a bridge socket kept for that requester, and
  each reply the pool sends back enters the pipeline on the pool's port as a frame from the
  pool node (``10.0.1.1:19286``) to the requester;
- a frame the pipeline sends out of a host port is delivered to that host's client: to the
  destination UDP port on loopback, or, for a multicast replica (destination ``AGENT_PORT``), to
  the address the host registered.

The switch is programmed as ``emulation.network.Cluster`` programs it (routes, the pool's port
role, every pool-owner bucket to the pool, each host's replica destination on ``AGENT_PORT``);
chunks are loaded into its SRAM with WRITE PacketOuts (``load_chunk``). One thread runs the
pipeline; ``lock`` keeps it from running while the test writes SRAM or registers.
"""

from __future__ import annotations

import select
import socket
import struct
import threading

from kvcast import p4constants as c
from kvcast import wire
from kvcast.ports import AGENT_PORT
from kvcast.tools.p4rt_client import Lpm
from kvcast.wire import ip_int, mac_int
from tests.conformance.harness import InProcessRefTarget
from tests.hostagent.fakes import LoopThread

Address = tuple[str, int]

SWITCH_MAC = "02:00:00:00:00:fe"
VIP = "10.0.100.1"
POOL_IP, POOL_MAC, POOL_PORT = "10.0.1.1", "00:00:00:00:01:01", 8
MAX_HOSTS = 4
_K = wire.FRAME_KVP_OFFSET


def host_ip(i: int) -> str:
    return f"10.0.0.{i}"


def host_mac(i: int) -> str:
    return f"00:00:00:00:00:{i:02x}"


class RefSwitchBridge(LoopThread):
    """The reference switch between loopback fetch clients and a loopback pool server.

    Args:
        pool_addr: the real pool server's UDP address.
    """

    def __init__(self, pool_addr: Address) -> None:
        super().__init__("refbridge")
        self.pool_addr = pool_addr
        self.target = InProcessRefTarget()
        self.client = self.target.client
        self.lock = threading.Lock()
        self._hosts: dict[int, int] = {}  # client loopback port -> host index
        self._agents: dict[int, Address] = {}  # host index -> where its replicas go
        self._pool_socks: dict[tuple[int, int], socket.socket] = {}  # (host, port) -> socket
        self._pool_owner: dict[int, tuple[int, int]] = {}  # socket fd -> (host, port)
        self._vip = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._vip.bind(("127.0.0.1", 0))
        self._program()

    @property
    def vip(self) -> Address:
        """Where clients send GETs (the switch VIP)."""
        host, port = self._vip.getsockname()
        return str(host), int(port)

    def register(self, addr: Address) -> int:
        """Attaches a client as the next emulated host; its replicas go to ``addr``.

        Returns:
            The host's index (its switch port and replica id).
        """
        i = len(self._agents) + 1
        if i > MAX_HOSTS:
            raise ValueError(f"the bridge emulates at most {MAX_HOSTS} hosts")
        self._hosts[addr[1]] = i
        self._agents[i] = ("127.0.0.1", addr[1])
        return i

    def add_group(self, group: int, hosts: list[int]) -> None:
        """Creates multicast group ``group`` over host indexes (replica id = port, member)."""
        self.client.multicast_group(group, [(i, i) for i in hosts])
        for i in hosts:
            self.client.insert(
                c.TABLE_INGRESS_PORT_ROLE_GROUP_MEMBER,
                {"group": group, "port": i},
                c.ACTION_INGRESS_PORT_ROLE_MEMBER,
                {},
            )

    def load_chunk(self, tenant: int, key: int, data: bytes, slot_base: int, epoch: int) -> int:
        """Loads a chunk into switch SRAM (WRITE PacketOuts, then the cache entry)."""
        with self.lock:
            return self.client.load_chunk(tenant, key, data, slot_base, epoch)

    def _program(self) -> None:
        cl, t = self.client, c
        smac = mac_int(SWITCH_MAC)
        nodes = [(i, host_ip(i), host_mac(i)) for i in range(1, MAX_HOSTS + 1)]
        for port, ip, mac in [*nodes, (POOL_PORT, POOL_IP, POOL_MAC)]:
            cl.insert(
                t.TABLE_INGRESS_FORWARDING_IPV4_LPM,
                {"dst_addr": Lpm(ip_int(ip), 32)},
                t.ACTION_INGRESS_FORWARDING_ROUTE,
                {"port": port, "smac": smac, "dmac": mac_int(mac)},
            )
        for i, ip, mac in nodes:
            # Each host's port bound to its address, any tenant (an unknown port is denied).
            cl.insert(
                t.TABLE_INGRESS_PORT_ROLE_PORT_ROLE,
                {"port": i},
                t.ACTION_INGRESS_PORT_ROLE_BIND_HOST,
                {"addr": ip_int(ip), "check_tenant": 0},
            )
            cl.insert(
                t.TABLE_EGRESS_REPLICA_REPLICA_DST,
                {"rid": i},
                t.ACTION_EGRESS_REPLICA_SET_REPLICA_DST,
                {"dmac": mac_int(mac), "dip": ip_int(ip), "dport": AGENT_PORT},
            )
        cl.set_pool_node(POOL_PORT, ip_int(POOL_IP))

    # ------------------------------------------------------------------ data path
    def _loop(self) -> None:
        while not self._stop.is_set():
            socks = [self._vip, *self._pool_socks.values()]
            ready, _, _ = select.select(socks, [], [], 0.01)
            for sock in ready:
                try:
                    data, peer = sock.recvfrom(65536)
                except OSError:
                    continue
                with self.lock:
                    if sock is self._vip:
                        self._from_host(data, peer)
                    else:
                        self._from_pool(data, self._pool_owner[sock.fileno()])

    def _from_host(self, data: bytes, peer: Address) -> None:
        i = self._hosts.get(peer[1])
        if i is None:
            i = self.register(peer)
        frame = wire.udp_frame(
            host_mac(i), SWITCH_MAC, host_ip(i), VIP, peer[1], c.KVP_UDP_PORT, data
        )
        self._run(i, frame)

    def _from_pool(self, data: bytes, requester: tuple[int, int]) -> None:
        i, port = requester
        frame = wire.udp_frame(
            POOL_MAC, SWITCH_MAC, POOL_IP, host_ip(i), c.KVP_UDP_PORT, port, data
        )
        self._run(POOL_PORT, frame)

    def _run(self, port: int, frame: bytes) -> None:
        for out in self.target.pipeline.process(port, frame):
            self._emit(out.port, out.frame)

    def _emit(self, port: int, frame: bytes) -> None:
        total = struct.unpack_from("!H", frame, 16)[0]
        payload = frame[_K : 14 + total]
        src_ip = socket.inet_ntoa(frame[26:30])
        sport, dport = struct.unpack_from("!HH", frame, 34)
        if port == POOL_PORT:
            host = int(src_ip.rsplit(".", 1)[1])
            sock = self._pool_socks.get((host, sport))
            if sock is None:
                sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                sock.bind(("127.0.0.1", 0))
                self._pool_socks[(host, sport)] = sock
                self._pool_owner[sock.fileno()] = (host, sport)
            sock.sendto(payload, self.pool_addr)
        elif 1 <= port <= MAX_HOSTS:
            dest = self._agents.get(port) if dport == AGENT_PORT else ("127.0.0.1", dport)
            if dest is not None:
                self._vip.sendto(payload, dest)

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Closes the bridge's sockets and the switch (after ``stop`` has ended the loop)."""
        for sock in [self._vip, *self._pool_socks.values()]:
            sock.close()
        self.target.close()
