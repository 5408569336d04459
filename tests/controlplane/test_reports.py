"""The access-report API: record validation, and the HTTP server's answers (no switch)."""

from __future__ import annotations

import json
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest

from controlplane.errors import ControlPlaneError
from controlplane.reports import HttpApi, ReportRejectedError, report_routes
from kvcast.kvclass import KvClass
from kvcast.reports import EVENT_STORED, AccessReport, ReportClient, ReportError, parse_reports

GOOD = {
    "tenant": 7,
    "key": "0xfedcba9876543210",
    "size": 2048,
    "host": "h1",
    "time": 1_700_000_000.5,
    "hit": True,
    "parent": 12345,
    "position": 1,
}


def body(doc: object) -> bytes:
    return json.dumps(doc).encode()


class Sink:
    """Records what the API hands over; refuses host "full" with 503 and "nobody" with 400."""

    def __init__(self) -> None:
        self.got: list[AccessReport] = []
        self.lock = threading.Lock()

    def submit_reports(self, reports: Sequence[AccessReport]) -> int:
        for r in reports:
            if r.host == "full":
                raise ReportRejectedError(503, "queue full; retry later")
            if r.host == "nobody":
                raise ReportRejectedError(400, "reports[0].host: unknown host 'nobody'")
        with self.lock:
            self.got.extend(reports)
        return len(reports)

    def status(self) -> Mapping[str, Any]:
        return {"started": True, "ticks": 3}


@pytest.fixture(name="api")
def api_fixture() -> Iterator[tuple[Sink, ReportClient, str]]:
    sink = Sink()
    server = HttpApi("127.0.0.1", 0, report_routes(sink), max_body_bytes=4096, name="test-api")
    host, port = server.start()
    url = f"http://{host}:{port}"
    yield sink, ReportClient(url), url
    server.stop()


def raw(url: str, method: str, data: bytes | None, headers: dict[str, str] | None = None) -> int:
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=5) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def refused(url: str, record: dict[str, object]) -> str:
    """POSTs one report record that must be refused with 400; returns the error message."""
    req = urllib.request.Request(url + "/v1/reports", data=body([record]), method="POST")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=5)
    assert err.value.code == 400
    return str(json.loads(err.value.read())["error"])


# ---------------------------------------------------------------------- parsing
def test_a_full_record_parses_with_hex_and_integer_keys() -> None:
    (r,) = parse_reports(body([GOOD]))
    assert r == AccessReport(7, 0xFEDCBA9876543210, 2048, "h1", 1_700_000_000.5, True, 12345, 1)


def test_optional_fields_default_to_unknown() -> None:
    doc = {k: GOOD[k] for k in ("tenant", "key", "size", "host", "time")}
    (r,) = parse_reports(body([doc]))
    assert (r.hit, r.parent, r.position) == (None, None, None)


def test_records_round_trip_through_as_json() -> None:
    (r,) = parse_reports(body([GOOD]))
    assert parse_reports(body([r.as_json()])) == [r]


def test_stored_records_parse_and_round_trip() -> None:
    doc = {k: v for k, v in GOOD.items() if k != "hit"}
    (r,) = parse_reports(body([{**doc, "event": "stored"}]))
    assert r.stored and r.hit is None and r.event == EVENT_STORED
    assert parse_reports(body([r.as_json()])) == [r]
    (plain,) = parse_reports(body([doc]))
    assert not plain.stored and "event" not in plain.as_json()


def test_a_declared_class_parses_and_round_trips() -> None:
    (r,) = parse_reports(body([{**GOOD, "class": "static"}]))
    assert r.kv_class is KvClass.STATIC
    assert r.as_json()["class"] == "static"
    assert parse_reports(body([r.as_json()])) == [r]
    (plain,) = parse_reports(body([GOOD]))
    assert plain.kv_class is None and "class" not in plain.as_json()


def test_a_bad_class_is_answered_400_naming_the_field(
    api: tuple[Sink, ReportClient, str],
) -> None:
    sink, _, url = api
    error = refused(url, {**GOOD, "class": "hot"})
    assert "reports[0].class: expected one of static, transient" in error
    assert sink.got == []


