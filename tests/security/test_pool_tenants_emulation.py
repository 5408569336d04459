"""In an emulated cluster, a pool node started as the experiments start it checks tenants itself.

The pool node gets the hosts' bindings the switch holds (``Cluster.source_tenants``, what every
experiment passes it). A GET from h1 naming a tenant h1 is not bound to is dropped by the switch
(``BAD_TENANT``); once the switch is misprogrammed (h1's port bound with its tenant check off,
as a switch another system programs might be), the same GET reaches the pool node, which refuses
it (``bad_tenants``) although it holds the chunk.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from emulation.targets import REPO
from kvcast import p4constants as c
from tests.mininet_env import MININET_MISSING

pytestmark = [pytest.mark.slow, pytest.mark.netns]

TENANT, OTHER, KEY, NBYTES = 7, 8, 0x7E4A47, 4096

_ASK = textwrap.dedent(
    """
    import json, socket, sys
    from kvcast.wire import KvpHeader, get_message
    tenant, key, req_id, pool, port, wait = sys.argv[1:]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(float(wait))
        s.sendto(get_message(int(tenant), int(key, 0), 0, req_id=int(req_id)), (pool, int(port)))
        try:
            hdr = KvpHeader.unpack(s.recv(65536))
            print(json.dumps({"op": hdr.op, "status": hdr.status, "tenant": hdr.tenant}))
        except TimeoutError:
            print(json.dumps({"op": None}))
    """
)


def _ask(cluster: Any, host: str, pool_ip: str, tenant: int, req_id: int, wait: float) -> Any:
    """One GET from ``host`` to the pool node; its first reply (``op`` None: none came)."""
    args = [str(tenant), hex(KEY), str(req_id), pool_ip, str(c.KVP_UDP_PORT), str(wait)]
    cmd = [sys.executable, "-c", _ASK, *args]
    pipes: dict[str, Any] = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    with cluster.popen(host, cmd, cwd=REPO, text=True, **pipes) as p:
        out, err = p.communicate(timeout=wait + 60)
    assert p.returncode == 0, err
    return json.loads(out.splitlines()[-1])


@pytest.mark.skipif(bool(MININET_MISSING), reason=MININET_MISSING or "runs")
def test_the_experiments_pool_node_refuses_a_tenant_its_sender_is_not_bound_to(
    tmp_path: Path,
) -> None:
    from emulation.network import Cluster
    from emulation.switches import RefSwitch
    from emulation.topo import ClusterSpec, LinkSpec

    spec = ClusterSpec(
        n_hosts=2, n_pools=1, host_link=LinkSpec(), pool_link=LinkSpec(), tenants=(TENANT,)
    )
    stats = tmp_path / "pool.json"
    with Cluster(spec, RefSwitch) as cluster:
        pool, h1 = cluster.pools()[0], cluster.hosts()[0]
        pool_cmd = [
            sys.executable, "-m", "poolnode", "--backend", "memory",
            # Both tenants' chunk: a GET that got through unchecked would be served.
            "--preload", f"{TENANT}:{KEY:#x}:{NBYTES}", "--preload", f"{OTHER}:{KEY:#x}:{NBYTES}",
            "--stats-file", str(stats), "--stats-interval", "0", *cluster.source_tenants(),
        ]  # fmt: skip
        pipes: dict[str, Any] = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
        with cluster.popen(pool.name, pool_cmd, cwd=REPO, text=True, **pipes) as node:
            assert node.stdout is not None
            listening = next((x for x in node.stdout if x.startswith("poolnode listening")), "")
            assert listening.rstrip().endswith("tenants=list"), listening
            own = _ask(cluster, h1.name, pool.ip, TENANT, 1, 10.0)
            assert (own["op"], own["tenant"]) == (c.KVP_OP_DATA, TENANT)
            # The switch's own check first: the GET never reaches the pool node.
            assert _ask(cluster, h1.name, pool.ip, OTHER, 2, 1.0)["op"] is None
            drops = cluster.client.counters(c.COUNTER_INGRESS_STATS_DROP_COUNTER)
            assert drops.get(c.DROP_BAD_TENANT, 0) >= 1
            # A switch that checks no tenant on h1's port: the pool node's check is the one left.
            cluster.client.modify(
                c.TABLE_INGRESS_PORT_ROLE_PORT_ROLE,
                {"port": h1.port},
                c.ACTION_INGRESS_PORT_ROLE_BIND_HOST,
                {"addr": int(ipaddress.IPv4Address(h1.ip)), "check_tenant": 0},
            )
            refused = _ask(cluster, h1.name, pool.ip, OTHER, 3, 10.0)
            assert (refused["op"], refused["status"]) == (c.KVP_OP_NACK, c.KVP_STATUS_BAD_REQUEST)
            assert _ask(cluster, h1.name, pool.ip, TENANT, 4, 10.0)["op"] == c.KVP_OP_DATA
            node.terminate()
            node.communicate(timeout=30)
    counted = json.loads(stats.read_text())["stats"]
    assert (counted["bad_tenants"], counted["unknown_sources"]) == (1, 0)
