"""Mooncake replicas for the serving sweep: a published prefix copied into k pool nodes' stores.

The baseline a serving engineer would pick without the switch is Mooncake's replication: put
each chunk with ``replica_num = k`` so that k pool nodes, each behind a NIC of its own, hold it,
and spread the readers over them. In the sweep's ``r2``/``r4`` modes replica j is pool node j
with a Mooncake master of its own (so that what it serves comes from its own DRAM, never through
another node), the chunks are copied into each replica's store by a client on the publishing
GPU host (:func:`replicate`, through that host's link, before the point is timed), and the
switch's pool-owner map sends the GETs for chunk c to replica ``bucket(c) mod k``: each chunk's
reads go to one replica, and a prefix's chunks spread over all k, the spread a replica-aware
client gets by choosing the replica per chunk. (Mooncake's own client reads the first replica
its master lists unless one is local, which spreads nothing: this is the baseline's best case.)

Functions:
    replicate: copies chunks into every replica pool node's store from a host of the cluster.
    main: the copying client, run in the host's namespace.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from experiments.serving_engine import REPO


def replicate(
    cluster: Any,
    host: str,
    masters: Sequence[str],
    keys: Sequence[tuple[int, int]],
    sizes: Sequence[int],
    path: Path,
    timeout_s: float = 120.0,
) -> None:
    """Copies chunks into every store of ``masters`` from ``host`` (one client per store).

    Args:
        cluster: the running cluster.
        host: the GPU host the copies leave from (its address is the client's).
        masters: the replicas' Mooncake masters (``host:port``).
        keys: ``(tenant, key)`` of each chunk, in the file's order.
        sizes: each chunk's length in bytes.
        path: the chunks, back to back.
        timeout_s: how long one store's copy may take.

    Raises:
        RuntimeError: a copy failed (the client's output says why).
    """
    spec = ",".join(f"{t}:{k}:{n}" for (t, k), n in zip(keys, sizes, strict=True))
    ip = cluster.nodes[host].ip
    for master in masters:
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
