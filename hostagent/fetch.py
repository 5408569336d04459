"""The host agent's fetch client: one chunk from the switch, else the DRAM pool, else "recompute".

``FetchClient.fetch`` fills a preallocated uint8 tensor (pinned where CUDA exists) with one chunk's
bytes. It sends pipelined GETs (at most ``window`` outstanding) to the service address (the switch
VIP: a hit comes back from switch SRAM with ``HIT``, a miss is forwarded to the key's pool node and
comes back with ``POOL``); each DATA is received with ``recv_into`` into one reusable buffer,
checked (tenant, key, request id, fragment range, length, CRC) and copied once, straight to
``offset = frag_idx * FRAG_BYTES`` of the tensor. No bytes object is made per fragment: the CRC
runs over views of the receive buffer made once (the payload, and the header's frag_idx field for
the seed), and the copy is the one write into the tensor. A per-fragment state array tracks what is
missing, requested or present. A GET unanswered in time is resent with exponential backoff; once a
fragment has been retried ``max_retries`` times, or the pool answers ``NOT_FOUND`` through the
switch, the client asks the DRAM pool directly (``pool_addr``, GETs with ``NOCACHE``), keeping
every fragment it already verified (keys are content hashes: the same key is the same bytes from
any source). When that fails too the answer is ``RECOMPUTE``: ordinary misses are outcomes, never
exceptions, and a partly filled tensor is never reported as valid.

Group fetch: N hosts that need the same chunk share one multicast stream. The **leader** runs
``fetch`` with a client whose ``group`` is G: its GETs name G, so the switch multicasts each hit
(or, with ``nocache``, the pool's multi-fragment DATA) to every member of G. The **followers**
run ``follow``: they send nothing at first and take the replicas of G for the chunk (flag
``REPLICA``) with the same checks; when the stream stalls (no new fragment for ``stall_s``) a
follower repairs what it still misses with its own unicast GETs, switch first and the pool
directly after, so it too ends complete or with a clear ``RECOMPUTE``.

Trust: datagrams are taken only from the service address and the pool addresses the client was
given (``pool_addr``, ``pool_addrs``), never from "any sender whose UDP source port is the KVP
port"; a DATA or NACK counts only for one of this fetch's own GETs, or, as a replica, for this
client's group. With a tenant key (``mac_keys``), a chunk whose MAC does not match is counted as
an attack (``mac_failures``), its bytes are dropped, and chunk and MAC are fetched again from the
pool directly (the pool's own client, else KVP to ``pool_addr``); only a match then completes it.

Reports: a client given a ``reporter`` (``hostagent.reports.ReportSink``) hands it one access
record per fetch or follow (``entry_from_fetch``: the chunk, this host, the wall-clock time,
``hit`` when most fragments came from switch SRAM) after the fetch has ended; the sink only
queues it, so reporting never delays or fails a fetch.

Classes:
    FetchOutcome: COMPLETE or RECOMPUTE.
    RecomputeReason: why a fetch gave up.
    FetchReport: what one fetch did (bytes, fragments from switch vs pool, retries, CRC
        failures, duration).
    FetchClient: the UDP client (one socket, one fetch at a time).
    FetchError: the caller passed something unusable (wrong tensor, chunk too large).
"""

from __future__ import annotations

import enum
import hmac
import logging
import math
import random
import select
import socket
import struct
import time
import zlib
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from hostagent.integrity import MAC_BYTES, check_keys, chunk_mac, mac_key_of
from hostagent.layout import MAX_FRAGMENTS, KVLayout
from hostagent.reports import ReportSink, entry_from_fetch
from kvcast import p4constants as c
from kvcast.kvclass import KvClass
from kvcast.native import enabled as native_enabled
from kvcast.wire import KVP_STRUCT, chunk_crc_seed
from poolnode.backend import PoolBackend
from poolnode.server import DEFAULT_MTU, frags_per_data

Address = tuple[str, int]

_LOG = logging.getLogger(__name__)

