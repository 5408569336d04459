"""Serving through the switch: N real vLLM engines need one prefix at once; time to first token.

Every GPU host of an emulated cluster (Mininet, one P4 switch: BMv2 where installed, the
reference target otherwise; one DRAM pool node with Mooncake Store) runs a real vLLM engine
(``experiments.serving_engine``: the CPU build's model runner, paged KV cache and scheduler)
with the kvcast connector. At each point N engines get one request each at the same instant:
one shared system prompt (``--prefix`` tokens) plus a suffix of their own. Modes:

``recompute``
    no KV is loaded: each engine prefills the whole prompt (the connector is loaded but the
    request asks it for nothing, so every mode runs the same engine).
``pool``
    each engine's connector loads the prefix from the pool through the switch: N unicast
    streams out of one pool link, the N-to-1 incast.
``r2``, ``r4``
    Mooncake's answer without the switch: the prefix replicated on k pool nodes, each behind a
    link of its own (:mod:`experiments.serving_replicas`), every engine loading it by unicast,
    engine i from replica ``i mod k`` (the request option ``replica``), so the N streams share
    k pool links, N / k to a link.
``multicast``
    one engine's connector asks the pool for the prefix with a multicast group in its GETs; the
    switch replicates the pool's one stream to every member, whose connectors follow it.
``sram``
    the prefix is in switch SRAM (loaded by the experiment through P4Runtime, as the controller
    does); the leader's GETs are answered from SRAM and replicated to every member.
``local``
    the floor: the prefix is already in every engine's own prefix cache (its HBM, on a GPU),
    so each computes only its suffix; at N > 1 it measures what N engines sharing this
    machine's two cores cost, which no network mode can beat.

Before each (N, repeat) one engine prefills the prefix with saving on, so the pool holds it
(vLLM's own block hashes name the chunks); every engine then drops its own prefix cache and
every mode runs on the same prompts. Per engine and point it records the time to first token
(from submitting the request to its first output token), the prompt tokens loaded and computed,
the greedy output tokens and the first token's log-probability, and the connector's counters;
per point the pool's egress bytes. It checks every engine's output against the ``recompute``
mode's for the same prompt.

Link rates: every link (GPU hosts and pool node, one NIC class as in a cluster) is shaped so that
fetching a token's KV takes the same fraction of prefilling it as in a stated real deployment
(``DEPLOYMENT``: Llama-3-8B in bf16 on an H100, 400 Gb/s NIC), with this machine's prefill rate
for the emulation's model measured first (``calibrate``). The model is a Llama with random
weights saved by transformers (``EMU_SHAPE``): few KV heads and a wide MLP, so that its prefill
on one CPU core costs what it would per KV byte on a GPU; real weights are not needed for the
timings, and random ones give outputs that differ between prompts.

Run: ``python -m experiments.serving`` (root; Mininet; ``--help`` lists the sweep).

The model, link scaling, prompts and plan are in :mod:`experiments.serving_plan`, the engine
processes in :mod:`experiments.serving_engine` (``Engines``), the fault checks run after the
points in :mod:`experiments.serving_checks`; this module runs the sweep and reports it.

Functions:
    calibrate: this machine's prefill time per token for the model.
    connector_config: one engine's connector configuration on the emulated cluster.
    run: the whole sweep on one cluster.
    pushing_daemon: the controller daemon set to push static prefixes to the engines.
    trace_summary: the trace replay's rows.
    summarize: the table's rows.
    format_table: the table as text.
    plot: the figure.
    main: command line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from emulation.topo import SERVICE_IP, ClusterSpec, LinkSpec
from experiments import serving_checks as checks
from experiments.output import pyplot, write_csv
from experiments.serving_engine import BLOCK_SIZE, REPO, EngineError, Engines
from experiments.serving_plan import (
    DEFAULT_MODES,
    DEPLOYMENT,
    EMU_SHAPE,
    MODES,
    TENANT,
    TRACE_MODES,
    Plan,
    TracePlan,
    link_mbit,
    make_model,
    mode_options,
    replicas,
    tokens,
    trace_requests,
)
from experiments.serving_replicas import replica_copies, replicate
from kvcast import p4constants as c
from kvcast.kvp import frag_count
from kvcast.ports import AGENT_PORT

RESULTS = Path("results/serving")
ENGINE_HTTP_PORT = 8000
"""Where each engine serves completions requests with ``--agentic-daemon`` (its namespace)."""


def calibrate(model: Path, prompt_tokens: int, repeats: int = 3, seed: int = 1) -> float:
    """This machine's prefill time per token for ``model``, one engine alone on one core.

    Starts one engine without a connector in this namespace, warms it up, and times
    ``repeats`` full prefills of ``prompt_tokens`` distinct random tokens.

    Returns:
        The median microseconds per token.
    """
    with tempfile.TemporaryDirectory(prefix="kvcast-calib-") as tmp:
        engines = Engines(
            lambda _name, cmd, **kw: subprocess.Popen(cmd, **kw),
            ["calib"],
            {"calib": None},
            model,
            Path(tmp),
        )
        try:
            engines.wait_ready(300)
            rnd = random.Random(seed)
            times = []
            for i in range(repeats + 1):
                prompt = [rnd.randrange(EMU_SHAPE["vocab_size"]) for _ in range(prompt_tokens)]
                rec = engines.ask({"calib": {"cmd": "run", "prompt": prompt, "max_tokens": 1}})
                if i:  # the first is the warm-up
                    times.append(rec["calib"]["ttft_s"])
        finally:
            engines.close()
    return float(statistics.median(times)) / prompt_tokens * 1e6


def connector_config(
    host_ip: str, name: str, pool_ip: str, master: str, window: int, timeouts: tuple[float, float],
    mtu: int, mac_keys: dict[int, bytes] | None = None, other_pools: Sequence[str] = (),
) -> dict[str, Any]:  # fmt: skip
    """One engine's ``kv_connector_extra_config`` on the emulated cluster.

    ``pool_ip`` is the pool node the engines publish to (and ask when the switch fails),
    ``other_pools`` the replicas' addresses, whose DATA the engine must trust too.
    """
    cfg: dict[str, Any] = {
        "service": f"{SERVICE_IP}:{c.KVP_UDP_PORT}",
        "pool": f"{pool_ip}:{c.KVP_UDP_PORT}",
        "pools": [f"{ip}:{c.KVP_UDP_PORT}" for ip in other_pools],
        "tenant": TENANT,
        "pool_backend": "mooncake",
        "mooncake": {
            "master_addr": master,
            "local_hostname": host_ip,
            "global_segment_size": 0,
            "local_buffer_size": 64 << 20,
        },
        "host": name,
        "bind": f"0.0.0.0:{AGENT_PORT}",
        "fetch": {
            "mtu": mtu,
            "window": window,
            "timeout_s": round(timeouts[0], 3),
            "max_timeout_s": round(timeouts[1], 3),
            "deadline_s": 60.0,
        },
        # A follower repairs by itself only after the leader's longest GET timeout.
        "follow_stall_s": round(max(0.5, 1.2 * timeouts[1]), 3),
        "follow_first_wait_s": 10.0,
    }
    if mac_keys:
        cfg["mac_keys"] = {str(t): k.hex() for t, k in mac_keys.items()}
    return cfg


def _replay(
    engines: Engines, trace: TracePlan, plan: Plan, progress: Callable[[str], None]
) -> list[dict[str, Any]]:
    """Replays the trace once per ``TRACE_MODES`` mode; one row per request and mode."""
    reqs = trace_requests(trace, plan.suffix)
    names = engines.names
    rows: list[dict[str, Any]] = []
    for mode in TRACE_MODES:
        opts = {"save": True} if mode == "trace-pool" else {"load": False, "save": False}
        engines.ask({n: {"cmd": "reset"} for n in names})
        done = _replay_mode(engines, reqs, mode, opts)
        rows += done
        progress(
            f"{mode}: {len(done)} requests, TTFT from arrival p50 "
            f"{statistics.median(r['ttft_from_arrival_s'] for r in done) * 1e3:.0f} ms, "
            f"computed {sum(r['computed_tokens'] for r in done)} tokens, "
            f"loaded {sum(r['loaded_tokens'] for r in done)}"
        )
    by_req: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        by_req.setdefault(r["request"], []).append(r)
    for r in rows:
        both = by_req[r["request"]]
        r["same_across_modes"] = len({b["tokens"] for b in both}) == 1
        r["first_token_same"] = len({b["tokens"].split()[0] for b in both}) == 1
        r["first_logprob_diff"] = max(b["first_logprob"] for b in both) - min(
            b["first_logprob"] for b in both
        )
    return rows


def _replay_mode(
    engines: Engines, reqs: Sequence[tuple[float, list[int]]], mode: str, opts: dict[str, Any]
) -> list[dict[str, Any]]:
    """One replay of the trace's requests, one row per request.

    Request j goes to engine ``j mod N`` at its arrival, or when that engine is free (the wait
    is counted in ``queued_s`` and in the TTFT from arrival).
    """
    names = engines.names
    queues: dict[str, list[int]] = {n: [] for n in names}
    for j in range(len(reqs)):
        queues[names[j % len(names)]].append(j)
    t0 = time.time() + 2.0
    busy: dict[str, int] = {}
    rows: list[dict[str, Any]] = []

    def start(name: str) -> None:
        if queues[name]:
            j = queues[name].pop(0)
            busy[name] = j
            engines.send(name, {"cmd": "run", "prompt": reqs[j][1], "kvcast": opts,
                                "max_tokens": 4, "start_at": t0 + reqs[j][0]})  # fmt: skip

    for name in names:
        start(name)
    while busy:
        for name, r in engines.wait_any(list(busy), 600):
            j = busy.pop(name)
            arrival = t0 + reqs[j][0]
            rows.append({
                "mode": mode, "request": j, "host": name,
                "arrival_s": round(reqs[j][0], 3),
                "queued_s": round(max(0.0, r["started"] - arrival), 4),
                "ttft_s": round(r["ttft_s"], 5),
                "ttft_from_arrival_s": round(r["started"] - arrival + r["ttft_s"], 5),
                "prompt_tokens": r["prompt_tokens"],
                "loaded_tokens": r["loaded_tokens"],
                "computed_tokens": r["computed_tokens"],
                "tokens": " ".join(map(str, r["tokens"])),
                "first_logprob": r["first_logprob"],
            })  # fmt: skip
            start(name)
    return rows


def trace_summary(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per trace mode: TTFT from arrival (p50, p90, max), tokens computed and loaded.

    ``outputs_equal`` and ``first_tokens_equal`` count the requests whose greedy outputs (all of
    them, or the first token) are the same in both modes; ``max_first_logprob_diff`` is the
    largest difference of the first token's log-probability between them.
    """
    out = []
    for mode in TRACE_MODES:
        rs = [r for r in rows if r["mode"] == mode]
        if not rs:
            continue
        t = sorted(r["ttft_from_arrival_s"] for r in rs)
        out.append({
            "mode": mode, "requests": len(rs),
            "ttft_p50_ms": round(statistics.median(t) * 1e3, 1),
            "ttft_p90_ms": round(t[min(len(t) - 1, int(0.9 * len(t)))] * 1e3, 1),
            "ttft_max_ms": round(t[-1] * 1e3, 1),
            "prompt_tokens": sum(r["prompt_tokens"] for r in rs),
            "computed_tokens": sum(r["computed_tokens"] for r in rs),
            "loaded_tokens": sum(r["loaded_tokens"] for r in rs),
            "outputs_equal": sum(r["same_across_modes"] for r in rs),
            "first_tokens_equal": sum(r["first_token_same"] for r in rs),
            "max_first_logprob_diff": round(max(r["first_logprob_diff"] for r in rs), 5),
        })  # fmt: skip
    return out


