"""Output helpers shared by the experiments: result lines, CSV files, plots, common options.

Result lines are parseable: ``result <experiment> key=value ...`` with values free of spaces
(floats to 4 significant digits), like the benchmark lines of :mod:`benchmarks`.

Classes:
    ExperimentMain: the type of an experiment's ``main``.

Types:
    Tables: an experiment's CSV tables by file name.

Functions:
    result_line: format (and print) one result line.
    parse_result: split a result line into its experiment and fields.
    write_csv, pyplot: re-exported from ``experiments.output``.
    add_common_args: ``--out``, ``--quick`` and ``--trace`` for every experiment's command line.
    main_for: the one ``main`` of the research questions and the replication
        experiment: their own options beside the common ones, then their ``run``.
    tables_main: the ``main`` of a research question: ``main_for`` over its one ``run``
        (simulate, write the tables as CSV files, draw the figures).
    save_figure: lay out, write and close a figure (every plot of the model's experiments).
    describe: a one-line summary of a configuration for the log.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from experiments.output import pyplot, write_csv
from experiments.sim.cluster_config import ClusterConfig

__all__ = [
    "ExperimentMain",
    "add_common_args",
    "describe",
    "parse_result",
    "pyplot",
    "result_line",
    "main_for",
    "save_figure",
    "tables_main",
    "write_csv",
]

Tables = dict[str, list[dict[str, Any]]]
"""An experiment's CSV tables by file name (``q3_sram.csv``), each a list of rows."""


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def result_line(experiment: str, *, echo: bool = True, **fields: object) -> str:
    """Format one result line and print it.

    Args:
        experiment: experiment name (second word).
        echo: print the line (flushed).
        **fields: key=value pairs in order.

    Returns:
        ``"result <experiment> k=v ..."``.

    Raises:
        ValueError: if a value is empty or contains whitespace.
    """
    parts = ["result", experiment]
    for key, value in fields.items():
        text = _fmt(value)
        if not text or any(ch.isspace() for ch in text):
            raise ValueError(f"result field {key}={text!r} must be non-empty without spaces")
        parts.append(f"{key}={text}")
    line = " ".join(parts)
    if echo:
        print(line, flush=True)
    return line


def parse_result(line: str) -> tuple[str, dict[str, str]] | None:
    """Parse a result line.

    Args:
        line: one printed line.

    Returns:
        ``(experiment, fields)``, or None when the line is not a result line.
    """
    words = line.split()
    if len(words) < 2 or words[0] != "result":
        return None
    fields = dict(w.split("=", 1) for w in words[2:] if "=" in w)
    return words[1], fields


def add_common_args(ap: argparse.ArgumentParser, default_out: Path) -> None:
    """Add ``--out``, ``--quick`` and ``--trace``.

    Args:
        ap: the parser.
        default_out: default output directory.
    """
    ap.add_argument("--out", type=Path, default=default_out, help=f"default {default_out}")
    ap.add_argument("--quick", action="store_true", help="a small slice, for smoke runs")
    ap.add_argument(
        "--trace",
        type=Path,
        default=None,
        help="a Mooncake-format JSONL trace for the conversation workload "
        "(default: the one shipped in data/traces/, or $KVCAST_TRACE)",
    )


class ExperimentMain(Protocol):
    """An experiment's command line: parse ``argv`` (None: ``sys.argv[1:]``), run, return 0."""

    def __call__(self, argv: Sequence[str] | None = None) -> int:
        """Run the experiment on ``argv``; return its exit status."""
        ...


def main_for(
    prog: str,
    doc: str | None,
    default_out: Path,
    add_args: Callable[[argparse.ArgumentParser], None],
    run: Callable[[argparse.Namespace], object],
) -> ExperimentMain:
    """The ``main`` of an experiment on the model: its own options beside the common ones.

    Args:
        prog: the program name in the usage line (``python -m experiments.<name>``).
        doc: the description (the experiment module's docstring, shown as written).
        default_out: default output directory (``--out``).
        add_args: adds the experiment's own options to the parser.
        run: runs the experiment on the parsed arguments (its return value is not used).

    Returns:
        ``main(argv=None) -> 0``: parses ``argv`` (None: ``sys.argv[1:]``) and runs.
    """

    def main(argv: Sequence[str] | None = None) -> int:
        ap = argparse.ArgumentParser(prog=prog, description=doc)
        ap.formatter_class = argparse.RawDescriptionHelpFormatter
        add_common_args(ap, default_out)
        add_args(ap)
        run(ap.parse_args(argv))
        return 0

    main.__doc__ = f"Command line of ``{prog}``; returns 0."
    return main


def tables_main(
    entry: str,
    doc: str | None,
    default_out: Path,
    add_args: Callable[[argparse.ArgumentParser], None],
    simulate: Callable[[argparse.Namespace, list[str]], Tables],
    figures: Callable[[Tables, Path], list[Path]],
) -> ExperimentMain:
    """The ``main`` of a research question: simulate, write its tables, draw its figures.

    Args:
        entry: the question's entry module under :mod:`experiments` (``q1_selection``): the
            program is ``python -m experiments.<entry>``.
        doc: as for :func:`main_for`.
        default_out: as for :func:`main_for`.
        add_args: as for :func:`main_for`.
        simulate: runs the simulations the parsed command line asks for, appends one result
            line per run to the list it is given, and returns the tables.
        figures: draws the figures from the tables into the output directory (``--out``);
            returns their files.

    Returns:
        :func:`main_for`'s ``main`` around a ``run`` that writes each non-empty table as a
        CSV file under ``--out``, then the figures, and prints the files it wrote.
    """

    def run(args: argparse.Namespace) -> list[str]:
        lines: list[str] = []
        tables = simulate(args, lines)
        out: Path = args.out
        written = [write_csv(out / name, rows) for name, rows in tables.items() if rows]
        written += figures(tables, out)
        print(f"wrote {', '.join(map(str, written))}", flush=True)
        return lines

    return main_for(f"python -m experiments.{entry}", doc, default_out, add_args, run)


def save_figure(fig: Any, path: Path) -> None:
    """Lay a matplotlib figure out, write it at 110 dpi and close it.

    Args:
        fig: the figure (from :func:`pyplot`).
        path: the image file.
    """
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)


def describe(cfg: ClusterConfig) -> str:
    """One line naming the cluster a run used."""
    return (
        f"{cfg.hosts} hosts ({cfg.host_gbps:g} Gb/s), {cfg.pools} pool nodes "
        f"({cfg.pool_gbps:g} Gb/s), model {cfg.model.name} ({cfg.chunk_bytes} B per "
        f"{cfg.block_tokens}-token block), switch {cfg.switch.name} (FRAG_BYTES "
        f"{cfg.switch.frag_bytes}, SRAM {cfg.switch.sram_bytes} B per pipe x {cfg.switch.pipes} "
        f"pipes), GPU {cfg.gpu.name} at MFU {cfg.gpu.mfu:g}, HBM cache {cfg.hbm_cache_gib:g} "
        f"GiB, DRAM cache {cfg.dram_cache_gib:g} GiB per host"
    )