_HDR = c.KVP_HDR_BYTES
_FB = c.FRAG_BYTES
_GET_BYTES = _HDR + _FB
_GET_BATCH = 64  # the most GETs packed and sent together (kvcast._native.send_gets)
_GET_VO = (c.KVP_VERSION << 4) | c.KVP_OP_GET
_DATA_VO = (c.KVP_VERSION << 4) | c.KVP_OP_DATA
_NACK_VO = (c.KVP_VERSION << 4) | c.KVP_OP_NACK
# The native receive path also accepts any sender whose source port equals this argument: no
# UDP port is -1, so only the trusted addresses are accepted.
_NO_PORT = -1
# The native path's receive slots (one datagram each, any UDP size) and event record width.
_SLOT = 65536
# The tenant and key of a KVP header (kvp_t), to find the fetch a datagram is for.
_TENANT_KEY = struct.Struct("!4xH2xQ")
_EVENT_FIELDS = 7
# Replica counters (5), then what the native path learned of the stream's DATA to receive the
# next ones in place: the fragment after the last DATA, the most fragments one has carried.
_STREAM_FIELDS = 7
# The most fragments a DATA carries (a 65,535-byte IP datagram), a bound on what is learned.
_MAX_DATA_FRAGS = frags_per_data(65535)
# Fetches one call of the native receive takes at once (kvcast/_native.c's MAX_FETCHES).
MAX_FETCHES = 64
# A follower asks for a missing fragment itself once the group's stream is this many fragments
# past it (a loss, not a reordering), instead of waiting for the stream to stall.
GAP_FRAGMENTS = 64
# A GET still unanswered when this many GETs sent after it on the same path have been answered
# was lost (a path answers in order; this much reordering is tolerated) once a round trip and a
# reordering window have passed since it was sent: its fragments are asked for again then,
# instead of after the timeout (TCP's fast retransmit, timed as RACK). A retry too: it has a
# request id of its own, so GETs sent after it that are answered show its loss as they show a
# first try's. A first try's timeout never goes below the client's first timeout, so without
# this one lost fragment costs the whole fetch that timeout.
FAST_REORDER_GETS = 3
# A fragment is sent again on evidence of its loss (fast retransmit, tail probe) at most this many
# times; such re-sends do not use up the path's ``max_retries`` (later GETs were answered, so
# the path works and only this fragment was unlucky: at 20 % loss a fragment's answer is lost
# on three round trips in a row once in 20), only timeouts, CRC failures and NACKs do. Beyond
# the cap its timeout decides, so a fragment no path ever answers still gives up.
FAST_REPAIRS_MAX = 8
# The shortest retry timeout. A retry's timeout is the measured ``srtt + 4 rttvar`` (RFC 6298;
# doubled per timeout of its fragment), not the client's first timeout: a retry is sent after
# at least one round trip, into a queue the samples describe. The floor covers what the samples
# do not: nothing answers late on purpose (a pool node and the switch answer each GET at once;
# no delayed ACKs, the reason for TCP's 200 ms floor), but the answering process may wait for
# a CPU. On the emulation a dozen processes share 2 CPUs, and Linux's scheduler (EEVDF) gives
# each runnable task a slice of 0.75 ms x (1 + log2 CPUs) = 1.5 ms, so a process behind five
# others on its CPU answers up to about 8 ms late: 10 ms keeps such a wait from being taken
# for a loss. A spurious retry costs one duplicate answer. A fragment that has failed twice
# (its retry went unanswered too) is more likely behind an outage than unlucky (at 1 % loss
# one in 2,500): its later retries back off from the first-try timeout as before, so a path
# still gets about as long as it did (13 first timeouts and one retry timeout over three
# retries, against 15 first timeouts) to come back (a restarted pool node or switch) before
# the client gives it up.
MIN_RETRY_TIMEOUT_S = 0.01
# A follower whose stream has reached its tail (within GAP_FRAGMENTS of the end) and then gone
# quiet for QUIET_FACTOR times its mean fragment spacing (at least QUIET_MIN_S, at most the
# stall time) takes the stream as ended and repairs the tail's losses at once: nothing after a
# lost last fragment would tell it the stream went past it, and the stall is long (it must
# outlast the leader's longest GET timeout). The floor is MIN_RETRY_TIMEOUT_S's: the leader, the
# switch or the pool node may wait that long for a CPU, and a quiet spell taken for the end
# costs a repair of every fragment still missing in the tail (at 5 ms, under load on the 2-CPU
# emulation, followers re-asked 7-11 GETs' worth of a 32 KiB prefix the stream then brought).
QUIET_FACTOR = 16
QUIET_MIN_S = MIN_RETRY_TIMEOUT_S
# ... and at least QUIET_ARRIVALS times the mean time between its arrivals: a jumbo DATA carries
# 34 fragments, so 16 fragment spacings were half of one DATA's spacing on a slow pool link
# (8.7 KB every 35 ms at 2 Mbit/s), and every follower of a 32-host group repaired its tail
# while the stream was still coming (62 redundant GETs to the pool per point in the demo).
QUIET_ARRIVALS = 3
# At the tail of a fetch no later GET can overtake a lost one: a first-try GET unanswered for
# this many smoothed round trips plus four deviations (at least TAIL_PROBE_MIN_S) is sent again
# (TCP's tail loss probe); a spurious probe costs one duplicate answer.
TAIL_PROBE_SRTTS = 2.0
TAIL_PROBE_MIN_S = 0.005
# Chunks ``fetch_many`` keeps in flight at once by default: enough that the next chunks' GETs
# fill the window while the first chunk's last answers are on the way.
DEFAULT_CHUNKS_IN_FLIGHT = 4
# A follower that takes one chunk's stream after another (``follow``) keeps the replicas of its
# group's other chunks it reads meanwhile (the leader asks for several chunks at once, and a
# follower that starts late finds them all queued): up to this many bytes, oldest dropped first.
STASH_MAX_BYTES = 32 << 20
_MISSING, _REQUESTED, _PRESENT = 0, 1, 2
_PRESENT_BYTE = bytes([_PRESENT])
_FAST_CAP = bytes([FAST_REPAIRS_MAX])
# Offset of frag_idx in the KVP header (kvp_t: 4 x 8 bit, tenant, group, key, req_id, epoch).
_FRAG_IDX_AT = 24
if KVP_STRUCT.unpack(bytes(range(_HDR)))[9] != (_FRAG_IDX_AT << 8) | (_FRAG_IDX_AT + 1):
    raise ImportError("_FRAG_IDX_AT does not match KVP_STRUCT")  # pragma: no cover


