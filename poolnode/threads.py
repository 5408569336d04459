"""The pool node's background threads: one start/stop lifecycle for the server and its helpers.

The UDP server, the group registry's refresh and the stats file writer each run one daemon
thread between ``start`` and ``stop``; this module is that lifecycle, once.

Classes:
    BackgroundThread: a daemon thread that runs a function until it is told to stop; starting
        and stopping are idempotent, and it can be started again after a stop.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["BackgroundThread"]


class BackgroundThread:
    """A daemon thread running ``target`` until :meth:`stop`.

    ``target`` watches :attr:`stopping` (``while not stopping.is_set()``, or
    ``stopping.wait(...)`` between steps) and returns once it is set.

    Args:
        target: what the thread runs.
        name: the thread's name.
    """

    def __init__(self, target: Callable[[], object], name: str) -> None:
        self.stopping = threading.Event()
        self._target = target
        self._name = name
        self._thread: threading.Thread | None = None

    @classmethod
    def every(cls, period_s: float, fn: Callable[[], object], name: str) -> BackgroundThread:
        """A thread that calls ``fn`` every ``period_s`` seconds, the first time one period in.

        Args:
            period_s: seconds between two calls (> 0).
            fn: what to call; an exception it raises ends the thread, so it handles its own.
            name: the thread's name.

        Returns:
            The thread, not started yet.

        Raises:
            ValueError: ``period_s`` is not positive.
        """
        if not period_s > 0:
            raise ValueError(f"period_s must be > 0, got {period_s}")

        def loop() -> None:
            while not worker.stopping.wait(period_s):
                fn()

        worker = cls(loop, name)
        return worker

    @property
    def running(self) -> bool:
        """Whether the thread was started and not stopped since."""
        return self._thread is not None

    def start(self) -> None:
        """Starts the thread (nothing if it runs already)."""
        if self._thread is None:
            self.stopping.clear()
            self._thread = threading.Thread(target=self._target, name=self._name, daemon=True)
            self._thread.start()

    def stop(self, timeout_s: float | None = None) -> None:
        """Sets :attr:`stopping` and waits for the thread (safe to call twice or unstarted).

        Args:
            timeout_s: the longest wait for the thread to end (None: until it ends).
        """
        self.stopping.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout_s)
