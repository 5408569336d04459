"""Producer to consumer across the emulated network, with Mooncake Store as the DRAM pool.

``experiments.prefix_share`` on a Mininet cluster (reference switch, three GPU hosts, a pool node
running Mooncake Store): host 1 publishes a prompt's KV with the producer path (Mooncake
``batch_put_from`` over TCP through the switch) and reports it as stored; hosts 2 and 3 get the
prompt's prefix from its token ids alone (the switch misses and forwards to the pool node, which
reads Mooncake Store), every block CRC-checked and byte-identical to host 1's.
"""

from __future__ import annotations

import pytest

from tests.mininet_env import MININET_MISSING
from tests.poolnode.conftest import MOONCAKE_MISSING

pytestmark = [pytest.mark.slow, pytest.mark.netns]


def test_a_prefix_one_host_publishes_reaches_the_others_through_switch_and_mooncake() -> None:
    if MININET_MISSING:
        pytest.skip(MININET_MISSING)
    if MOONCAKE_MISSING:
        pytest.skip(MOONCAKE_MISSING)
    from experiments.prefix_share import KEYER, PROMPT, run

    produced, *consumed = run(n_hosts=3)
    n = len(KEYER.keys(PROMPT))
    assert (produced["stored"], produced["failed"]) == (n, 0), produced
    assert [r[1:] for r in produced["records"]] == [["stored", b] for b in range(n)]
    assert len(consumed) == 2
    for rec in consumed:
        assert rec["blocks"] == n and rec["tokens"] == n * KEYER.block_size, rec
        assert rec["same"] == [True] * n and rec["stop"] == "none"
        assert rec["frags_pool"] > 0 and not rec["fell_back"]  # from the pool, through the switch
