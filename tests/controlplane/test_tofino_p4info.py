"""The controller on the Tofino program: the committed Tofino P4Info drives every driver.

``p4src/build/tofino/kvcast.p4info.txtpb`` is what ``make p4-tofino`` wrote (standard P4Runtime
entities, ``--p4runtime-force-std-externs``). A daemon configured for a Tofino switch with it
builds its runtime (client, drivers, digest subscription), and every session's writes, the
cache entries, counter reads, PacketOuts and the hot-miss digest are encoded with that P4Info:
no v1model P4Info and no ``pipe.`` stand-in. The reference target cannot run the Tofino program
(its device config is BMv2's or none), so the switch's transport is replaced by one that
encodes each request with the client's schema, as finsy does before sending, and records it.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import finsy as fy
import pytest
import yaml
from finsy import p4entity
from finsy.proto import p4d, p4r

from controlplane.config import parse_config
from controlplane.drivers import CacheEntry, ChunkId
from controlplane.errors import ControlPlaneError
from controlplane.metrics import ControllerMetrics
from controlplane.p4rt import ConnectionState, SessionInfo
from controlplane.runtime import SwitchRuntime
from emulation.targets import REPO
from kvcast import p4constants as c

from .test_targets import compiler_output

TOFINO_P4INFO = REPO / "p4src" / "build" / "tofino" / "kvcast.p4info.txtpb"
FANOUT = [68, 196]  # one loopback port in each pipe of a 2-pipe part
CPU_PORT = 192


class Transport:
    """The switch's side of finsy's Write and Read: encodes against the P4Info and records."""

    def __init__(self, schema: fy.P4Schema) -> None:
        self.schema = schema
        self.updates: list[Any] = []
        self.reads: list[p4r.Entity] = []

    async def write(self, entities: Iterable[Any], **_: Any) -> None:
        self.updates += p4entity.encode_updates(list(entities), self.schema)

    async def read(self, entities: Iterable[Any]) -> AsyncIterator[Any]:
        self.reads += p4entity.encode_entities(list(entities), self.schema)
        for _ in ():
            yield _

    def written(self, kind: type[Any]) -> set[int]:
        """The ids of the tables (or counters, ...) the Writes touched."""
        out = set()
        for update in self.updates:
            if isinstance(update, p4r.Update):
                entity = update.entity
                if entity.HasField("table_entry") and kind is p4r.TableEntry:
                    out.add(entity.table_entry.table_id)
                if entity.HasField("digest_entry") and kind is p4r.DigestEntry:
                    out.add(entity.digest_entry.digest_id)
        return out


def _config(tmp_path: Path, p4info: Path) -> Any:
    switch = {
        "name": "t1",
        "address": "10.0.0.2:9339",
        "target": "tofino",
        "p4info": str(p4info),
        "device_config": str(compiler_output(tmp_path)),
        "cpu_port": CPU_PORT,
        "fanout_ports": FANOUT,
    }
    host = {"name": "h1", "ip": "10.0.0.1", "mac": "00:00:00:00:00:01", "port": 1}
    pool = {"name": "p1", "ip": "10.0.1.1", "mac": "00:00:00:00:01:01", "port": 41}
    return parse_config(
        {"switches": [switch], "hosts": [{**host, "tenants": [1, 2]}], "pools": [pool]}
    )


def _runtime(tmp_path: Path, p4info: Path) -> SwitchRuntime:
    cfg = _config(tmp_path, p4info)
    return SwitchRuntime(cfg.switches[0], cfg, ControllerMetrics())


def _connect(rt: SwitchRuntime, monkeypatch: pytest.MonkeyPatch) -> Transport:
    switch = rt.client._switch  # noqa: SLF001 - the transport under the client
    transport = Transport(switch.p4info)
    monkeypatch.setattr(switch, "write", transport.write)
    monkeypatch.setattr(switch, "read", transport.read)
    monkeypatch.setattr(rt.client, "_state", ConnectionState.READY)
    return transport


def _digest_list(
    schema: fy.P4Schema, tenant: int, key: int, estimate: int
) -> p4r.StreamMessageResponse:
    """A DigestList of the hot-miss digest as the switch sends it on the stream."""
    digest = schema.digests[c.DIGEST_HOT_MISS_DIGEST_T]

    def bits(value: int) -> p4d.P4Data:
        return p4d.P4Data(bitstring=value.to_bytes(max(1, (value.bit_length() + 7) // 8), "big"))

    data = p4d.P4Data(struct=p4d.P4StructLike(members=[bits(tenant), bits(key), bits(estimate)]))
    digests = p4r.DigestList(digest_id=digest.id, list_id=1, data=[data], timestamp=1)
    return p4r.StreamMessageResponse(digest=digests)


def test_the_daemon_programs_a_tofino_through_the_compilers_p4info(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = _runtime(tmp_path, TOFINO_P4INFO)
    transport = _connect(rt, monkeypatch)
    # The client pushes the compiler's P4Info as it is.
    assert rt.client.p4info.digests[0].preamble.name == "KvcastIngressDeparser.hot_miss_digest"

    async def session() -> None:
        for driver in rt.client._drivers:  # noqa: SLF001 - every driver, in the daemon's order
            await driver.reinstall(SessionInfo(generation=1, pipeline_pushed=True))
        chunk = ChunkId(1, 0xABCDEF)
        await rt.loader.cache.insert(CacheEntry(chunk, slot_base=8, frag_count=4, epoch=3))
        await rt.sketch.open_window()
        await rt.stats.counters()
        await rt.stats.cache_hits()
        await rt.client.packet_out(b"\0" * 64, egress_port=0, pad=0)

    asyncio.run(session())
    schema = rt.client.schema
    tables = {schema.tables[t].id for t in (
        c.TABLE_INGRESS_PORT_ROLE_PORT_ROLE, c.TABLE_INGRESS_PORT_ROLE_TENANT_BINDING,
        c.TABLE_INGRESS_FORWARDING_IPV4_LPM, c.TABLE_INGRESS_FORWARDING_L2_FWD,
        c.TABLE_INGRESS_POOL_OWNER_POOL_OWNER, c.TABLE_INGRESS_HOT_SKETCH_SKETCH_CONFIG,
        c.TABLE_EGRESS_REPLICA_REPLICA_DST, c.TABLE_INGRESS_CACHE_CACHE_TABLE)}  # fmt: skip
    missing = {schema.tables[t].name for t in tables - transport.written(p4r.TableEntry)}
    assert not missing, f"no entry written to {missing}"
    assert transport.written(p4r.DigestEntry) == {schema.digests[c.DIGEST_HOT_MISS_DIGEST_T].id}
    # The fan-out group (one replica per pipe) and the FANOUT role of each fan-out port.
    groups = [
        u.entity.packet_replication_engine_entry.multicast_group_entry
        for u in transport.updates
        if isinstance(u, p4r.Update) and u.entity.HasField("packet_replication_engine_entry")
    ]
    fanout = [g for g in groups if g.multicast_group_id == c.WRITE_FANOUT_GROUP]
    assert fanout and sorted(r.egress_port for r in fanout[-1].replicas) == FANOUT
    read_counters = {
        e.counter_entry.counter_id for e in transport.reads if e.HasField("counter_entry")
    }
    assert schema.counters["KvcastIngress.stats.hot_digest_counter"].id in read_counters
    assert len(read_counters) == 4  # no egress event counter on Tofino
    packet_outs = [u for u in transport.updates if isinstance(u, p4r.StreamMessageRequest)]
    assert len(packet_outs) == 1 and packet_outs[0].packet.metadata


def test_the_tofino_hot_miss_digest_reaches_the_stats_driver(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = _runtime(tmp_path, TOFINO_P4INFO)
    schema = rt.client.schema
    decoded = fy.P4DigestList.decode(_digest_list(schema, 2, 0x1234_5678_9ABC, 11), schema)

    async def deliver() -> Any:
        stream = rt.stats.hot_misses()
        first = asyncio.ensure_future(anext(stream))
        await asyncio.sleep(0)
        for handler in rt.client._subs.digests[c.DIGEST_HOT_MISS_DIGEST_T]:  # noqa: SLF001
            handler(decoded)
        miss = await first
        await stream.aclose()
        return miss

    miss = asyncio.run(deliver())
    assert (miss.tenant, miss.key, miss.estimate) == (2, 0x1234_5678_9ABC, 11)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("KvcastIngress.port_role.port_role", "KvcastIngress.port_role.port_roles"),
        ('name: "hot_miss_digest_t"', 'name: "hot_digest_t"'),
        ("KvcastIngress.stats.drop_counter", "KvcastIngress.stats.drops"),
    ],
)
def test_a_tofino_p4info_without_a_name_the_daemon_needs_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, old: str, new: str
) -> None:
    text = TOFINO_P4INFO.read_text()
    assert old in text
    broken = tmp_path / "broken.p4info.txtpb"
    broken.write_text(text.replace(old, new))

    async def session(rt: SwitchRuntime) -> None:
        _connect(rt, monkeypatch)
        for driver in rt.client._drivers:  # noqa: SLF001
            await driver.reinstall(SessionInfo(generation=1, pipeline_pushed=True))
        await rt.stats.counters()

    with pytest.raises((ControlPlaneError, KeyError, ValueError)):
        asyncio.run(session(_runtime(tmp_path, broken)))


def test_the_example_config_of_docs_tofino_builds_a_runtime(tmp_path: Path) -> None:
    doc = (REPO / "docs" / "tofino.md").read_text()
    blocks = [b for b in re.findall(r"```yaml\n(.*?)```", doc, flags=re.S) if "tofino" in b]
    assert len(blocks) == 1, "docs/tofino.md: one controller config example"
    raw = yaml.safe_load(blocks[0])
    (switch,) = raw["switches"]
    assert (REPO / switch["p4info"]) == TOFINO_P4INFO
    # The compiler's .conf is a build output (build/tofino): a stand-in of the same layout.
    switch["p4info"] = str(TOFINO_P4INFO)
    switch["device_config"] = str(compiler_output(tmp_path))
    cfg = parse_config(raw)
    rt = SwitchRuntime(cfg.switches[0], cfg, ControllerMetrics())
    assert rt.spec.pipes == 2 and rt.spec.cpu_port == CPU_PORT
    assert rt.client.schema.tables[c.TABLE_INGRESS_CACHE_CACHE_TABLE].id
