"""Fake KVP peers for fetch-client tests: a UDP server whose answers come from a function.

``LoopThread`` (a loop on a thread, run by ``with``) and ``UdpLoop`` (one on a loopback UDP
socket) are the bases of ``FakeServer``, ``MulticastRelay`` and the reference-switch bridge.
Responders build on the real pool-node handler and then drop, corrupt, duplicate, reorder or
mislabel its replies, or play the switch (HIT: the requested fragment only, from "SRAM").
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Callable

from kvcast import p4constants as c
from kvcast.backend import InMemoryBackend
from kvcast.lifecycle import Service
from kvcast.wire import KVP_STRUCT, KvpHeader, data_message, fragment_crc
from poolnode.groups import ANY_GROUP
from poolnode.server import KvpGetHandler

Respond = Callable[[bytes], list[bytes]]
Address = tuple[str, int]
Mangle = Callable[[Address, bytes], bytes | None]


class LoopThread(Service):
    """``_loop`` on a daemon thread from ``start()`` until ``stop()``, then ``close()``.

    ``_loop`` runs until ``self._stop`` is set; ``with`` starts and stops it.

    Args:
        name: the thread's name (None: Python's default).
    """

    def __init__(self, name: str | None = None) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def _loop(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        """Starts the loop's thread."""
        self._thread.start()

    def stop(self) -> None:
        """Ends the loop, waits for its thread, then closes what the service holds."""
        self._stop.set()
        self._thread.join()
        self.close()

    def close(self) -> None:
        """Frees what the service holds once its thread has ended (subclasses override it)."""


class UdpLoop(LoopThread):
    """A loop serving one UDP socket on 127.0.0.1 (a free port, 10 ms receive timeout)."""

    def __init__(self) -> None:
        super().__init__()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.settimeout(0.01)

    @property
    def address(self) -> Address:
        """The socket's address."""
        host, port = self._sock.getsockname()
        return host, port

    def close(self) -> None:
        """Closes the socket."""
        self._sock.close()


class FakeServer(UdpLoop):
    """A UDP server on 127.0.0.1 answering each datagram with ``respond(datagram)``.

    ``idle()`` of the responder, if it has one, runs whenever 10 ms pass without a datagram.
    """

    def __init__(self, respond: Respond) -> None:
        super().__init__()
        self.respond = respond
        self.received = 0
        self._peer: Address | None = None

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                data, peer = self._sock.recvfrom(65536)
            except TimeoutError:
                idle = getattr(self.respond, "idle", None)
                if idle is not None and self._peer is not None:
                    for out in idle():
                        self._sock.sendto(out, self._peer)
                continue
            self.received += 1
            self._peer = peer
            for out in self.respond(data):
                self._sock.sendto(out, peer)


def pool(backend: InMemoryBackend) -> Respond:
    """The real pool-node logic, behind a switch that checks group membership (any group)."""
    handler = KvpGetHandler(backend, groups=ANY_GROUP)
    return lambda d: [h + bytes(p) for h, p in handler.handle(d)]


def silent(_datagram: bytes) -> list[bytes]:
    """Never answers."""
    return []


class Gate:
    """The pool, but it answers nothing until GETs for ``need`` different chunks have come.

    A client (or a loader) that waits for one chunk before it asks for the next never gets an
    answer.
    """

    def __init__(self, backend: InMemoryBackend, need: int) -> None:
        self.inner = pool(backend)
        self.need = need
        self.keys: set[int] = set()
        self.held: list[bytes] = []
        self.lock = threading.Lock()

    def __call__(self, datagram: bytes) -> list[bytes]:
        with self.lock:
            if len(self.keys) >= self.need:
                return self.inner(datagram)
            self.keys.add(KvpHeader.unpack(datagram).key)
            self.held.append(datagram)
            if len(self.keys) < self.need:
                return []
            held, self.held = self.held, []
        return [reply for d in held for reply in self.inner(d)]


