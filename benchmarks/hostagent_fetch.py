"""Host agent fetch goodput into a tensor: through the reference switch, on loopback, vs Mooncake.

Each line is a ratio of two things measured side by side in one run:

``path=refswitch``
    The reference switch (``python -m refswitch``) runs as a process on two veth pairs. The host
    end of port 1 is moved into a network namespace ("host", 10.0.0.1) and the host end of port 2
    into another ("peer", 10.0.1.1); both resolve the service VIP and each other to the switch
    MAC, and the switch routes both addresses (``ipv4_lpm``). A synthetic chunk is loaded into
    switch SRAM (``P4RuntimeClient.load_chunk``). Then ``python -m benchmarks.loopback probe`` runs
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
    What end-to-end integrity costs (kvcast.integrity): a pool-node server in this process
    holds the chunk and its keyed MAC; fetches without the tenant key and with it (which also
    fetch the 32-byte MAC object and compute BLAKE2b over the chunk) alternate. ``ratio`` is
    the keyed fetch's goodput over the plain one's; ``blake2b_us`` the MAC computation alone.

The loopback pool-server line of ``benchmarks.loopback`` (``bench fetch ...``) runs first. Lines
that cannot run here (not root, no Mooncake) say ``skipped=<reason>``.

The measurements live beside the suite: :mod:`benchmarks.hostagent_fetch_switch` (through the
emulated switch), :mod:`benchmarks.hostagent_fetch_pool` (against a pool node on loopback:
Mooncake, multi-chunk, MAC) and :mod:`benchmarks.hostagent_fetch_datapath` (the agent's receive
and the pool node's send alone).

Functions:
    run: the suite entry point (prints ``bench hostagent_fetch ...`` lines).
"""

from __future__ import annotations

import re

from benchmarks import bench_line, loopback
from benchmarks.hostagent_fetch_datapath import measure_receive, measure_send
from benchmarks.hostagent_fetch_pool import (
    JUMBO_MTU,
    LOOPBACK_FRAGS_PER_GET,
    measure_mac,
    measure_mooncake,
    measure_multi,
)
from benchmarks.hostagent_fetch_switch import cpu_ratio, measure_refswitch
from emulation.targets import TargetUnavailableError, bmv2_binary
from kvcast.kvp import frags_per_data
from kvcast.native import describe as describe_data_path

SUITE = "hostagent_fetch"
# One 16-token block of DESIGN.md's small model (24 layers x K,V x 2 heads x 64 x bf16): 192 KiB.
CHUNK_BYTES = 24 * 2 * 2 * 64 * 2 * 16
# The larger chunk of the Mooncake comparison: a 2 MiB block (a 128-token block of that model,
# or a 16-token block of a model 8x wider).
LARGE_CHUNK_BYTES = 2 << 20
# Chunks of the multi-chunk line: a prefix of 8 blocks, one fetch_many.
MULTI_CHUNKS = 8


def _reason(exc: BaseException) -> str:
    return re.sub(r"\s+", "-", str(exc).strip())[:120] or type(exc).__name__


def run(quick: bool = False) -> list[str]:
    """Runs the suite and prints its result lines.

    Args:
        quick: 5 rounds per path instead of 15, one loopback line (under a minute).

    Returns:
        The printed lines.
    """
    lines = list(loopback.run(quick, repeat=20))
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
                cpu_ratio=cpu_ratio(rec), rounds=rounds,
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


__all__ = ["CHUNK_BYTES", "LARGE_CHUNK_BYTES", "MULTI_CHUNKS", "SUITE", "run"]
