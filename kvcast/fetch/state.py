"""What one fetch in progress is, and what the parts of the fetch client share.

Constants: the tuning of retries, fast retransmits, tail probes and followers' quiet spells
(each with the reason for its value), and the fragment states.

Classes:
    ChunkRequest: one chunk for ``FetchClient.fetch_many``.
    _State: one fetch in progress (per-fragment state, GETs in flight, round-trip estimates).
    _Path: where GETs go (the service address, the pool) and its connected socket.
    _GiveUp: internal control flow: a fetch ends in RECOMPUTE for a reason.
    _ClientBase: the settings, sockets and buffers every part of the client uses.
"""

from __future__ import annotations

import logging
import math
import select
import socket
import struct
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from kvcast import p4constants as c
from kvcast.backend import PoolBackend
from kvcast.fetch.report import FetchReport, RecomputeReason
from kvcast.integrity import SEGMENT_BYTES
from kvcast.kvclass import KvClass
from kvcast.kvp import frags_per_data
from kvcast.reports import ReportSink
from kvcast.wire import KVP_STRUCT, chunk_crc_seed

Address = tuple[str, int]
Array = np.ndarray[Any, np.dtype[np.uint8]]
"""A fetch's destination as the engine writes it: 1-D, uint8, contiguous, writable."""

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
# Fragments per MAC segment (kvcast.integrity: a segment is a whole number of fragments).
_SEG_FRAGS = SEGMENT_BYTES // c.FRAG_BYTES
if _SEG_FRAGS * c.FRAG_BYTES != SEGMENT_BYTES:
    raise ImportError("SEGMENT_BYTES is not a whole number of fragments")  # pragma: no cover
if KVP_STRUCT.unpack(bytes(range(_HDR)))[9] != (_FRAG_IDX_AT << 8) | (_FRAG_IDX_AT + 1):
    raise ImportError("_FRAG_IDX_AT does not match KVP_STRUCT")  # pragma: no cover


Progress = Callable[[int, int], None]
"""``fetch_many``'s progress callback: ``(index of the chunk in the requests, bytes)``."""

_Get = tuple[int, int, float, float]
"""A GET in flight: (first fragment, fragments asked, deadline, time sent). A tuple: one is
made per GET."""


@dataclass(frozen=True, slots=True)
class ChunkRequest:
    """One chunk for ``FetchClient.fetch_many``.

    Attributes:
        tenant: tenant id.
        key: chunk key.
        dst: where the chunk goes (a buffer ``FetchClient.fetch`` takes).
        nbytes: chunk length; default: the buffer's size.
        parent: key of the previous block of the prefix chain (for the access report).
        position: the block's index in its chain (for the access report).
        kv_class: the chunk's declared KV class (for the access report; None: undeclared).
    """

    tenant: int
    key: int
    dst: Any
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
    dst: Array
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
    index: int = 0
    """The fetch's place in ``fetch_many``'s requests (what its progress callback names)."""
    prefix: int = 0
    """Fragments of the verified contiguous prefix already reported to the progress callback."""
    macs: bytes | None = None
    """The chunk's MAC object, once fetched (a tenant with a MAC key)."""
    mac_of: _State | None = None
    """The fetch of this chunk's MAC object that ``fetch_many`` runs beside it."""
    is_mac: bool = False
    """This fetch is of another chunk's MAC object (``fetch_many``)."""
    mac_ok: int = 0
    """Segments compared with their MACs and found equal, from the first on."""
    mac_bad: bool = False
    """A segment differed from its MAC: nothing past it is handed on."""
    advanced_at: int = -1
    """``missing`` when the progress callback last looked (unchanged: nothing new to report)."""

    def __post_init__(self) -> None:
        self.out = memoryview(self.dst.data).cast("B")
        self.crc_seed = chunk_crc_seed(self.tenant, self.key)
        self.frag = bytearray(self.n)
        self.owner = array("L", bytes(self.n * array("L").itemsize))
        self.tries = bytearray(self.n)
        self.fast = bytearray(self.n)
        self.missing = self.n


def _resolved(addr: Address) -> tuple[str, int]:
    """``(host, port)`` with the host as the dotted address ``recvfrom`` reports."""
    host, port = addr[0], int(addr[1])
    try:
        return socket.gethostbyname(host), port
    except OSError:
        return host, port


class _ClientBase:
    """What every part of ``FetchClient`` shares: its settings, sockets and buffers.

    ``FetchClient.__init__`` sets all of these. The parts build on each other, one role each:
    ``_Recovery`` (this base), ``_Receiver`` (recovery), ``_Transport`` (receiver), then
    ``FetchClient`` (transport); what a lower part calls of a higher one is declared here.
    """

    paths: list[_Path]
    window: int
    max_chunks_in_flight: int
    frags_per_get: int
    timeout_s: float
    max_timeout_s: float
    min_retry_timeout_s: float
    max_retries: int
    deadline_s: float
    tail_probe_min_s: float
    group: int
    reporter: ReportSink | None
    report_host: str | int
    mac_keys: dict[int, bytes]
    gap_fragments: int
    direct: PoolBackend | None
    _data_frags: int
    _sock: socket.socket
    _socks: dict[int, socket.socket]
    _poll: select.poll
    _trusted: set[tuple[str, int]]
    _native: ModuleType | None
    _rx: bytearray
    _events: array[int]
    _trusted_ints: tuple[tuple[int, int], ...]
    _rbuf: bytearray
    _rview: memoryview
    _full_payload: memoryview
    _frag_idx_field: memoryview
    _gets: bytearray
    _gets_view: memoryview
    _get_one: memoryview
    _next_req: int
    _stash: dict[tuple[int, int], list[bytes]]
    _stash_bytes: int
    _progress: Progress | None
    _stripe: int

    if TYPE_CHECKING:  # defined by the parts and the client; declared for the others

        def _start(self, tenant: int, key: int, dst: Array, nbytes: int | None) -> _State: ...
        def _run(self, st: _State, deadline: float) -> None: ...
        def _advance(self, active: list[_State]) -> None: ...
