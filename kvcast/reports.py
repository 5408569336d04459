"""Access reports: the record host agents send the controller, and the client that sends it.

``POST /v1/reports`` takes a JSON list of access records::

    [{"tenant": 7, "key": "0x1a2b...", "size": 2048, "host": "h1", "time": 1718000000.25,
      "hit": true, "parent": "0x99...", "position": 3}, ...]

=========== ======================================================== ========
field       meaning                                                  required
=========== ======================================================== ========
tenant      16-bit tenant id                                         yes
key         64-bit chunk key: an integer or a string (``0x`` hex or  yes
            decimal; JSON numbers lose precision above 2^53 in many
            languages, strings never do)
size        the chunk's bytes (> 0)                                  yes
host        the reporting host: its configured name, or its id       yes
time        when it used the chunk: Unix seconds (its wall clock)    yes
hit         true: served from switch SRAM; false: not; null/absent:  no
            unknown or not fetched (e.g. computed here)
parent      key of the previous block of the prefix chain            no
position    index of the block in its chain (0 = first)              no
event       ``"access"`` (default): the host used the chunk;         no
            ``"stored"``: the host put the chunk into the DRAM pool
            after computing it (the producer path; no ``hit``)
class       the chunk's KV class as the application declared it:     no
            ``"static"`` (a prefix every branch and task reuses) or
            ``"transient"``; absent: undeclared (the controller may
            still detect it as static, ``controlplane.kvclasses``)
=========== ======================================================== ========

A ``stored`` record is not an access: the controller learns that the pool holds the chunk and
its exact length (what it needs to load it into SRAM later), and forgets any earlier failure to
read it from the pool; the cache policy sees the chunk only when hosts use it.

Anything else (unknown fields, wrong types, out-of-range values, a body that is not a JSON
list) is refused with ``400`` and a message naming the record and field (``reports[3].key:
...``); nothing a client sends can stop the server. The other answers are ``202`` with
``{"accepted": n}``, ``413`` for a body over the limit, ``411`` without a Content-Length, ``503``
when the controller's queue is full (retry later), ``404``/``405`` for other paths and methods.

Every chunk a host fetches (or needed and could not fetch) is one access record for the
controller's cache policy, ``time`` in wall-clock Unix seconds and ``hit`` true when switch SRAM
served the chunk. A chunk a host computed and put into the DRAM pool (``hostagent.producer``) is
one ``stored`` record. A report must never slow down or fail a fetch, so records go through a
``ReportSink`` whose ``submit`` only appends to a bounded queue; the HTTP reporter posts batches
from a background thread and, when the controller is down or the queue is full, drops records and
counts them.

``hit`` from a fetch's report (``kvcast.fetch.entry_from_fetch``): **true when most fragments
(more than half) came from the switch** (``frags_hit * 2 > frag_count``), false otherwise;
``None`` when the fetch ended in RECOMPUTE (the chunk was needed but not fetched: still an
access, with no source). "Most" rather than "all" because a chunk the switch holds can still have
a few fragments come from the pool: one whose SRAM copy failed its CRC, or the tail of a chunk
evicted during the fetch. The controller counts one ``hit=true`` report as one whole-chunk fetch
the switch's hit counters should show; a fetch that the switch served mostly is that fetch.

HTTP answers (``HttpReporter``): 2xx: sent (the ``accepted`` count of the JSON answer, or the
whole batch with ``bad_responses`` counted when the answer is not that JSON); 4xx: the
controller refused the records (``rejected``; resending them would not help); 5xx (503: its
queue is full), no connection, a timeout or a reply that is not HTTP: the batch is dropped
(``dropped_failed``) and posting pauses with exponential backoff while new records queue up to
``max_queue`` (beyond it they are dropped: ``dropped_full``). The controller's side of the API
is ``controlplane.reports``.

Classes:
    AccessReport: one access record (validated when parsed).
    ReportError: not a valid record or body, or a reporter that cannot be made as asked.
    ReportClient: one request at a time to the API (post records, read the status).
    ReportStats: what a sink did with the records it was given.
    ReportSink: where an agent hands records (``submit`` never blocks and never raises).
    InMemorySink: keeps the records in a list (tests, experiments that collect them).
    HttpReporter: batches records and posts them with a ``ReportClient`` from a background
        thread.

Functions:
    parse_reports: a request body to records, or ReportError.
    parse_key: one chunk key from JSON (integer or 0x-hex/decimal string), or ReportError.
"""

