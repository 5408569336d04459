"""Prefix sharing end to end: one host prefills and publishes, the others fetch it from the network.

On an emulated cluster (one switch, ``--hosts`` GPU hosts, one pool node running Mooncake Store
with ``mooncake_master`` on the pool's address):

1. **produce** (host 1): "prefills" a prompt (synthetic KV, deterministic per block) and publishes
   it with the producer path (``hostagent.producer.Producer``): a Mooncake client in host 1's
   namespace puts the chunks with ``batch_put_from`` over TCP, through the switch, into the pool
   node's segment, and hands one ``stored`` record per chunk to a report sink;
2. **consume** (every other host, one after another): asks for the same prompt's prefix from its
   token ids alone (``hostagent.prefix.PrefixFetcher``: switch first; the switch misses and
   forwards to the pool node, which reads the chunks from Mooncake Store) and checks every block
   against what host 1 computed.

One JSON line per step; the last line, ``result prefix_share ...``, says how many blocks each
consumer got and whether they were byte-identical.

Run: ``python -m experiments.prefix_share [--hosts 3]`` (root; Mininet; Mooncake). The
``produce`` and ``consume`` subcommands are what runs inside the hosts' namespaces.

Functions:
    produce: the producer step (in a host's namespace).
    consume: the consumer step (in a host's namespace).
    run: the whole experiment on a new cluster.
    main: command line.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from emulation.switches import RefSwitch
from emulation.topo import EMULATION_MTU, SERVICE_IP, ClusterSpec, LinkSpec
from hostagent.chunkkeys import ChunkKeyer
from hostagent.layout import KVLayout
from kvcast import p4constants as c

REPO = Path(__file__).resolve().parents[1]
TENANT, BLOCK, HASH_SEED = 9, 16, "0"
LAYOUT = KVLayout(2, 2, 16, torch.float16, block_size=BLOCK)
PROMPT = list(range(1000, 1000 + 3 * BLOCK + 5))  # three full blocks and a partial one
KEYER = ChunkKeyer(BLOCK, HASH_SEED)


def block_bytes(block: int) -> bytes:
    """The synthetic KV of block ``block`` of the prompt (what host 1 "computed")."""
    return bytes((block * 31 + i * 7) & 0xFF for i in range(LAYOUT.chunk_bytes))


def produce(master: str, my_ip: str) -> dict[str, Any]:
    """Publishes the prompt's blocks into Mooncake Store (``master``) from this host.

    Args:
        master: ``host:port`` of ``mooncake_master``.
        my_ip: this host's address (Mooncake's transfer address).

    Returns:
        What was stored and reported.
    """
    from hostagent.producer import Producer
    from kvcast.mooncake import MooncakeBackend
    from kvcast.reports import InMemorySink

    backend = MooncakeBackend(
        master, local_hostname=my_ip, global_segment_size=0, local_buffer_size=4 << 20
    )
    try:
        chunks = []
        for b in range(len(KEYER.keys(PROMPT))):
            chunk = LAYOUT.alloc_chunk(pin=False)
            chunk.numpy()[:] = list(block_bytes(b))
            chunks.append(chunk)
        sink = InMemorySink()
        producer = Producer(backend, LAYOUT, KEYER, TENANT, reporter=sink, host=my_ip)
        report = producer.publish_chunks(PROMPT, chunks)
    finally:
        backend.close()
    return {
        "step": "produce",
        "stored": report.stored,
        "failed": report.failed,
        "error": report.error,
        "records": [[f"{e.key:#x}", e.event, e.position] for e in sink.entries],
    }


def consume(service: str, pool: str, mtu: int = EMULATION_MTU) -> dict[str, Any]:
    """Fetches the prompt's longest available prefix from the network and checks it.

    Args:
        service: the switch's service address.
        pool: the pool node's address (the direct fallback).
        mtu: the link's IP MTU (what a GET to the pool asks one DATA to carry).

    Returns:
        Blocks and tokens fetched, where they came from, and whether each block is the
        producer's.
    """
    from hostagent.fetch import FetchClient
    from hostagent.prefix import PrefixFetcher

    port = c.KVP_UDP_PORT
    with FetchClient(
        (service, port), (pool, port), timeout_s=0.2, max_timeout_s=1.0, deadline_s=30.0, mtu=mtu
    ) as client:
        result = PrefixFetcher(client, LAYOUT, KEYER, TENANT).fetch_prefix(PROMPT)
    return {
        "step": "consume",
        "blocks": result.blocks,
        "tokens": result.tokens,
        "stop": result.stop_reason.value,
        "same": [ch.numpy().tobytes() == block_bytes(b) for b, ch in enumerate(result.chunks)],
        "frags_pool": sum(r.frags_pool for r in result.reports),
        "fell_back": any(r.fell_back for r in result.reports),
        "duration_s": round(result.duration_s, 4),
    }


def _json_from(proc: subprocess.Popen[str], timeout_s: float) -> dict[str, Any]:
    out, err = proc.communicate(timeout=timeout_s)
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"step failed (rc {proc.returncode}): {err[-3000:]}")
    doc: dict[str, Any] = json.loads(lines[-1])
    return doc


def run(n_hosts: int = 3, timeout_s: float = 180.0) -> list[dict[str, Any]]:
    """The whole experiment on a new cluster (reference switch).

    Args:
        n_hosts: GPU hosts: host 1 produces, the others consume.
        timeout_s: bound on the pool node's start and on each step.

    Returns:
        The producer's record, then one record per consumer.

    Raises:
        RuntimeError: the pool node did not start or a step failed.
    """
    from emulation.network import Cluster

    spec = ClusterSpec(
        n_hosts=n_hosts,
        n_pools=1,
        host_link=LinkSpec(bw_mbit=200),
        pool_link=LinkSpec(bw_mbit=200),
        tenants=(TENANT,),
    )
    me = [sys.executable, "-m", "experiments.prefix_share"]
    records: list[dict[str, Any]] = []
    with Cluster(spec, RefSwitch) as cluster:
        pool, hosts = cluster.pools()[0], cluster.hosts()
        pool_cmd = [
            sys.executable, "-m", "poolnode", "--backend", "mooncake", "--start-master",
            "--local-hostname", pool.ip, "--segment-mib", "64", "--port", str(c.KVP_UDP_PORT),
            "--mtu", str(spec.mtu), *cluster.source_tenants(),
        ]  # fmt: skip
        ready = r"poolnode listening .*master=(\S+)"
        with cluster.serve(pool.name, pool_cmd, ready, timeout_s, cwd=REPO) as listening:
            master = listening.group(1)

            def step(host: str, *argv: str) -> dict[str, Any]:
                proc = cluster.host(host).popen(
                    [*me, *argv], cwd=REPO, text=True,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                )  # fmt: skip
                return _json_from(proc, timeout_s)

            records.append(step(hosts[0].name, "produce", master, hosts[0].ip))
            for h in hosts[1:]:
                records.append(
                    {**step(h.name, "consume", SERVICE_IP, pool.ip, f"--mtu={spec.mtu}"),
                     "host": h.name}
                )  # fmt: skip
    return records


def main(argv: list[str] | None = None) -> int:
    """Command line: the whole experiment, or one step (``produce`` / ``consume``)."""
    ap = argparse.ArgumentParser(prog="python -m experiments.prefix_share")
    sub = ap.add_subparsers(dest="command")
    p = sub.add_parser("produce", help="(in a host's namespace) publish the prompt's KV")
    p.add_argument("master")
    p.add_argument("my_ip")
    q = sub.add_parser("consume", help="(in a host's namespace) fetch the prompt's prefix")
    q.add_argument("service")
    q.add_argument("pool")
    q.add_argument("--mtu", type=int, default=EMULATION_MTU, help="IP MTU of the host's link")
    ap.add_argument("--hosts", type=int, default=3)
    args = ap.parse_args(argv)
    if args.command == "produce":
        print(json.dumps(produce(args.master, args.my_ip)), flush=True)
        return 0
    if args.command == "consume":
        print(json.dumps(consume(args.service, args.pool, args.mtu)), flush=True)
        return 0
    records = run(args.hosts)
    for rec in records:
        print(json.dumps(rec), flush=True)
    consumers = records[1:]
    ok = all(r["blocks"] == len(KEYER.keys(PROMPT)) and all(r["same"]) for r in consumers)
    print(
        f"result prefix_share stored={records[0]['stored']} consumers={len(consumers)} "
        f"blocks={[r['blocks'] for r in consumers]} identical={ok}",
        flush=True,
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
