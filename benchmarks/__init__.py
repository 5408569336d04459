"""kvcast benchmarks, run together by ``python -m benchmarks`` (``make bench``).

Every module in this package is a benchmark suite. A suite is found automatically when its
module defines either

* ``run(quick: bool = False) -> list[str]``: runs the suite, prints its result lines as they
  are measured and returns them (the module name is the suite name for ``--only``); or
* ``BENCHMARKS``: a list of :class:`Benchmark` objects, for a module with several suites; an
  empty list marks a tool a suite runs (``loopback``: the fetch client against a loopback pool
  server and the probe ``hostagent_fetch`` starts inside an emulated host).

A module with neither is a part of a suite: ``udp_feed`` (the native sender) and the
``hostagent_fetch_*`` modules (``switch``, ``pool``, ``datapath``: the measurements whose lines
the ``hostagent_fetch`` suite prints).

Result lines are parseable: ``bench <suite> key=value key=value ...`` (values without spaces),
for example ``bench policies workload=conversation budget=512 policy=kvcast byte_hit=0.0707
ratio_to_opt=0.511``. Other printed lines (``# ...`` comments, tables) are for people only.
Results compare things measured side by side in one run; they are never asserted in tests.

The top layer: a suite may import any kvcast package (``experiments`` too); nothing imports
``benchmarks``.

Classes:
    Benchmark: a named benchmark callable.

Functions:
    bench_line: format one result line.
    parse_line: split a result line into its suite and fields.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Benchmark", "bench_line", "parse_line"]


@dataclass(frozen=True)
class Benchmark:
    """A named benchmark.

    Attributes:
        name: suite name (what ``--only`` matches).
        run: callable taking ``quick`` and returning the result lines it printed.
        description: one line on what it measures.
    """

    name: str
    run: Callable[[bool], list[str]]
    description: str = ""


def bench_line(suite: str, **fields: object) -> str:
    """Format a result line; floats get 4 significant digits.

    Args:
        suite: suite name (second word of the line).
        **fields: key=value pairs in order; values must not contain spaces.

    Returns:
        ``"bench <suite> k=v ..."``.

    Raises:
        ValueError: if a value contains whitespace.
    """
    parts = ["bench", suite]
    for key, value in fields.items():
        text = f"{value:.4g}" if isinstance(value, float) else str(value)
        if not text or any(ch.isspace() for ch in text):
            raise ValueError(f"bench field {key}={text!r} must be non-empty without spaces")
        parts.append(f"{key}={text}")
    return " ".join(parts)


def parse_line(line: str) -> tuple[str, dict[str, str]] | None:
    """Parse a result line.

    Args:
        line: one printed line.

    Returns:
        ``(suite, fields)``, or None when the line is not a ``bench`` line. Words without
        ``=`` are collected, space-joined, under the field ``"label"``.
    """
    words = line.split()
    if len(words) < 2 or words[0] != "bench":
        return None
    fields: dict[str, str] = {}
    labels: list[str] = []
    for word in words[2:]:
        key, sep, value = word.partition("=")
        if sep:
            fields[key] = value
        else:
            labels.append(word)
    if labels:
        fields = {"label": " ".join(labels), **fields}
    return words[1], fields
