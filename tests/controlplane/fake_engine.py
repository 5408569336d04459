"""A fake OpenAI-compatible engine server for the push tests: a real HTTP server in a thread.

It records every completions request (path and JSON body) and answers
``POST /v1/completions`` as told (through the controller's own small HTTP server):
200 with a completion, an error status, or not at all until released (a hung engine).

Classes:
    FakeEngine: the server, its recorded requests and its answer mode.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from controlplane.reports import HttpApi, Response

COMPLETIONS = "/v1/completions"


class FakeEngine:
    """One fake engine on loopback.

    Attributes:
        requests: ``(path, body)`` of every completions request received, in order.
        status: the status it answers with (200: a completion).
        hold: requests wait while it is cleared (a hung engine), at most 30 s.
    """

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.status = 200
        self.hold = threading.Event()
        self.hold.set()
        self._lock = threading.Lock()
        self._server = HttpApi(
            "127.0.0.1", 0, {("POST", COMPLETIONS): self._complete}, name="fake-engine"
        )
        self._server.start()

    def _complete(self, body: bytes) -> Response:
        with self._lock:
            self.requests.append((COMPLETIONS, json.loads(body)))
        self.hold.wait(30)
        if self.status != 200:
            return Response.json(self.status, {"error": "down"})
        doc = {"id": "cmpl-1", "object": "text_completion", "choices": [{"text": "x"}]}
        return Response.json(self.status, doc)

    @property
    def url(self) -> str:
        """Its base URL."""
        host, port = self._server.address
        return f"http://{host}:{port}"

    def bodies(self) -> list[dict[str, Any]]:
        """The bodies of the completions requests received so far."""
        with self._lock:
            return [b for p, b in self.requests if p == COMPLETIONS]

    def wait_requests(self, n: int, timeout_s: float = 10.0) -> list[dict[str, Any]]:
        """Waits until it has received ``n`` completions requests; returns them all."""
        deadline = time.monotonic() + timeout_s
        while len(self.bodies()) < n and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.bodies()

    def close(self) -> None:
        """Stops the server (held requests are released first)."""
        self.hold.set()
        self._server.stop()