def run(
    plan: Plan,
    model: Path,
    mbit: float,
    out: Path,
    progress: Callable[[str], None] = print,
    switch_cls: Any = None,
    corrupt_check: bool = False,
    dead_pool_check: bool = False,
    trace: TracePlan | None = None,
    switch_kill_check: bool = False,
    prefill_us_per_token: float | None = None,
    agentic_check: bool = False,
    agentic_daemon: bool = False,
) -> dict[str, Any]:
    """The whole sweep on one emulated cluster.

    Args:
        plan: the sweep.
        model: the model directory (``make_model``).
        mbit: every link's rate (``link_mbit``).
        out: where the engines' logs go.
        progress: where progress lines go.
        switch_cls: the switch node class (default: BMv2 where installed, else the reference
            target).
        corrupt_check: at the end, with MAC keys on, corrupt one chunk of a published prefix
            in the pool and check that the engine recomputes from it with the same output.
        dead_pool_check: last, kill the pool node (and its Mooncake master) after a prefix was
            published, then send every engine a request for it: each must compute it with the
            right output, and the time it took beyond a plain prefill is what the dead pool
            stalled it.
        trace: also replay a trace's first requests (``TRACE_MODES``), after the sweep.
        switch_kill_check: before the dead pool, kill the switch while every engine loads a
            published prefix through it and start it again (re-programmed): each engine must
            end with the full prefill's output, and serve on through the restarted switch.
        prefill_us_per_token: an engine's prefill time per token here (calibrated): the load
            budget of the switch kill check's long outage (None: that part is left out).
        agentic_check: after the sweep, a task that forks one branch per engine, with its
            static prefix pushed to every engine ahead of the branches, pulled by each, or
            neither (:func:`experiments.serving_checks.agentic_check`).
        agentic_daemon: with ``agentic_check``, a fourth way last: the controller daemon runs
            (its switch session taking over from the experiment's) and pushes the prefix to
            the engines itself (:func:`pushing_daemon`).

    Returns:
        ``{"rows": per engine and point, "points": per point, "setup": ..., "corrupt": ...}``.

    Raises:
        EngineError: an engine failed.
        RuntimeError: the pool node did not start.
    """
    from emulation.network import Cluster
    from emulation.switches import default_switch_class
    from experiments.incast import agent_window, get_timeouts
    from experiments.incast_results import MODES as INCAST_MODES

    switch_cls = switch_cls or default_switch_class()
    n_max = max(plan.ns)
    n_pools = max(replicas(m) for m in plan.modes)
    spec = ClusterSpec(
        n_hosts=n_max,
        n_pools=n_pools,
        host_link=LinkSpec(bw_mbit=mbit),
        pool_link=LinkSpec(bw_mbit=mbit),
        tenants=(TENANT,),
    )
    window = agent_window(INCAST_MODES["a"], n_max)
    timeouts = get_timeouts(INCAST_MODES["a"], n_max, mbit, window, spec.mtu)
    mac_keys = {TENANT: bytes(range(32))} if corrupt_check else None
    rows: list[dict[str, Any]] = []
    points: list[dict[str, Any]] = []
    result: dict[str, Any] = {"rows": rows, "points": points}
    t_start = time.monotonic()
    with Cluster(spec, switch_cls) as cluster, contextlib.ExitStack() as stack:
        pool = cluster.pools()[0]
        hosts = cluster.hosts()
        names = [h.name for h in hosts]
        # Every pool node runs a Mooncake master of its own: pool node 0 holds what the engines
        # publish, the others a replica's copy (experiments.serving_replicas). Only the r modes
        # spread the buckets over them; every other mode reads pool node 0.
        # Tenants: the hosts' bindings the switch holds, and (pool node 0) the chunk reads of
        # the agentic check's controller (pushing_daemon's management network) for any tenant.
        from experiments.trace_replay.processes import ManagementNetwork

        controller = ManagementNetwork(cluster, [*names, pool.name]).root_ip[pool.name]
        masters = [
            stack.enter_context(
                _pool_node(cluster, p.name, p.ip, spec.mtu, [f"{controller}=any"] if i == 0 else [])
            ).group(1)
            for i, p in enumerate(cluster.pools())
        ]
        cluster.set_pool_owners([0])
        master = masters[0]
        replica_ips = [p.ip for p in cluster.pools()[1:]]
        connectors: dict[str, dict[str, Any] | None] = {
            h.name: connector_config(
                h.ip, h.name, pool.ip, master, window, timeouts, spec.mtu, mac_keys, replica_ips
            )
            for h in hosts
        }

        engines = Engines(
            lambda name, cmd, **kw: cluster.host(name).popen(cmd, **kw),
            names,
            connectors,
            model,
            out / "logs",
            http_port=ENGINE_HTTP_PORT if agentic_daemon else None,
        )
        try:
            t0 = time.monotonic()
            engines.wait_ready(600)
            progress(f"{n_max} engines ready in {time.monotonic() - t0:.1f} s")
            _warm_up(engines, plan)
            progress("engines warmed up")
            result["setup"] = {
                "switch": switch_cls.__name__,
                "link_mbit": mbit,
                "mtu": spec.mtu,
                "window": window,
                "get_timeouts": timeouts,
                "engine_startup_s": engines.startup_s,
            }
            try:
                _sweep(cluster, engines, plan, rows, points, progress, masters, mac_keys)
                if trace is not None:
                    result["trace"] = _replay(engines, trace, plan, progress)
                if corrupt_check:
                    result["corrupt"] = checks.corrupt_check(engines, plan)
                    progress(f"corrupt check: {result['corrupt']}")
                if agentic_check:

                    def daemon() -> Any:
                        return pushing_daemon(cluster, [*names, pool.name], out / "daemon")

                    result["agentic"] = checks.agentic_check(
                        cluster, engines, plan, daemon if agentic_daemon else None
                    )
                    progress(f"agentic check: {result['agentic']}")
                if switch_kill_check:
                    result["switch_kill"] = checks.switch_kill_check(
                        cluster, engines, plan, prefill_us_per_token
                    )
                    progress(f"switch kill check: {result['switch_kill']}")
                if dead_pool_check:
                    result["dead_pool"] = checks.dead_pool_check(engines, plan, pool.ip)
                    progress(f"dead pool check: {result['dead_pool']}")
            except EngineError as exc:
                # The points measured so far still reach the CSVs; the error says where.
                result["error"] = str(exc)[:2000]
                progress(f"stopped after {len(points)} points: {exc}")
        finally:
            engines.close()
    result["elapsed_s"] = time.monotonic() - t_start
    if "setup" not in result:
        raise EngineError("the engines did not start")
    return result


