"""``python -m fuzz [--count N] [--seed S] [--only T,...]``: the fuzz campaign (``make fuzz``).

Prints one line per target, ``fuzz target=... packets=... <outcome>=<n> ... seconds=...``, and
exits 1 on the first violation (the line says which input).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence

from fuzz.targets import FuzzError, run_agent, run_bmv2, run_pool, run_refswitch

TARGETS: dict[str, Callable[[int, int], Counter[str]]] = {
    "refswitch": run_refswitch,
    "pool": run_pool,
    "agent": run_agent,
    "bmv2": run_bmv2,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the campaign; 0 when every target held, 1 on a violation."""
    ap = argparse.ArgumentParser(prog="python -m fuzz", description=__doc__)
    ap.add_argument("--count", type=int, default=100_000, help="mutants per target")
    ap.add_argument("--seed", type=int, default=20261125)
    ap.add_argument("--only", default=",".join(TARGETS), help="comma-separated targets")
    args = ap.parse_args(argv)
    names = [t for t in args.only.split(",") if t]
    unknown = sorted(set(names) - set(TARGETS))
    if unknown:
        ap.error(f"unknown targets {unknown}; one of {sorted(TARGETS)}")
    failed = False
    for name in names:
        if name == "bmv2":
            from emulation.targets import bmv2_binary

            if bmv2_binary() is None:
                print("fuzz target=bmv2 skipped=simple_switch_grpc-not-installed", flush=True)
                continue
        t0 = time.monotonic()
        try:
            result = TARGETS[name](args.count, args.seed)
        except FuzzError as exc:
            print(f"fuzz target={name} FAILED {exc}", flush=True)
            failed = True
            continue
        fields = " ".join(f"{k}={v}" for k, v in sorted(result.items()))
        print(f"fuzz target={name} {fields} seconds={time.monotonic() - t0:.1f}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
