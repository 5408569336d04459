"""Stopping a child process the same way everywhere.

``stop`` asks a process to end (SIGTERM, or a caller's own polite request done beforehand),
waits up to a timeout, then kills it (SIGKILL) and reaps it; ``kill`` is the crash an
experiment injects. Both accept a process that already ended or never started (``None``).
The pool node's master supervisor, the experiments' cluster processes and the benchmarks use
these instead of their own copies of the same three steps.
"""

from __future__ import annotations

import signal
import subprocess


def stop(proc: subprocess.Popen[str] | subprocess.Popen[bytes] | None, timeout_s: float = 10.0,
         *, signal_first: bool = True) -> int | None:  # fmt: skip
    """Ends ``proc``: SIGTERM, up to ``timeout_s`` to exit, then SIGKILL; always reaps it.

    Args:
        proc: the child, or None (nothing to do).
        timeout_s: how long it may take to exit after the request.
        signal_first: False when the caller already asked it to end another way (closed its
            stdin, sent a quit command): then only the wait and the kill remain.

    Returns:
        Its exit status, or None when there was no process.
    """
    if proc is None:
        return None
    if proc.poll() is None:
        if signal_first:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()


def kill(proc: subprocess.Popen[str] | subprocess.Popen[bytes] | None) -> int | None:
    """Kills ``proc`` at once (SIGKILL, a crash: nothing flushed) and reaps it.

    Returns:
        Its exit status, or None when there was no process.
    """
    if proc is None:
        return None
    if proc.poll() is None:
        proc.kill()
    return proc.wait()
