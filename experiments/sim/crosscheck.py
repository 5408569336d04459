"""Cross-check of the home-made flow model against SimGrid's flow-level model on a leaf-spine.

The fabric studies (:mod:`experiments.sim.fabric`, :mod:`experiments.sim.replication`) run on
the project's own fluid model (:mod:`experiments.sim.flows`: max-min fair rates, a multicast
one flow over its tree). This builds the same leaf-spine fabric and the same transfers for both
that model and SimGrid's flow-level network model (s4u, run in a child process by
:mod:`experiments.sim.crosscheck_simgrid`), runs the scenarios the simulations answer questions
with, and puts the completion times side by side.

**Fabric.** :func:`experiments.sim.fabric.build_plan` of a :class:`FabricSimConfig` (the
placement study's: every NIC at ``gbps``, each leaf-spine link sized from the hosts under a
leaf and the oversubscription), routed and treed by :class:`kvcast.fabric.FabricPlan` (a leaf
sends to another leaf through one spine per destination leaf; a tree crosses one spine). Every
link is one direction: ``a>b`` for each pair of adjacent nodes (NIC to leaf, leaf to NIC, leaf
to spine, spine to leaf), with the same capacity and name in both models.

**Scenarios** (one prefix of ``prefix_bytes`` each, every transfer starting at once; host ``i``
of a scenario is the ``i // leaves``-th host of leaf ``i mod leaves``, so N hosts spread over
the leaves):

- ``unicast``: N-to-1 incast, one pool node sends each of N hosts its own copy (mode a);
- ``multicast``: one copy per tree link from the pool node to the N hosts (mode b);
- ``replicas-k``: k pool nodes (under evenly spaced leaves) hold a copy; host i reads
  replica i mod k by unicast (Mooncake's answer, modes r2/r4);
- ``groups-unicast`` / ``groups-multicast``: ``groups`` prefixes wanted at once by ``members``
  hosts each over ``member_leaves`` leaves, each from a pool node drawn at random (the
  placement study's workload, :func:`experiments.sim.fabric.draw_workload`): pool NICs and
  fabric links shared by several transfers.

**How SimGrid runs them.** Every host, pool node and switch is a SimGrid host in one full
(explicit-route) zone; every directed link is a SimGrid link; a route is the list of links
along the plan's path, one direction, and the reverse route its reverse (which SimGrid's
cross-traffic needs). A unicast is one comm (``Comm.sendto_async``) from the pool node to the
host along its route. SimGrid has no multicast: a tree is one comm per tree link, between the
link's two ends, all started at once, and a receiver holds the prefix when every comm on its
path from the root has ended (a cut-through relay with unlimited buffers in every switch). The
home model runs a tree as one flow at the rate of its slowest branch. With one tree alone both
give size over the path's bottleneck; under contention SimGrid lets each link run at its own
share (multi-rate), the home model holds every branch at one rate.

**Network model variants** (``--variants``): ``raw`` is SimGrid's plain max-min model (its
``raw`` network model: no latency or bandwidth factor, no TCP window, no RTT weighting, no
cross traffic) with zero link latency: it compares bandwidth sharing only, the home model's
one concern. ``lv08`` is SimGrid's default model (LV08: latency x 13.01, every flow moving
0.97 of the share it is given, RTT-weighted sharing with S = 20537 bytes, TCP window gamma
4 MiB, 5 % reverse cross traffic) with ``latency_us`` per link: what a SimGrid user gets by
default, TCP-like, which an RDMA fabric is not. ``ptask`` runs every transfer as one SimGrid
parallel task (the ``ptask_L07`` host model, zero latency): a tree is then one activity over
all its links at one rate, as in the home model, shared by SimGrid's default solver for
parallel tasks (``fairbottleneck``) rather than max-min.

Run: ``python -m experiments.sim.crosscheck [--quick] [--out DIR]``; writes ``crosscheck.csv``
and ``crosscheck.json`` and prints a table. Without SimGrid (``make sim-crosscheck`` installs
it) it runs the home model only and says so.

Classes:
    CrossCheckConfig: the fabric, the scenario sizes and the SimGrid variants.
    Transfer: a unicast or a multicast tree and the receivers it serves.
    Case: one scenario at one N: its transfers.

Types:
    Path: the node names along a route, source first.

Functions:
    link_capacities: every directed link of the fabric and its rate.
    unicast_route, tree_routes: a unicast's route and a tree's, from the fabric plan.
    build_cases: every scenario of a configuration.
    run_home: the completion time of every receiver on the home model.
    simgrid_spec: the platform and comms the SimGrid worker runs (JSON-able).
    simgrid_available: whether SimGrid imports.
    run_simgrid: run the worker for one variant; None when SimGrid is not installed.
    receiver_times: the receivers' times from the worker's per-comm times.
    compare, format_table: the table rows (home, SimGrid per variant, ratios) and its Markdown.
    main: command line.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path as FilePath
from typing import Any

from experiments.output import write_csv
from experiments.sim.fabric import FabricSimConfig, build_plan, draw_workload
from experiments.sim.flows import FlowNetwork
from kvcast.fabric import FabricPlan

__all__ = [
    "VARIANTS",
    "Case",
    "CrossCheckConfig",
    "Path",
    "Transfer",
    "build_cases",
    "compare",
    "format_table",
    "link_capacities",
    "main",
    "receiver_times",
    "run_home",
    "run_simgrid",
    "simgrid_available",
    "simgrid_spec",
    "tree_routes",
    "unicast_route",
]

VARIANTS: dict[str, list[str]] = {
    "raw": ["--cfg=network/model:raw"],
    "lv08": ["--cfg=network/model:LV08"],
    "ptask": ["--cfg=host/model:ptask_L07"],
}
"""SimGrid's command-line configuration per variant (module docstring)."""

