"""A fake OpenAI-compatible engine server for the push tests: a real HTTP server in a thread.

It records every request (path and JSON body) and answers ``POST /v1/completions`` as told:
200 with a completion, an error status, or not at all until released (a hung engine).

Classes:
    FakeEngine: the server, its recorded requests and its answer mode.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FakeEngine:
    """One fake engine on loopback.

    Attributes:
        requests: ``(path, body)`` of every request received, in order.
        status: the status it answers with (200: a completion).
        hold: requests wait while it is cleared (a hung engine), at most 30 s.
    """

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.status = 200
        self.hold = threading.Event()
        self.hold.set()
        self._lock = threading.Lock()
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length))
                with engine._lock:
                    engine.requests.append((self.path, body))
                engine.hold.wait(30)
                status = engine.status
                doc = {"id": "cmpl-1", "object": "text_completion", "choices": [{"text": "x"}]}
                data = json.dumps(doc if status == 200 else {"error": "down"}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *_args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        """Its base URL."""
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def bodies(self) -> list[dict[str, Any]]:
        """The bodies of the completions requests received so far."""
        with self._lock:
            return [b for p, b in self.requests if p == "/v1/completions"]

    def wait_requests(self, n: int, timeout_s: float = 10.0) -> list[dict[str, Any]]:
        """Waits until it has received ``n`` completions requests; returns them all."""
        deadline = time.monotonic() + timeout_s
        while len(self.bodies()) < n and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.bodies()

    def close(self) -> None:
        """Stops the server (held requests are released first)."""
        self.hold.set()
        self._server.shutdown()
        self._server.server_close()
