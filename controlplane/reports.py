"""The access-report API: host agents tell the controller which chunks they used.

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
``GET /v1/status`` returns the controller's status as JSON.

The same small server type also serves the Prometheus endpoint (``GET /metrics``).

Classes:
    AccessReport: one validated access record.
    ReportError: a request body that is not a valid list of records (answered 400).
    ReportRejectedError: the controller refused valid records (unknown host: 400; queue full: 503).
    ReportSink: what the API hands records to (the daemon).
    Response: a status, content type and body.
    HttpApi: a threaded HTTP server with a route table (start, stop, address).
    ReportClient: the client side (agents, the ``status`` command).

Functions:
    parse_reports: a request body to records, or ReportError.
    parse_key: one chunk key from JSON (integer or 0x-hex/decimal string), or ReportError.
    report_routes: the routes of the report API for a sink.
"""

from __future__ import annotations

import http.client
import json
import logging
import math
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from controlplane.errors import ControlPlaneError
from kvcast.kvclass import KvClass, parse_kv_class

__all__ = [
    "EVENT_ACCESS",
    "EVENT_STORED",
    "AccessReport",
    "HttpApi",
    "ReportClient",
    "ReportError",
    "ReportRejectedError",
    "ReportSink",
    "Response",
    "parse_key",
    "parse_reports",
    "report_routes",
]

_LOG = logging.getLogger(__name__)

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


class ReportError(ControlPlaneError, ValueError):
    """A report body that is not a valid list of access records; the message says where."""


class ReportRejectedError(ControlPlaneError):
    """Valid records the controller cannot take.

    Attributes:
        status: the HTTP status to answer (400 for an unknown host, 503 for a full queue).
    """

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


# ------------------------------------------------------------------------------ parsing
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


# ------------------------------------------------------------------------------ server
class ReportSink(Protocol):
    """What the report API hands validated records to."""

    def submit_reports(self, reports: Sequence[AccessReport]) -> int:
        """Queues records for the next tick (called from the server's threads).

        Returns:
            How many were accepted.

        Raises:
            ReportRejectedError: the records cannot be taken (unknown host, queue full).
        """

    def status(self) -> Mapping[str, Any]:
        """The controller's status as a JSON-able mapping (called from the server's threads)."""


@dataclass(frozen=True)
class Response:
    """An HTTP answer.

    Attributes:
        status: HTTP status code.
        body: the body.
        content_type: its type.
    """

    status: int
    body: bytes
    content_type: str = "application/json"

    @classmethod
    def json(cls, status: int, doc: Any) -> Response:
        """A JSON answer."""
        return cls(status, (json.dumps(doc, sort_keys=True) + "\n").encode())


Handler = Callable[[bytes], Response]
"""A route: the request body (empty for GET) to the answer."""


def report_routes(sink: ReportSink) -> dict[tuple[str, str], Handler]:
    """The routes of the report API.

    Args:
        sink: where records go, and where the status comes from.

    Returns:
        ``(method, path) -> handler`` for ``POST /v1/reports`` and ``GET /v1/status``.
    """

    def post_reports(body: bytes) -> Response:
        try:
            reports = parse_reports(body)
            accepted = sink.submit_reports(reports)
        except ReportError as exc:
            return Response.json(HTTPStatus.BAD_REQUEST, {"error": str(exc)})
        except ReportRejectedError as exc:
            return Response.json(exc.status, {"error": str(exc)})
        return Response.json(HTTPStatus.ACCEPTED, {"accepted": accepted})

    def get_status(_body: bytes) -> Response:
        return Response.json(HTTPStatus.OK, dict(sink.status()))

    return {("POST", "/v1/reports"): post_reports, ("GET", "/v1/status"): get_status}


