"""The per-host agent of a trace replay (``python -m experiments.trace_replay agent ...``).

One process per GPU host, in the host's namespace: it reads one request per stdin line, fetches
its prefix blocks (switch first, the pool behind it, then the pool directly), checks them against
their synthetic bytes, reports every block to the controller and writes one result per line.

Functions:
    agent_main: the agent's command line and loop.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from experiments.trace_replay.plan import DEFAULT_BLOCK_BYTES, SEED, TENANT
from kvcast import p4constants as c
from kvcast.kvp import DEFAULT_MTU, frag_count
from kvcast.reports import AccessReport, ReportClient


def agent_main(argv: Sequence[str]) -> int:
    """The per-host agent: one JSON request per stdin line, one JSON result per stdout line.

    Each input line is ``{"req": i, "at": epoch, "fetch": [hex keys], "computed": [hex]}``.
    The agent fetches the ``fetch`` blocks in order (switch first, the pool behind it, then the
    pool directly), verifies each against its synthetic bytes, reports every block to the
    controller and prints ``{"req", "host", "ok", "fetch_s", "blocks", ...}``. It prints
    ``agent ready`` on stderr once its socket is bound, and exits at end of input.

    Args:
        argv: the agent's arguments (see ``--help``).

    Returns:
        0 at end of input; 2 when it could not start.
    """
    ap = argparse.ArgumentParser(prog="python -m experiments.trace_replay agent")
    ap.add_argument("--name", required=True, help="host name (as configured in the controller)")
    ap.add_argument("--service", required=True, help="switch VIP")
    ap.add_argument("--pool", required=True, help="pool node data-plane address (last resort)")
    ap.add_argument("--report-url", required=True, help="controller report API base URL")
    ap.add_argument("--tenant", type=int, default=TENANT)
    ap.add_argument("--block-bytes", type=int, default=DEFAULT_BLOCK_BYTES)
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--get-timeout", type=float, default=0.2)
    ap.add_argument("--max-get-timeout", type=float, default=1.0)
    ap.add_argument("--deadline", type=float, default=30.0)
    ap.add_argument("--mtu", type=int, default=DEFAULT_MTU, help="IP MTU of the host's link")
    args = ap.parse_args(argv)

    import torch

    from hostagent.fetch import FetchClient
    from kvcast.synthetic import synthetic_chunk

    try:
        client = FetchClient(
            (args.service, c.KVP_UDP_PORT),
            (args.pool, c.KVP_UDP_PORT),
            timeout_s=args.get_timeout,
            max_timeout_s=max(args.get_timeout, args.max_get_timeout),
            max_retries=3,
            deadline_s=args.deadline,
            mtu=args.mtu,
        )
    except (OSError, ValueError) as exc:
        print(f"agent {args.name}: cannot start: {exc}", file=sys.stderr, flush=True)
        return 2
    reporter = ReportClient(args.report_url, timeout_s=5.0)
    dst = torch.empty(args.block_bytes, dtype=torch.uint8)
    nfrags = frag_count(args.block_bytes)
    print(f"agent ready {args.name}", file=sys.stderr, flush=True)
    with client:
        for line in sys.stdin:
            if not line.strip():
                continue
            job = json.loads(line)
            fetch = [int(k, 16) for k in job["fetch"]]
            computed = [int(k, 16) for k in job["computed"]]
            time.sleep(max(0.0, float(job["at"]) - time.time()))
            t_start = time.time()
            reports: list[AccessReport] = []
            row: dict[str, Any] = {
                "req": job["req"],
                "host": args.name,
                "at": job["at"],
                "t_start": t_start,
                "fetched": len(fetch),
                "computed": len(computed),
                "blocks_hit": 0,
                "frags_hit": 0,
                "frags_pool": 0,
                "failed": 0,
                "wrong_bytes": 0,
                "retries": 0,
                "fell_back": 0,
            }
            parent: int | None = None
            for pos, key in enumerate(fetch):
                report = client.fetch(args.tenant, key, dst, args.block_bytes)
                hit = report.ok and report.frags_hit == nfrags
                row["blocks_hit"] += int(hit)
                row["frags_hit"] += report.frags_hit
                row["frags_pool"] += report.frags_pool
                row["retries"] += report.retries
                row["fell_back"] += int(report.fell_back)
                if not report.ok:
                    row["failed"] += 1
                elif dst.numpy().tobytes() != synthetic_chunk(
                    args.tenant, key, args.block_bytes, args.seed
                ):
                    row["wrong_bytes"] += 1
                reports.append(
                    AccessReport(
                        args.tenant, key, args.block_bytes, args.name, time.time(), hit, parent, pos
                    )
                )
                parent = key
            t_done = time.time()
            for pos, key in enumerate(computed, start=len(fetch)):
                reports.append(
                    AccessReport(
                        args.tenant, key, args.block_bytes, args.name, t_done, None, parent, pos
                    )
                )
                parent = key
            code, answer = reporter.post(reports)
            row.update(
                t_done=t_done,
                fetch_s=t_done - t_start,
                queued_s=max(0.0, t_start - float(job["at"])),
                ok=row["failed"] == 0 and row["wrong_bytes"] == 0,
                report_code=code,
                report_error=answer.get("error", ""),
            )
            print(json.dumps(row), flush=True)
    return 0
