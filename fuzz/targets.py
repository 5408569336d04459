"""The fuzz targets: each feeds ``count`` mutants to one parser and returns what happened.

Every function raises ``FuzzError`` on the first violation (a crash, a packet that vanished
without a counted reason, a changed cache, a wrong byte in a completed tensor) and returns a
counter of outcomes otherwise.

Functions:
    run_refswitch: the reference pipeline.
    run_bmv2: BMv2 (simple_switch_grpc) on veth pairs.
    run_pool: the pool node's handler.
    run_agent: the fetch client during real fetches.
"""

from __future__ import annotations

import random
import socket
import threading
import time
from collections import Counter

from fuzz.mutators import mutate_frame, mutate_payload
from kvcast import p4constants as c
from kvcast import wire
from kvcast.kvp import frag_count

__all__ = ["FuzzError", "frame_seeds", "run_agent", "run_bmv2", "run_pool", "run_refswitch"]


class FuzzError(AssertionError):
    """A target did something it must never do; the message names the input."""


def frame_seeds(rng: random.Random) -> list[bytes]:
    """Real frames of every op from host and pool ports (the conformance setup's addresses)."""
    from tests.conformance.vectors import (
        CHUNK_KEY,
        HOSTS,
        STALE_KEY,
        TENANT,
        VIP,
        host_frame,
        pool_frame,
    )

    seeds = []
    for key in (CHUNK_KEY, STALE_KEY, rng.getrandbits(64)):
        for payload in (
            wire.get_message(TENANT, key, rng.randrange(4), group=rng.choice([0, 7, 8, 300])),
            wire.write_message(TENANT, key, 0, rng.randrange(c.NUM_FRAG_SLOTS), 1, b"\xaa" * 64),
            wire.data_message(TENANT, key, 0, 1, b"\x55" * 100, group=rng.choice([0, 7])),
            wire.nack_message(wire.KvpHeader(c.KVP_OP_GET, key=key), c.KVP_STATUS_NOT_FOUND),
            wire.KvpHeader(c.KVP_OP_WRITE_ACK, key=key).pack(),
        ):
            seeds.append(host_frame(rng.choice(list(HOSTS)), VIP, payload))
            seeds.append(pool_frame(rng.choice(list(HOSTS)), payload))
    return seeds


def run_refswitch(count: int, seed: int) -> Counter[str]:
    """``count`` mutants into the reference pipeline, each accounted for one by one."""
    from tests.conformance.harness import InProcessRefTarget
    from tests.conformance.vectors import (
        EG_DROPS,
        HOSTS,
        IG_DROPS,
        IG_EVENTS,
        POOL_PORT,
        program_switch,
    )

    rng = random.Random(seed)
    target = InProcessRefTarget()
    try:
        program_switch(target.client)
        seeds = frame_seeds(rng)
        ports = [*HOSTS, POOL_PORT]
        state = target.state

        def totals() -> tuple[int, int]:
            drops = sum(p for p, _ in state.counter_values(IG_DROPS))
            drops += sum(p for p, _ in state.counter_values(EG_DROPS))
            return drops, sum(p for p, _ in state.counter_values(IG_EVENTS))

        regs = target.pipeline.regs.snapshot()
        entries = target.client.table_entries(c.TABLE_INGRESS_CACHE_CACHE_TABLE)
        out: Counter[str] = Counter()
        for _ in range(count):
            port, frame = rng.choice(ports), mutate_frame(rng, seeds)
            d0, e0 = totals()
            try:
                outputs = target.pipeline.process(port, frame)
            except Exception as exc:
                raise FuzzError(f"pipeline raised {exc!r} on {frame.hex()}") from exc
            d1, e1 = totals()
            if outputs:
                out["forwarded"] += 1
            elif (d1 - d0, e1 - e0) == (1, 0):
                out["dropped"] += 1
            elif (d1 - d0, e1 - e0) == (0, 1):
                out["empty_group"] += 1
            else:
                raise FuzzError(f"a packet from port {port} vanished uncounted: {frame.hex()}")
        if target.pipeline.regs.snapshot() != regs:
            raise FuzzError("mutants from data ports changed switch SRAM")
        if target.client.table_entries(c.TABLE_INGRESS_CACHE_CACHE_TABLE) != entries:
            raise FuzzError("mutants from data ports changed the cache table")
        out["packets"] = count
        return out
    finally:
        target.close()


