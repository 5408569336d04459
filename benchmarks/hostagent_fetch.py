"""Host agent fetch goodput into a tensor: through the reference switch, on loopback, vs Mooncake.

Each line is a ratio of two things measured side by side in one run:

``path=refswitch``
    The reference switch (``python -m refswitch``) runs as a process on two veth pairs. The host
    end of port 1 is moved into a network namespace ("host", 10.0.0.1) and the host end of port 2
    into another ("peer", 10.0.1.1); both resolve the service VIP and each other to the switch
    MAC, and the switch routes both addresses (``ipv4_lpm``). A synthetic chunk is loaded into
    switch SRAM (``P4RuntimeClient.load_chunk``). Then ``python -m hostagent.bench probe`` runs
    in the host namespace (``ip netns exec``) and alternates: one fetch of the chunk through the
    switch (one GET per fragment, every fragment an SRAM hit) and one plain-UDP transfer of the
    same bytes in datagrams of the same payload size (``FRAG_BYTES``), sent from a socket in the
    peer namespace to the host through the switch's L3 path with the same window. Both cost
    the switch one pipeline pass per fragment and the probe one receive and one copy per
    fragment, so ``ratio = fetch_MBps / udp_MBps`` is what KVP (GET, SRAM read, CRC check,
    fragment bookkeeping) costs over bare UDP on the same path. ``ratio_paired`` is the median
    of the per-round ratios. The line also gives the CPU microseconds per fragment of the
    probe (``*_client_us``) and of the switch (``*_switch_us``) in each loop, and
    ``cpu_ratio``, plain UDP's CPU per fragment over the fetch's: on a machine whose cores are
    busy with other work both loops wait for a core alike and ``ratio`` drifts towards 1,
    while ``cpu_ratio`` stays what the two paths cost.
``path=refswitch-pool``
    The same, with a pool node (``python -m poolnode --backend memory``) in the peer namespace
    behind the switch: ``NOCACHE`` GETs of 5 fragments go through the switch to the pool, which
    answers 1280-byte DATA; the plain-UDP baseline then uses 1280-byte datagrams. This path
    crosses the switch twice per DATA (the GET to the pool, the DATA back) and runs a third
    process (the pool node, ``fetch_pool_us``), against one crossing for a plain datagram: its
    ratio is what a pool-served fetch achieves relative to one-way UDP, not a like-for-like
    protocol overhead.
``path=bmv2``
    The ``path=refswitch`` measurement with BMv2 (``simple_switch_grpc``, the same P4 program)
    as the switch, where it is installed: a GET hit there costs BMv2 32 register reads, which
    puts the reference target's ratio in context.
``path=mooncake``
    ``mooncake_master`` and a pool node holding the chunk in its Mooncake segment
    (``python -m poolnode --master ...``) on loopback. This process opens its own Mooncake
    client (no segment of its own, so every read is a TCP transfer from the pool node's
    segment) and alternates ``get_into`` of the chunk with a KVP fetch of it from the same pool
    node over UDP loopback. ``ratio_to_kvp`` is Mooncake's goodput over that KVP fetch's;
    ``ratio_to_kvp_refswitch`` over the through-switch fetch of the same chunk size above.

``path=multi_chunk``
    A prefix of ``MULTI_CHUNKS`` chunks from a pool node on loopback (in-memory backend, its own
    process, jumbo MTU): ``fetch`` after ``fetch`` (``serial_MBps``) alternated with one
    ``fetch_many`` keeping ``chunks_in_flight`` chunks in flight (``windowed_MBps``); ``ratio``
    is the serial time over the windowed time (> 1: the window helps).

``path=agent_receive``
    The agent's receive path alone (``measure_receive``): a chunk as multicast-replica DATA of
    1 (``sram``, 256-B datagrams), 5 (``mtu1500``) or 34 (``mtu9000``) fragments, sent by a
    native sender in its own process (``benchmarks.udp_feed``), received by a follower
    ``FetchClient`` set up for that MTU and, alternately, by a C loop that only counts bytes
    (``kvcast._native.recv_count``, the ceiling). ``feed=stream``: the receiver waits and the
    sender sends (can the agent keep up with a native sender?); ``feed=drain``: the chunk is
    queued first and the receiver is timed alone (what it costs per byte). ``cpu_ratio`` is
    the ceiling's CPU time over the agent's.
``path=pool_send``
    The pool node's send of a 2 MiB chunk answering 256-fragment GETs (``answer`` and
    ``send_data``) against ``send_batch`` of the same DATAs built beforehand, one datagram per
    message (``measure_send``); ``gso=1``: the pool node sends UDP GSO messages, as
    ``python -m poolnode --gso`` does (the same datagrams on the wire).

``path=mac``
    What end-to-end integrity costs (hostagent.integrity): a pool-node server in this process
    holds the chunk and its keyed MAC; fetches without the tenant key and with it (which also
    fetch the 32-byte MAC object and compute BLAKE2b over the chunk) alternate. ``ratio`` is
    the keyed fetch's goodput over the plain one's; ``blake2b_us`` the MAC computation alone.

The loopback pool-server line of ``hostagent.bench`` (``bench fetch ...``) runs first. Lines
that cannot run here (not root, no Mooncake) say ``skipped=<reason>``.

Classes:
    SwitchTestbed: veth pairs, two namespaces and a programmed reference switch (a context
        manager that removes everything it made).

Functions:
    measure_refswitch: the through-switch fetch vs plain-UDP probe.
    measure_mooncake: Mooncake ``get_into`` vs KVP loopback fetch.
    measure_multi: a multi-chunk prefix, one chunk at a time vs several in flight.
    measure_mac: a fetch with the chunk's keyed MAC checked vs one without.
    measure_receive: the agent's receive path vs a counting loop, fed by a native sender.
    measure_send: the pool node's send vs sending the same DATAs prebuilt.
    run: the suite entry point (prints ``bench hostagent_fetch ...`` lines).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

from benchmarks import bench_line
from benchmarks.udp_feed import KEY, SEED, TENANT  # the feed's chunk is the suite's
from emulation.targets import REPO, SwitchProcess, TargetUnavailableError, VethPorts, bmv2_binary
from hostagent import bench as hostbench
from kvcast import p4constants as c
from kvcast import procs, wire
from kvcast.native import describe as describe_data_path
from kvcast.p4rt_client import Lpm
from kvcast.synthetic import synthetic_chunk
from poolnode.server import frags_per_data

SUITE = "hostagent_fetch"
SWITCH_MAC, VIP = "02:00:00:00:00:fe", "10.0.100.1"
HOST_MAC, HOST_IP = "00:00:00:00:00:01", "10.0.0.1"
PEER_MAC, PEER_IP = "00:00:00:00:01:01", "10.0.1.1"
# One 16-token block of DESIGN.md's small model (24 layers x K,V x 2 heads x 64 x bf16): 192 KiB.
CHUNK_BYTES = 24 * 2 * 2 * 64 * 2 * 16
# The larger chunk of the Mooncake comparison: a 2 MiB block (a 128-token block of that model,
# or a 16-token block of a model 8x wider).
LARGE_CHUNK_BYTES = 2 << 20
# Loopback carries jumbo frames: the pool node and the client both use a 9000-byte MTU, and a
# GET asks for 256 fragments (the pool node's maximum, answered in eight 34-fragment DATAs).
JUMBO_MTU = 9000
LOOPBACK_FRAGS_PER_GET = 256
# Chunks of the multi-chunk line: a prefix of 8 blocks, one fetch_many.
MULTI_CHUNKS = 8


def _ip(text: str) -> int:
    return int.from_bytes(bytes(int(x) for x in text.split(".")), "big")


def _mac(text: str) -> int:
    return int(text.replace(":", ""), 16)


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
                {"dst_addr": Lpm(_ip(ip), 32)},
                c.ACTION_INGRESS_FORWARDING_ROUTE,
                {"port": port, "smac": _mac(SWITCH_MAC), "dmac": _mac(mac)},
            )
        # The host's port bound to its address (the reference target denies an unknown port).
        cl.insert(
            c.TABLE_INGRESS_PORT_ROLE_PORT_ROLE,
            {"port": 1},
            c.ACTION_INGRESS_PORT_ROLE_BIND_HOST,
            {"addr": _ip(HOST_IP), "check_tenant": 0},
        )
        cl.insert(
            c.TABLE_INGRESS_PORT_ROLE_PORT_ROLE,
            {"port": 2},
            c.ACTION_INGRESS_PORT_ROLE_SET_PORT_ROLE,
            {"role": c.PORT_ROLE_POOL},
        )
        for bucket in range(c.POOL_BUCKETS):
            cl.insert(
                c.TABLE_INGRESS_POOL_OWNER_POOL_OWNER,
                {"bucket": bucket},
                c.ACTION_INGRESS_POOL_OWNER_SET_POOL,
                {"pool_ip": _ip(PEER_IP)},
            )

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

    def __enter__(self) -> SwitchTestbed:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


@contextlib.contextmanager
def _pool_node(cmd: list[str]) -> Iterator[tuple[int, int]]:
    """Runs ``python -m poolnode ...`` (``cmd``) until the block ends.

    Yields:
        ``(UDP port, pid)``. ``ip netns exec`` execs its command, so the pid is the pool node's.
    """
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=REPO)  # fmt: skip
    try:
        assert proc.stdout is not None
        seen: list[str] = []
        for line in proc.stdout:
            seen.append(line.rstrip())
            match = re.search(r"poolnode listening .*port=(\d+)", line)
            if match:
                break
        else:
            raise RuntimeError("poolnode exited before listening: " + " | ".join(seen[-5:]))
        # Keep reading its output so a chatty pool node never blocks on a full pipe.
        threading.Thread(target=proc.stdout.read, daemon=True).start()
        yield int(match.group(1)), proc.pid
    finally:
        procs.stop(proc, 5)


def _probe(tb: SwitchTestbed, nbytes: int, rounds: int, *extra: str) -> dict[str, Any]:
    cmd = tb.in_ns(
        tb.host_ns, sys.executable, "-m", "hostagent.bench", "probe",
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
        SwitchTestbed(Path(logdir), kind) as tb,
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
            )  # fmt: skip
            with _pool_node(pool) as (_, pool_pid):
                fpg = str(frags_per_data(1500))
                rec = _probe(
                    tb, nbytes, rounds, "--nocache", "--frags-per-get", fpg,
                    "--udp-payload", str(int(fpg) * c.FRAG_BYTES), "--pool-pid", str(pool_pid),
                )  # fmt: skip
            rec.update(path="refswitch-pool")
            records.append(rec)
    return records


@contextlib.contextmanager
def _stderr_to_file() -> Iterator[Any]:
    """Sends this process's file descriptor 2 to a temporary file for the block.

    Mooncake's C++ client logs every setup step to standard error, around Python's back.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as log:
        os.dup2(log.fileno(), 2)
        try:
            yield log
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def measure_mooncake(
    nbytes: int,
    rounds: int,
    warmup: int = 3,
    mtu: int = JUMBO_MTU,
    frags_per_get: int | None = LOOPBACK_FRAGS_PER_GET,
    gso: bool = True,
) -> dict[str, float]:
    """Mooncake ``get_into`` over TCP vs a KVP fetch from the same pool node, on loopback.

    Args:
        nbytes: chunk length.
        rounds: measured ``get_into`` / fetch pairs.
        warmup: pairs run first and not counted (the first reads set up connections).
        mtu: the pool node's and the client's MTU (loopback carries jumbo frames).
        frags_per_get: fragments per GET (None: one DATA's worth).
        gso: the pool node sends its DATAs as UDP GSO messages (``--gso``: loopback, like a
            NIC, cuts them into the same datagrams; Mooncake's TCP is segmented the same way).

    Returns:
        ``get_into_MBps``, ``kvp_MBps`` and medians.

    Raises:
        MooncakeUnavailableError: Mooncake is not installed.
        RuntimeError: a read or a fetch failed or returned wrong bytes.
    """
    import torch

    from hostagent.fetch import FetchClient
    from poolnode.mooncake import MooncakeBackend, MooncakeMaster

    data = synthetic_chunk(TENANT, KEY, nbytes, SEED)
    with MooncakeMaster() as master:
        pool = [
            sys.executable, "-m", "poolnode", "--master", master.address, "--segment-mib", "64",
            "--host", "127.0.0.1", "--port", "0", "--preload", f"{TENANT}:{KEY:#x}:{nbytes}:{SEED}",
            "--mtu", str(mtu), *(["--gso"] if gso else []),
        ]  # fmt: skip
        with _pool_node(pool) as (port, _):
            with _stderr_to_file() as log:
                try:
                    reader = MooncakeBackend(master.address, global_segment_size=0,
                                             local_buffer_size=16 << 20)  # fmt: skip
                except Exception:
                    log.seek(0)
                    sys.stderr.write(log.read().decode(errors="replace")[-2000:])
                    raise
            dst = torch.zeros(nbytes, dtype=torch.uint8)
            view = dst.numpy().data
            mc_s: list[float] = []
            kvp_s: list[float] = []
            lone_s: list[float] = []
            lone_paths: set[str] = set()
            kwargs: dict[str, Any] = {
                "timeout_s": 0.05, "max_timeout_s": 0.5, "mtu": mtu,
                "frags_per_get": frags_per_get, "socket_buffer_bytes": 16 << 20,
            }  # fmt: skip
            try:
                with (
                    FetchClient(("127.0.0.1", port), **kwargs) as cl,
                    FetchClient(("127.0.0.1", port), direct=reader, window=1, **kwargs) as lone,
                ):
                    for i in range(-warmup, rounds):  # warm-up: handshakes, caches
                        dst.zero_()
                        t0 = time.perf_counter()
                        got = reader.get_into(TENANT, KEY, view)
                        t1 = time.perf_counter()
                        if got != nbytes or dst.numpy().tobytes() != data:
                            raise RuntimeError(f"Mooncake get_into returned {got} or wrong bytes")
                        dst.zero_()
                        report = cl.fetch(TENANT, KEY, dst, nbytes)
                        if not report.ok or dst.numpy().tobytes() != data:
                            raise RuntimeError(f"KVP loopback fetch failed: {report}")
                        dst.zero_()
                        # A lone miss: the agent sees the pool answer and reads the rest
                        # through Mooncake (one GET in flight, so the first answer is not
                        # already the whole chunk).
                        solo = lone.fetch(TENANT, KEY, dst, nbytes)
                        if not solo.ok or dst.numpy().tobytes() != data:
                            raise RuntimeError(f"lone-miss fetch failed: {solo}")
                        if i >= 0:
                            mc_s.append(t1 - t0)
                            kvp_s.append(report.duration_s)
                            lone_s.append(solo.duration_s)
                            lone_paths.add(solo.path)
            finally:
                reader.close()
    mc, kvp, solo_s = statistics.median(mc_s), statistics.median(kvp_s), statistics.median(lone_s)
    return {"get_into_MBps": nbytes / mc / 1e6, "kvp_MBps": nbytes / kvp / 1e6,
            "get_into_ms": mc * 1e3, "kvp_ms": kvp * 1e3, "lone_MBps": nbytes / solo_s / 1e6,
            "lone_direct": float(lone_paths == {"direct"})}  # fmt: skip


