"""benchmarks.hostagent_fetch: the suite's lines, skips, and its testbed leaving nothing behind."""

from __future__ import annotations

import os
import subprocess

import pytest

from benchmarks import hostagent_fetch as suite
from benchmarks import loopback, parse_line
from emulation.targets import P4INFO_PATH, TargetUnavailableError
from kvcast.mooncake import MooncakeUnavailableError
from kvcast.native import native


def _fields(lines: list[str]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for line in lines:
        parsed = parse_line(line)
        if parsed is not None and parsed[0] == suite.SUITE:
            out.setdefault(parsed[1]["path"], parsed[1])  # the first line of each path
    return out


def test_unavailable_targets_give_skipped_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_switch(*_args: object, **_kw: object) -> list[dict[str, object]]:
        raise TargetUnavailableError("veth pairs need root (CAP_NET_ADMIN)")

    def no_mooncake(*_args: object, **_kw: object) -> dict[str, float]:
        raise MooncakeUnavailableError("mooncake_master not found")

    monkeypatch.setattr(loopback, "run", lambda quick, repeat: [])
    monkeypatch.setattr(suite, "measure_refswitch", no_switch)
    monkeypatch.setattr(suite, "measure_mooncake", no_mooncake)
    monkeypatch.setattr(suite, "bmv2_binary", lambda: None)
    fields = _fields(suite.run(quick=True))
    assert fields["refswitch"]["skipped"] == "veth-pairs-need-root-(CAP_NET_ADMIN)"
    assert fields["bmv2"]["skipped"] == "simple_switch_grpc-not-installed"
    assert fields["mooncake"]["skipped"] == "mooncake_master-not-found"
    # The receive and send lines need only the native module (their ceiling is native code).
    for path in ("agent_receive", "pool_send"):
        row = fields[path]
        if native is None:
            assert row["skipped"].startswith("kvcast._native-not-built")
        else:
            assert float(row["ratio"]) > 0 and float(row["ceiling_MBps"]) > 0
    if native is not None:
        assert float(fields["agent_receive"]["cpu_ratio"]) > 0
    # The multi-chunk line needs only a pool node process (in-memory backend): always measured.
    multi = fields["multi_chunk"]
    assert float(multi["serial_MBps"]) > 0 and float(multi["windowed_MBps"]) > 0
    assert multi["chunks_in_flight"] == "1" and multi["chunks"] == str(suite.MULTI_CHUNKS)
    # The MAC line needs nothing installed: it is always measured.
    mac = fields["mac"]
    assert float(mac["plain_MBps"]) > 0 and float(mac["mac_MBps"]) > 0
    ratio = float(mac["mac_MBps"]) / float(mac["plain_MBps"])
    assert float(mac["ratio"]) == pytest.approx(ratio, rel=1e-3)  # lines keep 4 digits


def test_mooncake_ratio_is_to_the_through_switch_fetch_when_measured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    probe = {
        "path": "refswitch", "udp_payload": 256, "fetch_MBps": 10.0, "udp_MBps": 12.5,
        "ratio": 0.8, "ratio_paired": 0.8, "fetch_client_us": 1.0, "udp_client_us": 1.0,
        "fetch_switch_us": 1.0, "udp_switch_us": 1.0, "fetch_pool_us": 0.0, "frags_hit": 768,
        "frags_pool": 0, "retries": 0, "udp_resent": 0,
    }  # fmt: skip
    monkeypatch.setattr(loopback, "run", lambda quick, repeat: [])
    monkeypatch.setattr(suite, "bmv2_binary", lambda: "/usr/bin/simple_switch_grpc")
    monkeypatch.setattr(
        suite,
        "measure_refswitch",
        lambda *a, kind, **k: [
            {**probe, "path": kind, "fetch_MBps": 5.0 if kind == "bmv2" else 10.0}
        ],
    )
    monkeypatch.setattr(
        suite,
        "measure_mooncake",
        lambda *a, **k: {
            "get_into_MBps": 300.0,
            "kvp_MBps": 60.0,
            "lone_MBps": 150.0,
            "lone_direct": 1.0,
        },
    )
    fields = _fields(suite.run(quick=True))
    assert fields["refswitch"]["ratio"] == "0.8"
    assert fields["refswitch"]["cpu_ratio"] == "1"
    assert fields["bmv2"]["fetch_MBps"] == "5"
    assert fields["mooncake"]["ratio_to_kvp"] == "5"
    assert fields["mooncake"]["ratio_to_kvp_refswitch"] == "30"  # to refswitch's, not BMv2's
    assert fields["mooncake"]["lone_ratio"] == "0.5"
    assert fields["mooncake"]["lone_path"] == "direct"


@pytest.mark.slow
@pytest.mark.netns
def test_quick_suite_measures_every_path_and_removes_its_testbed() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: veth pairs and network namespaces")
    if not P4INFO_PATH.exists():
        pytest.skip(f"{P4INFO_PATH} missing: run `make p4`")
    fields = _fields(suite.run(quick=True))
    for path in ("refswitch", "refswitch-pool"):
        row = fields[path]
        assert float(row["fetch_MBps"]) > 0 and float(row["udp_MBps"]) > 0
        assert float(row["ratio"]) == pytest.approx(
            float(row["fetch_MBps"]) / float(row["udp_MBps"]), rel=0.01
        )
    assert int(fields["refswitch"]["frags_hit"]) == 5 * suite.CHUNK_BYTES // 256
    assert int(fields["refswitch-pool"]["frags_pool"]) == 5 * suite.CHUNK_BYTES // 256
    assert "get_into_MBps" in fields["mooncake"] or "skipped" in fields["mooncake"]
    assert "fetch_MBps" in fields["bmv2"] or "skipped" in fields["bmv2"]
    tag = f"kvhf{os.getpid() % 100000}"
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert tag not in namespaces
    assert f"khf{os.getpid() % 10000}" not in links


def test_the_feed_process_sends_the_chunk_it_built() -> None:
    """benchmarks.udp_feed in its own process: what it sends is the chunk's DATAs, in order,
    from the KVP port of its loopback address, and it times the send on the caller's clock."""
    import socket
    import time

    from benchmarks.udp_feed import SENDER, Feed, stream_messages

    if native is None:
        pytest.skip("kvcast._native not built (pip install -e .): the feed sends with it")
    expected = [h + bytes(p) for h, p in stream_messages(64 * 256 + 5, 5)]
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    rx.bind(("127.0.0.1", 0))
    rx.settimeout(5)
    try:
        with Feed() as feed:
            assert feed.build(64 * 256 + 5, 5) == len(expected)
            before = time.clock_gettime(time.CLOCK_MONOTONIC)
            feed.send(rx.getsockname())
            got = [rx.recvfrom(65536) for _ in expected]
            t0, t1, sent = feed.finish()
    finally:
        rx.close()
    assert [d for d, _ in got] == expected and {src for _, src in got} == {SENDER}
    assert sent == sum(map(len, expected)) and before <= t0 <= t1
