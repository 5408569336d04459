"""The serving engine's completions endpoint: what the controller's push sends becomes a run.

The engine itself (vLLM) is replaced by a recorder of the ``run`` commands it would execute;
the command loop, the HTTP server and the ``served`` command are the real ones.
"""

from __future__ import annotations

import io
import json
import os
import socket
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

import experiments.serving_engine as se
from controlplane.pusher import StaticPrefix, completion_body


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def post(port: int, body: object) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as reply:
            return int(reply.status), json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return int(exc.code), json.loads(exc.read())


def test_a_push_order_is_run_in_turn_with_the_commands_and_listed_as_served(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runs: list[dict[str, Any]] = []

    def fake_run(_llm: Any, cmd: dict[str, Any], seq: int) -> dict[str, Any]:
        runs.append(cmd)
        if cmd["prompt"] == [0]:
            raise RuntimeError("engine failure")
        return {"tokens": [seq], "loaded_tokens": len(cmd["prompt"])}

    monkeypatch.setattr(se, "_run", fake_run)
    port = free_port()
    r, w = os.pipe()
    out = io.StringIO()
    with os.fdopen(r) as inp, os.fdopen(w, "w") as commands:
        loop = threading.Thread(target=se.serve, args=(None, inp, out, port))
        loop.start()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.02)
        order = completion_body(
            StaticPrefix(1, 7, (5, 6, 7), None, 3), group=9, leader=False, model="m"
        )
        code, doc = post(port, order)
        assert code == 200
        assert doc["kvcast"] == {"tokens": [1], "loaded_tokens": 3}
        assert doc["choices"][0]["token_ids"] == [1]
        assert runs == [
            {
                "cmd": "run",
                "prompt": [5, 6, 7],
                "max_tokens": 1,
                "kvcast": {"save": False, "class": "static", "group": 9, "role": "follower"},
            }
        ]
        assert post(port, {"prompt": [0], "max_tokens": 1})[0] == 500  # the run failed
        assert post(port, {"max_tokens": 1})[0] == 400  # no prompt
        commands.write('{"cmd": "served"}\n{"cmd": "quit"}\n')
        commands.flush()
        loop.join(10)
    assert not loop.is_alive()
    (line,) = out.getvalue().splitlines()
    served = json.loads(line)
    assert served["cmd"] == "served"
    assert [r.get("loaded_tokens") for r in served["runs"]] == [3, None]
    assert "engine failure" in served["runs"][1]["error"]
