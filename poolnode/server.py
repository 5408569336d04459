"""The pool-node KVP server: answers GETs for chunk fragments from a ``PoolBackend``.

A GET reaches a pool node when the switch misses (or the GET carries ``NOCACHE``) and rewrites
its destination to the key's pool owner, or when a host asks the pool directly. For
``GET(tenant, key, frag_idx, count)`` the node sends DATA messages covering fragments
``frag_idx .. frag_idx + count - 1``, several consecutive fragments per DATA up to the MTU, with
flag ``POOL``, the GET's ``group`` and ``req_id``, and a CRC per DATA (``kvcast.wire``), to the
GET's source address (the requester's ip:port: the switch rewrote only the destination). It
answers ``NACK NOT_FOUND`` for an unknown chunk, ``NACK BAD_REQUEST`` for a fragment range
outside the chunk or a GET without its one-fragment placeholder, and ``NACK UNAVAILABLE`` when
the backend fails, or does not find a chunk while the node is putting its chunks back into a
restarted store (``KvpGetHandler.recovering``): "not yet", not "never".
Datagrams that are not KVP at all are counted and dropped; nothing a peer sends can stop the
server.

Classes:
    ServerStats: counters of everything the server received, sent, refused and dropped.
    ChunkCache: a byte-bounded LRU of recently served chunks, so a burst of GETs for one chunk
        reads the backend once.
    KvpGetHandler: the protocol logic, transport-free: one datagram in, the replies out.
    DataAnswer: a served GET before its DATAs are built (what the native send takes).
    PoolServer: a UDP socket loop in a thread (``start``/``stop``) or in the caller
        (``serve_forever``).
    AsyncPoolServerProtocol: the same handler as an asyncio ``DatagramProtocol``.
"""

from __future__ import annotations

import asyncio
import logging
import select
import socket
from collections import OrderedDict
from dataclasses import asdict, dataclass
from types import ModuleType
from typing import Any, NamedTuple, cast

from kvcast import p4constants as c
from kvcast.backend import PoolBackend
from kvcast.kvp import DEFAULT_MTU, frag_count, frags_per_data
from kvcast.lifecycle import Service
from kvcast.native import enabled as native_enabled
from kvcast.wire import KVP_STRUCT, VALID_OPS, KvpHeader, fragment_crc, nack_message
from poolnode.groups import GroupSource
from poolnode.tenants import SourceTenants
from poolnode.threads import BackgroundThread

log = logging.getLogger(__name__)

MAX_GET_FRAGMENTS = 256
"""The most fragments a GET may ask a pool node for (64 KiB of 256-byte fragments)."""

_GET_BYTES = c.KVP_HDR_BYTES + c.FRAG_BYTES
_DATA_VO = (c.KVP_VERSION << 4) | c.KVP_OP_DATA
_EMPTY = memoryview(b"")
_RX_SLOT = 65536  # one datagram of any UDP size per slot of the native receive batch
# The most DATAs per UDP GSO message where a pool node sends with GSO (PoolServer(gso=True)):
# the kernel's limit; kvcast._native also keeps a message within 65,507 bytes, so jumbo DATAs
# (8,744 bytes) go 7 at a time and 1,320-byte ones 49.
GSO_DATAS = 64

Reply = tuple[bytes, memoryview]
"""One datagram to send: the KVP header and the payload (empty for a NACK)."""


class DataAnswer(NamedTuple):
    """A GET the pool node serves, before its DATAs are built.

    Attributes:
        header: the 40-byte DATA header shared by every DATA of the answer (flag ``POOL``, the
            GET's tenant, group, key and request id, the chunk's ``frag_count``), with
            ``frag_idx``, ``payload_len`` and ``crc`` zero: each DATA fills them in.
        chunk: the chunk's bytes.
        first: the first fragment asked for.
        end: one past the last fragment asked for (within the chunk).
        wire_bytes: the UDP payload bytes of all its DATAs (headers included): what a send
            that dropped nothing reports.
        crcs: the chunk's DATA CRC table from the chunk cache (``crc_slots``), or None when
            the chunk is not cached.
    """

    header: bytes
    chunk: memoryview
    first: int
    end: int
    wire_bytes: int
    crcs: bytearray | None = None


