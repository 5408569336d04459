"""Which data path is in use: the C extension ``kvcast._native`` or the pure-Python fallback.

``pip install -e .`` compiles kvcast/_native.c (setup.py; optional: a machine without a C
compiler installs without it). Set ``KVCAST_NATIVE=0`` to run the pure-Python paths even where
the extension is built; the test suite runs the fetch tests both ways.

Attributes:
    native: the extension module, or None (not built, or disabled).

Functions:
    enabled: whether the native path is in use now (reads ``KVCAST_NATIVE`` each time).
    describe: a one-line account for logs and benchmark lines.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

_ext: ModuleType | None
try:
    _ext = importlib.import_module("kvcast._native")
except ImportError:  # not compiled here: the pure-Python paths run
    _ext = None

native: ModuleType | None = _ext

__all__ = ["describe", "enabled", "native"]


def enabled() -> ModuleType | None:
    """The extension when it is built and ``KVCAST_NATIVE`` is not ``0``; else None."""
    if _ext is None or os.environ.get("KVCAST_NATIVE", "1") == "0":
        return None
    return _ext


def describe() -> str:
    """``native`` or ``python (why)``."""
    if _ext is None:
        return "python (kvcast._native not built)"
    if enabled() is None:
        return "python (KVCAST_NATIVE=0)"
    return "native"
