"""Switch targets as processes: BMv2 (simple_switch_grpc) or the reference target.

Both are started the same way (``PORT@IFNAME`` interfaces, a P4Runtime address, CPU port 255),
waited for until their gRPC port answers, and given the pipeline over P4Runtime. The Mininet
switch classes and the benchmarks and conformance tests all start switches through here.

Classes:
    VethPair / VethPorts: veth pairs whose switch ends a switch process binds, and whose test
        ends a harness sends and receives raw frames on; removed again on close.
    SwitchProcess: a running switch (reference target or BMv2) with a connected
        :class:`~kvcast.tools.p4rt_client.P4RuntimeClient` that installed the pipeline.
    TargetUnavailableError: the target's binaries or the compiled program are missing.

Functions:
    bmv2_binary, p4c_binary, testgen_binary: where BMv2, p4c and p4testgen are installed, or
        None.
    p4runtime_shell_python: a Python with p4runtime-shell (its own venv), or None.
    load_p4info: the committed P4Info of the program.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from finsy.proto import p4i
from google.protobuf import text_format

from kvcast import p4constants as c
from kvcast.tools.p4rt_client import P4RuntimeClient

REPO = Path(__file__).resolve().parents[1]
BUILD = REPO / "p4src" / "build"
P4INFO_PATH = BUILD / "kvcast.p4info.txtpb"
BMV2_JSON_PATH = BUILD / "kvcast.json"
OPT_BIN = Path("/opt/p4/bin")
# p4c built with its Tofino backend installs under its own prefix (docs/tofino.md).
OPT_TOFINO = Path("/opt/p4-tofino")
# p4runtime-shell's venv where it was installed by hand (docs/controlplane.md).
P4RT_SHELL_VENV = Path("/opt/p4rt-shell-venv")
# Where TNA's include files (tna.p4) may be: $KVCAST_TNA_INCLUDE first, then the Tofino build's
# install prefix, then p4c's source tree where p4c was built from source under /opt/src.
TNA_INCLUDE_CANDIDATES = (
    OPT_TOFINO / "share" / "p4c" / "p4include",
    Path("/opt/p4/share/p4c/p4include"),
    Path("/opt/src/p4c/backends/tofino/bf-p4c/p4include"),
)


class TargetUnavailableError(RuntimeError):
    """A switch target cannot run here; the message names what is missing."""


def _find(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for directory in (OPT_BIN, OPT_TOFINO / "bin"):
        candidate = directory / name
        if candidate.exists():
            return str(candidate)
    return None


def bmv2_binary() -> str | None:
    """Path of simple_switch_grpc, or None."""
    return _find("simple_switch_grpc")


def p4c_binary() -> str | None:
    """Path of p4c-bm2-ss, or None."""
    return _find("p4c-bm2-ss")


def p4test_binary() -> str | None:
    """Path of p4test (p4c's front and mid end alone), or None."""
    return _find("p4test")


def tofino_compiler() -> str | None:
    """Path of the ``bf-p4c`` driver of p4c's Tofino backend, or None.

    The driver, not the ``p4c-barefoot`` binary alone: only the driver runs the assembler,
    which is what refuses a program that needs more than the chip's 12 stages.
    """
    return _find("bf-p4c")


def testgen_binary() -> str | None:
    """Path of p4testgen (p4c's test generator, built with its Tofino target), or None."""
    return _find("p4testgen")


def tna_include_dir() -> Path | None:
    """A directory holding TNA's ``tna.p4`` (``$KVCAST_TNA_INCLUDE`` first), or None."""
    env = os.environ.get("KVCAST_TNA_INCLUDE")
    for directory in ((Path(env),) if env else ()) + TNA_INCLUDE_CANDIDATES:
        if (directory / "tna.p4").is_file():
            return directory
    return None


def p4runtime_shell_python() -> str | None:
    """A Python that imports p4runtime-shell (in its own venv: it pins protobuf < 3.21), or None.

    Looked for in ``$KVCAST_P4RT_SHELL_PYTHON``, then the venv scripts/setup.sh makes
    (``.venv-p4rt-shell``), then ``/opt/p4rt-shell-venv``.
    """
    env = os.environ.get("KVCAST_P4RT_SHELL_PYTHON")
    candidates = [Path(env)] if env else []
    candidates += [REPO / ".venv-p4rt-shell" / "bin" / "python", P4RT_SHELL_VENV / "bin" / "python"]
    for python in candidates:
        if python.exists():
            probe = subprocess.run(
                [str(python), "-c", "import p4runtime_sh.shell"], capture_output=True
            )
            if probe.returncode == 0:
                return str(python)
    return None


def load_p4info(path: Path = P4INFO_PATH) -> p4i.P4Info:
    """Reads a text-format P4Info.

    Raises:
        TargetUnavailableError: the file does not exist.
    """
    if not path.exists():
        raise TargetUnavailableError(f"{path} missing: run `make p4` where p4c-bm2-ss is installed")
    return text_format.Parse(path.read_text(), p4i.P4Info())


def _run(cmd: Sequence[str]) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


@dataclass
class VethPair:
    """One veth pair: ``switch_if`` is bound by the switch, ``host_if`` by the test."""

    port: int
    switch_if: str
    host_if: str


class VethPorts:
    """Creates veth pairs for switch ports; IPv6 is off so the kernel sends nothing on them.

    Args:
        ports: switch port numbers.
        prefix: interface name prefix (unique per concurrent user).

    Raises:
        TargetUnavailableError: not root, or veth cannot be created.
    """

    def __init__(self, ports: Iterable[int], prefix: str = "kvc"):
        if os.geteuid() != 0:
            raise TargetUnavailableError("veth pairs need root (CAP_NET_ADMIN)")
        self.pairs: dict[int, VethPair] = {}
        tag = f"{prefix}{os.getpid() % 10000}"
        try:
            for port in ports:
                pair = VethPair(port, f"{tag}s{port}", f"{tag}h{port}")
                _run(
                    [
                        "ip",
                        "link",
                        "add",
                        pair.switch_if,
                        "type",
                        "veth",
                        "peer",
                        "name",
                        pair.host_if,
                    ]
                )
                self.pairs[port] = pair
                for ifname in (pair.switch_if, pair.host_if):
                    _run(["sysctl", "-q", "-w", f"net.ipv6.conf.{ifname}.disable_ipv6=1"])
                    _run(["ip", "link", "set", ifname, "mtu", "9000", "up"])
        except (OSError, subprocess.CalledProcessError) as exc:
            self.close()
            raise TargetUnavailableError(f"cannot create veth pairs: {exc}") from exc

    def interface_args(self) -> list[str]:
        """``-i PORT@IFNAME`` arguments for a switch process."""
        args: list[str] = []
        for pair in self.pairs.values():
            args += ["-i", f"{pair.port}@{pair.switch_if}"]
        return args

    def close(self) -> None:
        """Deletes every pair (deleting one end removes both)."""
        for pair in self.pairs.values():
            subprocess.run(["ip", "link", "del", pair.switch_if], capture_output=True)
        self.pairs.clear()


def free_tcp_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SwitchProcess:
    """A switch process with its pipeline installed and a primary P4Runtime client.

    Args:
        kind: ``"refswitch"`` or ``"bmv2"``.
        interface_args: ``-i PORT@IFNAME`` arguments.
        log_path: where the process's output goes.
        device_id: P4Runtime device id.
        impair: faults the reference target injects into the frames it sends
            (``refswitch --impair``, e.g. ``"loss=0.01,seed=3"``); empty: none. BMv2 has no
            such stage.
        install: connect the primary client and install the pipeline; False: only start the
            process and wait for its gRPC port (for a foreign client that does both).

    Raises:
        TargetUnavailableError: the target is not installed or the program is not compiled.
        ValueError: ``impair`` given for BMv2.
    """

    def __init__(
        self,
        kind: str,
        interface_args: Sequence[str],
        log_path: Path,
        device_id: int = 1,
        impair: str = "",
        install: bool = True,
    ):
        self.kind = kind
        self.grpc_port = free_tcp_port()
        self.address = f"127.0.0.1:{self.grpc_port}"
        p4info = load_p4info()
        device_config = b""
        if kind == "bmv2":
            binary = bmv2_binary()
            if binary is None:
                raise TargetUnavailableError("simple_switch_grpc is not installed")
            if not BMV2_JSON_PATH.exists():
                raise TargetUnavailableError(f"{BMV2_JSON_PATH} missing: run `make p4`")
            device_config = BMV2_JSON_PATH.read_bytes()
            if impair:
                raise ValueError("BMv2 has no impairment stage: use the reference target")
            cmd = [
                binary,
                "--device-id",
                str(device_id),
                *interface_args,
                "--no-p4",
                "--",
                "--grpc-server-addr",
                self.address,
                "--cpu-port",
                str(c.CPU_PORT_NUM),
            ]
        elif kind == "refswitch":
            cmd = [
                sys.executable,
                "-m",
                "refswitch",
                "--device-id",
                str(device_id),
                *interface_args,
                "--grpc-server-addr",
                self.address,
                "--log-level",
                "WARNING",
                *(["--impair", impair] if impair else []),
            ]
        else:
            raise ValueError(f"unknown switch kind {kind!r}")
        self._cmd = cmd
        self._device_id = device_id
        self._p4info, self._device_config = p4info, device_config
        self._log = log_path.open("wb")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, cwd=REPO)
        self.client = P4RuntimeClient(self.address, device_id=device_id, election_id=10)
        try:
            self._wait_listening(30.0)
            if install:
                self._install()
        except Exception:
            self.close()
            raise

    def _install(self) -> None:
        self.client.connect()
        self.client.set_pipeline(self._p4info, self._device_config)

    def restart(self, install: bool = False) -> None:
        """A crash and a restart: SIGKILL, then the same command on the same ports and address.

        The new process starts empty (no pipeline, tables, groups or SRAM), as a switch that
        rebooted; whoever controls it must notice and re-program it.

        Args:
            install: also connect a fresh primary client (election id 10) and push the
                pipeline (False: the controller is expected to do it).

        Raises:
            TargetUnavailableError: the new process did not open its gRPC port.
        """
        self.kill()
        self.start_again(install)

    def kill(self) -> None:
        """Kills the process (SIGKILL: a crash, nothing flushed) and waits until it is gone.

        The client stays open, as after a real crash: its next call fails with
        P4RuntimeClientError (UNAVAILABLE), which its users handle.
        """
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def start_again(self, install: bool = False) -> None:
        """Starts the killed process's command again (see :meth:`restart`)."""
        if self.proc.poll() is None:
            raise RuntimeError(f"{self.kind} is still running (pid {self.proc.pid})")
        self.client.close()
        self.proc = subprocess.Popen(
            self._cmd, stdout=self._log, stderr=subprocess.STDOUT, cwd=REPO
        )
        self.client = P4RuntimeClient(self.address, device_id=self._device_id, election_id=10)
        self._wait_listening(30.0)
        if install:
            self._install()

    def _wait_listening(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise TargetUnavailableError(
                    f"{self.kind} exited with {self.proc.returncode}; its log ends:\n"
                    f"{self.log_tail()}"
                )
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.grpc_port)) == 0:
                    return
            time.sleep(0.1)
        raise TargetUnavailableError(f"{self.kind} did not open {self.address} in {timeout} s")

    def log_tail(self, nbytes: int = 2000) -> str:
        """The last ``nbytes`` of the process's output (for error messages)."""
        self._log.flush()
        data = Path(self._log.name).read_bytes()
        return data[-nbytes:].decode("utf-8", "replace")

    def close(self) -> None:
        """Stops the client and the process (SIGTERM, then SIGKILL)."""
        self.client.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
