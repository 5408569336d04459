"""Recovery: retries with backoff, fast retransmits, tail probes, path changes and MAC checks.

Classes:
    _Recovery: decides what a lost, late or refused GET costs (``_release``, ``_expire``,
        ``_fast_retransmit``, ``_tail_probe``, ``_nack``), moves a fetch to its next path or
        to the pool's own client, measures round trips (RFC 6298), and checks a tenant's
        keyed MAC, repairing a forged chunk from the pool.
"""

from __future__ import annotations

import hmac
import math

import numpy as np

from kvcast import p4constants as c
from kvcast.fetch.report import RecomputeReason
from kvcast.fetch.state import (
    _FAST_CAP,
    _FB,
    _LOG,
    _MISSING,
    _PRESENT_BYTE,
    _REQUESTED,
    _SEG_FRAGS,
    FAST_REORDER_GETS,
    FAST_REPAIRS_MAX,
    TAIL_PROBE_SRTTS,
    _ClientBase,
    _Get,
    _GiveUp,
    _State,
)
from kvcast.integrity import (
    MAC_BYTES,
    SEGMENT_BYTES,
    chunk_mac,
    mac_count,
    mac_key_of,
    mac_object_bytes,
    segment_mac,
)


class _Recovery(_ClientBase):
    """The recovery side of ``FetchClient``."""

    @staticmethod
    def _on_path(st: _State, path: int) -> None:
        """Makes a fresh fetch start (and stay) on path ``path``."""
        st.path = path
        st.path_starts = [0] * (path + 1)

    def _verify_mac(self, st: _State, secret: bytes, deadline: float) -> None:
        """Compares the chunk with its MAC object.

        The MAC object is fetched unicast, switch then pool, unless ``fetch_many`` fetched it
        beside the chunk. On a mismatch the bytes are forged or rewritten (their CRCs
        matched): the failure is counted as an attack, and :meth:`_repair_from_pool` fetches
        chunk and MAC again from the pool directly; the chunk completes only if they then
        match. A chunk of which verified segments were already handed on (``fetch_many``'s
        progress) is not repaired: the repair would write into bytes its caller may be using;
        it ends ``MAC_MISMATCH``.

        Raises:
            _GiveUp: MAC_MISSING when it cannot be fetched, MAC_MISMATCH when it differs and
                the repair cannot be made or does not match either.
        """
        if self._mac_matches(st, secret, deadline, None):
            st.report.mac_verified = True
            return
        st.report.mac_failures += 1
        _LOG.warning(
            "chunk %#x of tenant %d does not match its MAC (forged or rewritten bytes with valid "
            "CRCs): dropping them and fetching again from the pool directly",
            st.key,
            st.tenant,
            extra={"event": "mac_failure", "tenant": st.tenant, "key": st.key},
        )
        if st.prefix:
            raise _GiveUp(RecomputeReason.MAC_MISMATCH)
        pool = self._repair_from_pool(st, deadline)
        if pool is None or not self._mac_matches(st, secret, deadline, pool):
            raise _GiveUp(RecomputeReason.MAC_MISMATCH)
        st.report.mac_verified = st.report.mac_repaired = True

    def _mac_matches(self, st: _State, secret: bytes, deadline: float, pool: int | None) -> bool:
        """Fetches the MAC object (all paths, or only pool path ``pool``) and compares.

        With ``pool`` None a MAC object ``fetch_many`` already fetched (``st.macs``) is used,
        and only the segments not compared yet against it are hashed.

        Raises:
            _GiveUp: MAC_MISSING when the MAC object cannot be fetched.
        """
        if pool is None and st.macs is not None:
            # Fetched beside the chunk, its segments compared as they arrived: only those not
            # compared yet are (the rest were hashed once already).
            return self._verified_segments(st, secret, st.n) == st.n
        mac_key = mac_key_of(st.key)
        size = mac_object_bytes(st.nbytes)
        if pool is not None and pool < 0:  # the pool's own client
            assert self.direct is not None
            buf = np.zeros(size, dtype=np.uint8)
            try:
                got = self.direct.get_into(st.tenant, mac_key, buf.data)
            except Exception as exc:  # a failed read is a missing MAC, as on KVP
                _LOG.info("direct read of the MAC of chunk %#x failed: %s", st.key, exc)
                got = None
            if got != size:
                raise _GiveUp(RecomputeReason.MAC_MISSING)
            got_macs = st.macs = buf.tobytes()
        else:
            buf = np.zeros(size, dtype=np.uint8)
            mac = self._start(st.tenant, mac_key, buf, size)
            if pool is not None:
                self._on_path(mac, pool)
            try:
                self._run(mac, deadline)
            except _GiveUp:
                raise _GiveUp(RecomputeReason.MAC_MISSING) from None
            finally:
                st.report.gets_sent += mac.report.gets_sent
            got_macs = st.macs = buf.tobytes()
        expected = chunk_mac(secret, st.tenant, st.key, st.out[: st.nbytes])
        return hmac.compare_digest(expected, got_macs)

    @staticmethod
    def _verified_segments(st: _State, secret: bytes, frags: int) -> int:
        """Fragments of ``st``'s first ``frags`` (all present) that its MAC object vouches for.

        Segments are compared with their MACs in order from the first not yet compared, up to
        the last one wholly within ``frags`` (the chunk's end counts as a segment's end);
        the first that differs stops it for good (``st.mac_bad``): ``_verify_mac`` decides.

        Returns:
            A fragment count: every fragment below it is verified.
        """
        macs = st.macs
        if macs is None or st.mac_bad:
            return min(st.mac_ok * _SEG_FRAGS, st.n)
        count = mac_count(st.nbytes)
        top = count if frags >= st.n else frags // _SEG_FRAGS
        while st.mac_ok < top:
            i = st.mac_ok
            data = st.out[i * SEGMENT_BYTES : min((i + 1) * SEGMENT_BYTES, st.nbytes)]
            mac = segment_mac(secret, st.tenant, st.key, i, count, data)
            if not hmac.compare_digest(mac, macs[i * MAC_BYTES : (i + 1) * MAC_BYTES]):
                st.mac_bad = True
                break
            st.mac_ok += 1
        return min(st.mac_ok * _SEG_FRAGS, st.n)

    def _repair_from_pool(self, st: _State, deadline: float) -> int | None:
        """Drops a chunk's bytes and fetches them again from the pool directly.

        The pool's own client (``direct``) first, else KVP GETs to ``pool_addr`` only (NOCACHE:
        neither switch SRAM nor the service path). Counts the fragments that changed.

        Returns:
            Where the MAC must come from too: -1 for the pool's own client, else the pool
            path's index; None when there is no such source or it failed.
        """
        before = bytes(st.out[: st.nbytes])
        st.out[: st.nbytes] = bytes(st.nbytes)  # the forged bytes are dropped whatever happens
        source: int | None = None
        if self.direct is not None:
            try:
                got = self.direct.get_into(st.tenant, st.key, st.out[: st.nbytes])
            except Exception as exc:  # the KVP pool path may still repair
                _LOG.info("direct repair read of chunk %#x failed: %s", st.key, exc)
                got = None
            if got == st.nbytes:
                source = -1
                st.report.path = "direct"
                st.report.direct_bytes += got
        pool = next((i for i, p in enumerate(self.paths) if p.name == "pool"), None)
        if source is None and pool is not None:
            again = self._start(st.tenant, st.key, st.dst, st.nbytes)
            self._on_path(again, pool)
            try:
                self._run(again, deadline)
                source = pool
                st.report.path = "pool"
            except _GiveUp:
                pass
            finally:
                st.report.gets_sent += again.report.gets_sent
                st.report.retries += again.report.retries
                st.report.fell_back = True
        if source is None:
            return None
        after = st.out[: st.nbytes]
        st.report.forged_fragments += sum(
            before[i : i + _FB] != after[i : i + _FB] for i in range(0, st.nbytes, _FB)
        )
        return source

    @staticmethod
    def _take_back(st: _State, rid: int, end: int) -> tuple[int, int]:
        """Takes back the packed GETs ``rid .. end - 1`` that a full send buffer refused.

        Their fragments are missing again and they leave the GETs in flight; their request ids
        are handed out again.

        Returns:
            Where the next ``_send`` resumes: (the first refused GET's first fragment, its
            request id).
        """
        frag, inflight = st.frag, st.inflight
        resume = inflight[rid][0]
        r = rid
        while r != end:
            i, count, _due, _sent = inflight.pop(r)
            frag[i : i + count] = bytes([_MISSING]) * count
            r = (r + 1) & 0xFFFFFFFF
        return resume, rid

    def _release(self, st: _State, rid: int, g: _Get, failed: bool, fast: bool = False) -> None:
        """Returns a GET's still-requested fragments to MISSING.

        Args:
            st: the fetch.
            rid: the GET's request id.
            g: the GET.
            failed: count a retry (the fragments are sent again).
            fast: the retry is on evidence of loss (fast retransmit, tail probe): it counts
                towards FAST_REPAIRS_MAX, not towards the path's ``max_retries``.

        Raises:
            _GiveUp: a fragment used up its retries on the last path.
        """
        frag, owner, tries, nfast = st.frag, st.owner, st.tries, st.fast
        start, count = g[0], g[1]
        exhausted = False
        for f in range(start, start + count):
            if frag[f] == _REQUESTED and owner[f] == rid:
                frag[f] = _MISSING
                if failed:
                    tries[f] = min(tries[f] + 1, 255)
                    if fast and nfast[f] < FAST_REPAIRS_MAX:
                        nfast[f] += 1
                    exhausted |= tries[f] - nfast[f] > self.max_retries
        st.scan = min(st.scan, start)
        if failed:
            st.report.retries += 1
        if exhausted:
            self._next_path(st, RecomputeReason.NO_ANSWER)

    def _fast_retransmit(self, st: _State, now: float) -> float:
        """Releases GETs overtaken by FAST_REORDER_GETS answered ones (see that constant).

        Overtaken GETs are released once a round trip and a reordering window (a quarter of
        it, or two deviations if more: jitter) have passed since they were sent (as RACK),
        retries as well as first tries, until a fragment of theirs has been sent again
        FAST_REPAIRS_MAX times so.

        Returns:
            When an overtaken GET's window ends next (inf: none waits).
        """
        st.fast_seen = st.answered
        limit = st.answered - FAST_REORDER_GETS
        base, nfast = st.rid_base, st.fast
        wait = st.srtt + max(st.srtt / 4, 2 * st.rttvar)
        due = math.inf
        for rid, g in list(st.inflight.items()):
            if (rid - base) & 0xFFFFFFFF >= limit:
                continue
            if nfast.find(_FAST_CAP, g[0], g[0] + g[1]) >= 0:
                continue  # re-sent on evidence often enough: its timeout decides
            if now < g[3] + wait:
                due = min(due, g[3] + wait)
                continue
            st.report.fast_retransmits += 1
            self._give_up_get(st, rid, g, fast=True)
        return due

    def _give_up_get(self, st: _State, rid: int, g: _Get, fast: bool = False) -> None:
        """Stops waiting for GET ``rid``: its fragments are asked again.

        ``fast``: on evidence of loss (see ``_release``). A late answer still counts:
        ``st.late`` keeps the GET's send time (bounded).
        """
        del st.inflight[rid]
        if len(st.late) >= 4096:
            st.late.clear()
        st.late[rid] = g[3]
        self._release(st, rid, g, failed=True, fast=fast)

    def _tail_probe(self, st: _State, now: float, limit: int) -> float:
        """Probes the tail once the fetch has heard nothing for a probe time (TCP's TLP).

        At the tail (nothing below ``limit`` left to ask for) no later GET can overtake a lost
        one, so fast retransmit cannot see its loss, and the timeout's floor would cost the
        whole fetch. Once no reply has come for a probe time (TAIL_PROBE_SRTTS round trips
        plus four deviations, counted from the later of a GET's send and the fetch's last
        reply), the latest-sent first-try GET in flight is sent again: one probe per quiet
        spell, as TCP sends one segment, not its window. Its answer either ends the fetch or
        shows the earlier GETs lost (fast retransmit then releases them); if the probe goes
        unanswered too, the timeouts decide. A stall anywhere on the path (a busy switch or
        pool node, or replies queued behind each other on a slow link) thus costs at most one
        duplicate answer per quiet spell; re-sending every GET whose probe time had passed
        once sent a second copy of a small chunk whose whole window was in flight.

        Returns:
            When the next probe is due (inf: none).
        """
        if not st.srtt or st.frag.find(_MISSING, 0, min(limit, st.n)) >= 0:
            return math.inf
        if st.probe_at and st.last_reply < st.probe_at:
            return math.inf  # a probe is out and nothing has answered since: it decides
        pto = max(self.tail_probe_min_s, TAIL_PROBE_SRTTS * st.srtt + 4 * st.rttvar)
        if pto >= st.rto:
            return math.inf  # the timeout comes first
        tries, due, heard = st.tries, math.inf, st.last_reply
        probe: tuple[int, _Get] | None = None
        for rid, g in st.inflight.items():
            if tries.count(0, g[0], g[0] + g[1]) != g[1]:
                continue
            quiet_from = g[3] if g[3] > heard else heard
            if now < quiet_from + pto:
                due = min(due, quiet_from + pto)
            elif probe is None or g[3] >= probe[1][3]:
                probe = (rid, g)
        if probe is None:
            return due
        st.report.tail_probes += 1
        st.probe_at = now
        st.probe_frag = probe[1][0]
        self._give_up_get(st, probe[0], probe[1], fast=True)
        return now  # send it again at once

    def _expire(self, st: _State, now: float) -> None:
        """Releases every GET whose deadline passed; sets ``next_check`` to the next one.

        A tail probe's timeout (a retry's, short) is put off while GETs sent before it are
        unanswered: a path answers in order, so the probe's answer comes after theirs. When
        the probe went out because a slow link's first replies came in a burst and the next
        one took longer (a token bucket: jumbo DATAs on the emulation's 2 Mbit/s pool link),
        its own short timeout otherwise expired twice behind the queue, each a duplicate
        DATA; a probe sent when nothing else is unanswered (its GET lost) is timed as before.
        """
        inflight = st.inflight
        next_check = math.inf
        for rid, g in list(inflight.items()):
            if g[2] > now:
                next_check = min(next_check, g[2])
            elif rid == st.probe_rid and any(h[3] < g[3] for h in inflight.values()):
                inflight[rid] = g = (g[0], g[1], now + (g[2] - g[3]), g[3])
                next_check = min(next_check, g[2])
            elif inflight.pop(rid, None) is not None:  # else gone with a path change
                st.report.timeouts += 1
                if len(st.late) >= 4096:
                    st.late.clear()
                st.late[rid] = g[3]
                self._release(st, rid, g, failed=True)
        st.next_check = next_check

    def _next_path(self, st: _State, reason: RecomputeReason) -> None:
        """Moves to the next path (the pool, directly), or gives up with ``reason``."""
        if st.path + 1 >= len(self.paths):
            raise _GiveUp(reason)
        st.path += 1
        st.report.fell_back = True
        frag = st.frag
        for start, count, _, _ in st.inflight.values():
            for f in range(start, start + count):
                if frag[f] == _REQUESTED:
                    frag[f] = _MISSING
        st.inflight.clear()
        st.path_starts.append(st.rids_used)
        st.tries = bytearray(st.n)
        st.fast = bytearray(st.n)
        st.scan = 0

    def _read_direct(self, st: _State) -> None:
        """Reads the whole chunk through the pool's own client; on failure, KVP goes on."""
        st.want_direct = False
        st.direct_done = True  # once per fetch
        assert self.direct is not None
        # A prefix already reported to fetch_many's progress callback is never written again:
        # the read then goes to a scratch buffer and only what follows the prefix is copied.
        done = min(st.prefix * _FB, st.nbytes)
        into = st.out[: st.nbytes] if not done else memoryview(bytearray(st.nbytes))
        try:
            n = self.direct.get_into(st.tenant, st.key, into)
        except Exception as exc:  # any failure of the other path leaves the KVP fetch running
            _LOG.info("direct read of chunk %#x failed, KVP goes on: %s", st.key, exc)
            n = None
        if n != st.nbytes:
            return
        if done:
            st.out[done : st.nbytes] = into[done:]
        st.report.path = "direct"
        st.report.direct_bytes = n
        st.frag[:] = _PRESENT_BYTE * st.n
        st.missing = 0
        st.inflight.clear()

    def _release_or_give_up(self, st: _State, rid: int, g: _Get, failed: bool) -> None:
        """``_release``, keeping a give-up in ``st.give_up`` instead of raising it.

        The native path's events of one batch may belong to several fetches: the rest of the
        batch must still be booked when one of them gives up.
        """
        try:
            self._release(st, rid, g, failed)
        except _GiveUp as give_up:
            if st.give_up is None:
                st.give_up = give_up.reason

    def _sample_rtt(self, st: _State, rtt: float) -> None:
        """One GET's round trip into the timeout (RFC 6298's estimator).

        Each GET has its own request id and a retry gets a new one, so every reply names the
        GET it answers and every sample is unambiguous (no Karn's rule needed), the late reply
        to a GET that already timed out included: that is the sample that matters most. The
        first try's timeout is ``srtt + 4 rttvar``, never below the client's first timeout nor
        above its largest: a switch or pool link that queues replies longer than the first
        timeout (a software switch answering N hosts' GETs one by one) makes the GETs wait longer
        instead of being sent again and queued twice. A retry's is the same without the first
        timeout's floor (``min_retry_timeout_s`` instead).
        """
        if st.srtt == 0.0:
            st.srtt, st.rttvar = rtt, rtt / 2
        else:
            st.rttvar = 0.75 * st.rttvar + 0.25 * abs(st.srtt - rtt)
            st.srtt = 0.875 * st.srtt + 0.125 * rtt
        rto = st.srtt + 4 * st.rttvar
        st.rto = min(self.max_timeout_s, max(self.timeout_s, rto))
        st.rrto = min(self.max_timeout_s, max(self.min_retry_timeout_s, rto))

    def _nack(self, st: _State, rid: int, status: int, path: int | None) -> None:
        if path != st.path:
            return  # about a path already abandoned
        if status == c.KVP_STATUS_NOT_FOUND:
            self._next_path(st, RecomputeReason.NOT_FOUND)
        elif status == c.KVP_STATUS_BAD_REQUEST:
            raise _GiveUp(RecomputeReason.REFUSED)
