"""The small-scale N-to-1 model: N hosts fetch one prefix from one pool node through one switch.

It runs the emulation's four modes (``experiments.incast``) on the same flow model as the
cluster simulation, so the validation against the emulation tests the model itself:

- ``a`` pool-unicast: every host GETs the whole prefix from the pool (several fragments per
  GET, one DATA frame per GET): the pool link carries it N times.
- ``b`` pool-multicast: one host GETs it once with a multicast group; the switch replicates
  each pool DATA to the N hosts: the pool link carries it once.
- ``c`` sram-multicast: the prefix is in switch SRAM; one host's GETs (one per fragment) name
  the group and the switch answers every member.
- ``d`` sram-unicast: every host GETs every fragment from the switch.
- ``r2``, ``r4`` pool-replicas-k: the baseline without the switch's help, Mooncake's answer to
  a hot object: k pool nodes each hold a copy, each behind its own pool link, and host i reads
  the whole prefix from replica ``i mod k`` (unicast): the k pool links carry it N times.

Links: the pool link (bytes/s, pool DATA frames), each host link (bytes/s), the switch's packet
rate (``switch_pps``: unicast forwards per second, one packet in and one out; each copy sent
costs ``replica_cost`` of a forward and the packet received the rest, so a GET answered from
SRAM costs one forward and a DATA replicated to N hosts costs ``1 - r + N r``), optionally a
host's packet-receive rate (``host_pps``). All flows of a point start together; the point's
time is when the last host holds the prefix.

Classes:
    IncastParams: the emulated link and switch parameters.
    IncastPoint: one (mode, N, prefix size) point: its times and pool bytes, as predicted.

Functions:
    predict: run one point.
    relief: T_a / T_x for each mode x.
    replicas: how many pool nodes a mode reads.

Constants:
    MODES: mode names and labels.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from experiments.sim.flows import FlowNetwork, Link
from experiments.sim.hardware import WireFormat, bmv2

__all__ = ["MODES", "IncastParams", "IncastPoint", "predict", "relief", "replicas"]

MODES = {
    "a": "pool-unicast",
    "b": "pool-multicast",
    "c": "sram-multicast",
    "d": "sram-unicast",
    "r2": "pool-replicas-2",
    "r4": "pool-replicas-4",
}


def replicas(mode: str) -> int:
    """Pool nodes holding the prefix in ``mode``: k for ``rK``, 1 otherwise."""
    return int(mode[1:]) if mode.startswith("r") else 1


def _emulation_wire() -> WireFormat:
    # tc on a veth counts the Ethernet header only; Mininet links have a 1500-byte MTU.
    return WireFormat(l2_bytes=14, mtu=1500)


@dataclass(frozen=True)
class IncastParams:
    """Parameters of the emulated N-to-1 setup.

    Attributes:
        pool_mbit: pool link rate (Mbit/s).
        host_mbit: each host link's rate (Mbit/s).
        switch_pps: switch forwards per second (None: not a limit).
        replica_cost: share of one forward's cost that each copy sent costs (the rest is
            receiving and ingress processing); 0.5 unless measured.
        host_pps: DATA packets per second one host agent can take (None: not a limit).
        frag_bytes: fragment size (default: the BMv2 target's, from the generated constants).
        wire: framing on the emulated links.
        fixed_s: time added to every prediction (process start-up, first round trip).
    """

    pool_mbit: float
    host_mbit: float
    switch_pps: float | None = None
    replica_cost: float = 0.5
    host_pps: float | None = None
    frag_bytes: int = field(default_factory=lambda: bmv2().frag_bytes)
    wire: WireFormat = field(default_factory=_emulation_wire)
    fixed_s: float = 0.0


@dataclass(frozen=True)
class IncastPoint:
    """One point of the incast, as the model predicts it (a measured one: ``validate.Measured``).

    Attributes:
        mode: ``a``..``d``.
        n: hosts.
        prefix_bytes: prefix size.
        max_s: time until all N hosts hold the prefix.
        p50_s: median host completion time.
        pool_tx_bytes: bytes the pool node sends (frames as the interface counts them).
    """

    mode: str
    n: int
    prefix_bytes: int
    max_s: float
    p50_s: float
    pool_tx_bytes: float


def predict(mode: str, n: int, prefix_bytes: int, p: IncastParams) -> IncastPoint:
    """Predict one point with the flow model.

    Args:
        mode: one of :data:`MODES`.
        n: hosts (>= 1).
        prefix_bytes: prefix size (> 0).
        p: the setup.

    Returns:
        The prediction.

    Raises:
        ValueError: for an unknown mode or a non-positive size or count.
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; known: {', '.join(MODES)}")
    if n < 1 or prefix_bytes <= 0:
        raise ValueError("need n >= 1 and prefix_bytes > 0")
    if not 0 <= p.replica_cost <= 1:
        raise ValueError(f"replica_cost must be within 0..1, got {p.replica_cost}")
    rep = p.replica_cost
    wire = p.wire
    frag = p.frag_bytes
    per_data = wire.frags_per_data(frag) * frag  # payload bytes of one full pool DATA
    pool_coef = wire.data_frames_bytes(prefix_bytes, frag) / prefix_bytes
    sram_coef = wire.sram_coef(frag)
    net = FlowNetwork()
    pools = [net.link(f"pool{j}", p.pool_mbit * 1e6 / 8) for j in range(replicas(mode))]
    pool = pools[0]
    hosts = [net.link(f"host{i}", p.host_mbit * 1e6 / 8) for i in range(n)]
    switch: Link | None = net.link("switch", p.switch_pps) if p.switch_pps else None
    agents = [net.link(f"agent{i}", p.host_pps) for i in range(n)] if p.host_pps else []

    def host_path(i: int, coef: float, pkt_per_byte: float) -> list[tuple[Link, float]]:
        path = [(hosts[i], coef)]
        if agents:
            path.append((agents[i], pkt_per_byte))
        return path

    flows = []
    if mode == "a" or mode.startswith("r"):
        for i in range(n):
            path = [(pools[i % len(pools)], pool_coef), *host_path(i, pool_coef, 1 / per_data)]
            if switch is not None:
                path.append((switch, 2 / per_data))  # GET forward + DATA forward
            flows.append(net.start(prefix_bytes, path))
        pool_tx = n * wire.data_frames_bytes(prefix_bytes, frag)
    elif mode == "b":
        path = [(pool, pool_coef)]
        for i in range(n):
            path += host_path(i, pool_coef, 1 / per_data)
        if switch is not None:
            path.append((switch, (1 + (1 - rep) + rep * n) / per_data))  # GET, replicated DATA
        flows.append(net.start(prefix_bytes, path))
        pool_tx = wire.data_frames_bytes(prefix_bytes, frag)
    elif mode == "c":
        path = []
        for i in range(n):
            path += host_path(i, sram_coef, 1 / frag)
        if switch is not None:
            path.append((switch, ((1 - rep) + rep * n) / frag))
        flows.append(net.start(prefix_bytes, path))
        pool_tx = 0
    else:
        for i in range(n):
            path = host_path(i, sram_coef, 1 / frag)
            if switch is not None:
                path.append((switch, 1 / frag))
            flows.append(net.start(prefix_bytes, path))
        pool_tx = 0
    net.advance(math.inf)
    done = sorted(f.finish for f in flows)
    if mode in ("b", "c"):
        done = done * n
    median = statistics.median(done)
    return IncastPoint(mode, n, prefix_bytes, done[-1] + p.fixed_s, median + p.fixed_s, pool_tx)


def relief(n: int, prefix_bytes: int, p: IncastParams) -> dict[str, float]:
    """Relief ratios T_a(N) / T_x(N) for every other mode x (makespans).

    Args:
        n: hosts.
        prefix_bytes: prefix size.
        p: the setup.

    Returns:
        ``{"a/b": ..., "a/c": ..., "a/d": ..., "a/r2": ..., "a/r4": ...}``.
    """
    t = {m: predict(m, n, prefix_bytes, p).max_s for m in MODES}
    return {f"a/{m}": t["a"] / t[m] for m in MODES if m != "a"}
