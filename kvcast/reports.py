"""Access reports from host agents to the control plane (``POST /v1/reports``): the client side.

Every chunk a host fetches (or needed and could not fetch) is one access record for the
controller's cache policy: ``{tenant, key, size, host, time, hit, parent?, position?}`` with the
key as a JSON integer, ``time`` in wall-clock Unix seconds, and ``hit`` true when switch SRAM
served the chunk. A chunk a host computed and put into the DRAM pool (``hostagent.producer``) is
one record with ``"event": "stored"`` and no ``hit``: not an access, but what tells the
controller that the pool holds it. A report must never slow down or fail a fetch, so records
go through a ``ReportSink`` whose ``submit`` only appends to a bounded queue; the HTTP reporter
posts batches from a background thread and, when the controller is down or the queue is full,
drops records and counts them.

``hit`` from a fetch's report (``kvcast.fetch.entry_from_fetch``): **true when most fragments (more
than half) came from the switch** (``frags_hit * 2 > frag_count``), false otherwise; ``None`` when
the fetch ended in RECOMPUTE (the chunk was needed but not fetched: still an access, with no
source). "Most" rather than "all" because a chunk the switch holds can still have a few fragments
come from the pool: one whose SRAM copy failed its CRC, or the tail of a chunk evicted during the
fetch. The controller counts one ``hit=true`` report as one whole-chunk fetch the switch's hit
counters should show; a fetch that the switch served mostly is that fetch.

HTTP answers (``HttpReporter``): 2xx: sent (the ``accepted`` count of the JSON answer, or the
whole batch with ``bad_responses`` counted when the answer is not that JSON); 4xx: the
controller refused the records (``rejected``; resending them would not help); 5xx (503: its
queue is full), no connection, a timeout or a reply that is not HTTP: the batch is dropped
(``dropped_failed``) and posting pauses with exponential backoff while new records queue up to
``max_queue`` (beyond it they are dropped: ``dropped_full``).

Classes:
    AccessEntry: one access record, as the API takes it.
    ReportStats: what a sink did with the records it was given.
    ReportSink: where the agent hands records (``submit`` never blocks and never raises).
    InMemorySink: keeps the records in a list (tests, experiments that collect them).
    HttpReporter: batches records and posts them to the controller in a background thread.
    ReportError: a reporter cannot be made as asked (bad URL or bounds).

"""

from __future__ import annotations

import abc
import contextlib
import http.client
import json
import logging
import queue
import threading
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from kvcast.kvclass import KvClass

__all__ = [
    "REPORTS_PATH",
    "AccessEntry",
    "HttpReporter",
    "InMemorySink",
    "ReportError",
    "ReportSink",
    "ReportStats",
]

_LOG = logging.getLogger(__name__)

REPORTS_PATH = "/v1/reports"


class ReportError(ValueError):
    """A reporter cannot be made as asked (a URL that is not ``http://host:port``, bad bounds)."""


@dataclass(frozen=True, slots=True)
class AccessEntry:
    """One access record.

    Attributes:
        tenant: tenant id (16 bits).
        key: chunk key (64 bits).
        size: the chunk's bytes.
        host: the reporting host, as the controller's configuration names it (or its id).
        time: when the chunk was used, Unix seconds on this host's clock.
        hit: True: served from switch SRAM; False: from the DRAM pool; None: not fetched.
        parent: key of the previous block of its prefix chain, if known.
        position: index of the block in its chain (0 = first), if known.
        event: ``"access"`` (the host used the chunk) or ``"stored"`` (the host put it into
            the DRAM pool after computing it; ``hit`` is then None).
        kv_class: the chunk's class as the application declared it (``"class"``; None:
            undeclared).
    """

    tenant: int
    key: int
    size: int
    host: str | int
    time: float
    hit: bool | None = None
    parent: int | None = None
    position: int | None = None
    event: str = "access"
    kv_class: KvClass | None = None

    def as_json(self) -> dict[str, Any]:
        """The record as ``POST /v1/reports`` takes it (optional fields left out when None)."""
        out: dict[str, Any] = {
            "tenant": self.tenant,
            "key": self.key,
            "size": self.size,
            "host": self.host,
            "time": self.time,
        }
        if self.hit is not None:
            out["hit"] = self.hit
        if self.parent is not None:
            out["parent"] = self.parent
        if self.position is not None:
            out["position"] = self.position
        if self.event != "access":
            out["event"] = self.event
        if self.kv_class is not None:
            out["class"] = self.kv_class.value
        return out


