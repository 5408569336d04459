"""Where in a leaf-spine fabric a shared prefix should be cached: the rules side by side.

The fabric of :mod:`kvcast.fabric` (the plan the controller and the emulation install) at
cluster scale on the flow model of :mod:`experiments.sim.flows` (max-min fair fluid flows;
a multicast is one flow over its tree's links). ``groups`` hot prefixes are wanted at the same
instant, each by ``members`` GPU hosts (servers): a fraction ``rack_local`` of the groups has
all its members under one leaf, the others spread over ``member_leaves`` leaves drawn at random;
each prefix's pool node is under a leaf of its own drawing. Every switch holds at most
``sram_prefixes`` prefixes. Each placement rule decides where a group's prefix is cached (copies
counted against the switches' capacity, groups in order, first fit; a group that does not fit
is served from its pool node by multicast):

- ``pool``: no switch caches anything: one pool read per group, multicast down its tree;
- ``pool-leaf``: the pool node's leaf caches it (one kvcast switch in front of the pool, as the
  cluster simulation models it): the pool NIC is spared, the fabric carries the same;
- ``spine``: the tree's spine caches it, whatever the members' racks;
- ``member-leaves``: every member leaf holds a copy and serves its own rack (no fabric bytes,
  one copy of SRAM per member leaf);
- ``first-meet`` (kvcast, docs/fabric.md): the switch where the members' GETs first meet, or,
  when it is full, the next switch every GET crosses toward the pool node with room
  (``FabricPlan.cache_path``: the pool node's leaf last).

Per rule: the time until every member of every group holds its prefix (``makespan_s``), the
mean over groups, the pool NICs' bytes, the leaf-spine links' bytes (all, and the busiest
link's), SRAM copies used and groups served from SRAM. The uplinks are sized from the hosts
under a leaf and the oversubscription; every NIC runs at ``gbps``.

Run: ``python -m experiments.sim.fabric [--quick] [--out DIR]``; writes ``fabric.csv`` and prints
``result fabric ...`` lines and a table.

Classes:
    FabricSimConfig: the cluster and the workload.
    RuleResult: one rule's figures.

Functions:
    build_plan: the fabric of a configuration as a :class:`kvcast.fabric.FabricPlan`.
    draw_workload: the groups (members, pool node) drawn with the configuration's seed.
    simulate: every rule on one drawn workload.
    main: command line.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from experiments.output import write_csv
from experiments.sim.flows import FlowNetwork, Link
from experiments.sim.report import result_line
from kvcast.fabric import Attachment, FabricPlan, Uplink

__all__ = [
    "RULES",
    "FabricSimConfig",
    "RuleResult",
    "build_plan",
    "draw_workload",
    "main",
    "simulate",
]

RULES = ("pool", "pool-leaf", "spine", "member-leaves", "first-meet")


@dataclass(frozen=True)
class FabricSimConfig:
    """A fabric and a burst of shared-prefix fetches.

    Attributes:
        leaves: leaf switches (racks).
        spines: spine switches.
        hosts_per_leaf: GPU servers under each leaf (8 GPUs each: 64 x 32 = 16k GPUs).
        pools_per_leaf: DRAM pool nodes under each leaf.
        gbps: every NIC's rate.
        oversub: leaf oversubscription (host bandwidth under a leaf / its uplink bandwidth).
        groups: hot prefixes wanted at once (64 x 32 members: every server once).
        members: servers wanting each prefix.
        member_leaves: leaves a cross-rack group spreads over.
        rack_local: fraction of groups whose members share one leaf.
        prefix_bytes: one prefix: 1 MiB, what switch SRAM can hold (a Tofino-1 pipe has about
            3 MiB: 8 tokens of Llama-3-8B bf16 KV, 32 of a 1B model, more compressed). Every
            flow has this size, so on the fluid model times and bytes scale with it.
        sram_prefixes: prefixes one switch can hold.
        seed: the workload's random seed.
    """

    leaves: int = 64
    spines: int = 8
    hosts_per_leaf: int = 32
    pools_per_leaf: int = 1
    gbps: float = 400.0
    oversub: float = 2.0
    groups: int = 64
    members: int = 32
    member_leaves: int = 8
    rack_local: float = 0.5
    prefix_bytes: int = 1 << 20
    sram_prefixes: int = 3
    seed: int = 1

    def __post_init__(self) -> None:
        if self.members > self.hosts_per_leaf and self.rack_local > 0:
            raise ValueError("a rack-local group cannot have more members than a leaf has hosts")
        if not 1 <= self.member_leaves <= self.leaves:
            raise ValueError(f"member_leaves must be 1..{self.leaves}")
        if self.members < self.member_leaves:
            raise ValueError("a cross-rack group needs at least one member per member leaf")


@dataclass
class RuleResult:
    """One placement rule's figures (see the module docstring)."""

    rule: str
    makespan_s: float = 0.0
    mean_group_s: float = 0.0
    pool_bytes: float = 0.0
    fabric_bytes: float = 0.0
    busiest_link_bytes: float = 0.0
    sram_copies: int = 0
    groups_from_sram: int = 0
    extra: dict[str, float] = field(default_factory=dict)


