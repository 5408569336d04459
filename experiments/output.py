"""What every experiment writes: CSV files and matplotlib figures (light: no numpy at import).

Functions:
    write_csv: rows of dicts to a CSV file.
    pyplot: matplotlib.pyplot on the Agg backend.
    text_table: rows as an aligned text table with a title, blocks of rows and notes.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["pyplot", "text_table", "write_csv"]


def write_csv(path: Path, rows: Iterable[Mapping[str, Any]]) -> Path:
    """Write rows to a CSV file, creating its directory.

    Args:
        path: the file.
        rows: dicts; the header is the union of keys in first-seen order.

    Returns:
        The path.
    """
    rows = list(rows)
    cols: list[str] = []
    for row in rows:
        cols += [k for k in row if k not in cols]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
    return path


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def text_table(
    title: str,
    cols: Sequence[tuple[str, Callable[[dict[str, Any]], str]]],
    rows: Sequence[dict[str, Any]],
    *,
    left: Collection[int],
    block: Callable[[dict[str, Any]], Hashable] | None = None,
    notes: Sequence[str] = (),
) -> str:
    """Rows as an aligned text table: the title underlined, a header, the rows, notes.

    Args:
        title: the table's title.
        cols: (header, cell of a row) per column.
        rows: the rows.
        left: indexes of the columns aligned left (the others align right).
        block: a blank line goes between rows where this value changes (None: no blocks).
        notes: lines after the table.

    Returns:
        The table, lines joined by newlines.
    """
    cells = [[f(r) for _, f in cols] for r in rows]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, (h, _) in enumerate(cols)]

    def line(values: Sequence[str]) -> str:
        return "  ".join(
            v.ljust(w) if i in left else v.rjust(w)
            for i, (v, w) in enumerate(zip(values, widths, strict=True))
        ).rstrip()

    header = line([h for h, _ in cols])
    out = [title, "=" * min(len(title), len(header)), header, "-" * len(header)]
    last: Hashable = None
    for r, cell in zip(rows, cells, strict=True):
        if block is not None:
            key = block(r)
            if last is not None and key != last:
                out.append("")
            last = key
        out.append(line(cell))
    out += ["-" * len(header), *notes]
    return "\n".join(out)