@dataclass(slots=True)
class ServerStats:
    """What a pool-node server saw and did (monotonic counters).

    ``data_sent`` counts DATA messages and ``data_payload_bytes`` their fragment bytes (what the
    handler produced); ``bytes_sent`` counts the UDP payload bytes the socket accepted (DATA and
    NACK, headers included); ``duplicate_gets`` the copies of a recent GET left unanswered;
    ``oversized_gets`` the GETs refused for asking more than ``max_get_fragments``;
    ``unknown_groups`` those refused for naming a group the node was not told about (every
    group, by default); ``bad_tenants`` those refused for naming a tenant their source address
    is not bound to, and ``unknown_sources`` those from an address the node's tenant list does
    not name (both only with a list, ``SourceTenants``); ``bad_ranges`` those refused for a
    fragment range the chunk it holds does not have (a requester that expects another length).
    """

    datagrams: int = 0
    gets: int = 0
    data_sent: int = 0
    data_payload_bytes: int = 0
    bytes_sent: int = 0
    nack_not_found: int = 0
    nack_bad_request: int = 0
    nack_unavailable: int = 0
    malformed: int = 0
    unexpected_op: int = 0
    duplicate_gets: int = 0
    oversized_gets: int = 0
    unknown_groups: int = 0
    bad_tenants: int = 0
    unknown_sources: int = 0
    bad_ranges: int = 0
    cache_hits: int = 0
    backend_reads: int = 0
    send_errors: int = 0
    internal_errors: int = 0

    def as_dict(self) -> dict[str, int]:
        """The counters by name."""
        return asdict(self)


def crc_slots(nbytes: int) -> bytearray:
    """An empty table of DATA CRCs for a chunk of ``nbytes`` (``kvcast._native.send_data``).

    8 bytes per fragment: the CRC of the last DATA sent that starts at that fragment and its
    ``payload_len + 1`` (0: none yet), as two native-endian uint32.
    """
    return bytearray(8 * frag_count(nbytes))


class ChunkCache:
    """Recently served chunks, least recently used evicted first, bounded in bytes.

    Keys are content hashes, so a cached chunk never goes stale; a deleted one may be served
    until it is evicted or invalidated. With each chunk the cache keeps a table of the CRCs of
    the DATAs sent from it (``crc_slots``, 1/32 of the chunk's size, counted in the bound): it
    lives and dies with the chunk's bytes it was computed from.

    Args:
        max_bytes: total size bound; 0 disables caching.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.used = 0
        self._items: OrderedDict[tuple[int, int], tuple[memoryview, bytearray]] = OrderedDict()

    def get(self, tenant: int, key: int) -> memoryview | None:
        """The cached chunk, marked as recently used, or ``None``."""
        item = self.entry(tenant, key)
        return None if item is None else item[0]

    def entry(self, tenant: int, key: int) -> tuple[memoryview, bytearray] | None:
        """The cached chunk and its DATA CRC table (``crc_slots``), marked as recently used."""
        item = self._items.get((tenant, key))
        if item is not None:
            self._items.move_to_end((tenant, key))
        return item

    def crcs(self, tenant: int, key: int) -> bytearray | None:
        """The cached chunk's DATA CRC table, or ``None`` if it is not cached."""
        item = self._items.get((tenant, key))
        return None if item is None else item[1]

    def put(self, tenant: int, key: int, data: memoryview) -> None:
        """Caches a chunk unless it alone exceeds the bound; evicts the least recently used."""
        table = crc_slots(len(data))
        if len(data) + len(table) > self.max_bytes:
            return
        self.invalidate(tenant, key)
        self._items[(tenant, key)] = (data, table)
        self.used += len(data) + len(table)
        while self.used > self.max_bytes:
            _, (evicted, slots) = self._items.popitem(last=False)
            self.used -= len(evicted) + len(slots)

    def invalidate(self, tenant: int, key: int) -> None:
        """Forgets a chunk (and its CRCs)."""
        old = self._items.pop((tenant, key), None)
        if old is not None:
            self.used -= len(old[0]) + len(old[1])

    def __len__(self) -> int:
        return len(self._items)


