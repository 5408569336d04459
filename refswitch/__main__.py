"""``kvcast-refswitch``: the reference target as a switch process.

Its command line follows simple_switch_grpc's, so that emulation and tests start either the same
way: ``kvcast-refswitch -i 1@veth1 -i 2@veth3 --grpc-server-addr 127.0.0.1:9559``. The program
arrives over P4Runtime (SetForwardingPipelineConfig with the P4Info p4c made from p4src).
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from collections.abc import Mapping

from finsy.proto import p4i

from kvcast import p4constants as c
from refswitch.dataplane import Dataplane, PortMap
from refswitch.impair import Impairment, ImpairSpec
from refswitch.p4rt_server import P4RuntimeServer
from refswitch.pipeline import Pipeline, initial_defaults
from refswitch.state import SwitchState
from refswitch.tables import ActionCall

log = logging.getLogger("refswitch")


def _defaults(_p4info: p4i.P4Info) -> Mapping[str, ActionCall]:
    return initial_defaults()


def main(argv: list[str] | None = None) -> None:
    """Runs the switch until SIGINT or SIGTERM."""
    ap = argparse.ArgumentParser(prog="kvcast-refswitch", description=__doc__.splitlines()[0])
    ap.add_argument("-i", "--interface", action="append", default=[], metavar="PORT@IFNAME")
    ap.add_argument("--grpc-server-addr", default="127.0.0.1:9559")
    ap.add_argument("--device-id", type=int, default=1)
    ap.add_argument("--cpu-port", type=int, default=c.CPU_PORT_NUM)
    ap.add_argument("--log-level", default="INFO")
    ap.add_argument(
        "--impair",
        default="",
        metavar="loss=P,dup=P,corrupt=P,reorder=P,seed=N",
        help="inject faults into frames sent to data ports (refswitch.impair; for fault runs)",
    )
    args = ap.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    if args.cpu_port != c.CPU_PORT_NUM:
        ap.error(f"the P4 program's CPU port is {c.CPU_PORT_NUM} (sizes.p4); got {args.cpu_port}")

    state = SwitchState(device_id=args.device_id, cpu_port=args.cpu_port)
    pipeline = Pipeline(state)
    try:
        spec = ImpairSpec.parse(args.impair)
    except ValueError as exc:
        ap.error(str(exc))
    impairment = Impairment(spec) if str(spec) != "none" else None
    dataplane = Dataplane(pipeline, PortMap.parse(args.interface), impairment)
    server = P4RuntimeServer(
        state,
        args.grpc_server_addr,
        defaults_provider=_defaults,
        on_pipeline=lambda _p4info, _cfg: pipeline.reset(),
    )
    dataplane.start()
    port = server.start()
    log.info(
        "P4Runtime on %s (port %d), ports %s", args.grpc_server_addr, port, dict(dataplane.ports)
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    log.info(
        "stopping: rx %d tx %d tx_errors %d impaired %s",
        dataplane.rx_packets,
        dataplane.tx_packets,
        dataplane.tx_errors,
        impairment.counts if impairment is not None else "none",
    )
    server.stop(grace=1)
    dataplane.stop()


if __name__ == "__main__":
    main()
