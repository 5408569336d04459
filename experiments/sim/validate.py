"""Validate the flow model against the emulation's measured N-to-1 incast.

Reads the summary CSV written by ``python -m experiments.incast`` (columns ``mode, n,
prefix_bytes, max_s, p50_s, pool_tx_bytes``; modes ``a``-``d``; repeated points are reduced to
their median; a row whose ``ok_hosts`` is below ``n`` is skipped), runs
:mod:`experiments.sim.incast` at the emulation's link parameters and compares, per prefix size
and N:

* the relief ratios T_a(N) / T_b(N) and T_a(N) / T_c(N) (and T_a / T_d when measured), where T
  is ``max_s``, the time until all N hosts hold the prefix: measured vs predicted and the
  relative error against a tolerance (default 15 %);
* the pool node's transmitted bytes per mode (the model counts DATA frames with their headers).

The switch's packet rate matters for the SRAM modes (c, d) and for replication (b): give it
(``--switch-pps``, forwards per second), or ``--calibrate-pps`` to fit it to the measured
mode-d point with the smallest N (that point is then reported but not counted).

Run: ``python -m experiments.sim.validate --emulation results/incast/summary.csv
--pool-mbit 20 --host-mbit 200 --switch-pps 20000``. Writes ``validation.csv`` and
``validation.png`` under ``--out`` and prints ``result validate ...`` lines; exits 1 when a
compared ratio is outside the tolerance.

Classes:
    Measured: the measured medians of one (mode, N, prefix size) point.
    Comparison: one measured-vs-predicted quantity.

Functions:
    read_summary: parse and reduce the emulation's summary CSV.
    calibrate_switch_pps: fit the switch's packet rate to one measured mode-d point.
    compare: every comparison for a set of measured points.
    main: command line.
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from experiments.sim.incast import MODES, IncastParams, predict
from experiments.sim.report import pyplot, result_line, write_csv

__all__ = ["Comparison", "Measured", "calibrate_switch_pps", "compare", "main", "read_summary"]

REQUIRED = ("mode", "n", "prefix_bytes", "max_s", "p50_s", "pool_tx_bytes")


class SummaryFormatError(ValueError):
    """The summary CSV lacks a required column or has an unparseable value."""


@dataclass(frozen=True)
class Measured:
    """Measured medians of one point.

    Attributes:
        mode: ``a``..``d``.
        n: hosts.
        prefix_bytes: prefix size.
        max_s: median over repeats of the time until all hosts held the prefix.
        p50_s: median over repeats of the median host time.
        pool_tx_bytes: median pool transmitted bytes.
        repeats: rows reduced.
    """

    mode: str
    n: int
    prefix_bytes: int
    max_s: float
    p50_s: float
    pool_tx_bytes: float
    repeats: int


@dataclass(frozen=True)
class Comparison:
    """One measured-vs-predicted quantity.

    Attributes:
        prefix_bytes: prefix size.
        n: hosts.
        quantity: ``a/b``, ``a/c``, ``a/d`` (relief ratios), ``T_<mode>`` (seconds) or
            ``pool_tx_<mode>`` (bytes).
        measured: the emulation's value.
        predicted: the model's value.
        counted: whether it counts towards the verdict (relief ratios, not the calibration
            point).
    """

    prefix_bytes: int
    n: int
    quantity: str
    measured: float
    predicted: float
    counted: bool

    @property
    def rel_err(self) -> float:
        """|predicted - measured| / measured (inf when measured is 0 and predicted is not)."""
        if self.measured == 0:
            return 0.0 if self.predicted == 0 else math.inf
        return abs(self.predicted - self.measured) / abs(self.measured)


def read_summary(path: Path) -> list[Measured]:
    """Read and reduce the emulation's summary CSV.

    Args:
        path: ``summary.csv``.

    Returns:
        One :class:`Measured` per (mode, n, prefix size), sorted.

    Raises:
        SummaryFormatError: for a missing column or a bad value.
        OSError: if the file cannot be read.
    """
    groups: dict[tuple[str, int, int], list[tuple[float, float, float]]] = {}
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in REQUIRED if c not in (reader.fieldnames or [])]
        if missing:
            raise SummaryFormatError(f"{path}: missing column(s) {', '.join(missing)}")
        for lineno, row in enumerate(reader, 2):
            try:
                mode = row["mode"].strip()
                n = int(row["n"])
                size = int(float(row["prefix_bytes"]))
                vals = (float(row["max_s"]), float(row["p50_s"]), float(row["pool_tx_bytes"]))
                ok = int(row["ok_hosts"]) if row.get("ok_hosts") not in (None, "") else n
            except (TypeError, ValueError) as exc:
                raise SummaryFormatError(f"{path}:{lineno}: {exc}") from None
            if mode not in MODES:
                raise SummaryFormatError(f"{path}:{lineno}: unknown mode {mode!r}")
            if ok < n or any(math.isnan(v) for v in vals):
                print(f"# skipping {path}:{lineno} (mode {mode}, n {n}): not every host ended")
                continue
            groups.setdefault((mode, n, size), []).append(vals)
    return [
        Measured(
            mode,
            n,
            size,
            statistics.median(v[0] for v in vals),
            statistics.median(v[1] for v in vals),
            statistics.median(v[2] for v in vals),
            len(vals),
        )
        for (mode, n, size), vals in sorted(
            groups.items(), key=lambda kv: (kv[0][2], kv[0][1], kv[0][0])
        )
    ]


def calibrate_switch_pps(point: Measured, params: IncastParams) -> float:
    """Fit the switch's forwards per second so the model's T_d matches one measured point.

    Bisection in log space over 1e2..1e10 (the model's T_d falls as the rate rises).

    Args:
        point: a measured mode-``d`` point.
        params: the other parameters (fixed_s included).

    Returns:
        The fitted rate (the upper end when the host links alone are already slower).
    """
    lo, hi = 2.0, 10.0  # log10
    for _ in range(60):
        mid = (lo + hi) / 2
        p = replace(params, switch_pps=10**mid)
        if predict("d", point.n, point.prefix_bytes, p).max_s > point.max_s:
            lo = mid
        else:
            hi = mid
    return float(10 ** ((lo + hi) / 2))


def compare(
    points: Sequence[Measured], params: IncastParams, calibrated: Measured | None = None
) -> list[Comparison]:
    """Compare measured points with the model.

    Args:
        points: measured medians.
        params: the emulation's parameters.
        calibrated: the point used for calibration (not counted), if any.

    Returns:
        Relief ratios (counted), absolute times and pool bytes (informative), per (size, N).
    """
    by_key = {(p.prefix_bytes, p.n, p.mode): p for p in points}
    out: list[Comparison] = []
    for size, n in sorted({(p.prefix_bytes, p.n) for p in points}):
        pred = {m: predict(m, n, size, params) for m in MODES}
        meas = {m: by_key[(size, n, m)] for m in MODES if (size, n, m) in by_key}
        for m, pt in meas.items():
            out.append(Comparison(size, n, f"T_{m}", pt.max_s, pred[m].max_s, False))
        if "a" in meas:
            for m in "bcd":
                if m in meas and meas[m].max_s > 0:
                    counted = calibrated is None or not (
                        m == "d" and (size, n) == (calibrated.prefix_bytes, calibrated.n)
                    )
                    out.append(
                        Comparison(
                            size,
                            n,
                            f"a/{m}",
                            meas["a"].max_s / meas[m].max_s,
                            pred["a"].max_s / pred[m].max_s,
                            counted,
                        )
                    )
        for m, pt in meas.items():
            out.append(
                Comparison(size, n, f"pool_tx_{m}", pt.pool_tx_bytes, pred[m].pool_tx_bytes, False)
            )
    return out


def _plot(comps: Sequence[Comparison], path: Path) -> None:
    plt = pyplot()
    sizes = sorted({c.prefix_bytes for c in comps})
    fig, axes = plt.subplots(1, len(sizes), figsize=(5.5 * len(sizes), 4), squeeze=False)
    for ax, size in zip(axes[0], sizes, strict=True):
        for q, color in (("a/b", "C0"), ("a/c", "C1"), ("a/d", "C2")):
            pts = sorted(
                (c.n, c.measured, c.predicted)
                for c in comps
                if c.prefix_bytes == size and c.quantity == q
            )
            if not pts:
                continue
            ns = [p[0] for p in pts]
            ax.plot(ns, [p[1] for p in pts], "o-", color=color, label=f"{q} measured")
            ax.plot(ns, [p[2] for p in pts], "x--", color=color, label=f"{q} model")
        ax.set(
            xscale="log",
            yscale="log",
            xlabel="N hosts",
            ylabel="relief T_a / T_x",
            title=f"prefix {size // 1024} KiB",
        )
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line.

    Returns:
        0 when every counted relief ratio is within the tolerance, 1 when one is not, 2 for
        unusable input.
    """
    ap = argparse.ArgumentParser(
        prog="python -m experiments.sim.validate", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--emulation", type=Path, required=True, help="the incast summary.csv")
    ap.add_argument("--pool-mbit", type=float, required=True, help="emulated pool link rate")
    ap.add_argument("--host-mbit", type=float, required=True, help="emulated host link rate")
    ap.add_argument("--switch-pps", type=float, default=None, help="switch forwards per second")
    ap.add_argument(
        "--calibrate-pps", action="store_true", help="fit --switch-pps to mode d at the smallest N"
    )
    ap.add_argument(
        "--host-pps", type=float, default=None, help="DATA packets/s one host agent takes"
    )
    ap.add_argument("--frag-bytes", type=int, default=None, help="fragment size (default: BMv2's)")
    ap.add_argument("--mtu", type=int, default=1500)
    ap.add_argument("--fixed-s", type=float, default=0.0, help="seconds added to every prediction")
    ap.add_argument("--tolerance", type=float, default=0.15)
    ap.add_argument("--out", type=Path, default=Path("results/validate"))
    args = ap.parse_args(argv)
    try:
        points = read_summary(args.emulation)
    except (OSError, SummaryFormatError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not points:
        print(f"error: {args.emulation} has no usable rows", file=sys.stderr)
        return 2
    params = IncastParams(
        pool_mbit=args.pool_mbit,
        host_mbit=args.host_mbit,
        switch_pps=args.switch_pps,
        host_pps=args.host_pps,
        fixed_s=args.fixed_s,
    )
    params = replace(
        params,
        wire=replace(params.wire, mtu=args.mtu),
        frag_bytes=args.frag_bytes or params.frag_bytes,
    )
    calibrated: Measured | None = None
    if args.calibrate_pps:
        d_points = sorted((p for p in points if p.mode == "d"), key=lambda p: (p.n, p.prefix_bytes))
        if not d_points:
            print("error: --calibrate-pps needs a measured mode-d point", file=sys.stderr)
            return 2
        calibrated = d_points[0]
        params = replace(params, switch_pps=calibrate_switch_pps(calibrated, params))
        print(
            f"# switch_pps calibrated to {params.switch_pps:.0f} forwards/s on mode d, "
            f"N={calibrated.n}, prefix {calibrated.prefix_bytes} B (that point is not counted)"
        )
    print(
        f"# compared: relief T_a/T_x of the time until all N hosts hold the prefix (max_s), "
        f"measured vs the flow model at pool {params.pool_mbit:g} Mbit/s, hosts "
        f"{params.host_mbit:g} Mbit/s, switch {params.switch_pps or 'unlimited'} forwards/s, "
        f"host agents {params.host_pps or 'unlimited'} packets/s, FRAG_BYTES {params.frag_bytes}, "
        f"MTU {params.wire.mtu}, fixed {params.fixed_s:g} s; pool bytes and absolute times "
        "are shown, not counted"
    )
    comps = compare(points, params, calibrated)
    for c in comps:
        result_line(
            "validate",
            prefix_bytes=c.prefix_bytes,
            n=c.n,
            quantity=c.quantity,
            measured=c.measured,
            predicted=c.predicted,
            rel_err=c.rel_err,
            counted="yes" if c.counted else "no",
            within="yes" if c.rel_err <= args.tolerance else "no",
        )
    counted = [c for c in comps if c.counted]
    within = [c for c in counted if c.rel_err <= args.tolerance]
    worst = max((c.rel_err for c in counted), default=0.0)
    result_line(
        "validate",
        summary="relief",
        compared=len(counted),
        within=len(within),
        tolerance=args.tolerance,
        max_rel_err=worst,
        switch_pps=params.switch_pps or 0.0,
    )
    args.out.mkdir(parents=True, exist_ok=True)
    rows = [
        {
            "prefix_bytes": c.prefix_bytes,
            "n": c.n,
            "quantity": c.quantity,
            "measured": c.measured,
            "predicted": c.predicted,
            "rel_err": c.rel_err,
            "counted": c.counted,
        }
        for c in comps
    ]
    csv_path = write_csv(args.out / "validation.csv", rows)
    _plot([c for c in comps if c.quantity.startswith("a/")], args.out / "validation.png")
    print(f"wrote {csv_path}, {args.out / 'validation.png'}")
    return 0 if len(within) == len(counted) else 1


if __name__ == "__main__":
    sys.exit(main())
