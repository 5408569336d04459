"""N-to-1 incast: N GPU hosts fetch the same hot prefix, without and with the switch.

Modes (one emulated cluster, measured side by side in one run):

- ``a`` pool-unicast: every host asks the pool for the whole prefix itself; the pool sends it N
  times through its one link.
- ``b`` pool-multicast: one host asks the pool once naming a multicast group; the switch
  replicates the pool's single stream to the N hosts.
- ``c`` sram-multicast: the prefix is in switch SRAM; one host's GETs name the group and the
  switch answers every member from SRAM.
- ``d`` sram-unicast: the prefix is in switch SRAM; every host asks the switch for each fragment.
- ``r2``, ``r4`` pool-replicas-k: the baseline a user would pick without the switch, Mooncake's
  answer to a hot object: the prefix on k pool nodes (each its own pool node process and store,
  each behind a pool link of the same rate), host i reading the whole prefix from replica
  ``i mod k`` by unicast, as Mooncake's client spreads reads over replicas. The switch steers a
  GET to the pool node that owns the key's bucket, so replica j holds the prefix under a key of
  its own bucket and host i asks for that key: the client naming its replica.

The pool node is ``python -m poolnode`` in the pool's namespace: with ``--pool-backend mooncake``
(the default where ``mooncake_master`` is installed, which ``make setup`` does) it starts
``mooncake_master`` there and serves the prefix from Mooncake Store; ``memory`` keeps it in the
pool node's own memory.

Per point it records every host's completion time (from a common start instant to a complete,
CRC-checked and content-verified tensor), its GET retries, timeouts and follower repairs, the
pool nodes' egress bytes (interface counters) and the switch's counters. Every point is run
``--repeats`` times (3 by default; the table gives the median and the range). Each GPU host runs
one long-lived agent (``python -m hostagent.agent batch``) for the whole sweep, so a point's time
is the fetch, not the interpreter's start-up. It writes a per-host CSV, a summary CSV and a PNG
plot, and prints last one table: per N and mode the time until all N hosts hold the prefix, the
relief T_a/T_x beside the flow model's prediction (``experiments.sim.incast``), the pool egress
and the retries, timeouts and repairs.

Run: ``python -m experiments.incast`` (root; Mininet). ``--help`` lists the sweep parameters.
``--topology leaf-spine`` runs it on a leaf-spine fabric of switches (emulation.fabric,
docs/fabric.md): the N hosts round-robin over the leaves, a pool node under each leaf, and per
point the bytes each leaf-spine link carried (``uplink_max_over_prefix``: the busiest link's,
in prefix copies).

The modes, a point's result and the outputs made from results (CSVs, plot, relief table) are
in :mod:`experiments.incast_results`; this module runs the points on the cluster.

Classes:
    HostAgents: one long-lived agent process per GPU host.

Functions:
    get_timeouts: the agents' GET timeouts in one point.
    pool_tx_each: bytes each pool node has sent.
    run_point: one point on a running cluster.
    serve_pools: a pool node on every pool host of a running cluster.
    run_sweep: the whole sweep on one cluster.
    main: command line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import select
import shlex
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from emulation.fabric import FabricCluster, default_fabric_switch_class
from emulation.network import Cluster
from emulation.switches import BMv2Switch, P4Switch, RefSwitch, default_switch_class
from emulation.topo import EMULATION_MTU, SERVICE_IP, ClusterSpec, FabricSpec, LinkSpec
from experiments.incast_results import (
    DEFAULT_MODES,
    MODES,
    Mode,
    PointResult,
    fit_sim,
    format_table,
    parse_modes,
    relief_table,
    replica_key,
    write_outputs,
)
from kvcast import p4constants as c
from kvcast import procs
from kvcast.kvp import frags_per_data
from kvcast.ports import AGENT_PORT
from kvcast.tools.p4rt_client import P4RuntimeClientError
from poolnode.mooncake import find_master_binary

TENANT = 7
SEED = 20261122
RESULTS = Path("results/incast")


def _pool_tx_bytes(cluster: Cluster) -> int:
    """Bytes the pool nodes have sent, all together (:func:`pool_tx_each`)."""
    return sum(pool_tx_each(cluster))


def pool_tx_each(cluster: Cluster) -> list[int]:
    """Bytes each pool node has sent: what the switch's port facing it has received.

    Read in the root namespace (the switch's end of each veth pair), so no node shell is
    involved; a veth pair delivers every frame one end sends to the other.
    """
    out = []
    for pool in cluster.pools():
        node = cluster.host(pool.name)
        switch_intf = node.defaultIntf().link.intf2.name
        out.append(int(Path(f"/sys/class/net/{switch_intf}/statistics/rx_bytes").read_text()))
    return out


def _event_counters(cluster: Cluster) -> dict[int, int]:
    """The KVP event counters, summed over the cluster's switches (one in a star)."""
    total: dict[int, int] = defaultdict(int)
    for client in cluster.clients():
        for index, value in client.counters(c.COUNTER_INGRESS_STATS_KVP_EVENT_COUNTER).items():
            total[index] += value
    return dict(total)


def _settle_pool_links(cluster: Cluster, max_wait_s: float = 2.0) -> None:
    """Waits until the pool nodes have sent nothing for a few DATAs' transmission time.

    Called when a point's hosts are done: answers to their last duplicate GETs (a tail probe,
    a retry) may still be queued on a pool link. They are the point's traffic; read later, they
    were counted in the next point's pool bytes (a multicast point's prefix sent "twice").
    """
    rate = cluster.spec.pool_link.bw_mbit
    data_s = cluster.spec.mtu * 8 / (rate * 1e6) if rate else 0.0
    quiet_s = max(0.05, 3 * data_s)
    deadline = time.monotonic() + max_wait_s
    last, since = _pool_tx_bytes(cluster), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(quiet_s / 5)
        now_bytes = _pool_tx_bytes(cluster)
        if now_bytes != last:
            last, since = now_bytes, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return


def _link_bytes(cluster: Cluster) -> dict[str, int]:
    return cluster.link_tx_bytes() if isinstance(cluster, FabricCluster) else {}


_EVENT_NAMES = {
    c.EV_GET_HIT: "get_hit",
    c.EV_GET_MISS: "get_miss",
    c.EV_GET_BYPASS: "get_bypass",
    c.EV_DATA_MCAST: "data_mcast",
    c.EV_DATA_UNICAST: "data_unicast",
}


WINDOW = 32  # GETs each agent keeps outstanding
SWITCH_QUEUE_FRAMES = 64  # BMv2 simple_switch's egress queue per port, in packets


def pool_requesters(mode: Mode, n: int) -> int:
    """Agents whose GETs share one pool link in a point: one per group, N / k per replica."""
    return 1 if mode.group else -(-n // mode.replicas)


def agent_window(mode: Mode, n: int, window: int = WINDOW) -> int:
    """GETs each agent keeps outstanding in a point.

    What a point puts in flight at once must fit the emulated switch's buffers, or the switch
    drops it and the agents wait for their GET timeouts, which then measures the loss and not
    the scheme. BMv2 queues 64 packets per egress port (``simple_switch.cpp``) and drops the
    rest; measured on BMv2 at N = 32 with 28-32 GETs per agent: 646 timeouts and 40.5 s in mode
    a (35.7 s is the pool link's drain time), 144 repairs in mode c, 7,496 timeouts in mode d;
    with 2 GETs per agent none at all, and modes a, c and d took 35.7, 2.4 and 5.5 s. So the
    GETs toward one pool link (mode a: N agents, r_k: N/k), the copies of the leader's GETs
    (mode c: N per GET) and every host's GETs (mode d) are kept within 64. A TCP sender's
    congestion window finds such a limit by loss; the agents are given it. Neither path needs
    more: the pool link carries one 1,500-byte reply in 6 ms and the switch answers in well
    under a millisecond, so a few GETs in flight per agent keep every link busy.
    """
    load = n if mode.via == "switch" else pool_requesters(mode, n)
    return max(1, min(window, SWITCH_QUEUE_FRAMES // load))


def get_timeouts(
    mode: Mode, n: int, pool_mbit: float | None, window: int = WINDOW, mtu: int = EMULATION_MTU
) -> tuple[float, float]:
    """First and largest GET timeout for the agents of one point.

    A GET's reply waits behind everything already queued on the pool link; a timeout shorter
    than that drain time retransmits GETs whose replies are merely queued, and the duplicates
    congest the link further. TCP avoids this with an RTT estimate; the agents are given the
    drain time of the bytes that can be in flight (every requester's window) instead, so mode
    (a) is measured without spurious retransmissions and the relief is the traffic's, not a
    collapse's.

    Args:
        mode: the point's mode.
        n: hosts fetching.
        pool_mbit: pool link rate (None: unshaped).
        window: the most GETs one agent keeps outstanding.
        mtu: the links' MTU: a GET to the pool asks for as many fragments as one DATA carries.

    Returns:
        (first timeout, largest timeout) in seconds.
    """
    if mode.via == "switch" or pool_mbit is None:
        return 0.1, 1.0
    requesters = pool_requesters(mode, n)
    frames = requesters * agent_window(mode, n, window)
    in_flight = frames * frags_per_data(mtu) * (c.FRAG_BYTES + c.KVP_HDR_BYTES)
    first = max(0.1, 2.5 * in_flight * 8 / (pool_mbit * 1e6))
    return first, 4 * first


def _agent_cmd(
    name: str,
    mode: Mode,
    role: str,
    key: int,
    nbytes: int,
    group: int,
    pool_ip: str,
    timeout: float,
    timeouts: tuple[float, float],
    window: int,
    mtu: int,
    other_pools: Sequence[str] = (),
) -> list[str]:
    if mode.group:
        agent_mode = role
    else:
        agent_mode = "unicast-switch" if mode.via == "switch" else "unicast-pool"
    cmd = [
        "--name",
        name,
        "--tenant",
        str(TENANT),
        "--key",
        hex(key),
        "--nbytes",
        str(nbytes),
        "--service",
        SERVICE_IP,
        "--pool",
        pool_ip,
        "--mode",
        agent_mode,
        "--start-at",
        "stdin",
        "--timeout",
        str(timeout),
        "--verify-seed",
        str(SEED),
        "--bind-port",
        str(AGENT_PORT),
        "--window",
        str(window),
        "--mtu",
        str(mtu),
        "--get-timeout",
        f"{timeouts[0]:.3f}",
        "--max-get-timeout",
        f"{timeouts[1]:.3f}",
        # A follower repairs only when the stream has stalled longer than the leader's longest
        # GET timeout, or it would take a leader's retry for the end of the stream.
        "--stall",
        f"{max(0.5, 1.2 * timeouts[1]):.3f}",
    ]
    # The switch sends a miss to the key's owner, which may be another pool node: the agent
    # takes datagrams only from the pool nodes it was given.
    for ip in other_pools:
        cmd += ["--trust-pool", ip]
    if mode.group:
        cmd += ["--group", str(group), "--via", mode.via]
    return cmd


class HostAgents:
    """One long-lived ``python -m hostagent.agent batch`` process per GPU host.

    A point hands each taking part a ``fetch`` argument line, waits until every one has bound
    its socket (``agent ready`` on its stderr), gives them all one start instant and reads one
    JSON line from each. An agent that dies is reported as a failed host and started again.
    """

    def __init__(self, cluster: Cluster, names: Sequence[str]) -> None:
        self.cluster = cluster
        self.procs: dict[str, subprocess.Popen[str]] = {}
        for name in names:
            self._start(name)

    def _start(self, name: str) -> None:
        self.procs[name] = self.cluster.host(name).popen(
            [sys.executable, "-m", "hostagent.agent", "batch"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
        )

    def run(self, lines: dict[str, list[str]], timeout: float) -> dict[str, dict[str, Any]]:
        """Runs one fetch on each named host, all starting at one instant.

        Args:
            lines: host name -> its ``fetch`` arguments (with ``--start-at stdin``).
            timeout: seconds to wait for the JSON lines once started.

        Returns:
            Host name -> the agent's JSON record (``ok: false`` with ``error`` for an agent
            that died or said nothing in time).
        """
        for name, args in lines.items():
            self._send(name, shlex.join(args))
        self._wait_ready(list(lines), timeout=60.0)
        # One instant for all, a little ahead so that every follower listens first.
        start_at = time.time() + 0.3
        for name in reversed(list(lines)):
            self._send(name, f"{start_at:.6f}")
        records = {}
        deadline = time.monotonic() + timeout
        for name in lines:
            records[name] = self._read_record(name, deadline)
        return records

    def _send(self, name: str, line: str) -> None:
        proc = self.procs[name]
        try:
            assert proc.stdin is not None
            proc.stdin.write(line + "\n")
            proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # dead: _read_record reports it and starts another

    def _wait_ready(self, names: list[str], timeout: float) -> None:
        pending = {}
        for name in names:
            err = self.procs[name].stderr
            if err is not None:
                pending[err.fileno()] = err
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            ready, _, _ = select.select(list(pending), [], [], 0.5)
            for fd in ready:
                line = pending[fd].readline()
                if not line or line.startswith("agent ready"):
                    del pending[fd]  # ready, or exited (its record says so)

    def _read_record(self, name: str, deadline: float) -> dict[str, Any]:
        proc = self.procs[name]
        out = proc.stdout
        assert out is not None
        while time.monotonic() < deadline:
            ready, _, _ = select.select([out], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            line = out.readline()
            if not line:
                return self._restart(name, f"agent exited with {proc.wait()}")
            if line.startswith("{"):
                record: dict[str, Any] = json.loads(line)
                return record
        return self._restart(name, "no result in time")

    def _restart(self, name: str, why: str) -> dict[str, Any]:
        proc = self.procs[name]
        procs.kill(proc)
        _, err = proc.communicate()
        self._start(name)
        return {"ok": False, "outcome": "error", "error": f"{why}: {err.strip()[-300:]}"}

    def close(self) -> None:
        """Ends every agent (end of input, then a kill for one that lingers)."""
        for proc in self.procs.values():
            try:
                if proc.stdin is not None:
                    proc.stdin.close()
            except OSError:
                pass
        for proc in self.procs.values():
            procs.stop(proc, 10, signal_first=False)
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()


def run_point(
    cluster: Cluster,
    agents: HostAgents,
    mode: Mode,
    n: int,
    nbytes: int,
    key: int,
    group: int,
    timeout: float = 60.0,
    repeat: int = 0,
    window: int = WINDOW,
) -> PointResult:
    """Measures one point on a running cluster.

    Args:
        cluster: the running cluster (pool nodes serving ``key``, and each replica its
            :func:`replica_key`).
        agents: the hosts' agents.
        mode: how to fetch.
        n: GPU hosts fetching.
        nbytes: prefix size.
        key: chunk key the pool holds.
        group: a multicast group id not used before in this run.
        timeout: seconds an agent may take.
        repeat: which repeat of the point this is.
        window: the most GETs one agent keeps outstanding (less where the switch's queue would
            not hold what the point puts in flight, :func:`agent_window`).

    Returns:
        The point's result.
    """
    hosts = cluster.hosts()[:n]
    # No switch keeps the prefix from an earlier point; in SRAM modes, the lowest switch every
    # GET of these hosts crosses gets it (the only one in a star).
    for client in cluster.clients():
        try:
            client.delete(c.TABLE_INGRESS_CACHE_CACHE_TABLE, {"tenant": TENANT, "key": key})
        except Exception as exc:  # noqa: BLE001 - absent is fine
            if not getattr(exc, "not_found", False):
                raise
    if mode.sram:
        cluster.cache_client([h.name for h in hosts]).load_chunk(
            TENANT, key, _synthetic(key, nbytes), slot_base=0, epoch=group
        )
    if mode.group:
        cluster.add_group(group, [h.name for h in hosts])
    pools = cluster.pools()
    tx0, ev0 = _pool_tx_bytes(cluster), _event_counters(cluster)
    links0 = _link_bytes(cluster)
    result = PointResult(mode.name, n, nbytes, repeat=repeat)
    pool_mbit = cluster.spec.pool_link.bw_mbit
    timeouts = get_timeouts(mode, n, pool_mbit, window, cluster.spec.mtu)
    if pool_mbit is not None and mode.via == "pool":
        # Never cut off a fetch that is merely queued: three times the pool link's drain time.
        drain = pool_requesters(mode, n) * nbytes * 1.1 * 8 / (pool_mbit * 1e6)
        timeout = max(timeout, 3 * drain)
    lines = {}
    for i, h in enumerate(hosts):
        role = "leader" if i == 0 else "follower"
        replica = i % mode.replicas
        lines[h.name] = _agent_cmd(
            h.name,
            mode,
            role,
            replica_key(key, replica),
            nbytes,
            group,
            pools[replica].ip,
            timeout,
            timeouts,
            agent_window(mode, n, window),
            cluster.spec.mtu,
            [p.ip for p in pools if p is not pools[replica]],
        )
    records = agents.run(lines, timeout + 30)
    _settle_pool_links(cluster)
    for i, (name, rec) in enumerate(records.items()):
        # The agent's own "host" (its hostname) and "mode" (its role) must not overwrite ours.
        rec = dict(rec)
        role = rec.pop("mode", None)
        rec.pop("host", None)
        result.hosts.append({"host": name, "role": role, "replica": i % mode.replicas, **rec})
    result.pool_tx_bytes = _pool_tx_bytes(cluster) - tx0
    result.link_bytes = {k: v - links0[k] for k, v in _link_bytes(cluster).items()}
    try:
        # The hosts' outcomes are in; a switch that died meanwhile loses only its counters.
        ev1 = _event_counters(cluster)
        result.counters = {n: ev1.get(i, 0) - ev0.get(i, 0) for i, n in _EVENT_NAMES.items()}
        if mode.group:
            cluster.remove_group(group)
    except P4RuntimeClientError as exc:
        result.error = f"switch after the fetch: {exc}"
    return result


def _synthetic(key: int, nbytes: int) -> bytes:
    from kvcast.synthetic import synthetic_chunk

    return synthetic_chunk(TENANT, key, nbytes, SEED)


def serve_pools(
    cluster: Cluster,
    stack: contextlib.ExitStack,
    keys: Sequence[int],
    sizes: Sequence[int],
    pool_backend: str = "memory",
) -> None:
    """Starts a pool node on every pool host, preloaded with each prefix's replica.

    Pool node ``j`` holds prefix ``keys[i]`` (``sizes[i]`` bytes) as
    :func:`replica_key` ``(keys[i], j)``; each node is stopped when ``stack`` closes.

    Raises:
        RuntimeError: a pool node did not start (its log's tail is in the message).
    """
    for j, pool in enumerate(cluster.pools()):
        preload = [
            arg
            for key, size in zip(keys, sizes, strict=True)
            for arg in ("--preload", f"{TENANT}:{replica_key(key, j):#x}:{size}:{SEED}")
        ]
        # The experiment programs its groups into the switch itself, per point (no
        # controller to serve them to the node): the switch's membership check guards them.
        # Tenants: the node checks each GET's against the hosts' bindings the switch holds.
        pool_cmd = [
            sys.executable, "-m", "poolnode", "--port", str(c.KVP_UDP_PORT),
            "--mtu", str(cluster.spec.mtu), "--any-group", *cluster.source_tenants(), *preload,
        ]  # fmt: skip
        if pool_backend == "mooncake":
            pool_cmd += ["--backend", "mooncake", "--start-master", "--segment-mib", "64"]
        else:
            pool_cmd += ["--backend", "memory"]
        stack.enter_context(cluster.serve(pool.name, pool_cmd, "poolnode listening"))


def run_sweep(
    spec: ClusterSpec | FabricSpec,
    switch_cls: type[P4Switch],
    modes: Sequence[str],
    ns: Sequence[int],
    sizes: Sequence[int],
    repeats: int,
    progress: Callable[[str], None] = print,
    pool_backend: str = "memory",
    window: int = WINDOW,
    on_point: Callable[[Cluster, int], None] | None = None,
) -> list[PointResult]:
    """Runs every (size, N, mode) point ``repeats`` times on one cluster.

    Args:
        spec: the cluster (``spec.n_hosts`` >= max of ``ns``, ``spec.n_pools`` >= the most
            replicas a mode reads).
        switch_cls: switch node class.
        modes: mode names.
        ns: host counts.
        sizes: prefix sizes in bytes.
        repeats: runs per point; the repeats of a point are interleaved with the other points
            (repeat 0 of every point first), so that a slow spell of a shared machine does not
            land on one point's every run.
        progress: where progress lines go.
        pool_backend: ``"memory"``, or ``"mooncake"``: each pool node starts ``mooncake_master``
            in its namespace and serves its prefixes from Mooncake Store (``python -m poolnode
            --start-master``).
        window: the most GETs one agent keeps outstanding.
        on_point: called with the cluster and the point's number (from 1) just before each
            point (a fault campaign kills the switch from here). A switch found dead after a
            point is started again and re-programmed (:meth:`Cluster.restart_switch`) before the
            next, and the point's error says so.

    Returns:
        Every point's result.

    Raises:
        ValueError: a mode reads more replicas than the cluster has pool nodes.
        RuntimeError: a pool node did not start (its log's tail is in the message).
    """
    need = max(MODES[m].replicas for m in modes)
    if need > spec.n_pools:
        raise ValueError(f"mode(s) {modes} read {need} replicas; the cluster has {spec.n_pools}")
    results: list[PointResult] = []
    points = [(s, n, m, r) for r in range(repeats) for s in sizes for n in ns for m in modes]
    keys = {s: 0x5EED0000 + (i << 16) for i, s in enumerate(sizes)}
    built = (
        FabricCluster(spec, switch_cls)
        if isinstance(spec, FabricSpec)
        else Cluster(spec, switch_cls)
    )
    with built as cluster, contextlib.ExitStack() as stack:
        serve_pools(cluster, stack, [keys[s] for s in sizes], sizes, pool_backend)
        progress(f"{len(cluster.pools())} pool node(s) ({pool_backend}) ready")
        agents = HostAgents(cluster, [h.name for h in cluster.hosts()[: max(ns)]])
        stack.callback(agents.close)
        t0 = time.time()
        for done, (size, n, m, rep) in enumerate(points, 1):
            if on_point is not None:
                on_point(cluster, done)
            try:
                res = run_point(
                    cluster, agents, MODES[m], n, size, keys[size], group=100 + done,
                    repeat=rep, window=window,
                )  # fmt: skip
            except P4RuntimeClientError as exc:
                # A switch that cannot be programmed fails this point, not the whole sweep:
                # the points measured so far and those after it still reach the CSVs.
                res = PointResult(m, n, size, repeat=rep, error=f"switch: {exc}")
            if not cluster.switch_alive():
                t_dead = time.monotonic()
                try:
                    cluster.restart_switch()
                    took = time.monotonic() - t_dead
                    note = f"switch died; restarted and re-programmed in {took:.2f} s"
                except Exception as exc:  # noqa: BLE001 - the next points record their failure
                    note = f"switch died; restart failed: {exc!r}"
                res.error = f"{res.error}; {note}" if res.error else note
            results.append(res)
            s = res.summary()
            progress(
                f"[{done:3d}/{len(points)}] {time.time() - t0:6.1f}s mode={m} "
                f"({MODES[m].label}) N={n} prefix={size // 1024}KiB rep={rep} "
                f"max={s['max_s']:.3f}s p50={s['p50_s']:.3f}s "
                f"pool_tx={s['pool_tx_over_prefix']:.2f}x ok={s['ok_hosts']}/{n} "
                f"retries={s['retries']} timeouts={s['timeouts']} repairs={s['repairs']}"
                + (f" error={res.error}" if res.error else "")
            )
    return results


def main(argv: list[str] | None = None) -> int:
    """Command line: runs the sweep, writes CSVs and the plot, prints the table last."""
    ap = argparse.ArgumentParser(
        prog="python -m experiments.incast", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--hosts", default="1,2,4,8,16,32", help="comma-separated N values")
    ap.add_argument(
        "--modes", default=DEFAULT_MODES, help=f"comma-separated, of {', '.join(MODES)}"
    )
    ap.add_argument("--prefix-kib", default="256", help="comma-separated prefix sizes in KiB")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--window", type=int, default=WINDOW, help="most GETs one agent keeps outstanding"
    )
    ap.add_argument("--pool-mbit", type=float, default=2.0, help="pool link rate (see docs)")
    ap.add_argument("--host-mbit", type=float, default=20.0, help="GPU host link rate")
    ap.add_argument(
        "--mtu",
        type=int,
        default=EMULATION_MTU,
        help="IP MTU of every link, the pool nodes' DATA and the agents' GETs (1500: the runs "
        "before jumbo frames became the default)",
    )
    ap.add_argument(
        "--topology",
        choices=["star", "leaf-spine"],
        default="star",
        help="one switch, or a leaf-spine fabric of switches (emulation.fabric): the N hosts "
        "spread round-robin over the leaves, a pool node under each leaf",
    )
    ap.add_argument("--spines", type=int, default=2, help="leaf-spine: spine switches")
    ap.add_argument("--leaves", type=int, default=4, help="leaf-spine: leaf switches")
    ap.add_argument(
        "--uplink-mbit", type=float, default=400.0, help="leaf-spine: each leaf-spine link"
    )
    ap.add_argument("--switch", choices=["auto", "refswitch", "bmv2"], default="auto")
    ap.add_argument(
        "--pool-backend",
        choices=["auto", "mooncake", "memory"],
        default="auto",
        help="the pool node's store: Mooncake Store (auto: where mooncake_master is installed)",
    )
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    try:
        modes = parse_modes(args.modes)
    except ValueError as exc:
        ap.error(str(exc))
    ns = [int(x) for x in args.hosts.split(",")]
    sizes = [int(x) * 1024 for x in args.prefix_kib.split(",")]
    if args.repeats < 1 or args.window < 1:
        ap.error("--repeats and --window must be at least 1")
    if max(sizes) > c.NUM_FRAG_SLOTS * c.FRAG_BYTES:
        ap.error(f"a prefix must fit switch SRAM ({c.NUM_FRAG_SLOTS * c.FRAG_BYTES} bytes)")
    auto = default_fabric_switch_class() if args.topology == "leaf-spine" else None
    switch_cls: type[P4Switch] = {
        "auto": auto or default_switch_class(),
        "refswitch": RefSwitch,
        "bmv2": BMv2Switch,
    }[args.switch]
    spec: ClusterSpec | FabricSpec
    replicas = max(MODES[m].replicas for m in modes)
    if args.topology == "leaf-spine":
        if replicas > args.leaves:
            ap.error(f"mode(s) read {replicas} replicas: at least {replicas} leaves needed")
        try:
            spec = FabricSpec(
                spines=args.spines,
                leaves=args.leaves,
                hosts_per_leaf=-(-max(ns) // args.leaves),
                host_link=LinkSpec(bw_mbit=args.host_mbit),
                pool_link=LinkSpec(bw_mbit=args.pool_mbit),
                uplink=LinkSpec(bw_mbit=args.uplink_mbit),
                tenants=(TENANT,),
                mtu=args.mtu,
            )
        except ValueError as exc:
            ap.error(str(exc))
        where = (
            f"a leaf-spine fabric of {spec.leaves} leaves and {spec.spines} spines (uplinks "
            f"{args.uplink_mbit:g} Mbit/s), {spec.hosts_per_leaf} hosts under each leaf"
        )
    else:
        spec = ClusterSpec(
            n_hosts=max(ns),
            n_pools=replicas,
            host_link=LinkSpec(bw_mbit=args.host_mbit),
            pool_link=LinkSpec(bw_mbit=args.pool_mbit),
            tenants=(TENANT,),
            mtu=args.mtu,
        )
        where = "one switch"
    pool_backend = args.pool_backend
    if pool_backend == "auto":
        pool_backend = "mooncake" if find_master_binary() else "memory"
    target = {"refswitch": "the Python reference target", "bmv2": "BMv2 simple_switch_grpc"}
    kib = ",".join(str(s // 1024) for s in sizes)
    setup = (
        f"N-to-1 incast on Mininet, {where}: switch {switch_cls.kind} "
        f"({target[switch_cls.kind]}), "
        f"{spec.n_pools} pool node(s) on {pool_backend}, pool links {args.pool_mbit:g} Mbit/s, "
        f"host links {args.host_mbit:g} Mbit/s, MTU {spec.mtu}, prefix {kib} KiB in "
        f"{c.FRAG_BYTES}-byte fragments, {args.repeats} repeat(s)"
    )
    print(f"incast: {setup}; N={ns} modes={','.join(modes)}", flush=True)
    t0 = time.monotonic()
    results = run_sweep(
        spec,
        switch_cls,
        modes,
        ns,
        sizes,
        args.repeats,
        progress=lambda s: print(s, flush=True),
        pool_backend=pool_backend,
        window=args.window,
    )
    sim = fit_sim(results, args.pool_mbit, args.host_mbit)
    rows = relief_table(results, sim)
    paths = write_outputs(results, args.out, setup, rows)
    for r in results:
        s = r.summary()
        print(
            f"result incast mode={r.mode} n={r.n} prefix_bytes={r.nbytes} repeat={r.repeat} "
            f"max_s={s['max_s']:.4f} p50_s={s['p50_s']:.4f} p99_s={s['p99_s']:.4f} "
            f"pool_tx_over_prefix={s['pool_tx_over_prefix']} ok={s['ok_hosts']}/{r.n} "
            f"retries={s['retries']} timeouts={s['timeouts']} repairs={s['repairs']}"
        )
    fitted = (
        f"switch {sim.switch_pps:,.0f} forwards/s and copy cost {sim.replica_cost:.2f} fitted "
        f"to d and c at the largest N (those two are fits, not predictions)"
        if sim.switch_pps
        else "the switch taken as no limit (no d point to fit its rate to)"
    )
    notes = [
        "T all N: time until every one of the N hosts holds the whole prefix, CRC-checked and "
        "compared byte for byte",
        "relief a/x: T_a / T_x within each repeat; median and range over repeats",
        f"sim a/x: the flow model (experiments/sim/incast.py) at these link rates, {fitted}",
        "pool egress: bytes the pool nodes sent / prefix bytes; retries, timeouts, repairs: "
        "summed over hosts and repeats",
        f"wrote {paths['hosts']}, {paths['summary']}, {paths['table']}, {paths['plot']} "
        f"in {time.monotonic() - t0:.0f} s",
    ]
    print()
    print(format_table(rows, "kvcast incast: " + setup, notes))
    return 0 if all(r.all_ok for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
