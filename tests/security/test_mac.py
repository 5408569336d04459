"""Keyed chunk MACs: the producer stores a MAC object next to each chunk, the agent checks it.

A MAC object is one MAC per ``SEGMENT_BYTES`` segment of the chunk (``kvcast.integrity``);
``tests/kvcast/test_fetch_progress.py`` checks that ``fetch_many`` hands a MAC tenant's chunk
on segment by segment, never past a segment that does not match.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from hostagent.chunkkeys import ChunkKeyer
from hostagent.fetch import FetchClient
from hostagent.layout import KVLayout
from hostagent.producer import Producer
from kvcast import p4constants as c
from kvcast.backend import InMemoryBackend
from kvcast.fetch import FetchReport, RecomputeReason
from kvcast.integrity import (
    MAC_BYTES,
    SEGMENT_BYTES,
    chunk_mac,
    load_tenant_keys,
    mac_count,
    mac_key_of,
    mac_object_bytes,
    segment_mac,
)
from poolnode.server import PoolServer

# Each test runs on the native data path and on the pure-Python one.
pytestmark = pytest.mark.usefixtures("data_path")

TENANT, KEY = 6, 0x6D6163
SECRET = bytes(range(32))
CHUNK = os.urandom(5 * c.FRAG_BYTES + 9)
TIMING: dict[str, Any] = {
    "timeout_s": 0.03,
    "max_timeout_s": 0.1,
    "max_retries": 2,
    "deadline_s": 5.0,
}


@pytest.fixture
def backend() -> InMemoryBackend:
    return InMemoryBackend()


@pytest.fixture
def server(backend: InMemoryBackend) -> Iterator[PoolServer]:
    with PoolServer(backend, "127.0.0.1", 0, cache_bytes=0) as srv:
        yield srv


def _fetch(server: PoolServer, keys: dict[int, bytes] | None) -> tuple[FetchReport, bytes]:
    out = torch.zeros(len(CHUNK), dtype=torch.uint8)
    with FetchClient(server.address, mac_keys=keys, **TIMING) as client:
        report = client.fetch(TENANT, KEY, out)
    return report, out.numpy().tobytes()


def test_a_chunk_with_its_mac_is_verified(backend: InMemoryBackend, server: PoolServer) -> None:
    backend.put(TENANT, KEY, CHUNK)
    backend.put(TENANT, mac_key_of(KEY), chunk_mac(SECRET, TENANT, KEY, CHUNK))
    report, got = _fetch(server, {TENANT: SECRET})
    assert report.ok and report.mac_verified
    assert got == CHUNK


def test_bytes_rewritten_with_a_valid_crc_fail_the_mac(
    backend: InMemoryBackend, server: PoolServer
) -> None:
    # Whoever rewrote the chunk (a pool node, a switch load) made every fragment CRC match.
    forged = bytes(len(CHUNK))
    backend.put(TENANT, KEY, forged)
    backend.put(TENANT, mac_key_of(KEY), chunk_mac(SECRET, TENANT, KEY, CHUNK))
    report, _ = _fetch(server, {TENANT: SECRET})
    assert not report.ok
    assert report.reason is RecomputeReason.MAC_MISMATCH
    # Counted as an attack; with no pool path nor pool client there is nothing to repair from.
    assert report.mac_failures == 1 and not report.mac_repaired
    # Without the key the forgery goes unnoticed: the MAC is what stops it.
    report, got = _fetch(server, None)
    assert report.ok and not report.mac_verified and got == forged


# ---------------------------------------------------------------------- repair after a failure
FORGED_FRAGS = (1, 3)


def _forged_chunk() -> bytes:
    """CHUNK with fragments FORGED_FRAGS rewritten (each still CRC-valid as served)."""
    out = bytearray(CHUNK)
    for i in FORGED_FRAGS:
        out[i * c.FRAG_BYTES : (i + 1) * c.FRAG_BYTES] = bytes(c.FRAG_BYTES)
    return bytes(out)


def _stores(chunk: bytes, mac: bytes | None = None) -> InMemoryBackend:
    b = InMemoryBackend()
    b.put(TENANT, KEY, chunk)
    b.put(TENANT, mac_key_of(KEY), mac or chunk_mac(SECRET, TENANT, KEY, CHUNK))
    return b


def _fetch_via(
    service: PoolServer, pool_addr: tuple[str, int] | None, direct: InMemoryBackend | None = None
) -> tuple[FetchReport, bytes]:
    out = torch.zeros(len(CHUNK), dtype=torch.uint8)
    keys = {TENANT: SECRET}
    with FetchClient(service.address, pool_addr, mac_keys=keys, direct=direct, **TIMING) as cl:
        report = cl.fetch(TENANT, KEY, out)
    return report, out.numpy().tobytes()


def test_forged_fragments_are_dropped_and_the_chunk_repaired_from_the_pool() -> None:
    # The service path (a bad switch load, a path that rewrites) serves two forged fragments
    # with valid CRCs; the pool holds the producer's bytes.
    with (
        PoolServer(_stores(_forged_chunk()), "127.0.0.1", 0, cache_bytes=0) as service,
        PoolServer(_stores(CHUNK), "127.0.0.1", 0, cache_bytes=0) as pool,
    ):
        report, got = _fetch_via(service, pool.address)
    assert report.ok and got == CHUNK
    assert report.mac_failures == 1 and report.mac_repaired and report.mac_verified
    assert report.forged_fragments == len(FORGED_FRAGS)
    assert report.path == "pool" and report.fell_back


def test_a_forged_mac_object_is_repaired_from_the_pool_too() -> None:
    forged_mac = chunk_mac(SECRET, TENANT, KEY, _forged_chunk())
    with (
        PoolServer(_stores(CHUNK, forged_mac), "127.0.0.1", 0, cache_bytes=0) as service,
        PoolServer(_stores(CHUNK), "127.0.0.1", 0, cache_bytes=0) as pool,
    ):
        report, got = _fetch_via(service, pool.address)
    assert report.ok and got == CHUNK
    assert report.mac_failures == 1 and report.mac_repaired
    assert report.forged_fragments == 0  # the bytes were true: only the MAC object was not


def test_the_pools_own_client_repairs_when_it_is_given() -> None:
    with PoolServer(_stores(_forged_chunk()), "127.0.0.1", 0, cache_bytes=0) as service:
        report, got = _fetch_via(service, None, direct=_stores(CHUNK))
    assert report.ok and got == CHUNK and report.path == "direct"
    # Once the service (a pool node here) has answered one GET, the pool's own client reads the
    # chunk; whether the DATA with the forged fragments was taken before that depends on how the
    # answers are batched. If it was, the MAC failed and the client's read repaired the chunk;
    # if not, its read replaced them first. Either way no forged byte is kept.
    if report.forged_fragments:
        assert report.forged_fragments == len(FORGED_FRAGS)
        assert report.mac_failures == 1 and report.mac_repaired
    else:
        assert report.mac_failures == 0 and report.mac_verified


def test_a_repair_that_does_not_match_either_ends_in_recompute() -> None:
    with (
        PoolServer(_stores(_forged_chunk()), "127.0.0.1", 0, cache_bytes=0) as service,
        PoolServer(_stores(_forged_chunk()), "127.0.0.1", 0, cache_bytes=0) as pool,
    ):
        report, got = _fetch_via(service, pool.address)
    assert not report.ok and report.reason is RecomputeReason.MAC_MISMATCH
    assert report.mac_failures == 1 and not report.mac_repaired and not report.mac_verified


def test_a_valid_chunk_replayed_under_another_key_fails(
    backend: InMemoryBackend, server: PoolServer
) -> None:
    other = KEY + 1
    backend.put(TENANT, KEY, CHUNK)
    backend.put(TENANT, mac_key_of(KEY), chunk_mac(SECRET, TENANT, other, CHUNK))
    report, _ = _fetch(server, {TENANT: SECRET})
    assert report.reason is RecomputeReason.MAC_MISMATCH


def test_a_chunk_without_its_mac_is_not_trusted(
    backend: InMemoryBackend, server: PoolServer
) -> None:
    backend.put(TENANT, KEY, CHUNK)
    report, _ = _fetch(server, {TENANT: SECRET})
    assert not report.ok
    assert report.reason is RecomputeReason.MAC_MISSING


def test_the_producer_stores_a_mac_next_to_each_chunk(backend: InMemoryBackend) -> None:
    layout = KVLayout(2, 2, 8, torch.float32, block_size=4)
    keyer = ChunkKeyer(4, "0")
    prompt = list(range(8))
    gen = torch.Generator().manual_seed(1)
    shape = (layout.num_kv_heads, len(prompt), layout.head_dim)
    ks = [torch.randn(shape, generator=gen) for _ in range(layout.num_layers)]
    vs = [torch.randn(shape, generator=gen) for _ in range(layout.num_layers)]
    producer = Producer(backend, layout, keyer, TENANT, host="h1", mac_key=SECRET)
    report = producer.publish_kv(prompt, ks, vs)
    assert report.stored == 2
    for ck in keyer.keys(prompt):
        data = backend.get(TENANT, ck.key)
        assert data is not None
        assert backend.get(TENANT, mac_key_of(ck.key)) == chunk_mac(SECRET, TENANT, ck.key, data)
        assert len(chunk_mac(SECRET, TENANT, ck.key, data)) == mac_object_bytes(len(data))


def test_a_mac_object_is_one_mac_per_segment_naming_its_place() -> None:
    data = os.urandom(2 * SEGMENT_BYTES + 100)
    obj = chunk_mac(SECRET, TENANT, KEY, data)
    assert mac_count(len(data)) == 3 and len(obj) == 3 * MAC_BYTES
    segments = [data[i * SEGMENT_BYTES : (i + 1) * SEGMENT_BYTES] for i in range(3)]
    for i, seg in enumerate(segments):
        assert obj[i * MAC_BYTES : (i + 1) * MAC_BYTES] == segment_mac(
            SECRET, TENANT, KEY, i, 3, seg
        )
    # The same bytes in another place, in a chunk of another length, or under another name
    # have other MACs: segments cannot be moved, dropped or replayed.
    assert segment_mac(SECRET, TENANT, KEY, 1, 3, segments[0]) != obj[:MAC_BYTES]
    assert chunk_mac(SECRET, TENANT, KEY, data[: 2 * SEGMENT_BYTES])[:MAC_BYTES] != obj[:MAC_BYTES]
    assert chunk_mac(SECRET, TENANT, KEY + 1, data) != obj
    assert mac_count(0) == 1 and len(chunk_mac(SECRET, TENANT, KEY, b"")) == MAC_BYTES


def test_tenant_key_files_are_parsed_and_checked(tmp_path: Path) -> None:
    good = tmp_path / "keys"
    good.write_text("# tenant:key\n6:" + SECRET.hex() + "\n\n0x7: 0102\n")
    assert load_tenant_keys(good) == {6: SECRET, 7: b"\x01\x02"}
    bad = tmp_path / "bad"
    bad.write_text("70000:00\n")
    with pytest.raises(ValueError, match="bad:1"):
        load_tenant_keys(bad)
