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

import json
import re
import subprocess
from pathlib import Path

import pytest

from controlplane.targets import pack_bf_pipeline_config, unpack_bf_pipeline_config
from emulation.targets import (
    BUILD,
    REPO,
    load_p4info,
    p4test_binary,
    tna_include_dir,
    tofino_compiler,
)
from kvcast.tools.tofino_summary import summarize

TOFINO_BUILD = REPO / "p4src" / "build" / "tofino"

TNA_MAIN = REPO / "p4src" / "tna" / "kvcast.p4"
# The TNA program's own files and the controls it shares with the v1model program.
TNA_SOURCES = sorted((REPO / "p4src" / "tna").rglob("*.p4")) + sorted(
    (REPO / "p4src" / "shared" / "control").rglob("*.p4")
)

# v1model entities the TNA program does not have, and why.
ABSENT_ON_TOFINO = {
    # Egress counts drops only; its Stats instance on BMv2 also declares the event counter,
    # which egress never uses.
    "KvcastEgress.stats.kvp_event_counter": "egress counts no events",
    # The structural checks open the ingress verdict chain on Tofino (drop(DROP_MALFORMED)),
    # where they cost no stage of their own; KvpValidate only computes the lengths.
    "KvcastIngress.kvp_validate.malformed": "checks made in the ingress verdict chain",
    # Tofino fragments are 24 words of 32 bits (sizes.p4: what fits in 12 stages).
    **{
        f"KvcastIngress.fragments.slice_{i:02d}.frag_word": "Tofino fragments are 24 words"
        for i in range(24, 32)
    },
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
        if action.preamble.name == "NoAction" or action.preamble.name in ABSENT_ON_TOFINO:
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


def _blocks(text: str, key: str) -> list[str]:
    """The bodies of the top-level ``key { ... }`` blocks of a text-format message."""
    out = []
    for match in re.finditer(rf"^{key} {{", text, flags=re.M):
        depth, start = 0, match.end() - 1
        for j in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            if depth == 0:
                out.append(text[start : j + 1])
                break
    return out


def _preamble_names(block: str) -> list[str]:
    return [n.removeprefix("pipe.") for n in re.findall(r'preamble \{[^}]*?name: "([^"]+)"', block)]


# The extern types of bf-p4c's P4Info that the v1model P4Info has as registers and counters.
_EXTERN_KINDS = {"Register", "Counter", "DirectCounter"}


def _names(text: str) -> set[str]:
    """Tables, the actions they use, registers and counters of a P4Info (BMv2's or bf-p4c's).

    bf-p4c writes registers and counters as TNA externs (``barefoot.Register`` ...), which
    text_format cannot parse without Intel's protos, so the names are read from the text.
    """
    out: set[str] = set()
    for table in _blocks(text, "tables"):
        out.update(_preamble_names(table)[:1])
    refs = r"action_refs \{\s*id: (\d+)"
    table_actions = {int(i) for t in _blocks(text, "tables") for i in re.findall(refs, t)}
    for action in _blocks(text, "actions"):
        ident = int(re.search(r"id: (\d+)", action).group(1))  # type: ignore[union-attr]
        if ident in table_actions:
            out.update(_preamble_names(action))
    for key in ("registers", "counters", "direct_counters"):
        for block in _blocks(text, key):
            out.update(_preamble_names(block))
    for ext in _blocks(text, "externs"):
        kind = re.search(r'extern_type_name: "([^"]+)"', ext)
        if kind and kind.group(1) in _EXTERN_KINDS:
            out.update(_preamble_names(ext))
    return out


def _check_same_names(tna_text: str) -> None:
    v1 = _names((BUILD / "kvcast.p4info.txtpb").read_text())
    tna = _names(tna_text)
    missing = v1 - tna - set(ABSENT_ON_TOFINO)
    extra = tna - v1 - EXTRA_ON_TOFINO
    assert not missing and not extra, f"missing on Tofino: {missing}; extra: {extra}"


def test_the_committed_tofino_p4info_names_the_v1model_entities() -> None:
    _check_same_names((TOFINO_BUILD / "kvcast.p4info.txtpb").read_text())


def test_tna_program_compiles_for_tofino_as_the_committed_summary_says(tmp_path: Path) -> None:
    compiler = tofino_compiler()
    if compiler is None:
        pytest.skip("bf-p4c (the driver of p4c's Tofino backend) not installed (docs/tofino.md)")
    out = tmp_path / "out"
    proc = subprocess.run(
        [compiler, "--target", "tofino", "--arch", "tna", "--verbose", "1", "-I", "p4src",
         "-o", str(out), "--p4runtime-files", str(out / "kvcast.p4info.txtpb"),
         "--p4runtime-force-std-externs", "--bf-rt-schema", str(out / "bf-rt.json"),
         str(TNA_MAIN.relative_to(REPO))],
        capture_output=True,
        text=True,
        timeout=3000,
        cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, f"the Tofino backend rejects p4src/tna:\n{proc.stderr[-4000:]}"
    _check_same_names((out / "kvcast.p4info.txtpb").read_text())
    gen = Path(compiler).resolve().parent / "p4c-gen-conf"
    if gen.exists() and not (out / "kvcast.conf").exists():
        subprocess.run(
            [str(gen), "--conf-type", "BF-RT", "--bfrt-name", "bf-rt.json", "--name", "kvcast",
             "--device", "tofino", "--p4-version", "p4-16", "--outputdir", ".", "--pipe", "pipe"],
            check=True, cwd=out, capture_output=True,
        )  # fmt: skip
    if (out / "kvcast.conf").exists():
        # What the controller gives a Stratum switch: the compiler's binary, packed.
        packed = unpack_bf_pipeline_config(pack_bf_pipeline_config(out / "kvcast.conf"))
        assert packed.p4_name == "kvcast"
        assert packed.profiles[0].binary == (out / "pipe" / "tofino.bin").read_bytes()
    # The fresh summary hashes the tree and the defines this compile used (none); the committed
    # one what `make p4-tofino` compiled: they differ if the sources changed since, or if the
    # committed build was made with other defines (CPU_PORT=320).
    fresh = summarize(out)
    committed = json.loads((TOFINO_BUILD / "summary.json").read_text())
    for key in ("source_sha256", "defines", "cpu_port", "stages_used", "sram_blocks",
                "tcam_blocks", "stateful_alus", "kv_bytes_per_pipe", "frag_bytes"):  # fmt: skip
        assert fresh[key] == committed[key], (key, fresh[key], committed[key])


def test_the_p4info_names_check_fails_on_a_missing_register() -> None:
    text = (TOFINO_BUILD / "kvcast.p4info.txtpb").read_text()
    broken = text.replace("KvcastIngress.fragments.frag_epoch", "KvcastIngress.fragments.epochs")
    assert broken != text
    with pytest.raises(AssertionError, match="frag_epoch"):
        _check_same_names(broken)