class FetchError(ValueError):
    """The fetch cannot start: the destination tensor or the chunk length is unusable."""


class FetchOutcome(enum.Enum):
    """How a fetch ended."""

    COMPLETE = "complete"
    """Every fragment arrived and passed its CRC: the tensor holds the chunk."""
    RECOMPUTE = "recompute"
    """The chunk could not be had: prefill it again. The tensor's contents are undefined."""


class RecomputeReason(enum.Enum):
    """Why a fetch ended in ``RECOMPUTE`` (``NONE`` when it completed)."""

    NONE = "none"
    NOT_FOUND = "not_found"
    """The pool answered NOT_FOUND on the last path."""
    REFUSED = "refused"
    """The pool answered BAD_REQUEST: it refused the GET. A NACK carries no more than that; the
    pool node's counters say which check it failed: a fragment range or length other than what
    it holds (a layout mismatch, ``bad_ranges``), a group it does not serve
    (``unknown_groups``), a tenant or source it does not accept (``bad_tenants``,
    ``unknown_sources``), an oversized request (``oversized_gets``)."""
    NO_ANSWER = "no_answer"
    """Some fragment stayed missing after every retry on every path."""
    DEADLINE = "deadline"
    """The fetch's overall deadline passed."""
    MAC_MISMATCH = "mac_mismatch"
    """Every fragment arrived, but the chunk's keyed MAC did not match (hostagent.integrity)."""
    MAC_MISSING = "mac_missing"
    """The tenant has a key, but the chunk's MAC could not be fetched."""


@dataclass(slots=True)
class FetchReport:
    """What one fetch did.

    Attributes:
        outcome: COMPLETE or RECOMPUTE.
        reason: why it gave up (``NONE`` when complete).
        tenant: tenant id fetched.
        key: chunk key fetched.
        nbytes: chunk length in bytes.
        frag_count: fragments in the chunk.
        frags_hit: fragments first received from switch SRAM (``HIT``).
        frags_pool: fragments first received from a pool node (``POOL``).
        frags_stream: fragments first received as multicast replicas of another member's
            requests (a group fetch's stream; also counted in ``frags_hit``/``frags_pool``).
        repairs: fragments a follower received in answer to its own repair GETs.
        stalled: whether a follower's stream stalled and it started repairing.
        gets_sent: GET messages sent.
        retries: GETs re-sent after a timeout (a NACK UNAVAILABLE waits for it), a CRC failure,
            or on evidence of loss (fast retransmits, tail probes).
        timeouts: GETs that went unanswered in time.
        crc_failures: DATA messages whose CRC did not match (dropped, fragments re-fetched).
        duplicates: DATA messages that brought no new fragment.
        ignored: datagrams for another chunk or request, or not KVP replies.
        invalid: DATA for this chunk with an impossible range, length or fragment count, or
            answering one of this fetch's GETs with another group or fragments it did not ask
            for.
        foreign: datagrams from a sender that is neither the service address nor a pool address
            the client was given (dropped unread).
        nacks: NACKs received for this fetch.
        fell_back: whether the client switched to asking the DRAM pool directly.
        duration_s: wall time of the fetch.
        srtt_s: the smoothed GET round trip measured (0.0 without a sample).
        rto_s: the retransmission timeout the fetch ended with.
        fast_retransmits: GETs sent again before their timeout because later GETs were
            answered first (FAST_REORDER_GETS); each also counts in ``retries``.
        tail_probes: GETs at the fetch's tail sent again after TAIL_PROBE_SRTTS round trips
            without an answer; each also counts in ``retries``.
        mac_verified: whether the chunk's keyed MAC was fetched and matched (False when the
            tenant has no key).
        mac_failures: times the chunk's bytes did not match its MAC: forged or rewritten bytes
            with valid CRCs (an attack, or a bad path); each drops the bytes and fetches the
            chunk and its MAC again from the pool directly.
        forged_fragments: fragments whose bytes the repair after a MAC failure found changed.
        mac_repaired: whether the chunk completed only after such a repair.
        path: where the bytes came from: ``switch`` (most fragments from switch SRAM),
            ``pool`` (KVP from a pool node), ``direct`` (the pool's own transfer engine, for a
            lone miss), or ``none``.
        direct_bytes: bytes read through the direct reader.
    """

    outcome: FetchOutcome = FetchOutcome.RECOMPUTE
    reason: RecomputeReason = RecomputeReason.NONE
    tenant: int = 0
    key: int = 0
    nbytes: int = 0
    frag_count: int = 0
    frags_hit: int = 0
    frags_pool: int = 0
    frags_stream: int = 0
    repairs: int = 0
    stalled: bool = False
    gets_sent: int = 0
    retries: int = 0
    timeouts: int = 0
    crc_failures: int = 0
    duplicates: int = 0
    ignored: int = 0
    invalid: int = 0
    foreign: int = 0
    nacks: int = 0
    stashed: int = 0
    """Replicas of the group's other chunks kept for a later ``follow`` (and replayed here)."""
    fell_back: bool = False
    duration_s: float = 0.0
    srtt_s: float = 0.0
    rto_s: float = 0.0
    fast_retransmits: int = 0
    tail_probes: int = 0
    mac_verified: bool = False
    mac_failures: int = 0
    forged_fragments: int = 0
    mac_repaired: bool = False
    path: str = "none"
    direct_bytes: int = 0

    @property
    def ok(self) -> bool:
        """Whether the tensor holds the whole chunk."""
        return self.outcome is FetchOutcome.COMPLETE

    def as_dict(self) -> dict[str, Any]:
        """The report with enums as their values (for logs and metrics)."""
        out = asdict(self)
        out["outcome"] = self.outcome.value
        out["reason"] = self.reason.value
        return out