def measure_multi(
    nbytes: int,
    chunks: int,
    in_flight: int,
    rounds: int,
    warmup: int = 2,
    mtu: int = JUMBO_MTU,
    frags_per_get: int | None = LOOPBACK_FRAGS_PER_GET,
) -> dict[str, float]:
    """A prefix of ``chunks`` chunks from one pool node on loopback, one chunk vs several at once.

    ``fetch`` after ``fetch`` (one chunk at a time) and ``fetch_many`` with ``in_flight`` chunks
    in flight, alternated. The pool node runs in its own process with the in-memory backend (no
    Mooncake needed), as in the ``mooncake`` line otherwise (jumbo MTU, ``frags_per_get``
    fragments per GET).

    Args:
        nbytes: bytes per chunk.
        chunks: chunks per prefix.
        in_flight: ``max_chunks_in_flight`` of the windowed fetch.
        rounds: measured pairs.
        warmup: pairs run first and not counted.
        mtu: the pool node's and the client's MTU.
        frags_per_get: fragments per GET (None: one DATA's worth).

    Returns:
        ``serial_MBps``, ``windowed_MBps`` (medians over the rounds) and their ``ratio``.

    Raises:
        RuntimeError: a fetch failed or returned wrong bytes.
    """
    import torch

    from hostagent.fetch import ChunkRequest, FetchClient

    keys = [KEY + 1 + i for i in range(chunks)]
    data = [synthetic_chunk(TENANT, k, nbytes, SEED) for k in keys]
    pool = [
        sys.executable, "-m", "poolnode", "--backend", "memory", "--host", "127.0.0.1",
        "--port", "0", "--mtu", str(mtu), "--cache-mib", "0",
        *(a for k in keys for a in ("--preload", f"{TENANT}:{k:#x}:{nbytes}:{SEED}")),
    ]  # fmt: skip
    dsts = [torch.zeros(nbytes, dtype=torch.uint8) for _ in keys]
    reqs = [ChunkRequest(TENANT, k, d, nbytes) for k, d in zip(keys, dsts, strict=True)]
    serial_s: list[float] = []
    windowed_s: list[float] = []

    def check(reports: list[Any], how: str) -> None:
        for r, d, want in zip(reports, dsts, data, strict=True):
            if not r.ok or d.numpy().tobytes() != want:
                raise RuntimeError(f"{how} fetch failed: {r}")
        for d in dsts:
            d.zero_()

    with _pool_node(pool) as (port, _), FetchClient(
        ("127.0.0.1", port), timeout_s=0.05, max_timeout_s=0.5, mtu=mtu,
        frags_per_get=frags_per_get, socket_buffer_bytes=16 << 20,
        max_chunks_in_flight=in_flight,
    ) as cl:  # fmt: skip
        for i in range(-warmup, rounds):
            t0 = time.perf_counter()
            one = [cl.fetch(TENANT, r.key, r.dst, nbytes) for r in reqs]
            t1 = time.perf_counter()
            check(one, "serial")
            t2 = time.perf_counter()
            many = cl.fetch_many(reqs)
            t3 = time.perf_counter()
            check(many, "windowed")
            if i >= 0:
                serial_s.append(t1 - t0)
                windowed_s.append(t3 - t2)
    total = nbytes * chunks
    serial, windowed = statistics.median(serial_s), statistics.median(windowed_s)
    return {"serial_MBps": total / serial / 1e6, "windowed_MBps": total / windowed / 1e6,
            "ratio": serial / windowed}  # fmt: skip


