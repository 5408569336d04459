"""``with`` for anything that starts and stops: one ``__enter__``/``__exit__`` pair.

Classes:
    Service: a base whose ``with`` block calls ``start()`` on entry and ``stop()`` on exit,
        whatever ends the block.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any, Self


class Service:
    """A thing with ``start()`` and ``stop()``; ``with service:`` runs it for the block."""

    def start(self) -> Any:
        """Starts the service (subclasses override it)."""
        raise NotImplementedError

    def stop(self) -> None:
        """Stops the service and frees what it holds (subclasses override it)."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
