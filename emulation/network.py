"""Builds, programs and tears down an emulated kvcast cluster.

Multicast replicas go to each host's ``AGENT_PORT`` (kvcast.ports), where its agent listens.

Classes:
    Cluster: a running Mininet network built from a :class:`~emulation.topo.ClusterSpec` with an
        injectable switch class, with the switch's base program installed (routes, port roles,
        pool owners, multicast replica destinations) and the hosts' ARP filled in. A context
        manager: leaving it, by return, exception or SIGINT/SIGTERM, removes every namespace,
        interface and process it made. ``source_tenants`` gives its pool nodes the hosts'
        bindings to check GETs against.

Functions:
    cleanup_leftovers: removes what an earlier run that was killed hard (SIGKILL) left behind.

One emulated cluster per machine at a time: Mininet names interfaces by node (``h1-eth0``), and
starting a cluster removes leftovers by those names, as ``mn -c`` does, so a second cluster
started beside a running one would tear the first one down. A cluster therefore holds an
exclusive lock on ``CLUSTER_LOCK`` from before its cleanup until it is stopped; a second one
waits for it (``lock_timeout_s``), saying so, instead of destroying it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from finsy.proto import p4r
from mininet.link import TCLink
from mininet.log import setLogLevel
from mininet.net import Mininet

from emulation.switches import P4Switch, default_switch_class
from emulation.topo import (
    SERVICE_IP,
    SWITCH_MAC,
    ClusterSpec,
    FabricSpec,
    NodeAddr,
    StarTopo,
    addresses,
)
from kvcast import p4constants as c
from kvcast.lifecycle import Service
from kvcast.ports import AGENT_PORT
from kvcast.tools.p4rt_client import Lpm, P4RuntimeClient
from kvcast.wire import ip_int, mac_int

CLUSTER_LOCK = Path("/run/lock/kvcast-cluster.lock")
"""Held by every running cluster of this machine (see the module's docstring)."""

_LEFTOVER_INTF = re.compile(r"^((?:h|p|s)\d+-eth\d+)[@:]")


def cleanup_leftovers() -> list[str]:
    """Removes interfaces and node shells an earlier, hard-killed run left.

    Returns:
        What was removed.
    """
    removed: list[str] = []
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        m = _LEFTOVER_INTF.match(line.split(": ", 1)[1] if ": " in line else "")
        if m:
            subprocess.run(["ip", "link", "del", m.group(1)], capture_output=True)
            removed.append(m.group(1))
    shells = subprocess.run(["pgrep", "-f", "mininet:"], capture_output=True, text=True).stdout
    for pid in shells.split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
            removed.append(f"pid {pid}")
    return removed


class Cluster(Service):
    """A running emulated cluster.

    Args:
        spec: what to build (a :class:`~emulation.topo.FabricSpec` only through
            :class:`~emulation.fabric.FabricCluster`).
        switch_cls: the switch node class (default: BMv2 where installed, else the reference
            target).
        quiet: silence Mininet's own logging.
        lock_timeout_s: how long ``start`` waits for another cluster of this machine to stop.
    """

    def __init__(
        self,
        spec: ClusterSpec | FabricSpec,
        switch_cls: type[P4Switch] | None = None,
        quiet: bool = True,
        lock_timeout_s: float = 1800.0,
    ):
        self.spec = spec
        self.lock_timeout_s = lock_timeout_s
        self._lock: Any = None
        self.switch_cls = switch_cls or default_switch_class()
        self.nodes = {n.name: n for n in self._addresses()}
        self._groups: dict[int, list[int]] = {}
        self._pool_owners: list[int] | None = None
        self.net: Any = None
        self._old_handlers: dict[int, Any] = {}
        if quiet:
            # "critical": tc prints harmless htb quantum warnings at error level for every link.
            setLogLevel("critical")

    # ------------------------------------------------------------------ lifecycle

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    def start(self) -> None:
        """Builds the network, starts the switch and programs it.

        Raises:
            Exception: whatever failed; everything built so far is removed first.
        """
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._old_handlers[sig] = signal.signal(sig, self._on_signal)
        try:
            self._take_lock()
            cleanup_leftovers()
            self.net = Mininet(
                topo=self._topology(),
                switch=self.switch_cls,
                link=TCLink,
                controller=None,
                autoSetMacs=False,
                build=True,
            )
            # Before the switch starts: BMv2 reads its ports through libpcap, whose receive ring
            # is sized from the MTU when it opens them, and would truncate larger frames.
            self._set_mtu()
            self.net.start()
            for node in self.nodes.values():
                self._configure_host(node)
            self._program_switch()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stops the switch process, the hosts and removes every link (idempotent)."""
        try:
            if self.net is not None:
                self.net.stop()
        finally:
            self.net = None
            if self._lock is not None:
                cleanup_leftovers()
                self._lock.close()  # releases the lock
                self._lock = None
            for sig, handler in self._old_handlers.items():
                signal.signal(sig, handler)
            self._old_handlers.clear()

    def _take_lock(self) -> None:
        """Waits for the machine's cluster lock (another running cluster holds it).

        Raises:
            TimeoutError: another cluster held it for ``lock_timeout_s``.
        """
        CLUSTER_LOCK.parent.mkdir(parents=True, exist_ok=True)
        f = CLUSTER_LOCK.open("a+")
        deadline = time.monotonic() + self.lock_timeout_s
        said = False
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    f.close()
                    raise TimeoutError(
                        f"another emulated cluster held {CLUSTER_LOCK} for "
                        f"{self.lock_timeout_s:.0f} s (one cluster per machine at a time)"
                    ) from None
                if not said:
                    print(f"waiting for another emulated cluster to stop ({CLUSTER_LOCK})",
                          flush=True)  # fmt: skip
                    said = True
                time.sleep(0.5)
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        self._lock = f

    def _addresses(self) -> list[NodeAddr]:
        """Every node of the cluster with its switch port."""
        assert isinstance(self.spec, ClusterSpec)
        return addresses(self.spec)

    def _topology(self) -> Any:
        """The Mininet topology the network is built from."""
        return StarTopo(spec=self.spec)

    # ------------------------------------------------------------------ access
    @property
    def switch(self) -> P4Switch:
        """The switch node."""
        return self.net.get("s1")  # type: ignore[no-any-return]

    @property
    def client(self) -> P4RuntimeClient:
        """The switch's primary P4Runtime client."""
        return self.switch.client

    def clients(self) -> list[P4RuntimeClient]:
        """Every switch's primary P4Runtime client (one in a star)."""
        return [self.client]

    def cache_client(self, hosts: list[str]) -> P4RuntimeClient:
        """The client of the switch whose SRAM serves a prefix these hosts share (the one)."""
        return self.client

    def host(self, name: str) -> Any:
        """A Mininet host node by name (``h1``, ``p1``)."""
        return self.net.get(name)

    def hosts(self) -> list[NodeAddr]:
        """GPU hosts in port order."""
        return [n for n in self.nodes.values() if n.role == "host"]

    def pools(self) -> list[NodeAddr]:
        """Pool nodes in port order."""
        return [n for n in self.nodes.values() if n.role == "pool"]

    def source_tenants(self) -> list[str]:
        """A pool node's ``--source-tenants`` arguments for the hosts' bindings on the switch.

        Each GPU host's address with the tenants its port is bound to (``spec.tenants``; ``any``
        where the spec binds none), as the controller's ``/v1/sources`` would serve them: the
        node then refuses a GET naming another tenant (``bad_tenants``) or from an address that
        is no host's (``unknown_sources``). Add the controller's own address where one reads
        chunks from the node.
        """
        tenants = self.spec.tenants
        bound = "any" if tenants is None else ",".join(str(t) for t in tenants)
        return [arg for h in self.hosts() for arg in ("--source-tenants", f"{h.ip}={bound}")]

    # ------------------------------------------------------------------ setup
    def _set_mtu(self) -> None:
        """Gives both ends of every link the spec's MTU (a veth drops what exceeds it)."""
        for link in self.net.links:
            for intf in (link.intf1, link.intf2):
                out = intf.node.cmd(f"ip link set dev {intf.name} mtu {self.spec.mtu}")
                if out.strip():
                    raise RuntimeError(f"cannot set MTU {self.spec.mtu} on {intf.name}: {out}")

    def interface_mtu(self, node: str) -> int:
        """The MTU the kernel reports for ``node``'s first interface (a host or the switch)."""
        n = self.net.get(node)
        intf = next(i for i in n.intfList() if i.name != "lo")
        return int(n.cmd(f"cat /sys/class/net/{intf.name}/mtu").strip())

    def _configure_host(self, node: NodeAddr) -> None:
        h = self.host(node.name)
        h.cmd("sysctl -q -w net.ipv6.conf.all.disable_ipv6=1")
        h.cmd("sysctl -q -w net.ipv6.conf.default.disable_ipv6=1")
        intf = h.defaultIntf().name
        # A software switch forwards frames as its raw socket sees them: with checksum offload a
        # sender's UDP checksum is only completed by the NIC, which veth never does, and the
        # receiver's kernel would drop the frame.
        h.cmd(f"ethtool -K {intf} tx off rx off sg off tso off gso off")
        # Everything goes through the switch's L3: every address resolves to the switch MAC.
        for other in [*self.nodes.values()]:
            if other.name != node.name:
                h.cmd(f"ip neigh replace {other.ip} lladdr {SWITCH_MAC} dev {intf}")
        h.cmd(f"ip neigh replace {SERVICE_IP} lladdr {SWITCH_MAC} dev {intf}")

    def _program_switch(self) -> None:
        cl = self.client
        smac = mac_int(SWITCH_MAC)
        for node in self.nodes.values():
            route = {"port": node.port, "smac": smac, "dmac": mac_int(node.mac)}
            self._program_node(cl, node, route, attached=True)
        self._program_defaults(cl, fabric_ports=[])

    def _program_node(
        self, cl: P4RuntimeClient, node: NodeAddr, route: dict[str, int], attached: bool
    ) -> None:
        """One node's entries on one switch.

        Its route and, where it is ``attached`` to this switch, its L2 entry and its port's
        role: a pool port, or a host port bound to its address and (when the spec names them)
        its tenants, with its replica destination.
        """
        cl.insert(
            c.TABLE_INGRESS_FORWARDING_IPV4_LPM,
            {"dst_addr": Lpm(ip_int(node.ip), 32)},
            c.ACTION_INGRESS_FORWARDING_ROUTE,
            route,
        )
        if not attached:
            return
        cl.insert(
            c.TABLE_INGRESS_FORWARDING_L2_FWD,
            {"dst_addr": mac_int(node.mac)},
            c.ACTION_INGRESS_FORWARDING_L2_FORWARD,
            {"port": node.port},
        )
        if node.role == "pool":
            cl.insert(
                c.TABLE_INGRESS_PORT_ROLE_PORT_ROLE,
                {"port": node.port},
                c.ACTION_INGRESS_PORT_ROLE_SET_PORT_ROLE,
                {"role": c.PORT_ROLE_POOL},
            )
            return
        cl.insert(
            c.TABLE_EGRESS_REPLICA_REPLICA_DST,
            {"rid": node.port},
            c.ACTION_EGRESS_REPLICA_SET_REPLICA_DST,
            {"dmac": mac_int(node.mac), "dip": ip_int(node.ip), "dport": AGENT_PORT},
        )
        tenants = self.spec.tenants
        cl.insert(
            c.TABLE_INGRESS_PORT_ROLE_PORT_ROLE,
            {"port": node.port},
            c.ACTION_INGRESS_PORT_ROLE_BIND_HOST,
            {"addr": ip_int(node.ip), "check_tenant": int(tenants is not None)},
        )
        for tenant in tenants or ():
            cl.insert(
                c.TABLE_INGRESS_PORT_ROLE_TENANT_BINDING,
                {"port": node.port, "tenant": tenant},
                c.ACTION_INGRESS_PORT_ROLE_TENANT_OK,
                {},
            )

    def _program_defaults(self, cl: P4RuntimeClient, fabric_ports: list[int]) -> None:
        """A switch's trusted fabric ports, default-deny for every other port, pool owners."""
        for port in fabric_ports:
            # A fabric port brings in what a switch of the fabric forwards (kvcast.fabric).
            cl.insert(
                c.TABLE_INGRESS_PORT_ROLE_PORT_ROLE,
                {"port": port},
                c.ACTION_INGRESS_PORT_ROLE_SET_PORT_ROLE,
                {"role": c.PORT_ROLE_POOL},
            )
        # No KVP from a port that is neither a host, a pool node nor the fabric.
        cl.set_default(
            c.TABLE_INGRESS_PORT_ROLE_PORT_ROLE,
            c.ACTION_INGRESS_PORT_ROLE_SET_PORT_ROLE,
            {"role": c.PORT_ROLE_DENY},
        )
        for bucket, ip in enumerate(self._bucket_owners()):
            cl.insert(
                c.TABLE_INGRESS_POOL_OWNER_POOL_OWNER,
                {"bucket": bucket},
                c.ACTION_INGRESS_POOL_OWNER_SET_POOL,
                {"pool_ip": ip},
            )

    def _bucket_owners(self) -> list[int]:
        """Each pool bucket's pool node address: bucket b to ``owners[b mod len(owners)]``."""
        pools = self.pools()
        owners = self._pool_owners or list(range(len(pools)))
        return [ip_int(pools[owners[b % len(owners)]].ip) for b in range(c.POOL_BUCKETS)]

    def set_pool_owners(self, owners: Sequence[int]) -> None:
        """Spreads the pool buckets over the pool nodes ``owners`` (on a star's one switch).

        ``owners`` are indexes into :meth:`pools`; bucket b goes to ``owners[b mod
        len(owners)]`` (at start: every pool node, in order). Only the buckets that change are
        rewritten, one MODIFY each (never an entry-less moment); a restarted switch is
        programmed with the latest owners.

        Raises:
            ValueError: no owner, or an index that is not a pool node.
        """
        n = len(self.pools())
        if not owners or any(not 0 <= i < n for i in owners):
            raise ValueError(f"pool owners {list(owners)} are not indexes of {n} pool nodes")
        before = self._bucket_owners()
        self._pool_owners = list(owners)
        for bucket, (old, new) in enumerate(zip(before, self._bucket_owners(), strict=True)):
            if old != new:
                self.client.modify(
                    c.TABLE_INGRESS_POOL_OWNER_POOL_OWNER,
                    {"bucket": bucket},
                    c.ACTION_INGRESS_POOL_OWNER_SET_POOL,
                    {"pool_ip": new},
                )

    def switch_alive(self) -> bool:
        """Whether the switch process is still running."""
        process = self.switch.process
        return process is not None and process.proc.poll() is None

    def restart_switch(self) -> None:
        """Starts a dead (or running: killed first) switch again and programs it as at start.

        The experiments' own client is the incast's controller: after a restart it pushes the
        pipeline and the forwarding, port, pool-owner and replica tables again. Groups and SRAM
        contents are per point, so the next point writes its own.
        """
        self.switch.restart(install=True)
        self._program_switch()

    def add_group(self, group_id: int, hosts: list[str]) -> None:
        """Creates multicast group ``group_id`` over the named GPU hosts (replica id = port).

        Each member's port is also written into ``group_member``: the switch takes a GET naming
        the group only from a member.
        """
        replicas = [(self.nodes[h].port, self.nodes[h].port) for h in hosts]
        self.client.multicast_group(group_id, replicas)
        for port, _ in replicas:
            self.client.insert(
                c.TABLE_INGRESS_PORT_ROLE_GROUP_MEMBER,
                {"group": group_id, "port": port},
                c.ACTION_INGRESS_PORT_ROLE_MEMBER,
                {},
            )
        self._groups[group_id] = [port for port, _ in replicas]

    def remove_group(self, group_id: int) -> None:
        """Deletes a group made by :meth:`add_group` and its membership entries."""
        self.client.multicast_group(group_id, [], update=p4r.Update.DELETE)
        for port in self._groups.pop(group_id, []):
            self.client.delete(
                c.TABLE_INGRESS_PORT_ROLE_GROUP_MEMBER, {"group": group_id, "port": port}
            )

    @contextlib.contextmanager
    def popen(self, node: str, cmd: list[str], **kwargs: Any) -> Iterator[subprocess.Popen[Any]]:
        """Runs a process in a node's namespace; it is killed when the block exits."""
        proc = self.host(node).popen(cmd, **kwargs)
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()

    @contextlib.contextmanager
    def serve(
        self, node: str, cmd: list[str], ready: str, timeout_s: float = 120.0, **kwargs: Any
    ) -> Iterator[re.Match[str]]:
        """Runs a server in a node's namespace once it says it is ready; stops it at block exit.

        Its output goes to a log file (a pipe nobody reads would stop a chatty server once
        full), which is deleted when the block ends normally and kept, its path in the error,
        when it does not.

        Args:
            node: the node.
            cmd: the command.
            ready: a regular expression the server prints once it serves.
            timeout_s: how long to wait for it.
            **kwargs: more ``Popen`` arguments (``cwd``, ``env``).

        Yields:
            The match of ``ready`` in the server's output.

        Raises:
            RuntimeError: the server exited or stayed silent for ``timeout_s`` (with its log).
        """
        with tempfile.NamedTemporaryFile(
            "w", prefix=f"kvcast-{node}-", suffix=".log", delete=False
        ) as log:
            path = Path(log.name)
            with self.popen(node, cmd, stdout=log, stderr=subprocess.STDOUT, **kwargs) as proc:
                deadline = time.monotonic() + timeout_s
                while (match := re.search(ready, path.read_text(errors="replace"))) is None:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        tail = path.read_text(errors="replace")[-2000:]
                        raise RuntimeError(
                            f"{cmd[:3]} on {node} did not start (exit {proc.poll()}); "
                            f"log {path}:\n{tail}"
                        )
                    time.sleep(0.2)
                yield match
        path.unlink()
