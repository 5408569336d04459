"""The baseline a user would pick instead: the hot prefix replicated on k pool nodes.

Mooncake Store's own answer to a hot object is more copies of it (``replica_num`` at put time,
and hot-object replication): with k replicas, N consumers spread over k pool NICs instead of
one. This experiment puts that side by side with the switch's answer, one pool stream
replicated by the switch to all N consumers, on the same flow model as the cluster simulation
(:mod:`experiments.sim.flows`: max-min fair sharing of every NIC), at cluster scale:

- ``pool-unicast``: one pool node holds the prefix; each consumer pulls its own copy;
- ``replicas-k`` (k = 2, 4, 8 by default): k pool nodes hold a copy each; consumer i reads from
  replica i mod k (an even spread, the best case for replication; a client that picks a replica
  at random loads the busiest one more);
- ``switch-multicast``: one pool node sends the prefix once and the switch replicates every
  DATA frame to the N consumers (miss coalescing: the consumers ask at the same time).

The consumers ask for one prefix of ``blocks`` chunks of the model's
``block_tokens``-token KV (Llama-3-8B bf16 by default: 64 MiB per 512-token block), all at one
instant or spread evenly over ``spread_s`` (multicast helps only consumers whose requests
overlap a stream in flight; a late one joins for the rest and repairs what it missed). Per point:
the time until the last consumer holds the prefix, the relief T_pool-unicast / T_mode, the pool
NICs' wire bytes during the fetch, and the cost of the copies: DRAM held (k x prefix) and the
bytes that made the extra replicas (sent before the fetch, off its critical path; counted, not
timed). Replication's relief is bounded by k; multicast's by N and by the host NIC.

Run: ``python -m experiments.replication [--quick] [--out DIR]``; writes ``replication.csv``
and ``replication.png`` and prints ``result replication ...`` lines.

Classes:
    ReplicationPoint: one (mode, N, link speed) point.

Functions:
    fetch_point: run one point on the flow model.
    run: the sweep; returns the points.
    main: command line.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from experiments.output import pyplot, write_csv
from experiments.sim.flows import Flow, FlowNetwork
from experiments.sim.hardware import MODELS, WireFormat, tofino1
from experiments.sim.report import main_for, result_line, save_figure

__all__ = ["ReplicationPoint", "fetch_point", "main", "run"]

DEFAULT_OUT = Path("results/replication")
UNICAST = "pool-unicast"
MULTICAST = "switch-multicast"


def _mode_replicas(mode: str) -> int:
    if mode in (UNICAST, MULTICAST):
        return 1
    if mode.startswith("replicas-") and mode[9:].isdigit() and int(mode[9:]) >= 1:
        return int(mode[9:])
    raise ValueError(f"unknown mode {mode!r}: {UNICAST}, {MULTICAST} or replicas-K")


@dataclass(frozen=True)
class ReplicationPoint:
    """One point of the sweep.

    Attributes:
        mode: ``pool-unicast``, ``replicas-K`` or ``switch-multicast``.
        n: consumers.
        gbps: host and pool NIC rate (Gb/s).
        prefix_bytes: prefix payload bytes.
        replicas: pool nodes holding a copy.
        makespan_s: time until the last consumer holds the prefix.
        pool_wire_bytes: bytes the pool NICs sent during the fetch (framing included).
        dram_bytes: DRAM the copies occupy across the pool.
        replication_wire_bytes: bytes sent beforehand to make the extra copies.
    """

    mode: str
    n: int
    gbps: float
    prefix_bytes: int
    replicas: int
    makespan_s: float
    pool_wire_bytes: float
    dram_bytes: int
    replication_wire_bytes: float


def fetch_point(
    mode: str,
    n: int,
    prefix_bytes: int,
    gbps: float,
    spread_s: float = 0.0,
    wire: WireFormat | None = None,
) -> ReplicationPoint:
    """Runs one point on the flow model.

    Consumer i asks at ``spread_s * i / n`` (all at once when 0). With multicast, a consumer
    that asks while a stream of the prefix is on its way joins it for the bytes still to come
    and fetches the bytes it missed from the pool by unicast (a repair); one that asks after
    the stream ended starts a new stream.

    Args:
        mode: ``pool-unicast``, ``replicas-K`` or ``switch-multicast``.
        n: consumers (>= 1).
        prefix_bytes: prefix payload bytes (> 0).
        gbps: every NIC's rate, hosts and pool nodes alike.
        spread_s: the arrivals spread evenly over this many seconds.
        wire: framing (default: 9000-byte MTU Ethernet, Tofino-1 fragments).

    Returns:
        The point; ``makespan_s`` runs from the first arrival to the last completion.

    Raises:
        ValueError: an unknown mode, or a non-positive count, size or rate.
    """
    k = _mode_replicas(mode)
    if n < 1 or prefix_bytes <= 0 or gbps <= 0 or spread_s < 0:
        raise ValueError("need n >= 1, prefix_bytes > 0, gbps > 0 and spread_s >= 0")
    wire = wire or WireFormat()
    frag = tofino1().frag_bytes
    coef = wire.data_frames_bytes(prefix_bytes, frag) / prefix_bytes
    rate = gbps * 1e9 / 8
    net = FlowNetwork()
    pools = [net.link(f"pool{j}", rate) for j in range(k)]
    hosts = [net.link(f"host{i}", rate) for i in range(n)]
    done: list[list[Flow]] = [[] for _ in range(n)]
    pool_bytes = 0.0
    stream: Flow | None = None
    for i in range(n):
        net.advance(spread_s * i / n)
        if mode != MULTICAST:
            done[i].append(net.start(prefix_bytes, [(pools[i % k], coef), (hosts[i], coef)]))
            pool_bytes += prefix_bytes
            continue
        if stream is None or stream.done:
            stream = net.start(prefix_bytes, [(pools[0], coef), (hosts[i], coef)])
            pool_bytes += prefix_bytes
            done[i].append(stream)
            continue
        left = net.current_remaining(stream)
        if left > 0:
            net.extend(stream, [(hosts[i], coef)])
            done[i].append(stream)
        missed = prefix_bytes - left
        if missed > 0:
            done[i].append(net.start(missed, [(pools[0], coef), (hosts[i], coef)]))
            pool_bytes += missed
    net.advance(math.inf)
    return ReplicationPoint(
        mode=mode,
        n=n,
        gbps=gbps,
        prefix_bytes=prefix_bytes,
        replicas=k,
        makespan_s=max(f.finish for fs in done for f in fs),
        pool_wire_bytes=coef * pool_bytes,
        dram_bytes=k * prefix_bytes,
        replication_wire_bytes=(k - 1) * coef * prefix_bytes,
    )


def run(
    ns: Sequence[int],
    gbps: Sequence[float],
    replicas: Sequence[int],
    prefix_bytes: int,
    out: Path,
    spreads: Sequence[float] = (0.0,),
) -> list[ReplicationPoint]:
    """Runs the sweep, writes the CSV and the figure, prints one result line per point.

    Args:
        ns: consumer counts.
        gbps: NIC rates.
        replicas: replica counts k for the ``replicas-k`` modes.
        prefix_bytes: prefix payload bytes.
        out: output directory.
        spreads: arrival spreads (seconds) to run, each a separate panel of the figure.

    Returns:
        Every point.
    """
    modes = [UNICAST, *(f"replicas-{k}" for k in replicas), MULTICAST]
    points: list[ReplicationPoint] = []
    rows = []
    panels = [(g, sp) for g in gbps for sp in spreads]
    for g, spread in panels:
        for n in ns:
            base = None
            for mode in modes:
                p = fetch_point(mode, n, prefix_bytes, g, spread)
                base = p.makespan_s if mode == UNICAST else base
                assert base is not None
                points.append(p)
                row = {**asdict(p), "spread_s": spread, "relief": base / p.makespan_s}
                rows.append(row)
                result_line(
                    "replication",
                    mode=mode,
                    n=n,
                    gbps=g,
                    spread_s=spread,
                    makespan_s=p.makespan_s,
                    relief=row["relief"],
                    pool_wire_bytes=p.pool_wire_bytes,
                    dram_bytes=p.dram_bytes,
                    replication_wire_bytes=p.replication_wire_bytes,
                )
    write_csv(out / "replication.csv", rows)
    _plot(rows, modes, panels, prefix_bytes, out / "replication.png")
    return points


def _plot(
    rows: list[dict[str, object]],
    modes: Sequence[str],
    panels: Sequence[tuple[float, float]],
    prefix_bytes: int,
    path: Path,
) -> None:
    plt = pyplot()
    cols = min(len(panels), 2)
    nrows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5.6 * cols, 4.2 * nrows), squeeze=False)
    styles = {UNICAST: "k.-", MULTICAST: "o-"}
    for j, (g, spread) in enumerate(panels):
        ax = axes[j // cols][j % cols]
        for mode in modes:
            pts = [
                (r["n"], r["relief"])
                for r in rows
                if r["mode"] == mode and r["gbps"] == g and r["spread_s"] == spread
            ]
            xs = [int(str(x)) for x, _ in pts]
            ys = [float(str(y)) for _, y in pts]
            ax.plot(xs, ys, styles.get(mode, "s--"), label=mode, ms=4)
        ns = sorted({int(str(r["n"])) for r in rows})
        ax.plot(ns, ns, color="grey", lw=0.8, ls=":", label="relief = N")
        ax.set(
            xscale="log",
            yscale="log",
            xlabel="consumers N",
            ylabel="relief vs one pool node, unicast",
            title=f"{g:g} Gb/s NICs, arrivals "
            + (f"spread over {spread * 1e3:g} ms" if spread else "at one instant"),
        )
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    for j in range(len(panels), nrows * cols):
        axes[j // cols][j % cols].axis("off")
    fig.suptitle(
        f"Hot prefix ({prefix_bytes / 2**20:.0f} MiB) to N consumers: Mooncake-style "
        "replicas vs switch multicast (flow model)"
    )
    save_figure(fig, path)


def _add_args(ap: argparse.ArgumentParser) -> None:
    """The replication experiment's own options (beside ``--out``, ``--quick`` and ``--trace``)."""
    ap.add_argument("--ns", help="consumer counts (default 1,2,4,...,1024; quick: 1,4,16)")
    ap.add_argument("--gbps", default="100,400", help="NIC rates, hosts and pool nodes")
    ap.add_argument("--replicas", default="2,4,8", help="k of the replicas-k modes")
    ap.add_argument(
        "--spreads",
        default="0,1",
        help="arrival spreads in seconds (0: all at once; 1: one second, longer than a "
        "stream of the default prefix takes at 100 Gb/s)",
    )
    ap.add_argument("--model", default="llama3-8b", choices=sorted(MODELS))
    ap.add_argument("--block-tokens", type=int, default=512)
    ap.add_argument("--blocks", type=int, default=4, help="blocks in the shared prefix")


def _run_args(args: argparse.Namespace) -> list[ReplicationPoint]:
    """:func:`run` on the parsed command line."""
    ns = args.ns or ("1,4,16" if args.quick else ",".join(str(2**i) for i in range(11)))
    prefix = args.blocks * MODELS[args.model].chunk_bytes(args.block_tokens)
    return run(
        [int(x) for x in ns.split(",")],
        [float(x) for x in args.gbps.split(",")],
        [int(x) for x in args.replicas.split(",")],
        prefix,
        args.out,
        [float(x) for x in args.spreads.split(",")],
    )


main = main_for("python -m experiments.replication", __doc__, DEFAULT_OUT, _add_args, _run_args)


if __name__ == "__main__":
    sys.exit(main())