def measure_mac(nbytes: int, rounds: int) -> dict[str, float]:
    """What the keyed chunk MAC costs a fetch: with and without the tenant key, alternated.

    Both fetch the same chunk from one pool-node server on loopback (in this process); the one
    with the key also fetches the 32-byte MAC object and computes BLAKE2b over the chunk.

    Returns:
        ``plain_MBps``, ``mac_MBps`` (medians) and ``blake2b_us``, the MAC computation alone.

    Raises:
        RuntimeError: a fetch failed or returned wrong bytes.
    """
    import torch

    from hostagent.fetch import FetchClient
    from hostagent.integrity import chunk_mac, mac_key_of
    from poolnode.backend import InMemoryBackend
    from poolnode.server import PoolServer

    secret = bytes(range(32))
    data = synthetic_chunk(TENANT, KEY, nbytes, SEED)
    backend = InMemoryBackend()
    backend.put(TENANT, KEY, data)
    backend.put(TENANT, mac_key_of(KEY), chunk_mac(secret, TENANT, KEY, data))
    dst = torch.zeros(nbytes, dtype=torch.uint8)
    plain_s: list[float] = []
    mac_s: list[float] = []
    with (
        PoolServer(backend, "127.0.0.1", 0) as server,
        FetchClient(server.address, timeout_s=0.05, max_timeout_s=0.5) as plain,
        FetchClient(
            server.address, timeout_s=0.05, max_timeout_s=0.5, mac_keys={TENANT: secret}
        ) as keyed,
    ):
        for i in range(-2, rounds):
            for client, times in ((plain, plain_s), (keyed, mac_s)):
                dst.zero_()
                report = client.fetch(TENANT, KEY, dst)
                if not report.ok or dst.numpy().tobytes() != data:
                    raise RuntimeError(f"fetch for the MAC benchmark failed: {report}")
                if i >= 0:
                    times.append(report.duration_s)
    t0 = time.perf_counter()
    for _ in range(rounds):
        chunk_mac(secret, TENANT, KEY, data)
    mac_us = (time.perf_counter() - t0) / rounds * 1e6
    return {
        "plain_MBps": nbytes / statistics.median(plain_s) / 1e6,
        "mac_MBps": nbytes / statistics.median(mac_s) / 1e6,
        "blake2b_us": mac_us,
    }


