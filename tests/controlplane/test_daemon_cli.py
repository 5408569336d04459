"""``python -m controlplane``: validate-config, and run + status + SIGTERM as a real process."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from controlplane.__main__ import main
from kvcast.reports import AccessReport, ReportClient

from .test_p4rt_harness import (
    HOST_IP,
    HOST_MAC,
    HOST_PORT,
    POOL_IP,
    POOL_MAC,
    POOL_PORT,
    RefSwitch,
    refswitch_fixture,  # noqa: F401 - provides the refswitch fixture
)

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_config(path: Path, address: str, **extra: object) -> tuple[int, int]:
    report_port, metrics_port = free_port(), free_port()
    doc = {
        "switches": [{"name": "s1", "address": address, "election_id": 10}],
        "pools": [{"name": "p1", "ip": POOL_IP, "mac": POOL_MAC, "port": POOL_PORT}],
        "hosts": [
            {"name": "h1", "ip": HOST_IP, "mac": HOST_MAC, "port": HOST_PORT, "tenants": [1]}
        ],
        "tick_s": 0.2,
        "report_api": {"listen": f"127.0.0.1:{report_port}"},
        "metrics": {"listen": f"127.0.0.1:{metrics_port}"},
        **extra,
    }
    path.write_text(yaml.safe_dump(doc))
    return report_port, metrics_port


def test_validate_config_prints_a_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "c.yaml"
    write_config(path, "127.0.0.1:9559")
    assert main(["validate-config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "is valid" in out and "switch s1: 127.0.0.1:9559" in out and "policy kvcast" in out


def test_validate_config_names_the_bad_setting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "c.yaml"
    write_config(path, "127.0.0.1:9559", tick_s=-1)
    assert main(["validate-config", str(path)]) == 2
    assert "tick_s: expected a positive finite number" in capsys.readouterr().err


def test_status_of_a_daemon_that_is_not_running_fails_cleanly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "c.yaml"
    write_config(path, "127.0.0.1:9559")
    assert main(["status", "--config", str(path), "--timeout", "1"]) == 1
    assert "no status from" in capsys.readouterr().err


def test_run_with_a_bad_config_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--config", str(tmp_path / "none.yaml")]) == 2
    assert "cannot read configuration" in capsys.readouterr().err


@pytest.mark.slow
def test_run_serves_status_and_metrics_and_stops_cleanly_on_sigterm(
    refswitch: RefSwitch, tmp_path: Path
) -> None:
    path = tmp_path / "c.yaml"
    report_port, _ = write_config(path, refswitch.address)
    proc = subprocess.Popen(
        [sys.executable, "-m", "controlplane", "run", "--config", str(path)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        client = ReportClient(f"http://127.0.0.1:{report_port}", timeout_s=1)
        state = None
        for _ in range(300):  # start-up (imports, connection): wait for READY, bounded
            code, doc = client.status()
            state = doc.get("switches", {}).get("s1", {}).get("state") if code == 200 else None
            if state == "ready" or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert state == "ready", proc.poll()
        report = AccessReport(1, 0xABC, 1000, "h1", time.time(), False)
        assert client.post([report]) == (202, {"accepted": 1})
        status = subprocess.run(
            [sys.executable, "-m", "controlplane", "status", "--config", str(path), "--metrics"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert status.returncode == 0, status.stderr
        assert '"policy": "kvcast"' in status.stdout
        assert 'kvcast_controller_switch_connected{switch="s1"} 1.0' in status.stdout
        assert "kvcast_controller_reports_received_total 1.0" in status.stdout
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    records = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    assert len(records) == len(err.splitlines())  # every log line is one JSON object
    events = [r.get("event") for r in records]
    assert events.index("start") < events.index("signal") < events.index("stop")
