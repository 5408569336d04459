"""``python -m hostagent.agent``: the host agent's command line, one fetch per run or a batch.

``python -m hostagent.agent fetch ...`` fetches one chunk in this host (or network namespace)
and prints ONE JSON line describing what happened, for the experiments to collect. It binds its
UDP socket first (``--bind-port``, ``AGENT_PORT`` by default, where the switch delivers
multicast replicas), then sleeps until ``--start-at`` (a wall-clock epoch, so every host of an
experiment starts together) and fetches in one of four modes:

``unicast-pool``
    GETs to the service address (the switch VIP) with ``NOCACHE``: the switch forwards them to
    the key's pool node, which answers several fragments per DATA, by unicast to this host.
``unicast-switch``
    one GET per fragment to the service address: hits come from switch SRAM (unicast); misses
    go on to the pool node behind it.
``leader``
    the GETs name multicast group ``--group``: the switch replicates every reply to all members
    (this host included). ``--via pool`` asks the pool (``NOCACHE`` range GETs: one
    multi-fragment stream from the pool, replicated by the switch); ``--via switch`` asks the
    switch SRAM (one GET per fragment, each hit multicast).
``follower``
    sends nothing at first and takes the group's replicas; when the stream stalls
    (``--stall``), it repairs its gaps by unicast: switch first, then the pool directly.

In every mode a stalled path falls back to the pool node directly (``--pool``) and each
fragment's CRC is checked before it is written. With ``--verify-seed`` the whole chunk is
compared with the synthetic pattern the pool preloaded (``kvcast.synthetic``).

With ``--report-url http://IP:PORT`` the agent also tells the controller about the access
(``POST /v1/reports``, one record: ``kvcast.reports``): the record is queued when the fetch
ends and posted by a background thread; before exiting, the agent waits at most
``--report-timeout`` for it to go out. A controller that is down or slow never changes the
fetch's outcome or exit status; the JSON line's ``reports`` field says what happened to the
record (``sent``, ``dropped``, ``rejected``, ``last_error``).

``python -m hostagent.agent batch`` is the same agent kept alive: it reads ``fetch`` argument
lines (shell-quoted, the words after ``fetch``) from standard input, runs each in turn and prints
its JSON line, until end of input. An experiment that runs many points starts one per host and
pays the interpreter's and torch's start-up once instead of once per fetch. A line that does not
parse, or a fetch that cannot start, gives a JSON line with ``ok: false`` and ``error``; the
batch goes on. With ``--start-at stdin`` in a line, the start instant is the next input line.

Exit status: 0 when the chunk is complete (and verified, if asked), 1 when the fetch failed or
the bytes differ, 2 when the agent could not start (bad arguments, port in use).

Constants:
    AGENT_PORT: re-exported from ``kvcast.ports``.

Classes:
    AgentError: the fetch cannot run as asked (a mode without its group or service address).

Functions:
    build_parser: the argument parser.
    run_fetch: one fetch from parsed arguments, as the JSON record.
    run_batch: fetch after fetch from argument lines on a text stream.
    main: parse, run, print, return the exit status.
"""

from __future__ import annotations

import argparse
import json
import shlex
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import torch

from hostagent.fetch import FetchClient
from kvcast import p4constants as c
from kvcast.fetch import MIN_RETRY_TIMEOUT_S, FetchError, FetchReport
from kvcast.integrity import load_tenant_keys
from kvcast.kvp import DEFAULT_MTU
from kvcast.ports import AGENT_PORT
from kvcast.reports import HttpReporter, ReportSink
from kvcast.synthetic import parse_key, synthetic_chunk

__all__ = ["AGENT_PORT", "MODES", "AgentError", "build_parser", "main", "run_batch", "run_fetch"]

MODES = ("unicast-pool", "unicast-switch", "leader", "follower")


class AgentError(RuntimeError):
    """The agent cannot run the fetch as asked (e.g. a mode without its group)."""


def _start_at(text: str) -> float | str:
    """``--start-at``: a float epoch, or ``stdin``."""
    return text if text == "stdin" else float(text)


def _tenant(text: str) -> int:
    try:
        tenant = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"tenant {text!r} is not a number") from None
    if not 0 <= tenant <= 0xFFFF:
        raise argparse.ArgumentTypeError(f"tenant {text!r} is not a 16-bit unsigned integer")
    return tenant


