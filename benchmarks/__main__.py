"""Run every benchmark suite and print result lines plus a final table per suite.

Usage::

    python -m benchmarks                 # every suite
    python -m benchmarks --quick         # shorter runs
    python -m benchmarks --only policies # one suite (repeatable)
    python -m benchmarks --list          # suite names
    python -m benchmarks --trace FILE    # replay another Mooncake-format trace

Suites are discovered from the modules of the ``benchmarks`` package (see its docstring): a
new module with a ``run(quick)`` function or a ``BENCHMARKS`` list is picked up without
editing this file. A suite that fails to import or raises prints ``bench <name> error=...``;
the others still run and the exit status is 1.

Functions:
    discover: find the suites.
    format_tables: render result lines as one aligned table per suite.
    main: command-line entry point.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path

import benchmarks
from benchmarks import Benchmark, bench_line, parse_line
from experiments.traces import TRACE_ENV

__all__ = ["discover", "format_tables", "main"]


def discover() -> tuple[list[Benchmark], list[str]]:
    """Import every module of the package and collect its benchmarks.

    Returns:
        ``(benchmarks, errors)``: the suites sorted by name, and one error line per module
        that could not be imported.
    """
    found: list[Benchmark] = []
    errors: list[str] = []
    for info in sorted(pkgutil.iter_modules(benchmarks.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        try:
            module = importlib.import_module(f"benchmarks.{info.name}")
        except Exception as exc:  # noqa: BLE001 - report any import failure and go on
            errors.append(bench_line(info.name, error=type(exc).__name__))
            print(f"# {info.name}: import failed: {exc}", file=sys.stderr)
            continue
        listed = getattr(module, "BENCHMARKS", None)
        if listed is not None:
            found.extend(b for b in listed if isinstance(b, Benchmark))
        elif callable(getattr(module, "run", None)):
            doc = (module.__doc__ or "").strip().splitlines()
            found.append(Benchmark(info.name, module.run, doc[0] if doc else ""))
    return sorted(found, key=lambda b: b.name), errors


def format_tables(lines: Sequence[str]) -> str:
    """Render result lines as one aligned table per suite.

    Args:
        lines: printed lines; non-``bench`` lines are ignored.

    Returns:
        The tables, suites in first-seen order, columns in first-seen order.
    """
    suites: dict[str, list[dict[str, str]]] = {}
    for line in lines:
        parsed = parse_line(line)
        if parsed is not None:
            suites.setdefault(parsed[0], []).append(parsed[1])
    out: list[str] = []
    for suite, rows in suites.items():
        columns: list[str] = []
        for row in rows:
            columns.extend(k for k in row if k not in columns)
        widths = {c: max(len(c), *(len(r.get(c, "")) for r in rows)) for c in columns}
        out.append(f"== {suite} ({len(rows)} rows)")
        out.append("  ".join(c.ljust(widths[c]) for c in columns).rstrip())
        for row in rows:
            out.append("  ".join(row.get(c, "-").ljust(widths[c]) for c in columns).rstrip())
        out.append("")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the selected suites.

    Args:
        argv: command-line arguments (default ``sys.argv[1:]``).

    Returns:
        0 when every selected suite ran, 1 when one failed, 2 for an unknown ``--only`` name.
    """
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument(
        "--only", action="append", metavar="NAME", help="run only this suite (repeatable)"
    )
    parser.add_argument("--quick", action="store_true", help="shorter runs")
    parser.add_argument("--list", action="store_true", help="list the suites and exit")
    parser.add_argument(
        "--trace",
        type=Path,
        help="a Mooncake-format trace for the suites that replay one (default: data/traces/)",
    )
    args = parser.parse_args(argv)
    if args.trace is not None:
        if not args.trace.is_file():
            parser.error(f"--trace {args.trace}: no such file")
        # Every suite asks experiments.traces.default_trace_path, which reads this.
        os.environ[TRACE_ENV] = str(args.trace.resolve())

    suites, errors = discover()
    if args.list:
        for b in suites:
            print(f"{b.name}\t{b.description}")
        return 0
    if args.only:
        unknown = set(args.only) - {b.name for b in suites}
        if unknown:
            names = ", ".join(b.name for b in suites)
            print(f"unknown suite(s) {', '.join(sorted(unknown))}; known: {names}")
            return 2
        suites = [b for b in suites if b.name in args.only]
        errors = []

    results: list[str] = list(errors)
    for line in errors:
        print(line, flush=True)
    failed = bool(errors)
    for b in suites:
        print(f"# suite {b.name}{' (quick)' if args.quick else ''}: {b.description}", flush=True)
        start = time.perf_counter()
        try:
            results.extend(b.run(args.quick))
        except Exception as exc:  # noqa: BLE001 - one failing suite must not stop the others
            traceback.print_exc()
            line = bench_line(b.name, error=type(exc).__name__)
            print(line, flush=True)
            results.append(line)
            failed = True
        print(f"# suite {b.name} took {time.perf_counter() - start:.1f} s", flush=True)

    print()
    print(format_tables(results))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