def _now() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def measure_receive(
    nbytes: int, frags_per_msg: int, rounds: int, mtu: int = JUMBO_MTU
) -> dict[str, dict[str, float]]:
    """The agent's receive rate alone vs a receive loop that only counts (the ceiling).

    A native sender in its own process (``benchmarks.udp_feed``: the chunk as multicast-replica
    DATA of ``frags_per_msg`` fragments, prebuilt, one ``sendmmsg`` call) feeds two receivers:
    a follower ``FetchClient`` set up for ``mtu`` (checks, CRC, the payload into the tensor;
    whichever data path ``KVCAST_NATIVE`` selects) and ``kvcast._native.recv_count`` on a plain
    socket. Two feeds, all four alternated each round, medians:

    ``stream``
        The sender starts while the receiver waits (the issue's "fed by a native sender on
        loopback"): the time from the sender's first datagram to the receiver's last. Each side
        has a core; the receiver keeps up or the sender waits for it (the socket buffer holds
        the whole chunk, so nothing is lost either way).
    ``drain``
        The whole chunk is queued in the receiving socket first, then the receiver alone is
        timed draining it: its CPU cost per byte, with no sender to wait for.

    Both are also timed in the receiving thread's CPU time (``time.thread_time``: the system
    calls included, the time other processes hold the core not): on a shared machine a 5 ms
    drain is more often interrupted than a 4 ms one, which the wall-clock ratio counts against
    the slower side.

    Returns:
        Per feed (``stream``, ``drain``): ``agent_MBps``, ``ceiling_MBps``,
        ``agent_frags_per_s``, ``ceiling_frags_per_s``, ``cpu_ratio`` (the ceiling's median
        CPU time over the agent's); ``stream`` also ``sender_MBps`` (the sender's own time).

    Raises:
        RuntimeError: kvcast._native is not built (the ceiling is native code), or a round
            lost datagrams (the socket buffer could not hold the chunk).
    """
    import torch

    from benchmarks.udp_feed import GROUP, SENDER, Feed
    from hostagent.fetch import FetchClient
    from kvcast.native import native

    if native is None:
        raise RuntimeError("kvcast._native not built: no native receive ceiling to compare with")
    frags = -(-nbytes // c.FRAG_BYTES)
    plain = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    plain.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 20)
    plain.bind(("127.0.0.1", 0))
    rxbuf = bytearray(65536 * native.MAX_BATCH)
    dst = torch.zeros(nbytes, dtype=torch.uint8)
    wall: dict[tuple[str, str], list[float]] = {}
    cpu: dict[tuple[str, str], list[float]] = {}
    sender_s: list[float] = []
    try:
        with (
            Feed() as feed,
            FetchClient(
                ("127.0.0.1", 9), group=GROUP, mtu=mtu, socket_buffer_bytes=16 << 20,
                deadline_s=10, pool_addrs=[SENDER],
            ) as client,
        ):  # fmt: skip
            count = feed.build(nbytes, frags_per_msg)

            def agent() -> None:
                report = client.follow(TENANT, KEY, dst, nbytes, stall_s=5.0, first_wait_s=5.0)
                if not report.ok or report.frags_stream != frags:
                    raise RuntimeError(f"the receive benchmark lost datagrams: {report}")

            def ceiling() -> None:
                got, _ = native.recv_count(plain.fileno(), rxbuf, 65536, count, 1000)
                if got != count:
                    raise RuntimeError(f"the ceiling loop got {got} of {count} datagrams")

            receivers = (
                ("agent", agent, client.address),
                ("ceiling", ceiling, plain.getsockname()),
            )
            for _ in range(rounds):
                for side, receive, to in receivers:
                    # stream: the sender starts, the receiver is already waiting.
                    feed.start(to)
                    c0 = time.thread_time()
                    receive()
                    t_end = _now()
                    cpu.setdefault(("stream", side), []).append(time.thread_time() - c0)
                    t0, t1, _ = feed.finish()
                    wall.setdefault(("stream", side), []).append(t_end - t0)
                    sender_s.append(t1 - t0)
                    # drain: the whole chunk is queued first.
                    feed.start(to)
                    feed.finish()
                    c0, t0 = time.thread_time(), _now()
                    receive()
                    wall.setdefault(("drain", side), []).append(_now() - t0)
                    cpu.setdefault(("drain", side), []).append(time.thread_time() - c0)
    finally:
        plain.close()
    out: dict[str, dict[str, float]] = {}
    for feed_kind in ("stream", "drain"):
        a = statistics.median(wall[(feed_kind, "agent")])
        z = statistics.median(wall[(feed_kind, "ceiling")])
        out[feed_kind] = {
            "agent_MBps": nbytes / a / 1e6,
            "ceiling_MBps": nbytes / z / 1e6,
            "agent_frags_per_s": frags / a,
            "ceiling_frags_per_s": frags / z,
            "cpu_ratio": statistics.median(cpu[(feed_kind, "ceiling")])
            / statistics.median(cpu[(feed_kind, "agent")]),
        }
    out["stream"]["sender_MBps"] = nbytes / statistics.median(sender_s) / 1e6
    return out


