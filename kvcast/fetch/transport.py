"""Sending GETs and the fetch loop: sockets, paths, the window, batched sends.

Classes:
    _Transport: opens the client's sockets (one unconnected, one connected per path), runs
        one fetch (``_run``) or a window of fetches (``_run_many``) until done or given up,
        and packs the GETs due into batches (``_send``, ``_flush_gets``).
"""

from __future__ import annotations

import math
import select
import socket
import time
from array import array

from kvcast.fetch.receive import _Receiver
from kvcast.fetch.report import RecomputeReason
from kvcast.fetch.state import (
    _GET_BATCH,
    _GET_BYTES,
    _GET_VO,
    _LOG,
    _MISSING,
    _PRESENT,
    _REQUESTED,
    QUIET_ARRIVALS,
    QUIET_FACTOR,
    QUIET_MIN_S,
    Address,
    _GiveUp,
    _Path,
    _State,
)
from kvcast.wire import KVP_STRUCT


class _Transport(_Receiver):
    """The sending side and the loop of ``FetchClient``."""

    def _open_sockets(self, bind: Address, rcvbuf: int) -> socket.socket:
        """Opens the client's UDP socket and one connected socket per path, on one port.

        Sending on a connected socket saves the kernel a route lookup per GET, and Python the
        address parsing: about 2 us of a 13 us fragment through the reference switch. Replies
        from a path's address reach its connected socket (the kernel prefers the socket whose
        connection matches); everything else (the pool answering a miss forwarded by the
        switch, another member's multicast stream) reaches the unconnected one. ``SO_REUSEPORT``
        is set only while the sockets are bound and cleared afterwards, so no other socket can
        join the port later and take a share of its datagrams. Where any of this fails, the
        path sends with ``sendto`` from the unconnected socket instead.

        Returns:
            The unconnected socket, bound to ``bind``.

        Raises:
            OSError: ``bind`` cannot be bound.
        """
        reuse: int | None = getattr(socket, "SO_REUSEPORT", None)
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._socks: dict[int, socket.socket] = {}
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
            if reuse is not None:
                sock.setsockopt(socket.SOL_SOCKET, reuse, 1)
            sock.bind(bind)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._socks[sock.fileno()] = sock
        port = sock.getsockname()[1]
        by_addr: dict[Address, socket.socket] = {}
        for path in self.paths if reuse is not None else ():
            path.sock = by_addr.get(path.addr) or self._connected(path, bind[0], port, rcvbuf)
            if path.sock is not None:
                by_addr[path.addr] = self._socks[path.sock.fileno()] = path.sock
        for s in self._socks.values():
            if reuse is not None:
                s.setsockopt(socket.SOL_SOCKET, reuse, 0)
        self._poll = select.poll()
        for fd in self._socks:
            self._poll.register(fd, select.POLLIN)
        return sock

    @staticmethod
    def _connected(path: _Path, host: str, port: int, rcvbuf: int) -> socket.socket | None:
        """A socket bound to ``(host, port)`` with SO_REUSEPORT and connected to the path."""
        conn = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            conn.bind((host, port))
            conn.connect(path.addr)
            conn.setblocking(False)
        except OSError as exc:
            conn.close()
            _LOG.debug("path %s sends with sendto: %s", path.name, exc)
            return None
        return conn

    def _run(self, st: _State, deadline: float) -> None:
        socks, poll = self._socks, self._poll.poll
        unconnected, trusted = self._sock, self._trusted
        rbuf = self._rbuf
        receive = self._receive
        while st.missing:
            now = time.monotonic()
            if now >= deadline:
                raise _GiveUp(RecomputeReason.DEADLINE)
            if st.answered > st.fast_seen or now >= st.fast_next:
                st.fast_next = self._fast_retransmit(st, now)
            if st.listening:
                wake = st.last_progress + st.stall_s
                if now >= wake:  # the stream stalled: repair the gaps ourselves
                    st.listening = False
                    st.report.stalled = True
                    st.scan = 0
                    continue
                # Gaps the stream has gone past: repair them now, not after a stall. Once it
                # brought the chunk's last fragment, every gap is behind it.
                high = st.stream_high
                behind = st.n if high >= st.n else high - self.gap_fragments
                if behind < st.n and high >= st.n - self.gap_fragments:
                    # In the tail: a stream gone quiet has ended (see QUIET_FACTOR).
                    quiet = self._quiet(st)
                    if now >= st.last_progress + quiet:
                        behind = st.n
                    else:
                        wake = min(wake, st.last_progress + quiet)
                if behind > 0 or st.inflight:
                    if now >= st.next_check:
                        self._expire(st, now)
                    if behind > st.gap_scan:
                        st.scan = min(st.scan, st.gap_scan)
                        st.gap_scan = behind
                    self._send(st, now, st.gap_scan)
                    if st.inflight:
                        wake = min(
                            wake, st.next_check, st.fast_next,
                            self._tail_probe(st, now, st.gap_scan),
                        )  # fmt: skip
            else:
                if now >= st.next_check:
                    self._expire(st, now)
                self._send(st, now)
                wake = st.next_check if st.inflight else now + self.timeout_s
                if st.inflight:
                    wake = min(wake, st.fast_next, self._tail_probe(st, now, st.n))
            if st.want_direct:
                self._read_direct(st)
                continue
            for fd, _ in poll(max(0.0, min(wake, deadline) - now) * 1e3):
                sock = socks[fd]
                if self._native is not None:
                    self._drain_native(st, fd, sock is unconnected)
                    continue
                if sock is not unconnected:  # the kernel takes only the path's own replies
                    recv_into = sock.recv_into
                    while st.missing:
                        try:
                            nrecv = recv_into(rbuf)
                        except (BlockingIOError, InterruptedError):
                            break
                        except ConnectionRefusedError:  # ICMP error for an earlier GET
                            continue
                        receive(st, nrecv)
                    continue
                recvfrom_into = sock.recvfrom_into
                while st.missing:
                    try:
                        nrecv, src = recvfrom_into(rbuf)
                    except (BlockingIOError, InterruptedError):
                        break
                    except ConnectionRefusedError:  # an ICMP error for an earlier GET: a timeout
                        continue
                    # Only the switch's service address and the pool nodes speak to the agent.
                    if src not in trusted:
                        st.report.foreign += 1
                        continue
                    receive(st, nrecv)

    def _run_many(self, active: list[_State], keep: bool = False) -> None:
        """Runs the unicast (or leading) fetches in ``active`` together until one of them ends.

        As ``_run`` without a follower's listening: per fetch its timers (deadline, fast
        retransmit, timeout, tail probe) and its direct read; GETs are sent in the order of
        ``active`` while fewer than ``window`` are in flight over all of them; each datagram goes
        to the fetch it names (``keep``: as for ``_receive_any``). A fetch that gives up keeps
        its reason in ``give_up``.
        """
        while True:
            now = time.monotonic()
            for st in active:
                try:
                    self._tick(st, now)
                except _GiveUp as give_up:
                    st.give_up = give_up.reason
            room = self.window - sum(len(st.inflight) for st in active)
            if self._stripe and room > 0:
                room = self._send_striped(active, now, room)
            wake = math.inf
            for st in active:
                if st.give_up is None and st.missing and room > 0:
                    before = len(st.inflight)
                    self._send(st, now, window=before + room)
                    room -= len(st.inflight) - before
                if st.give_up is None and st.want_direct:
                    self._read_direct(st)
                if st.give_up is not None or not st.missing:
                    return
                if st.inflight:
                    try:
                        tail = self._tail_probe(st, now, st.n)
                    except _GiveUp as give_up:  # its retries ran out: a path change failed
                        st.give_up = give_up.reason
                        return
                    wake = min(wake, st.next_check, st.fast_next, tail, st.deadline)
                else:
                    wake = min(wake, now + self.timeout_s, st.deadline)
            self._receive_many(active, wake - now, keep)
            if self._progress is not None:
                self._advance(active)
            if any(st.give_up is not None or not st.missing for st in active):
                return

    @staticmethod
    def _quiet(st: _State) -> float:
        """How long a follower's stream in its tail may be silent before it has ended.

        QUIET_FACTOR mean fragment spacings and QUIET_ARRIVALS mean arrival spacings of the
        stream so far, at least QUIET_MIN_S and at most ``stall_s``.
        """
        got = st.report.frags_stream
        spacing = (st.last_progress - st.started) / got if got else st.stall_s
        gap = (st.last_progress - st.started) / st.arrivals if st.arrivals else 0.0
        return min(st.stall_s, max(QUIET_MIN_S, QUIET_FACTOR * spacing, QUIET_ARRIVALS * gap))

    def _tick(self, st: _State, now: float) -> None:
        """A sending fetch's timers: its deadline, fast retransmit and GET timeouts.

        Raises:
            _GiveUp: the deadline passed, or a path's retries ran out and no path is left.
        """
        if now >= st.deadline:
            raise _GiveUp(RecomputeReason.DEADLINE)
        if st.answered > st.fast_seen or now >= st.fast_next:
            st.fast_next = self._fast_retransmit(st, now)
        if now >= st.next_check:
            self._expire(st, now)

    def _receive_many(self, active: list[_State], wait_s: float, keep: bool = False) -> None:
        """Waits up to ``wait_s`` for datagrams and takes them into the fetches of ``active``.

        Each goes to the fetch it names (``keep``: as for ``_receive_any``); returns once the
        sockets are drained or one of the fetches has ended.
        """
        socks, unconnected, trusted, rbuf = self._socks, self._sock, self._trusted, self._rbuf
        for fd, _ in self._poll.poll(max(0.0, wait_s) * 1e3):
            sock = socks[fd]
            if self._native is not None:
                self._drain_native_many(active, fd, sock is unconnected, keep)
                continue
            while True:
                try:
                    if sock is not unconnected:  # the kernel takes only the path's replies
                        nrecv = sock.recv_into(rbuf)
                    else:
                        nrecv, src = sock.recvfrom_into(rbuf)
                        if src not in trusted:
                            active[0].report.foreign += 1
                            continue
                except (BlockingIOError, InterruptedError):
                    break
                except ConnectionRefusedError:  # an ICMP error for an earlier GET
                    continue
                self._receive_any(active, nrecv, keep)
                if any(st.give_up is not None or not st.missing for st in active):
                    break

    def _listen_many(self, chunks: list[_State]) -> bool:
        """Takes the group's stream into the followed ``chunks`` (``follow_many``'s first part).

        The chunks send nothing; their MAC objects (``mac_of``) are fetched by unicast beside
        them, their timers kept as in ``_run_many``. Every datagram goes to the fetch it names;
        a replica of a chunk not among them is stashed for a later ``follow``. Returns once
        every chunk is whole and every MAC object ended, once the stream has brought the last
        fragment of every chunk still missing some (what they miss was lost), once each of
        those is in its stream's tail and quiet for its spell (``_quiet``: a lost last
        fragment leaves nothing after it to show the stream went past), once no chunk got a
        new fragment for ``stall_s`` (the first wait before the first), or at a chunk's
        deadline: the caller repairs what is missing.

        Returns:
            Whether it ended on a stall (``stall_s`` without a new fragment).
        """
        macs = [st.mac_of for st in chunks if st.mac_of is not None]
        while True:
            now = time.monotonic()
            for st in chunks:
                if not st.missing and not st.ended:
                    st.ended = now
            waiting = [st for st in chunks if st.missing]
            sending = [m for m in macs if m.missing and m.give_up is None]
            if not waiting and not sending:
                return False
            wake = math.inf
            if waiting:
                stall = max(st.last_progress for st in waiting) + waiting[0].stall_s
                quiet = stall
                if all(st.stream_high >= st.n - self.gap_fragments for st in waiting):
                    # Every chunk still missing some is in its stream's tail: once each has
                    # been quiet for its spell, the stream has ended for it (see ``_run``).
                    quiet = min(quiet, max(st.last_progress + self._quiet(st) for st in waiting))
                if (
                    all(st.stream_high >= st.n for st in waiting)
                    or now >= quiet
                    or now >= min(st.deadline for st in waiting)
                ):
                    return now >= stall
                wake = min(quiet, min(st.deadline for st in waiting))
            room = self.window - sum(len(m.inflight) for m in sending)
            for m in sending:
                try:
                    self._tick(m, now)
                    if room > 0:
                        before = len(m.inflight)
                        self._send(m, now, window=before + room)
                        room -= len(m.inflight) - before
                    tail = self._tail_probe(m, now, m.n) if m.inflight else now + self.timeout_s
                except _GiveUp as give_up:  # its MAC is fetched again when the chunk ends
                    m.give_up = give_up.reason
                    continue
                wake = min(wake, m.next_check, m.fast_next, tail, m.deadline)
            self._receive_many(waiting + sending, wake - now, keep=True)
            if self._progress is not None:
                self._advance([st for st in chunks if st.prefix < st.n])

    def _send_striped(self, active: list[_State], now: float, room: int) -> int:
        """Sends GETs stripe by stripe over every fetch in ``active`` (``fetch_many``'s stripes).

        Stripe ``s`` is fragments ``[s, s + 1) x stripe`` of each chunk: the window goes to the
        lowest stripe any chunk still misses, in every chunk, before the next one, so the
        chunks' first stripes (a KV chunk's first layers) arrive together.

        Returns:
            The GETs the window still has room for.
        """
        stripe = self._stripe
        live = [st for st in active if st.give_up is None and st.missing]
        firsts = [i for i in (st.frag.find(_MISSING) for st in live) if i >= 0]
        if not firsts:  # everything missing is asked for already
            return room
        limit = (min(firsts) // stripe + 1) * stripe
        top = max(st.n for st in live)
        while room > 0 and limit - stripe < top:
            for st in live:
                if room <= 0:
                    break
                before = len(st.inflight)
                self._send(st, now, limit=limit, window=before + room)
                room -= len(st.inflight) - before
            limit += stripe
        return room

    def _send(
        self, st: _State, now: float, limit: int | None = None, window: int | None = None
    ) -> None:
        """Sends GETs for missing fragments (below ``limit`` only, when given).

        Args:
            st: the fetch.
            now: the time now.
            limit: ask only for fragments below this one (None: all).
            window: GETs of this fetch in flight at most (None: the client's ``window``).
        """
        inflight = st.inflight
        window = self.window if window is None else window
        if len(inflight) >= window:
            return
        frag, k, owner = st.frag, self.frags_per_get, st.owner
        n = st.n if limit is None else min(limit, st.n)
        path = self.paths[st.path]
        pflags = path.flags
        gets, pack_into, flush = self._gets, KVP_STRUCT.pack_into, self._flush_gets
        tenant, group, key = st.tenant, st.get_group, st.key
        tries, fast = st.tries, st.fast
        rto0, rto_max = st.rto, self.max_timeout_s
        rrto = st.rrto or rto0
        scan, next_check, rid = st.scan, st.next_check, self._next_req
        # GETs are packed into consecutive slots of one buffer (q of them, request ids from
        # first on), their fragments marked as requested (so the next run is found after
        # them), and sent together: one sendmmsg where kvcast._native is in use.
        q, first = 0, rid
        while len(inflight) < window:
            i = frag.find(_MISSING, scan, n)
            if i < 0:
                scan = n
                break
            j = i + 1
            if k > 1:  # the run of missing fragments from i, at most k (found in C, not a loop)
                lim = min(i + k, n)
                r = frag.find(_REQUESTED, j, lim)
                p = frag.find(_PRESENT, j, lim if r < 0 else r)
                j = p if p >= 0 else r if r >= 0 else lim
            pack_into(gets, q * _GET_BYTES, _GET_VO, pflags, 0, 0, tenant, group, key, rid, 0,
                      i, j - i, 0, 0, 0, 0)  # fmt: skip
            if j == i + 1:
                frag[i] = _REQUESTED
                owner[i] = rid
            else:
                frag[i:j] = bytes([_REQUESTED]) * (j - i)
                owner[i:j] = array("L", (rid,)) * (j - i)
            t = tries[i]
            if t == 0:
                due = now + rto0
            else:  # a retry: see MIN_RETRY_TIMEOUT_S
                # its failures (timeouts, CRC failures, NACKs), not its fast re-sends
                fails = t - fast[i]
                due = now + (rrto if fails <= 1 else min(rto0 * (1 << fails), rto_max))
            if i == st.probe_frag:  # the tail probe: see _expire
                st.probe_frag = -1
                st.probe_rid = rid
            inflight[rid] = (i, j - i, due, now)
            if due < next_check:
                next_check = due
            rid = (rid + 1) & 0xFFFFFFFF
            scan = j
            q += 1
            if q == _GET_BATCH:
                sent = flush(path, q)
                st.report.gets_sent += sent
                if sent < q:  # the send buffer is full: the rest waits
                    scan, rid = self._take_back(st, (first + sent) & 0xFFFFFFFF, rid)
                    q = 0
                    break
                q, first = 0, rid
        if q == 1 and path.sock is not None:  # a lone GET (the steady state): one send
            try:
                path.sock.send(self._get_one)
                st.report.gets_sent += 1
            except BlockingIOError:
                scan, rid = self._take_back(st, first, rid)
            except OSError:  # unreachable now; the timeout retries it
                st.report.gets_sent += 1
        elif q:
            sent = flush(path, q)
            st.report.gets_sent += sent
            if sent < q:
                scan, rid = self._take_back(st, (first + sent) & 0xFFFFFFFF, rid)
        st.scan, st.next_check = scan, next_check
        if rid != self._next_req:
            st.rids_used = (rid - st.rid_base) & 0xFFFFFFFF
            self._next_req = rid

    def _flush_gets(self, path: _Path, count: int) -> int:
        """Sends the first ``count`` GETs packed in ``self._gets`` on ``path``.

        Several at once leave with one ``sendmmsg`` (``kvcast._native.send_gets``) where the
        extension is in use and the path has a connected socket; else (and a lone GET) with one
        ``send``/``sendto`` each. A GET the network refuses counts as sent (its timeout retries
        it); a full send buffer stops the sending.

        Returns:
            How many of the GETs were sent (the first ones).
        """
        conn = path.sock
        if count > 1 and conn is not None and self._native is not None:
            return int(self._native.send_gets(conn.fileno(), self._gets, _GET_BYTES, count))
        view = self._gets_view
        for q in range(count):
            msg = view[q * _GET_BYTES : (q + 1) * _GET_BYTES]
            try:
                if conn is not None:
                    conn.send(msg)
                else:
                    self._sock.sendto(msg, path.addr)
            except BlockingIOError:
                return q
            except OSError:
                pass  # unreachable now; the timeout retries it
        return count