def _pool_node(cluster: Any, name: str, ip: str, mtu: int, also: Sequence[str]) -> Any:
    """A pool node with a Mooncake master of its own on ``name``; the match of its ready line.

    The experiment programs its groups into the switch itself, per point (no controller serves
    them to the pool node): the switch's membership check guards them. A GET's tenant must be
    one the switch binds its source host to, or ``also`` allows (``ADDR=T`` each).
    """
    cmd = [
        sys.executable, "-m", "poolnode", "--backend", "mooncake", "--start-master",
        "--local-hostname", ip, "--segment-mib", "256", "--port", str(c.KVP_UDP_PORT),
        "--mtu", str(mtu), "--any-group", *cluster.source_tenants(),
        *(arg for a in also for arg in ("--source-tenants", a)),
    ]  # fmt: skip
    return cluster.serve(name, cmd, r"poolnode listening .*master=(\S+)", 180, cwd=REPO)


@contextlib.contextmanager
def pushing_daemon(
    cluster: Any, nodes: Sequence[str], workdir: Path
) -> Iterator[Callable[[list[int]], None]]:
    """The controller daemon, set to push static prefixes to the engines; gives ``register``.

    A management network joins the root namespace to every node (``nodes``: the hosts, then the
    pool node); the daemon (``python -m controlplane run``, dry-run policy) takes the switch
    over, reads chunk lengths from the pool, and knows each host's engine at
    ``http://<its management address>:ENGINE_HTTP_PORT``. ``register(tokens)`` declares the
    task's static prefix (``POST /v1/static``); the daemon's next tick pushes it.
    """
    import urllib.request

    from experiments.serving_plan import emu_kv_bytes_per_token
    from experiments.trace_replay.processes import (
        ManagementNetwork,
        controller_config,
        free_port,
        running_controller,
    )

    report_port, metrics_port = free_port(), free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    with ManagementNetwork(cluster, nodes) as mgmt:
        config = controller_config(
            cluster, mgmt, cache_on=False, report_port=report_port, metrics_port=metrics_port,
            policy="lru", tick_s=0.1, max_loads_per_tick=1, sram_budget_bytes=None,
        )  # fmt: skip
        for host in config["hosts"]:
            host["engine_url"] = f"http://{mgmt.node_ip[host['name']]}:{ENGINE_HTTP_PORT}"
        config["push"] = {"budget_bytes_per_tick": 1 << 30, "timeout_s": 300.0,
                          "bytes_per_token": emu_kv_bytes_per_token()}  # fmt: skip
        with running_controller(config, workdir, report_port):

            def register(prompt: list[int]) -> None:
                body = json.dumps({"tenant": TENANT, "tokens": prompt}).encode()
                req = urllib.request.Request(
                    f"http://127.0.0.1:{report_port}/v1/static", body, method="POST"
                )
                with urllib.request.urlopen(req, timeout=10) as reply:
                    json.loads(reply.read())

            yield register