LATENCY_FREE = {"raw", "ptask"}
"""Variants run with zero link latency (bandwidth sharing only)."""

PARALLEL_TASKS = {"ptask"}
"""Variants that run every transfer as one parallel task (a tree at one rate)."""


def _default_fabric() -> FabricSimConfig:
    return FabricSimConfig(
        leaves=16,
        spines=4,
        hosts_per_leaf=16,
        groups=32,
        members=16,
        member_leaves=4,
        rack_local=0.0,
        prefix_bytes=64 << 20,
    )


@dataclass(frozen=True)
class CrossCheckConfig:
    """The fabric and the scenarios.

    Attributes:
        fabric: the placement study's configuration (:class:`FabricSimConfig`): spines, leaves,
            hosts and one pool node per leaf, NIC rate, oversubscription, and the ``groups-*``
            scenarios' workload (``groups`` prefixes of ``members`` hosts over
            ``member_leaves`` leaves, ``seed``); its ``prefix_bytes`` is every transfer's size
            (default 64 MiB: one 512-token block of Llama-3-8B bf16 KV), 256 hosts.
        ns: the N of the single-prefix scenarios (hosts wanting the prefix).
        replicas: the k of the ``replicas-k`` scenarios.
        latency_us: each link's latency in the variants that have latency.
        variants: the SimGrid variants to run (keys of :data:`VARIANTS`).
    """

    fabric: FabricSimConfig = field(default_factory=_default_fabric)
    ns: tuple[int, ...] = (1, 4, 16, 64, 256)
    replicas: tuple[int, ...] = (2, 4)
    latency_us: float = 1.0
    variants: tuple[str, ...] = ("raw", "lv08", "ptask")

    def __post_init__(self) -> None:
        fab = self.fabric
        hosts = fab.leaves * fab.hosts_per_leaf
        if any(not 1 <= n <= hosts for n in self.ns):
            raise ValueError(f"every N must be 1..{hosts} (the fabric's hosts), got {self.ns}")
        pools = fab.leaves * fab.pools_per_leaf
        if any(not 1 <= k <= pools for k in self.replicas):
            raise ValueError(f"replicas must be 1..{pools} (the fabric's pool nodes)")
        unknown = set(self.variants) - set(VARIANTS)
        if unknown:
            raise ValueError(f"unknown SimGrid variants {sorted(unknown)}; {sorted(VARIANTS)}")
        if self.latency_us < 0:
            raise ValueError("latency_us must be >= 0")