def _key(text: str) -> int:
    try:
        return parse_key(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _position(text: str) -> int:
    try:
        position = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"position {text!r} is not a number") from None
    if position < 0:
        raise argparse.ArgumentTypeError(f"position {text!r} is negative")
    return position


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m hostagent.agent`` argument parser (subcommand ``fetch``)."""
    parser = argparse.ArgumentParser(
        prog="python -m hostagent.agent", description=__doc__.splitlines()[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser(
        "batch", help="read fetch argument lines from stdin, print one JSON line for each"
    )
    _add_fetch_arguments(sub.add_parser("fetch", help="fetch one chunk and print one JSON line"))
    return parser


def _add_fetch_arguments(f: argparse.ArgumentParser) -> None:
    """The ``fetch`` subcommand's arguments."""
    f.add_argument("--tenant", type=_tenant, required=True, help="tenant id (16 bits)")
    f.add_argument("--key", type=_key, required=True, help="chunk key (decimal or 0x hex)")
    f.add_argument("--nbytes", type=int, required=True, help="chunk length in bytes")
    f.add_argument("--service", help="service address (switch VIP); KVP_UDP_PORT")
    f.add_argument("--service-port", type=int, default=c.KVP_UDP_PORT)
    f.add_argument("--pool", help="pool node address for the direct fallback; KVP_UDP_PORT")
    f.add_argument("--pool-port", type=int, default=c.KVP_UDP_PORT)
    f.add_argument(
        "--trust-pool",
        action="append",
        default=[],
        metavar="ADDR",
        help="another pool node the switch may forward misses to (its answers come from "
        "ADDR:KVP_UDP_PORT); repeat for each. The agent takes datagrams only from --service, "
        "--pool and these",
    )
    f.add_argument("--mode", choices=MODES, default="unicast-pool")
    f.add_argument(
        "--via",
        choices=("pool", "switch"),
        default="pool",
        help="leader: stream from the pool (NOCACHE range GETs) or from switch SRAM",
    )
    f.add_argument("--group", type=int, default=0, help="multicast group (leader, follower)")
    f.add_argument("--bind", default="0.0.0.0", help="local address to bind")
    f.add_argument("--bind-port", type=int, default=AGENT_PORT, help="local UDP port")
    f.add_argument(
        "--start-at",
        type=_start_at,
        help="wall-clock epoch seconds to start at (sleep until then), or 'stdin': read that "
        "number from a line on standard input once the socket is bound (a driver starting many "
        "agents waits for every 'agent ready' and then gives them all one instant)",
    )
    f.add_argument("--timeout", type=float, default=30.0, help="bound on the whole fetch, s")
    f.add_argument("--get-timeout", type=float, default=0.02, help="first GET timeout, s")
    f.add_argument("--max-get-timeout", type=float, default=0.25, help="backed-off cap, s")
    f.add_argument(
        "--min-retry-timeout",
        type=float,
        default=MIN_RETRY_TIMEOUT_S,
        help="floor of a retry's timeout (a retry waits the measured srtt + 4 rttvar), s",
    )
    f.add_argument("--max-retries", type=int, default=3, help="retries per path")
    f.add_argument("--window", type=int, default=32, help="GETs outstanding")
    f.add_argument(
        "--frags-per-get",
        type=int,
        help="fragments per GET (default: 1 to the switch, what one DATA carries to the pool)",
    )
    f.add_argument("--mtu", type=int, default=DEFAULT_MTU)
    f.add_argument("--stall", type=float, default=0.5, help="follower: silence before repair, s")
    f.add_argument("--first-wait", type=float, help="follower: wait for the first fragment, s")
    f.add_argument("--verify-seed", type=int, help="compare with the synthetic chunk of SEED")
    f.add_argument(
        "--tenant-keys",
        type=Path,
        help="file of tenant:hexkey lines: chunks of these tenants must match their keyed MAC",
    )
    f.add_argument("--name", default=socket.gethostname(), help="host label in the output")
    f.add_argument(
        "--report-url",
        help="controller API (http://IP:PORT): report the access with POST /v1/reports",
    )
    f.add_argument("--report-host", help="this host's name in the report (default: --name)")
    f.add_argument(
        "--report-timeout",
        type=float,
        default=1.0,
        help="how long to wait at exit for the report to be posted, s",
    )
    f.add_argument("--parent", type=_key, help="report: key of the previous block of the chain")
    f.add_argument(
        "--position", type=_position, help="report: the block's index in its chain (0 = first)"
    )