@dataclass(slots=True)
class ReportStats:
    """What a sink did with the records it was given.

    Attributes:
        submitted: records handed to ``submit``.
        sent: records the controller accepted.
        batches: POST requests answered 2xx.
        rejected: records the controller refused (4xx: invalid, unknown host, wrong URL).
        dropped_full: records dropped because the queue was full (controller slow or down).
        dropped_failed: records of batches that could not be delivered (no connection,
            timeout, 5xx, a reply that is not HTTP) or were still queued at ``close``.
        failed_posts: POST attempts that failed that way.
        bad_responses: 2xx answers whose body was not the expected ``{"accepted": n}``.
        last_error: the last failure, for logs.
    """

    submitted: int = 0
    sent: int = 0
    batches: int = 0
    rejected: int = 0
    dropped_full: int = 0
    dropped_failed: int = 0
    failed_posts: int = 0
    bad_responses: int = 0
    last_error: str = ""

    @property
    def dropped(self) -> int:
        """Records lost without the controller seeing them."""
        return self.dropped_full + self.dropped_failed

    def as_dict(self) -> dict[str, Any]:
        """The counters (and ``dropped``) as a JSON-able dict."""
        out = asdict(self)
        out["dropped"] = self.dropped
        return out


class ReportSink(abc.ABC):
    """Where the host agent hands access records.

    ``submit`` is called on the fetch path: implementations must return at once and never
    raise (a record that cannot be kept is dropped and counted).
    """

    @abc.abstractmethod
    def submit(self, entries: Sequence[AccessEntry]) -> None:
        """Takes records; never blocks, never raises.

        Args:
            entries: the records.
        """

    @abc.abstractmethod
    def stats(self) -> ReportStats:
        """A snapshot of the counters."""

    def flush(self, timeout_s: float = 2.0) -> bool:
        """Waits until every record submitted so far is delivered, refused or dropped.

        Args:
            timeout_s: how long to wait at most.

        Returns:
            Whether everything was handled in time.
        """
        return True

    def close(self, timeout_s: float = 2.0) -> None:
        """Flushes (within ``timeout_s``) and releases resources; later submits are dropped.

        Args:
            timeout_s: bound on the flush.
        """
        self.flush(timeout_s)


class InMemorySink(ReportSink):
    """Keeps every record in ``entries`` (thread-safe); for tests and collecting experiments."""

    def __init__(self) -> None:
        self.entries: list[AccessEntry] = []
        self._lock = threading.Lock()
        self._stats = ReportStats()

    def submit(self, entries: Sequence[AccessEntry]) -> None:  # noqa: D102
        with self._lock:
            self.entries.extend(entries)
            self._stats.submitted += len(entries)
            self._stats.sent += len(entries)

    def stats(self) -> ReportStats:  # noqa: D102
        with self._lock:
            return ReportStats(**asdict(self._stats))


_WAKE = object()
"""Queued by flush/close so that the sender stops waiting for a batch to fill."""


