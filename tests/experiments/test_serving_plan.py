"""The serving sweep's plan: what each mode asks of the connector and how many pool nodes hold
the prefix; the replicas' copying client refuses a description that does not match its file."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.serving_plan import MODES, mode_options, replicas
from experiments.serving_replicas import main as replicate_main


def test_the_r_modes_read_k_replicas_by_unicast_and_the_rest_one_pool_node() -> None:
    assert {m: replicas(m) for m in MODES} == {
        "recompute": 1, "pool": 1, "r2": 2, "r4": 4, "multicast": 1, "sram": 1, "local": 1,
    }  # fmt: skip
    for mode in ("pool", "r2", "r4"):
        assert mode_options(mode, 3, 101) == {"save": False}
    assert mode_options("multicast", 0, 101)["role"] == "leader"
    assert mode_options("multicast", 1, 101) == {
        "save": False, "group": 101, "role": "follower",
    }  # fmt: skip
    assert mode_options("recompute", 0, 101) == {"load": False, "save": False}


def test_an_unknown_mode_is_an_error_naming_the_modes() -> None:
    with pytest.raises(ValueError, match="r3.*recompute, pool, r2, r4"):
        replicas("r3")


def test_the_copying_client_refuses_a_spec_that_does_not_match_its_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    chunks = tmp_path / "chunks.bin"
    chunks.write_bytes(bytes(300))
    with pytest.raises(SystemExit) as exc:
        replicate_main(
            ["--master", "127.0.0.1:1", "--local-hostname", "127.0.0.1", "--chunks", str(chunks),
             "--spec", "7:16:100,7:17:100"]
        )  # fmt: skip
    assert exc.value.code == 2
    assert "names 200 bytes" in capsys.readouterr().err
