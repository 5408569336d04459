"""The fuzz campaign's quick mode: 2,000 seeded mutants per target (``make fuzz`` runs 100,000)."""

from __future__ import annotations

import os
import shutil

import pytest

from emulation.targets import bmv2_binary
from fuzz.targets import run_agent, run_bmv2, run_pool, run_refswitch

COUNT, SEED = 2000, 7


def test_the_reference_pipeline_accounts_for_every_mutant() -> None:
    out = run_refswitch(COUNT, SEED)
    assert out["packets"] == COUNT
    assert out["dropped"] + out["forwarded"] + out["empty_group"] == COUNT
    assert out["dropped"] > COUNT // 2  # most mutants are malformed, and counted as such


def test_the_pool_handler_counts_every_datagram_and_answers_only_well_formed() -> None:
    out = run_pool(COUNT, SEED)
    assert out["answered"] + out["silent"] == COUNT
    assert out["data"] > 0 and out["nack"] > 0  # both kinds of answer were exercised


@pytest.mark.usefixtures("data_path")
def test_no_fetch_completes_with_a_wrong_byte_under_mutants_from_a_kvp_port() -> None:
    out = run_agent(COUNT, SEED)
    assert out["packets"] == COUNT
    assert out["complete_after"] == 1  # the client still serves once the mutants stop
    assert out["crc_failures"] + out["invalid"] + out["ignored"] > 0  # mutants did arrive


@pytest.mark.bmv2
@pytest.mark.netns
def test_bmv2_survives_mutants_and_still_serves() -> None:
    if os.geteuid() != 0:
        pytest.skip("veth pairs need root")
    if bmv2_binary() is None or shutil.which("ip") is None:
        pytest.skip("simple_switch_grpc not installed (docs/bmv2.md)")
    out = run_bmv2(1000, SEED)
    assert out["packets"] == 1000
