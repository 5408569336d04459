"""Mooncake replicas for the serving sweep: a published prefix copied into k pool nodes' stores.

The baseline a serving engineer would pick without the switch is Mooncake's replication: put
each chunk with ``replica_num = k`` so that k pool nodes, each behind a NIC of its own, hold it,
and spread the readers over them. In the sweep's ``r2``/``r4`` modes replica j is pool node j
with a Mooncake master of its own (so that what it serves comes from its own DRAM, never through
another node), and engine i reads every chunk from replica ``i mod k``, as a replica-aware
client spreads its readers: the switch sends a GET to the pool node that owns the key's bucket,
so replica j holds each chunk under ``kvcast.replicas.replica_key(key, j, k)`` (a key in a bucket
the owner map ``b -> b mod k`` gives node j), with a MAC object made for that key where MACs
are on (every node holds every replica key's MAC object: a MAC object's own key falls in any
bucket). The copies are put from a client on the publishing GPU host (:func:`replicate`, through
that host's link, before the point is timed). (Mooncake's own client reads the first replica its
master lists unless one is local, which spreads nothing: this is the baseline's best case.)

Functions:
    replica_copies: what each pool node must hold for readers choosing among k replicas.
    replicate: puts each pool node's copies into its store from a host of the cluster.
    main: the copying client, run in the host's namespace.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from experiments.serving_engine import REPO
from kvcast.integrity import chunk_mac, mac_key_of
from kvcast.replicas import replica_key

Chunk = tuple[int, int, bytes]
"""``(tenant, key, data)``."""


def replica_copies(
    chunks: Sequence[Chunk],
    counts: Iterable[int],
    nodes: int,
    mac_keys: Mapping[int, bytes] | None = None,
) -> list[list[Chunk]]:
    """What each of ``nodes`` pool nodes holds so that readers can choose among k replicas.

    For every k in ``counts``, node j < k holds each chunk under ``replica_key(key, j, k)``;
    with ``mac_keys`` every node also holds the MAC object of every such key (under
    ``mac_key_of`` of it). A key that two counts give the same node is held once.

    Raises:
        ValueError: a count larger than ``nodes`` (or not a valid replica count), or two
            chunks with one replica key (keys that differ only in their low bits).
        KeyError: a chunk's tenant has no key in ``mac_keys``.
    """
    held: list[dict[tuple[int, int], bytes]] = [{} for _ in range(nodes)]
    macs: dict[tuple[int, int], bytes] = {}
    for count in counts:
        if count > nodes:
            raise ValueError(f"{count} replicas need {count} pool nodes; there are {nodes}")
        for tenant, key, data in chunks:
            for j in range(count):
                k = replica_key(key, j, count)
                if held[j].setdefault((tenant, k), data) != data:
                    raise ValueError(f"chunks share replica key {k:#x}: their keys differ in the "
                                     f"low bits only")  # fmt: skip
                if mac_keys is not None:
                    macs[(tenant, mac_key_of(k))] = chunk_mac(mac_keys[tenant], tenant, k, data)
    for node in held:
        node.update(macs)
    return [[(t, k, d) for (t, k), d in node.items()] for node in held]


def replicate(
    cluster: Any,
    host: str,
    stores: Sequence[tuple[str, Sequence[Chunk]]],
    tmp: Path,
    timeout_s: float = 120.0,
) -> None:
    """Puts each store's chunks into it from ``host`` (one client per store).

    Args:
        cluster: the running cluster.
        host: the GPU host the copies leave from (its address is the client's).
        stores: ``(Mooncake master host:port, chunks)`` of each pool node to fill.
        tmp: a folder for the chunk files the clients read.
        timeout_s: how long one store's copy may take.

    Raises:
        RuntimeError: a copy failed (the client's output says why).
    """
    ip = cluster.nodes[host].ip
    for i, (master, chunks) in enumerate(stores):
        if not chunks:
            continue
        path = tmp / f"replica-{i}.bin"
        path.write_bytes(b"".join(d for *_, d in chunks))
        spec = ",".join(f"{t}:{k}:{len(d)}" for t, k, d in chunks)
        cmd = [
            sys.executable, "-m", "experiments.serving_replicas", "--master", master,
            "--local-hostname", ip, "--chunks", str(path), "--spec", spec,
        ]  # fmt: skip
        proc = cluster.host(host).popen(
            cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"copying the prefix to {master} failed ({proc.returncode}): {out}")


def main(argv: Sequence[str] | None = None) -> int:
    """Puts the chunks of ``--chunks`` into the store of ``--master``; prints what it put."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--master", required=True, help="the replica's mooncake_master host:port")
    p.add_argument("--local-hostname", required=True, help="this host's address for transfers")
    p.add_argument("--chunks", type=Path, required=True, help="the chunks, back to back")
    p.add_argument("--spec", required=True, help="TENANT:KEY:NBYTES,... in the file's order")
    args = p.parse_args(argv)
    items: list[tuple[int, int, int]] = []
    for part in args.spec.split(","):
        tenant, key, nbytes = (int(x) for x in part.split(":"))
        items.append((tenant, key, nbytes))
    blob = args.chunks.read_bytes()
    if sum(n for _, _, n in items) != len(blob):
        p.error(f"--spec names {sum(n for *_, n in items)} bytes; {args.chunks} has {len(blob)}")
    from kvcast.mooncake import MooncakeBackend

    store = MooncakeBackend(args.master, args.local_hostname, global_segment_size=0)
    try:
        view, at = memoryview(blob), 0
        batch = []
        for tenant, key, nbytes in items:
            batch.append((tenant, key, view[at : at + nbytes]))
            at += nbytes
        store.put_many(batch)
    finally:
        store.close()
    print(json.dumps({"master": args.master, "chunks": len(items), "bytes": len(blob)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
