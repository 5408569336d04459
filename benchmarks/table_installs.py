"""Benchmark: cache-table entry installs per second over P4Runtime, batched, per switch target.

Inserts then deletes ``ENTRIES`` cache_table entries in WriteRequests of ``BATCH`` updates, to
the reference target (its P4Runtime server as a process on veth) and, where installed, BMv2,
side by side in one run; prints each target's installs/s and their ratio.

Functions:
    measure: installs and deletes per second on one target.
    run: the benchmark entry point (prints ``bench table_installs ...`` lines).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from finsy.proto import p4r

from emulation.targets import SwitchProcess, TargetUnavailableError, VethPorts, bmv2_binary
from kvcast import p4constants as c
from kvcast.tools.p4rt_client import P4RuntimeClient

BATCH = 100


def _updates(client: P4RuntimeClient, kind: int, keys: range) -> list[p4r.Update]:
    updates = []
    for key in keys:
        entry = client.table_entry(
            c.TABLE_INGRESS_CACHE_CACHE_TABLE,
            {"tenant": 1, "key": key},
            c.ACTION_INGRESS_CACHE_CACHE_HIT,
            {"slot_base": key % c.NUM_FRAG_SLOTS, "frag_count": 1, "epoch": 1},
        )
        if kind == p4r.Update.DELETE:
            entry.ClearField("action")
        upd = p4r.Update(type=kind)  # type: ignore[arg-type]
        upd.entity.table_entry.CopyFrom(entry)
        updates.append(upd)
    return updates


def measure(kind: str, entries: int) -> tuple[float, float]:
    """Installs/s and deletes/s of ``entries`` cache entries in batches of BATCH.

    Args:
        kind: ``"refswitch"`` or ``"bmv2"``.
        entries: entries to install (at most CACHE_ENTRIES).

    Returns:
        (installs per second, deletes per second).

    Raises:
        TargetUnavailableError: the target cannot run here.
    """
    veths = VethPorts([1], prefix="kt" + kind[0])
    logdir = Path(tempfile.mkdtemp(prefix=f"kvcast-tbl-{kind}-"))
    sw = None
    try:
        sw = SwitchProcess(kind, veths.interface_args(), logdir / "switch.log")
        client = sw.client
        rates = []
        for op in (p4r.Update.INSERT, p4r.Update.DELETE):
            batches = [
                _updates(client, op, range(i, min(i + BATCH, entries)))
                for i in range(0, entries, BATCH)
            ]
            start = time.perf_counter()
            for batch in batches:
                client.write(batch)
            rates.append(entries / (time.perf_counter() - start))
        return rates[0], rates[1]
    finally:
        if sw is not None:
            sw.close()
        veths.close()
        shutil.rmtree(logdir, ignore_errors=True)


def run(quick: bool = False) -> list[str]:
    """Measures every target present; prints one line each and the ratio."""
    entries = 1000 if quick else c.CACHE_ENTRIES
    lines: list[str] = []
    got: dict[str, float] = {}
    for kind in ("refswitch", "bmv2"):
        if kind == "bmv2" and bmv2_binary() is None:
            lines.append(
                "bench table_installs target=bmv2 skipped=simple_switch_grpc-not-installed"
            )
            continue
        try:
            ins, dels = measure(kind, entries)
        except TargetUnavailableError as exc:
            lines.append(f"bench table_installs target={kind} skipped={str(exc).replace(' ', '-')}")
            continue
        got[kind] = ins
        lines.append(
            f"bench table_installs target={kind} entries={entries} batch={BATCH} "
            f"installs_per_s={ins:.0f} deletes_per_s={dels:.0f}"
        )
    if len(got) == 2:
        lines.append(
            f"bench table_installs ratio refswitch/bmv2={got['refswitch'] / got['bmv2']:.2f}"
        )
    for line in lines:
        print(line, flush=True)
    return lines