Path = tuple[str, ...]
"""Node names along a route, source first."""


@dataclass(frozen=True)
class Transfer:
    """What one pool node sends: a unicast (one receiver) or a multicast tree (its receivers).

    Attributes:
        source: the pool node sending.
        routes: per receiver, the nodes from the source to it.
        multicast: one copy per tree link (else one copy per receiver).
    """

    source: str
    routes: dict[str, Path]
    multicast: bool

    def edges(self) -> list[tuple[str, str]]:
        """The directed links the transfer crosses, each once (a tree's links, in order)."""
        seen: dict[tuple[str, str], None] = {}
        for route in self.routes.values():
            for a, b in zip(route, route[1:], strict=False):
                seen[(a, b)] = None
        return list(seen)


@dataclass
class Case:
    """One scenario at one size.

    Attributes:
        scenario: ``unicast``, ``multicast``, ``replicas-k``, ``groups-unicast``, ...
        n: receivers (hosts wanting a prefix, counted once per prefix).
        transfers: what moves.
    """

    scenario: str
    n: int
    transfers: list[Transfer] = field(default_factory=list)

    @property
    def name(self) -> str:
        """``scenario/N``."""
        return f"{self.scenario}/{self.n}"


def link_name(a: str, b: str) -> str:
    """The directed link from node ``a`` to adjacent node ``b``."""
    return f"{a}>{b}"


def link_capacities(cfg: CrossCheckConfig, plan: FabricPlan) -> dict[str, float]:
    """Every directed link of the fabric and its capacity in bytes per second.

    The NICs at ``gbps``; a leaf-spine link at the leaf's host bandwidth over the
    oversubscription, split over the spines (as :mod:`experiments.sim.fabric` sizes it).
    """
    fab = cfg.fabric
    nic = fab.gbps * 1e9 / 8
    uplink = fab.hosts_per_leaf * nic / fab.oversub / fab.spines
    links: dict[str, float] = {}
    for node in plan.nodes.values():
        links[link_name(node.name, node.switch)] = nic
        links[link_name(node.switch, node.name)] = nic
    for leaf in plan.leaves:
        for spine in plan.spines:
            links[link_name(leaf, spine)] = uplink
            links[link_name(spine, leaf)] = uplink
    return links


def unicast_route(plan: FabricPlan, source: str, dest: str) -> Path:
    """The nodes a unicast from ``source`` to ``dest`` crosses (the plan's next hops)."""
    route = [source, plan.nodes[source].switch]
    while True:
        _port, nxt = plan.next_hop(route[-1], dest)
        if nxt is None:
            return (*route, dest)
        route.append(nxt)


def tree_routes(plan: FabricPlan, source: str, members: Sequence[str]) -> dict[str, Path]:
    """Per member, the nodes the tree from ``source`` carries its DATA through.

    Built from :meth:`FabricPlan.tree`'s replication groups, walked from the pool node's leaf
    as the data plane forwards DATA (never back out of the port it came in on).
    """
    tree = plan.tree(members, source)
    by_port: dict[tuple[str, int], str] = {(n.switch, n.port): n.name for n in plan.nodes.values()}
    for leaf in plan.leaves:
        for spine in plan.spines:
            by_port[(leaf, plan.uplink_port(leaf, spine))] = spine
            by_port[(spine, plan.downlink_port(spine, leaf))] = leaf
    routes: dict[str, Path] = {}
    stack: list[Path] = [(source, plan.nodes[source].switch)]
    while stack:
        route = stack.pop()
        here, came_from = route[-1], route[-2]
        for port, _replica in tree.get(here, []):
            nxt = by_port[(here, port)]
            if nxt == came_from or nxt in route:
                continue
            if nxt in plan.nodes:
                routes[nxt] = (*route, nxt)
            else:
                stack.append((*route, nxt))
    missing = set(members) - set(routes)
    if missing:
        raise RuntimeError(f"the tree from {source} does not reach {sorted(missing)}")
    return routes


