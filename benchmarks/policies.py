"""Benchmark: cache-selection policies against the offline optimum, and batch ranking speed.

Replays each workload through every online policy at SRAM budgets of 128 to 4,096 equal-size
blocks, next to Belady's optimum at the same budget, and prints for each (workload, budget,
policy) the prefix byte hit ratio and its ratio to the optimum. The hit definition is the one
of :mod:`experiments.policies.evaluate`: a block is a hit when it is resident and every
earlier block of its request was a hit.

Workloads: the Mooncake conversation and synthetic traces (when found), a stationary Zipf
prefix workload, the same with popularity churn, and agentic fan-out. References next to the
optimum: ``belady`` itself (ratio 1) and, on the conversation trace, ``belady-seen2``, Belady
forbidden to admit a block on its first access (what perfect foresight gives a policy that
only admits chunks it has seen before). Full runs add a kvcast parameter sensitivity at two
budgets. Each workload is also replayed at issue 29's budgets (1, 4 and 16 % of its distinct
blocks; 4 and 16 % with ``--quick``), and a ``bench policies-goal`` line per budget and policy
(kvcast, adaptive) gives the ratio to the best anchor (target >= 0.98) and, where the best
anchor is below 0.7 of the optimum, the share of the distance to the optimum closed (target
>= 0.1), with ``met=yes|no``.

Finally it times the controller's batch path on every workload and on a 1,000,000-access
Zipf one (100,000 with ``--quick``): ``record_many`` and one ``select`` of the SRAM set per
online policy (each line with the time per million accesses and ``met=yes|no`` against the
1 s rate), then kvcast's three record paths side by side (Python, the C loop over Access
objects, the C loop over column arrays; alternated, three runs each), against issue 14's rate
of a million accesses recorded and ranked in one second.

Functions:
    policy_rows: replay policies at several budgets next to the optimum.
    target_rows: kvcast over the best anchor per budget, against the 1.15x target.
    goal_budgets: issue 29's budgets for a workload (1, 4, 16 % of its distinct blocks).
    goal_rows: issue 29's targets per budget, for kvcast and adaptive, with ``met=yes|no``.
    run: the suite entry point (prints ``bench policies ...`` and ``bench policies-timing ...``
        lines and a ratio table per workload).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping, Sequence
from typing import Any

from benchmarks import bench_line
from controlplane.policies import (
    Access,
    AccessColumns,
    KvcastPolicy,
    available_policies,
    make_policy,
)
from experiments.policies.evaluate import opt_result, replay
from experiments.policies.workloads import (
    Workload,
    agentic_fanout_workload,
    load_mooncake_trace,
    zipf_prefix_workload,
)
from experiments.traces import SYNTHETIC_TRACE, default_trace_path

__all__ = ["goal_budgets", "goal_rows", "run"]

BUDGETS = (128, 512, 1024, 2048, 4096)
ANCHORS = ("lru", "lfu", "arc", "wtinylfu")
"""The classic caches of issue 14's target: kvcast at least ``TARGET`` times the best of them."""
TARGET = 1.15
RATE_TARGET_S = 1.0
"""Issue 14's batch rate: a million accesses recorded and ranked in at most this."""
PATHS = ("python", "native", "arrays")
"""kvcast's record paths timed side by side: Python, C over Access objects, C over arrays."""
QUICK_BUDGETS = (128, 512, 2048)
GOAL_FRACTIONS = (0.01, 0.04, 0.16)
"""Issue 29's budgets: shares of each workload's distinct blocks."""
NEVER_BEHIND = 0.98
"""Issue 29: the policy's hits at least this times the best anchor's, in every cell ..."""
CLOSE_BELOW = 0.7
CLOSE_SHARE = 0.1
"""... and where the best anchor is below ``CLOSE_BELOW`` of the optimum, at least
``CLOSE_SHARE`` of the distance from it to the optimum closed."""
GOAL_POLICIES = ("kvcast", "adaptive")
SENSITIVITY_BUDGETS = (512, 2048)

# label -> (registered policy, parameters) for the kvcast sensitivity rows.
SENSITIVITY: Mapping[str, tuple[str, Mapping[str, Any]]] = {
    "kvcast-hl10s": ("kvcast", {"half_life_s": 10.0}),
    "kvcast-hl300s": ("kvcast", {"half_life_s": 300.0}),
    "kvcast-hostw1": ("kvcast", {"repeat_host_weight": 1.0}),
    "kvcast-hyst0": ("kvcast", {"hysteresis": 0.0}),
    "kvcast-open": ("kvcast", {"prefix_closed": False}),
    "kvcast-unlearned": ("kvcast", {"learned_weights": False}),
}