def build_plan(cfg: FabricSimConfig) -> FabricPlan:
    """The fabric of ``cfg`` as a plan.

    Leaves ``l{i}``, spines ``s{k}``, hosts ``h{i}.{j}``, pool nodes ``p{i}.{j}``; a leaf's ports
    are its hosts, its pool nodes, then one uplink per spine.
    """
    leaves = [f"l{i}" for i in range(cfg.leaves)]
    spines = [f"s{k}" for k in range(cfg.spines)]
    links = [
        Uplink(leaf, cfg.hosts_per_leaf + cfg.pools_per_leaf + k, spine, i)
        for i, leaf in enumerate(leaves)
        for k, spine in enumerate(spines)
    ]
    nodes = [
        Attachment(f"h{i}.{j}", leaf, j, "host")
        for i, leaf in enumerate(leaves)
        for j in range(cfg.hosts_per_leaf)
    ]
    nodes += [
        Attachment(f"p{i}.{j}", leaf, cfg.hosts_per_leaf + j, "pool")
        for i, leaf in enumerate(leaves)
        for j in range(cfg.pools_per_leaf)
    ]
    return FabricPlan(leaves, spines, links, nodes)


def draw_workload(cfg: FabricSimConfig, plan: FabricPlan) -> list[tuple[list[str], str]]:
    """(members, pool node) per group, drawn with the config's seed.

    A server is in one group until every server of its leaf is (then servers are reused), so
    that groups compete for the fabric and the pool NICs rather than for one server's NIC.
    """
    rnd = random.Random(cfg.seed)
    pools = [n for n in plan.nodes.values() if n.role == "pool"]
    free: dict[str, list[int]] = {leaf: [] for leaf in plan.leaves}
    out = []
    for g in range(cfg.groups):
        local = g < round(cfg.rack_local * cfg.groups)
        leaves = rnd.sample(plan.leaves, 1 if local else cfg.member_leaves)
        share, extra = divmod(cfg.members, len(leaves))
        per = [share + (i < extra) for i in range(len(leaves))]
        members = []
        for leaf, k in zip(leaves, per, strict=True):
            if len(free[leaf]) < k:
                free[leaf] = rnd.sample(range(cfg.hosts_per_leaf), cfg.hosts_per_leaf)
            members += [f"h{plan.leaves.index(leaf)}.{free[leaf].pop()}" for _ in range(k)]
        out.append((members, rnd.choice(pools).name))
    return out