def spread_hosts(plan: FabricPlan, n: int) -> list[str]:
    """N hosts spread over the leaves: host i is the (i // leaves)-th of leaf i mod leaves."""
    per_leaf = [
        [a.name for a in plan.nodes.values() if a.switch == leaf and a.role == "host"]
        for leaf in plan.leaves
    ]
    k = len(plan.leaves)
    return [per_leaf[i % k][i // k] for i in range(n)]


def build_cases(cfg: CrossCheckConfig) -> list[Case]:
    """Every scenario of ``cfg`` (module docstring), in table order."""
    fab = cfg.fabric
    plan = build_plan(fab)
    pools = [a.name for a in plan.nodes.values() if a.role == "pool"]
    pool = pools[0]
    cases: list[Case] = []
    for n in cfg.ns:
        hosts = spread_hosts(plan, n)
        uni = Case("unicast", n)
        uni.transfers = [Transfer(pool, {h: unicast_route(plan, pool, h)}, False) for h in hosts]
        multi = Case("multicast", n, [Transfer(pool, tree_routes(plan, pool, hosts), True)])
        cases += [uni, multi]
        for k in cfg.replicas:
            holders = [pools[r * len(pools) // k] for r in range(k)]
            rep = Case(f"replicas-{k}", n)
            rep.transfers = [
                Transfer(holders[i % k], {h: unicast_route(plan, holders[i % k], h)}, False)
                for i, h in enumerate(hosts)
            ]
            cases.append(rep)
    if fab.groups > 0:
        work = draw_workload(fab, plan)
        n = sum(len(members) for members, _ in work)
        gu, gm = Case("groups-unicast", n), Case("groups-multicast", n)
        for members, source in work:
            gu.transfers += [
                Transfer(source, {h: unicast_route(plan, source, h)}, False) for h in members
            ]
            gm.transfers.append(Transfer(source, tree_routes(plan, source, members), True))
        cases += [gu, gm]
    order = {s: i for i, s in enumerate(dict.fromkeys(c.scenario for c in cases))}
    return sorted(cases, key=lambda c: (order[c.scenario], c.n))


def run_home(cfg: CrossCheckConfig, case: Case) -> list[float]:
    """Every receiver's completion time (s) of ``case`` on the home model, in transfer order.

    A unicast is one flow along its route; a tree one flow over its links (module docstring).
    """
    plan = build_plan(cfg.fabric)
    caps = link_capacities(cfg, plan)
    net = FlowNetwork()
    flows = []
    for t in case.transfers:
        path = [(net.link(link_name(a, b), caps[link_name(a, b)]), 1.0) for a, b in t.edges()]
        flows.append((t, net.start(float(cfg.fabric.prefix_bytes), path)))
    net.advance(float("inf"))
    return [flow.finish for t, flow in flows for _ in t.routes]


def simgrid_spec(cfg: CrossCheckConfig, cases: Sequence[Case], variant: str) -> dict[str, Any]:
    """What the SimGrid worker builds and runs for ``variant`` (JSON-able).

    ``hosts``: every node and switch; ``links``: ``[name, bytes/s, latency s]``; ``routes``:
    ``[src, dst, [link, ...]]`` for every route a comm takes and its reverse; ``cases``: per
    case, per unicast (one comm, source to receiver) or tree (one comm per tree link), its comms
    as ``[src, dst, bytes]``; ``parallel_tasks``: run each of those as one parallel task. The
    worker answers each comm's completion time from its case's start, in that order.
    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown SimGrid variant {variant!r}; {sorted(VARIANTS)}")
    plan = build_plan(cfg.fabric)
    caps = link_capacities(cfg, plan)
    latency = 0.0 if variant in LATENCY_FREE else cfg.latency_us * 1e-6
    routes: dict[tuple[str, str], list[str]] = {}

    def add_route(path: Path) -> None:
        for hops in (path, tuple(reversed(path))):
            names = [link_name(a, b) for a, b in zip(hops, hops[1:], strict=False)]
            if routes.setdefault((hops[0], hops[-1]), names) != names:
                raise RuntimeError(f"two routes from {hops[0]} to {hops[-1]}")

    comms: list[list[list[list[Any]]]] = []
    for case in cases:
        mine: list[list[list[Any]]] = []
        for t in case.transfers:
            size = cfg.fabric.prefix_bytes
            if t.multicast:
                for a, b in t.edges():
                    add_route((a, b))
                mine.append([[a, b, size] for a, b in t.edges()])
            else:
                for route in t.routes.values():
                    add_route(route)
                mine += [[[t.source, dest, size]] for dest in t.routes]
        comms.append(mine)
    return {
        "args": [*VARIANTS[variant], "--log=root.thresh:warning"],
        "parallel_tasks": variant in PARALLEL_TASKS,
        "hosts": [*plan.spines, *plan.leaves, *plan.nodes],
        "links": [[name, cap, latency] for name, cap in caps.items()],
        "routes": [[s, d, names] for (s, d), names in routes.items()],
        "cases": comms,
    }


def receiver_times(case: Case, finish: Sequence[float]) -> list[float]:
    """Receivers' completion times from the worker's per-comm times (``simgrid_spec`` order).

    A unicast receiver is done when its comm is; a tree's when every comm on its path is.
    """
    out: list[float] = []
    i = 0
    for t in case.transfers:
        if t.multicast:
            edges = t.edges()
            done = dict(zip(edges, finish[i : i + len(edges)], strict=True))
            i += len(edges)
            for route in t.routes.values():
                out.append(max(done[e] for e in zip(route, route[1:], strict=False)))
        else:
            out += list(finish[i : i + len(t.routes)])
            i += len(t.routes)
    if i != len(finish):
        raise ValueError(f"{case.name}: {len(finish)} comm times for {i} comms")
    return out


def simgrid_available() -> bool:
    """Whether the ``simgrid`` Python package can be imported."""
    return importlib.util.find_spec("simgrid") is not None


def _simgrid_env() -> dict[str, str]:
    """The environment with the directory of SimGrid's extension on the library path.

    The wheel ``pip`` builds from SimGrid's source puts ``libsimgrid.so`` beside the extension
    module without a run path to it, so the loader needs to be told where it is.
    """
    env = dict(os.environ)
    spec = importlib.util.find_spec("simgrid")
    if spec is not None and spec.origin:
        here = str(FilePath(spec.origin).parent)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (here, env.get("LD_LIBRARY_PATH", "")) if p
        )
    return env


def run_simgrid(
    cfg: CrossCheckConfig, cases: Sequence[Case], variant: str, timeout_s: float = 600.0
) -> tuple[list[list[float]], str] | None:
    """Run ``cases`` on SimGrid's ``variant`` in a child process (one engine per process).

    Returns:
        Per case, every receiver's completion time (s) in transfer order, and SimGrid's
        version; None when SimGrid is not installed.

    Raises:
        RuntimeError: the worker failed (its error output in the message).
    """
    if not simgrid_available():
        return None
    spec = simgrid_spec(cfg, cases, variant)
    got = subprocess.run(
        [sys.executable, "-m", "experiments.sim.crosscheck_simgrid"],
        input=json.dumps(spec),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
        env=_simgrid_env(),
    )
    if got.returncode != 0:
        raise RuntimeError(f"SimGrid worker ({variant}) failed: {got.stderr[-3000:]}")
    answer = json.loads(got.stdout)
    times = [receiver_times(c, f) for c, f in zip(cases, answer["finish"], strict=True)]
    return times, str(answer["version"])


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def compare(
    cfg: CrossCheckConfig,
    cases: Sequence[Case],
    home: Sequence[Sequence[float]],
    simgrid: dict[str, Sequence[Sequence[float]]],
) -> list[dict[str, Any]]:
    """One row per case: the last and mean receiver's time in each model, and the ratios.

    Args:
        cfg: the configuration (for the table's context).
        cases: the cases.
        home: per case, every receiver's time on the home model.
        simgrid: per variant, per case, every receiver's time on SimGrid.

    Returns:
        Rows with ``oversub``, ``scenario``, ``n``, ``transfers``, ``home_last_ms``,
        ``home_mean_ms`` and, per variant V, ``V_last_ms``, ``V_mean_ms``, ``V_ratio_last``
        (SimGrid / home) and ``V_ratio_mean``.
    """
    rows: list[dict[str, Any]] = []
    for i, case in enumerate(cases):
        h = home[i]
        row: dict[str, Any] = {
            "oversub": cfg.fabric.oversub,
            "scenario": case.scenario,
            "n": case.n,
            "transfers": len(case.transfers),
            "home_last_ms": round(max(h) * 1e3, 4),
            "home_mean_ms": round(_mean(h) * 1e3, 4),
        }
        for variant, per_case in simgrid.items():
            s = per_case[i]
            if len(s) != len(h):
                raise ValueError(f"{case.name}: {len(s)} SimGrid receivers, {len(h)} home")
            row[f"{variant}_last_ms"] = round(max(s) * 1e3, 4)
            row[f"{variant}_mean_ms"] = round(_mean(s) * 1e3, 4)
            row[f"{variant}_ratio_last"] = round(max(s) / max(h), 4)
            row[f"{variant}_ratio_mean"] = round(_mean(s) / _mean(h), 4)
        rows.append(row)
    return rows


def format_table(rows: Sequence[dict[str, Any]], variants: Sequence[str]) -> str:
    """The rows as a Markdown table (last receiver's time; mean in the CSV)."""
    head = ["oversub", "scenario", "N", "home (ms)"]
    for v in variants:
        head += [f"SimGrid {v} (ms)", f"{v} / home"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [f"{r['oversub']:g}", str(r["scenario"]), str(r["n"]), f"{r['home_last_ms']:.4g}"]
        for v in variants:
            cells += [f"{r[f'{v}_last_ms']:.4g}", f"{r[f'{v}_ratio_last']:.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: build the cases, run both models, write the table."""
    ap = argparse.ArgumentParser(
        prog="python -m experiments.sim.crosscheck", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--quick", action="store_true", help="2 spines, 4 leaves x 4 hosts")
    ap.add_argument("--out", type=FilePath, default=FilePath("results/sim-crosscheck"))
    ap.add_argument("--variants", default="raw,lv08,ptask", help=f"of {', '.join(VARIANTS)}")
    ap.add_argument("--latency-us", type=float, default=1.0, help="per link, lv08 only")
    ap.add_argument("--oversub", default=None, help="leaf oversubscriptions (default 2,8; quick 2)")
    args = ap.parse_args(argv)
    variants = tuple(v for v in args.variants.split(",") if v)
    oversubs = [float(x) for x in (args.oversub or ("2" if args.quick else "2,8")).split(",")]
    base = CrossCheckConfig(latency_us=args.latency_us, variants=variants)
    if args.quick:
        small = replace(
            base.fabric, spines=2, leaves=4, hosts_per_leaf=4, groups=4, members=4, member_leaves=2
        )
        base = replace(base, fabric=small, ns=(1, 4, 16), replicas=(2,))
    installed = simgrid_available()
    if not installed:
        print("simgrid not installed (make sim-crosscheck installs it): home model only")
    rows: list[dict[str, Any]] = []
    version = None
    for oversub in oversubs:
        cfg = replace(base, fabric=replace(base.fabric, oversub=oversub))
        cases = build_cases(cfg)
        home = [run_home(cfg, c) for c in cases]
        sim: dict[str, Sequence[Sequence[float]]] = {}
        for v in cfg.variants if installed else ():
            got = run_simgrid(cfg, cases, v)
            if got is None:
                raise RuntimeError("simgrid went away during the run")
            sim[v], version = got
        rows += compare(cfg, cases, home, sim)
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(args.out / "crosscheck.csv", rows)
    meta = {"config": asdict(base), "oversub": oversubs, "simgrid_version": version, "rows": rows}
    (args.out / "crosscheck.json").write_text(json.dumps(meta, indent=1) + "\n")
    fab = base.fabric
    print(
        f"{fab.spines} spines, {fab.leaves} leaves x {fab.hosts_per_leaf} hosts "
        f"({fab.leaves * fab.hosts_per_leaf}) + 1 pool node per leaf, {fab.gbps:g} Gb/s NICs, "
        f"{fab.prefix_bytes / 2**20:g} MiB prefix; SimGrid {version or 'not run'}"
    )
    print(format_table(rows, list(base.variants) if installed else []))
    print(f"wrote {args.out / 'crosscheck.csv'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