class KvpGetHandler:
    """The pool node's protocol logic, independent of the transport.

    Args:
        backend: where chunks are read from.
        mtu: IP MTU the DATA messages must fit in.
        cache_bytes: size of the recently-served chunk cache (0: read the backend per GET).
        stats: counters to update (a fresh ``ServerStats`` by default).
        dedup_window: how many recent GETs are remembered to drop a duplicate of one (the
            same tenant, key, group, request id and fragment range: the network delivered a
            GET twice); 0 answers every copy. A client's retry has a new request id and is
            always answered.
        max_get_fragments: the most fragments one GET may ask for; a GET asking for more is
            refused (NACK BAD_REQUEST, counted in ``oversized_gets``), so no 338-byte request
            makes the node send more than this many fragments (docs/security.md).
        groups: the groups the node may echo (poolnode.groups); a GET naming another is
            refused (NACK BAD_REQUEST, counted in ``unknown_groups``). None (the default): no
            group at all; ``poolnode.groups.ANY_GROUP`` explicitly allows every group (the
            switch's membership check alone).
        tenants: the tenants each source address may name (poolnode.tenants); a GET naming
            another is refused (NACK BAD_REQUEST, ``bad_tenants``), as is one from an unlisted
            address (``unknown_sources``). None (the default): no tenant check here (the
            switch's ``tenant_binding`` alone).

    Raises:
        ValueError: the MTU cannot carry one fragment.
    """

    def __init__(
        self,
        backend: PoolBackend,
        mtu: int = DEFAULT_MTU,
        cache_bytes: int = 64 << 20,
        stats: ServerStats | None = None,
        dedup_window: int = 8192,
        max_get_fragments: int = MAX_GET_FRAGMENTS,
        groups: GroupSource | None = None,
        tenants: SourceTenants | None = None,
    ) -> None:
        self.backend = backend
        self.tenants = tenants
        self.max_get_fragments = max_get_fragments
        self.groups = groups
        self.dedup_window = dedup_window
        self._recent: OrderedDict[tuple[int, int, int, int, int, int], None] = OrderedDict()
        self.frags_per_data = frags_per_data(mtu)
        self.cache = ChunkCache(cache_bytes)
        self.stats = stats or ServerStats()
        self.recovering = False
        """Set while the store is being refilled (its master restarted): a chunk not found is
        answered UNAVAILABLE, so the requester retries later instead of giving it up."""

    def _read(self, tenant: int, key: int) -> tuple[memoryview, bytearray | None] | None:
        """The chunk (None: not found) and its CRC table, None when it is not cached.

        Always the pair the cache holds together, so a table never describes other bytes.
        """
        item = self.cache.entry(tenant, key)
        if item is not None:
            self.stats.cache_hits += 1
            return item
        self.stats.backend_reads += 1
        size = self.backend.size(tenant, key)
        if size is None:
            return None
        buf = memoryview(bytearray(size))
        n = self.backend.get_into(tenant, key, buf)
        if n is None:
            return None
        chunk = buf[:n]
        self.cache.put(tenant, key, chunk)
        item = self.cache.entry(tenant, key)
        return item if item is not None and item[0] is chunk else (chunk, None)

    def handle(
        self, datagram: bytes | bytearray | memoryview, source: int | None = None
    ) -> list[Reply]:
        """Answers one datagram.

        Args:
            datagram: the UDP payload received.
            source: the sender's IPv4 address as an int (for the tenant check; None: unknown).

        Returns:
            The datagrams to send back to the sender, in order (none for a dropped datagram).
        """
        answer = self.answer(datagram, source)
        if type(answer) is DataAnswer:
            return self.data_replies(answer)
        return cast(list[Reply], answer)

    def answer(
        self, datagram: bytes | bytearray | memoryview, source: int | None = None
    ) -> list[Reply] | DataAnswer:
        """Decides the answer to one datagram without building its DATAs.

        Every check and counter of ``handle`` happens here; a GET that is served comes back as
        a ``DataAnswer`` (its DATAs are counted in ``stats`` already), which ``data_replies``
        turns into datagrams, or which ``kvcast._native.send_data`` sends directly.

        Args:
            datagram: the UDP payload received.
            source: the sender's IPv4 address as an int (for the tenant check; None: unknown,
                refused when the node checks tenants).

        Returns:
            The datagrams to send (a NACK, or none for a dropped datagram), or the range to
            serve.
        """
        stats = self.stats
        stats.datagrams += 1
        if len(datagram) < c.KVP_HDR_BYTES:
            stats.malformed += 1
            return []
        (vo, flags, _st, _r0, tenant, group, key, req_id, _ep, frag_idx, count, *_rest) = (
            KVP_STRUCT.unpack_from(datagram)
        )
        op = vo & 0xF
        if vo >> 4 != c.KVP_VERSION or op not in VALID_OPS:
            stats.malformed += 1
            return []
        if op != c.KVP_OP_GET:
            stats.unexpected_op += 1
            return []
        stats.gets += 1
        request = (op, flags, tenant, group, key, req_id, frag_idx, count)
        if len(datagram) != _GET_BYTES:
            return self._nack(request, c.KVP_STATUS_BAD_REQUEST)
        if count > self.max_get_fragments:
            stats.oversized_gets += 1
            return self._nack(request, c.KVP_STATUS_BAD_REQUEST)
        if group and (self.groups is None or not self.groups.allows(group)):
            stats.unknown_groups += 1
            return self._nack(request, c.KVP_STATUS_BAD_REQUEST)
        tenants = self.tenants
        if tenants is not None:
            if source is None or not tenants.known(source):
                stats.unknown_sources += 1
                return self._nack(request, c.KVP_STATUS_BAD_REQUEST)
            if not tenants.allows(source, tenant):
                stats.bad_tenants += 1
                return self._nack(request, c.KVP_STATUS_BAD_REQUEST)
        if self.dedup_window:
            ident = (tenant, key, group, req_id, frag_idx, count)
            recent = self._recent
            if ident in recent:
                stats.duplicate_gets += 1
                return []
            recent[ident] = None
            if len(recent) > self.dedup_window:
                recent.popitem(last=False)
        try:
            read = self._read(tenant, key)
        except Exception as exc:  # any backend failure is "try again later", never a crash
            log.warning("backend read of tenant %d key %#x failed: %s", tenant, key, exc)
            return self._nack(request, c.KVP_STATUS_UNAVAILABLE)
        if read is None:
            if self.recovering:
                return self._nack(request, c.KVP_STATUS_UNAVAILABLE)
            return self._nack(request, c.KVP_STATUS_NOT_FOUND)
        chunk, crcs = read
        size = len(chunk)
        nfrags = frag_count(size)
        end = frag_idx + count
        if count == 0 or end > nfrags:
            stats.bad_ranges += 1
            return self._nack(request, c.KVP_STATUS_BAD_REQUEST)
        header = KVP_STRUCT.pack(
            _DATA_VO, c.KVP_FLAG_POOL, c.KVP_STATUS_OK, 0, tenant, group, key, req_id, 0, 0,
            nfrags, 0, 0, 0, 0,
        )  # fmt: skip
        datas = -(-count // self.frags_per_data)
        payload = (end * c.FRAG_BYTES if end < nfrags else size) - frag_idx * c.FRAG_BYTES
        stats.data_sent += datas
        stats.data_payload_bytes += payload
        return DataAnswer(header, chunk, frag_idx, end, payload + datas * c.KVP_HDR_BYTES, crcs)

    def data_replies(self, answer: DataAnswer) -> list[Reply]:
        """The DATAs of a served GET, built in Python.

        ``kvcast._native.send_data`` builds the same bytes in C.

        Args:
            answer: what ``answer`` decided.

        Returns:
            One (header, payload) per DATA: ``frags_per_data`` fragments each, the last one
            ending at the range's (or the chunk's) end, the header ``answer.header`` with
            ``frag_idx``, ``payload_len`` and ``crc`` filled in.
        """
        header, chunk, frag_idx, end, _, _ = answer
        (_vo, _fl, _st, _r0, tenant, group, key, req_id, _ep, _fi, nfrags, *_rest) = (
            KVP_STRUCT.unpack(header)
        )
        size = len(chunk)
        replies: list[Reply] = []
        step = self.frags_per_data
        for first in range(frag_idx, end, step):
            lo = first * c.FRAG_BYTES
            hi = min(min(first + step, end) * c.FRAG_BYTES, size)
            payload = chunk[lo:hi]
            data_header = KVP_STRUCT.pack(
                _DATA_VO,
                c.KVP_FLAG_POOL,
                c.KVP_STATUS_OK,
                0,
                tenant,
                group,
                key,
                req_id,
                0,
                first,
                nfrags,
                hi - lo,
                0,
                0,
                fragment_crc(tenant, key, first, payload),
            )
            replies.append((data_header, payload))
        return replies

    def _nack(self, request: tuple[int, ...], status: int) -> list[Reply]:
        if status == c.KVP_STATUS_NOT_FOUND:
            self.stats.nack_not_found += 1
        elif status == c.KVP_STATUS_BAD_REQUEST:
            self.stats.nack_bad_request += 1
        else:
            self.stats.nack_unavailable += 1
        op, flags, tenant, group, key, req_id, frag_idx, count = request
        header = KvpHeader(
            op, flags, 0, tenant, group, key, req_id, frag_idx=frag_idx, frag_count=count
        )
        return [(nack_message(header, status), _EMPTY)]


class PoolServer(Service):
    """A pool node's UDP server: a blocking socket loop that answers KVP GETs.

    ``start()`` runs the loop in a daemon thread (tests, embedding); ``serve_forever()`` runs it
    in the calling thread (the ``python -m poolnode`` daemon). A fragment is never copied in
    Python: the native path sends from the chunk's buffer, the Python path with one ``sendmsg``
    of header and payload view.

    Args:
        backend: where chunks are read from.
        host: address to bind.
        port: UDP port (0: an ephemeral one, see ``address``).
        mtu: IP MTU the DATA messages must fit in.
        cache_bytes: size of the recently-served chunk cache.
        socket_buffer_bytes: SO_RCVBUF/SO_SNDBUF to ask for.
        groups: the groups the node may echo (None: none), see ``KvpGetHandler``.
        tenants: the tenants each source address may name (None: no check here), see
            ``KvpGetHandler``.
        gso: send a served GET's DATAs as UDP GSO messages (up to ``GSO_DATAS`` DATAs each, cut
            into the same datagrams by the kernel or the NIC; native data path only): for a node
            whose DATAs leave through a NIC or loopback. Not behind a software switch that
            reads raw frames from a veth (the emulated cluster): it would see one giant frame.
            A GSO send the kernel refuses turns it off (logged) and goes again without it.
    """

    def __init__(
        self,
        backend: PoolBackend,
        host: str = "0.0.0.0",
        port: int = c.KVP_UDP_PORT,
        mtu: int = DEFAULT_MTU,
        cache_bytes: int = 64 << 20,
        socket_buffer_bytes: int = 4 << 20,
        groups: GroupSource | None = None,
        gso: bool = False,
        tenants: SourceTenants | None = None,
    ) -> None:
        self.handler = KvpGetHandler(backend, mtu, cache_bytes, groups=groups, tenants=tenants)
        self.gso = GSO_DATAS if gso else 0
        self.stats = self.handler.stats
        self._bind = (host, port)
        self._buffer_bytes = socket_buffer_bytes
        self._sock: socket.socket | None = None
        self._serving = BackgroundThread(self.serve_forever, "kvcast-poolserver")

    @property
    def address(self) -> tuple[str, int]:
        """The bound ``(host, port)``.

        Raises:
            RuntimeError: the server is not bound yet.
        """
        if self._sock is None:
            raise RuntimeError("PoolServer is not bound: call start() or bind() first")
        host, port = self._sock.getsockname()[:2]
        return str(host), int(port)

    def bind(self) -> socket.socket:
        """Binds the UDP socket (once).

        Returns:
            The socket.

        Raises:
            OSError: the address is taken or not local.
        """
        if self._sock is None:
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self._buffer_bytes)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self._buffer_bytes)
                sock.bind(self._bind)
            except OSError:
                sock.close()
                raise
            sock.settimeout(0.1)
            self._sock = sock
        return self._sock

    def serve_forever(self) -> None:
        """Answers datagrams in the calling thread until ``stop()``.

        Where kvcast._native is in use, GETs are received in batches (``recvmmsg``) and a
        served GET's DATAs are built (headers, CRCs) and sent in C with ``sendmmsg``
        (``send_data``); else each GET is one ``recvfrom`` and ``KvpGetHandler.data_replies``
        builds its DATAs, each leaving with one ``sendmsg``.
        """
        sock = self.bind()
        nat = native_enabled()
        if nat is not None:
            self._serve_native(sock, nat)
            return
        answer = self.handler.answer
        data_replies = self.handler.data_replies
        stats = self.stats
        stopping = self._serving.stopping
        buf = bytearray(65536)
        view = memoryview(buf)
        while not stopping.is_set():
            try:
                n, addr = sock.recvfrom_into(buf)
            except TimeoutError:
                continue
            except OSError as exc:
                if stopping.is_set():
                    break
                log.warning("recvfrom failed: %s", exc)
                continue
            try:
                reply = answer(view[:n], _ip_int(addr[0]))
                if type(reply) is DataAnswer:
                    replies = data_replies(reply)
                else:
                    replies = cast(list[Reply], reply)
            except Exception:  # a bug must not take the pool node down
                stats.internal_errors += 1
                log.exception("handler failed on a %d-byte datagram from %s", n, addr)
                continue
            self._send_replies(sock, replies, addr)

    def _send_replies(self, sock: socket.socket, replies: list[Reply], addr: Any) -> None:
        """Sends built replies (a NACK, or the Python path's DATAs), one ``sendmsg`` each."""
        for header, payload in replies:
            try:
                self.stats.bytes_sent += sock.sendmsg((header, payload), (), 0, addr)
            except OSError as exc:
                self.stats.send_errors += 1
                log.debug("sendmsg to %s failed: %s", addr, exc)

    def _serve_native(self, sock: socket.socket, nat: ModuleType) -> None:
        """``serve_forever`` on kvcast._native: GETs in batches, DATAs built and sent in C.

        One ``recvmmsg`` takes every GET queued (up to ``MAX_BATCH``; ``recv_datagrams``), so
        a burst of GETs (an agent sends those due at once with one ``sendmmsg``) costs one
        wakeup and one system call, not two per GET; each is answered in arrival order as the
        Python path answers it, and a served GET's DATAs leave with one ``send_data``.
        """
        answer = self.handler.answer
        step = self.handler.frags_per_data
        stats = self.stats
        gso = self.gso
        recv_datagrams, send_data, batch = nat.recv_datagrams, nat.send_data, nat.MAX_BATCH
        fd = sock.fileno()
        rx = bytearray(_RX_SLOT * batch)
        view = memoryview(rx)
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        stopping = self._serving.stopping
        while not stopping.is_set():
            if not poller.poll(100):
                continue
            while True:
                try:
                    got = recv_datagrams(fd, rx, _RX_SLOT)
                except OSError as exc:
                    log.warning("recvmmsg failed: %s", exc)
                    break
                at = 0
                for n, ip, port in got:
                    try:
                        reply = answer(view[at : at + n], ip)
                        if type(reply) is DataAnswer:
                            header, chunk, first, end, wire_bytes, crcs = reply
                            args = (fd, (ip, port), header, chunk, first, end, step, c.FRAG_BYTES)
                            try:
                                try:
                                    sent = send_data(*args, crcs, gso)
                                except OSError as exc:
                                    if not gso:
                                        raise
                                    # The path takes no GSO (no checksum offload, an MTU below
                                    # the DATA size): one datagram per DATA from now on.
                                    log.warning("UDP GSO send failed (%s): GSO off", exc)
                                    gso = self.gso = 0
                                    sent = send_data(*args, crcs, 0)
                                stats.bytes_sent += sent
                                if sent < wire_bytes:  # the send buffer stayed full: rest dropped
                                    stats.send_errors += 1
                            except OSError as exc:
                                stats.send_errors += 1
                                log.debug("sendmmsg to %#x:%d failed: %s", ip, port, exc)
                        else:
                            addr = (socket.inet_ntoa(ip.to_bytes(4, "big")), port)
                            self._send_replies(sock, cast(list[Reply], reply), addr)
                    except Exception:  # a bug must not take the pool node down
                        stats.internal_errors += 1
                        log.exception("handler failed on a %d-byte datagram from %#x", n, ip)
                    at += _RX_SLOT
                if len(got) < batch:
                    break

    def start(self) -> PoolServer:
        """Binds and serves in a daemon thread.

        Returns:
            ``self``.
        """
        self.bind()
        self._serving.start()
        return self

    def stop(self) -> None:
        """Stops serving and closes the socket. Safe to call twice."""
        self._serving.stop()
        if self._sock is not None:
            self._sock.close()
            self._sock = None


