"""What an incast point is, and what the experiment makes of its results.

The modes (``a``..``d``, ``r2``, ``r4``: see :mod:`experiments.incast`), one point's result, and
everything made from results alone, without a cluster: the CSVs, the plot, the flow model fitted
to the measurements and the final relief table.

Classes:
    Mode: one way of fetching.
    PointResult: the outcome of one (mode, N, prefix size) point.

Functions:
    parse_modes: ``--modes`` as mode names.
    replica_key: the key a replica holds the prefix under.
    write_outputs: hosts.csv, summary.csv, table.csv and the plot.
    relief_table: the final table's rows.
    fit_sim: the flow model calibrated to the measured points.
    format_table: the final table as text.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from experiments.output import pyplot, text_table, write_csv
from experiments.sim.incast import MODES as SIM_MODES
from experiments.sim.incast import IncastParams, predict
from experiments.sim.validate import Measured, calibrate_replica_cost, calibrate_switch_pps
from kvcast import p4constants as c
from kvcast.replicas import replica_key as _bucket_replica_key


@dataclass(frozen=True)
class Mode:
    """One way of fetching the prefix.

    Attributes:
        name: ``a``..``d``.
        label: what it is.
        sram: the prefix is loaded into switch SRAM first.
        group: one leader fetches for a multicast group; the others follow.
        via: where GETs are answered: ``pool`` (NOCACHE, the pool owner) or ``switch`` (SRAM).
        replicas: pool nodes holding the prefix, host i reading replica ``i mod replicas``.
    """

    name: str
    label: str
    sram: bool
    group: bool
    via: str
    replicas: int = 1


MODES = {
    "a": Mode("a", SIM_MODES["a"], sram=False, group=False, via="pool"),
    "b": Mode("b", SIM_MODES["b"], sram=False, group=True, via="pool"),
    "c": Mode("c", SIM_MODES["c"], sram=True, group=True, via="switch"),
    "d": Mode("d", SIM_MODES["d"], sram=True, group=False, via="switch"),
    "r2": Mode("r2", SIM_MODES["r2"], sram=False, group=False, via="pool", replicas=2),
    "r4": Mode("r4", SIM_MODES["r4"], sram=False, group=False, via="pool", replicas=4),
}
DEFAULT_MODES = "a,b,c,d,r2,r4"


def parse_modes(text: str) -> list[str]:
    """``--modes``: comma-separated names (``a,b,r2``), or letters run together (``abcd``).

    Raises:
        ValueError: an unknown mode.
    """
    names = text.split(",") if "," in text or text in MODES else list(text)
    names = [n.strip() for n in names if n.strip()]
    unknown = [n for n in names if n not in MODES]
    if unknown or not names:
        raise ValueError(f"unknown mode(s) {unknown or text!r}; known: {', '.join(MODES)}")
    return names


def replica_key(key: int, replica: int) -> int:
    """The key replica ``replica`` holds the prefix under: one in a bucket that node owns.

    The switch's pool-owner table gives bucket b to pool node ``b mod n_pools``
    (:class:`emulation.network.Cluster`); ``key`` sits in bucket 0, so its replica j's key
    (``kvcast.replicas.replica_key``, the serving sweep's too) is ``key + j``, in bucket j,
    owned by pool node j.
    """
    if key & (c.POOL_BUCKETS - 1):
        raise ValueError(f"key {key:#x} is not in bucket 0")
    return _bucket_replica_key(key, replica, c.POOL_BUCKETS)


@dataclass
class PointResult:
    """One (mode, N, prefix size) point."""

    mode: str
    n: int
    nbytes: int
    hosts: list[dict[str, Any]] = field(default_factory=list)
    pool_tx_bytes: int = 0
    counters: dict[str, int] = field(default_factory=dict)
    repeat: int = 0
    error: str = ""
    link_bytes: dict[str, int] = field(default_factory=dict)
    """On a fabric: bytes each leaf-spine link carried in the point, per direction."""

    @property
    def times(self) -> list[float]:
        """Completion times of hosts that ended verified."""
        return sorted(h["completion_s"] for h in self.hosts if h.get("ok") and h.get("verified"))

    @property
    def all_ok(self) -> bool:
        """Every host ended with a verified prefix."""
        return len(self.times) == self.n

    def total(self, field_name: str) -> int:
        """A per-host counter (``retries``, ``timeouts``, ``repairs``, ...) summed over hosts."""
        return sum(int(h.get(field_name) or 0) for h in self.hosts)

    def summary(self) -> dict[str, Any]:
        """The point's summary row."""
        t = self.times
        p99 = t[min(len(t) - 1, int(round(0.99 * (len(t) - 1))))] if t else float("nan")
        return {
            "mode": self.mode,
            "label": MODES[self.mode].label,
            "n": self.n,
            "prefix_bytes": self.nbytes,
            "repeat": self.repeat,
            "ok_hosts": len(t),
            "retries": self.total("retries"),
            "timeouts": self.total("timeouts"),
            "repairs": self.total("repairs"),
            "stalled_hosts": sum(1 for h in self.hosts if h.get("stalled")),
            "error": self.error,
            "p50_s": statistics.median(t) if t else float("nan"),
            "p99_s": p99,
            "max_s": t[-1] if t else float("nan"),
            "pool_tx_bytes": self.pool_tx_bytes,
            "pool_tx_over_prefix": round(self.pool_tx_bytes / self.nbytes, 3),
            **{f"sw_{k}": v for k, v in self.counters.items()},
            **(
                {"uplink_max_over_prefix": round(max(self.link_bytes.values()) / self.nbytes, 3)}
                if self.link_bytes
                else {}
            ),
        }


def write_outputs(
    results: list[PointResult], out: Path, setup: str = "", rows: list[dict[str, Any]] | None = None
) -> dict[str, Path]:
    """Writes hosts.csv, summary.csv, table.csv and incast.png into ``out``.

    Args:
        results: every point.
        out: the directory.
        setup: one line saying what was run (the plot's title).
        rows: the table's rows (default: :func:`relief_table` without predictions).
    """
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "hosts": out / "hosts.csv",
        "summary": out / "summary.csv",
        "table": out / "table.csv",
        "plot": out / "incast.png",
    }
    host_rows = [
        {"mode": r.mode, "label": MODES[r.mode].label, "n": r.n, "prefix_bytes": r.nbytes,
         "repeat": r.repeat, **h}
        for r in results
        for h in r.hosts
    ]  # fmt: skip
    write_csv(paths["hosts"], host_rows)
    write_csv(paths["summary"], [r.summary() for r in results])
    rows = relief_table(results) if rows is None else rows
    write_csv(paths["table"], rows)
    _plot(rows, paths["plot"], setup)
    return paths


