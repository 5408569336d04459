"""``python -m controlplane`` (``kvcast-controller``): run, inspect and check the controller.

Commands:

``run --config FILE``
    runs the controller daemon (JSON-lines logs on stderr) until SIGTERM or SIGINT, then stops
    cleanly and exits 0; exits 2 when it cannot start (bad configuration, address in use).
``status [--config FILE | --url URL] [--metrics]``
    prints the running daemon's ``GET /v1/status`` as JSON (and with ``--metrics`` its
    ``kvcast_controller_*`` Prometheus samples); exits 1 when it cannot be reached.
``validate-config FILE``
    checks a configuration file and prints a summary; exits 2 with the first problem, named by
    its path in the file.

Functions:
    build_parser: the argument parser.
    main: parse, run the command, return the exit status.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence

from controlplane.config import load_config
from controlplane.configspec import DaemonConfig, ListenAddress
from controlplane.errors import ControlPlaneError
from kvcast.reports import ReportClient

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m controlplane`` argument parser."""
    parser = argparse.ArgumentParser(
        prog="kvcast-controller", description="kvcast controller daemon"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the controller daemon")
    run.add_argument("--config", required=True, help="YAML configuration file")
    run.add_argument("--log-level", help="override the configuration's log_level")
    status = sub.add_parser("status", help="print a running daemon's status")
    where = status.add_mutually_exclusive_group(required=True)
    where.add_argument("--config", help="the daemon's configuration (for its report API address)")
    where.add_argument("--url", help="report API base URL, e.g. http://127.0.0.1:9109")
    status.add_argument("--metrics-url", help="metrics URL (default: from --config)")
    status.add_argument("--metrics", action="store_true", help="also print the metrics")
    status.add_argument("--timeout", type=float, default=3.0, help="seconds per request")
    check = sub.add_parser("validate-config", help="check a configuration file")
    check.add_argument("file", help="YAML configuration file")
    return parser


def _local(listen: ListenAddress) -> str:
    host = "127.0.0.1" if listen.host in ("0.0.0.0", "") else listen.host
    return f"http://{host}:{listen.port}"


def _summary(config: DaemonConfig) -> str:
    lines = [f"configuration {config.source} is valid:"]
    for s in config.switches:
        dc = s.device_config or "none"
        lines.append(
            f"  switch {s.name}: {s.address} ({s.target.value}) device {s.device_id} "
            f"election {s.election_id} device_config {dc}; {len(config.hosts_of(s.name))} hosts, "
            f"{len(config.pools_of(s.name))} pools"
        )
    lines.append(
        f"  policy {config.policy.name} {dict(config.policy.params)}"
        f"{' (dry run)' if config.policy.dry_run else ''}; "
        f"SRAM budget {config.sram_budget_bytes} B; tick {config.tick_s} s; "
        f"sketch window {config.sketch.window_s} s, threshold {config.sketch.threshold}"
    )
    metrics = config.metrics if config.metrics is not None else "off"
    lines.append(f"  report API {config.report_api.listen}; metrics {metrics}")
    return "\n".join(lines)


def _load(path: str) -> DaemonConfig | None:
    """The configuration in ``path``, or None after saying on stderr why it is not valid."""
    try:
        return load_config(path)
    except ControlPlaneError as exc:
        print(f"kvcast-controller: {exc}", file=sys.stderr)
        return None


def _run(args: argparse.Namespace) -> int:
    from controlplane.daemon import serve
    from controlplane.logs import configure_logging

    config = _load(args.config)
    if config is None:
        return 2
    configure_logging(args.log_level or config.log_level)
    try:
        asyncio.run(serve(config))
    except ControlPlaneError as exc:
        print(f"kvcast-controller: cannot run: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0


def _status(args: argparse.Namespace) -> int:
    metrics_url = args.metrics_url
    if args.config:
        config = _load(args.config)
        if config is None:
            return 2
        url = _local(config.report_api.listen)
        if metrics_url is None and config.metrics is not None:
            metrics_url = _local(config.metrics) + "/metrics"
    else:
        url = args.url
    code, doc = ReportClient(url, timeout_s=args.timeout).status()
    if code != 200:
        print(f"kvcast-controller: no status from {url}: {doc.get('error', code)}", file=sys.stderr)
        return 1
    print(json.dumps(doc, indent=2, sort_keys=True))
    if args.metrics:
        if metrics_url is None:
            print("kvcast-controller: --metrics needs --metrics-url or --config", file=sys.stderr)
            return 1
        try:
            with urllib.request.urlopen(metrics_url, timeout=args.timeout) as reply:
                text = reply.read().decode()
        except (urllib.error.URLError, OSError) as exc:
            print(f"kvcast-controller: no metrics from {metrics_url}: {exc}", file=sys.stderr)
            return 1
        for line in text.splitlines():
            if line.startswith("kvcast_controller_"):
                print(line)
    return 0


def _validate(args: argparse.Namespace) -> int:
    config = _load(args.file)
    if config is None:
        return 2
    print(_summary(config))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line.

    Args:
        argv: arguments (default: ``sys.argv[1:]``).

    Returns:
        The exit status.
    """
    args = build_parser().parse_args(argv)
    command = {"run": _run, "status": _status, "validate-config": _validate}[args.command]
    return command(args)


if __name__ == "__main__":
    sys.exit(main())
