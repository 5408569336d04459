"""Fault campaign: the incast experiment with loss, duplication, corruption and reordering.

``python -m experiments.faults [--out DIR] [--quick]`` (``make faults``) runs the incast modes a-d
on the emulated cluster (Mininet, the reference target, pool nodes on Mooncake Store where it is
installed, one agent per host) once without faults and once per fault, and writes one row per
(fault, mode): fetches attempted, completed, cleanly refused, **completed with a wrong byte**
(must be 0), the time until every host holds the prefix and its ratio to the fault-free run,
retries, timeouts, repairs and pool egress.

The faults are injected by the reference target's own impairment stage (refswitch.impair) on
every frame it sends to a data port, because this machine's kernel has no netem: each frame is
independently lost, corrupted (one payload bit), duplicated or sent after the next one. BMv2 has
no such stage, so the campaign always runs the reference target.

Functions:
    run_campaign: every fault x mode point; the rows.
    format_rows: the rows as an aligned table.
    main: command-line entry point.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from emulation.switches import RefSwitch
from emulation.topo import ClusterSpec, LinkSpec
from experiments.incast import TENANT, PointResult, run_sweep
from experiments.output import write_csv
from poolnode.mooncake import find_master_binary

FAULTS: list[tuple[str, str]] = [
    ("none", ""),
    ("loss 0.1%", "loss=0.001"),
    ("loss 1%", "loss=0.01"),
    ("loss 5%", "loss=0.05"),
    ("loss 20%", "loss=0.2"),
    ("duplicate 1%", "dup=0.01"),
    ("corrupt 1%", "corrupt=0.01"),
    ("reorder 5%", "reorder=0.05"),
]
QUICK_FAULTS = ["none", "loss 1%", "corrupt 1%"]
MODES = ["a", "b", "c", "d"]


def _switch_with(impair: str, seed: int) -> type[RefSwitch]:
    spec = f"{impair},seed={seed}" if impair else ""
    return type("ImpairedRefSwitch", (RefSwitch,), {"impair": spec})


def _row(fault: str, impair: str, point: PointResult, clean: dict[str, float]) -> dict[str, Any]:
    hosts = point.hosts
    completed = sum(1 for h in hosts if h.get("ok") and h.get("verified") is not False)
    wrong = sum(1 for h in hosts if h.get("ok") and h.get("verified") is False)
    t = max(point.times) if point.all_ok else None
    base = clean.get(point.mode)
    return {
        "fault": fault,
        "impairment": impair or "none",
        "mode": point.mode,
        "n": point.n,
        "prefix_kib": point.nbytes // 1024,
        "attempted": point.n,
        "completed": completed,
        "refused": point.n - completed - wrong,
        "wrong_bytes": wrong,
        "t_s": t,
        "vs_clean": (t / base) if t is not None and base else None,
        "retries": point.total("retries"),
        "timeouts": point.total("timeouts"),
        "repairs": point.total("repairs"),
        "pool_egress": point.pool_tx_bytes / point.nbytes if point.nbytes else 0.0,
        "error": point.error,
    }


def run_campaign(
    faults: Sequence[tuple[str, str]],
    n: int,
    nbytes: int,
    seed: int = 1,
    progress: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """Runs modes a-d at ``n`` hosts under each fault; the first fault must be ``none``.

    Returns:
        One row per (fault, mode), as described in the module docstring.
    """
    spec = ClusterSpec(
        n_hosts=n,
        n_pools=1,
        host_link=LinkSpec(bw_mbit=200),
        pool_link=LinkSpec(bw_mbit=20),
        tenants=(TENANT,),
    )
    backend = "mooncake" if find_master_binary() else "memory"
    rows: list[dict[str, Any]] = []
    clean: dict[str, float] = {}
    for fault, impair in faults:
        progress(f"faults: {fault} ({impair or 'no impairment'}), N={n}, {nbytes // 1024} KiB")
        points = run_sweep(
            spec,
            _switch_with(impair, seed),
            MODES,
            [n],
            [nbytes],
            repeats=1,
            progress=lambda s: progress(f"  {s}"),
            pool_backend=backend,
        )
        for point in points:
            if not impair and point.all_ok:
                clean[point.mode] = max(point.times)
            rows.append(_row(fault, impair, point, clean))
    return rows


def format_rows(rows: Sequence[dict[str, Any]], title: str) -> str:
    """The rows as an aligned text table."""
    cols: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
        ("fault", lambda r: r["fault"]),
        ("mode", lambda r: r["mode"]),
        ("attempted", lambda r: str(r["attempted"])),
        ("completed", lambda r: str(r["completed"])),
        ("refused", lambda r: str(r["refused"])),
        ("wrong bytes", lambda r: str(r["wrong_bytes"])),
        ("T all N (s)", lambda r: "-" if r["t_s"] is None else f"{r['t_s']:.2f}"),
        ("vs no fault", lambda r: "-" if r["vs_clean"] is None else f"{r['vs_clean']:.2f}x"),
        ("retries", lambda r: str(r["retries"])),
        ("timeouts", lambda r: str(r["timeouts"])),
        ("repairs", lambda r: str(r["repairs"])),
        ("pool egress", lambda r: f"{r['pool_egress']:.2f}x"),
    ]
    cells = [[f(r) for _, f in cols] for r in rows]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, (h, _) in enumerate(cols)]

    def line(values: Sequence[str]) -> str:
        return "  ".join(
            v.ljust(w) if i < 2 else v.rjust(w)
            for i, (v, w) in enumerate(zip(values, widths, strict=True))
        ).rstrip()

    header = line([h for h, _ in cols])
    out = [title, "=" * min(len(title), len(header)), header, "-" * len(header)]
    last = None
    for r, cell in zip(rows, cells, strict=True):
        if last is not None and r["fault"] != last:
            out.append("")
        last = r["fault"]
        out.append(line(cell))
    out.append("-" * len(header))
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the campaign and writes ``faults.csv`` and ``faults.txt`` under ``--out``."""
    ap = argparse.ArgumentParser(prog="python -m experiments.faults", description=__doc__)
    ap.add_argument("--out", type=Path, default=Path("results/faults"))
    ap.add_argument("--n", type=int, default=4, help="hosts")
    ap.add_argument("--prefix-kib", type=int, default=128)
    ap.add_argument("--seed", type=int, default=1, help="the impairment stage's seed")
    ap.add_argument("--quick", action="store_true", help=f"faults {QUICK_FAULTS}, N=2, 32 KiB")
    args = ap.parse_args(argv)
    faults = [f for f in FAULTS if not args.quick or f[0] in QUICK_FAULTS]
    n, kib = (2, 32) if args.quick else (args.n, args.prefix_kib)
    t0 = time.monotonic()
    rows = run_campaign(faults, n, kib * 1024, seed=args.seed)
    title = (
        f"Incast under faults: N={n}, {kib} KiB prefix, faults injected by the reference "
        f"target's impairment stage (seed {args.seed}; no netem on this kernel)"
    )
    table = format_rows(rows, title)
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(args.out / "faults.csv", rows)
    (args.out / "faults.txt").write_text(table + "\n")
    print(table)
    print(f"wrote {args.out}/faults.csv, {args.out}/faults.txt in {time.monotonic() - t0:.0f} s")
    wrong = sum(r["wrong_bytes"] for r in rows)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
