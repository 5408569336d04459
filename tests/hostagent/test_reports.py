"""kvcast.reports: access records, the HTTP reporter against local servers, the fetch hook."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import torch

from controlplane.reports import HttpApi, report_routes
from hostagent import agent
from hostagent.fetch import FetchClient
from kvcast.backend import InMemoryBackend
from kvcast.fetch import FetchOutcome, FetchReport, RecomputeReason, entry_from_fetch
from kvcast.reports import (
    AccessReport,
    HttpReporter,
    InMemorySink,
    ReportError,
    ReportSink,
    ReportStats,
    parse_reports,
)
from poolnode.server import PoolServer

TENANT, KEY, NBYTES = 3, 0xFEDC_BA98_7654_3210, 5000  # a key above 2**53 stays exact
WAIT_S = 10.0  # generous bound on waiting for a background thread; never a measured time

Reply = tuple[int, bytes]


class RecordingServer:
    """``http.server`` in a thread: records each request, answers with ``reply(body)``."""

    def __init__(self, reply: Callable[[bytes], Reply] | None = None) -> None:
        self.reply = reply or (
            lambda body: (202, json.dumps({"accepted": len(json.loads(body))}).encode())
        )
        self.requests: list[tuple[str, str, dict[str, str], bytes]] = []
        self.arrived = threading.Event()
        self.release = threading.Event()
        self.release.set()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                server.requests.append((self.command, self.path, dict(self.headers), body))
                server.arrived.set()
                server.release.wait(WAIT_S)
                status, answer = server.reply(body)
                self.send_response(status)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def batches(self) -> list[list[dict[str, Any]]]:
        return [json.loads(body) for _, _, _, body in self.requests]

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server() -> Iterator[RecordingServer]:
    srv = RecordingServer()
    yield srv
    srv.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _entries(n: int, host: str = "h1") -> list[AccessReport]:
    return [AccessReport(TENANT, KEY + i, 4096, host, 1.7e9 + i, hit=i % 2 == 0) for i in range(n)]


def _balanced(stats: ReportStats) -> bool:
    return stats.submitted == stats.sent + stats.rejected + stats.dropped


def _report(frags_hit: int, frags_pool: int, ok: bool = True) -> FetchReport:
    return FetchReport(
        outcome=FetchOutcome.COMPLETE if ok else FetchOutcome.RECOMPUTE,
        reason=RecomputeReason.NONE if ok else RecomputeReason.NOT_FOUND,
        tenant=TENANT,
        key=KEY,
        nbytes=10 * 256,
        frag_count=10,
        frags_hit=frags_hit,
        frags_pool=frags_pool,
    )


# -- records ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("frags_hit", "frags_pool", "hit"), [(10, 0, True), (6, 4, True), (5, 5, False), (0, 10, False)]
)
def test_hit_means_more_than_half_of_the_fragments_from_the_switch(
    frags_hit: int, frags_pool: int, hit: bool
) -> None:
    assert entry_from_fetch(_report(frags_hit, frags_pool), "h1").hit is hit


def test_a_recomputed_chunk_is_an_access_with_unknown_source() -> None:
    entry = entry_from_fetch(_report(0, 3, ok=False), "h1", when=5.0, parent=7, position=2)
    assert entry == AccessReport(TENANT, KEY, 2560, "h1", 5.0, None, 7, 2)


def test_json_writes_keys_as_hex_strings_and_leaves_out_unset_fields() -> None:
    # A key above 2**53 as a JSON number loses precision in many readers; a string never does.
    assert AccessReport(TENANT, KEY, 10, "h1", 1.5).as_json() == {
        "tenant": TENANT, "key": f"{KEY:#x}", "size": 10, "host": "h1", "time": 1.5,
    }  # fmt: skip
    full = AccessReport(TENANT, KEY, 10, 4, 1.5, hit=False, parent=KEY - 1, position=0).as_json()
    assert (full["hit"], full["parent"], full["position"]) == (False, f"{KEY - 1:#x}", 0)


def test_the_controllers_parser_accepts_the_records() -> None:
    body = json.dumps([e.as_json() for e in _entries(2)]).encode()
    assert parse_reports(body) == [
        AccessReport(TENANT, KEY, 4096, "h1", 1.7e9, True),
        AccessReport(TENANT, KEY + 1, 4096, "h1", 1.7e9 + 1, False),
    ]


def test_the_controllers_parser_accepts_stored_records() -> None:
    entry = AccessReport(TENANT, KEY, 4096, "h1", 1.7e9, parent=KEY - 1, position=1, event="stored")
    (got,) = parse_reports(json.dumps([entry.as_json()]).encode())
    assert got == AccessReport(TENANT, KEY, 4096, "h1", 1.7e9, None, KEY - 1, 1, "stored")
    assert got.stored


# -- the HTTP reporter -----------------------------------------------------------------------------


@pytest.mark.parametrize("url", ["https://c:9109", "ftp://c", "http://:9109", "http://c:port", "c"])
def test_a_url_that_is_not_http_host_port_is_refused(url: str) -> None:
    with pytest.raises(ReportError, match="report URL"):
        HttpReporter(url)


def test_batches_are_posted_as_json_lists_to_the_reports_path(server: RecordingServer) -> None:
    entries = _entries(7)
    with HttpReporter(server.url, max_batch=3, max_delay_s=WAIT_S) as rep:
        rep.submit(entries)
        assert rep.flush(WAIT_S)
        stats = rep.stats()
    assert [len(b) for b in server.batches()] == [3, 3, 1]
    assert [r for b in server.batches() for r in b] == [e.as_json() for e in entries]
    method, path, headers, _ = server.requests[0]
    assert (method, path, headers["Content-Type"]) == ("POST", "/v1/reports", "application/json")
    assert (stats.sent, stats.batches, stats.dropped, stats.rejected) == (7, 3, 0, 0)


def test_a_partial_batch_goes_out_after_max_delay_without_a_flush(server: RecordingServer) -> None:
    rep = HttpReporter(server.url, max_batch=100, max_delay_s=0.05)
    try:
        rep.submit(_entries(2))
        assert server.arrived.wait(WAIT_S)
        assert server.batches() == [[e.as_json() for e in _entries(2)]]
    finally:
        rep.close()


def test_the_controllers_own_api_receives_the_records() -> None:
    got: list[AccessReport] = []

    class Sink:
        def submit_reports(self, reports: Sequence[AccessReport]) -> int:
            got.extend(reports)
            return len(reports)

        def status(self) -> dict[str, Any]:
            return {}

    api = HttpApi("127.0.0.1", 0, report_routes(Sink()))
    host, port = api.start()
    try:
        with HttpReporter(f"http://{host}:{port}/") as rep:
            rep.submit(_entries(3))
            assert rep.flush(WAIT_S)
            assert rep.stats().sent == 3
    finally:
        api.stop()
    assert [r.key for r in got] == [KEY, KEY + 1, KEY + 2]


def test_controller_down_drops_and_counts_without_raising() -> None:
    rep = HttpReporter(f"http://127.0.0.1:{_free_port()}", timeout_s=0.5)
    rep.submit(_entries(4))
    assert rep.flush(WAIT_S)
    rep.close(timeout_s=0.1)
    rep.submit(_entries(1))  # after close: dropped, not raised
    stats = rep.stats()
    assert stats.sent == 0
    assert stats.dropped == 5 and stats.failed_posts >= 1
    assert "ConnectionRefusedError" in stats.last_error
    assert _balanced(stats)


def test_a_full_queue_drops_new_records(server: RecordingServer) -> None:
    server.release.clear()  # the first POST hangs until released
    rep = HttpReporter(server.url, max_batch=1, max_queue=2, max_delay_s=WAIT_S)
    try:
        rep.submit(_entries(1))
        assert server.arrived.wait(WAIT_S)  # the thread holds that record in its POST
        rep.submit(_entries(5))
        assert rep.stats().dropped_full == 3
        server.release.set()
        assert rep.flush(WAIT_S)
    finally:
        rep.close()
    stats = rep.stats()
    assert (stats.sent, stats.dropped_full, stats.submitted) == (3, 3, 6)


def test_records_queued_while_backing_off_are_counted_at_close() -> None:
    rep = HttpReporter(f"http://127.0.0.1:{_free_port()}", backoff_s=WAIT_S, timeout_s=0.5)
    rep.submit(_entries(1))
    assert rep.flush(WAIT_S)  # failed: the thread now waits out its backoff
    rep.submit(_entries(3))
    assert not rep.flush(0.05)
    rep.close(timeout_s=0.05)
    stats = rep.stats()
    assert (stats.dropped_failed, stats.failed_posts) == (4, 1)
    assert _balanced(stats)


@pytest.mark.parametrize(
    ("status", "answer", "counts"),
    [
        (202, b"not json", {"sent": 2, "bad_responses": 1}),
        (200, b'{"accepted": 9}', {"sent": 2, "bad_responses": 1}),
        (202, b'{"accepted": 1}', {"sent": 1, "rejected": 1}),
        (400, b'{"error": "reports[0].host: unknown host"}', {"rejected": 2}),
        (404, b"<html>nope</html>", {"rejected": 2}),
        (503, b'{"error": "queue full"}', {"dropped_failed": 2, "failed_posts": 1}),
    ],
)
def test_each_kind_of_answer_is_counted(status: int, answer: bytes, counts: dict[str, int]) -> None:
    srv = RecordingServer(lambda body: (status, answer))
    try:
        rep = HttpReporter(srv.url)
        rep.submit(_entries(2))
        assert rep.flush(WAIT_S)
        rep.close()
    finally:
        srv.close()
    stats = rep.stats().as_dict()
    for name in ("sent", "rejected", "dropped_failed", "failed_posts", "bad_responses"):
        assert stats[name] == counts.get(name, 0), name
    if status >= 400:
        assert str(status) in stats["last_error"]
    if status == 400:
        assert "unknown host" in stats["last_error"]


def test_a_reply_that_is_not_http_is_a_failed_post() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def garbage() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"hello, this is not HTTP\r\n\r\n")

    thread = threading.Thread(target=garbage, daemon=True)
    thread.start()
    try:
        rep = HttpReporter(f"http://127.0.0.1:{listener.getsockname()[1]}")
        rep.submit(_entries(2))
        assert rep.flush(WAIT_S)
        rep.close()
    finally:
        thread.join(WAIT_S)
        listener.close()
    stats = rep.stats()
    assert (stats.dropped_failed, stats.failed_posts, stats.sent) == (2, 1, 0)
    assert "BadStatusLine" in stats.last_error


# -- the fetch hook and the agent ------------------------------------------------------------------


@pytest.fixture
def pool() -> Iterator[tuple[str, int]]:
    backend = InMemoryBackend()
    backend.put(TENANT, KEY, bytes(range(256)) * 19 + bytes(136))
    srv = PoolServer(backend, "127.0.0.1", 0)
    srv.bind()
    srv.start()
    yield srv.address
    srv.stop()


def test_every_fetch_hands_one_record_to_the_sink(pool: tuple[str, int]) -> None:
    sink = InMemorySink()
    dst = torch.empty(NBYTES, dtype=torch.uint8)
    with FetchClient(pool, reporter=sink, report_host="h7") as client:
        ok = client.fetch(TENANT, KEY, dst, parent=KEY - 1, position=4)
        missing = client.fetch(TENANT, KEY + 1, dst)
    assert ok.ok and not missing.ok
    first, second = sink.entries
    assert (first.tenant, first.key, first.size, first.host) == (TENANT, KEY, NBYTES, "h7")
    assert (first.hit, first.parent, first.position) == (False, KEY - 1, 4)
    assert (second.key, second.hit, second.parent) == (KEY + 1, None, None)


def test_a_sink_that_raises_does_not_fail_the_fetch(pool: tuple[str, int]) -> None:
    class Broken(ReportSink):
        def submit(self, entries: Sequence[AccessReport]) -> None:
            raise RuntimeError("sink broke")

        def stats(self) -> ReportStats:
            return ReportStats()

    dst = torch.empty(NBYTES, dtype=torch.uint8)
    with FetchClient(pool, reporter=Broken()) as client:
        assert client.fetch(TENANT, KEY, dst).ok


def test_fetch_completes_when_the_controller_is_down(pool: tuple[str, int]) -> None:
    rep = HttpReporter(f"http://127.0.0.1:{_free_port()}", timeout_s=0.5)
    dst = torch.empty(NBYTES, dtype=torch.uint8)
    with FetchClient(pool, reporter=rep) as client:
        reports = [client.fetch(TENANT, KEY, dst) for _ in range(3)]
    rep.close()
    assert all(r.ok for r in reports)
    assert rep.stats().dropped == 3


def _agent_argv(pool: tuple[str, int], *extra: str) -> list[str]:
    return [
        "fetch", "--tenant", str(TENANT), "--key", f"{KEY:#x}", "--nbytes", str(NBYTES),
        "--service", pool[0], "--service-port", str(pool[1]), "--bind", "127.0.0.1",
        "--bind-port", "0", "--name", "hx", *extra,
    ]  # fmt: skip


def test_agent_reports_the_fetch_to_the_url(
    pool: tuple[str, int], server: RecordingServer, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = _agent_argv(pool, "--report-url", server.url, "--parent", "0x11", "--position", "1")
    assert agent.main(argv) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["reports"]["sent"] == 1
    (entry,) = server.batches()[0]
    assert (entry["key"], entry["host"], entry["hit"], entry["parent"], entry["position"]) == (
        f"{KEY:#x}", "hx", False, "0x11", 1,
    )  # fmt: skip
    assert record["t_start"] <= entry["time"]


def test_agent_fetch_succeeds_and_counts_the_drop_when_the_controller_is_down(
    pool: tuple[str, int], capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"http://127.0.0.1:{_free_port()}"
    assert agent.main(_agent_argv(pool, "--report-url", url, "--report-host", "gpu-3")) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["ok"] is True
    assert (record["reports"]["sent"], record["reports"]["dropped"]) == (0, 1)


def test_agent_with_a_bad_report_url_does_not_start(
    pool: tuple[str, int], capsys: pytest.CaptureFixture[str]
) -> None:
    assert agent.main(_agent_argv(pool, "--report-url", "controller:9109")) == 2
    assert "ReportError" in json.loads(capsys.readouterr().out)["error"]