def measure_send(nbytes: int, mtu: int, rounds: int, gso: bool = False) -> dict[str, float]:
    """The pool node's send rate for one chunk vs sending the same datagrams prebuilt (ceiling).

    The pool node's side, as its server loop does it: ``KvpGetHandler.answer`` of GETs for the
    whole chunk (256 fragments each), then, where kvcast._native is in use, ``send_data``
    (headers, CRCs and ``sendmmsg`` in C), else ``data_replies`` and one ``sendmsg`` per DATA,
    into a socket whose buffer holds the whole chunk. The
    ceiling: ``kvcast._native.send_batch`` of the same datagrams built beforehand, one datagram
    per message. With ``gso`` the pool node sends as ``PoolServer(gso=True)`` does (UDP GSO
    messages of up to ``GSO_DATAS`` DATAs, the same datagrams on the wire). Alternated, medians.

    Returns:
        ``pool_MBps``, ``ceiling_MBps``.

    Raises:
        RuntimeError: kvcast._native is not built.
    """
    from kvcast.native import enabled, native
    from poolnode.backend import InMemoryBackend
    from poolnode.server import GSO_DATAS, MAX_GET_FRAGMENTS, DataAnswer, KvpGetHandler

    if native is None:
        raise RuntimeError("kvcast._native not built: no native send ceiling to compare with")
    nat = enabled()
    if gso and nat is None:
        raise RuntimeError("UDP GSO sends need the native data path (KVCAST_NATIVE=0 is set)")
    data = synthetic_chunk(TENANT, KEY, nbytes, SEED)
    backend = InMemoryBackend()
    backend.put(TENANT, KEY, data)
    handler = KvpGetHandler(backend, mtu=mtu, dedup_window=0)
    n = -(-nbytes // c.FRAG_BYTES)
    gets = [
        wire.get_message(TENANT, KEY, f, req_id=f, count=min(MAX_GET_FRAGMENTS, n - f))
        for f in range(0, n, MAX_GET_FRAGMENTS)
    ]
    prebuilt = [r for g in gets for r in handler.handle(g)]
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 20)
    rx.bind(("127.0.0.1", 0))
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16 << 20)
    to = rx.getsockname()
    ip = int.from_bytes(socket.inet_aton(to[0]), "big")
    rxbuf = bytearray(65536 * native.MAX_BATCH)
    pool_s: list[float] = []
    ceiling_s: list[float] = []
    try:
        for _ in range(rounds):
            t0 = time.perf_counter()
            for g in gets:
                answer = handler.answer(g)
                if not isinstance(answer, DataAnswer):
                    raise RuntimeError(f"the pool node did not serve GET {g[:40]!r}: {answer}")
                if nat is not None:
                    header, chunk, first, end, _, crcs = answer
                    nat.send_data(
                        tx.fileno(), (ip, to[1]), header, chunk, first, end,
                        handler.frags_per_data, c.FRAG_BYTES, crcs, GSO_DATAS if gso else 0,
                    )  # fmt: skip
                else:
                    for header, payload in handler.data_replies(answer):
                        tx.sendmsg((header, payload), (), 0, to)
            pool_s.append(time.perf_counter() - t0)
            native.recv_count(rx.fileno(), rxbuf, 65536, len(prebuilt), 1000)
            t0 = time.perf_counter()
            native.send_batch(tx.fileno(), (ip, to[1]), prebuilt)
            ceiling_s.append(time.perf_counter() - t0)
            native.recv_count(rx.fileno(), rxbuf, 65536, len(prebuilt), 1000)
    finally:
        rx.close()
        tx.close()
    return {
        "pool_MBps": nbytes / statistics.median(pool_s) / 1e6,
        "ceiling_MBps": nbytes / statistics.median(ceiling_s) / 1e6,
    }


