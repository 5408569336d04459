"""The serving experiment's fault checks: each runs once on the engines after the sweep's points.

Functions:
    pool_tx_bytes: bytes the pool nodes have sent (the switch ports facing them).
    publish: host 1 computes a new prompt and publishes its blocks to the pool.
    switch_kill_check: the switch killed while the engines load a prefix through it.
    agentic_check: a shared static prefix pushed (by the experiment or the controller daemon),
        pulled or neither into every engine.
    dead_pool_check: the pool node gone while the engines ask for a prefix.
    corrupt_check: corrupted pool bytes never reach an engine.
"""

from __future__ import annotations

import contextlib
import math
import random
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from experiments.serving_engine import EngineError, Engines
from experiments.serving_plan import Plan, emu_kv_bytes_per_token, mode_options, tokens

AGENTIC_BRANCH_TOKENS = 64
"""Each branch's own (transient) tokens after the task's static prefix."""


def pool_tx_bytes(cluster: Any) -> int:
    """Bytes the cluster's pool nodes have sent (:func:`experiments.incast.pool_tx_bytes`)."""
    from experiments.incast import _pool_tx_bytes as tx

    return tx(cluster)


def publish(engines: Engines, plan: Plan, rnd: random.Random) -> tuple[list[int], dict[str, Any]]:
    """Host 1 computes a new prompt (nothing loaded) and publishes its blocks to the pool.

    Returns:
        The prompt and host 1's answer: the full prefill's output the checks compare with.
    """
    name = engines.names[0]
    prompt = tokens(rnd, plan.prefix + plan.suffix)
    ref = engines.ask(
        {name: {"cmd": "run", "prompt": prompt, "kvcast": {"load": False},
                "max_tokens": plan.max_tokens}}
    )[name]  # fmt: skip
    return prompt, ref


def switch_kill_check(
    cluster: Any, engines: Engines, plan: Plan, prefill_us_per_token: float | None = None
) -> dict[str, Any]:
    """The switch dies while the engines load a prefix through it; it is started again.

    Host 1 publishes a prefix; every engine drops its cache and gets the prompt through the
    connector (each loads the prefix from the pool, through the switch). Once the pool has sent
    an eighth of what they need, the switch process is killed (SIGKILL) and started again,
    re-programmed by the experiment (its controller here). Twice: back after half a second
    (``short``: the fetches wait and finish), and back after five seconds with the requests
    carrying a load budget of ``prefill_us_per_token`` per token (``long``: a load may take what
    recomputing would, then the engine computes what it lacks). Each engine must end with the
    full prefill's output. Then every engine gets the prompt once more, through the restarted
    switch.
    """
    names = engines.names
    prompt, ref = publish(engines, plan, random.Random(plan.seed - 13))
    need = len(names) * plan.prefix * emu_kv_bytes_per_token()

    def outage(down_s: float, kvcast: dict[str, Any]) -> dict[str, Any]:
        events: dict[str, Any] = {}

        def kill() -> None:
            start = pool_tx_bytes(cluster)
            deadline = time.monotonic() + 60
            while pool_tx_bytes(cluster) - start < need // 8 and time.monotonic() < deadline:
                time.sleep(0.005)
            events["pool_sent_at_kill"] = round((pool_tx_bytes(cluster) - start) / need, 3)
            cluster.switch.kill()
            killed = time.monotonic()
            time.sleep(down_s)
            cluster.restart_switch()
            events["down_s"] = round(time.monotonic() - killed, 3)

        engines.ask({n: {"cmd": "reset"} for n in names})
        killer = threading.Thread(target=kill, name="switch-kill")
        killer.start()
        start_at = time.time() + 1.0
        try:
            recs = engines.ask(
                {n: {"cmd": "run", "prompt": prompt, "kvcast": kvcast,
                     "max_tokens": plan.max_tokens, "start_at": start_at} for n in names},
                timeout_s=600,
            )  # fmt: skip
        finally:
            killer.join()
        return {
            **events,
            "ttft_last_ms": round(max(r["ttft_s"] for r in recs.values()) * 1e3, 1),
            "loaded_tokens": [r["loaded_tokens"] for r in recs.values()],
            "computed_tokens": [r["computed_tokens"] for r in recs.values()],
            "same_output": all(r["tokens"] == ref["tokens"] for r in recs.values()),
        }

    out: dict[str, Any] = {"short": outage(0.5, {"save": False})}
    if prefill_us_per_token is not None and math.isfinite(prefill_us_per_token):
        budget = {"save": False, "budget_us_per_token": prefill_us_per_token}
        out["long"] = {"budget_us_per_token": prefill_us_per_token, **outage(5.0, budget)}
    engines.ask({n: {"cmd": "reset"} for n in names})
    after = engines.ask(
        {n: {"cmd": "run", "prompt": prompt, "kvcast": {"save": False},
             "max_tokens": plan.max_tokens} for n in names}, timeout_s=600,
    )  # fmt: skip
    out["after_restart"] = {
        "loaded_tokens": [r["loaded_tokens"] for r in after.values()],
        "same_output": all(r["tokens"] == ref["tokens"] for r in after.values()),
    }
    return out