def test_an_empty_list_is_valid() -> None:
    assert parse_reports(b"[]") == []


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"reports": []}, "JSON list"),
        ([1], "reports[0]: expected an object"),
        ([{**GOOD, "color": 1}], "unknown field 'color'"),
        ([{k: v for k, v in GOOD.items() if k != "size"}], "missing field 'size'"),
        ([{**GOOD, "tenant": 70000}], "reports[0].tenant"),
        ([{**GOOD, "tenant": True}], "reports[0].tenant"),
        ([{**GOOD, "key": -1}], "reports[0].key"),
        ([{**GOOD, "key": 1 << 64}], "not an unsigned 64-bit key"),
        ([{**GOOD, "key": "0xzz"}], "is not a key"),
        ([{**GOOD, "key": 1.5}], "expected a key"),
        ([{**GOOD, "size": 0}], "reports[0].size"),
        ([{**GOOD, "host": ""}], "reports[0].host"),
        ([{**GOOD, "host": -3}], "reports[0].host"),
        ([{**GOOD, "time": "now"}], "reports[0].time"),
        ([{**GOOD, "time": -1}], "reports[0].time"),
        ([{**GOOD, "hit": "yes"}], "reports[0].hit"),
        ([{**GOOD, "parent": "x"}], "reports[0].parent"),
        ([{**GOOD, "position": -1}], "reports[0].position"),
        ([GOOD, {**GOOD, "size": "big"}], "reports[1].size"),
        ([{**GOOD, "event": "deleted"}], "reports[0].event"),
        ([{**GOOD, "event": "stored"}], "a stored record has no hit"),
        ([{**GOOD, "class": "Static"}], "reports[0].class: expected one of static, transient"),
        ([{**GOOD, "class": 1}], "reports[0].class"),
    ],
)
def test_bad_records_are_named_in_the_error(doc: object, message: str) -> None:
    with pytest.raises(ReportError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_reports(body(doc))


def test_non_json_and_non_utf8_bodies_are_report_errors() -> None:
    with pytest.raises(ReportError, match="not JSON"):
        parse_reports(b"[{")
    with pytest.raises(ReportError, match="not UTF-8"):
        parse_reports(b"\xff\xfe")
    with pytest.raises(ReportError, match="not JSON"):
        parse_reports(b"")


def test_nan_time_is_refused() -> None:
    with pytest.raises(ReportError, match="time"):
        parse_reports(b'[{"tenant":1,"key":1,"size":1,"host":"h","time":NaN}]')


# ---------------------------------------------------------------------- HTTP
def test_valid_reports_are_accepted_with_202(api: tuple[Sink, ReportClient, str]) -> None:
    sink, client, _ = api
    (r,) = parse_reports(body([GOOD]))
    assert client.post([r, r]) == (202, {"accepted": 2})
    assert sink.got == [r, r]


def test_bad_input_is_answered_400_with_the_reason_and_the_server_stays_up(
    api: tuple[Sink, ReportClient, str],
) -> None:
    sink, client, url = api
    assert "reports[0].key" in refused(url, {**GOOD, "key": "nope"})
    for junk in (b"", b"{", b"\x00\x01", b'"text"', b"[[]]"):
        assert raw(url + "/v1/reports", "POST", junk) == 400
    (r,) = parse_reports(body([GOOD]))
    assert client.post([r]) == (202, {"accepted": 1})
    assert sink.got == [r]


def test_refusals_by_the_sink_keep_their_status(api: tuple[Sink, ReportClient, str]) -> None:
    _, client, _ = api
    (r,) = parse_reports(body([{**GOOD, "host": "full"}]))
    code, doc = client.post([r])
    assert (code, doc["error"]) == (503, "queue full; retry later")
    (r,) = parse_reports(body([{**GOOD, "host": "nobody"}]))
    code, doc = client.post([r])
    assert code == 400 and "unknown host" in doc["error"]


def test_oversized_bodies_are_refused_unread(api: tuple[Sink, ReportClient, str]) -> None:
    sink, _, url = api
    assert raw(url + "/v1/reports", "POST", b"[" + b" " * 5000 + b"]") == 413
    assert sink.got == []


def test_unknown_paths_and_methods(api: tuple[Sink, ReportClient, str]) -> None:
    _, _, url = api
    assert raw(url + "/v2/reports", "POST", b"[]") == 404
    assert raw(url + "/v1/reports", "GET", None) == 405
    assert raw(url + "/v1/status", "DELETE", None) == 405


def test_status_is_served_as_json(api: tuple[Sink, ReportClient, str]) -> None:
    _, client, _ = api
    assert client.status() == (200, {"started": True, "ticks": 3})


def test_an_unreachable_api_is_status_0_not_an_exception() -> None:
    server = HttpApi("127.0.0.1", 0, {}, name="gone")
    _, port = server.start()
    server.stop()
    code, doc = ReportClient(f"http://127.0.0.1:{port}", timeout_s=1).status()
    assert code == 0 and "error" in doc


@pytest.mark.parametrize(
    "reply",
    [
        b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"a"',  # cut short: IncompleteRead
        b"HTT",  # cut in its status line: BadStatusLine
        b"",  # closed unanswered: RemoteDisconnected
    ],
)
def test_an_api_that_dies_in_its_reply_is_status_0_not_an_exception(reply: bytes) -> None:
    # A controller killed while it answers a host's POST must not kill the host's agent.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]

    def answer() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(reply)

    server = threading.Thread(target=answer)
    server.start()
    try:
        code, doc = ReportClient(f"http://127.0.0.1:{port}", timeout_s=2).post([])
    finally:
        server.join(5)
        listener.close()
    assert code == 0 and doc["error"].startswith(f"POST http://127.0.0.1:{port}/v1/reports: ")


def test_a_taken_port_is_a_clear_error(api: tuple[Sink, ReportClient, str]) -> None:
    _, _, url = api
    port = int(url.rsplit(":", 1)[1])
    with pytest.raises(ControlPlaneError, match="cannot listen"):
        HttpApi("127.0.0.1", port, {}, name="second").start()


def test_a_restricted_route_answers_only_its_operators() -> None:
    from controlplane.reports import Response

    def moved(_body: bytes) -> Response:
        return Response.json(200, {"moved": True})

    route = ("POST", "/v1/fabric/links")
    for operators, want in ((frozenset({"10.9.9.9"}), 403), (frozenset({"127.0.0.1"}), 200)):
        server = HttpApi("127.0.0.1", 0, {route: moved}, name="t", restricted={route: operators})
        host, port = server.start()
        req = urllib.request.Request(f"http://{host}:{port}{route[1]}", data=b"{}", method="POST")
        try:
            with urllib.request.urlopen(req, timeout=5) as reply:
                status, doc = int(reply.status), json.loads(reply.read())
        except urllib.error.HTTPError as exc:
            status, doc = int(exc.code), json.loads(exc.read())
        finally:
            server.stop()
        assert status == want, doc
        if want == 403:
            assert "is for operators; 127.0.0.1 is not one" in doc["error"]
        else:
            assert doc == {"moved": True}