def _cpu_ratio(rec: dict[str, Any]) -> float:
    """Plain UDP's CPU per fragment over the fetch's, every process on the path counted.

    On a machine with cores to spare both loops are CPU-bound and this is what ``ratio``
    tends to; when other work keeps the cores busy, waiting for a core costs both loops
    alike and ``ratio`` drifts towards 1, while this stays what the code costs.
    """
    fetch = rec["fetch_client_us"] + rec["fetch_switch_us"] + rec["fetch_pool_us"]
    udp = rec["udp_client_us"] + rec["udp_switch_us"]
    return float(udp / fetch) if fetch > 0 else 0.0


def _reason(exc: BaseException) -> str:
    return re.sub(r"\s+", "-", str(exc).strip())[:120] or type(exc).__name__


def run(quick: bool = False) -> list[str]:
    """Runs the suite and prints its result lines.

    Args:
        quick: 5 rounds per path instead of 15, one loopback line (under a minute).

    Returns:
        The printed lines.
    """
    lines = list(hostbench.run(quick, repeat=20))
    nbytes = CHUNK_BYTES
    rounds = 5 if quick else 15

    def emit(**fields: object) -> None:
        line = bench_line(SUITE, **fields)
        print(line, flush=True)
        lines.append(line)

    kvp_switch: float | None = None
    for kind in ("refswitch", "bmv2"):
        if kind == "bmv2" and bmv2_binary() is None:
            emit(path="bmv2", skipped="simple_switch_grpc-not-installed")
            continue
        try:
            records = measure_refswitch(nbytes, rounds, pool_path=kind == "refswitch", kind=kind)
        except TargetUnavailableError as exc:
            emit(path=kind, skipped=_reason(exc))
            continue
        for rec in records:
            if rec["path"] == "refswitch":
                kvp_switch = float(rec["fetch_MBps"])
            emit(
                path=rec["path"], chunk_bytes=nbytes, payload=rec["udp_payload"],
                fetch_MBps=float(rec["fetch_MBps"]), udp_MBps=float(rec["udp_MBps"]),
                ratio=float(rec["ratio"]), ratio_paired=float(rec["ratio_paired"]),
                cpu_ratio=_cpu_ratio(rec), rounds=rounds,
                fetch_client_us=float(rec["fetch_client_us"]),
                udp_client_us=float(rec["udp_client_us"]),
                fetch_switch_us=float(rec["fetch_switch_us"]),
                udp_switch_us=float(rec["udp_switch_us"]),
                fetch_pool_us=float(rec["fetch_pool_us"]), frags_hit=rec["frags_hit"],
                frags_pool=rec["frags_pool"], retries=rec["retries"],
                udp_resent=rec["udp_resent"],
            )  # fmt: skip
    data_path = describe_data_path().split(" ")[0]
    for size in (nbytes, LARGE_CHUNK_BYTES):
        try:
            mc = measure_mooncake(size, 20)
        except ImportError as exc:
            emit(path="mooncake", chunk_bytes=size, skipped=_reason(exc))
            continue
        emit(
            path="mooncake", chunk_bytes=size, mtu=JUMBO_MTU, pool_gso=1,
            frags_per_get=LOOPBACK_FRAGS_PER_GET, data_path=data_path,
            get_into_MBps=mc["get_into_MBps"], kvp_loopback_MBps=mc["kvp_MBps"],
            ratio=mc["kvp_MBps"] / mc["get_into_MBps"],
            lone_miss_MBps=mc["lone_MBps"], lone_ratio=mc["lone_MBps"] / mc["get_into_MBps"],
            lone_path="direct" if mc["lone_direct"] else "mixed",
            ratio_to_kvp=mc["get_into_MBps"] / mc["kvp_MBps"],
            ratio_to_kvp_refswitch=(
                mc["get_into_MBps"] / kvp_switch if kvp_switch and size == nbytes else "n/a"
            ),
            rounds=20,
        )  # fmt: skip
    for in_flight in (1, 4):
        mu = measure_multi(nbytes, MULTI_CHUNKS, in_flight, rounds)
        emit(
            path="multi_chunk", chunk_bytes=nbytes, chunks=MULTI_CHUNKS, mtu=JUMBO_MTU,
            frags_per_get=LOOPBACK_FRAGS_PER_GET, data_path=data_path,
            chunks_in_flight=in_flight, serial_MBps=mu["serial_MBps"],
            windowed_MBps=mu["windowed_MBps"], ratio=mu["ratio"], rounds=rounds,
        )  # fmt: skip
    for label, frags_per_msg, size, mtu in (
        ("sram", 1, 1 << 20, JUMBO_MTU),
        ("mtu1500", frags_per_data(1500), LARGE_CHUNK_BYTES, 1500),
        ("mtu9000", frags_per_data(JUMBO_MTU), LARGE_CHUNK_BYTES, JUMBO_MTU),
    ):
        try:
            feeds = measure_receive(size, frags_per_msg, rounds, mtu)
        except RuntimeError as exc:
            emit(path="agent_receive", datagrams=label, skipped=_reason(exc))
            continue
        for feed, rx in feeds.items():
            extra = {"sender_MBps": rx["sender_MBps"]} if "sender_MBps" in rx else {}
            emit(
                path="agent_receive", datagrams=label, feed=feed,
                frags_per_datagram=frags_per_msg, chunk_bytes=size, data_path=data_path,
                agent_MBps=rx["agent_MBps"], ceiling_MBps=rx["ceiling_MBps"],
                agent_frags_per_s=rx["agent_frags_per_s"],
                ceiling_frags_per_s=rx["ceiling_frags_per_s"],
                ratio=rx["agent_MBps"] / rx["ceiling_MBps"], cpu_ratio=rx["cpu_ratio"],
                **extra, rounds=rounds,
            )  # fmt: skip
    for mtu, gso in ((1500, False), (JUMBO_MTU, False), (1500, True), (JUMBO_MTU, True)):
        try:
            tx = measure_send(LARGE_CHUNK_BYTES, mtu, rounds, gso)
        except RuntimeError as exc:
            emit(path="pool_send", mtu=mtu, gso=int(gso), skipped=_reason(exc))
            continue
        emit(
            path="pool_send", mtu=mtu, gso=int(gso), chunk_bytes=LARGE_CHUNK_BYTES,
            data_path=data_path,
            pool_MBps=tx["pool_MBps"], ceiling_MBps=tx["ceiling_MBps"],
            ratio=tx["pool_MBps"] / tx["ceiling_MBps"], rounds=rounds,
        )  # fmt: skip
    mac = measure_mac(nbytes, rounds)
    emit(
        path="mac", chunk_bytes=nbytes, plain_MBps=mac["plain_MBps"], mac_MBps=mac["mac_MBps"],
        ratio=mac["mac_MBps"] / mac["plain_MBps"], blake2b_us=mac["blake2b_us"], rounds=rounds,
    )  # fmt: skip
    return lines


__all__ = [
    "SwitchTestbed",
    "measure_mac",
    "measure_mooncake",
    "measure_multi",
    "measure_receive",
    "measure_refswitch",
    "measure_send",
    "run",
]