class AsyncPoolServerProtocol(asyncio.DatagramProtocol):
    """``KvpGetHandler`` behind an asyncio datagram endpoint.

    The handler's backend reads block the event loop (the chunk cache makes them one per
    chunk burst); use ``PoolServer`` where the backend is slow.

    Args:
        handler: the protocol logic.
    """

    def __init__(self, handler: KvpGetHandler) -> None:
        self.handler = handler
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # noqa: D102
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:  # noqa: D102
        transport = self.transport
        if transport is None:
            return
        try:
            replies = self.handler.handle(data, _ip_int(addr[0]))
        except Exception:
            self.handler.stats.internal_errors += 1
            log.exception("handler failed on a %d-byte datagram from %s", len(data), addr)
            return
        for header, payload in replies:
            transport.sendto(header + payload, addr)
            self.handler.stats.bytes_sent += len(header) + len(payload)

    def error_received(self, exc: Exception) -> None:  # noqa: D102
        self.handler.stats.send_errors += 1
        log.debug("datagram error: %s", exc)


async def serve_asyncio(
    backend: PoolBackend,
    host: str = "0.0.0.0",
    port: int = c.KVP_UDP_PORT,
    mtu: int = DEFAULT_MTU,
    cache_bytes: int = 64 << 20,
) -> tuple[asyncio.DatagramTransport, AsyncPoolServerProtocol]:
    """Starts an asyncio pool server on the running loop.

    Args:
        backend: where chunks are read from.
        host: address to bind.
        port: UDP port (0: ephemeral).
        mtu: IP MTU the DATA messages must fit in.
        cache_bytes: size of the recently-served chunk cache.

    Returns:
        The transport (close it to stop) and the protocol (``protocol.handler.stats``).
    """
    loop = asyncio.get_running_loop()
    handler = KvpGetHandler(backend, mtu, cache_bytes)
    transport, protocol = await loop.create_datagram_endpoint(
        lambda: AsyncPoolServerProtocol(handler), local_addr=(host, port)
    )
    return transport, protocol


def _ip_int(host: object) -> int | None:
    """A sender's IPv4 address as an int (None for anything else)."""
    try:
        return int.from_bytes(socket.inet_aton(str(host)), "big")
    except OSError:
        return None
