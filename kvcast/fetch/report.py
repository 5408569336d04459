"""What a fetch tells its caller: the outcome, the reason, the counts, and its access record.

Classes:
    FetchError: the caller passed something unusable (wrong buffer, chunk too large).
    FetchOutcome: COMPLETE or RECOMPUTE.
    RecomputeReason: why a fetch gave up.
    FetchReport: what one fetch did (bytes, fragments from switch vs pool, retries, CRC
        failures, duration).

Functions:
    entry_from_fetch: the access record (``kvcast.reports.AccessReport``) of one fetch.
"""

from __future__ import annotations

import enum
import time
from dataclasses import asdict, dataclass
from typing import Any

from kvcast.kvclass import KvClass
from kvcast.reports import AccessReport


class FetchError(ValueError):
    """The fetch cannot start: the destination buffer or the chunk length is unusable."""


class FetchOutcome(enum.Enum):
    """How a fetch ended."""

    COMPLETE = "complete"
    """Every fragment arrived and passed its CRC: the buffer holds the chunk."""
    RECOMPUTE = "recompute"
    """The chunk could not be had: prefill it again. The buffer's contents are undefined."""


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
    """Every fragment arrived, but the chunk's keyed MAC did not match (kvcast.integrity)."""
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
        """Whether the buffer holds the whole chunk."""
        return self.outcome is FetchOutcome.COMPLETE

    def as_dict(self) -> dict[str, Any]:
        """The report with enums as their values (for logs and metrics)."""
        out = asdict(self)
        out["outcome"] = self.outcome.value
        out["reason"] = self.reason.value
        return out


def entry_from_fetch(
    report: FetchReport,
    host: str | int,
    *,
    when: float | None = None,
    parent: int | None = None,
    position: int | None = None,
    kv_class: KvClass | None = None,
) -> AccessReport:
    """The access record of one fetch (one chunk).

    Args:
        report: the fetch's report.
        host: the reporting host's name (or id) as the controller knows it.
        when: Unix seconds of the access; default: now.
        parent: key of the previous block of the prefix chain, if known.
        position: the block's index in its chain, if known.
        kv_class: the chunk's declared class, if any.

    Returns:
        The record; ``hit`` is True when more than half of the chunk's fragments came from the
        switch, False when fewer did, None when the fetch ended in RECOMPUTE.
    """
    hit: bool | None = None
    if report.ok:
        hit = report.frags_hit * 2 > report.frag_count
    return AccessReport(
        tenant=report.tenant,
        key=report.key,
        size=report.nbytes,
        host=host,
        time=time.time() if when is None else when,
        hit=hit,
        parent=parent,
        position=position,
        kv_class=kv_class,
    )