def _warm_up(engines: Engines, plan: Plan) -> None:
    """First forward passes (slow once per process) and the connector's socket and pool path.

    Host 1 prefills and publishes a throw-away prompt; then every engine loads it from the pool
    once (its fetch client binds the agent port then, before any group fetch needs it), and
    runs a full prefill of another.
    """
    rnd = random.Random(plan.seed - 1)
    first = engines.names[0]
    warm = tokens(rnd, plan.prefix + plan.suffix)
    engines.ask({first: {"cmd": "run", "prompt": warm, "max_tokens": 1}})
    engines.ask({n: {"cmd": "reset"} for n in engines.names})
    engines.ask(
        {n: {"cmd": "run", "prompt": warm, "kvcast": {"save": False}, "max_tokens": 1}
         for n in engines.names}
    )  # fmt: skip
    other = tokens(rnd, plan.prefix + plan.suffix)
    engines.ask(
        {n: {"cmd": "run", "prompt": other, "kvcast": {"load": False, "save": False},
             "max_tokens": 1} for n in engines.names}
    )  # fmt: skip
    engines.ask({n: {"cmd": "reset"} for n in engines.names})


def _sweep(
    cluster: Any,
    engines: Engines,
    plan: Plan,
    rows: list[dict[str, Any]],
    points: list[dict[str, Any]],
    progress: Callable[[str], None],
    masters: Sequence[str],
    mac_keys: Mapping[int, bytes] | None,
) -> None:
    """The points: per repeat, N and mode, every engine's request at once (module docstring).

    ``masters`` are the pool nodes' Mooncake masters (pool node 0's first), ``mac_keys`` the
    tenants' MAC keys where chunks have MAC objects (the replicas' copies get theirs).
    """
    from experiments.incast import pool_tx_each

    client = cluster.client
    n_replicas = max(replicas(m) for m in plan.modes)
    total = len(plan.ns) * plan.repeats * len(plan.modes)
    done = 0
    epoch = 0
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kvcast-serving-") as tmp:
        for rep in range(plan.repeats):
            for n in plan.ns:
                names = engines.names[:n]
                rnd = random.Random(plan.seed + 1000 * rep + n)
                prefix = tokens(rnd, plan.prefix)
                prompts = {name: prefix + tokens(rnd, plan.suffix) for name in names}
                # Host 1 prefills the prefix with saving on: the pool holds its blocks.
                produce = prefix + tokens(rnd, plan.suffix)
                rec = engines.ask(
                    {names[0]: {"cmd": "run", "prompt": produce, "kvcast": {"load": False},
                                "max_tokens": 1}}
                )[names[0]]  # fmt: skip
                keys: list[tuple[int, int]] = [tuple(k) for k in rec["saved"]]  # type: ignore[misc]
                keys = keys[: plan.prefix // BLOCK_SIZE]
                chunk_file = Path(tmp) / "chunks.bin"
                engines.ask({names[0]: {"cmd": "read", "keys": keys, "path": str(chunk_file)}})
                blob = chunk_file.read_bytes()
                chunk = len(blob) // len(keys)
                if n_replicas > 1:  # each replica's keys (and MAC objects) into its store
                    data = [blob[j * chunk : (j + 1) * chunk] for j in range(len(keys))]
                    copies = replica_copies(
                        [(t, k, d) for (t, k), d in zip(keys, data, strict=True)],
                        {replicas(m) for m in plan.modes} - {1},
                        n_replicas,
                        mac_keys,
                    )
                    replicate(
                        cluster, names[0], list(zip(masters, copies, strict=False)), Path(tmp)
                    )
                recompute_tokens: dict[str, list[int]] = {}
                recompute_lp: dict[str, float] = {}
                for mode in plan.modes:
                    done += 1
                    epoch += 1
                    group = 100 + epoch
                    engines.ask({name: {"cmd": "reset"} for name in engines.names})
                    if mode == "sram":
                        frags = frag_count(chunk)
                        for j, (tenant, key) in enumerate(keys):
                            client.load_chunk(
                                tenant, key, blob[j * chunk : (j + 1) * chunk],
                                slot_base=j * frags, epoch=epoch & 0xFFFF or 1,
                            )  # fmt: skip
                    if mode in ("multicast", "sram"):
                        cluster.add_group(group, names)
                    if replicas(mode) > 1:
                        cluster.set_pool_owners(range(replicas(mode)))
                    if mode == "local":  # the prefix into each engine's own cache first
                        engines.ask(
                            {name: {"cmd": "run", "prompt": prompts[name],
                                    "kvcast": {"load": False, "save": False}, "max_tokens": 1}
                             for name in names}
                        )  # fmt: skip
                    tx0 = pool_tx_each(cluster)
                    start_at = time.time() + 1.0
                    recs = engines.ask(
                        {name: {"cmd": "run", "prompt": prompts[name],
                                "kvcast": mode_options(mode, i, group),
                                "max_tokens": plan.max_tokens, "start_at": start_at}
                         for i, name in enumerate(names)}
                    )  # fmt: skip
                    tx_each = [b - a for a, b in zip(tx0, pool_tx_each(cluster), strict=True)]
                    pool_tx = sum(tx_each)
                    if mode in ("multicast", "sram"):
                        cluster.remove_group(group)
                    if replicas(mode) > 1:
                        cluster.set_pool_owners([0])
                    if mode == "sram":
                        for tenant, key in keys:
                            client.delete(
                                c.TABLE_INGRESS_CACHE_CACHE_TABLE, {"tenant": tenant, "key": key}
                            )
                    if mode == "recompute":
                        recompute_tokens = {nm: r["tokens"] for nm, r in recs.items()}
                        recompute_lp = {nm: r["first_logprob"] for nm, r in recs.items()}
                    ttfts = []
                    for i, (name, r) in enumerate(recs.items()):
                        conn = r.get("connector", {})
                        ref = recompute_tokens.get(name)
                        rows.append({
                            "mode": mode, "n": n, "rep": rep, "host": name,
                            "role": "leader" if i == 0 else "follower",
                            "ttft_s": round(r["ttft_s"], 5), "e2e_s": round(r["e2e_s"], 5),
                            "skew_s": round(r["started"] - start_at, 5),
                            "prompt_tokens": r["prompt_tokens"],
                            "loaded_tokens": r["loaded_tokens"],
                            "computed_tokens": r["computed_tokens"],
                            "frags_hit": int(conn.get("frags_hit", 0)),
                            "frags_pool": int(conn.get("frags_pool", 0)),
                            "frags_stream": int(conn.get("frags_stream", 0)),
                            "repairs": int(conn.get("repairs", 0)),
                            "load_s": round(float(conn.get("load_s", 0.0)), 5),
                            "chunks_failed": int(conn.get("chunks_failed", 0)),
                            "first_logprob": r["first_logprob"],
                            "tokens": " ".join(map(str, r["tokens"])),
                            "same_as_recompute": (r["tokens"] == ref) if ref is not None else "",
                            "logprob_diff": (
                                abs(r["first_logprob"] - recompute_lp[name])
                                if name in recompute_lp else ""
                            ),
                        })  # fmt: skip
                        ttfts.append(r["ttft_s"])
                    points.append({
                        "mode": mode, "n": n, "rep": rep,
                        "ttft_p50_s": statistics.median(ttfts), "ttft_max_s": max(ttfts),
                        "pool_tx_bytes": pool_tx, "pool_tx_max_bytes": max(tx_each),
                        "pool_tx_each_bytes": tx_each,
                        "prefix_bytes": len(blob),
                    })  # fmt: skip
                    progress(
                        f"[{done:3d}/{total}] {time.monotonic() - t0:6.1f}s mode={mode} N={n} "
                        f"rep={rep} ttft p50={statistics.median(ttfts) * 1e3:.1f} ms "
                        f"max={max(ttfts) * 1e3:.1f} ms pool_tx={pool_tx / len(blob):.2f}x "
                        f"loaded={sum(r['loaded_tokens'] for r in rows[-n:])} "
                        f"computed={sum(r['computed_tokens'] for r in rows[-n:])}"
                    )


def summarize(
    points: Sequence[dict[str, Any]], rows: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """One row per (N, mode): TTFT over the repeats, tokens, pool egress, outputs checked.

    TTFT per point is the median engine's and the last engine's; the table gives their medians
    over the repeats and the worst last-engine TTFT of any repeat (the tail). ``vs_lone_cached``
    is the last engine's TTFT over a lone engine's cached-prefix TTFT (mode ``pool`` at N = 1);
    ``vs_local_same_n`` over the ``local`` floor at the same N (N engines computing their suffix
    at once on this machine's cores, no KV moved); ``net_ms`` is the difference, the time the
    KV's journey adds, and ``net_vs_lone`` that time over a lone engine's (pool at N = 1 minus
    local at N = 1). ``load_ms`` is the median engine's time in the connector's load jobs
    (from handing the step's chunks to the loader to the last one verified in the cache).
    """
    out = []
    lone = [p["ttft_p50_s"] for p in points if p["n"] == 1 and p["mode"] == "pool"]
    lone_s = statistics.median(lone) if lone else None
    local1 = [p["ttft_p50_s"] for p in points if p["n"] == 1 and p["mode"] == "local"]
    lone_net = lone_s - statistics.median(local1) if lone_s is not None and local1 else None
    for n in sorted({p["n"] for p in points}):
        floor = [p["ttft_max_s"] for p in points if p["n"] == n and p["mode"] == "local"]
        floor_s = statistics.median(floor) if floor else None
        for mode in MODES:
            ps = [p for p in points if p["n"] == n and p["mode"] == mode]
            if not ps:
                continue
            rs = [r for r in rows if r["n"] == n and r["mode"] == mode]
            p50 = statistics.median(p["ttft_p50_s"] for p in ps)
            last = statistics.median(p["ttft_max_s"] for p in ps)
            checked = [r["same_as_recompute"] for r in rs if r["same_as_recompute"] != ""]
            out.append({
                "n": n, "mode": mode, "repeats": len(ps),
                "ttft_p50_ms": round(p50 * 1e3, 1), "ttft_last_ms": round(last * 1e3, 1),
                "ttft_tail_ms": round(max(p["ttft_max_s"] for p in ps) * 1e3, 1),
                "vs_lone_cached": round(last / lone_s, 2) if lone_s else "",
                "vs_local_same_n": round(last / floor_s, 2) if floor_s else "",
                "net_ms": round((last - floor_s) * 1e3, 1) if floor_s else "",
                "net_vs_lone": (
                    round((last - floor_s) / lone_net, 2) if floor_s and lone_net else ""
                ),
                "load_ms": round(statistics.median(r["load_s"] for r in rs) * 1e3, 1),
                "loaded_tokens": round(statistics.mean(r["loaded_tokens"] for r in rs)),
                "computed_tokens": round(statistics.mean(r["computed_tokens"] for r in rs)),
                "pool_tx_over_prefix": round(
                    statistics.median(p["pool_tx_bytes"] / p["prefix_bytes"] for p in ps), 2
                ),
                "busiest_pool_over_prefix": round(
                    statistics.median(p["pool_tx_max_bytes"] / p["prefix_bytes"] for p in ps), 2
                ),
                "repairs": sum(r["repairs"] for r in rs),
                "chunks_failed": sum(r["chunks_failed"] for r in rs),
                "outputs_equal": (all(checked) and len(checked) == len(rs)) if checked else "",
                "max_logprob_diff": round(
                    max((r["logprob_diff"] for r in rs if r["logprob_diff"] != ""), default=0.0), 4
                ),
            })  # fmt: skip
    return out


COLUMNS = [
    ("n", "N"), ("mode", "mode"), ("ttft_p50_ms", "TTFT p50 ms"),
    ("ttft_last_ms", "TTFT last ms"), ("ttft_tail_ms", "tail ms"),
    ("vs_lone_cached", "/lone"), ("vs_local_same_n", "/local"), ("net_ms", "net ms"),
    ("net_vs_lone", "net/lone"), ("load_ms", "load ms"),
    ("loaded_tokens", "loaded"), ("computed_tokens", "computed"),
    ("pool_tx_over_prefix", "pool tx/prefix"),
    ("busiest_pool_over_prefix", "busiest pool/prefix"), ("repairs", "repairs"),
    ("chunks_failed", "failed"), ("outputs_equal", "= recompute"),
    ("max_logprob_diff", "max |dlogp|"),
]  # fmt: skip


def format_table(summary: Sequence[dict[str, Any]]) -> str:
    """The summary as a fixed-width text table."""
    heads = [h for _, h in COLUMNS]
    cells = [[str(r[k]) for k, _ in COLUMNS] for r in summary]
    widths = [max(len(h), *(len(row[i]) for row in cells)) for i, h in enumerate(heads)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(heads, widths, strict=True))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def plot(summary: Sequence[dict[str, Any]], path: Path, title: str) -> None:
    """TTFT of the last engine against N, one line per mode (log scale)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8.5, 4.5))
    for mode in MODES:
        pts = [r for r in summary if r["mode"] == mode]
        if not pts:
            continue
        ax.plot([r["n"] for r in pts], [r["ttft_last_ms"] for r in pts], marker="o", label=mode)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("engines N needing the prefix at once")
    ax.set_ylabel("time to first token, last engine (ms)")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m experiments.serving``."""
    p = argparse.ArgumentParser(
        prog="python -m experiments.serving", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--ns", default="1,2,4,8", help="engine counts (default 1,2,4,8)")
    p.add_argument("--modes", default=DEFAULT_MODES, help=f"comma-separated of {MODES}")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--prefix", type=int, default=1024, help="shared prompt tokens (x32)")
    p.add_argument("--suffix", type=int, default=16, help="each request's own tokens")
    p.add_argument("--link-mbit", type=float, help="link rate (default: calibrated)")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument(
        "--switch",
        choices=["auto", "refswitch", "bmv2"],
        default="auto",
        help="the P4 switch (auto: BMv2 where installed, else the reference target)",
    )
    p.add_argument("--model", type=Path, help="model directory (default: OUT/model, made)")
    p.add_argument("--corrupt-check", action="store_true", help="also the corrupted-chunk run")
    p.add_argument("--dead-pool-check", action="store_true", help="last, the pool node killed")
    p.add_argument(
        "--agentic",
        action="store_true",
        help="a task forking one branch per engine: static prefix pushed, pulled or neither",
    )
    p.add_argument(
        "--agentic-daemon",
        action="store_true",
        help="with --agentic, a fourth way last: the controller daemon sends the push",
    )
    p.add_argument(
        "--switch-kill-check",
        action="store_true",
        help="the switch killed while the engines load a prefix, then started again",
    )
    p.add_argument("--trace", type=Path, help="also replay this trace's first requests")
    p.add_argument("--trace-requests", type=int, default=30)
    p.add_argument("--trace-speed", type=float, default=1.0, help="arrival times / SPEED")
    args = p.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad or args.prefix % BLOCK_SIZE:
        p.error(f"unknown modes {bad}" if bad else f"--prefix must be a multiple of {BLOCK_SIZE}")
    if os.geteuid() != 0:
        p.error("needs root (Mininet)")
    args.out.mkdir(parents=True, exist_ok=True)
    model = make_model(args.model or args.out / "model")
    if args.link_mbit is None:
        us = calibrate(model, args.prefix + args.suffix)
        mbit = link_mbit(us)
        print(f"calibrated: prefill {us:.1f} us/token on one core -> links at {mbit:.1f} Mbit/s "
              f"(fetch/prefill per token {DEPLOYMENT.ratio:.4f}, as {DEPLOYMENT.model} on "
              f"{DEPLOYMENT.gpu} with a {DEPLOYMENT.nic_gbps:g} Gb/s NIC)", flush=True)  # fmt: skip
    else:
        us, mbit = float("nan"), args.link_mbit
    plan = Plan(
        ns=[int(x) for x in args.ns.split(",")],
        modes=modes,
        repeats=args.repeats,
        prefix=args.prefix,
        suffix=args.suffix,
    )
    trace = (
        TracePlan(args.trace, args.trace_requests, speed=args.trace_speed) if args.trace else None
    )
    from emulation.switches import BMv2Switch, RefSwitch, default_switch_class

    switch_cls = {"auto": None, "refswitch": RefSwitch, "bmv2": BMv2Switch}[args.switch]
    res = run(
        plan, model, mbit, args.out, switch_cls=switch_cls or default_switch_class(),
        corrupt_check=args.corrupt_check,
        dead_pool_check=args.dead_pool_check, trace=trace,
        switch_kill_check=args.switch_kill_check, prefill_us_per_token=us,
        agentic_check=args.agentic, agentic_daemon=args.agentic_daemon,
    )  # fmt: skip
    if res.get("error"):
        print(f"error: {res['error']}", flush=True)
    summary = summarize(res["points"], res["rows"])
    write_csv(args.out / "engines.csv", res["rows"])
    write_csv(args.out / "summary.csv", summary)
    meta = {**res["setup"], "prefill_us_per_token": us, "deployment": DEPLOYMENT.__dict__,
            "ratio": DEPLOYMENT.ratio, "shape": EMU_SHAPE, "plan": plan.__dict__,
            "corrupt": res.get("corrupt"), "dead_pool": res.get("dead_pool"),
            "switch_kill": res.get("switch_kill"), "agentic": res.get("agentic"),
            "elapsed_s": res["elapsed_s"],
            "error": res.get("error")}  # fmt: skip
    (args.out / "setup.json").write_text(json.dumps(meta, indent=1, default=str))
    title = (f"{max(plan.ns)} vLLM engines (CPU), {plan.prefix}-token shared prefix, links "
             f"{mbit:.0f} Mbit/s ({res['setup']['switch']})")  # fmt: skip
    plot(summary, args.out / "ttft.png", title)
    print(format_table(summary))
    if res.get("trace"):
        write_csv(args.out / "trace.csv", res["trace"])
        tsum = trace_summary(res["trace"])
        write_csv(args.out / "trace_summary.csv", tsum)
        for row in tsum:
            print("trace " + " ".join(f"{k}={v}" for k, v in row.items()))
    if res.get("corrupt"):
        print(f"corrupted chunk: {res['corrupt']}")
    if res.get("agentic"):
        for mode in ("neither", "pull", "push", "daemon"):
            if mode in res["agentic"]:
                print(f"agentic {mode}: {res['agentic'][mode]}")
    if res.get("switch_kill"):
        print(f"switch killed while loading: {res['switch_kill']}")
    if res.get("dead_pool"):
        print(f"dead pool: {res['dead_pool']}")
    print(f"wrote {args.out}/engines.csv, summary.csv, setup.json, ttft.png "
          f"({res['elapsed_s']:.0f} s)")  # fmt: skip
    return 1 if res.get("error") else 0


if __name__ == "__main__":
    raise SystemExit(main())