def _served_pushes(engines: Engines, timeout_s: float) -> dict[str, dict[str, Any]]:
    """Waits until every engine has served one completions request over HTTP; returns each."""
    got: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout_s
    while len(got) < len(engines.names):
        if time.monotonic() > deadline:
            missing = sorted(set(engines.names) - set(got))
            raise EngineError(f"no push reached {missing} in {timeout_s:.0f} s")
        time.sleep(0.05)
        for name, rec in engines.ask({n: {"cmd": "served"} for n in engines.names}).items():
            if rec["runs"] and name not in got:
                got[name] = rec["runs"][0]
    return got


def agentic_check(
    cluster: Any,
    engines: Engines,
    plan: Plan,
    daemon: Callable[[], AbstractContextManager[Callable[[list[int]], None]]] | None = None,
) -> dict[str, Any]:
    """A task forks one branch per engine; the static prefix pushed, pulled, or neither.

    The task's static prefix (``plan.prefix`` tokens: its system prompt and tool definitions,
    declared static with ``static_tokens``) was published once by host 1. Each branch is that
    prefix plus ``AGENTIC_BRANCH_TOKENS`` tokens of its own; branch i goes to engine i, all at
    one instant, three ways (four with ``daemon``), every engine's cache dropped first:

    - ``neither``: no connector; every branch computes the whole prompt;
    - ``pull``: each branch loads the prefix through the switch when it arrives (N pool reads
      at once: the incast);
    - ``push``: before the branches arrive, the static prefix is pushed: one pool read,
      multicast by the switch to every engine of the group (one engine leads the group fetch,
      the others take its stream), landed in each engine's own prefix cache; the experiment
      plays the controller's part (the push planner's order: this prefix, every host of the
      group). The branches then find it local;
    - ``daemon`` (with ``daemon``): as ``push``, but the controller daemon sends it: ``daemon()``
      runs the daemon (its engine pusher, ``controlplane.pusher``) and gives a function that
      registers the prefix (``POST /v1/static``); the daemon's next tick sends each engine a
      completions request over HTTP (``experiments.serving_engine --http``) in one multicast
      group it makes. The push's time runs from the registration to the last engine's answer.

    Per mode: each branch's TTFT from the instant the branches arrive and the task's completion
    (its last branch's end), tokens loaded, computed and found local, the pool's egress; for
    ``push`` and ``daemon`` also the push's own time and egress. Every branch's output is
    compared with the ``neither`` run's.
    """
    names = engines.names
    rnd = random.Random(plan.seed - 17)
    static = tokens(rnd, plan.prefix)
    branches = {n: static + tokens(rnd, AGENTIC_BRANCH_TOKENS) for n in names}
    engines.ask({n: {"cmd": "reset"} for n in names})
    engines.ask(
        {names[0]: {"cmd": "run", "prompt": static + tokens(rnd, 16), "max_tokens": 1,
                    "kvcast": {"load": False, "static_tokens": plan.prefix}}}
    )  # fmt: skip
    out: dict[str, Any] = {"branches": len(names), "static_tokens": plan.prefix}
    reference: dict[str, list[int]] = {}
    group = 0x7F00
    modes = ["neither", "pull", "push"] + (["daemon"] if daemon is not None else [])
    with contextlib.ExitStack() as running:  # the daemon, once started, runs to the end
        for mode in modes:
            engines.ask({n: {"cmd": "reset"} for n in names})
            row: dict[str, Any] = {}
            if mode == "push":
                cluster.add_group(group, names)
                tx0, t0 = pool_tx_bytes(cluster), time.monotonic()
                warm = engines.ask(
                    {n: {"cmd": "run", "prompt": static, "max_tokens": 1,
                         "kvcast": {**mode_options("multicast", i, group), "save": False}}
                     for i, n in enumerate(names)}
                )  # fmt: skip
                row["push_s"] = round(time.monotonic() - t0, 3)
                row["push_pool_bytes"] = pool_tx_bytes(cluster) - tx0
                row["push_loaded_tokens"] = [r["loaded_tokens"] for r in warm.values()]
                cluster.remove_group(group)
            elif mode == "daemon":
                assert daemon is not None
                register = running.enter_context(daemon())
                tx0, t0 = pool_tx_bytes(cluster), time.time()
                register(static)
                warm = _served_pushes(engines, 300.0)
                row["push_s"] = round(max(r["started"] + r["e2e_s"] for r in warm.values()) - t0, 3)
                row["push_pool_bytes"] = pool_tx_bytes(cluster) - tx0
                row["push_loaded_tokens"] = [warm[n]["loaded_tokens"] for n in names]
            opts = {"load": False, "save": False} if mode == "neither" else {"save": False}
            tx0 = pool_tx_bytes(cluster)
            start_at = time.time() + 1.0
            recs = engines.ask(
                {n: {"cmd": "run", "prompt": branches[n], "kvcast": opts,
                     "max_tokens": plan.max_tokens, "start_at": start_at} for n in names},
                timeout_s=600,
            )  # fmt: skip
            if mode == "neither":
                reference = {n: r["tokens"] for n, r in recs.items()}
            ttfts = [r["ttft_s"] for r in recs.values()]
            row.update(
                ttft_p50_ms=round(statistics.median(ttfts) * 1e3, 1),
                ttft_max_ms=round(max(ttfts) * 1e3, 1),
                task_ms=round(max(r["started"] + r["e2e_s"] for r in recs.values()) * 1e3
                              - start_at * 1e3, 1),
                pool_bytes=pool_tx_bytes(cluster) - tx0,
                loaded_tokens=[r["loaded_tokens"] for r in recs.values()],
                local_tokens=[r["cached_tokens"] - r["loaded_tokens"] for r in recs.values()],
                computed_tokens=[r["computed_tokens"] for r in recs.values()],
                same_output=all(r["tokens"] == reference[n] for n, r in recs.items()),
            )  # fmt: skip
            out[mode] = row
    return out