def _client(args: argparse.Namespace, reporter: ReportSink | None = None) -> FetchClient:
    mode = args.mode
    if mode in ("leader", "follower") and args.group == 0:
        raise AgentError(f"--mode {mode} needs --group G (G != 0)")
    if mode != "follower" and not args.service:
        raise AgentError(f"--mode {mode} needs --service (the switch VIP)")
    if mode == "follower" and not (args.service or args.pool):
        raise AgentError("--mode follower needs --service or --pool to repair from")
    via_switch = mode == "unicast-switch" or (mode == "leader" and args.via == "switch")
    nocache = mode == "unicast-pool" or (mode == "leader" and args.via == "pool")
    frags_per_get = args.frags_per_get or (1 if via_switch else None)
    return FetchClient(
        (args.service, args.service_port) if args.service else None,
        (args.pool, args.pool_port) if args.pool else None,
        window=args.window,
        frags_per_get=frags_per_get,
        mtu=args.mtu,
        timeout_s=args.get_timeout,
        max_timeout_s=max(args.max_get_timeout, args.get_timeout),
        min_retry_timeout_s=min(
            args.min_retry_timeout, max(args.max_get_timeout, args.get_timeout)
        ),
        max_retries=args.max_retries,
        deadline_s=args.timeout,
        group=args.group if mode in ("leader", "follower") else 0,
        nocache=nocache,
        bind=(args.bind, args.bind_port),
        reporter=reporter,
        report_host=args.report_host or args.name,
        mac_keys=load_tenant_keys(args.tenant_keys) if args.tenant_keys else None,
        pool_addrs=[(addr, c.KVP_UDP_PORT) for addr in args.trust_pool],
    )


def _record(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "host": args.name,
        "mode": args.mode,
        "via": args.via if args.mode == "leader" else None,
        "group": args.group,
        "tenant": args.tenant,
        "key": f"{args.key:#x}",
        "nbytes": args.nbytes,
        "start_at": args.start_at,
    }


def run_fetch(args: argparse.Namespace) -> dict[str, Any]:
    """Runs one fetch as the parsed arguments say.

    Args:
        args: ``build_parser().parse_args(["fetch", ...])``.

    Returns:
        The JSON record: ``host, mode, ok, outcome, reason, verified, t_start, t_done,
        completion_s`` (``t_done - start_at``, or ``- t_start`` without ``--start-at``),
        ``nbytes, frags_switch, frags_pool, frags_stream, repairs, retries, crc_failures``, the
        rest of the fetch report, and ``reports`` (the reporter's counters, or None without
        ``--report-url``).

    Raises:
        AgentError: the mode lacks what it needs (group, service address).
        FetchError: the chunk length is unusable.
        ReportError: ``--report-url`` is not ``http://HOST:PORT``.
        OSError: the socket cannot be bound.
    """
    reporter = HttpReporter(args.report_url) if args.report_url else None
    try:
        out = _fetch(args, reporter)
    finally:
        if reporter is not None:
            reporter.close(args.report_timeout)
    out["reports"] = reporter.stats().as_dict() if reporter is not None else None
    return out


