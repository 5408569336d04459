"""The pool node's background thread: runs until stopped, starts and stops once, restarts."""

from __future__ import annotations

import threading
import time

import pytest

from poolnode.threads import BackgroundThread


def test_runs_the_target_until_stopped_and_a_second_start_or_stop_changes_nothing() -> None:
    started = threading.Event()
    runs: list[str] = []
    seen: list[threading.Thread] = []

    def target() -> None:
        runs.append(threading.current_thread().name)
        seen.append(threading.current_thread())
        started.set()
        worker.stopping.wait()

    worker = BackgroundThread(target, "test-worker")
    assert not worker.running
    worker.start()
    worker.start()
    assert started.wait(5)
    assert worker.running
    worker.stop(timeout_s=5)
    worker.stop()
    assert not worker.running
    assert runs == ["test-worker"]
    assert seen[0].daemon and not seen[0].is_alive()


def test_starts_again_after_a_stop() -> None:
    calls = 0
    ran = threading.Event()

    def target() -> None:
        nonlocal calls
        calls += 1
        ran.set()

    worker = BackgroundThread(target, "test-restart")
    for _ in range(2):
        ran.clear()
        worker.start()
        assert ran.wait(5)
        worker.stop(timeout_s=5)
    assert calls == 2


def test_every_calls_the_function_each_period_and_not_after_stop() -> None:
    calls: list[int] = []
    third = threading.Event()

    def tick() -> None:
        calls.append(len(calls))
        if len(calls) == 3:
            third.set()

    worker = BackgroundThread.every(0.01, tick, "test-periodic")
    assert calls == []  # nothing before start
    worker.start()
    assert third.wait(5)
    worker.stop(timeout_s=5)
    after = len(calls)
    assert after >= 3
    time.sleep(0.05)  # five periods
    assert len(calls) == after  # no call once stopped


@pytest.mark.parametrize("period_s", [0.0, -1.0])
def test_every_refuses_a_period_that_is_not_positive(period_s: float) -> None:
    with pytest.raises(ValueError, match="period_s must be > 0"):
        BackgroundThread.every(period_s, lambda: None, "test-bad")
