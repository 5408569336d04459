"""``python -m poolnode``: a DRAM pool node answering KVP GETs.

With ``--backend mooncake`` the node opens a Mooncake Store client (contributing
``--segment-mib`` of DRAM to the pool) against ``--master``, or starts its own
``mooncake_master`` on loopback with ``--start-master``. ``--backend memory`` serves an empty
in-memory store (for wiring tests). The node prints one ``poolnode listening ...`` line, serves
until SIGINT/SIGTERM, then prints its counters as ``poolnode stats k=v ...`` and exits 0.

Functions:
    main: parse arguments, run the node, return the exit status.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys
from collections.abc import Sequence
from types import FrameType

from kvcast import p4constants as c
from poolnode.backend import InMemoryBackend, PoolBackend, PoolBackendError
from poolnode.mooncake import MasterStartError, MooncakeBackend, MooncakeMaster
from poolnode.server import DEFAULT_MTU, PoolServer


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m poolnode", description=__doc__.splitlines()[0])
    p.add_argument("--host", default="0.0.0.0", help="address to bind (default: all)")
    p.add_argument("--port", type=int, default=c.KVP_UDP_PORT, help="UDP port (0: ephemeral)")
    p.add_argument("--mtu", type=int, default=DEFAULT_MTU, help="IP MTU DATA must fit in")
    p.add_argument("--cache-mib", type=int, default=64, help="recently-served chunk cache")
    p.add_argument("--backend", choices=("mooncake", "memory"), default="mooncake")
    p.add_argument("--master", help="mooncake_master host:port")
    p.add_argument("--start-master", action="store_true", help="start mooncake_master here")
    p.add_argument("--local-hostname", default="127.0.0.1", help="Mooncake transfer address")
    p.add_argument("--metadata-server", default="P2PHANDSHAKE")
    p.add_argument("--protocol", default="tcp", help="Mooncake transfer protocol")
    p.add_argument("--segment-mib", type=int, default=1024, help="DRAM given to the pool")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Runs a pool node until SIGINT or SIGTERM.

    Args:
        argv: command-line arguments (default: ``sys.argv[1:]``).

    Returns:
        0 after a clean stop, 2 when the node could not start.
    """
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    with contextlib.ExitStack() as stack:
        backend: PoolBackend
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
            server = PoolServer(backend, args.host, args.port, args.mtu, args.cache_mib << 20)
            server.bind()
        except (ImportError, MasterStartError, PoolBackendError, OSError, ValueError) as exc:
            print(f"poolnode: cannot start: {exc}")
            return 2
        stack.callback(server.stop)

        def _stop(signum: int, frame: FrameType | None) -> None:
            server.stop()

        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
        host, port = server.address
        print(f"poolnode listening host={host} port={port} backend={args.backend}", flush=True)
        server.serve_forever()
        stats = " ".join(f"{k}={v}" for k, v in server.stats.as_dict().items())
        print(f"poolnode stats {stats}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