def _sources(
    rule: str, plan: FabricPlan, members: list[str], pool: str, room: Callable[[str], bool]
) -> list[str]:
    """Where the group's prefix would be cached under ``rule`` (empty: nowhere).

    ``room`` says whether a switch can take one more prefix; only ``first-meet`` looks for a
    switch with room (the others' one choice fits or not, the caller checks).
    """
    member_leaves = sorted({plan.nodes[h].switch for h in members})
    if rule == "pool":
        return []
    if rule == "pool-leaf":
        return [plan.nodes[pool].switch]
    if rule == "spine":
        return [plan.tree_spine(pool)]
    if rule == "member-leaves":
        return member_leaves
    if rule == "first-meet":
        return [s for s in plan.cache_path(members, pool) if room(s)][:1]
    raise ValueError(f"unknown rule {rule!r}; one of {', '.join(RULES)}")


class _Net:
    """The flow model's links of one fabric: NICs and both directions of every uplink."""

    def __init__(self, cfg: FabricSimConfig, plan: FabricPlan) -> None:
        self.cfg, self.plan = cfg, plan
        self.net = FlowNetwork()
        nic = cfg.gbps * 1e9 / 8
        uplink = cfg.hosts_per_leaf * nic / cfg.oversub / cfg.spines
        self.nic, self.uplink = nic, uplink
        self.fabric: list[Link] = []
        self._up: dict[tuple[str, str], Link] = {}
        self._down: dict[tuple[str, str], Link] = {}
        for leaf in plan.leaves:
            for spine in plan.spines:
                self._up[(leaf, spine)] = self.net.link(f"{leaf}>{spine}", uplink)
                self._down[(spine, leaf)] = self.net.link(f"{spine}>{leaf}", uplink)
        self.fabric = [*self._up.values(), *self._down.values()]

    def host(self, name: str) -> Link:
        return self.net.link(f"nic:{name}", self.nic)

    def tree(self, source: str, members: list[str], pool: str) -> list[Link]:
        """The links a multicast from ``source`` (a switch) to ``members`` crosses."""
        plan = self.plan
        spine = plan.tree_spine(pool)
        leaves = {plan.nodes[h].switch for h in members}
        links = [self.host(h) for h in members]
        if plan.is_spine(source):
            return links + [self._down[(source, leaf)] for leaf in leaves]
        remote = leaves - {source}
        if remote:
            links.append(self._up[(source, spine)])
            links += [self._down[(spine, leaf)] for leaf in remote]
        return links


def _run_rule(
    rule: str, cfg: FabricSimConfig, plan: FabricPlan, work: Sequence[tuple[list[str], str]]
) -> RuleResult:
    net = _Net(cfg, plan)
    used: dict[str, int] = {}
    res = RuleResult(rule)
    finish: dict[int, float] = {}

    def done_at(g: int) -> object:
        def on_done(_flow: object, t: float) -> None:
            finish[g] = max(finish.get(g, 0.0), t)

        return on_done

    size = float(cfg.prefix_bytes)
    for g, (members, pool) in enumerate(work):

        def room(switch: str) -> bool:
            return used.get(switch, 0) < cfg.sram_prefixes

        sources = _sources(rule, plan, members, pool, room)
        fits = bool(sources) and all(room(s) for s in sources)
        if fits:
            for s in sources:
                used[s] = used.get(s, 0) + 1
            res.sram_copies += len(sources)
            res.groups_from_sram += 1
            if rule == "member-leaves":
                for leaf in sources:
                    local = [h for h in members if plan.nodes[h].switch == leaf]
                    path = [(link, 1.0) for link in net.tree(leaf, local, pool)]
                    net.net.start(size, path, on_done=done_at(g))  # type: ignore[arg-type]
            else:
                path = [(link, 1.0) for link in net.tree(sources[0], members, pool)]
                net.net.start(size, path, on_done=done_at(g))  # type: ignore[arg-type]
            continue
        pool_link = net.net.link(f"nic:{pool}", net.nic)
        path = [(pool_link, 1.0)]
        path += [(link, 1.0) for link in net.tree(plan.nodes[pool].switch, members, pool)]
        net.net.start(size, path, on_done=done_at(g))  # type: ignore[arg-type]
    net.net.advance(float("inf"))
    res.makespan_s = max(finish.values())
    res.mean_group_s = sum(finish.values()) / len(finish)
    res.pool_bytes = sum(lk.moved for lk in net.net.links if lk.name.startswith("nic:p"))
    res.fabric_bytes = sum(lk.moved for lk in net.fabric)
    res.busiest_link_bytes = max(lk.moved for lk in net.fabric)
    return res


