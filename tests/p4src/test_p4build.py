"""The committed compiler outputs and generated constants must match the P4 source.

p4src/build/ holds what p4c made of p4src (the reference target needs the P4Info where no p4c
is installed); kvcast/p4constants.py is generated from it. Both go stale when the source
changes: these tests catch that wherever the tools are present.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from emulation.targets import BUILD, REPO, p4c_binary
from kvcast.tools import gen_constants

P4_MAIN = REPO / "p4src" / "v1model" / "kvcast.p4"


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """p4c's output for the current source (compiled once for the module)."""
    tmp_path = tmp_path_factory.mktemp("p4c")
    p4c = p4c_binary()
    if p4c is None:
        pytest.skip("p4c not installed: p4c-bm2-ss not found (docs/bmv2.md)")
    out = tmp_path / "kvcast.p4info.txtpb"
    proc = subprocess.run(
        [
            p4c,
            "--std",
            "p4-16",
            "-I",
            "p4src",
            str(P4_MAIN.relative_to(REPO)),
            "-o",
            str(tmp_path / "kvcast.json"),
            "--p4runtime-files",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        # From the repository root with relative paths, as `make p4` runs it: the BMv2 JSON
        # records source file names.
        cwd=REPO,
    )
    assert proc.returncode == 0, f"p4c-bm2-ss failed:\n{proc.stderr[-3000:]}"
    return tmp_path


def test_committed_p4info_is_what_p4c_makes_of_the_source(compiled: Path) -> None:
    assert (compiled / "kvcast.p4info.txtpb").read_text() == (
        BUILD / "kvcast.p4info.txtpb"
    ).read_text(), "p4src/build/kvcast.p4info.txtpb is stale: run `make p4 constants` and commit"


def test_committed_bmv2_json_is_what_p4c_makes_of_the_source(compiled: Path) -> None:
    assert (compiled / "kvcast.json").read_text() == (BUILD / "kvcast.json").read_text(), (
        "p4src/build/kvcast.json is stale: run `make p4` and commit"
    )


def test_generated_constants_match_p4info_defines_and_sizes() -> None:
    src = REPO / "p4src" / "shared"
    text = gen_constants.render(
        gen_constants.parse_defines((src / "defines.p4").read_text()),
        gen_constants.parse_sizes(src / "sizes.p4", REPO / "p4src"),
        gen_constants.load_p4info(BUILD / "kvcast.p4info.txtpb"),
        [
            "p4src/shared/defines.p4",
            "p4src/shared/headers.p4",
            "p4src/shared/sizes.p4",
            "p4src/build/kvcast.p4info.txtpb",
        ],
        gen_constants.parse_header_bits((src / "headers.p4").read_text()),
    )
    assert text == (REPO / "kvcast" / "p4constants.py").read_text(), (
        "kvcast/p4constants.py is stale: run `make constants` and commit"
    )