def dead_pool_check(engines: Engines, plan: Plan, pool_ip: str) -> dict[str, Any]:
    """The pool node dies after publishing: every engine computes, right, and how much later.

    Host 1 publishes a prefix; the pool node is killed (SIGKILL: its Mooncake master, started
    by it, dies with it); every engine drops its own cache and gets the prompt, once asking the
    connector to load (the pool's existence check and GETs now fail) and once not (a plain
    prefill); then a request that needs no pool, to show the engine still serves.
    """
    names = engines.names
    rnd = random.Random(plan.seed - 11)
    prompt, ref = publish(engines, plan, rnd)
    killed = subprocess.run(
        [
            "pkill",
            "-KILL",
            "-f",
            f"poolnode --backend mooncake --start-master --local-hostname {pool_ip} ",
        ],
        capture_output=True,
    ).returncode
    time.sleep(1.0)
    out: dict[str, Any] = {"pool_killed": killed == 0}
    for label, opts in (("through_connector", {"save": False}),
                        ("plain_prefill", {"load": False, "save": False})):  # fmt: skip
        engines.ask({n: {"cmd": "reset"} for n in names})
        start_at = time.time() + 1.0
        recs = engines.ask(
            {n: {"cmd": "run", "prompt": prompt, "kvcast": opts, "max_tokens": plan.max_tokens,
                 "start_at": start_at} for n in names}, timeout_s=600,
        )  # fmt: skip
        out[label] = {
            "ttft_last_ms": round(max(r["ttft_s"] for r in recs.values()) * 1e3, 1),
            "loaded_tokens": sum(r["loaded_tokens"] for r in recs.values()),
            "computed_tokens": min(r["computed_tokens"] for r in recs.values()),
            "same_output": all(r["tokens"] == ref["tokens"] for r in recs.values()),
        }  # fmt: skip
    after = engines.ask(
        {n: {"cmd": "run", "prompt": tokens(rnd, 64), "kvcast": {"load": False, "save": False},
             "max_tokens": 2} for n in names}
    )  # fmt: skip
    out["engines_serve_after"] = all(len(r["tokens"]) == 2 for r in after.values())
    out["stall_ms"] = round(
        out["through_connector"]["ttft_last_ms"] - out["plain_prefill"]["ttft_last_ms"], 1
    )
    return out


def corrupt_check(engines: Engines, plan: Plan) -> dict[str, Any]:
    """A chunk whose pool copy went bad (MAC keys on): the engine recomputes, same output.

    Host 1 publishes a prefix; block 3's bytes in the pool are replaced by other bytes of the
    same length (the pool node's CRC is then valid for the wrong bytes: only the MAC catches
    it); host 1 drops its cache and runs the prompt again through the connector.
    """
    name = engines.names[0]
    prompt, ref = publish(engines, plan, random.Random(plan.seed - 7))
    tenant, key = ref["saved"][3]
    with tempfile.TemporaryDirectory(prefix="kvcast-corrupt-") as tmp:
        good = Path(tmp) / "good.bin"
        engines.ask({name: {"cmd": "read", "keys": [[tenant, key]], "path": str(good)}})
        data = bytearray(good.read_bytes())
        for i in range(0, len(data), 64):
            data[i] ^= 0x5A
        bad = Path(tmp) / "bad.bin"
        bad.write_bytes(bytes(data))
        engines.ask({name: {"cmd": "corrupt", "tenant": tenant, "key": key, "path": str(bad)}})
    engines.ask({name: {"cmd": "reset"}})
    got = engines.ask(
        {name: {"cmd": "run", "prompt": prompt, "kvcast": {"save": False},
                "max_tokens": plan.max_tokens}}
    )[name]  # fmt: skip
    conn = got["connector"]
    return {
        "corrupted_block": 3,
        "loaded_tokens": got["loaded_tokens"],
        "computed_tokens": got["computed_tokens"],
        "chunks_failed": int(conn.get("chunks_failed", 0)),
        "same_output": got["tokens"] == ref["tokens"],
        "first_logprob_diff": abs(got["first_logprob"] - ref["first_logprob"]),
    }