def run_bmv2(count: int, seed: int) -> Counter[str]:
    """``count`` mutants into BMv2 on veth pairs; then it must still serve a hit correctly.

    Raises:
        FuzzError: BMv2 died, stopped serving, or its counters do not account for the
            packets it did not forward.
    """
    from tests.conformance.harness import VethTarget
    from tests.conformance.vectors import (
        CHUNK_KEY,
        EG_DROPS,
        HOSTS,
        IG_DROPS,
        IG_EVENTS,
        POOL_PORT,
        TENANT,
        VIP,
        hit_reply,
        host_frame,
        program_switch,
    )

    rng = random.Random(seed)
    target = VethTarget("bmv2")
    try:
        program_switch(target.client)
        seeds = frame_seeds(rng)
        ports = [*HOSTS, POOL_PORT]

        def counted() -> int:
            total = 0
            for name in (IG_DROPS, EG_DROPS, IG_EVENTS):
                n = c.EV_COUNT if name == IG_EVENTS else c.DROP_REASON_COUNT
                total += sum(target.client.counter(name, i)[0] for i in range(n))
            return total

        before = counted()
        out: Counter[str] = Counter()
        batch = 100  # BMv2 drops what its port queue cannot hold; keep each burst small
        for start in range(0, count, batch):
            for _ in range(min(batch, count - start)):
                try:
                    target.send(rng.choice(ports), mutate_frame(rng, seeds))
                except OSError:  # shorter than an Ethernet header, or over the port's MTU
                    out["unsendable"] += 1
            out["forwarded_frames"] += len(target.collect(0, 0))
        if target.proc.proc.poll() is not None:
            raise FuzzError(f"simple_switch_grpc exited: {target.proc.log_tail()}")
        out["counted"] = counted() - before
        # Every mutant was either counted (drop or event) or forwarded at least once.
        if out["counted"] + out["forwarded_frames"] < count - out["unsendable"]:
            raise FuzzError(
                f"{count} packets, {out['counted']} counted, {out['forwarded_frames']} frames out"
            )
        get = host_frame(1, VIP, wire.get_message(TENANT, CHUNK_KEY, 0, 77))
        target.send(1, get)
        if target.collect(1, 0) != [(1, hit_reply(1, 0, 77))]:
            raise FuzzError("BMv2 no longer serves the cached chunk correctly")
        out["packets"] = count
        return out
    finally:
        target.close()


def run_pool(count: int, seed: int) -> Counter[str]:
    """``count`` mutants of GETs (and of everything else) into the pool node's handler."""
    from kvcast.backend import InMemoryBackend
    from poolnode.server import KvpGetHandler

    rng = random.Random(seed)
    backend = InMemoryBackend()
    tenant, key = 4, 0xF00D
    chunk = rng.randbytes(40 * c.FRAG_BYTES - 7)
    backend.put(tenant, key, chunk)
    handler = KvpGetHandler(backend, dedup_window=64)
    seeds = [
        wire.get_message(tenant, key, rng.randrange(40), req_id=rng.getrandbits(32), count=n)
        for n in (1, 5, 40)
    ] + [
        wire.data_message(tenant, key, 0, 40, chunk[: c.FRAG_BYTES]),
        wire.nack_message(wire.KvpHeader(c.KVP_OP_GET, key=key), c.KVP_STATUS_NOT_FOUND),
    ]
    out: Counter[str] = Counter()
    stats = handler.stats
    for _ in range(count):
        datagram = mutate_payload(rng, seeds)
        before = stats.datagrams
        try:
            replies = handler.handle(datagram)
        except Exception as exc:
            raise FuzzError(f"the pool handler raised {exc!r} on {datagram.hex()}") from exc
        if stats.datagrams != before + 1:
            raise FuzzError(f"a datagram was not counted: {datagram.hex()}")
        for header, payload in replies:
            hdr = wire.KvpHeader.unpack(header)
            if hdr.op == c.KVP_OP_DATA:
                lo = hdr.frag_idx * c.FRAG_BYTES
                body = bytes(payload)
                if body != chunk[lo : lo + len(body)] or hdr.crc != wire.fragment_crc(
                    tenant, key, hdr.frag_idx, body
                ):
                    raise FuzzError(f"a DATA with wrong bytes or CRC for {datagram.hex()}")
                out["data"] += 1
            elif hdr.op == c.KVP_OP_NACK:
                out["nack"] += 1
            else:
                raise FuzzError(f"the pool answered op {hdr.op}")
        out["answered" if replies else "silent"] += 1
    out["packets"] = count
    return out


