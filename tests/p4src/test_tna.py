"""The Tofino (TNA) program: same entities as the v1model program, and accepted by p4c.

Three levels, each as strong as the tools present allow:

* always: every table, action, register and counter of the v1model P4Info is declared in
  p4src/tna under the same name, in controls instantiated under the same names, with the same
  match-field and parameter names (read from the sources; the documented exceptions are listed
  below with their reasons);
* where p4test and TNA's include files are installed: the program passes p4c's front and mid
  end for the TNA architecture;
* where p4c's Tofino backend (p4c-barefoot / bf-p4c) is installed: it compiles for Tofino-1 and
  the P4Info it writes names the same entities as the v1model P4Info.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from google.protobuf import text_format

from emulation.targets import (
    BUILD,
    REPO,
    load_p4info,
    p4test_binary,
    tna_include_dir,
    tofino_compiler,
)

TNA_MAIN = REPO / "p4src" / "tna" / "kvcast.p4"
TNA_SOURCES = sorted((REPO / "p4src" / "tna").rglob("*.p4"))

# v1model entities the TNA program does not have, and why.
ABSENT_ON_TOFINO = {
    # Egress counts drops only; its Stats instance on BMv2 also declares the event counter,
    # which egress never uses.
    "KvcastEgress.stats.kvp_event_counter": "egress counts no events",
}
# TNA entities the v1model program does not have, and why.
EXTRA_ON_TOFINO = {
    # A Tofino counter runs once per pass: the hot-key event of a GET miss (which also counts
    # EV_GET_MISS) has a counter of its own.
    "KvcastIngress.stats.hot_digest_counter",
}


def _source() -> str:
    text = "\n".join(p.read_text() for p in TNA_SOURCES)
    return re.sub(r"//[^\n]*|/\*.*?\*/", "", text, flags=re.S)


def _block(source: str, kind: str, name: str) -> str | None:
    """The text of ``table NAME { ... }`` / ``action NAME(...) { ... }``, or None."""
    match = re.search(rf"\b{kind}\s+{re.escape(name)}\s*[({{]", source)
    if match is None:
        return None
    depth, i = 0, source.index("{", match.start())
    for j in range(i, len(source)):
        depth += {"{": 1, "}": -1}.get(source[j], 0)
        if depth == 0:
            return source[match.start() : j + 1]
    return None


def _declares_instance(source: str, name: str) -> bool:
    """``Type() name;`` or ``Type<...>(...) name;`` (a control or extern instance)."""
    return re.search(rf"\)\s*{re.escape(name)}\s*(;|=)", source) is not None


def _check_path(source: str, full_name: str, problems: list[str]) -> str:
    """Checks the instance chain of ``Control.inst.inst.local``; returns the local name."""
    parts = full_name.split(".")
    if parts[0] not in ("KvcastIngress", "KvcastEgress"):
        problems.append(f"{full_name}: unexpected top-level control")
    elif not re.search(rf"\bcontrol\s+{parts[0]}\s*\(", source):
        problems.append(f"{full_name}: no control {parts[0]} in p4src/tna")
    for inst in parts[1:-1]:
        if not _declares_instance(source, inst):
            problems.append(f"{full_name}: no instance named {inst!r} in p4src/tna")
    return parts[-1]


def test_tna_declares_every_v1model_entity_under_the_same_name() -> None:
    info = load_p4info(BUILD / "kvcast.p4info.txtpb")
    source = _source()
    problems: list[str] = []
    for table in info.tables:
        local = _check_path(source, table.preamble.name, problems)
        block = _block(source, "table", local)
        if block is None:
            problems.append(f"{table.preamble.name}: no table {local}")
            continue
        for mf in table.match_fields:
            if f'@name("{mf.name}")' not in block:
                problems.append(f"{table.preamble.name}: no match field named {mf.name!r}")
    for action in info.actions:
        if action.preamble.name == "NoAction":
            continue
        local = _check_path(source, action.preamble.name, problems)
        block = _block(source, "action", local)
        if block is None:
            problems.append(f"{action.preamble.name}: no action {local}")
            continue
        head = block[: block.index("{")]
        for param in action.params:
            if not re.search(rf"\b{param.name}\s*[,)]", head):
                problems.append(f"{action.preamble.name}: no parameter {param.name!r}")
    externs = [r.preamble.name for r in info.registers]
    externs += [ctr.preamble.name for ctr in info.counters]
    externs += [d.preamble.name for d in info.direct_counters]
    for name in externs:
        if name in ABSENT_ON_TOFINO:
            continue
        local = _check_path(source, name, problems)
        if not _declares_instance(source, local):
            problems.append(f"{name}: no register or counter named {local!r}")
    assert not problems, "p4src/tna differs from the v1model program:\n" + "\n".join(problems)


def test_the_names_check_fails_on_a_renamed_table() -> None:
    source = _source().replace("table cache_table", "table cache_tbl")
    assert _block(source, "table", "cache_table") is None
    assert _block(_source(), "table", "cache_table") is not None


def _tna_include() -> Path:
    include = tna_include_dir()
    if include is None:
        pytest.skip(
            "TNA include files (tna.p4) not found: build p4c with its Tofino backend "
            "(docs/tofino.md) or set KVCAST_TNA_INCLUDE"
        )
    return include


def test_tna_program_passes_p4c_front_and_mid_end() -> None:
    p4test = p4test_binary()
    if p4test is None:
        pytest.skip("p4test not installed (p4c's front/mid-end test driver; docs/bmv2.md)")
    include = _tna_include()
    proc = subprocess.run(
        [
            p4test,
            "--std",
            "p4-16",
            "-D__TARGET_TOFINO__",
            "-I",
            "p4src",
            "-I",
            str(include),
            "--Wdisable=unused",
            str(TNA_MAIN.relative_to(REPO)),
        ],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert proc.returncode == 0, f"p4test rejects p4src/tna:\n{proc.stderr[-3000:]}"
    assert "error" not in proc.stderr.lower(), proc.stderr[-3000:]


def test_tna_program_compiles_for_tofino_with_the_same_p4info_names(tmp_path: Path) -> None:
    compiler = tofino_compiler()
    if compiler is None:
        pytest.skip("p4c's Tofino backend (p4c-barefoot or bf-p4c) not installed (docs/tofino.md)")
    p4info_path = tmp_path / "kvcast_tna.p4info.txtpb"
    proc = subprocess.run(
        [
            compiler,
            "--target",
            "tofino",
            "--arch",
            "tna",
            "-I",
            "p4src",
            "--p4runtime-files",
            str(p4info_path),
            "-o",
            str(tmp_path / "out"),
            str(TNA_MAIN.relative_to(REPO)),
        ],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=3000,
        cwd=REPO,
    )
    assert proc.returncode == 0, f"the Tofino backend rejects p4src/tna:\n{proc.stderr[-4000:]}"
    from finsy.proto import p4i

    tna = text_format.Parse(p4info_path.read_text(), p4i.P4Info())
    v1 = load_p4info(BUILD / "kvcast.p4info.txtpb")

    def names(info: p4i.P4Info) -> set[str]:
        out: set[str] = set()
        for group in (info.tables, info.actions, info.registers, info.counters,
                      info.direct_counters):  # fmt: skip
            # bf-p4c prefixes the pipe's name ("pipe.KvcastIngress...").
            out |= {e.preamble.name.removeprefix("pipe.") for e in group}
        return out

    missing = names(v1) - names(tna) - set(ABSENT_ON_TOFINO)
    extra = names(tna) - names(v1) - EXTRA_ON_TOFINO
    assert not missing and not extra, f"missing on Tofino: {missing}; extra: {extra}"
