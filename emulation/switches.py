"""P4 switches as Mininet nodes: BMv2 or the reference target, started the same way.

Each class is one more Mininet ``Switch`` subclass (Mininet's shape: the network is built from a
pure topology with an injectable switch class). ``start`` launches the switch process on the
node's interfaces, waits until its P4Runtime port answers and pushes the pipeline; ``stop``
ends the process and removes its log directory (a start that fails carries the log's tail in
its error).

Classes:
    P4Switch: the common part; ``kind`` selects the target.
    RefSwitch: the reference target (``python -m refswitch``).
    BMv2Switch: ``simple_switch_grpc``.

Functions:
    default_switch_class: BMv2 where it is installed and compiled for, the reference target
        otherwise.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from mininet.node import Switch

from emulation.targets import BMV2_JSON_PATH, SwitchProcess, bmv2_binary
from kvcast.tools.p4rt_client import P4RuntimeClient


class P4Switch(Switch):  # type: ignore[misc]
    """A P4 switch process bound to this node's interfaces (in the root namespace)."""

    kind = "refswitch"
    impair = ""
    """Faults the reference target injects into its output (``refswitch --impair``); a subclass
    with this set is how a fault campaign asks for them (experiments.faults)."""

    def __init__(self, name: str, **params: Any) -> None:
        params["inNamespace"] = False
        super().__init__(name, **params)
        self.process: SwitchProcess | None = None
        self.log_dir = Path(tempfile.mkdtemp(prefix=f"kvcast-{name}-"))

    @property
    def client(self) -> P4RuntimeClient:
        """The primary P4Runtime client that installed the pipeline."""
        if self.process is None:
            raise RuntimeError(f"switch {self.name} is not started")
        return self.process.client

    def interface_args(self) -> list[str]:
        """``-i PORT@IFNAME`` for every data port (port 0, the loopback control intf, excluded)."""
        args: list[str] = []
        for intf, port in sorted(self.ports.items(), key=lambda kv: kv[1]):
            if port == 0 or intf.name == "lo":
                continue
            self.cmd(f"sysctl -q -w net.ipv6.conf.{intf.name}.disable_ipv6=1")
            self.cmd(f"ethtool -K {intf.name} tx off rx off sg off tso off gso off")
            args += ["-i", f"{port}@{intf.name}"]
        return args

    def start(self, controllers: list[Any]) -> None:
        """Starts the switch process and installs the pipeline."""
        self.process = SwitchProcess(
            self.kind, self.interface_args(), self.log_dir / "switch.log", impair=self.impair
        )

    def restart(self, install: bool = False) -> None:
        """Kills the switch process and starts it again, empty (see SwitchProcess.restart)."""
        if self.process is None:
            raise RuntimeError(f"switch {self.name} is not started")
        self.process.restart(install=install)

    def kill(self) -> None:
        """Kills the switch process (SIGKILL); :meth:`start_again` brings it back empty."""
        if self.process is None:
            raise RuntimeError(f"switch {self.name} is not started")
        self.process.kill()

    def start_again(self, install: bool = False) -> None:
        """Starts the killed switch process again on the same ports and address."""
        if self.process is None:
            raise RuntimeError(f"switch {self.name} is not started")
        self.process.start_again(install=install)

    def stop(self, deleteIntfs: bool = True) -> None:  # noqa: N803 - Mininet's signature
        """Stops the process, removes its log directory, then the interfaces."""
        if self.process is not None:
            self.process.close()
            self.process = None
        shutil.rmtree(self.log_dir, ignore_errors=True)
        super().stop(deleteIntfs)


class RefSwitch(P4Switch):
    """The reference target."""

    kind = "refswitch"


class BMv2Switch(P4Switch):
    """BMv2's simple_switch_grpc."""

    kind = "bmv2"


def default_switch_class() -> type[P4Switch]:
    """BMv2 where simple_switch_grpc and the compiled JSON exist, the reference target otherwise."""
    if bmv2_binary() is not None and BMV2_JSON_PATH.exists():
        return BMv2Switch
    return RefSwitch
