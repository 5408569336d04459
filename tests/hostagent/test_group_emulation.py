"""Group fetch through the real reference switch in a Mininet cluster (2 hosts, 1 pool node).

The pool node runs ``python -m poolnode`` in p1's namespace with a preloaded synthetic chunk;
the leader (h1) and the follower (h2) are ``python -m hostagent.agent fetch`` processes in their
own namespaces, both bound to AGENT_PORT. The leader's NOCACHE range GETs name the group; the
switch sends them to the pool owner and multicasts the pool's DATA to both members. Checks are on
bytes and counters, never on times.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from emulation.targets import REPO
from kvcast import p4constants as c
from kvcast.ports import AGENT_PORT
from tests.mininet_env import MININET_MISSING

pytestmark = [pytest.mark.slow, pytest.mark.netns]

TENANT, KEY, NBYTES, SEED, GROUP = 7, 0x6E0C0DE, 48 * 1024, 21, 5


def _agent(name: str, mode: str, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "hostagent.agent", "fetch", "--tenant", str(TENANT),
        "--key", f"{KEY:#x}", "--nbytes", str(NBYTES), "--service", "10.0.100.1",
        "--pool", "10.0.1.1", "--mode", mode, "--group", str(GROUP), "--name", name,
        "--verify-seed", str(SEED), "--bind-port", str(AGENT_PORT), "--timeout", "30",
        "--get-timeout", "0.3", "--max-get-timeout", "1.0", *extra,
    ]  # fmt: skip


def _wait_line(stream: Any, pattern: str) -> str:
    for line in stream:
        if re.search(pattern, line):
            return str(line)
    raise AssertionError(f"process ended before printing {pattern!r}")


@pytest.mark.skipif(bool(MININET_MISSING), reason=MININET_MISSING or "runs")
def test_leader_and_follower_through_the_reference_switch_both_verify(tmp_path: Path) -> None:
    from emulation.network import Cluster
    from emulation.switches import RefSwitch
    from emulation.topo import ClusterSpec, LinkSpec

    spec = ClusterSpec(n_hosts=2, n_pools=1, host_link=LinkSpec(), pool_link=LinkSpec())
    stats = tmp_path / "pool.json"
    pipes: dict[str, Any] = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    with Cluster(spec, RefSwitch) as cluster:
        pool_cmd = [
            sys.executable, "-m", "poolnode", "--backend", "memory", "--preload",
            f"{TENANT}:{KEY:#x}:{NBYTES}:{SEED}", "--stats-file", str(stats),
            "--stats-interval", "0", "--group", str(GROUP),  # the one group the test makes
            *cluster.source_tenants(),  # the hosts' bindings on the switch
        ]  # fmt: skip
        cluster.add_group(GROUP, ["h1", "h2"])
        with cluster.popen("p1", pool_cmd, cwd=REPO, text=True, **pipes) as pool:
            _wait_line(pool.stdout, "poolnode listening")
            # The follower listens first (a long first wait: it must take the stream, not
            # repair), then the leader starts the stream.
            follower_cmd = _agent("h2", "follower", "--first-wait", "60", "--stall", "2")
            with cluster.popen("h2", follower_cmd, cwd=REPO, text=True, **pipes) as follower:
                _wait_line(follower.stderr, "agent ready")
                leader_cmd = _agent("h1", "leader", "--via", "pool")
                with cluster.popen("h1", leader_cmd, cwd=REPO, text=True, **pipes) as leader:
                    lead_out, lead_err = leader.communicate(timeout=90)
                fol_out, fol_err = follower.communicate(timeout=90)
            pool.terminate()
            pool.communicate(timeout=30)
        events = cluster.client.counters(c.COUNTER_INGRESS_STATS_KVP_EVENT_COUNTER)
    lead = json.loads(lead_out.splitlines()[-1]) if lead_out else {"error": lead_err}
    fol = json.loads(fol_out.splitlines()[-1]) if fol_out else {"error": fol_err}
    assert (lead.get("verified"), fol.get("verified")) == (True, True), (lead, fol)
    frags = -(-NBYTES // 256)
    assert lead["frags_pool"] == frags and lead["frags_switch"] == 0
    # The follower took the leader's stream (replicas), repairing at most what was lost.
    assert fol["frags_stream"] > 0
    assert fol["frags_stream"] + fol["repairs"] == frags
    # The pool sent the chunk about once, not once per host.
    sent = json.loads(stats.read_text())["stats"]["data_payload_bytes"]
    assert NBYTES <= sent < 2 * NBYTES
    # The leader's GETs bypassed the cache; the pool's DATA was multicast by the switch.
    assert events.get(c.EV_GET_BYPASS, 0) == lead["gets_sent"]
    assert events.get(c.EV_DATA_MCAST, 0) > 0
