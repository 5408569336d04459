"""Receiving: every datagram checked (source, tenant, key, request, range, CRC) and placed.

Classes:
    _Receiver: the Python receive path (``_receive``: one datagram into one fetch) and the
        native one (``kvcast._native``: batches of datagrams checked and copied in C, then
        their events applied here), and the stash of replicas of the group's other chunks.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Sequence

from kvcast import p4constants as c
from kvcast.fetch.recovery import _Recovery
from kvcast.fetch.state import (
    _DATA_VO,
    _EVENT_FIELDS,
    _FB,
    _HDR,
    _NACK_VO,
    _NO_PORT,
    _PRESENT,
    _PRESENT_BYTE,
    _SLOT,
    _TENANT_KEY,
    STASH_MAX_BYTES,
    _Get,
    _GiveUp,
    _State,
)
from kvcast.kvp import frag_count
from kvcast.wire import KVP_STRUCT


class _Receiver(_Recovery):
    """The receive side of ``FetchClient``."""

    def _keep(self, tenant: int, key: int, nrecv: int) -> None:
        """Stashes the datagram in the receive buffer for a later ``follow`` of its chunk."""
        datagram = bytes(self._rview[:nrecv])
        self._stash.setdefault((tenant, key), []).append(datagram)
        self._stash_bytes += nrecv
        while self._stash_bytes > STASH_MAX_BYTES and self._stash:
            oldest = next(iter(self._stash))
            dropped = self._stash.pop(oldest)
            self._stash_bytes -= sum(len(d) for d in dropped)

    def _drain_native(self, st: _State, fd: int, check_src: bool) -> None:
        """Receives what ``fd`` holds through kvcast._native (the same checks as ``_receive``).

        The C side takes each DATA that answers one of this fetch's GETs within the fragments
        that GET owns (or a replica of this host's group), checks its CRC, copies its new
        fragments into the buffer and marks them present; this method then does the per-GET
        bookkeeping from its events. Every other datagram comes back as bytes and goes through
        ``_receive``.
        """
        nat = self._native
        assert nat is not None
        recv_fetch, rbuf, stream, report = nat.recv_fetch, self._rbuf, st.stream, st.report
        while st.missing:
            stream[0] = stream[1] = stream[2] = stream[3] = stream[4] = 0
            nev, slow, foreign, drained = recv_fetch(
                fd, self._rx, _SLOT, check_src, self._trusted_ints, _NO_PORT, _DATA_VO,
                st.tenant, st.key, st.get_group, self.group, st.crc_seed, st.nbytes, _FB,
                st.rid_base, st.rids_used, st.out, st.frag, st.owner, self._events, stream,
            )  # fmt: skip
            report.foreign += foreign
            if nev:
                self._apply_events((st,), nev)
                if st.give_up is not None:
                    raise _GiveUp(st.give_up)
            self._count_stream(st)
            for datagram in slow:
                n = len(datagram)
                rbuf[:n] = datagram
                self._receive(st, n)
            if drained:
                return

    @staticmethod
    def _count_stream(st: _State) -> None:
        """Books the replicas the native path counted in ``st.stream`` (a group's stream)."""
        hit, pool, dups, bad, high = st.stream[:5]
        if high > st.stream_high:
            st.stream_high = high
        if hit or pool or dups or bad:
            new = hit + pool
            st.missing -= new
            report = st.report
            report.frags_hit += hit
            report.frags_pool += pool
            report.frags_stream += new
            report.duplicates += dups
            report.crc_failures += bad
            if new and st.listening:
                st.last_progress = time.monotonic()
                st.arrivals += 1

    def _drain_native_many(
        self, active: list[_State], fd: int, check_src: bool, keep: bool = False
    ) -> None:
        """``_drain_native`` for several fetches at once (``kvcast._native.recv_fetches``).

        Returns once the socket is drained or one of the fetches has ended (complete, or given
        up: ``st.give_up``). ``keep``: as for ``_receive_any``.
        """
        nat = self._native
        assert nat is not None
        recv_fetches, rbuf, events = nat.recv_fetches, self._rbuf, self._events
        while True:
            fetches = []
            for st in active:
                stream = st.stream
                stream[0] = stream[1] = stream[2] = stream[3] = stream[4] = 0
                fetches.append(
                    (st.tenant, st.key, st.get_group, st.crc_seed, st.nbytes, st.rid_base,
                     st.rids_used, st.out, st.frag, st.owner, stream)
                )  # fmt: skip
            nev, slow, foreign, drained = recv_fetches(
                fd, self._rx, _SLOT, check_src, self._trusted_ints, _NO_PORT, _DATA_VO,
                self.group, _FB, tuple(fetches), events,
            )  # fmt: skip
            active[0].report.foreign += foreign
            if nev:
                self._apply_events(active, nev)
            for st in active:
                self._count_stream(st)
            for datagram in slow:
                n = len(datagram)
                rbuf[:n] = datagram
                self._receive_any(active, n, keep)
            if drained or any(st.give_up is not None or not st.missing for st in active):
                return

    def _receive_any(self, active: list[_State], nrecv: int, keep: bool = False) -> None:
        """``_receive`` for the fetch in ``active`` the datagram in the buffer names.

        A give-up is kept in that fetch's ``give_up``; a datagram for none of them is counted
        as ignored by the first, or, with ``keep`` (a follower), stashed for a later
        ``follow`` when it is a replica of this host's group.
        """
        if nrecv >= _HDR:
            tenant, key = _TENANT_KEY.unpack_from(self._rbuf)
            for st in active:
                if st.key == key and st.tenant == tenant:
                    try:
                        self._receive(st, nrecv)
                    except _GiveUp as give_up:
                        if st.give_up is None:
                            st.give_up = give_up.reason
                    return
        if keep:
            self._receive(active[0], nrecv)  # stashes a replica of another chunk
            return
        active[0].report.ignored += 1

    def _apply_events(self, states: Sequence[_State], nev: int) -> None:
        """Per-GET bookkeeping of the DATA the native path took (as the tail of ``_receive``).

        Every event answers one of the GETs of ``states[index]``, its last field the index
        (replicas are only counted, in C).
        """
        ev = self._events
        for i in range(0, nev * _EVENT_FIELDS, _EVENT_FIELDS):
            rid, first, last, new, flags, crc_ok, index = ev[i : i + _EVENT_FIELDS]
            st = states[index]
            report, inflight = st.report, st.inflight
            g = inflight.get(rid)
            if not crc_ok:
                report.crc_failures += 1
                if g is not None:
                    del inflight[rid]
                    self._release_or_give_up(st, rid, g, failed=True)
                continue
            self._time_reply(st, rid, g)
            if new == 0:
                report.duplicates += 1
            else:
                self._book_new(st, new, flags, last, from_get=True)
            if g is not None:
                self._retire_get(st, rid, g, first, flags, self._release_or_give_up)

    def _book_new(self, st: _State, new: int, flags: int, last: int, *, from_get: bool) -> None:
        """Books ``new`` fragments a checked DATA brought into ``st`` (both receive paths).

        Args:
            st: the fetch.
            new: fragments it wrote that were missing (> 0).
            flags: the DATA's flags (``KVP_FLAG_HIT``: from switch SRAM).
            last: one past its last fragment.
            from_get: it answers one of this fetch's GETs (else it is a replica of the group's
                stream).
        """
        report = st.report
        st.missing -= new
        if flags & c.KVP_FLAG_HIT:
            report.frags_hit += new
        else:
            report.frags_pool += new
            if from_get and self.direct is not None and not st.direct_done:
                st.want_direct = st.get_group == 0 and not st.follower
        if not from_get:
            report.frags_stream += new
            if last > st.stream_high:
                st.stream_high = last
        elif st.follower:
            report.repairs += new
        if st.listening:
            st.last_progress = time.monotonic()
            st.arrivals += 1

    def _time_reply(self, st: _State, rid: int, g: _Get | None) -> None:
        """Samples the round trip of a reply to GET ``rid`` (``g``: in flight; else a late one).

        Both receive paths call this for every DATA that passed its checks.
        """
        if g is not None:
            st.last_reply = time.monotonic()
            self._sample_rtt(st, st.last_reply - g[3])
            off = (rid - st.rid_base) & 0xFFFFFFFF
            if off > st.answered:
                st.answered = off
        elif rid in st.late:
            st.last_reply = time.monotonic()
            self._sample_rtt(st, st.last_reply - st.late.pop(rid))

    @staticmethod
    def _retire_get(
        st: _State,
        rid: int,
        g: _Get,
        first: int,
        flags: int,
        release: Callable[[_State, int, _Get, bool], None],
    ) -> None:
        """Ends GET ``rid`` once its DATA is in: a switch hit, or every fragment it asked for.

        Args:
            st: the fetch.
            rid: the GET's request id.
            g: the GET (first fragment, count, ...).
            first: the first fragment of the DATA that answered it.
            flags: that DATA's flags.
            release: how to hand back the rest of a hit GET's range (``_release``, or
                ``_release_or_give_up`` on the native path).
        """
        if flags & c.KVP_FLAG_HIT:
            # The switch answers a GET with its first fragment only: ask for the rest anew.
            del st.inflight[rid]
            if g[1] > 1 or first != g[0]:
                release(st, rid, g, False)
        elif st.frag.count(_PRESENT_BYTE, g[0], g[0] + g[1]) == g[1]:
            del st.inflight[rid]

    def _receive(self, st: _State, nrecv: int) -> None:
        report = st.report
        if nrecv < _HDR:
            report.ignored += 1
            return
        (vo, flags, status, _r0, tenant, group, key, rid, _epoch, first, total, plen, _r1, _ix,
         crc) = KVP_STRUCT.unpack_from(self._rbuf)  # fmt: skip
        if (vo != _DATA_VO and vo != _NACK_VO) or tenant != st.tenant or key != st.key:
            if vo == _DATA_VO and flags & c.KVP_FLAG_REPLICA and group != 0 and group == self.group:
                self._keep(tenant, key, nrecv)
                report.stashed += 1
            else:
                report.ignored += 1
            return
        off = (rid - st.rid_base) & 0xFFFFFFFF
        path: int | None = None
        if off < st.rids_used:  # one of this fetch's GETs: on which path did it go?
            p = st.path
            while off < st.path_starts[p]:
                p -= 1
            path = p
        if path is None and not (
            vo == _DATA_VO and flags & c.KVP_FLAG_REPLICA and group != 0 and group == self.group
        ):
            report.ignored += 1
            return
        if vo == _NACK_VO:
            report.nacks += 1
            self._nack(st, rid, status, path)
            return
        n = st.n
        last = first + frag_count(plen)
        lo = first * _FB
        if (
            plen == 0
            or plen > nrecv - _HDR
            or total != n
            or last > n
            or lo + plen != min(last * _FB, st.nbytes)
        ):
            report.invalid += 1
            return
        g = st.inflight.get(rid)
        if path is not None and (
            group != st.get_group or g is not None and (first < g[0] or last > g[0] + g[1])
        ):
            # An answer to one of our GETs must name the GET's group and stay in its range.
            report.invalid += 1
            return
        payload = self._full_payload if plen == _FB else self._rview[_HDR : _HDR + plen]
        if zlib.crc32(payload, zlib.crc32(self._frag_idx_field, st.crc_seed)) != crc:
            report.crc_failures += 1
            if g is not None:
                del st.inflight[rid]
                self._release(st, rid, g, failed=True)
            return
        self._time_reply(st, rid, g)
        frag = st.frag
        if last == first + 1:
            new = 0 if frag[first] == _PRESENT else 1
        else:
            new = (last - first) - frag.count(_PRESENT_BYTE, first, last)
        if new == 0:
            report.duplicates += 1
        else:
            if new == last - first:
                st.out[lo : lo + plen] = payload
            else:  # fragments already present are never written again (fetch_many's progress)
                for i in range(first, last):
                    if frag[i] != _PRESENT:
                        a = i * _FB
                        b = min(a + _FB, lo + plen)
                        st.out[a:b] = payload[a - lo : b - lo]
            if new == 1 and last == first + 1:
                frag[first] = _PRESENT
            else:
                frag[first:last] = _PRESENT_BYTE * (last - first)
            self._book_new(st, new, flags, last, from_get=path is not None)
        if g is not None:
            self._retire_get(st, rid, g, first, flags, self._release)