_Get = tuple[int, int, float, float]
"""A GET in flight: (first fragment, fragments asked, deadline, time sent). A tuple: one is
made per GET."""


@dataclass(frozen=True, slots=True)
class ChunkRequest:
    """One chunk for ``FetchClient.fetch_many``.

    Attributes:
        tenant: tenant id.
        key: chunk key.
        dst: a contiguous 1-D uint8 CPU tensor (pinned where CUDA exists) the chunk goes to.
        nbytes: chunk length; default: ``dst.numel()``.
        parent: key of the previous block of the prefix chain (for the access report).
        position: the block's index in its chain (for the access report).
        kv_class: the chunk's declared KV class (for the access report; None: undeclared).
    """

    tenant: int
    key: int
    dst: torch.Tensor
    nbytes: int | None = None
    parent: int | None = None
    position: int | None = None
    kv_class: KvClass | None = None


@dataclass(slots=True)
class _Path:
    addr: Address
    flags: int
    name: str
    sock: socket.socket | None = None
    """A socket on the client's port connected to ``addr`` (None: send with ``sendto``)."""


class _GiveUp(Exception):  # noqa: N818 - internal control flow, never escapes fetch()
    def __init__(self, reason: RecomputeReason) -> None:
        self.reason = reason


@dataclass(slots=True)
class _State:
    """One fetch in progress."""

    tenant: int
    key: int
    nbytes: int
    n: int
    dst: np.ndarray[Any, np.dtype[np.uint8]]
    report: FetchReport
    out: memoryview = field(init=False)
    crc_seed: int = field(init=False)
    frag: bytearray = field(init=False)
    owner: array[int] = field(init=False)
    tries: bytearray = field(init=False)
    """Per fragment: times sent again on this path (backs off its timeout)."""
    fast: bytearray = field(init=False)
    """Per fragment: of those, re-sends on evidence of loss (FAST_REPAIRS_MAX)."""
    missing: int = field(init=False)
    get_group: int = 0
    follower: bool = False
    listening: bool = False
    stream_high: int = 0
    """One past the highest fragment a replica of the group's stream brought (followers)."""
    gap_scan: int = 0
    """Followers repair missing fragments below this before the stream stalls."""
    want_direct: bool = False
    """A pool answered one of this unicast fetch's GETs: the switch does not hold the chunk."""
    direct_done: bool = False
    stall_s: float = 0.0
    last_progress: float = 0.0
    arrivals: int = 0
    """Receive passes that brought a follower new fragments (for its mean arrival spacing)."""
    started: float = 0.0
    answered: int = -1
    """The latest-sent GET of this fetch that has been answered (its offset from rid_base)."""
    last_reply: float = 0.0
    """When a reply to one of this fetch's GETs last arrived (0.0: none yet)."""
    probe_at: float = 0.0
    """When the fetch last sent a tail probe (0.0: never)."""
    probe_frag: int = -1
    """First fragment of the tail probe not sent yet (-1: none; one probe per quiet spell)."""
    probe_rid: int = -1
    """Request id of the tail probe in flight (-1: none)."""
    fast_seen: int = -1
    fast_next: float = math.inf
    scan: int = 0
    path: int = 0
    inflight: dict[int, _Get] = field(default_factory=dict)
    next_check: float = math.inf
    """No GET in flight times out before this (a lower bound: answered GETs leave early)."""
    srtt: float = 0.0
    rttvar: float = 0.0
    rto: float = 0.0
    """The first try's timeout now: measured round trips (RFC 6298), within the client's
    bounds."""
    rrto: float = 0.0
    """A retry's timeout before backoff: ``srtt + 4 rttvar``, at least ``min_retry_timeout_s``
    (0.0 before the first sample: ``rto`` then)."""
    late: dict[int, float] = field(default_factory=dict)
    """Send times of GETs that timed out: a late reply still measures the round trip."""
    rid_base: int = 0
    """Request id of the fetch's first GET. The client numbers its GETs consecutively (mod
    2**32); the fetch's GETs are among ``rid_base .. rid_base + rids_used - 1``, interleaved with
    other chunks' in ``fetch_many`` (whose DATA name other keys and own no fragment here)."""
    rids_used: int = 0
    path_starts: list[int] = field(default_factory=lambda: [0])
    """``path_starts[p]``: offset from ``rid_base`` of the first GET sent on path ``p``."""
    stream: array[int] = field(default_factory=lambda: array("q", bytes(8 * _STREAM_FIELDS)))
    """The native receive path's replica counters for this fetch (kvcast._native)."""
    deadline: float = math.inf
    """When ``fetch_many`` gives this fetch up (DEADLINE)."""
    ended: float = 0.0
    """When ``fetch_many`` saw the fetch end (its last fragment arrived, or it gave up)."""
    give_up: RecomputeReason | None = None
    """Why ``fetch_many`` gave this fetch up (None: it has not)."""

    def __post_init__(self) -> None:
        self.out = memoryview(self.dst.data).cast("B")
        self.crc_seed = chunk_crc_seed(self.tenant, self.key)
        self.frag = bytearray(self.n)
        self.owner = array("L", bytes(self.n * array("L").itemsize))
        self.tries = bytearray(self.n)
        self.fast = bytearray(self.n)
        self.missing = self.n


