"""``python -m poolnode``: a DRAM pool node answering KVP GETs.

With ``--backend mooncake`` the node opens a Mooncake Store client (contributing
``--segment-mib`` of DRAM to the pool) against ``--master``, or starts its own
``mooncake_master`` on loopback with ``--start-master``. ``--backend memory`` serves an
in-memory store (for wiring tests and emulation). ``--preload TENANT:KEY:NBYTES[:SEED]``
(repeatable) stores the synthetic chunk of that name (``kvcast.synthetic``) through the
backend's own put path (one ``put_many``: Mooncake's ``batch_put_from``) before serving. The
node prints one ``poolnode listening ...`` line once it is ready (ending with its checks:
``groups=controller|list|any|none tenants=controller|list|any``), serves until SIGINT/SIGTERM,
then prints its counters as ``poolnode stats k=v ...`` and exits 0.

A master the node started (``--start-master``) is supervised (``MooncakeMaster.supervise``;
``--no-supervise-master`` turns it off): when it dies the node answers GETs for chunks it cannot
read ``NACK UNAVAILABLE`` (retry later), starts the master again on the same address, puts its
preloaded chunks back (the new master knows no object; the store client reconnects by itself,
its first call failing), and prints ``poolnode master restarted pid=P down_s=S reput=K
reput_s=T`` (seconds from noticing the death). ``poolnode master pid=P`` follows the
``listening`` line.
Chunks put into the store by others are not put back: only their owners have the bytes.

Groups and tenants (docs/security.md): a GET naming a multicast group is refused unless the node
was told the group exists: ``--groups-url`` (the controller's list), ``--group G`` (repeatable, a
fixed list), or ``--any-group`` (every group: the switch's membership check alone; logged as a
warning). ``--source-tenants ADDR=T[,T...]`` or ``ADDR=any`` (repeatable) makes the node refuse a
GET that names a tenant its source address is not bound to, or that comes from an unlisted address;
``--source-tenants-url`` reads those bindings from the controller (``/v1/sources``) once at start,
and the node does not start when it cannot. A node must be given a tenant policy: one of those, or
``--any-tenant`` (no tenant check here: the switch's tenant binding alone; logged as a warning).
Started with none, it does not start (exit 2, naming the flags).

``--stats-file PATH`` also writes the counters as JSON to PATH every ``--stats-interval``
seconds and at exit (atomically: a reader never sees half a file).

Classes:
    StatsWriter: writes the server's counters to a JSON file, periodically and at stop.

Functions:
    main: parse arguments, run the node, return the exit status.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from kvcast import p4constants as c
from kvcast.backend import InMemoryBackend, PoolBackend, PoolBackendError
from kvcast.kvp import DEFAULT_MTU
from kvcast.mooncake import MooncakeBackend
from kvcast.synthetic import ChunkSpec
from poolnode.groups import ANY_GROUP, GroupRegistry, GroupSource, StaticGroups
from poolnode.mooncake import MasterStartError, MooncakeMaster
from poolnode.server import PoolServer, ServerStats
from poolnode.tenants import SourceTenants
from poolnode.threads import BackgroundThread


class StatsWriter:
    """Writes a server's counters to a JSON file: every ``interval_s`` and once more at stop.

    The file is ``{"time": epoch seconds, "final": bool, "stats": {counter: value},
    "preloaded": [{"tenant", "key", "nbytes", "seed"}, ...]}``, replaced atomically.

    Args:
        path: the JSON file.
        stats: the live counters.
        preloaded: the chunks preloaded at start.
        interval_s: seconds between writes; 0 writes only at stop.
    """

    def __init__(
        self,
        path: Path,
        stats: ServerStats,
        preloaded: Sequence[ChunkSpec] = (),
        interval_s: float = 1.0,
    ) -> None:
        self.path = path
        self.stats = stats
        self.preloaded = [
            {"tenant": p.tenant, "key": f"{p.key:#x}", "nbytes": p.nbytes, "seed": p.seed}
            for p in preloaded
        ]
        self.interval_s = interval_s
        self._periodic = (
            BackgroundThread.every(interval_s, self._write_logged, "poolnode-stats")
            if interval_s > 0
            else None
        )

    def write(self, final: bool = False) -> None:
        """Writes the counters now.

        Raises:
            OSError: the file cannot be written.
        """
        doc: dict[str, Any] = {
            "time": time.time(),
            "final": final,
            "stats": self.stats.as_dict(),
            "preloaded": self.preloaded,
        }
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(doc) + "\n")
        os.replace(tmp, self.path)

    def _write_logged(self) -> None:
        try:
            self.write()
        except OSError as exc:
            logging.getLogger(__name__).warning("cannot write %s: %s", self.path, exc)

    def start(self) -> StatsWriter:
        """Writes once, then keeps writing every ``interval_s`` in a daemon thread."""
        self.write()
        if self._periodic is not None:
            self._periodic.start()
        return self

    def stop(self) -> None:
        """Stops the periodic writes and writes the final counters."""
        if self._periodic is not None:
            self._periodic.stop()
        self.write(final=True)


def _chunk_spec(text: str) -> ChunkSpec:
    try:
        return ChunkSpec.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m poolnode", description=__doc__.splitlines()[0])
    p.add_argument("--host", default="0.0.0.0", help="address to bind (default: all)")
    p.add_argument("--port", type=int, default=c.KVP_UDP_PORT, help="UDP port (0: ephemeral)")
    p.add_argument("--mtu", type=int, default=DEFAULT_MTU, help="IP MTU DATA must fit in")
    p.add_argument("--cache-mib", type=int, default=64, help="recently-served chunk cache")
    p.add_argument(
        "--gso",
        action="store_true",
        help="send DATAs as UDP GSO messages (a NIC or loopback path; not behind a software "
        "switch reading a veth)",
    )
    p.add_argument("--backend", choices=("mooncake", "memory"), default="mooncake")
    p.add_argument("--master", help="mooncake_master host:port")
    p.add_argument("--start-master", action="store_true", help="start mooncake_master here")
    p.add_argument(
        "--no-supervise-master",
        dest="supervise_master",
        action="store_false",
        help="do not restart a master started here when it dies (nor put the chunks back)",
    )
    p.add_argument("--local-hostname", default="127.0.0.1", help="Mooncake transfer address")
    p.add_argument("--metadata-server", default="P2PHANDSHAKE")
    p.add_argument("--protocol", default="tcp", help="Mooncake transfer protocol")
    p.add_argument("--segment-mib", type=int, default=1024, help="DRAM given to the pool")
    p.add_argument(
        "--preload",
        type=_chunk_spec,
        action="append",
        default=[],
        metavar="TENANT:KEY:NBYTES[:SEED]",
        help="store this synthetic chunk before serving (repeatable)",
    )
    groups = p.add_mutually_exclusive_group()
    groups.add_argument(
        "--groups-url",
        help="the controller's http://HOST:PORT/v1/groups/SWITCH: refuse GETs naming other groups",
    )
    groups.add_argument(
        "--group",
        type=int,
        action="append",
        metavar="G",
        help="a group GETs may name (repeatable; a switch programmed without the controller)",
    )
    groups.add_argument(
        "--any-group",
        action="store_true",
        help="serve GETs naming any group (default: none unless --groups-url or --group)",
    )
    p.add_argument(
        "--source-tenants",
        action="append",
        default=[],
        metavar="ADDR=T[,T...]|ADDR=any",
        help="tenants a GET from ADDR may name (repeatable); unlisted senders are refused",
    )
    p.add_argument(
        "--source-tenants-url",
        metavar="URL",
        help="the controller's http://HOST:PORT/v1/sources: the hosts' bindings, read once at "
        "start (the node does not start without them); --source-tenants adds to them (e.g. "
        "the controller's own address=any, for the chunk reads it makes)",
    )
    p.add_argument(
        "--any-tenant",
        action="store_true",
        help="check no tenant here: a GET may name any tenant, only the switch's tenant binding "
        "keeps a host to its own (logged). A node needs this or a list to start",
    )
    p.add_argument("--stats-file", type=Path, help="write the counters as JSON here")
    p.add_argument("--stats-interval", type=float, default=1.0, help="seconds between writes")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


REPUT_TRIES = 50
REPUT_PAUSE_S = 0.05
"""Tries (and the pause between them) to put the chunks back into a restarted store: the store
client's first call after the restart fails (RPC_FAIL) while it reconnects."""