class HttpApi:
    """A small threaded HTTP/1.1 server over a route table.

    Each request runs in its own thread; a handler that raises is answered 500 and logged,
    never propagated. Bodies above ``max_body_bytes`` are refused (413) without being read.

    Args:
        host: address to bind.
        port: TCP port (0: ephemeral).
        routes: ``(method, path) -> handler``.
        max_body_bytes: the largest request body read.
        name: for logs and the thread name.
    """

    def __init__(
        self,
        host: str,
        port: int,
        routes: Mapping[tuple[str, str], Handler],
        *,
        max_body_bytes: int = 4 << 20,
        name: str = "http",
    ) -> None:
        self._host = host
        self._port = port
        self._routes = dict(routes)
        self._max_body = max_body_bytes
        self._name = name
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        """The bound ``(host, port)``.

        Raises:
            ControlPlaneError: not started.
        """
        if self._server is None:
            raise ControlPlaneError(f"{self._name} server is not started")
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def start(self) -> tuple[str, int]:
        """Binds and serves in a daemon thread.

        Returns:
            The bound address.

        Raises:
            ControlPlaneError: the address cannot be bound (in use, not local).
        """
        api = self

        class _Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            server_version = "kvcast-controller"

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                api._handle(self, "GET")

            def do_POST(self) -> None:  # noqa: N802
                api._handle(self, "POST")

            def do_PUT(self) -> None:  # noqa: N802
                api._handle(self, "PUT")

            def do_DELETE(self) -> None:  # noqa: N802
                api._handle(self, "DELETE")

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                _LOG.debug("%s: " + format, api._name, *args)

        try:
            server = ThreadingHTTPServer((self._host, self._port), _Handler)
        except OSError as exc:
            raise ControlPlaneError(
                f"{self._name}: cannot listen on {self._host}:{self._port}: "
                f"{exc.strerror or exc}; choose another address or port in the configuration"
            ) from None
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.1}, name=self._name, daemon=True
        )
        self._thread.start()
        return self.address

    def stop(self) -> None:
        """Stops serving and closes the socket (idempotent)."""
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join(timeout=5)

    def _handle(self, req: BaseHTTPRequestHandler, method: str) -> None:
        path = req.path.split("?", 1)[0]
        try:
            response = self._dispatch(req, method, path)
        except Exception:  # noqa: BLE001 - a request must never take the server down
            _LOG.exception("%s: %s %s failed", self._name, method, path)
            response = Response.json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": "internal error"})
        try:
            req.send_response(response.status)
            req.send_header("Content-Type", response.content_type)
            req.send_header("Content-Length", str(len(response.body)))
            if response.status >= 400 and method == "POST":
                req.send_header("Connection", "close")
                req.close_connection = True
            req.end_headers()
            req.wfile.write(response.body)
        except OSError as exc:
            _LOG.debug("%s: client went away: %s", self._name, exc)

    def _dispatch(self, req: BaseHTTPRequestHandler, method: str, path: str) -> Response:
        handler = self._routes.get((method, path))
        if handler is None:
            allowed = sorted(m for m, p in self._routes if p == path)
            if allowed:
                return Response.json(
                    HTTPStatus.METHOD_NOT_ALLOWED,
                    {"error": f"{method} not allowed on {path}; use {', '.join(allowed)}"},
                )
            paths = sorted({f"{m} {p}" for m, p in self._routes})
            return Response.json(
                HTTPStatus.NOT_FOUND, {"error": f"no {path}; this server has {', '.join(paths)}"}
            )
        body = b""
        if method in ("POST", "PUT"):
            length_text = req.headers.get("Content-Length")
            if length_text is None:
                return Response.json(
                    HTTPStatus.LENGTH_REQUIRED, {"error": "a Content-Length header is required"}
                )
            try:
                length = int(length_text)
            except ValueError:
                return Response.json(
                    HTTPStatus.BAD_REQUEST, {"error": f"bad Content-Length {length_text!r}"}
                )
            if length < 0 or length > self._max_body:
                return Response.json(
                    HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                    {"error": f"body of {length} bytes; at most {self._max_body} per request"},
                )
            body = req.rfile.read(length)
            if len(body) != length:
                return Response.json(
                    HTTPStatus.BAD_REQUEST, {"error": "body shorter than declared"}
                )
        return handler(body)


# ------------------------------------------------------------------------------ client
class ReportClient:
    """Client of the report API (host agents, ``python -m controlplane status``).

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
        return self._request("POST", "/v1/reports", body)

    def status(self) -> tuple[int, dict[str, Any]]:
        """Reads ``GET /v1/status``.

        Returns:
            ``(HTTP status, JSON answer)``; a transport failure is status 0 with ``error``.
        """
        return self._request("GET", "/v1/status", None)

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
            return 0, {"error": f"{method} {self._base}{path}: {reason}"}


def _json_or_text(raw: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return {"error": raw.decode("utf-8", "replace")[:500]}
    return doc if isinstance(doc, dict) else {"value": doc}
