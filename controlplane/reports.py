"""The access-report API: host agents tell the controller which chunks they used.

``POST /v1/reports`` takes a JSON list of access records; their format, validation and
``400`` messages are the shared contract in ``kvcast.reports`` (``parse_reports``), which also
holds the client. ``POST /v1/reports`` answers ``202`` with
``{"accepted": n}``, ``400`` for an invalid body, ``413`` for a body over the limit, ``411``
without a Content-Length, ``503`` when the controller's queue is full (retry later),
``404``/``405`` for other paths and methods. Nothing a client sends can stop the server.
``GET /v1/status`` returns the controller's status as JSON.

The same small server type also serves the Prometheus endpoint (``GET /metrics``).

Classes:
    ReportRejectedError: the controller refused valid records (unknown host: 400; queue full: 503).
    ReportSink: what the API hands records to (the daemon).
    Response: a status, content type and body.
    HttpApi: a threaded HTTP server with a route table (start, stop, address).

Functions:
    report_routes: the routes of the report API for a sink.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from controlplane.errors import ControlPlaneError
from kvcast.reports import REPORTS_PATH, STATUS_PATH, AccessReport, ReportError, parse_reports

__all__ = [
    "HttpApi",
    "ReportRejectedError",
    "ReportSink",
    "Response",
    "report_routes",
]

_LOG = logging.getLogger(__name__)


class ReportRejectedError(ControlPlaneError):
    """Valid records the controller cannot take.

    Attributes:
        status: the HTTP status to answer (400 for an unknown host, 503 for a full queue).
    """

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


# ------------------------------------------------------------------------------ parsing
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

    return {("POST", REPORTS_PATH): post_reports, ("GET", STATUS_PATH): get_status}


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
        restricted: routes only these client addresses may use (others: 403).
    """

    def __init__(
        self,
        host: str,
        port: int,
        routes: Mapping[tuple[str, str], Handler],
        *,
        max_body_bytes: int = 4 << 20,
        name: str = "http",
        restricted: Mapping[tuple[str, str], frozenset[str]] | None = None,
    ) -> None:
        self._host = host
        self._restricted = dict(restricted or {})
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
        allowed_from = self._restricted.get((method, path))
        if allowed_from is not None and req.client_address[0] not in allowed_from:
            return Response.json(
                HTTPStatus.FORBIDDEN,
                {"error": f"{method} {path} is for operators; {req.client_address[0]} is not one"},
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
