"""The serving sweep's plan: what each mode asks of the connector and how many pool nodes hold
the prefix; the replicas' copying client refuses a description that does not match its file."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.serving_plan import MODES, mode_options, replicas
from experiments.serving_replicas import main as replicate_main
from experiments.serving_replicas import replica_copies
from kvcast import p4constants as c
from kvcast.integrity import chunk_mac, mac_key_of
from kvcast.replicas import replica_key


def test_the_r_modes_read_k_replicas_by_unicast_and_the_rest_one_pool_node() -> None:
    assert {m: replicas(m) for m in MODES} == {
        "recompute": 1, "pool": 1, "r2": 2, "r4": 4, "multicast": 1, "sram": 1, "local": 1,
    }  # fmt: skip
    assert mode_options("pool", 3, 101) == {"save": False}
    # Engine i reads replica i mod k.
    assert mode_options("r2", 3, 101) == {"save": False, "replica": 1, "replicas": 2}
    assert mode_options("r4", 3, 101) == {"save": False, "replica": 3, "replicas": 4}
    assert mode_options("r4", 4, 101)["replica"] == 0
    assert mode_options("multicast", 0, 101)["role"] == "leader"
    assert mode_options("multicast", 1, 101) == {
        "save": False, "group": 101, "role": "follower",
    }  # fmt: skip
    assert mode_options("recompute", 0, 101) == {"load": False, "save": False}


def test_each_pool_node_holds_its_replicas_keys_and_every_replica_keys_mac() -> None:
    secret = bytes(range(32))
    chunks = [(7, (0xA5 + b << 8) | b, bytes([b]) * 64) for b in (0, 1, 2, 3, 6, 0xFF)]
    copies = replica_copies(chunks, {2, 4}, 4, {7: secret})
    assert len(copies) == 4
    macs = {}
    for count in (2, 4):
        for j in range(count):
            for t, k, d in chunks:
                rk = replica_key(k, j, count)
                assert (t, rk, d) in copies[j]  # node j serves it under its own bucket
                assert (rk & (c.POOL_BUCKETS - 1)) % count == j
                macs[(t, mac_key_of(rk))] = chunk_mac(secret, t, rk, d)
    for node in copies:
        held = {(t, k): d for t, k, d in node}
        assert len(held) == len(node)  # a key two counts give one node is held once
        assert all(held[tk] == m for tk, m in macs.items())
    # Nodes 2 and 3 hold only r4's copies (and the MACs); without MAC keys no MAC objects.
    plain = replica_copies(chunks, {2, 4}, 4)
    assert {k for _, k, _ in plain[3]} == {replica_key(k, 3, 4) for _, k, _ in chunks}
    with pytest.raises(ValueError, match="4 replicas need 4 pool nodes; there are 2"):
        replica_copies(chunks, {4}, 2)
    # Two chunks whose keys differ in the low bits only would share a replica key: refused.
    clash = [(7, 0xA500, b"a" * 64), (7, 0xA501, b"b" * 64)]
    with pytest.raises(ValueError, match="share replica key 0xa500"):
        replica_copies(clash, {2}, 2)


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
