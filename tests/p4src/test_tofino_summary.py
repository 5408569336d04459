"""p4src/build/tofino: what the Tofino backend placed, committed, and kept fresh.

The summary is written by ``make p4-tofino`` (kvcast.tools.tofino_summary) from the compiler's own
resource report. These tests need no compiler: they recompute the sources' hash (a source change
without a new compile fails here, unless ``uncompiled.json`` records it: which sources were
compiled, which are committed, and that docs/tofino.md says so), hold the summary to the chip's
budget, and check that docs/tofino.md quotes it. Where the compiler exists,
tests/p4src/test_tna.py recompiles and compares.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvcast.tools.gen_constants import parse_sizes
from kvcast.tools.tofino_summary import REPO, SOURCE_DIRS, source_sha256, summarize

BUILD = REPO / "p4src" / "build" / "tofino"
MIB = 1 << 20


@pytest.fixture(scope="module")
def summary() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((BUILD / "summary.json").read_text())
    return data


def test_the_summary_was_made_from_todays_sources(summary: dict[str, Any]) -> None:
    uncompiled = BUILD / "uncompiled.json"
    now = source_sha256(REPO, summary["defines"])
    if summary["source_sha256"] == now:
        assert not uncompiled.exists(), "the summary is fresh: remove uncompiled.json"
        return
    assert uncompiled.exists(), (
        f"{' and '.join(SOURCE_DIRS)} changed since p4src/build/tofino was written: "
        "run `make p4-tofino` (docs/tofino.md) and commit p4src/build/tofino; without bf-p4c, "
        f"record the change in {uncompiled.name} (source_sha256 {now}) and in docs/tofino.md"
    )
    record = json.loads(uncompiled.read_text())
    assert record["compiled_source_sha256"] == summary["source_sha256"]
    assert record["source_sha256"] == now, (
        f"sources changed again since {uncompiled.name} was written: run `make p4-tofino`, or "
        f"record source_sha256 {now} there with what changed"
    )
    assert record["changes"], "say what was not compiled"
    assert uncompiled.name in (REPO / "docs" / "tofino.md").read_text()


def _copy_sources(tmp_path: Path) -> None:
    for d in SOURCE_DIRS:
        for path in (REPO / d).rglob("*"):
            if path.is_file():
                copy = tmp_path / path.relative_to(REPO)
                copy.parent.mkdir(parents=True, exist_ok=True)
                copy.write_bytes(path.read_bytes())


def test_the_hash_covers_every_input_of_the_compile(tmp_path: Path) -> None:
    _copy_sources(tmp_path)
    base = source_sha256(tmp_path)
    assert base == source_sha256()
    one = next((tmp_path / "p4src/tna").rglob("*.p4"))
    one.write_bytes(one.read_bytes() + b"// changed\n")
    changed = source_sha256(tmp_path)
    assert changed != base
    # A file an #include may name need not end in .p4.
    (tmp_path / "p4src/shared/extra.h").write_text("#define X 1\n")
    with_header = source_sha256(tmp_path)
    assert with_header != changed
    # The defines are inputs too: a build for another CPU port is another program.
    assert source_sha256(tmp_path, ["CPU_PORT_NUM=320"]) != with_header


def _fake_build(tmp_path: Path, defines: list[str]) -> Path:
    """A build directory as bf-p4c leaves it, around the committed resource report."""
    build = tmp_path / "build"
    (build / "pipe" / "logs").mkdir(parents=True)
    (build / "pipe" / "tofino.bin").write_bytes(b"\0")
    resources = (BUILD / "resources.json").read_bytes()
    (build / "pipe" / "logs" / "resources.json").write_bytes(resources)
    manifest = {
        "compilation_succeeded": True,
        "compiler_version": "test",
        "target": "tofino",
        "programs": [{"source_files": {"defines": ["__TARGET_TOFINO__=1", "__p4c__=1", *defines]}}],
    }
    (build / "manifest.json").write_text(json.dumps(manifest))
    pipeline = {"p4_pipeline_name": "pipe", "pipe_scope": [0, 1, 2, 3]}
    conf = {"p4_devices": [{"p4_programs": [{"p4_pipelines": [pipeline]}]}]}
    (build / "kvcast.conf").write_text(json.dumps(conf))
    return build


def test_the_summary_records_the_defines_and_the_cpu_port_compiled_for(
    tmp_path: Path, summary: dict[str, Any]
) -> None:
    default = summarize(_fake_build(tmp_path / "a", []))
    assert default["defines"] == []
    assert default["cpu_port"] == summary["cpu_port"] == 192
    assert default["source_sha256"] == source_sha256()
    four_pipes = summarize(_fake_build(tmp_path / "b", ["CPU_PORT_NUM=320"]))
    assert four_pipes["defines"] == ["CPU_PORT_NUM=320"]
    assert four_pipes["cpu_port"] == 320
    # So a summary of a CPU_PORT=320 build does not pass for the committed default build.
    assert four_pipes["source_sha256"] != default["source_sha256"]
    assert four_pipes["pipes_served"] == 4


def test_pipes_served_is_what_the_compilers_conf_loads_the_program_on(tmp_path: Path) -> None:
    build = _fake_build(tmp_path, [])
    conf = json.loads((build / "kvcast.conf").read_text())
    conf["p4_devices"][0]["p4_programs"][0]["p4_pipelines"][0]["pipe_scope"] = [0, 1]
    (build / "kvcast.conf").write_text(json.dumps(conf))
    assert summarize(build)["pipes_served"] == 2
    (build / "kvcast.conf").unlink()
    with pytest.raises(ValueError, match="expected one compiler .conf, found 0"):
        summarize(build)


def test_the_program_fits_one_tofino_pipe_and_serves_every_pipe(summary: dict[str, Any]) -> None:
    assert summary["target"] == "tofino"
    assert 1 <= summary["stages_used"] <= summary["stages_available"] == 12
    assert summary["kv_bytes_per_pipe"] >= 2 * MIB
    assert summary["pipes_served"] == 4
    sizes = parse_sizes(REPO / "p4src/shared/sizes.p4", REPO / "p4src", "__TARGET_TOFINO__")
    assert summary["frag_bytes"] == sizes["FRAG_BYTES"]
    assert summary["kv_bytes_per_pipe"] == sizes["FRAG_BYTES"] * sizes["NUM_FRAG_SLOTS"]
    placed = [u for s in summary["stage_map"] for u in s["stateful_alus"]]
    assert len(placed) == summary["stateful_alus"]
    assert sum(u.endswith(".frag_word") for u in placed) == sizes["FRAG_WORDS"]
    assert all(len(s["stateful_alus"]) <= 4 for s in summary["stage_map"])


def test_the_compilers_own_reports_are_committed_with_it(summary: dict[str, Any]) -> None:
    resources = json.loads((BUILD / "resources.json").read_text())
    stages = resources["resources"]["mau"]["mau_stages"]
    assert sum(len(s["rams"]["srams"]) for s in stages) == summary["sram_blocks"]
    assert (BUILD / "table_summary.log").read_text().strip()
    assert "KvcastIngress.cache.cache_table" in (BUILD / "kvcast.p4info.txtpb").read_text()


def test_docs_quote_the_summarys_numbers(summary: dict[str, Any]) -> None:
    doc = (REPO / "docs" / "tofino.md").read_text()
    wanted = {
        "stages": f"{summary['stages_used']} of 12 stages",
        "KV bytes": f"{summary['kv_bytes_per_pipe']:,} bytes",
        "stateful ALUs": f"{summary['stateful_alus']} stateful ALUs",
        "SRAM": f"{summary['sram_blocks']} SRAM blocks",
        "compiler": summary["compiler"],
    }
    missing = {k: v for k, v in wanted.items() if v not in doc}
    assert not missing, f"docs/tofino.md does not quote the summary: {missing}"