def _workloads(quick: bool) -> list[Workload]:
    out = []
    trace = default_trace_path()
    if trace is not None:
        out.append(load_mooncake_trace(trace, limit=3000 if quick else None))
    else:
        print("# no trace: data/traces/ is missing and KVCAST_TRACE unset; skipping it", flush=True)
    if SYNTHETIC_TRACE.is_file():
        out.append(load_mooncake_trace(SYNTHETIC_TRACE, limit=1500 if quick else None))
    n = 3000 if quick else 12000
    out.append(zipf_prefix_workload(n_requests=n))
    out.append(zipf_prefix_workload(n_requests=n, churn_period_s=300.0, name="zipf-churn"))
    out.append(agentic_fanout_workload(n_tasks=80 if quick else 300))
    return out


def policy_rows(
    w: Workload,
    budgets: Sequence[int],
    policies: Mapping[str, tuple[str, Mapping[str, Any]]],
    table: dict[int, dict[str, float]],
) -> list[str]:
    """Replay ``policies`` at each budget next to the optimum and print one line per run.

    Args:
        w: the workload.
        budgets: budgets in blocks.
        policies: row label -> (registered policy name, constructor parameters).
        table: filled in place: budget -> label -> ratio to optimum (plus ``opt_byte_hit``).

    Returns:
        The printed lines (the optimum's row first at each budget).
    """
    lines = []
    for blocks in budgets:
        capacity = blocks * w.block_bytes
        opt = opt_result(w, capacity)
        row = table.setdefault(blocks, {})
        row["opt_byte_hit"] = opt.byte_hit_ratio
        runs = [("belady", opt)]
        for label, (name, params) in policies.items():
            extra = dict(params)
            if name == "belady":
                extra["future"] = w.key_sequence()
            runs.append((label, replay(w, make_policy(name, capacity_bytes=capacity, **extra))))
        for label, r in runs:
            ratio = r.hit_bytes / opt.hit_bytes if opt.hit_bytes else 1.0
            row[label] = ratio
            line = bench_line(
                "policies",
                workload=w.name,
                budget=blocks,
                policy=label,
                byte_hit=round(r.byte_hit_ratio, 4),
                ratio_to_opt=round(ratio, 3),
                any_byte_hit=round(r.any_byte_hit_ratio, 4),
                admissions=r.admissions,
                evictions=r.evictions,
                demotes=r.demotes,
                demote_precision=round(r.demote_precision, 3) if r.demotes else "-",
                drop_regret=round(r.drop_regret, 3) if r.evictions > r.demotes else "-",
                replay_s=round(r.seconds, 2),
            )
            print(line, flush=True)
            lines.append(line)
    return lines


def target_rows(w: Workload, table: dict[int, dict[str, float]]) -> list[str]:
    """Per budget, kvcast's hits over the best anchor's, against issue 14's 1.15x target.

    Next to the target each line prints the *ceiling*: no policy beats the optimum, so kvcast
    over the best anchor can be at most 1 / (best anchor's ratio to the optimum). Where that
    is below the target (``reachable=False``: the anchor is already within 1/1.15 = 0.87 of
    the optimum) the target cannot be met by construction; ``met`` is the same test either way.

    Args:
        w: the workload.
        table: :func:`policy_rows`'s table (ratios to the optimum per label).

    Returns:
        One ``bench policies-target`` line per budget where kvcast and an anchor ran.
    """
    lines = []
    for blocks, row in table.items():
        present = [a for a in ANCHORS if a in row]
        if "kvcast" not in row or not present:
            continue
        best = max(present, key=lambda a: row[a])
        ratio = row["kvcast"] / row[best] if row[best] > 0 else float("inf")
        ceiling = 1.0 / row[best] if row[best] > 0 else float("inf")
        line = bench_line(
            "policies-target",
            workload=w.name,
            budget=blocks,
            kvcast_to_opt=round(row["kvcast"], 3),
            best_anchor=best,
            best_anchor_to_opt=round(row[best], 3),
            kvcast_over_best_anchor=round(ratio, 3),
            target=TARGET,
            ceiling=round(ceiling, 3),
            reachable=ceiling >= TARGET,
            met=ratio >= TARGET,
        )
        print(line, flush=True)
        lines.append(line)
    return lines


def goal_budgets(w: Workload, quick: bool) -> dict[int, str]:
    """Issue 29's budgets for a workload: blocks -> share label (1, 4, 16 % of its blocks)."""
    distinct = len(set(w.key_sequence()))
    fractions = GOAL_FRACTIONS[1:] if quick else GOAL_FRACTIONS
    return {max(8, int(f * distinct)): f"{f:.0%}" for f in fractions}


