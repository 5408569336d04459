"""Typed readers of the configuration's YAML values, each error naming the setting's path.

Classes:
    Section: a mapping being read key by key; keys left over are errors with a "did you mean".

Functions:
    kind_of: a value's kind for a message.
    as_str, as_int, as_float, as_bool, as_ip, as_mac, as_host_port, as_listen, as_path,
        as_list, as_choice: one value read as that type, or a ConfigError naming its path.
"""

from __future__ import annotations

import difflib
import ipaddress
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from controlplane.configspec import ListenAddress
from controlplane.errors import ConfigError

__all__ = [
    "Section",
    "as_bool",
    "as_choice",
    "as_float",
    "as_host_port",
    "as_int",
    "as_ip",
    "as_list",
    "as_listen",
    "as_mac",
    "as_path",
    "as_str",
    "kind_of",
]


class Section:
    """A mapping being read: takes keys one by one, then complains about any left over."""

    def __init__(self, raw: object, path: str) -> None:
        if not isinstance(raw, Mapping):
            raise ConfigError(f"{path or 'the file'}: expected a mapping, got {kind_of(raw)}")
        self._raw = dict(raw)
        self._path = path
        self._known: list[str] = []

    def at(self, key: str) -> str:
        """The path of ``key`` in this section."""
        return f"{self._path}.{key}" if self._path else key

    def take(self, key: str, default: object = ..., *, required: bool = False) -> Any:
        """Reads ``key`` (its default when absent; absent and required: a ConfigError)."""
        self._known.append(key)
        if key in self._raw:
            return self._raw.pop(key)
        if required or default is ...:
            raise ConfigError(f"{self.at(key)}: required setting is missing")
        return default

    def done(self) -> None:
        """Raises a ConfigError naming the first key nobody took."""
        for key in self._raw:
            hint = difflib.get_close_matches(str(key), self._known, n=1)
            maybe = f"; did you mean {hint[0]!r}?" if hint else ""
            known = ", ".join(self._known)
            raise ConfigError(f"{self.at(str(key))}: unknown setting{maybe} (known: {known})")


def kind_of(value: object) -> str:
    """A value's kind, for a message."""
    return "nothing" if value is None else type(value).__name__


def as_str(value: object, path: str) -> str:
    """A non-empty string."""
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{path}: expected a non-empty string, got {kind_of(value)} {value!r}")
    return value


def as_int(value: object, path: str, lo: int, hi: int) -> int:
    """An integer in ``lo..hi`` (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{path}: expected an integer, got {kind_of(value)} {value!r}")
    if not lo <= value <= hi:
        raise ConfigError(f"{path}: {value} is outside {lo}..{hi}")
    return value


def as_float(value: object, path: str, *, positive: bool = True) -> float:
    """A finite number (positive unless ``positive`` is False)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{path}: expected a number, got {kind_of(value)} {value!r}")
    out = float(value)
    if not math.isfinite(out) or (positive and out <= 0):
        raise ConfigError(f"{path}: expected a positive finite number, got {value!r}")
    return out


def as_bool(value: object, path: str) -> bool:
    """A boolean."""
    if not isinstance(value, bool):
        raise ConfigError(f"{path}: expected true or false, got {kind_of(value)} {value!r}")
    return value


def as_ip(value: object, path: str) -> str:
    """An IPv4 address, normalised."""
    text = as_str(value, path)
    try:
        return str(ipaddress.IPv4Address(text))
    except ValueError:
        raise ConfigError(f"{path}: {text!r} is not an IPv4 address") from None


def as_mac(value: object, path: str) -> str:
    """A MAC address ``xx:xx:xx:xx:xx:xx``, lower case."""
    text = as_str(value, path)
    parts = text.split(":")
    if len(parts) != 6 or not all(len(p) == 2 for p in parts):
        raise ConfigError(f"{path}: {text!r} is not a MAC address like 00:00:00:00:00:01")
    try:
        bytes(int(p, 16) for p in parts)
    except ValueError:
        raise ConfigError(f"{path}: {text!r} is not a MAC address") from None
    return text.lower()


def as_host_port(value: object, path: str, default_port: int | None = None) -> tuple[str, int]:
    """A ``host:port`` (the port may default to ``default_port``)."""
    text = as_str(value, path)
    host, sep, port_text = text.rpartition(":")
    if not sep:
        if default_port is None:
            raise ConfigError(f"{path}: {text!r} is not host:port")
        host, port_text = text, str(default_port)
    if not host:
        raise ConfigError(f"{path}: {text!r} has no host part")
    try:
        port = int(port_text)
    except ValueError:
        raise ConfigError(f"{path}: port {port_text!r} of {text!r} is not a number") from None
    return host, as_int(port, path, 0, 65535)


def as_listen(value: object, path: str) -> ListenAddress:
    """A ``host:port`` to bind."""
    host, port = as_host_port(value, path)
    return ListenAddress(host, port)


def as_path(value: object, path: str, base: Path | None, *, must_exist: bool) -> Path:
    """A path, relative to ``base`` (the file's folder) when not absolute."""
    p = Path(as_str(value, path)).expanduser()
    if not p.is_absolute() and base is not None:
        p = base / p
    if must_exist and not p.is_file():
        raise ConfigError(f"{path}: file {p} does not exist")
    return p


def as_list(value: object, path: str) -> list[object]:
    """A list (nothing: an empty one)."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise ConfigError(f"{path}: expected a list, got {kind_of(value)}")
    return value


def as_choice(raw: object, path: str, allowed: Sequence[str]) -> str:
    """One of ``allowed``."""
    if raw not in allowed:
        raise ConfigError(f"{path}: {raw!r} is not one of {', '.join(allowed)}")
    return str(raw)
