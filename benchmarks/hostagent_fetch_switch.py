"""The hostagent_fetch lines through an emulated host: the reference switch (or BMv2) on veths.

``path=refswitch``, ``path=refswitch-pool`` and ``path=bmv2`` of
:mod:`benchmarks.hostagent_fetch` (the lines are described there): a testbed of veth pairs,
two network namespaces and a programmed switch, and the probe
(``python -m benchmarks.loopback probe``) run in the host namespace.

Classes:
    SwitchTestbed: veth pairs, two namespaces and a programmed reference switch (its ``close``
        removes everything it made).

Functions:
    measure_refswitch: the through-switch fetch vs plain-UDP probe.
    cpu_ratio: plain UDP's CPU per fragment over the fetch's in one probe record.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.hostagent_fetch_pool import pool_node
from benchmarks.udp_feed import KEY, SEED, TENANT  # the feed's chunk is the suite's
from emulation.targets import REPO, SwitchProcess, TargetUnavailableError, VethPorts
from kvcast import p4constants as c
from kvcast.kvp import frags_per_data
from kvcast.synthetic import synthetic_chunk
from kvcast.tools.p4rt_client import Lpm
from kvcast.wire import ip_int, mac_int

SWITCH_MAC, VIP = "02:00:00:00:00:fe", "10.0.100.1"
HOST_MAC, HOST_IP = "00:00:00:00:00:01", "10.0.0.1"
PEER_MAC, PEER_IP = "00:00:00:00:01:01", "10.0.1.1"


def _sh(*cmd: str) -> None:
    try:
        subprocess.run(cmd, check=True, capture_output=True, text=True)
    except subprocess.CalledProcessError as exc:
        raise TargetUnavailableError(
            f"`{' '.join(cmd)}` failed: {exc.stderr.strip() or exc.returncode}"
        ) from exc


class SwitchTestbed:
    """The reference switch on two veth ports, each host end in its own namespace.

    Port 1 leads to the "host" namespace (``HOST_IP``, where the fetch client runs), port 2 to
    the "peer" namespace (``PEER_IP``: the plain-UDP sender, and the pool node when one runs).
    Everything is removed on ``close`` (also when construction fails half way).

    Args:
        logdir: where the switch's log goes.
        kind: ``"refswitch"`` (the reference target) or ``"bmv2"`` (simple_switch_grpc).

    Raises:
        TargetUnavailableError: not root, no P4Info, the switch binary is missing, or the switch
            or a namespace cannot start.
    """

    def __init__(self, logdir: Path, kind: str = "refswitch") -> None:
        tag = f"{os.getpid() % 100000}"
        self.host_ns, self.peer_ns = f"kvhf{tag}h", f"kvhf{tag}p"
        self._namespaces: list[str] = []
        self.sw: SwitchProcess | None = None
        self.veths = VethPorts([1, 2], prefix="khf")
        try:
            self.sw = SwitchProcess(kind, self.veths.interface_args(), logdir / "sw.log")
            self._namespace(self.host_ns, self.veths.pairs[1].host_if, HOST_MAC, HOST_IP, PEER_IP)
            self._namespace(self.peer_ns, self.veths.pairs[2].host_if, PEER_MAC, PEER_IP, HOST_IP)
            self._program()
        except BaseException:
            self.close()
            raise

    def _namespace(self, ns: str, ifname: str, mac: str, ip: str, other: str) -> None:
        _sh("ip", "netns", "add", ns)
        self._namespaces.append(ns)
        for conf in ("all", "default"):
            _sh("ip", "netns", "exec", ns, "sysctl", "-q", "-w",
                f"net.ipv6.conf.{conf}.disable_ipv6=1")  # fmt: skip
        _sh("ip", "link", "set", ifname, "address", mac)
        _sh("ip", "link", "set", ifname, "netns", ns)
        _sh("ip", "-n", ns, "link", "set", "lo", "up")
        _sh("ip", "-n", ns, "link", "set", ifname, "mtu", "9000", "up")
        _sh("ip", "-n", ns, "addr", "add", f"{ip}/16", "dev", ifname)
        for addr in (VIP, other):
            _sh("ip", "-n", ns, "neigh", "replace", addr, "lladdr", SWITCH_MAC, "dev", ifname)
        # The switch forwards frames as its raw socket sees them: a checksum left to a NIC
        # that veth never completes would make the receiver drop the datagram.
        _sh("ip", "netns", "exec", ns, "ethtool", "-K", ifname,
            "tx", "off", "rx", "off", "sg", "off", "tso", "off", "gso", "off")  # fmt: skip

    def _program(self) -> None:
        assert self.sw is not None
        cl = self.sw.client
        for port, ip, mac in ((1, HOST_IP, HOST_MAC), (2, PEER_IP, PEER_MAC)):
            cl.insert(
                c.TABLE_INGRESS_FORWARDING_IPV4_LPM,
                {"dst_addr": Lpm(ip_int(ip), 32)},
                c.ACTION_INGRESS_FORWARDING_ROUTE,
                {"port": port, "smac": mac_int(SWITCH_MAC), "dmac": mac_int(mac)},
            )
        # The host's port bound to its address (the reference target denies an unknown port).
        cl.insert(
            c.TABLE_INGRESS_PORT_ROLE_PORT_ROLE,
            {"port": 1},
            c.ACTION_INGRESS_PORT_ROLE_BIND_HOST,
            {"addr": ip_int(HOST_IP), "check_tenant": 0},
        )
        cl.set_pool_node(2, ip_int(PEER_IP))

    def load(self, nbytes: int) -> None:
        """Puts the synthetic chunk ``(TENANT, KEY, nbytes, SEED)`` into switch SRAM."""
        assert self.sw is not None
        data = synthetic_chunk(TENANT, KEY, nbytes, SEED)
        self.sw.client.load_chunk(TENANT, KEY, data, slot_base=0, epoch=1)

    def in_ns(self, ns: str, *cmd: str) -> list[str]:
        """``cmd`` run inside namespace ``ns``."""
        return ["ip", "netns", "exec", ns, *cmd]

    def close(self) -> None:
        """Stops the switch, deletes the namespaces (and the veth ends in them) and the pairs."""
        try:
            if self.sw is not None:
                self.sw.close()
                self.sw = None
        finally:
            for ns in self._namespaces:
                subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            self._namespaces.clear()
            self.veths.close()


def _probe(tb: SwitchTestbed, nbytes: int, rounds: int, *extra: str) -> dict[str, Any]:
    cmd = tb.in_ns(
        tb.host_ns, sys.executable, "-m", "benchmarks.loopback", "probe",
        "--service", VIP, "--trust-pool", PEER_IP, "--tenant", str(TENANT), "--key", f"{KEY:#x}",
        "--nbytes", str(nbytes), "--seed", str(SEED), "--rounds", str(rounds),
        "--udp-netns", tb.peer_ns, "--udp-src", PEER_IP, "--udp-dst", HOST_IP,
        "--switch-pid", str(tb.sw.proc.pid if tb.sw else 0), *extra,
    )  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=120)
    lines = out.stdout.strip().splitlines()
    record: dict[str, Any] = json.loads(lines[-1]) if lines else {"error": out.stderr[-500:]}
    if "error" in record:
        raise RuntimeError(f"probe failed: {record['error']}")
    return record


def measure_refswitch(
    nbytes: int, rounds: int, pool_path: bool, kind: str = "refswitch"
) -> list[dict[str, Any]]:
    """Fetch through the reference switch (or BMv2) vs plain UDP on the same veth path.

    Args:
        nbytes: chunk length.
        rounds: measured fetch / UDP pairs per path.
        pool_path: also measure the pool-behind-the-switch path.
        kind: the switch: ``"refswitch"`` or ``"bmv2"`` (records get ``path=bmv2``).

    Returns:
        One probe record per path, with ``path`` set.

    Raises:
        TargetUnavailableError: the testbed cannot be built here (not root, ...).
        RuntimeError: a probe failed.
    """
    records: list[dict[str, Any]] = []
    with (
        tempfile.TemporaryDirectory(prefix="kvcast-bench-hostagent-") as logdir,
        contextlib.closing(SwitchTestbed(Path(logdir), kind)) as tb,
    ):
        t0 = time.monotonic()
        tb.load(nbytes)
        load_s = time.monotonic() - t0
        rec = _probe(tb, nbytes, rounds)
        rec.update(path="refswitch" if kind == "refswitch" else kind, sram_load_s=load_s)
        records.append(rec)
        if pool_path:
            pool = tb.in_ns(
                tb.peer_ns, sys.executable, "-m", "poolnode", "--backend", "memory",
                "--host", PEER_IP, "--port", str(c.KVP_UDP_PORT),
                "--preload", f"{TENANT}:{KEY:#x}:{nbytes}:{SEED}",
                "--source-tenants", f"{HOST_IP}={TENANT}",  # the client, the one sender
            )  # fmt: skip
            with pool_node(pool) as (_, pool_pid):
                fpg = str(frags_per_data(1500))
                rec = _probe(
                    tb, nbytes, rounds, "--nocache", "--frags-per-get", fpg,
                    "--udp-payload", str(int(fpg) * c.FRAG_BYTES), "--pool-pid", str(pool_pid),
                )  # fmt: skip
            rec.update(path="refswitch-pool")
            records.append(rec)
    return records


def cpu_ratio(rec: dict[str, Any]) -> float:
    """Plain UDP's CPU per fragment over the fetch's, every process on the path counted.

    On a machine with cores to spare both loops are CPU-bound and this is what ``ratio``
    tends to; when other work keeps the cores busy, waiting for a core costs both loops
    alike and ``ratio`` drifts towards 1, while this stays what the code costs.
    """
    fetch = rec["fetch_client_us"] + rec["fetch_switch_us"] + rec["fetch_pool_us"]
    udp = rec["udp_client_us"] + rec["udp_switch_us"]
    return float(udp / fetch) if fetch > 0 else 0.0


__all__ = ["SwitchTestbed", "cpu_ratio", "measure_refswitch"]