class FetchClient:
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
        mac_keys: tenant -> secret (hostagent.integrity): a chunk of such a tenant is complete
            only once its keyed MAC, fetched after the last fragment, matches its bytes.
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
        self._mac_buf = torch.zeros(MAC_BYTES, dtype=torch.uint8)
        self._sock = self._open_sockets(bind, socket_buffer_bytes)
        # The only senders the unconnected socket takes datagrams from: the paths (the switch's
        # service address, the pool) and the pool nodes the switch may forward misses to. Not
        # "any KVP source port": a host that gets a datagram past the switch could set it.
        self._trusted = {_resolved(a) for a in (*(p.addr for p in self.paths), *pool_addrs)}
        # The native receive path (kvcast._native.recv_fetch), where it is built: a batch of
        # datagrams per system call, checked, CRC'd and copied into the tensor in C.
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

    @property
    def data_path(self) -> str:
        """``native`` (kvcast._native receives, checks and copies) or ``python``."""
        return "python" if self._native is None else "native"

    @property
    def address(self) -> Address:
        """The local ``(host, port)`` replies come to."""
        host, port = self._sock.getsockname()[:2]
        return str(host), int(port)

    def _keep(self, tenant: int, key: int, nrecv: int) -> None:
        """Stashes the datagram in the receive buffer for a later ``follow`` of its chunk."""
        datagram = bytes(self._rview[:nrecv])
        self._stash.setdefault((tenant, key), []).append(datagram)
        self._stash_bytes += nrecv
        while self._stash_bytes > STASH_MAX_BYTES and self._stash:
            oldest = next(iter(self._stash))
            dropped = self._stash.pop(oldest)
            self._stash_bytes -= sum(len(d) for d in dropped)

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

    def __enter__(self) -> FetchClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def fetch_block(
        self,
        tenant: int,
        key: int,
        layout: KVLayout,
        dst: torch.Tensor,
        *,
        parent: int | None = None,
        position: int | None = None,
    ) -> FetchReport:
        """Fetches one chunk of ``layout`` into ``dst``.

        Args:
            tenant: tenant id.
            key: chunk key (``ChunkKey.key``).
            layout: the chunk's KV layout.
            dst: ``layout.alloc_chunk()`` or any contiguous 1-D uint8 CPU tensor of
                ``layout.chunk_bytes``.
            parent: key of the previous block of the prefix chain (for the access report).
            position: the block's index in its chain (for the access report).

        Returns:
            The report; ``layout.view(dst)`` is the KV when ``report.ok``.

        Raises:
            LayoutError: ``dst`` does not match the layout.
        """
        layout.check_chunk(dst)
        return self.fetch(tenant, key, dst, layout.chunk_bytes, parent=parent, position=position)

    def fetch(
        self,
        tenant: int,
        key: int,
        dst: torch.Tensor,
        nbytes: int | None = None,
        *,
        parent: int | None = None,
        position: int | None = None,
    ) -> FetchReport:
        """Fetches one chunk of ``nbytes`` into ``dst[:nbytes]``.

        Args:
            tenant: tenant id.
            key: chunk key.
            dst: a contiguous 1-D uint8 CPU tensor (pinned where CUDA exists).
            nbytes: chunk length; default: ``dst.numel()``.
            parent: key of the previous block of the prefix chain (for the access report).
            position: the block's index in its chain (for the access report).

        Returns:
            The report. Only ``report.ok`` means ``dst[:nbytes]`` holds the chunk.

        Raises:
            FetchError: ``dst`` is not a contiguous 1-D uint8 CPU tensor, or ``nbytes`` is not
                in ``1 .. dst.numel()`` or needs more fragments than a 16-bit index addresses.
        """
        st = self._start(tenant, key, dst, nbytes)
        st.get_group = self.group
        return self._finish(st, parent, position)

    def follow(
        self,
        tenant: int,
        key: int,
        dst: torch.Tensor,
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
            dst: a contiguous 1-D uint8 CPU tensor (pinned where CUDA exists).
            nbytes: chunk length; default: ``dst.numel()``.
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
        st = self._start(tenant, key, dst, nbytes)
        st.follower = st.listening = True
        st.stall_s = stall_s
        st.last_progress += first - stall_s
        kept = self._stash.pop((tenant, key), [])
        for datagram in kept:  # replicas read while this host followed other chunks
            self._stash_bytes -= len(datagram)
            n = len(datagram)
            self._rbuf[:n] = datagram
            self._receive(st, n)
        st.report.stashed += len(kept)
        return self._finish(st, parent, position, kv_class)

    def fetch_many(
        self,
        requests: Sequence[ChunkRequest],
        *,
        max_chunks_in_flight: int | None = None,
        stop_after_failure: bool = False,
    ) -> list[FetchReport]:
        """Fetches several chunks with their GETs in flight together (a window of chunks).

        Up to ``max_chunks_in_flight`` chunks are fetched at once, in the order given: each has
        its own state, request ids, timers and paths exactly as in ``fetch``, and the client's
        ``window`` bounds the GETs in flight over all of them, the earliest chunk served first.
        So the next chunks' GETs go out while the first chunk's answers are still on the way,
        and a multi-chunk fetch keeps the pool (or the switch) busy instead of waiting one round
        trip per chunk. Every DATA names its chunk (tenant, key) and the GET it answers, and is
        checked against that chunk only (range, owner, CRC), so chunks never mix. A chunk's MAC
        (``mac_keys``) is fetched and compared after the data of every chunk has arrived.

        Args:
            requests: the chunks, in the order they are wanted.
            max_chunks_in_flight: chunks fetched at once; default: the client's.
            stop_after_failure: start no further chunk once one has ended in ``RECOMPUTE``
                (a prefix is of use only up to its first missing block); chunks already in
                flight run to their end.

        Returns:
            One report per chunk started, in the order of ``requests`` (all of them unless
            ``stop_after_failure`` stopped early). Only ``report.ok`` means that chunk's
            ``dst`` holds it.

        Raises:
            FetchError: a request's ``dst`` or ``nbytes`` is unusable (as for ``fetch``),
                before anything is sent.
            ValueError: ``max_chunks_in_flight`` is not in ``1 .. 64``.
        """
        k = self.max_chunks_in_flight if max_chunks_in_flight is None else max_chunks_in_flight
        if not 1 <= k <= MAX_FETCHES:
            raise ValueError(f"max_chunks_in_flight must be in 1..{MAX_FETCHES}, got {k}")
        for r in requests:
            self._check_dst(r.dst, r.nbytes)
        states: list[_State] = []
        active: list[_State] = []
        failed = False
        while True:
            while (
                len(states) < len(requests)
                and len(active) < k
                and not (failed and stop_after_failure)
            ):
                r = requests[len(states)]
                if any(a.key == r.key and a.tenant == r.tenant for a in active):
                    break  # one fetch per chunk at a time: a DATA names its chunk, not its fetch
                st = self._start(r.tenant, r.key, r.dst, r.nbytes)
                st.get_group = self.group
                st.deadline = st.started + self.deadline_s
                states.append(st)
                active.append(st)
            if not active:
                break
            self._run_many(active)
            now = time.monotonic()
            for st in [s for s in active if s.give_up is not None or not s.missing]:
                st.ended = now
                active.remove(st)
                failed |= st.give_up is not None
        reports = []
        for st, r in zip(states, requests, strict=False):
            reason = st.give_up
            mac_s = 0.0
            secret = self.mac_keys.get(st.tenant)
            if reason is None and secret is not None:
                t0 = time.monotonic()
                try:
                    self._verify_mac(st, secret, t0 + self.deadline_s)
                except _GiveUp as give_up:
                    reason = give_up.reason
                mac_s = time.monotonic() - t0
            duration = st.ended - st.started + mac_s
            reports.append(self._conclude(st, reason, duration, r.parent, r.position, r.kv_class))
        return reports

    @staticmethod
    def _check_dst(dst: torch.Tensor, nbytes: int | None) -> int:
        """Checks a fetch's tensor and length; returns the length.

        Raises:
            FetchError: as ``fetch`` says.
        """
        if dst.dtype != torch.uint8 or dst.dim() != 1 or not dst.is_contiguous():
            raise FetchError(
                f"fetch needs a contiguous 1-D uint8 tensor, got {dst.dtype} {tuple(dst.shape)}"
            )
        if dst.device.type != "cpu":
            raise FetchError(
                f"fetch writes host memory; got a {dst.device} tensor: fetch into a pinned CPU "
                "tensor (KVLayout.alloc_chunk) and copy it to the GPU with scatter_to_paged"
            )
        nbytes = dst.numel() if nbytes is None else nbytes
        if not 0 < nbytes <= dst.numel():
            raise FetchError(f"chunk length {nbytes} not in 1..{dst.numel()} (the tensor size)")
        n = -(-nbytes // _FB)
        if n > MAX_FRAGMENTS:
            raise FetchError(
                f"a {nbytes}-byte chunk has {n} fragments; KVP addresses at most {MAX_FRAGMENTS}"
            )
        return nbytes

    def _start(self, tenant: int, key: int, dst: torch.Tensor, nbytes: int | None) -> _State:
        """Checks the arguments of a fetch and makes its state."""
        nbytes = self._check_dst(dst, nbytes)
        n = -(-nbytes // _FB)
        report = FetchReport(tenant=tenant, key=key, nbytes=nbytes, frag_count=n)
        st = _State(tenant, key, nbytes, n, dst.numpy(), report)
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

    def _verify_mac(self, st: _State, secret: bytes, deadline: float) -> None:
        """Fetches the chunk's MAC object (unicast, switch then pool) and compares.

        On a mismatch the bytes are forged or rewritten (their CRCs matched): the failure is
        counted as an attack, and :meth:`_repair_from_pool` fetches chunk and MAC again from
        the pool directly; the chunk completes only if they then match.

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
        pool = self._repair_from_pool(st, deadline)
        if pool is None or not self._mac_matches(st, secret, deadline, pool):
            raise _GiveUp(RecomputeReason.MAC_MISMATCH)
        st.report.mac_verified = st.report.mac_repaired = True

    def _mac_matches(self, st: _State, secret: bytes, deadline: float, pool: int | None) -> bool:
        """Fetches the MAC object (all paths, or only pool path ``pool``) and compares.

        Raises:
            _GiveUp: MAC_MISSING when the MAC object cannot be fetched.
        """
        mac_key = mac_key_of(st.key)
        if pool is not None and pool < 0:  # the pool's own client
            assert self.direct is not None
            try:
                got = self.direct.get_into(st.tenant, mac_key, self._mac_buf.numpy().data)
            except Exception as exc:  # a failed read is a missing MAC, as on KVP
                _LOG.info("direct read of the MAC of chunk %#x failed: %s", st.key, exc)
                got = None
            if got != MAC_BYTES:
                raise _GiveUp(RecomputeReason.MAC_MISSING)
        else:
            mac = self._start(st.tenant, mac_key, self._mac_buf, MAC_BYTES)
            if pool is not None:
                self._on_path(mac, pool)
            try:
                self._run(mac, deadline)
            except _GiveUp:
                raise _GiveUp(RecomputeReason.MAC_MISSING) from None
            finally:
                st.report.gets_sent += mac.report.gets_sent
        expected = chunk_mac(secret, st.tenant, st.key, st.out[: st.nbytes])
        return hmac.compare_digest(expected, self._mac_buf.numpy().tobytes())

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
            again = self._start(st.tenant, st.key, torch.from_numpy(st.dst), st.nbytes)
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
    def _on_path(st: _State, path: int) -> None:
        """Makes a fresh fetch start (and stay) on path ``path``."""
        st.path = path
        st.path_starts = [0] * (path + 1)

    # -- the loop -------------------------------------------------------------------------------

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
                    got = st.report.frags_stream
                    spacing = (st.last_progress - st.started) / got if got else st.stall_s
                    gap = (st.last_progress - st.started) / st.arrivals if st.arrivals else 0.0
                    quiet = min(
                        st.stall_s,
                        max(QUIET_MIN_S, QUIET_FACTOR * spacing, QUIET_ARRIVALS * gap),
                    )
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

    def _run_many(self, active: list[_State]) -> None:
        """Runs the unicast (or leading) fetches in ``active`` together until one of them ends.

        As ``_run`` without a follower's listening: per fetch its timers (deadline, fast
        retransmit, timeout, tail probe) and its direct read; GETs are sent in the order of
        ``active`` while fewer than ``window`` are in flight over all of them; each datagram goes
        to the fetch it names. A fetch that gives up keeps its reason in ``give_up``.
        """
        socks, poll = self._socks, self._poll.poll
        unconnected, trusted, rbuf = self._sock, self._trusted, self._rbuf
        receive_any = self._receive_any
        while True:
            now = time.monotonic()
            for st in active:
                try:
                    if now >= st.deadline:
                        raise _GiveUp(RecomputeReason.DEADLINE)
                    if st.answered > st.fast_seen or now >= st.fast_next:
                        st.fast_next = self._fast_retransmit(st, now)
                    if now >= st.next_check:
                        self._expire(st, now)
                except _GiveUp as give_up:
                    st.give_up = give_up.reason
            room = self.window - sum(len(st.inflight) for st in active)
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
            for fd, _ in poll(max(0.0, wake - now) * 1e3):
                sock = socks[fd]
                if self._native is not None:
                    self._drain_native_many(active, fd, sock is unconnected)
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
                    receive_any(active, nrecv)
                    if any(st.give_up is not None or not st.missing for st in active):
                        break
            if any(st.give_up is not None or not st.missing for st in active):
                return

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
        try:
            n = self.direct.get_into(st.tenant, st.key, st.out[: st.nbytes])
        except Exception as exc:  # any failure of the other path leaves the KVP fetch running
            _LOG.info("direct read of chunk %#x failed, KVP goes on: %s", st.key, exc)
            n = None
        if n != st.nbytes:
            return
        st.report.path = "direct"
        st.report.direct_bytes = n
        st.frag[:] = _PRESENT_BYTE * st.n
        st.missing = 0
        st.inflight.clear()

    def _drain_native(self, st: _State, fd: int, check_src: bool) -> None:
        """Receives what ``fd`` holds through kvcast._native (the same checks as ``_receive``).

        The C side takes each DATA that answers one of this fetch's GETs within the fragments
        that GET owns (or a replica of this host's group), checks its CRC, copies its new
        fragments into the tensor and marks them present; this method then does the per-GET
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

    def _drain_native_many(self, active: list[_State], fd: int, check_src: bool) -> None:
        """``_drain_native`` for several fetches at once (``kvcast._native.recv_fetches``).

        Returns once the socket is drained or one of the fetches has ended (complete, or given
        up: ``st.give_up``).
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
                self._receive_any(active, n)
            if drained or any(st.give_up is not None or not st.missing for st in active):
                return

    def _receive_any(self, active: list[_State], nrecv: int) -> None:
        """``_receive`` for the fetch in ``active`` the datagram in the buffer names.

        A give-up is kept in that fetch's ``give_up``; a datagram for none of them is counted
        as ignored by the first.
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
        active[0].report.ignored += 1

    def _apply_events(self, states: Sequence[_State], nev: int) -> None:
        """Per-GET bookkeeping of the DATA the native path took (as the tail of ``_receive``).

        Every event answers one of the GETs of ``states[index]``, its last field the index
        (replicas are only counted, in C).
        """
        ev = self._events
        for i in range(0, nev * _EVENT_FIELDS, _EVENT_FIELDS):
            rid, first, _last, new, flags, crc_ok, index = ev[i : i + _EVENT_FIELDS]
            st = states[index]
            report, inflight, frag = st.report, st.inflight, st.frag
            g = inflight.get(rid)
            if not crc_ok:
                report.crc_failures += 1
                if g is not None:
                    del inflight[rid]
                    self._release_or_give_up(st, rid, g, failed=True)
                continue
            if g is not None:
                st.last_reply = time.monotonic()
                self._sample_rtt(st, st.last_reply - g[3])
                off = (rid - st.rid_base) & 0xFFFFFFFF
                if off > st.answered:
                    st.answered = off
            elif rid in st.late:
                st.last_reply = time.monotonic()
                self._sample_rtt(st, st.last_reply - st.late.pop(rid))
            if new == 0:
                report.duplicates += 1
            else:
                st.missing -= new
                if flags & c.KVP_FLAG_HIT:
                    report.frags_hit += new
                else:
                    report.frags_pool += new
                    if self.direct is not None and not st.direct_done:
                        st.want_direct = st.get_group == 0 and not st.follower
                if st.follower:
                    report.repairs += new
                if st.listening:
                    st.last_progress = time.monotonic()
                    st.arrivals += 1
            if g is not None:
                if flags & c.KVP_FLAG_HIT:
                    del inflight[rid]
                    if g[1] > 1 or first != g[0]:
                        self._release_or_give_up(st, rid, g, failed=False)
                elif frag.count(_PRESENT_BYTE, g[0], g[0] + g[1]) == g[1]:
                    del inflight[rid]

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
        last = first + -(-plen // _FB)
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
        if g is not None:
            st.last_reply = time.monotonic()
            self._sample_rtt(st, st.last_reply - g[3])
            if off > st.answered:
                st.answered = off
        elif rid in st.late:
            st.last_reply = time.monotonic()
            self._sample_rtt(st, st.last_reply - st.late.pop(rid))
        frag = st.frag
        if last == first + 1:
            new = 0 if frag[first] == _PRESENT else 1
        else:
            new = (last - first) - frag.count(_PRESENT_BYTE, first, last)
        if new == 0:
            report.duplicates += 1
        else:
            st.out[lo : lo + plen] = payload
            if new == 1 and last == first + 1:
                frag[first] = _PRESENT
            else:
                frag[first:last] = _PRESENT_BYTE * (last - first)
            st.missing -= new
            if flags & c.KVP_FLAG_HIT:
                report.frags_hit += new
            else:
                report.frags_pool += new
                if path is not None and self.direct is not None and not st.direct_done:
                    st.want_direct = st.get_group == 0 and not st.follower
            if path is None:
                report.frags_stream += new
                if last > st.stream_high:
                    st.stream_high = last
            elif st.follower:
                report.repairs += new
            if st.listening:
                st.last_progress = time.monotonic()
                st.arrivals += 1
        if g is not None:
            if flags & c.KVP_FLAG_HIT:
                # The switch answers a GET with its first fragment only: ask for the rest anew.
                del st.inflight[rid]
                if g[1] > 1 or first != g[0]:
                    self._release(st, rid, g, failed=False)
            elif frag.count(_PRESENT_BYTE, g[0], g[0] + g[1]) == g[1]:
                del st.inflight[rid]

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
        # UNAVAILABLE (the pool's store is recovering, say): the GET waits for its timeout and
        # is retried with backoff then; sent again at once it would use up its retries within a
        # few round trips while the store comes back.


def _resolved(addr: Address) -> tuple[str, int]:
    """``(host, port)`` with the host as the dotted address ``recvfrom`` reports."""
    host, port = addr[0], int(addr[1])
    try:
        return socket.gethostbyname(host), port
    except OSError:
        return host, port