class Corrupting:
    """The pool, but the first DATA carrying fragment ``frag`` has one payload byte flipped."""

    def __init__(self, backend: InMemoryBackend, frag: int) -> None:
        self.inner = pool(backend)
        self.frag = frag
        self.done = False

    def __call__(self, datagram: bytes) -> list[bytes]:
        out = []
        for reply in self.inner(datagram):
            hdr = KvpHeader.unpack(reply)
            n = -(-hdr.payload_len // c.FRAG_BYTES)
            if not self.done and hdr.op == c.KVP_OP_DATA and hdr.frag_idx <= self.frag:
                if self.frag < hdr.frag_idx + n:
                    self.done = True
                    flip = bytearray(reply)
                    flip[c.KVP_HDR_BYTES + (self.frag - hdr.frag_idx) * c.FRAG_BYTES] ^= 0xFF
                    reply = bytes(flip)
            out.append(reply)
        return out


class Dropping:
    """The pool, but the first answer to a GET starting at a fragment in ``frags`` is lost
    (the first ``times[f]`` answers for a fragment ``f`` in ``times``)."""

    def __init__(
        self, backend: InMemoryBackend, frags: set[int], times: dict[int, int] | None = None
    ) -> None:
        self.inner = pool(backend)
        self.pending = set(frags)
        self.times = dict(times or {})

    def __call__(self, datagram: bytes) -> list[bytes]:
        first = KvpHeader.unpack(datagram).frag_idx
        if first in self.pending:
            self.pending.discard(first)
            return []
        if self.times.get(first, 0) > 0:
            self.times[first] -= 1
            return []
        return self.inner(datagram)


class Recording:
    """The pool, keeping the header of every datagram it was sent in ``seen``."""

    def __init__(self, backend: InMemoryBackend) -> None:
        self.inner = pool(backend)
        self.seen: list[KvpHeader] = []

    def __call__(self, datagram: bytes) -> list[bytes]:
        self.seen.append(KvpHeader.unpack(datagram))
        return self.inner(datagram)


class Stalling:
    """The pool, but it stalls once for ``stall_s`` before answering the ``at``-th GET.

    As a pool node or switch that loses its CPU for a while: nothing is lost, the GETs wait in
    the socket's queue and are all answered after the stall.
    """

    def __init__(self, backend: InMemoryBackend, at: int, stall_s: float) -> None:
        self.inner = pool(backend)
        self.at = at
        self.stall_s = stall_s
        self.seen = 0

    def __call__(self, datagram: bytes) -> list[bytes]:
        self.seen += 1
        if self.seen == self.at:
            time.sleep(self.stall_s)
        return self.inner(datagram)


class DuplicatingReordering:
    """The pool, but replies are held, then sent newest first, each twice."""

    def __init__(self, backend: InMemoryBackend, batch: int = 3) -> None:
        self.inner = pool(backend)
        self.batch = batch
        self.held: list[bytes] = []

    def __call__(self, datagram: bytes) -> list[bytes]:
        self.held.extend(self.inner(datagram))
        return self.idle() if len(self.held) >= self.batch else []

    def idle(self) -> list[bytes]:
        out = [r for r in reversed(self.held) for _ in range(2)]
        self.held = []
        return out


class Mislabelling:
    """The pool, preceded by look-alike DATA of bogus bytes with valid CRCs for each GET: one
    under another key, one under another request id, one for another tenant."""

    def __init__(self, backend: InMemoryBackend) -> None:
        self.inner = pool(backend)

    def __call__(self, datagram: bytes) -> list[bytes]:
        g = KvpHeader.unpack(datagram)
        real = self.inner(datagram)
        fakes = []
        for reply in real:
            hdr = KvpHeader.unpack(reply)
            if hdr.op != c.KVP_OP_DATA:
                continue
            bogus = bytes([0xA5]) * hdr.payload_len
            for tenant, key, req_id in (
                (g.tenant, g.key ^ 1, g.req_id),
                (g.tenant, g.key, g.req_id ^ 0x5A5A),
                (g.tenant ^ 1, g.key, g.req_id),
            ):
                fakes.append(
                    data_message(tenant, key, hdr.frag_idx, hdr.frag_count, bogus, req_id=req_id)
                )
        return fakes + real


class Switch:
    """A switch holding ``chunk`` in SRAM for fragments below ``hit_below``: a GET for such a
    fragment comes back as DATA with HIT and that one fragment, padded to FRAG_BYTES as the
    switch rewrites the GET in place; any other GET goes to ``behind`` (the pool owner)."""

    def __init__(
        self, tenant: int, key: int, chunk: bytes, hit_below: int, behind: Respond, epoch: int = 9
    ) -> None:
        self.tenant, self.key, self.chunk = tenant, key, chunk
        self.hit_below, self.behind, self.epoch = hit_below, behind, epoch
        self.frag_count = -(-len(chunk) // c.FRAG_BYTES)

    def __call__(self, datagram: bytes) -> list[bytes]:
        fields = list(KVP_STRUCT.unpack_from(datagram))
        flags, tenant, key, frag_idx = fields[1], fields[4], fields[6], fields[9]
        cached = (tenant, key) == (self.tenant, self.key) and not flags & c.KVP_FLAG_NOCACHE
        if not cached or frag_idx >= self.hit_below:
            return self.behind(datagram)
        frag = self.chunk[frag_idx * c.FRAG_BYTES : (frag_idx + 1) * c.FRAG_BYTES]
        fields[0] = (c.KVP_VERSION << 4) | c.KVP_OP_DATA
        fields[1] = flags | c.KVP_FLAG_HIT
        fields[8] = self.epoch
        fields[10] = self.frag_count
        fields[11] = len(frag)
        fields[14] = fragment_crc(tenant, key, frag_idx, frag)
        return [KVP_STRUCT.pack(*fields) + frag.ljust(c.FRAG_BYTES, b"\0")]


class Replicating:
    """The pool's answers delivered as multicast replicas of another host's request: REPLICA
    flag, ``group``, and a request id this host never used."""

    def __init__(self, backend: InMemoryBackend, group: int) -> None:
        self.inner = pool(backend)
        self.group = group

    def __call__(self, datagram: bytes) -> list[bytes]:
        out = []
        for reply in self.inner(datagram):
            raw = bytearray(reply)
            raw[1] |= c.KVP_FLAG_REPLICA
            struct.pack_into("!H", raw, 6, self.group)
            rid = struct.unpack_from("!I", raw, 16)[0]
            struct.pack_into("!I", raw, 16, rid ^ 0x80000001)
            out.append(bytes(raw))
        return out


class Partial:
    """The pool for fragments below ``upto``; silence for the rest."""

    def __init__(self, backend: InMemoryBackend, upto: int) -> None:
        self.inner = pool(backend)
        self.upto = upto

    def __call__(self, datagram: bytes) -> list[bytes]:
        g = KvpHeader.unpack(datagram)
        if g.frag_idx >= self.upto:
            return []
        count = min(g.frag_count, self.upto - g.frag_idx)
        return self.inner(datagram[:26] + struct.pack("!H", count) + datagram[28:])


class MulticastRelay(UdpLoop):
    """A fake switch VIP with multicast, on loopback.

    GETs are answered by the real pool-node handler. A DATA answering a GET that names a group
    is sent, with ``REPLICA`` set, to every member address of that group (the requester only
    gets it as a member, as from the real switch); ``mangle(member, datagram)`` may return an
    altered copy or ``None`` to lose it. Replies to GETs without a group, and NACKs, go back to
    the requester. ``gets`` counts the GETs received per requester address.
    """

    def __init__(
        self,
        backend: InMemoryBackend,
        groups: dict[int, list[Address]],
        mangle: Mangle | None = None,
    ) -> None:
        super().__init__()
        self.handler = KvpGetHandler(backend, groups=ANY_GROUP)
        self.groups = groups
        self.mangle = mangle
        self.gets: dict[Address, int] = {}
        self.data_sent = 0

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                data, peer = self._sock.recvfrom(65536)
            except TimeoutError:
                continue
            self.gets[peer] = self.gets.get(peer, 0) + 1
            group = KvpHeader.unpack(data).group
            for header, payload in self.handler.handle(data):
                reply = header + bytes(payload)
                if reply[0] & 0xF != c.KVP_OP_DATA or group == 0:
                    self._sock.sendto(reply, peer)
                    continue
                self.data_sent += 1
                raw = bytearray(reply)
                raw[1] |= c.KVP_FLAG_REPLICA
                for member in self.groups.get(group, []):
                    out = bytes(raw) if self.mangle is None else self.mangle(member, bytes(raw))
                    if out is not None:
                        self._sock.sendto(out, member)