def _supervise(
    master: MooncakeMaster, backend: PoolBackend, server: PoolServer, preload: Sequence[ChunkSpec]
) -> None:
    """Restarts ``master`` when it dies and puts ``preload`` back (see the module docstring)."""
    handler = server.handler
    died: list[float] = []

    def on_down() -> None:
        died.append(time.monotonic())
        handler.recovering = True

    def on_restart(down_s: float) -> None:
        chunks = [(p.tenant, p.key, p.data()) for p in preload]
        error: Exception | None = None
        for _ in range(REPUT_TRIES):
            try:
                if chunks:
                    backend.put_many(chunks)
                error = None
                break
            except PoolBackendError as exc:
                error = exc
                time.sleep(REPUT_PAUSE_S)
        handler.recovering = False
        since = time.monotonic() - (died.pop() if died else time.monotonic())
        if error is not None:
            print(f"poolnode master restarted but its chunks were not put back: {error}")
        print(
            f"poolnode master restarted pid={master.pid} down_s={down_s:.3f} "
            f"reput={0 if error else len(chunks)} reput_s={since:.3f}",
            flush=True,
        )

    master.supervise(on_down, on_restart)


def _groups_check(args: argparse.Namespace) -> str:
    """The groups the node echoes, for its listening line: controller, list, any or none."""
    if args.groups_url:
        return "controller"
    return "list" if args.group else "any" if args.any_group else "none"