def goal_rows(
    w: Workload,
    table: dict[int, dict[str, float]],
    shares: dict[int, str],
    policies: Sequence[str] = GOAL_POLICIES,
) -> list[str]:
    """Issue 29's targets per budget: never behind the best anchor, closing on the optimum.

    Each line (``bench policies-goal``) names the policy, its ratio to the optimum and the
    best anchor's, ``ratio`` = policy / best anchor against ``NEVER_BEHIND``, and where the
    best anchor is below ``CLOSE_BELOW`` of the optimum, ``closed`` = (policy - best) / (1 -
    best) against ``CLOSE_SHARE``; ``met=yes`` when every target that applies is met.

    Args:
        w: the workload.
        table: :func:`policy_rows`'s table.
        shares: the budgets to report (blocks -> label such as ``4%``).
        policies: the policies measured.

    Returns:
        One line per (budget, policy) present in the table.
    """
    lines = []
    for blocks, share in shares.items():
        row = table.get(blocks, {})
        present = [a for a in ANCHORS if a in row]
        if not present:
            continue
        best = max(present, key=lambda a: row[a])
        b = row[best]
        for policy in policies:
            if policy not in row:
                continue
            v = row[policy]
            ratio = v / b if b > 0 else float("inf")
            applies = b < CLOSE_BELOW
            closed = (v - b) / (1.0 - b) if applies else None
            met_ratio = ratio >= NEVER_BEHIND
            met_close = None if closed is None else closed >= CLOSE_SHARE
            line = bench_line(
                "policies-goal",
                workload=w.name,
                budget=blocks,
                share=share,
                policy=policy,
                to_opt=round(v, 3),
                best_anchor=best,
                best_anchor_to_opt=round(b, 3),
                opt=1.0,
                ratio=round(ratio, 3),
                ratio_target=NEVER_BEHIND,
                met_ratio="yes" if met_ratio else "no",
                closed="-" if closed is None else round(closed, 3),
                close_target=CLOSE_SHARE,
                met_close="n/a" if met_close is None else "yes" if met_close else "no",
                met="yes" if met_ratio and met_close is not False else "no",
            )
            print(line, flush=True)
            lines.append(line)
    return lines


def _print_table(w: Workload, table: dict[int, dict[str, float]]) -> None:
    labels: list[str] = []
    for row in table.values():
        labels += [k for k in row if k != "opt_byte_hit" and k not in labels]
    print(f"# {w.name}: {w.n_refs} block refs; {w.description}")
    print(
        "# ratio to optimum (prefix byte hit); 'kv/anchor': kvcast over the best of "
        f"{', '.join(ANCHORS)} (target {TARGET}); 'ceiling': the most it can be, 1 / the best "
        "anchor's ratio to the optimum (below the target: unreachable by construction); last "
        "column: the optimum's byte hit ratio"
    )
    width = {lab: max(14, len(lab) + 2) for lab in labels}
    head = "".join(f"{lab:>{width[lab]}}" for lab in labels)
    print("# " + "budget".rjust(6) + head + f"{'kv/anchor':>11}{'ceiling':>9}{'opt':>9}")
    for blocks, row in table.items():
        cells = "".join(
            f"{row[lab]:>{width[lab]}.3f}" if lab in row else f"{'-':>{width[lab]}}"
            for lab in labels
        )
        present = [row[a] for a in ANCHORS if a in row]
        if "kvcast" in row and present and max(present) > 0:
            versus = f"{row['kvcast'] / max(present):>11.3f}{1 / max(present):>9.3f}"
        else:
            versus = f"{'-':>11}{'-':>9}"
        print(f"# {blocks:>6}{cells}{versus}{row['opt_byte_hit']:>9.4f}", flush=True)


def _record_once(w: Workload, path: str, accesses: Sequence[Access], cols: AccessColumns) -> Any:
    """Record ``accesses`` into a fresh kvcast policy on one path, then select; the timings."""
    policy = KvcastPolicy(4096 * w.block_bytes, native=path != "python")
    if path != "python" and not policy.native:
        return None
    t0 = time.perf_counter()
    if path == "arrays":
        policy.record_arrays(*cols)
    else:
        policy.record_many(accesses)
    t1 = time.perf_counter()
    decision = policy.select(accesses[-1].time)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, decision


