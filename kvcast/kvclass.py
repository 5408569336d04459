"""KV classes: static prefixes (reused by every branch and task) and transient suffixes.

An agentic task forks branches that share a system prompt and tool definitions (static: every
branch and every task reuses them) and each branch adds reasoning that is used once
(transient). The class decides what goes first under pressure: transient chunks are evicted
before static ones, in switch SRAM and in the DRAM pool. The application declares a class
(the vLLM connector's ``kvcast`` options, ``"class": "static"``; the controller's
``POST /v1/classes``), or the controller detects a prefix reused over a long window
(``controlplane.kvclasses``); anything else is transient.

This module is the one spelling of the class names that every component shares (agent,
controller, pool node), as ``kvcast.wire`` is for the wire format.

Classes:
    KvClass: the two classes, as their wire/JSON names.

Functions:
    parse_kv_class: a JSON value to a class, or a ``ValueError`` that says what is accepted.
"""

from __future__ import annotations

import enum

__all__ = ["KV_CLASS_NAMES", "KvClass", "parse_kv_class"]


class KvClass(enum.Enum):
    """The class of a KV chunk.

    Attributes:
        STATIC: a prefix reused across many requests (system prompt, tool definitions):
            kept under pressure, and a candidate for a push ahead of demand.
        TRANSIENT: everything else (a branch's own suffix): the first to go under pressure.
    """

    STATIC = "static"
    TRANSIENT = "transient"


KV_CLASS_NAMES: tuple[str, ...] = tuple(k.value for k in KvClass)
"""The accepted names, in a stable order (for messages and metric labels)."""


def parse_kv_class(value: object) -> KvClass:
    """A class from its JSON form.

    Args:
        value: ``"static"`` or ``"transient"`` (exact, lower case), or a ``KvClass``.

    Returns:
        The class.

    Raises:
        ValueError: anything else; the message lists the accepted names.
    """
    if isinstance(value, KvClass):
        return value
    if isinstance(value, str):
        for k in KvClass:
            if k.value == value:
                return k
    raise ValueError(f"expected one of {', '.join(KV_CLASS_NAMES)}, got {value!r}")
