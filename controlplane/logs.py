"""The controller daemon's logging: one JSON object per line.

Classes:
    JsonFormatter: formats a log record as one JSON object (time, level, logger, message and
        the record's extras).

Functions:
    configure_logging: sends every log record to a stream as JSON lines.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys
from typing import IO, Any

__all__ = ["JsonFormatter", "configure_logging"]

_STANDARD_ATTRS = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON object: time, level, logger, message, and its extras.

    ``_LOG.info("loaded", extra={"event": "load", "switch": "s1"})`` gives
    ``{"ts": "...", "level": "INFO", "logger": "...", "msg": "loaded", "event": "load",
    "switch": "s1"}``.
    """

    def format(self, record: logging.LogRecord) -> str:  # noqa: D102
        doc: dict[str, Any] = {
            "ts": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD_ATTRS and not key.startswith("_"):
                doc[key] = value
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def configure_logging(level: str = "INFO", stream: IO[str] | None = None) -> logging.Handler:
    """Sends every log record to ``stream`` (stderr) as JSON lines.

    Args:
        level: the root level name.
        stream: where lines go.

    Returns:
        The installed handler (remove it to undo).
    """
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    return handler
