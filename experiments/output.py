"""What every experiment writes: CSV files and matplotlib figures (light: no numpy at import).

Functions:
    write_csv: rows of dicts to a CSV file.
    pyplot: matplotlib.pyplot on the Agg backend.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["pyplot", "write_csv"]


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
