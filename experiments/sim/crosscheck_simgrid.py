"""The SimGrid side of :mod:`experiments.sim.crosscheck`: one engine, run in a child process.

SimGrid allows one engine per process and takes its network model at start, so the cross-check
runs this module once per model variant: it reads a specification on standard input (what
:func:`experiments.sim.crosscheck.simgrid_spec` writes: ``args`` for the engine, ``hosts``,
``links`` as ``[name, bytes/s, latency s]``, ``routes`` as ``[src, dst, [link, ...]]``,
``cases``: per case, per transfer, its ``[src, dst, bytes]`` comms), builds the platform in
one full (explicit-route) zone, and has one actor run the cases one after the other: it starts
every comm of a case at once (``Comm.sendto_async``, host to host without mailboxes), waits for
all of them, and records each one's end from the case's start. With ``parallel_tasks`` (the
``ptask_L07`` host model) each transfer is one parallel task instead, its comms a matrix of
bytes between its hosts (a tree then progresses at one rate), run by an actor of its own, and
each of its comms gets the task's end. The network is idle between cases,
so they do not see each other. It writes ``{"version": ..., "finish": [[seconds, ...], ...]}``
on standard output.

Needs the ``simgrid`` package (``make sim-crosscheck``); nothing else imports this module.

Functions:
    run: build and run one specification; returns the answer.
    main: standard input to standard output.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["main", "run"]


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Build the platform of ``spec``, run its cases, return every comm's completion time."""
    import simgrid  # type: ignore[import-not-found,unused-ignore]
    from simgrid import ActivitySet, Comm, Engine, LinkInRoute, this_actor

    engine = Engine(["crosscheck", *spec["args"]])
    zone = engine.netzone_root
    hosts = {name: zone.add_host(name, 1e9).seal() for name in spec["hosts"]}
    links = {}
    for name, bandwidth, latency in spec["links"]:
        links[name] = zone.add_link(name, bandwidth).set_latency(latency).seal()
    none = LinkInRoute.Direction.NONE
    for src, dst, names in spec["routes"]:
        route = [LinkInRoute(links[n], none) for n in names]
        zone.add_route(hosts[src], hosts[dst], route, False)
    zone.seal()
    finish: list[list[float]] = []

    def parallel_task(comms: list[list[Any]], done: list[float]) -> Callable[[], None]:
        names = list(dict.fromkeys(n for s, d, _ in comms for n in (s, d)))
        index = {n: i for i, n in enumerate(names)}
        amounts = [0.0] * (len(names) * len(names))
        for s, d, size in comms:
            amounts[index[s] * len(names) + index[d]] = float(size)

        def go() -> None:
            this_actor.parallel_execute([hosts[n] for n in names], [0.0] * len(names), amounts)
            done.append(engine.clock)

        return go

    def driver() -> None:
        for case in spec["cases"]:
            start = engine.clock
            if spec["parallel_tasks"]:
                ends: list[list[float]] = [[] for _ in case]
                actors = [
                    hosts[t[0][0]].add_actor(f"transfer{i}", parallel_task(t, ends[i]))
                    for i, t in enumerate(case)
                ]
                for actor in actors:
                    actor.join()
                finish.append(
                    [end[0] - start for t, end in zip(case, ends, strict=True) for _ in t]
                )
                continue
            comms = [Comm.sendto_async(hosts[s], hosts[d], int(n)) for t in case for s, d, n in t]
            pending = ActivitySet()
            for comm in comms:
                pending.push(comm)
            pending.wait_all()
            finish.append([comm.finish_time - start for comm in comms])

    hosts[spec["hosts"][0]].add_actor("driver", driver)
    engine.run()
    return {"version": getattr(simgrid, "simgrid_version", "unknown"), "finish": finish}


def main() -> int:
    """Read a specification on standard input, write the answer on standard output."""
    json.dump(run(json.load(sys.stdin)), sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