from __future__ import annotations

import abc
import contextlib
import http.client
import json
import logging
import math
import queue
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from kvcast.kvclass import KvClass, parse_kv_class

__all__ = [
    "EVENT_ACCESS",
    "EVENT_STORED",
    "REPORTS_PATH",
    "STATUS_PATH",
    "AccessReport",
    "HttpReporter",
    "InMemorySink",
    "ReportClient",
    "ReportError",
    "ReportSink",
    "ReportStats",
    "parse_key",
    "parse_reports",
]

_LOG = logging.getLogger(__name__)

REPORTS_PATH = "/v1/reports"
STATUS_PATH = "/v1/status"


class ReportError(ValueError):
    """Not a valid access record or report body, or a reporter that cannot be made as asked.

    The message names the record and field (``reports[3].key: ...``), or the URL or bound.
    """


KEY_MAX = (1 << 64) - 1
TENANT_MAX = 0xFFFF
MAX_HOST_NAME = 253
_FIELDS = (
    "tenant",
    "key",
    "size",
    "host",
    "time",
    "hit",
    "parent",
    "position",
    "event",
    "class",
)
EVENT_ACCESS, EVENT_STORED = "access", "stored"
_EVENTS = (EVENT_ACCESS, EVENT_STORED)
_REQUIRED = ("tenant", "key", "size", "host", "time")