class HttpReporter(ReportSink):
    """Batches access records and posts them to the controller from a background thread.

    ``submit`` puts records on a bounded queue (``max_queue``; records beyond it are dropped and
    counted). The thread posts a batch when ``max_batch`` records are queued or ``max_delay_s``
    after the first record of a batch, whichever comes first, one HTTP/1.1 request per batch
    (``POST {url}/v1/reports``, JSON list, ``timeout_s`` per request). After a failed post it
    waits ``backoff_s``, doubling up to ``max_backoff_s``, and resets on the next success.

    Args:
        url: the controller's API, ``http://host:port`` (a trailing ``/v1/reports`` is allowed).
        max_batch: records per POST at most.
        max_delay_s: how long a record waits for its batch to fill.
        max_queue: records queued at most.
        timeout_s: connect + answer timeout of one POST.
        backoff_s: first pause after a failed POST.
        max_backoff_s: longest pause.

    Raises:
        ReportError: the URL is not ``http://host[:port][/path]`` or a bound is not positive.
    """

    def __init__(
        self,
        url: str,
        *,
        max_batch: int = 256,
        max_delay_s: float = 0.5,
        max_queue: int = 8192,
        timeout_s: float = 2.0,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
    ) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ReportError(f"report URL {url!r} is not http://HOST:PORT")
        try:
            port = parts.port or 80
        except ValueError as exc:
            raise ReportError(f"report URL {url!r}: {exc}") from None
        if min(max_batch, max_queue) < 1 or min(max_delay_s, timeout_s, backoff_s) <= 0:
            raise ReportError(
                "max_batch and max_queue must be >= 1 and max_delay_s, timeout_s and backoff_s "
                f"positive; got {max_batch}, {max_queue}, {max_delay_s}, {timeout_s}, {backoff_s}"
            )
        path = parts.path.rstrip("/")
        self.host, self.port = parts.hostname, port
        self.path = path if path.endswith(REPORTS_PATH) else path + REPORTS_PATH
        self.url = f"http://{self.host}:{self.port}{self.path}"
        self.max_batch = max_batch
        self.max_delay_s = max_delay_s
        self.timeout_s = timeout_s
        self.backoff_s = backoff_s
        self.max_backoff_s = max(max_backoff_s, backoff_s)
        self._q: queue.Queue[object] = queue.Queue(max_queue)
        self._lock = threading.Lock()
        self._done = threading.Condition(self._lock)
        self._stats = ReportStats()
        self._queued = 0  # records accepted into the queue
        self._handled = 0  # of those: sent, rejected or dropped after dequeuing
        self._urgent = threading.Event()
        self._closing = threading.Event()
        self._closed = False
        self._down = False
        self._thread = threading.Thread(target=self._run, name="kvcast-reports", daemon=True)
        self._thread.start()

    # -- the caller's side -------------------------------------------------------------------------

    def submit(self, entries: Sequence[AccessEntry]) -> None:  # noqa: D102
        kept = 0
        if not self._closed:
            for entry in entries:
                try:
                    self._q.put_nowait(entry)
                except queue.Full:
                    break
                kept += 1
        with self._lock:
            self._stats.submitted += len(entries)
            self._stats.dropped_full += len(entries) - kept
            self._queued += kept

    def stats(self) -> ReportStats:  # noqa: D102
        with self._lock:
            return ReportStats(**asdict(self._stats))

    def flush(self, timeout_s: float = 2.0) -> bool:  # noqa: D102
        deadline = time.monotonic() + timeout_s
        with self._lock:
            target = self._queued
        self._urgent.set()
        self._wake()
        with self._done:
            while self._handled < target:
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    return False
                self._done.wait(left)
        return True

    def close(self, timeout_s: float = 2.0) -> None:
        """Posts what is queued (within ``timeout_s``), then stops the thread.

        Records still queued after that (controller down: the thread is backing off) are
        counted in ``dropped_failed``. Later ``submit`` calls drop their records.

        Args:
            timeout_s: bound on the final flush.
        """
        if self._closed:
            return
        self.flush(timeout_s)
        self._closed = True
        self._closing.set()
        self._wake()
        self._thread.join(timeout=max(0.1, self.timeout_s + 0.5))
        leftover = 0
        while True:
            try:
                item = self._q.get_nowait()
            except queue.Empty:
                break
            leftover += item is not _WAKE
        if leftover:
            self._account(dropped_failed=leftover)

    def __enter__(self) -> HttpReporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _wake(self) -> None:
        with contextlib.suppress(queue.Full):  # full: the thread has records to take anyway
            self._q.put_nowait(_WAKE)

    # -- the sender thread -------------------------------------------------------------------------

    def _account(self, **counts: int) -> None:
        with self._done:
            for name, n in counts.items():
                setattr(self._stats, name, getattr(self._stats, name) + n)
            self._handled += sum(
                n for name, n in counts.items() if name in ("sent", "rejected", "dropped_failed")
            )
            self._done.notify_all()

    def _run(self) -> None:
        backoff = 0.0
        while not self._closing.is_set():
            batch = self._collect()
            if not batch:
                continue
            if self._post(batch):
                backoff = 0.0
            else:
                backoff = min(self.max_backoff_s, max(self.backoff_s, backoff * 2))
                self._closing.wait(backoff)

    def _collect(self) -> list[AccessEntry]:
        """Waits for records and returns one batch (possibly empty on a wake-up)."""
        batch: list[AccessEntry] = []
        item = self._q.get()
        deadline = time.monotonic() + self.max_delay_s
        while True:
            if isinstance(item, AccessEntry):
                batch.append(item)
            if len(batch) >= self.max_batch or self._closing.is_set():
                return batch
            try:
                if self._urgent.is_set():
                    item = self._q.get_nowait()
                else:
                    item = self._q.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self._urgent.clear()
                return batch

    def _post(self, batch: list[AccessEntry]) -> bool:
        """Posts one batch and counts the outcome; False when the controller was unreachable."""
        body = json.dumps([e.as_json() for e in batch]).encode()
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        try:
            conn.request("POST", self.path, body=body, headers={"Content-Type": "application/json"})
            reply = conn.getresponse()
            status, answer = reply.status, reply.read(1 << 16)
        except (OSError, http.client.HTTPException) as exc:
            self._failed(batch, f"POST {self.url}: {type(exc).__name__}: {exc}")
            return False
        finally:
            conn.close()
        if 200 <= status < 300:
            accepted = _accepted(answer, len(batch))
            if accepted is None:
                self._account(sent=len(batch), batches=1, bad_responses=1)
            else:
                self._account(sent=accepted, rejected=len(batch) - accepted, batches=1)
            if self._down:
                self._down = False
                _LOG.info("report API at %s answers again", self.url)
            return True
        if 400 <= status < 500:
            why = f"POST {self.url}: {status} {_error_text(answer)}"
            with self._lock:
                self._stats.last_error = why
            _LOG.warning("controller refused %d access records: %s", len(batch), why)
            self._account(rejected=len(batch))
            return True
        self._failed(batch, f"POST {self.url}: {status} {_error_text(answer)}")
        return False

    def _failed(self, batch: list[AccessEntry], why: str) -> None:
        with self._lock:
            self._stats.last_error = why
        if not self._down:
            self._down = True
            _LOG.warning("access reports are being dropped: %s", why)
        self._account(dropped_failed=len(batch), failed_posts=1)


def _accepted(answer: bytes, expected: int) -> int | None:
    """The ``accepted`` count of a 2xx answer, or None when the answer is not that JSON."""
    try:
        doc = json.loads(answer)
    except (UnicodeDecodeError, ValueError):
        return None
    n = doc.get("accepted") if isinstance(doc, dict) else None
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= expected:
        return None
    return n


def _error_text(answer: bytes) -> str:
    """The ``error`` of a JSON error answer, else the start of the body."""
    try:
        doc = json.loads(answer)
        if isinstance(doc, dict) and isinstance(doc.get("error"), str):
            return str(doc["error"])
    except (UnicodeDecodeError, ValueError):
        pass
    return answer[:200].decode(errors="replace")
