"""Validate the flow model against the emulation's measured N-to-1 incast.

Reads the summary CSV written by ``python -m experiments.incast`` (columns ``mode, n,
prefix_bytes, max_s, p50_s, pool_tx_bytes``; modes ``a``-``d``, ``r2``, ``r4``; repeated points
are reduced to their median; a row whose ``ok_hosts`` is below ``n`` is skipped), runs
:mod:`experiments.sim.incast` at the emulation's link parameters and compares, per prefix size
and N:

* the relief ratios T_a(N) / T_b(N) and T_a(N) / T_c(N) (and T_a / T_d when measured), where T
  is ``max_s``, the time until all N hosts hold the prefix: measured vs predicted and the
  relative error against a tolerance (default 15 %);
* the pool node's transmitted bytes per mode (the model counts DATA frames with their headers).

The switch's packet rate matters for the SRAM modes (c, d) and for replication (b): give it
(``--switch-pps``, forwards per second, and ``--replica-cost``, the share of a forward that each
multicast copy costs), or ``--calibrate`` to fit both to the measured points where the switch
works hardest: the switch rate to mode d at the largest N (every host's GETs pass it), then the
replica cost to mode c at the largest N (one GET, N copies). Those two points are reported but
not counted.

Run: ``python -m experiments.sim.validate --emulation results/incast/summary.csv
--pool-mbit 2 --host-mbit 20 --calibrate`` (the emulation's default link rates). Writes
``validation.csv`` and ``validation.png`` under ``--out`` and prints ``result validate ...``
lines; exits 1 when a compared ratio is outside the tolerance.

Classes:
    Measured: the measured medians of one (mode, N, prefix size) point.
    Comparison: one measured-vs-predicted quantity.

Functions:
    read_summary: parse and reduce the emulation's summary CSV.
    calibrate_switch_pps: fit the switch's packet rate to one measured mode-d point.
    calibrate_replica_cost: fit the cost of a multicast copy to one measured mode-c point.
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
from dataclasses import dataclass, fields, replace
from pathlib import Path

from experiments.sim.incast import MODES, IncastParams, IncastPoint, predict
from experiments.sim.report import pyplot, result_line, save_figure, write_csv

__all__ = [
    "Comparison",
    "Measured",
    "calibrate_replica_cost",
    "calibrate_switch_pps",
    "compare",
    "main",
    "read_summary",
]

REQUIRED = tuple(f.name for f in fields(IncastPoint))


class SummaryFormatError(ValueError):
    """The summary CSV lacks a required column or has an unparseable value."""


@dataclass(frozen=True)
class Measured(IncastPoint):
    """A point as the emulation measured it: each quantity the median over its repeats.

    Attributes:
        repeats: rows reduced.
    """

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


def calibrate_replica_cost(point: Measured, params: IncastParams) -> float:
    """Fit the share of a forward that one multicast copy costs to a measured mode-c point.

    Bisection over 0..1 (the model's T_c rises with it); needs ``params.switch_pps``.

    Args:
        point: a measured mode-``c`` point.
        params: the other parameters.

    Returns:
        The fitted share (an end of 0..1 when no value matches).
    """
    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        if (
            predict("c", point.n, point.prefix_bytes, replace(params, replica_cost=mid)).max_s
            > point.max_s
        ):
            hi = mid
        else:
            lo = mid
    return (lo + hi) / 2


def compare(
    points: Sequence[Measured], params: IncastParams, calibrated: Sequence[Measured] = ()
) -> list[Comparison]:
    """Compare measured points with the model.

    Args:
        points: measured medians.
        params: the emulation's parameters.
        calibrated: points used for calibration; ratios involving them are not counted.

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
            for m in MODES:
                if m != "a" and m in meas and meas[m].max_s > 0:
                    counted = not any(
                        c.mode == m and (c.prefix_bytes, c.n) == (size, n) for c in calibrated
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
    save_figure(fig, path)


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
    ap.add_argument("--replica-cost", type=float, default=0.5, help="share of a forward per copy")
    ap.add_argument(
        "--calibrate",
        action="store_true",
        help="fit --switch-pps to mode d and --replica-cost to mode c, both at the largest N",
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
        replica_cost=args.replica_cost,
        host_pps=args.host_pps,
        fixed_s=args.fixed_s,
    )
    params = replace(
        params,
        wire=replace(params.wire, mtu=args.mtu),
        frag_bytes=args.frag_bytes or params.frag_bytes,
    )
    calibrated: list[Measured] = []
    if args.calibrate:
        largest = {}
        for m in "dc":
            pts = sorted((p for p in points if p.mode == m), key=lambda p: (p.n, p.prefix_bytes))
            if not pts:
                print(f"error: --calibrate needs a measured mode-{m} point", file=sys.stderr)
                return 2
            largest[m] = pts[-1]
        params = replace(params, switch_pps=calibrate_switch_pps(largest["d"], params))
        params = replace(params, replica_cost=calibrate_replica_cost(largest["c"], params))
        calibrated = [largest["d"], largest["c"]]
        print(
            f"# calibrated: switch {params.switch_pps:.0f} forwards/s on mode d at "
            f"N={largest['d'].n}, replica cost {params.replica_cost:.3f} of a forward on mode c "
            f"at N={largest['c'].n} (ratios that use these two points are not counted)"
        )
    print(
        f"# compared: relief T_a/T_x of the time until all N hosts hold the prefix (max_s), "
        f"measured vs the flow model at pool {params.pool_mbit:g} Mbit/s, hosts "
        f"{params.host_mbit:g} Mbit/s, switch "
        f"{f'{params.switch_pps:.0f}' if params.switch_pps else 'unlimited'} forwards/s "
        f"(a copy costs {params.replica_cost:.3g} of a forward), host agents "
        f"{params.host_pps or 'unlimited'} packets/s, FRAG_BYTES {params.frag_bytes}, "
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
        replica_cost=params.replica_cost,
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