@dataclass(frozen=True, slots=True)
class AccessReport:
    """One validated access record from a host agent.

    Attributes:
        tenant: tenant id.
        key: chunk key.
        size: the chunk's bytes.
        host: the host's configured name, or its integer id.
        time: Unix seconds on the reporter's clock.
        hit: whether switch SRAM served it (None: unknown or not fetched).
        parent: key of the previous block of its prefix chain, if known.
        position: index in the chain, if known.
        event: ``"access"`` (the host used it) or ``"stored"`` (the host put it into the pool).
        kv_class: the class the application declared (``"class"`` in JSON), None if undeclared.
    """

    tenant: int
    key: int
    size: int
    host: str | int
    time: float
    hit: bool | None = None
    parent: int | None = None
    position: int | None = None
    event: str = EVENT_ACCESS
    kv_class: KvClass | None = None

    @property
    def stored(self) -> bool:
        """Whether this records a put into the pool rather than a use."""
        return self.event == EVENT_STORED

    def as_json(self) -> dict[str, Any]:
        """The record as the API takes it (keys as hex strings)."""
        out: dict[str, Any] = {
            "tenant": self.tenant,
            "key": f"{self.key:#x}",
            "size": self.size,
            "host": self.host,
            "time": self.time,
        }
        if self.hit is not None:
            out["hit"] = self.hit
        if self.parent is not None:
            out["parent"] = f"{self.parent:#x}"
        if self.position is not None:
            out["position"] = self.position
        if self.event != EVENT_ACCESS:
            out["event"] = self.event
        if self.kv_class is not None:
            out["class"] = self.kv_class.value
        return out


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_key(value: object, path: str) -> int:
    """A chunk key from JSON: an integer, or a 0x-hex or decimal string, unsigned 64-bit.

    Raises:
        ReportError: anything else, named by ``path``.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        key = value
    elif isinstance(value, str):
        text = value.strip()
        try:
            key = int(text, 16) if text.lower().startswith("0x") else int(text, 10)
        except ValueError:
            raise ReportError(
                f"{path}: {value!r} is not a key (an integer, 0x-hex or decimal string)"
            ) from None
    else:
        raise ReportError(f"{path}: expected a key (integer or string), got {_type(value)}")
    if not 0 <= key <= KEY_MAX:
        raise ReportError(f"{path}: {value!r} is not an unsigned 64-bit key")
    return key


def _type(value: object) -> str:
    return {
        type(None): "null",
        bool: "boolean",
        int: "integer",
        float: "number",
        str: "string",
        list: "list",
        dict: "object",
    }.get(type(value), type(value).__name__)


def _record(raw: object, path: str) -> AccessReport:
    if not isinstance(raw, dict):
        raise ReportError(f"{path}: expected an object, got {_type(raw)}")
    unknown = sorted(set(raw) - set(_FIELDS))
    if unknown:
        raise ReportError(f"{path}: unknown field {unknown[0]!r} (fields: {', '.join(_FIELDS)})")
    missing = [f for f in _REQUIRED if f not in raw]
    if missing:
        raise ReportError(f"{path}: missing field {missing[0]!r}")
    tenant = raw["tenant"]
    if not _is_int(tenant) or not 0 <= tenant <= TENANT_MAX:
        raise ReportError(f"{path}.tenant: expected an integer 0..65535, got {tenant!r}")
    size = raw["size"]
    if not _is_int(size) or size <= 0:
        raise ReportError(f"{path}.size: expected a positive integer (bytes), got {size!r}")
    host = raw["host"]
    if isinstance(host, str):
        if not host or len(host) > MAX_HOST_NAME:
            raise ReportError(f"{path}.host: expected a name of 1..{MAX_HOST_NAME} characters")
    elif not _is_int(host) or host < 0:
        raise ReportError(f"{path}.host: expected a host name or a non-negative id, got {host!r}")
    t = raw["time"]
    if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or t < 0:
        raise ReportError(f"{path}.time: expected Unix seconds (a finite number >= 0), got {t!r}")
    hit = raw.get("hit")
    if hit is not None and not isinstance(hit, bool):
        raise ReportError(f"{path}.hit: expected true, false or null, got {hit!r}")
    parent = raw.get("parent")
    position = raw.get("position")
    event = raw.get("event", EVENT_ACCESS)
    if event not in _EVENTS:
        raise ReportError(f"{path}.event: expected one of {', '.join(_EVENTS)}, got {event!r}")
    if event == EVENT_STORED and hit is not None:
        raise ReportError(f"{path}.hit: a stored record has no hit (it was computed, not fetched)")
    if position is not None and (not _is_int(position) or not 0 <= position < 1 << 31):
        raise ReportError(f"{path}.position: expected a non-negative integer, got {position!r}")
    raw_class = raw.get("class")
    try:
        kv_class = None if raw_class is None else parse_kv_class(raw_class)
    except ValueError as exc:
        raise ReportError(f"{path}.class: {exc}") from None
    return AccessReport(
        tenant=int(tenant),
        key=parse_key(raw["key"], f"{path}.key"),
        size=int(size),
        host=host,
        time=float(t),
        hit=hit,
        parent=None if parent is None else parse_key(parent, f"{path}.parent"),
        position=None if position is None else int(position),
        event=event,
        kv_class=kv_class,
    )


def parse_reports(body: bytes) -> list[AccessReport]:
    """Parses and validates a ``POST /v1/reports`` body.

    Args:
        body: the request body (UTF-8 JSON).

    Returns:
        The records, in body order.

    Raises:
        ReportError: not UTF-8 JSON, not a list, or a record is invalid (the message names
            the first bad record and field).
    """
    try:
        doc = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ReportError(f"body is not UTF-8: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ReportError(f"body is not JSON: {exc}") from None
    if not isinstance(doc, list):
        raise ReportError(f"body must be a JSON list of access records, got {_type(doc)}")
    return [_record(item, f"reports[{i}]") for i, item in enumerate(doc)]


class ReportClient:
    """Client of the report API (``HttpReporter``, ``python -m controlplane status``, tools).

    Args:
        base_url: e.g. ``http://10.254.1.1:9109``.
        timeout_s: per request.
    """

    def __init__(self, base_url: str, timeout_s: float = 2.0) -> None:
        self._base = base_url.rstrip("/")
        self._timeout = timeout_s

    def post(self, reports: Sequence[AccessReport]) -> tuple[int, dict[str, Any]]:
        """Sends records.

        Args:
            reports: the records.

        Returns:
            ``(HTTP status, JSON answer)``; a transport failure is status 0 with ``error``.
        """
        body = json.dumps([r.as_json() for r in reports]).encode()
        return self._request("POST", REPORTS_PATH, body)

    def status(self) -> tuple[int, dict[str, Any]]:
        """Reads ``GET /v1/status``.

        Returns:
            ``(HTTP status, JSON answer)``; a transport failure is status 0 with ``error``.
        """
        return self._request("GET", STATUS_PATH, None)

    def _request(self, method: str, path: str, body: bytes | None) -> tuple[int, dict[str, Any]]:
        request = urllib.request.Request(
            self._base + path,
            data=body,
            method=method,
            headers={"Content-Type": "application/json"} if body is not None else {},
        )
        try:
            with urllib.request.urlopen(request, timeout=self._timeout) as reply:
                return reply.status, _json_or_text(reply.read())
        except urllib.error.HTTPError as exc:
            return exc.code, _json_or_text(exc.read())
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            # HTTPException: a server that died in the middle of its reply (IncompleteRead,
            # BadStatusLine) is a transport failure too, never an exception in the caller.
            reason = getattr(exc, "reason", exc)
            return 0, {"error": f"{method} {self._base}{path}: {type(reason).__name__}: {reason}"}


def _json_or_text(raw: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return {"error": raw.decode("utf-8", "replace")[:500]}
    return doc if isinstance(doc, dict) else {"value": doc}


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
    def submit(self, entries: Sequence[AccessReport]) -> None:
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
        self.entries: list[AccessReport] = []
        self._lock = threading.Lock()
        self._stats = ReportStats()

    def submit(self, entries: Sequence[AccessReport]) -> None:  # noqa: D102
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
        self._client = ReportClient(self.url.removesuffix(REPORTS_PATH), timeout_s)
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

    def submit(self, entries: Sequence[AccessReport]) -> None:  # noqa: D102
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

    def _collect(self) -> list[AccessReport]:
        """Waits for records and returns one batch (possibly empty on a wake-up)."""
        batch: list[AccessReport] = []
        item = self._q.get()
        deadline = time.monotonic() + self.max_delay_s
        while True:
            if isinstance(item, AccessReport):
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

    def _post(self, batch: list[AccessReport]) -> bool:
        """Posts one batch and counts the outcome; False when the controller was unreachable."""
        status, answer = self._client.post(batch)
        if status == 0:
            self._failed(batch, str(answer.get("error")))
            return False
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

    def _failed(self, batch: list[AccessReport], why: str) -> None:
        with self._lock:
            self._stats.last_error = why
        if not self._down:
            self._down = True
            _LOG.warning("access reports are being dropped: %s", why)
        self._account(dropped_failed=len(batch), failed_posts=1)


def _accepted(answer: dict[str, Any], expected: int) -> int | None:
    """The ``accepted`` count of a 2xx answer, or None when the answer is not that JSON."""
    n = answer.get("accepted")
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= expected:
        return None
    return n


def _error_text(answer: dict[str, Any]) -> str:
    """The ``error`` of a JSON error answer, else what the answer was."""
    error = answer.get("error")
    return error[:200] if isinstance(error, str) else json.dumps(answer)[:200]