def _fetch(args: argparse.Namespace, reporter: ReportSink | None) -> dict[str, Any]:
    """The fetch of ``run_fetch``, handing its access record to ``reporter``."""
    out = _record(args)
    dst = torch.empty(args.nbytes, dtype=torch.uint8)
    expected = (
        synthetic_chunk(args.tenant, args.key, args.nbytes, args.verify_seed)
        if args.verify_seed is not None
        else None
    )
    with _client(args, reporter) as client:
        out["bound"] = f"{client.address[0]}:{client.address[1]}"
        print(f"agent ready {out['host']} bound={out['bound']}", file=sys.stderr, flush=True)
        if args.start_at == "stdin":
            args.start_at = float(sys.stdin.readline())
            out["start_at"] = args.start_at
        if args.start_at is not None:
            time.sleep(max(0.0, args.start_at - time.time()))
        t_start = time.time()
        report: FetchReport
        if args.mode == "follower":
            report = client.follow(
                args.tenant,
                args.key,
                dst,
                args.nbytes,
                stall_s=args.stall,
                first_wait_s=args.first_wait,
                parent=args.parent,
                position=args.position,
            )
        else:
            report = client.fetch(
                args.tenant, args.key, dst, args.nbytes, parent=args.parent, position=args.position
            )
        t_done = time.time()
    verified: bool | None = None
    if expected is not None:
        verified = report.ok and dst.numpy().tobytes() == expected
    rep = report.as_dict()
    out.update(
        ok=report.ok,
        outcome=rep["outcome"],
        reason=rep["reason"],
        verified=verified,
        t_start=t_start,
        t_done=t_done,
        late_s=max(0.0, t_start - args.start_at) if args.start_at is not None else 0.0,
        completion_s=t_done - (args.start_at if args.start_at is not None else t_start),
        frags_switch=report.frags_hit,
        frag_count=report.frag_count,
        frags_pool=report.frags_pool,
        frags_stream=report.frags_stream,
        repairs=report.repairs,
        stalled=report.stalled,
        retries=report.retries,
        timeouts=report.timeouts,
        crc_failures=report.crc_failures,
        gets_sent=report.gets_sent,
        duplicates=report.duplicates,
        ignored=report.ignored,
        invalid=report.invalid,
        nacks=report.nacks,
        fell_back=report.fell_back,
        duration_s=report.duration_s,
        srtt_s=round(report.srtt_s, 6),
        rto_s=round(report.rto_s, 6),
        fast_retransmits=report.fast_retransmits,
        tail_probes=report.tail_probes,
    )
    return out


class _ArgumentError(ValueError):
    """A batch line that argparse refuses."""


class _BatchParser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse would exit the whole batch
        raise _ArgumentError(message)


def _fetch_parser() -> argparse.ArgumentParser:
    """A ``fetch`` argument parser that raises instead of exiting."""
    parser = _BatchParser(prog="python -m hostagent.agent batch", add_help=False)
    _add_fetch_arguments(parser)
    return parser


def _fetch_or_error(args: argparse.Namespace) -> tuple[dict[str, Any], bool]:
    """:func:`run_fetch`, or the error record of a fetch that could not start (and False)."""
    try:
        return run_fetch(args), True
    except (AgentError, FetchError, OSError, ValueError) as exc:
        record = _record(args)
        record.update(ok=False, outcome="error", error=f"{type(exc).__name__}: {exc}")
        return record, False


def run_batch(lines: TextIO, out: TextIO) -> int:
    """Runs one fetch per argument line of ``lines`` and writes its JSON line to ``out``.

    Args:
        lines: the ``fetch`` arguments, one shell-quoted line per fetch; blank lines are
            skipped. A fetch with ``--start-at stdin`` reads its start instant from the next
            line of ``sys.stdin``, so ``lines`` is normally ``sys.stdin``.
        out: where the JSON lines go (flushed after each).

    Returns:
        How many fetches did not end complete (and verified when asked), bad lines included.
    """
    parser = _fetch_parser()
    failed = 0
    for line in iter(lines.readline, ""):
        if not line.strip():
            continue
        try:
            args = parser.parse_args(shlex.split(line))  # shlex: ValueError on bad quoting
        except ValueError as exc:
            record: dict[str, Any] = {"ok": False, "outcome": "error", "error": f"bad line: {exc}"}
        else:
            record, _ = _fetch_or_error(args)
        failed += not (record["ok"] and record.get("verified") is not False)
        print(json.dumps(record), file=out, flush=True)
    return failed


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line.

    Args:
        argv: arguments (default: ``sys.argv[1:]``).

    Returns:
        0: complete (and verified when asked); 1: failed or wrong bytes (``batch``: any fetch
        did not end complete); 2: could not start.
    """
    args = build_parser().parse_args(argv)
    if args.command == "batch":
        return 1 if run_batch(sys.stdin, sys.stdout) else 0
    record, started = _fetch_or_error(args)
    print(json.dumps(record), flush=True)
    if not started:
        return 2
    return 0 if record["ok"] and record["verified"] is not False else 1


if __name__ == "__main__":
    sys.exit(main())
