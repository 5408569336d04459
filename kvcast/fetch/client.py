"""The KVP fetch client: one chunk from the switch, else the DRAM pool, else "recompute".

``FetchClient.fetch`` fills a preallocated uint8 buffer (a numpy array, a bytearray; the host
agent's client takes a pinned tensor) with one chunk's bytes. It sends pipelined GETs (at most
``window`` outstanding) to the service address (the switch VIP: a hit comes back from switch SRAM
with ``HIT``, a miss is forwarded to the key's pool node and comes back with ``POOL``); each DATA is
received with ``recv_into`` into one reusable buffer, checked (tenant, key, request id, fragment
range, length, CRC) and copied once, straight to ``offset = frag_idx * FRAG_BYTES`` of the tensor.
No bytes object is made per fragment: the CRC runs over views of the receive buffer made once (the
payload, and the header's frag_idx field for the seed), and the copy is the one write into the
tensor. A per-fragment state array tracks what is missing, requested or present. A GET unanswered in
time is resent with exponential backoff; once a fragment has been retried ``max_retries`` times, or
the pool answers ``NOT_FOUND`` through the switch, the client asks the DRAM pool directly
(``pool_addr``, GETs with ``NOCACHE``), keeping every fragment it already verified (keys are content
hashes: the same key is the same bytes from any source). When that fails too the answer is
``RECOMPUTE``: ordinary misses are outcomes, never exceptions, and a partly filled tensor is never
reported as valid.

Group fetch: N hosts that need the same chunk share one multicast stream. The **leader** runs
``fetch`` with a client whose ``group`` is G: its GETs name G, so the switch multicasts each hit
(or, with ``nocache``, the pool's multi-fragment DATA) to every member of G. The **followers** run
``follow`` (``follow_many`` for several chunks at once, the side of a leader's ``fetch_many``):
they send nothing at first and take the replicas of G for the chunk (flag ``REPLICA``)
with the same checks; when the stream stalls (no new fragment for ``stall_s``) a follower repairs
what it still misses with its own unicast GETs, switch first and the pool directly after, so it too
ends complete or with a clear ``RECOMPUTE``.

Trust: datagrams are taken only from the service address and the pool addresses the client was given
(``pool_addr``, ``pool_addrs``), never from "any sender whose UDP source port is the KVP port"; a
DATA or NACK counts only for one of this fetch's own GETs, or, as a replica, for this client's
group. With a tenant key (``mac_keys``), a chunk whose MAC object (one MAC per segment,
``kvcast.integrity``) does not match is counted as an attack (``mac_failures``), its bytes are
dropped, and chunk and MAC object are fetched again from the pool directly (the pool's own
client, else KVP to ``pool_addr``); only a match then completes it.

Reports: a client given a ``reporter`` (``kvcast.reports.ReportSink``) hands it one access record
per fetch or follow (``entry_from_fetch``: the chunk, this host, the wall-clock time, ``hit`` when
most fragments came from switch SRAM) after the fetch has ended; the sink only queues it, so
reporting never delays or fails a fetch.

This module holds the client's public side (construction, ``fetch``, ``follow``, ``fetch_many``,
``follow_many``, and how a fetch starts and ends); the loop and sending are in ``transport``,
receiving and checking in ``receive``, retries, path changes and MAC checks in ``recovery``.

Classes:
    FetchClient: the UDP client (one socket, one fetch or window of fetches at a time).
"""

from __future__ import annotations

import random
import socket
import time
from array import array
from collections.abc import Mapping, Sequence
from typing import Any, Self

import numpy as np

from kvcast import p4constants as c
from kvcast.backend import PoolBackend
from kvcast.fetch.report import (
    FetchError,
    FetchOutcome,
    FetchReport,
    RecomputeReason,
    entry_from_fetch,
)
from kvcast.fetch.state import (
    _EVENT_FIELDS,
    _FB,
    _FRAG_IDX_AT,
    _GET_BATCH,
    _GET_BYTES,
    _HDR,
    _LOG,
    _MAX_DATA_FRAGS,
    _MISSING,
    _REQUESTED,
    _SLOT,
    DEFAULT_CHUNKS_IN_FLIGHT,
    GAP_FRAGMENTS,
    MAX_FETCHES,
    MIN_RETRY_TIMEOUT_S,
    TAIL_PROBE_MIN_S,
    Address,
    Array,
    ChunkRequest,
    Progress,
    _GiveUp,
    _Path,
    _resolved,
    _State,
)
from kvcast.fetch.transport import _Transport
from kvcast.integrity import check_keys, mac_key_of, mac_object_bytes
from kvcast.kvclass import KvClass
from kvcast.kvp import DEFAULT_MTU, MAX_FRAGMENTS, frag_count, frags_per_data
from kvcast.native import enabled as native_enabled
from kvcast.reports import ReportSink