def simulate(cfg: FabricSimConfig, rules: Sequence[str] = RULES) -> list[RuleResult]:
    """Every rule on one workload drawn from ``cfg``.

    Raises:
        ValueError: an unknown rule.
    """
    plan = build_plan(cfg)
    work = draw_workload(cfg, plan)
    return [_run_rule(rule, cfg, plan, work) for rule in rules]


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: the rules at 16k GPUs (or ``--quick``: a small fabric), a table."""
    ap = argparse.ArgumentParser(
        prog="python -m experiments.sim.fabric", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--quick", action="store_true", help="8 leaves x 8 servers")
    ap.add_argument("--out", type=Path, default=Path("results/fabric-sim"))
    ap.add_argument("--rack-local", default="0,0.5,0.9", help="fractions of rack-local groups")
    ap.add_argument("--sram-prefixes", default="1,3", help="prefixes one switch holds")
    ap.add_argument("--oversub", type=float, default=2.0)
    args = ap.parse_args(argv)
    base = (
        FabricSimConfig(
            leaves=8,
            spines=2,
            hosts_per_leaf=8,
            groups=16,
            members=8,
            member_leaves=4,
            oversub=args.oversub,
        )  # fmt: skip
        if args.quick
        else FabricSimConfig(oversub=args.oversub)
    )
    rows: list[dict[str, object]] = []
    for local in (float(x) for x in args.rack_local.split(",")):
        for cap in (int(x) for x in args.sram_prefixes.split(",")):
            cfg = FabricSimConfig(**{**asdict(base), "rack_local": local, "sram_prefixes": cap})
            results = simulate(cfg)
            pool_t = results[0].makespan_s
            for r in results:
                row: dict[str, object] = {
                    "rack_local": local, "sram_prefixes": cap, "rule": r.rule,
                    "makespan_ms": round(r.makespan_s * 1e3, 3),
                    "mean_group_ms": round(r.mean_group_s * 1e3, 3),
                    "speedup_vs_pool": round(pool_t / r.makespan_s, 3),
                    "pool_mb": round(r.pool_bytes / 1e6, 1),
                    "fabric_mb": round(r.fabric_bytes / 1e6, 1),
                    "busiest_link_mb": round(r.busiest_link_bytes / 1e6, 2),
                    "sram_copies": r.sram_copies, "groups_from_sram": r.groups_from_sram,
                }  # fmt: skip
                rows.append(row)
                result_line("fabric", echo=True, **row)
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(args.out / "fabric.csv", rows)
    gpus = base.leaves * base.hosts_per_leaf * 8
    print(
        f"\nplacement rules: {base.leaves} leaves x {base.hosts_per_leaf} servers ({gpus} GPUs), "
        f"{base.spines} spines, oversubscription {base.oversub:g}, {base.gbps:g} Gb/s NICs, "
        f"{base.groups} groups of {base.members}, {base.prefix_bytes / 2**20:g} MiB prefixes"
    )
    head = f"{'local':>5} {'cap':>3} {'rule':<14}{'makespan ms':>12}{'mean ms':>8}{'vs pool':>8}"
    head += f"{'pool MB':>9}{'fabric MB':>10}{'busiest MB':>11}{'copies':>7}{'cached':>7}"
    print(head)
    for x in rows:
        print(
            f"{x['rack_local']:>5} {x['sram_prefixes']:>3} {x['rule']:<14}{x['makespan_ms']:>12}"
            f"{x['mean_group_ms']:>8}{x['speedup_vs_pool']:>8}{x['pool_mb']:>9}"
            f"{x['fabric_mb']:>10}{x['busiest_link_mb']:>11}{x['sram_copies']:>7}"
            f"{x['groups_from_sram']:>7}"
        )
    print(f"wrote {args.out / 'fabric.csv'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
