"""What p4c's Tofino backend made of ``p4src/tna``: the committed summary and its inputs.

``make p4-tofino`` compiles the TNA program with the ``bf-p4c`` driver (front end, Tofino
backend and assembler, which refuses a program over 12 stages) into ``build/tofino``, then runs
``python -m kvcast.tools.tofino_summary build/tofino p4src/build/tofino``, which copies the
P4Info and the compiler's resource logs there and writes ``summary.json`` from the compiler's
``resources.json``:

* ``stages_used``, and per stage the tables, SRAM and TCAM blocks and stateful ALUs placed;
* ``sram_blocks``, ``tcam_blocks``, ``stateful_alus``: totals over the pipe;
* ``kv_bytes_per_pipe`` and ``frag_bytes``: the fragment store's size, from the Tofino sizes of
  ``p4src/shared/sizes.p4``, after checking that every word register was placed;
* ``defines``: the preprocessor definitions of the compile, as the compiler's manifest
  records them (``-DCPU_PORT_NUM=320`` for a 4-pipe part), less the compiler's own version
  macros; ``cpu_port`` is the CPU port the program was compiled for (the define where given,
  else ``sizes.p4``'s);
* ``pipes_served``: how many pipes the compiler's ``.conf`` loads the program on (its
  ``pipe_scope``: 0-3, every pipe of a Tofino-1 part);
* ``source_sha256``: every input of the compile (:func:`source_sha256`: every file under
  ``p4src/tna`` and ``p4src/shared``, and the defines), which a test recomputes, so a summary
  older than the sources, or made with other defines, fails CI.

Functions:
    source_sha256: the hash of the TNA program's inputs.
    compile_defines: the user definitions a build was compiled with.
    summarize: the summary of one build directory.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from kvcast.tools.gen_constants import GeneratorError, parse_sizes

REPO = Path(__file__).resolve().parents[2]
SOURCE_DIRS = ("p4src/tna", "p4src/shared")
# Tofino-1: 12 stages; per stage 80 SRAM blocks, 24 TCAM blocks, 4 stateful ALUs.
STAGES = 12
# What the compiler writes that the summary keeps, by where it is in the build directory.
COPIED = {
    "kvcast.p4info.txtpb": "kvcast.p4info.txtpb",
    "bf-rt.json": "bf-rt.json",
    "pipe/logs/resources.json": "resources.json",
    "pipe/logs/table_summary.log": "table_summary.log",
    "pipe/logs/phv_allocation_summary_0.log": "phv_allocation_summary.log",
}


# The compiler's own macros (its version): not inputs the project chooses.
_COMPILER_DEFINES = ("__p4c", "__TARGET_")


def source_sha256(repo: Path = REPO, defines: list[str] | tuple[str, ...] = ()) -> str:
    """SHA-256 over every input of the TNA compile: the files under ``SOURCE_DIRS`` and defines.

    Every file (not only ``.p4``: whatever an ``#include`` may name) is taken in sorted path
    order as ``path NUL bytes NUL``; then each define (``NAME=VALUE``, sorted) with a NUL.
    """
    digest = hashlib.sha256()
    files = sorted(p for d in SOURCE_DIRS for p in (repo / d).rglob("*") if p.is_file())
    for path in files:
        digest.update(path.relative_to(repo).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    for define in sorted(defines):
        digest.update(b"-D" + define.encode() + b"\0")
    return digest.hexdigest()


def compile_defines(manifest: dict[str, Any]) -> list[str]:
    """The ``NAME=VALUE`` definitions of a compile, from its manifest, less the compiler's own."""
    defines: list[str] = []
    for program in manifest.get("programs", []):
        for define in program.get("source_files", {}).get("defines", []):
            if not str(define).startswith(_COMPILER_DEFINES) and define not in defines:
                defines.append(str(define))
    return sorted(defines)


def _stage_rows(resources: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for stage in resources["resources"]["mau"]["mau_stages"]:
        tables = sorted(t["table_name"] for t in stage["logical_tables"]["ids"])
        salus = sorted(u["used_by"] for m in stage["meter_alus"]["meters"] for u in m["usages"])
        rows.append(
            {
                "stage": stage["stage_number"],
                "tables": tables,
                "sram_blocks": len(stage["rams"]["srams"]),
                "tcam_blocks": len(stage["tcams"]["tcams"]),
                "stateful_alus": salus,
            }
        )
    return sorted(rows, key=lambda r: int(r["stage"]))


def _pipe_scope(build: Path) -> set[int]:
    """The pipes the compiler's ``.conf`` loads the program on (every pipeline's scope).

    Raises:
        ValueError: no ``.conf``, or one without a pipeline scope.
    """
    confs = sorted(build.glob("*.conf"))
    if len(confs) != 1:
        raise ValueError(f"{build}: expected one compiler .conf, found {len(confs)}")
    doc = json.loads(confs[0].read_text())
    pipes = {
        int(p)
        for device in doc.get("p4_devices", [])
        for program in device.get("p4_programs", [])
        for pipeline in program.get("p4_pipelines", [])
        for p in pipeline.get("pipe_scope", [])
    }
    if not pipes:
        raise ValueError(f"{confs[0]}: no pipe_scope in its p4_pipelines")
    return pipes


def summarize(build: Path, repo: Path = REPO) -> dict[str, Any]:
    """The summary of a ``bf-p4c`` output directory.

    Raises:
        ValueError: the build is incomplete (no binary: the assembler refused it) or the
            fragment store was not placed whole.
    """
    manifest = json.loads((build / "manifest.json").read_text())
    if not manifest.get("compilation_succeeded") or not (build / "pipe" / "tofino.bin").exists():
        raise ValueError(f"{build}: the compile did not succeed (no pipe/tofino.bin)")
    resources = json.loads((build / "pipe" / "logs" / "resources.json").read_text())
    stages = _stage_rows(resources)
    used = [s for s in stages if s["tables"]]
    sizes = parse_sizes(repo / "p4src/shared/sizes.p4", repo / "p4src", "__TARGET_TOFINO__")
    defines = compile_defines(manifest)
    overrides = dict(d.split("=", 1) for d in defines if "=" in d)
    placed = {u for s in stages for u in s["stateful_alus"]}
    words = {u for u in placed if u.endswith(".frag_word")}
    if len(words) != sizes["FRAG_WORDS"]:
        raise ValueError(f"{len(words)} of {sizes['FRAG_WORDS']} fragment word registers placed")
    return {
        "compiler": f"bf-p4c (p4c Tofino backend) {manifest['compiler_version']}",
        "source_sha256": source_sha256(repo, defines),
        "defines": defines,
        "target": manifest.get("target", "tofino"),
        "stages_available": STAGES,
        "stages_used": 1 + max(int(s["stage"]) for s in used),
        "sram_blocks": sum(int(s["sram_blocks"]) for s in stages),
        "tcam_blocks": sum(int(s["tcam_blocks"]) for s in stages),
        "stateful_alus": sum(len(s["stateful_alus"]) for s in stages),
        "frag_bytes": sizes["FRAG_BYTES"],
        "frag_slots": sizes["NUM_FRAG_SLOTS"],
        "kv_bytes_per_pipe": sizes["FRAG_BYTES"] * sizes["NUM_FRAG_SLOTS"],
        "cache_entries": sizes["CACHE_ENTRIES"],
        "cpu_port": int(str(overrides.get("CPU_PORT_NUM", sizes["CPU_PORT_NUM"])), 0),
        "pipes_served": len(_pipe_scope(build)),
        "pipes_how": "the compiler's .conf loads the program on these pipes (pipe_scope); each "
        "WRITE is multicast to one fan-out port per pipe (WRITE_FANOUT_GROUP) and stored by "
        "every pipe's ingress",
        "stage_map": stages,
    }


def main(argv: list[str] | None = None) -> int:
    """Copies a build's P4Info and logs into OUT and writes OUT/summary.json."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("build", type=Path, help="bf-p4c's output directory (-o)")
    parser.add_argument("out", type=Path, help="where the summary goes (p4src/build/tofino)")
    args = parser.parse_args(argv)
    try:
        summary = summarize(args.build)
    except (OSError, ValueError, KeyError, GeneratorError) as exc:
        print(f"tofino_summary: {exc}", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    for src, dst in COPIED.items():
        shutil.copyfile(args.build / src, args.out / dst)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(
        f"stages {summary['stages_used']}/{STAGES}, {summary['kv_bytes_per_pipe']} KV bytes "
        f"per pipe, {summary['stateful_alus']} stateful ALUs -> {args.out}/summary.json"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