class FetchClient(_Transport):
    """Fetches chunks over KVP/UDP: switch first, DRAM pool second, recompute last.

    Args:
        service_addr: where GETs go first: the switch VIP and ``KVP_UDP_PORT`` (in tests, a
            pool server). ``None`` asks the pool directly from the start.
        pool_addr: the DRAM pool node asked directly (GETs with ``NOCACHE``) when the service
            path fails, and the source of a repair after a MAC failure; ``None`` for no
            fallback.
        window: GETs outstanding at once (over every chunk in flight, for ``fetch_many``).
        max_chunks_in_flight: chunks ``fetch_many`` fetches at once by default (at most
            ``kvcast._native.MAX_FETCHES``, 64): the GETs of the next chunks use what of the
            window the earlier ones leave free.
        frags_per_get: fragments asked per GET (a pool node answers up to the MTU per DATA;
            the switch answers the first fragment only); default: what one DATA carries in
            ``mtu``.
        mtu: IP MTU, for the default ``frags_per_get``.
        timeout_s: first timeout of a GET, and the least a first try waits: the first GETs
            are sent in a burst before any round trip is measured, and their answers may queue
            behind every requester's window (see ``experiments.incast.get_timeouts``).
        max_timeout_s: cap of the backed-off timeout.
        min_retry_timeout_s: floor of a retry's timeout (MIN_RETRY_TIMEOUT_S); a retry waits
            the measured ``srtt + 4 rttvar``, doubled per timeout of its first fragment.
        max_retries: retries of a fragment on one path before moving on.
        deadline_s: bound on a whole fetch.
        group: multicast group of this host (0: none). ``fetch`` names it in its GETs, so the
            replies go to every member (the leader of a group fetch); ``follow`` listens for
            it. DATA replicated to the group (flag ``REPLICA``) for the chunk being fetched is
            accepted whoever requested it.
        nocache: GETs to the service address carry ``NOCACHE``: the switch sends them to the
            key's pool node without looking at its cache (a pool-served, multi-fragment stream).
        bind: local address of the UDP socket.
        socket_buffer_bytes: SO_RCVBUF to ask for.
        reporter: where to hand one access record per fetch (None: no reports).
        report_host: this host's name (or id) in the records; default: the hostname.
        mac_keys: tenant -> secret (kvcast.integrity): a chunk of such a tenant is complete
            only once its keyed MAC object (fetched after the last fragment, or beside the
            chunk by ``fetch_many`` with progress) matches its bytes, segment by segment.
        direct: the pool's own client (a ``PoolBackend``: Mooncake's transfer engine in
            deployment) for lone misses: once a pool answers a unicast fetch's GET (so the
            switch does not hold the chunk and no group shares the fetch), the rest of the chunk
            is read with ``direct.get_into``, the path a user would otherwise take; if that
            fails the KVP fetch goes on. None: KVP only.
        tail_probe_min_s: the shortest wait before a GET at the fetch's tail is sent again
            (TAIL_PROBE_SRTTS); at least ``timeout_s`` turns tail probes off.
        pool_addrs: the other pool nodes the switch may forward this client's misses to: their
            answers come from their own addresses. Datagrams from anyone but the service
            address, ``pool_addr`` and these are dropped (``foreign``).

    Raises:
        ValueError: neither address given, or a parameter out of range.
    """

    def __init__(
        self,
        service_addr: Address | None,
        pool_addr: Address | None = None,
        *,
        window: int = 32,
        max_chunks_in_flight: int = DEFAULT_CHUNKS_IN_FLIGHT,
        frags_per_get: int | None = None,
        mtu: int = DEFAULT_MTU,
        timeout_s: float = 0.02,
        max_timeout_s: float = 0.25,
        min_retry_timeout_s: float = MIN_RETRY_TIMEOUT_S,
        max_retries: int = 3,
        deadline_s: float = 5.0,
        group: int = 0,
        nocache: bool = False,
        bind: Address = ("0.0.0.0", 0),
        socket_buffer_bytes: int = 4 << 20,
        reporter: ReportSink | None = None,
        report_host: str | int | None = None,
        mac_keys: Mapping[int, bytes] | None = None,
        direct: PoolBackend | None = None,
        tail_probe_min_s: float = TAIL_PROBE_MIN_S,
        pool_addrs: Sequence[Address] = (),
    ) -> None:
        if service_addr is None and pool_addr is None:
            raise ValueError("FetchClient needs a service address, a pool address or both")
        if (
            window < 1
            or max_retries < 0
            or not 0 < timeout_s <= max_timeout_s
            or not 0 < min_retry_timeout_s <= max_timeout_s
        ):
            raise ValueError(
                f"need window >= 1, max_retries >= 0, 0 < timeout_s <= max_timeout_s and 0 < "
                f"min_retry_timeout_s <= max_timeout_s; got {window}, {max_retries}, "
                f"{timeout_s}, {max_timeout_s}, {min_retry_timeout_s}"
            )
        if not 1 <= max_chunks_in_flight <= MAX_FETCHES:
            raise ValueError(
                f"max_chunks_in_flight must be in 1..{MAX_FETCHES}, got {max_chunks_in_flight}"
            )
        self.paths: list[_Path] = []
        if service_addr is not None:
            self.paths.append(_Path(service_addr, c.KVP_FLAG_NOCACHE if nocache else 0, "service"))
        if pool_addr is not None:
            self.paths.append(_Path(pool_addr, c.KVP_FLAG_NOCACHE, "pool"))
        self.window = window
        self.max_chunks_in_flight = max_chunks_in_flight
        self.frags_per_get = frags_per_get or frags_per_data(mtu)
        # The native path's first guess of a DATA's fragments: from the MTU, then what the last
        # fetch's DATAs carried (its sender's MTU, which can differ from ours).
        self._data_frags = min(self.frags_per_get, frags_per_data(mtu))
        self.timeout_s = timeout_s
        self.max_timeout_s = max_timeout_s
        self.min_retry_timeout_s = min_retry_timeout_s
        self.max_retries = min(max_retries, 254)
        self.deadline_s = deadline_s
        self.tail_probe_min_s = tail_probe_min_s
        self.group = group
        self.reporter = reporter
        self.report_host = socket.gethostname() if report_host is None else report_host
        self.mac_keys = check_keys(mac_keys or {})
        self.gap_fragments = GAP_FRAGMENTS
        self.direct = direct
        self._sock = self._open_sockets(bind, socket_buffer_bytes)
        # The only senders the unconnected socket takes datagrams from: the paths (the switch's
        # service address, the pool) and the pool nodes the switch may forward misses to. Not
        # "any KVP source port": a host that gets a datagram past the switch could set it.
        self._trusted = {_resolved(a) for a in (*(p.addr for p in self.paths), *pool_addrs)}
        # The native receive path (kvcast._native.recv_fetch), where it is built: a batch of
        # datagrams per system call, checked, CRC'd and copied into the buffer in C.
        nat = native_enabled()
        self._native = nat if nat is not None and array("L").itemsize == 8 else None
        if self._native is not None:
            self._rx = bytearray(_SLOT * self._native.MAX_BATCH)
            # Room for the events of every batch one call may take (MAX_ROUNDS of them).
            events = self._native.MAX_BATCH * self._native.MAX_ROUNDS * _EVENT_FIELDS
            self._events = array("q", bytes(8 * events))
            self._trusted_ints = tuple(
                (int.from_bytes(socket.inet_aton(h), "big"), port) for h, port in self._trusted
            )
        self._rbuf = bytearray(65536)
        self._rview = memoryview(self._rbuf)
        # Views into the receive buffer made once: a full fragment's payload, and the DATA's
        # frag_idx field (the CRC seed's last two bytes, big-endian as on the wire).
        self._full_payload = self._rview[_HDR : _HDR + _FB]
        self._frag_idx_field = self._rview[_FRAG_IDX_AT : _FRAG_IDX_AT + 2]
        # GETs due at once are packed here and sent together (_send, _flush_gets); the
        # one-fragment placeholder after each header stays zero.
        self._gets = bytearray(_GET_BYTES * _GET_BATCH)
        self._gets_view = memoryview(self._gets)
        self._get_one = self._gets_view[:_GET_BYTES]
        self._next_req = random.getrandbits(32)
        # Replicas of the group's other chunks read while following one (STASH_MAX_BYTES).
        self._stash: dict[tuple[int, int], list[bytes]] = {}
        self._stash_bytes = 0
        self._progress: Progress | None = None
        self._stripe = 0  # fetch_many's stripe in fragments (0: the earliest chunk first)

    @property
    def data_path(self) -> str:
        """``native`` (kvcast._native receives, checks and copies) or ``python``."""
        return "python" if self._native is None else "native"

    @property
    def address(self) -> Address:
        """The local ``(host, port)`` replies come to."""
        host, port = self._sock.getsockname()[:2]
        return str(host), int(port)

    def discard_pending(self) -> int:
        """Drops every datagram waiting on the client's sockets; returns how many.

        Between fetches that share nothing (a new experiment point), what is still queued is
        from earlier ones (late replies, replicas of a group fetch this host no longer follows):
        a follower must not take those for the stream it is about to follow.
        """
        dropped = sum(len(v) for v in self._stash.values())
        self._stash.clear()
        self._stash_bytes = 0
        for sock in self._socks.values():
            while True:
                try:
                    sock.recv_into(self._rbuf)
                except (BlockingIOError, InterruptedError):
                    break
                except ConnectionRefusedError:  # an ICMP error queued for an earlier GET
                    continue
                dropped += 1
        return dropped

    def close(self) -> None:
        """Closes the sockets."""
        for s in self._socks.values():
            s.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def fetch(
        self,
        tenant: int,
        key: int,
        dst: Any,
        nbytes: int | None = None,
        *,
        parent: int | None = None,
        position: int | None = None,
    ) -> FetchReport:
        """Fetches one chunk of ``nbytes`` into ``dst[:nbytes]``.

        Args:
            tenant: tenant id.
            key: chunk key.
            dst: where the chunk goes: a contiguous, writable 1-D uint8 numpy array, or a
                writable bytes-like buffer (``bytearray``, ``memoryview``); the host agent's
                client takes a uint8 CPU tensor here.
            nbytes: chunk length; default: the buffer's size.
            parent: key of the previous block of the prefix chain (for the access report).
            position: the block's index in its chain (for the access report).

        Returns:
            The report. Only ``report.ok`` means ``dst[:nbytes]`` holds the chunk.

        Raises:
            FetchError: ``dst`` is not a usable buffer, or ``nbytes`` is not in ``1 ..`` its
                size or needs more fragments than a 16-bit index addresses.
        """
        st = self._start(tenant, key, self._as_array(dst), nbytes)
        st.get_group = self.group
        return self._finish(st, parent, position)

    def follow(
        self,
        tenant: int,
        key: int,
        dst: Any,
        nbytes: int | None = None,
        *,
        stall_s: float = 0.5,
        first_wait_s: float | None = None,
        parent: int | None = None,
        position: int | None = None,
        kv_class: KvClass | None = None,
    ) -> FetchReport:
        """Receives one chunk from the group's multicast stream, repairing gaps by unicast.

        A follower of a group fetch sends nothing at first: another member (the leader) asks for
        the chunk with the group in its GETs, and the switch replicates every reply to this
        host (flag ``REPLICA``). Each replica is checked as in ``fetch`` (tenant, key, group,
        range, length, CRC) and written in place. A fragment the stream has gone
        ``GAP_FRAGMENTS`` past (or any, once the stream brought the chunk's last fragment) was
        lost on the way: the follower asks for it at once, by a unicast GET without a group,
        while it goes on listening. When no new fragment has arrived for ``stall_s``
        (``first_wait_s`` before the first one), it asks for every fragment it still misses:
        to the service address (switch SRAM, else the pool behind it), then to the pool
        directly, as ``fetch`` does; replicas that still arrive keep counting.

        Args:
            tenant: tenant id.
            key: chunk key.
            dst: where the chunk goes, a buffer as for :meth:`fetch`.
            nbytes: chunk length; default: the buffer's size.
            stall_s: silence (no new fragment) after which the follower repairs on its own.
            first_wait_s: how long to wait for the stream's first fragment; default
                ``stall_s``.
            parent: key of the previous block of the prefix chain (for the access report).
            position: the block's index in its chain (for the access report).
            kv_class: the chunk's declared class (for the access report).

        Returns:
            The report (``stalled`` and ``repairs`` say whether and how much it repaired). Only
            ``report.ok`` means ``dst[:nbytes]`` holds the chunk.

        Raises:
            FetchError: the client has no group, ``stall_s`` or ``first_wait_s`` is not
                positive, or ``dst`` and ``nbytes`` are unusable (as for ``fetch``).
        """
        if self.group == 0:
            raise FetchError("follow needs a client with a multicast group (group != 0)")
        first = stall_s if first_wait_s is None else first_wait_s
        if stall_s <= 0 or first <= 0:
            raise FetchError(f"stall_s and first_wait_s must be positive, got {stall_s}, {first}")
        st = self._start_following(tenant, key, self._as_array(dst), nbytes, stall_s, first)
        self._take_stash(st)
        return self._finish(st, parent, position, kv_class)

    def follow_many(
        self,
        requests: Sequence[ChunkRequest],
        *,
        stall_s: float = 0.5,
        first_wait_s: float | None = None,
        progress: Progress | None = None,
    ) -> list[FetchReport]:
        """``follow`` for several chunks at once: the group's stream fills all of them.

        The leader of a group fetch asks for its chunks together (``fetch_many``, layer by
        layer with ``stripe_bytes``), so the stream brings every chunk's first stripe before
        any chunk is whole. A follower that took one chunk after another would hold nothing
        usable until the stream's end, and would then fetch the MAC objects one round trip
        each. Here every chunk (up to ``MAX_FETCHES / 2`` at once) takes its replicas as they
        come, a tenant's MAC objects are fetched beside them by unicast, and ``progress``
        hands on each chunk's verified contiguous prefix as it grows, as ``fetch_many`` does
        for the leader. Once every chunk is whole, or the stream has passed the end of those
        that are not (their missing fragments were lost), or no chunk got a new fragment for
        ``stall_s`` (``first_wait_s`` before the first), what is missing is repaired by
        unicast GETs for every chunk at once (switch, then the pool directly).

        Args:
            requests: the chunks, in the order they are wanted.
            stall_s: silence (no new fragment for any chunk) after which the follower repairs.
            first_wait_s: how long to wait for the stream's first fragment; default
                ``stall_s``.
            progress: as for ``fetch_many``.

        Returns:
            One report per chunk, in order. Only ``report.ok`` means that chunk's ``dst``
            holds it.

        Raises:
            FetchError: as for ``follow``.
        """
        if self.group == 0:
            raise FetchError("follow_many needs a client with a multicast group (group != 0)")
        first = stall_s if first_wait_s is None else first_wait_s
        if stall_s <= 0 or first <= 0:
            raise FetchError(f"stall_s and first_wait_s must be positive, got {stall_s}, {first}")
        arrays = [self._as_array(r.dst) for r in requests]
        for arr, r in zip(arrays, requests, strict=True):
            self._check_len(arr, r.nbytes)
        per = MAX_FETCHES // 2  # each chunk with its MAC object beside it
        self._progress = progress
        reports: list[FetchReport] = []
        try:
            for at in range(0, len(requests), per):
                states = []
                for i in range(at, min(at + per, len(requests))):
                    r = requests[i]
                    st = self._start_following(r.tenant, r.key, arrays[i], r.nbytes, stall_s, first)
                    st.index = i
                    if st.tenant in self.mac_keys:
                        self._mac_beside(st)
                    self._take_stash(st)
                    states.append(st)
                stalled = self._listen_many(states)
                # What the stream did not bring: every chunk's missing fragments by unicast,
                # together (switch first, then the pool directly, as ``follow`` repairs).
                active = [
                    f
                    for st in states
                    for f in (st.mac_of, st)
                    if f is not None and f.give_up is None and f.missing
                ]
                for f in active:
                    if not f.is_mac:
                        f.listening, f.scan, f.report.stalled = False, 0, stalled
                while active:
                    self._run_many(active, keep=True)
                    self._retire(active)
                for st in states:
                    r = requests[st.index]
                    reports.append(self._close(st, st.give_up, r.parent, r.position, r.kv_class))
        finally:
            self._progress = None
        return reports

    def fetch_many(
        self,
        requests: Sequence[ChunkRequest],
        *,
        max_chunks_in_flight: int | None = None,
        stop_after_failure: bool = False,
        progress: Progress | None = None,
        stripe_bytes: int | None = None,
    ) -> list[FetchReport]:
        """Fetches several chunks with their GETs in flight together (a window of chunks).

        Up to ``max_chunks_in_flight`` chunks are fetched at once, in the order given: each has
        its own state, request ids, timers and paths exactly as in ``fetch``, and the client's
        ``window`` bounds the GETs in flight over all of them, the earliest chunk served first.
        So the next chunks' GETs go out while the first chunk's answers are still on the way,
        and a multi-chunk fetch keeps the pool (or the switch) busy instead of waiting one round
        trip per chunk. Every DATA names its chunk (tenant, key) and the GET it answers, and is
        checked against that chunk only (range, owner, CRC), so chunks never mix. A chunk's MAC
        object (``mac_keys``) is fetched and compared after the data of every chunk has
        arrived, or, with ``progress``, fetched beside the chunk and compared segment by
        segment as the data arrives.

        Args:
            requests: the chunks, in the order they are wanted.
            max_chunks_in_flight: chunks fetched at once; default: the client's.
            stop_after_failure: start no further chunk once one has ended in ``RECOMPUTE``
                (a prefix is of use only up to its first missing block); chunks already in
                flight run to their end.
            progress: called as ``progress(i, nbytes)`` (in this thread, between receives)
                whenever the verified contiguous prefix of chunk ``i`` (its index in
                ``requests``) grows to ``nbytes``: ``dst[:nbytes]`` then holds the chunk's
                bytes, every fragment CRC-checked, and no later datagram changes them. For a
                tenant with a MAC key the prefix ends, further, after the last segment that
                matched its MAC (nothing unauthenticated is reported; a chunk whose later
                segment fails is not repaired once part of it was reported: it ends
                ``MAC_MISMATCH``); a complete chunk's last call names its full length. A
                chunk may still end in ``RECOMPUTE`` after a partial prefix of it was reported
                (its later fragments never came): only the report says it is whole. An
                exception from ``progress`` ends ``fetch_many``.
            stripe_bytes: send GETs stripe by stripe over the chunks in flight: the window
                goes to the fragments of every chunk's first ``stripe_bytes`` bytes, then the
                next ``stripe_bytes``, and so on (a layer-major KV chunk's layers, with the
                layer's bytes as the stripe: layer 0 of every chunk arrives first). None: the
                earliest chunk first, as a prefix is wanted in order.

        Returns:
            One report per chunk started, in the order of ``requests`` (all of them unless
            ``stop_after_failure`` stopped early). Only ``report.ok`` means that chunk's
            ``dst`` holds it.

        Raises:
            FetchError: a request's ``dst`` or ``nbytes`` is unusable (as for ``fetch``),
                before anything is sent.
            ValueError: ``max_chunks_in_flight`` is not in ``1 .. 64``, or ``stripe_bytes`` is
                not positive.
        """
        k = self.max_chunks_in_flight if max_chunks_in_flight is None else max_chunks_in_flight
        if not 1 <= k <= MAX_FETCHES:
            raise ValueError(f"max_chunks_in_flight must be in 1..{MAX_FETCHES}, got {k}")
        arrays = [self._as_array(r.dst) for r in requests]
        for arr, r in zip(arrays, requests, strict=True):
            self._check_len(arr, r.nbytes)
        if stripe_bytes is not None and stripe_bytes < 1:
            raise ValueError(f"stripe_bytes must be positive, got {stripe_bytes}")
        self._progress = progress
        self._stripe = 0 if stripe_bytes is None else frag_count(stripe_bytes)
        try:
            return self._fetch_many(requests, arrays, k, stop_after_failure, progress)
        finally:
            self._progress = None
            self._stripe = 0

    def _fetch_many(
        self,
        requests: Sequence[ChunkRequest],
        arrays: list[Array],
        k: int,
        stop_after_failure: bool,
        progress: Progress | None,
    ) -> list[FetchReport]:
        """``fetch_many`` once its arguments are checked."""
        states: list[_State] = []
        active: list[_State] = []
        failed = False
        while True:
            while (
                len(states) < len(requests)
                and sum(not a.is_mac for a in active) < k
                and len(active) + 2 <= MAX_FETCHES
                and not (failed and stop_after_failure)
            ):
                r = requests[len(states)]
                if any(a.key == r.key and a.tenant == r.tenant for a in active):
                    break  # one fetch per chunk at a time: a DATA names its chunk, not its fetch
                st = self._start(r.tenant, r.key, arrays[len(states)], r.nbytes)
                st.get_group = self.group
                st.deadline = st.started + self.deadline_s
                st.index = len(states)
                states.append(st)
                if progress is not None and st.tenant in self.mac_keys:
                    # Its MAC object beside it (first in the window), so that each segment can
                    # be verified, and handed on, as it arrives.
                    active.append(self._mac_beside(st))
                active.append(st)
            if not active:
                break
            self._run_many(active)
            if progress is not None:
                self._advance(active)
            failed |= any(st.give_up is not None and not st.is_mac for st in self._retire(active))
        return [
            self._close(st, st.give_up, r.parent, r.position, r.kv_class)
            for st, r in zip(states, requests, strict=False)
        ]

    def _close(
        self,
        st: _State,
        reason: RecomputeReason | None,
        parent: int | None,
        position: int | None,
        kv_class: KvClass | None,
    ) -> FetchReport:
        """Ends a fetch of ``fetch_many`` or ``follow_many`` (``reason`` None: all arrived).

        A tenant's chunk is compared with its MAC object (the one fetched beside it, else one
        fetched now); a complete chunk whose whole length the progress callback has not been
        told yet is reported whole; then the report is concluded.
        """
        mac_s = 0.0
        if st.mac_of is not None:  # its MAC object's GETs are the chunk's too
            st.report.gets_sent += st.mac_of.report.gets_sent
        secret = self.mac_keys.get(st.tenant)
        if reason is None and secret is not None:
            self._take_macs(st)
            t0 = time.monotonic()
            try:
                self._verify_mac(st, secret, t0 + self.deadline_s)
            except _GiveUp as give_up:
                reason = give_up.reason
            mac_s = time.monotonic() - t0
        progress = self._progress
        if reason is None and progress is not None and st.prefix < st.n:
            st.prefix = st.n
            progress(st.index, st.nbytes)
        duration = st.ended - st.started + mac_s
        return self._conclude(st, reason, duration, parent, position, kv_class)

    @staticmethod
    def _retire(active: list[_State]) -> list[_State]:
        """Takes the fetches that ended (complete or given up) out of ``active``, with the time.

        Returns:
            Those fetches.
        """
        now = time.monotonic()
        ended = [st for st in active if st.give_up is not None or not st.missing]
        for st in ended:
            st.ended = now
            active.remove(st)
        return ended

    def _mac_beside(self, st: _State) -> _State:
        """Starts the fetch of ``st``'s MAC object, to run beside it (``st.mac_of``)."""
        size = mac_object_bytes(st.nbytes)
        mac = self._start(st.tenant, mac_key_of(st.key), np.zeros(size, np.uint8), size)
        mac.deadline, mac.is_mac = st.deadline, True
        st.mac_of = mac
        return mac

    def _start_following(
        self, tenant: int, key: int, dst: Array, nbytes: int | None, stall_s: float, first: float
    ) -> _State:
        """A follower's state: listening, stalled after ``first`` s without a first fragment."""
        st = self._start(tenant, key, dst, nbytes)
        st.follower = st.listening = True
        st.stall_s = stall_s
        st.last_progress += first - stall_s
        st.deadline = st.started + self.deadline_s
        return st

    def _take_stash(self, st: _State) -> None:
        """Receives into ``st`` the replicas of its chunk read while others were followed."""
        kept = self._stash.pop((st.tenant, st.key), [])
        for datagram in kept:
            self._stash_bytes -= len(datagram)
            n = len(datagram)
            self._rbuf[:n] = datagram
            self._receive(st, n)
        st.report.stashed += len(kept)

    def _advance(self, active: list[_State]) -> None:
        """Reports the fetches in ``active`` whose verified contiguous prefix grew.

        The prefix ends at the first fragment not present (missing or requested); present
        fragments never change again. For a tenant with a MAC key it ends, further, after the
        last segment found equal to its MAC (none before the MAC object has arrived). Fetches
        that gave up, and those of MAC objects, are skipped.
        """
        progress = self._progress
        assert progress is not None
        for st in active:
            if st.give_up is not None or st.is_mac or st.prefix == st.n:
                continue
            if st.missing == st.advanced_at and (st.macs is not None or st.mac_of is None):
                continue  # no fragment arrived since (and no MAC object to take)
            st.advanced_at = st.missing
            if not st.missing:
                end = st.n
            else:
                frag, at = st.frag, st.prefix
                gaps = [i for i in (frag.find(_MISSING, at), frag.find(_REQUESTED, at)) if i >= 0]
                end = min(gaps) if gaps else st.n
            secret = self.mac_keys.get(st.tenant)
            if secret is not None:
                self._take_macs(st)
                end = self._verified_segments(st, secret, end)
            if end > st.prefix:
                st.prefix = end
                progress(st.index, min(end * _FB, st.nbytes))

    @staticmethod
    def _take_macs(st: _State) -> None:
        """Takes the MAC object fetched beside ``st`` once that fetch has ended complete."""
        mac = st.mac_of
        if st.macs is None and mac is not None and mac.give_up is None and not mac.missing:
            st.macs = mac.dst.tobytes()

    def _as_array(self, dst: Any) -> Array:
        """The fetch's destination as a 1-D uint8 array over the same memory.

        A subclass that takes another kind of buffer (the host agent's client: tensors)
        overrides this one method.

        Raises:
            FetchError: ``dst`` is not a contiguous, writable 1-D uint8 buffer.
        """
        if isinstance(dst, np.ndarray):
            arr = dst
        else:
            try:
                arr = np.frombuffer(dst, dtype=np.uint8)
            except (TypeError, ValueError) as exc:
                raise FetchError(
                    f"fetch needs a writable uint8 buffer (numpy array, bytearray, memoryview), "
                    f"got {type(dst).__name__}"
                ) from exc
        if arr.dtype != np.uint8 or arr.ndim != 1 or not arr.flags.c_contiguous:
            raise FetchError(
                f"fetch needs a contiguous 1-D uint8 buffer, got {arr.dtype} {arr.shape}"
            )
        if not arr.flags.writeable:
            raise FetchError("fetch needs a writable buffer, got a read-only one")
        return arr

    @staticmethod
    def _check_len(arr: Array, nbytes: int | None) -> int:
        """Checks a fetch's length against its buffer; returns the length.

        Raises:
            FetchError: as ``fetch`` says.
        """
        nbytes = arr.size if nbytes is None else nbytes
        if not 0 < nbytes <= arr.size:
            raise FetchError(f"chunk length {nbytes} not in 1..{arr.size} (the buffer size)")
        n = frag_count(nbytes)
        if n > MAX_FRAGMENTS:
            raise FetchError(
                f"a {nbytes}-byte chunk has {n} fragments; KVP addresses at most {MAX_FRAGMENTS}"
            )
        return nbytes

    def _start(self, tenant: int, key: int, dst: Array, nbytes: int | None) -> _State:
        """Checks the length of a fetch into ``dst`` (an ``_as_array``) and makes its state."""
        nbytes = self._check_len(dst, nbytes)
        n = frag_count(nbytes)
        report = FetchReport(tenant=tenant, key=key, nbytes=nbytes, frag_count=n)
        st = _State(tenant, key, nbytes, n, dst, report)
        st.rid_base = self._next_req
        st.last_progress = st.started = time.monotonic()
        st.rto = self.timeout_s
        st.stream[6] = self._data_frags
        return st

    def _finish(
        self,
        st: _State,
        parent: int | None,
        position: int | None,
        kv_class: KvClass | None = None,
    ) -> FetchReport:
        """Runs a fetch to its outcome, then hands its access record to the reporter."""
        start = time.monotonic()
        reason: RecomputeReason | None = None
        try:
            self._run(st, start + self.deadline_s)
            secret = self.mac_keys.get(st.tenant)
            if secret is not None:
                self._verify_mac(st, secret, start + self.deadline_s)
        except _GiveUp as give_up:
            reason = give_up.reason
        return self._conclude(st, reason, time.monotonic() - start, parent, position, kv_class)

    def _conclude(
        self,
        st: _State,
        reason: RecomputeReason | None,
        duration_s: float,
        parent: int | None,
        position: int | None,
        kv_class: KvClass | None = None,
    ) -> FetchReport:
        """Fills in a fetch's outcome (``reason`` None: complete) and hands its record on."""
        report = st.report
        if reason is None:
            report.outcome = FetchOutcome.COMPLETE
        else:
            report.outcome = FetchOutcome.RECOMPUTE
            report.reason = reason
        report.duration_s = duration_s
        report.srtt_s, report.rto_s = st.srtt, st.rto
        if st.stream[6] > 1:  # pool DATAs were seen (SRAM hits carry one fragment each)
            self._data_frags = min(int(st.stream[6]), _MAX_DATA_FRAGS)
        if report.path == "none" and report.outcome is FetchOutcome.COMPLETE:
            report.path = "switch" if report.frags_hit * 2 >= report.frag_count else "pool"
        if self.reporter is not None:
            try:
                entry = entry_from_fetch(
                    report, self.report_host, parent=parent, position=position, kv_class=kv_class
                )
                self.reporter.submit([entry])
            except Exception:  # a report must never fail a fetch, whatever the sink does
                _LOG.exception("access report of chunk %#x not handed over", report.key)
        return report
