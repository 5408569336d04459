"""kvcast.procs: a child ends by SIGTERM when it obeys, by SIGKILL when it does not."""

from __future__ import annotations

import signal
import subprocess
import sys

from kvcast import procs


def _child(code: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "up"
    return proc


def test_stop_ends_an_obedient_child_with_sigterm() -> None:
    proc = _child("import time; print('up', flush=True); time.sleep(60)")
    assert procs.stop(proc, timeout_s=10) == -signal.SIGTERM


def test_stop_kills_a_child_that_ignores_sigterm() -> None:
    code = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('up', flush=True); time.sleep(60)")  # fmt: skip
    proc = _child(code)
    assert procs.stop(proc, timeout_s=0.3) == -signal.SIGKILL


def test_stop_without_a_signal_only_waits_then_kills() -> None:
    code = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('up', flush=True); time.sleep(60)")  # fmt: skip
    proc = _child(code)
    assert procs.stop(proc, timeout_s=0.2, signal_first=False) == -signal.SIGKILL


def test_kill_and_stop_accept_no_process_and_an_ended_one() -> None:
    assert procs.stop(None) is None and procs.kill(None) is None
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    proc.wait()
    assert procs.stop(proc) == 3 and procs.kill(proc) == 3


def test_kill_is_a_sigkill() -> None:
    proc = _child("import time; print('up', flush=True); time.sleep(60)")
    assert procs.kill(proc) == -signal.SIGKILL