def _rate_rows(w: Workload, accesses: Sequence[Access], reps: int) -> list[str]:
    """Record + select of kvcast on the Python path, the C path and the C path over arrays.

    The three run alternated (the order rotates every repetition) on the same access list;
    each line gives the median over ``reps`` runs and the spread (min-max), the speed-up of
    the median over the Python path's, whether every path selected the same set, and against
    issue 14's rate (1M accesses recorded and ranked in ``RATE_TARGET_S``) the time scaled to
    a million accesses.
    """
    cols = AccessColumns.of(accesses)
    runs: dict[str, list[tuple[float, float]]] = {p: [] for p in PATHS}
    selected: dict[str, Any] = {}
    for rep in range(reps):
        order = PATHS[rep % len(PATHS) :] + PATHS[: rep % len(PATHS)]
        for path in order:
            out = _record_once(w, path, accesses, cols)
            if out is None:
                continue
            runs[path].append((out[0], out[1]))
            selected[path] = out[2]
    same = all(d == selected["python"] for d in selected.values())
    lines = []
    base = statistics.median(r + s for r, s in runs["python"])
    for path in PATHS:
        if not runs[path]:
            print(f"# {path}: controlplane.policies._kvcast_native not built; skipped", flush=True)
            continue
        rec = [r for r, _ in runs[path]]
        sel = [s for _, s in runs[path]]
        tot = [r + s for r, s in runs[path]]
        per_million = statistics.median(tot) * 1e6 / len(accesses)
        line = bench_line(
            "policies-rate",
            workload=w.name,
            path=path,
            accesses=len(accesses),
            runs=len(tot),
            record_s=round(statistics.median(rec), 3),
            record_spread=f"{min(rec):.3f}-{max(rec):.3f}",
            select_s=round(statistics.median(sel), 3),
            select_spread=f"{min(sel):.3f}-{max(sel):.3f}",
            speedup=round(base / statistics.median(tot), 2),
            per_million_s=round(per_million, 3),
            target_s=RATE_TARGET_S,
            met=per_million <= RATE_TARGET_S,
            same_selection=same,
        )
        print(line, flush=True)
        lines.append(line)
    return lines


def _timing(workloads: Sequence[Workload], quick: bool) -> list[str]:
    """Batch speed of every online policy on each workload and on a 1M-access Zipf one.

    One ``policies-timing`` line per policy and workload (kvcast on its default path: the C
    one when built), then kvcast's paths side by side (``policies-rate``).
    """
    n_requests = 7300 if quick else 73000  # about 100,000 / 1,000,000 block references
    big = zipf_prefix_workload(
        n_requests=n_requests, n_documents=20000, rate_per_s=24.0, name="zipf-1m"
    )
    lines = []
    for w in [*workloads, big]:
        accesses = w.accesses()
        for name in available_policies(include_offline=False):
            policy = make_policy(name, capacity_bytes=4096 * w.block_bytes)
            t0 = time.perf_counter()
            policy.record_many(accesses)
            t1 = time.perf_counter()
            decision = policy.select(accesses[-1].time)
            t2 = time.perf_counter()
            line = bench_line(
                "policies-timing",
                workload=w.name,
                policy=name,
                accesses=len(accesses),
                budget=4096,
                record_s=round(t1 - t0, 3),
                select_s=round(t2 - t1, 3),
                accesses_per_s=int(len(accesses) / max(t1 - t0, 1e-9)),
                selected=len(decision.admit),
                per_million_s=round((t2 - t0) * 1e6 / len(accesses), 3),
                target_s=RATE_TARGET_S,
                met="yes" if (t2 - t0) * 1e6 / len(accesses) <= RATE_TARGET_S else "no",
            )
            print(line, flush=True)
            lines.append(line)
        lines += _rate_rows(w, accesses, 1 if quick else 3)
    return lines


def run(quick: bool = False) -> list[str]:
    """Run the policy comparison and the batch timing.

    Args:
        quick: trace slice of 3,000 requests, smaller generated workloads, three budgets,
            no sensitivity rows, 100,000 accesses for the timing.

    Returns:
        The printed ``bench`` lines.
    """
    budgets = QUICK_BUDGETS if quick else BUDGETS
    online: dict[str, tuple[str, Mapping[str, Any]]] = {
        name: (name, {}) for name in available_policies(include_offline=False)
    }
    lines: list[str] = []
    workloads = _workloads(quick)
    for w in workloads:
        policies = dict(online)
        if w.name == "conversation":
            policies["belady-seen2"] = ("belady", {"min_accesses": 2})
        table: dict[int, dict[str, float]] = {}
        shares = goal_budgets(w, quick)
        lines += policy_rows(w, sorted(set(budgets) | set(shares)), policies, table)
        if not quick:
            lines += policy_rows(w, SENSITIVITY_BUDGETS, SENSITIVITY, table)
        lines += target_rows(w, table)
        lines += goal_rows(w, table, shares)
        _print_table(w, table)
    lines += _timing(workloads, quick)
    return lines