def _tenants_check(args: argparse.Namespace) -> str:
    """The node's tenant check, for its listening line: controller, list or any."""
    if args.source_tenants_url:
        return "controller"
    return "list" if args.source_tenants else "any"


NO_TENANT_POLICY = (
    "no tenant policy: give --source-tenants-url URL (the controller's /v1/sources) and/or "
    "--source-tenants ADDR=T[,T...]|ADDR=any, or --any-tenant to check no tenant here"
)
"""Why a node told nothing about tenants does not start."""


def _tenant_policy_error(args: argparse.Namespace) -> str | None:
    """Why the node's tenant arguments cannot start it (none, or a list with ``--any-tenant``)."""
    listed = bool(args.source_tenants or args.source_tenants_url)
    if args.any_tenant and listed:
        return "--any-tenant contradicts --source-tenants and --source-tenants-url"
    return None if listed or args.any_tenant else NO_TENANT_POLICY


def main(argv: Sequence[str] | None = None) -> int:
    """Runs a pool node until SIGINT or SIGTERM.

    Args:
        argv: command-line arguments (default: ``sys.argv[1:]``).

    Returns:
        0 after a clean stop, 2 when the node could not start.
    """
    args = _parser().parse_args(argv)
    if (refused := _tenant_policy_error(args)) is not None:
        print(f"poolnode: cannot start: {refused}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    with contextlib.ExitStack() as stack:
        backend: PoolBackend
        master_addr: str | None = None
        master: MooncakeMaster | None = None
        try:
            if args.backend == "memory":
                backend = InMemoryBackend()
            else:
                master_addr = args.master
                if args.start_master:
                    master = stack.enter_context(MooncakeMaster(host=args.local_hostname))
                    master_addr = master.address
                if not master_addr:
                    print("poolnode: --backend mooncake needs --master or --start-master")
                    return 2
                backend = MooncakeBackend(
                    master_addr,
                    local_hostname=args.local_hostname,
                    metadata_server=args.metadata_server,
                    global_segment_size=args.segment_mib << 20,
                    protocol=args.protocol,
                )
                stack.callback(backend.close)
            if args.preload:
                backend.put_many((p.tenant, p.key, p.data()) for p in args.preload)
            groups: GroupSource | None = None
            if args.groups_url:
                registry = GroupRegistry(args.groups_url).start()
                stack.callback(registry.stop)
                groups = registry
            elif args.group:
                groups = StaticGroups(args.group)
            elif args.any_group:
                logging.getLogger("poolnode").warning(
                    "--any-group: GETs naming any multicast group are served; only the "
                    "switch's membership check keeps a host from feeding a group it is not in"
                )
                groups = ANY_GROUP
            tenants = SourceTenants.parse(args.source_tenants) if args.source_tenants else None
            if args.source_tenants_url:
                served = SourceTenants.fetch(args.source_tenants_url)
                tenants = served if tenants is None else served.merged(tenants)
            if args.any_tenant:
                logging.getLogger("poolnode").warning(
                    "--any-tenant: no tenant check here, a GET may name any tenant; only the "
                    "switch's tenant binding keeps a host to its own"
                )
            server = PoolServer(
                backend, args.host, args.port, args.mtu, args.cache_mib << 20, groups=groups,
                gso=args.gso, tenants=tenants,
            )  # fmt: skip
            server.bind()
            writer = None
            if args.stats_file is not None:
                writer = StatsWriter(
                    args.stats_file, server.stats, args.preload, args.stats_interval
                ).start()
        except (ImportError, MasterStartError, PoolBackendError, OSError, ValueError) as exc:
            print(f"poolnode: cannot start: {exc}")
            return 2
        stack.callback(server.stop)
        if writer is not None:
            stack.callback(writer.stop)

        def _stop(signum: int, frame: FrameType | None) -> None:
            server.stop()

        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
        host, port = server.address
        if args.preload:
            total = sum(p.nbytes for p in args.preload)
            print(f"poolnode preloaded chunks={len(args.preload)} bytes={total}", flush=True)
        where = f" master={master_addr}" if args.backend == "mooncake" else ""
        checks = f" groups={_groups_check(args)} tenants={_tenants_check(args)}"
        print(
            f"poolnode listening host={host} port={port} backend={args.backend}{where}{checks}",
            flush=True,
        )
        if master is not None:  # after "listening": a reader waiting for that line sees this
            print(f"poolnode master pid={master.pid} address={master.address}", flush=True)
            if args.supervise_master:
                _supervise(master, backend, server, args.preload)
        server.serve_forever()
        stats = " ".join(f"{k}={v}" for k, v in server.stats.as_dict().items())
        print(f"poolnode stats {stats}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
