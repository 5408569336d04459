"""``python -m hostagent.agent fetch``: one fetch, one JSON line, against a real pool node."""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from hostagent.agent import AGENT_PORT, main
from kvcast.backend import InMemoryBackend
from kvcast.ports import AGENT_PORT as PORTS_AGENT_PORT
from kvcast.synthetic import synthetic_chunk
from poolnode.server import PoolServer

TENANT, KEY, NBYTES, SEED = 2, 0xC0FFEE0012, 50_000, 11
REQUIRED = {
    "host", "mode", "ok", "outcome", "t_start", "t_done", "completion_s", "nbytes",
    "frags_switch", "frags_pool", "retries", "crc_failures", "repairs", "verified",
}  # fmt: skip


@pytest.fixture(scope="module")
def pool_node() -> Iterator[int]:
    """``python -m poolnode`` with the synthetic chunk preloaded; yields its UDP port."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "poolnode", "--backend", "memory", "--host", "127.0.0.1"]
        + ["--port", "0", "--preload", f"{TENANT}:{KEY:#x}:{NBYTES}:{SEED}"]
        + ["--source-tenants", f"127.0.0.1={TENANT}"],  # the agents, on the loopback
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            match = re.search(r"listening .*port=(\d+)", line)
            if match:
                yield int(match.group(1))
                break
        else:
            pytest.fail("poolnode exited before listening")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def agent_args(port: int, *extra: str) -> list[str]:
    return [
        "fetch", "--tenant", str(TENANT), "--key", f"{KEY:#x}", "--nbytes", str(NBYTES),
        "--service", "127.0.0.1", "--service-port", str(port), "--bind", "127.0.0.1",
        "--bind-port", "0", "--get-timeout", "0.2", "--max-get-timeout", "0.5", "--name", "hx",
        *extra,
    ]  # fmt: skip


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, object]]:
    rc = main(argv)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1
    record: dict[str, object] = json.loads(lines[0])
    return rc, record


def test_agent_port_has_one_home() -> None:
    assert AGENT_PORT == PORTS_AGENT_PORT == 19287


def test_unicast_pool_fetch_prints_one_verified_json_line(pool_node: int) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "hostagent.agent"]
        + agent_args(pool_node, "--mode", "unicast-pool", "--verify-seed", str(SEED)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, proc.stdout + proc.stderr
    record = json.loads(lines[0])
    assert record.keys() >= REQUIRED
    assert proc.returncode == 0
    assert (record["ok"], record["verified"], record["outcome"]) == (True, True, "complete")
    assert (record["host"], record["mode"], record["nbytes"]) == ("hx", "unicast-pool", NBYTES)
    assert record["frags_pool"] == -(-NBYTES // 256) and record["frags_switch"] == 0
    assert record["t_done"] >= record["t_start"]


def test_wrong_seed_is_reported_unverified_with_exit_1(
    pool_node: int, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, record = run_main(agent_args(pool_node, "--verify-seed", str(SEED + 1)), capsys)
    assert (rc, record["ok"], record["verified"]) == (1, True, False)


def test_start_at_in_the_past_starts_at_once_and_measures_from_it(
    pool_node: int, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, record = run_main(agent_args(pool_node, "--start-at", "1000"), capsys)
    assert rc == 0 and record["verified"] is None
    assert record["completion_s"] == pytest.approx(float(record["t_done"]) - 1000)  # type: ignore[arg-type]
    assert float(record["late_s"]) > 0  # type: ignore[arg-type]


def test_follower_without_a_stream_repairs_and_verifies(
    capsys: pytest.CaptureFixture[str],
) -> None:
    backend = InMemoryBackend()
    backend.put(TENANT, KEY, synthetic_chunk(TENANT, KEY, NBYTES, SEED))
    with PoolServer(backend, "127.0.0.1", 0) as srv:
        argv = agent_args(srv.address[1], "--mode", "follower", "--group", "3")
        rc, record = run_main(argv + ["--stall", "0.05", "--verify-seed", str(SEED)], capsys)
    assert (rc, record["verified"], record["stalled"]) == (0, True, True)
    assert record["repairs"] == -(-NBYTES // 256)


def test_unknown_chunk_is_a_failed_fetch_with_exit_1(
    pool_node: int, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = agent_args(pool_node, "--timeout", "5")
    argv[argv.index(f"{KEY:#x}")] = "0x1"
    rc, record = run_main(argv, capsys)
    assert (rc, record["ok"], record["outcome"], record["reason"]) == (
        1,
        False,
        "recompute",
        "not_found",
    )


def test_group_mode_without_a_group_is_an_error_line_with_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rc, record = run_main(agent_args(9, "--mode", "leader"), capsys)
    assert (rc, record["ok"], record["outcome"]) == (2, False, "error")
    assert "--group" in str(record["error"])


@pytest.mark.parametrize(
    ("tenant", "key", "culprit"),
    [
        ("1", "0x1" + "0" * 16, "--key"),
        ("65536", "1", "--tenant"),
        ("one", "1", "--tenant"),
        ("1", "xyz", "--key"),
    ],
)
def test_tenant_and_key_must_fit_their_fields(
    tenant: str, key: str, culprit: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["fetch", "--tenant", tenant, "--key", key, "--nbytes", "1"])
    assert exc.value.code == 2
    assert f"argument {culprit}:" in capsys.readouterr().err


def test_batch_runs_line_after_line_and_survives_bad_lines(pool_node: int) -> None:
    good = shlex.join(agent_args(pool_node, "--verify-seed", str(SEED))[1:])
    lines = [
        good,
        "--tenant 70000 --key 1 --nbytes 10",  # tenant out of range: an error line
        "",  # skipped
        shlex.join(agent_args(pool_node, "--verify-seed", str(SEED + 1))[1:]),  # wrong bytes
        good + " --start-at stdin",
        "1000",  # the start instant of the line before
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "hostagent.agent", "batch"],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    records = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(records) == 4, proc.stdout + proc.stderr
    assert (records[0]["ok"], records[0]["verified"]) == (True, True)
    assert records[1]["ok"] is False and "tenant '70000'" in records[1]["error"]
    assert (records[2]["ok"], records[2]["verified"]) == (True, False)
    assert records[3]["verified"] is True and records[3]["start_at"] == 1000.0
    assert proc.returncode == 1  # two of the four did not end complete and verified
    assert proc.stderr.count("agent ready") == 3