def run_agent(count: int, seed: int) -> Counter[str]:
    """Fetches from a pool node on loopback while ``count`` mutants arrive from a KVP port."""
    import torch

    from hostagent.fetch import FetchClient
    from kvcast.backend import InMemoryBackend
    from poolnode.server import PoolServer

    rng = random.Random(seed)
    tenant, key = 6, 0xBEEF
    chunk = rng.randbytes(64 * c.FRAG_BYTES - 3)
    backend = InMemoryBackend()
    backend.put(tenant, key, chunk)
    n = frag_count(len(chunk))
    seeds = [
        wire.data_message(tenant, key, i, n, chunk[i * c.FRAG_BYTES : (i + 5) * c.FRAG_BYTES])
        for i in range(0, n, 5)
    ] + [
        wire.nack_message(wire.KvpHeader(c.KVP_OP_GET, tenant=tenant, key=key), s)
        for s in (1, 2, 3)
    ]
    out: Counter[str] = Counter()
    sent = 0
    stop = threading.Event()
    # The hostile source is a pool node the client was given: the worst case, a source the
    # agent trusts, so every mutant reaches the checks behind the source filter.
    evil_addr = ("127.0.0.7", c.KVP_UDP_PORT)
    with (
        PoolServer(backend, "127.0.0.1", 0) as server,
        FetchClient(
            server.address,
            timeout_s=0.01,
            max_timeout_s=0.05,
            deadline_s=5.0,
            pool_addrs=[evil_addr],
        ) as client,
    ):
        evil = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        evil.bind(evil_addr)
        to = ("127.0.0.1", client.address[1])

        def inject() -> None:
            nonlocal sent
            while not stop.is_set() and sent < count:
                msg = bytearray(mutate_payload(rng, seeds))
                if len(msg) >= 20 and rng.random() < 0.5:  # aim at a live request id
                    rid = (client._next_req - rng.randrange(64)) & 0xFFFFFFFF
                    msg[16:20] = rid.to_bytes(4, "big")
                try:
                    evil.sendto(bytes(msg), to)
                except OSError:
                    continue
                sent += 1

        thread = threading.Thread(target=inject, daemon=True)
        thread.start()
        try:
            dst = torch.zeros(len(chunk), dtype=torch.uint8)
            while thread.is_alive():
                dst.zero_()
                report = client.fetch(tenant, key, dst)
                if report.ok:
                    if dst.numpy().tobytes() != chunk:
                        raise FuzzError(f"a fetch completed with a wrong byte: {report}")
                    out["complete"] += 1
                else:
                    out[f"refused_{report.reason.value}"] += 1
                out["crc_failures"] += report.crc_failures
                out["invalid"] += report.invalid
                out["ignored"] += report.ignored
        finally:
            stop.set()
            thread.join()
            evil.close()
        # The client keeps serving: a fetch after the storm completes with the chunk. What the
        # storm left queued on the client's socket is dropped first: a queued forged NACK from
        # a source the client trusts would still end the next fetch (docs/security.md), which
        # says nothing about whether the client serves once the mutants stop.
        time.sleep(0.05)
        client.discard_pending()
        dst.zero_()
        report = client.fetch(tenant, key, dst)
        if not report.ok or dst.numpy().tobytes() != chunk:
            raise FuzzError(f"the fetch after the mutants did not complete correctly: {report}")
        out["complete_after"] += 1
    out["packets"] = sent
    return out