_STYLE = {  # mode -> (colour, marker, line style): distinct even where two series overlap
    "a": ("#444444", "o", "-"),
    "b": ("#1f77b4", "s", "-"),
    "c": ("#d62728", "^", "-"),
    "d": ("#ff7f0e", "v", "--"),
    "r2": ("#2ca02c", "D", ":"),
    "r4": ("#9467bd", "P", ":"),
}


def _plot(rows: list[dict[str, Any]], path: Path, setup: str) -> None:
    """Three panels per prefix size: completion time, relief against the ideal, pool egress."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    plt = pyplot()
    sizes = sorted({r["prefix_kib"] for r in rows})
    fig, axes = plt.subplots(len(sizes), 3, figsize=(16, 4.8 * len(sizes)), squeeze=False)
    for row_i, size in enumerate(sizes):
        ax_t, ax_r, ax_p = axes[row_i]
        mine = [r for r in rows if r["prefix_kib"] == size]
        ns = sorted({r["n"] for r in mine})
        modes = [m for m in MODES if any(r["mode"] == m for r in mine)]
        for k, m in enumerate(modes):
            # Points where no repeat ended with every host served have no time to draw.
            pts = sorted(
                (r for r in mine if r["mode"] == m and r["t_s"] is not None), key=lambda r: r["n"]
            )
            if not pts:
                continue
            colour, marker, style = _STYLE.get(m, ("k", "o", "-"))
            label = f"({m}) {MODES[m].label}"
            # A small horizontal offset per mode keeps overlapping series apart.
            x = [r["n"] * (1 + 0.035 * (k - (len(modes) - 1) / 2)) for r in pts]
            t = [r["t_s"] for r in pts]
            ax_t.errorbar(
                x, t, yerr=[[v - r["t_min_s"] for v, r in zip(t, pts, strict=True)],
                            [r["t_max_s"] - v for v, r in zip(t, pts, strict=True)]],
                color=colour, marker=marker, linestyle=style, capsize=3, label=label,
            )  # fmt: skip
            rel_pts = [(xi, r) for xi, r in zip(x, pts, strict=True) if r["relief"] is not None]
            if m != "a" and rel_pts:
                rel = [r["relief"] for _, r in rel_pts]
                ax_r.errorbar(
                    [xi for xi, _ in rel_pts], rel,
                    yerr=[[v - r["relief_min"] for v, (_, r) in zip(rel, rel_pts, strict=True)],
                          [r["relief_max"] - v for v, (_, r) in zip(rel, rel_pts, strict=True)]],
                    color=colour, marker=marker, linestyle=style, capsize=3, label=label,
                )  # fmt: skip
            ax_p.plot(
                x, [r["pool_egress"] for r in pts], color=colour, marker=marker, linestyle=style,
                label=label,
            )  # fmt: skip
        ax_r.plot(ns, ns, color="k", linewidth=1, alpha=0.5, linestyle="-.", label="ideal: N")
        ax_p.plot(ns, ns, color="k", linewidth=1, alpha=0.5, linestyle="-.", label="N x prefix")
        ax_t.set_yscale("log")
        ticks = [t for t in (0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200)]
        ax_t.yaxis.set_major_locator(FixedLocator(ticks))
        ax_t.yaxis.set_minor_locator(NullLocator())
        ax_t.yaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{v:g}"))
        ax_t.set(
            xlabel="N hosts fetching",
            ylabel="time until all N hold the prefix (s)",
            title=f"completion, median and min-max of repeats (prefix {size} KiB)",
        )
        ax_r.set(
            xlabel="N hosts fetching",
            ylabel="relief T_a / T_mode",
            title="relief over pool-unicast (higher is better)",
        )
        ax_p.set(
            xlabel="N hosts fetching",
            ylabel="pool egress / prefix bytes",
            title="what the pool nodes sent",
        )
        for ax in (ax_t, ax_r, ax_p):
            ax.set_xticks(ns)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
        ax_r.set_ylim(bottom=0)
        ax_p.set_ylim(bottom=0)
    fig.suptitle(setup, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def relief_table(
    results: list[PointResult], sim: IncastParams | None = None
) -> list[dict[str, Any]]:
    """The final table: one row per (prefix size, N, mode).

    Times are makespans (the time until all N hosts hold the verified prefix): ``t_s`` their
    median over the repeats where every host ended, ``t_min_s``/``t_max_s`` the range. The
    relief is T_a / T_mode: the median over repeats of the ratio within each repeat, with its
    range (a repeat of mode a is paired with the same repeat of the mode). ``sim_relief`` is
    the flow model's prediction at ``sim``'s parameters. Retries, timeouts and repairs are summed
    over hosts and repeats; ``ok`` counts the hosts that ended verified over all repeats.
    """
    rows = []
    by_key: dict[tuple[int, int, str], list[PointResult]] = {}
    for r in results:
        by_key.setdefault((r.nbytes, r.n, r.mode), []).append(r)
    for size, n, m in sorted(by_key, key=lambda k: (k[0], k[1], list(MODES).index(k[2]))):
        pts = by_key[(size, n, m)]
        good = [r for r in pts if r.all_ok]
        times = [r.summary()["max_s"] for r in good]
        row: dict[str, Any] = {
            "prefix_kib": size // 1024,
            "n": n,
            "mode": m,
            "label": MODES[m].label,
            "repeats": len(pts),
            "t_s": round(statistics.median(times), 4) if times else None,
            "t_min_s": round(min(times), 4) if times else None,
            "t_max_s": round(max(times), 4) if times else None,
        }
        base = {r.repeat: r for r in by_key.get((size, n, "a"), []) if r.all_ok}
        ratios = [
            base[r.repeat].summary()["max_s"] / r.summary()["max_s"]
            for r in good
            if r.repeat in base and r.summary()["max_s"] > 0
        ]
        row["relief"] = round(statistics.median(ratios), 2) if ratios else None
        row["relief_min"] = round(min(ratios), 2) if ratios else None
        row["relief_max"] = round(max(ratios), 2) if ratios else None
        if sim is not None:
            t_a = predict("a", n, size, sim).max_s
            row["sim_relief"] = round(t_a / predict(m, n, size, sim).max_s, 2)
        egress = [r.pool_tx_bytes / r.nbytes for r in pts]
        row["pool_egress"] = round(statistics.median(egress), 2)
        row["retries"] = sum(r.total("retries") for r in pts)
        row["timeouts"] = sum(r.total("timeouts") for r in pts)
        row["repairs"] = sum(r.total("repairs") for r in pts)
        row["ok"] = f"{sum(len(r.times) for r in pts)}/{n * len(pts)}"
        rows.append(row)
    return rows


def fit_sim(results: list[PointResult], pool_mbit: float, host_mbit: float) -> IncastParams:
    """The flow model's parameters for this run.

    The link rates are the emulation's. The switch's packet rate and the cost of a multicast
    copy are properties of the switch process on this machine, so they are fitted to the run
    itself as ``experiments.sim.validate --calibrate`` does: the rate to mode d at the largest
    N (every host's GETs pass the switch), the copy cost to mode c there. Without those points
    the switch is taken as no limit.
    """
    params = IncastParams(pool_mbit=pool_mbit, host_mbit=host_mbit, frag_bytes=c.FRAG_BYTES)
    rows = relief_table(results)
    top = max((r["n"] for r in rows), default=0)

    def measured(mode: str) -> Measured | None:
        for r in rows:
            if r["mode"] == mode and r["n"] == top and r["t_s"] is not None:
                pts = [p for p in results if p.mode == mode and p.n == top]
                tx = statistics.median(p.pool_tx_bytes for p in pts)
                return Measured(mode, top, r["prefix_kib"] * 1024, r["t_s"], r["t_s"], tx, 1)
        return None

    d, cc = measured("d"), measured("c")
    if d is not None and top > 1:
        params = replace(params, switch_pps=calibrate_switch_pps(d, params))
        if cc is not None:
            params = replace(params, replica_cost=calibrate_replica_cost(cc, params))
    return params


def format_table(rows: list[dict[str, Any]], title: str, notes: Sequence[str] = ()) -> str:
    """The table as aligned text: a title, a header, a block of rows per N, notes."""
    cols: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
        ("N", lambda r: str(r["n"])),
        ("mode", lambda r: r["mode"]),
        ("", lambda r: r["label"]),
        ("T all N (s)", lambda r: _num(r["t_s"], 3)),
        ("min-max", lambda r: _range(r["t_min_s"], r["t_max_s"], 2)),
        ("relief a/x", lambda r: _num(r["relief"], 1)),
        ("min-max ", lambda r: _range(r["relief_min"], r["relief_max"], 1)),
        ("sim a/x", lambda r: _num(r.get("sim_relief"), 1)),
        ("pool egress", lambda r: f"{r['pool_egress']:.2f}x"),
        ("retries", lambda r: str(r["retries"])),
        ("timeouts", lambda r: str(r["timeouts"])),
        ("repairs", lambda r: str(r["repairs"])),
        ("ok", lambda r: r["ok"]),
    ]
    return text_table(
        title, cols, rows, left={1, 2}, block=lambda r: (r["prefix_kib"], r["n"]), notes=notes
    )


def _num(v: float | None, digits: int) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _range(lo: float | None, hi: float | None, digits: int) -> str:
    return "-" if lo is None or hi is None else f"{lo:.{digits}f}-{hi:.{digits}f}"
