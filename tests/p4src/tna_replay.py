"""Replays p4testgen's tests of the TNA program into the reference target, built with Tofino sizes.

Run as its own process (``python -m tests.p4src.tna_replay``): the reference target reads its
sizes from ``kvcast.p4constants`` when its modules are imported, so this process first puts in
its place a module generated from the v1model P4Info (the same names) and sizes.p4's
``__TARGET_TOFINO__`` branch (96-byte fragments, 32,768 slots, CPU port 192), as a Tofino
deployment's Python side is built (docs/tofino.md), and only then imports ``refswitch``.

For each test (tests/p4src/testgen_ptf.py reads them): a fresh switch with the v1model P4Info;
the test's table entries and default actions installed under the same names; the fragment
store's register cells it sets written into the reference target's registers (the sketch's
cells are not: they decide the hot-miss digest, never the packet, and the two programs lay them
out differently); the packet sent; and what comes out compared with what p4testgen expects,
bit for bit outside the bits it marks don't-care. Each outcome is one of:

- ``agree``: same verdict, same bytes;
- ``documented:<difference>``: a difference docs/tofino.md lists, recognized by its inputs;
- ``unmodelled:<what>``: p4testgen does not model what decides the outcome (multicast);
- ``mismatch``: anything else, with the first differing byte;
- ``unmapped``: the test names a table, action or register the reference target lacks.

Functions:
    tofino_constants_source: the text of the Tofino-sized constants module.
    replay_file: every test of one PTF file, replayed (only after the constants are installed).
    main: the command line (PTF files in, one JSON list of outcomes out).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

from kvcast.tools.gen_constants import (
    load_p4info,
    parse_defines,
    parse_header_bits,
    parse_sizes,
    render,
)

REPO = Path(__file__).resolve().parents[2]
P4INFO = REPO / "p4src" / "build" / "kvcast.p4info.txtpb"
SHARED = REPO / "p4src" / "shared"


def tofino_constants_source() -> str:
    """The constants module a Tofino deployment's Python side is built with.

    Returns:
        Python source: the v1model P4Info's names with sizes.p4's ``__TARGET_TOFINO__`` sizes.
    """
    return render(
        parse_defines((SHARED / "defines.p4").read_text()),
        parse_sizes(SHARED / "sizes.p4", REPO / "p4src", "__TARGET_TOFINO__"),
        load_p4info(P4INFO),
        ["p4src/shared/defines.p4", "p4src/shared/sizes.p4 (__TARGET_TOFINO__)"],
        parse_header_bits((SHARED / "headers.p4").read_text()),
    )


def install_tofino_constants(workdir: Path) -> None:
    """Makes ``kvcast.p4constants`` the Tofino-sized module for this process.

    Raises:
        RuntimeError: a module that reads the constants was imported before.
    """
    for name in ("kvcast.wire", "refswitch.pipeline"):
        if name in sys.modules:
            raise RuntimeError(f"{name} already imported with the v1model sizes")
    path = workdir / "p4constants_tofino.py"
    path.write_text(tofino_constants_source())
    spec = importlib.util.spec_from_file_location("kvcast.p4constants", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    import kvcast

    sys.modules["kvcast.p4constants"] = module
    kvcast.p4constants = module  # type: ignore[attr-defined]


def replay_file(path: Path, fix_checksum: bool = False) -> list[dict[str, Any]]:
    """Replays every test of one PTF file.

    Args:
        path: a PTF file p4testgen wrote for the TNA program.
        fix_checksum: make each input's IPv4 checksum correct before it is sent.

    Returns:
        One outcome per test: ``name``, ``path`` (what the reference target did with the
        packet: ``get_hit``, ``get_miss``, ``write_fanout_ack``, ``security_drop:<REASON>`` ...),
        ``outcome`` and ``detail``.
    """
    from tests.p4src import tna_replay_core  # after install_tofino_constants

    return tna_replay_core.replay_file(path, load_p4info(P4INFO), fix_checksum)


def main(argv: list[str] | None = None) -> None:
    """Command line: ``--workdir DIR --out FILE.json [--fix-ipv4-checksum] PTF...``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--fix-ipv4-checksum", action="store_true")
    ap.add_argument("ptf", type=Path, nargs="+")
    args = ap.parse_args(argv)
    install_tofino_constants(args.workdir)
    outcomes = [o for p in args.ptf for o in replay_file(p, args.fix_ipv4_checksum)]
    args.out.write_text(json.dumps(outcomes, indent=1))


if __name__ == "__main__":
    main()
