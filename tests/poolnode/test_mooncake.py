"""Mooncake Store backend and the mooncake_master process manager (real master, loopback)."""

from __future__ import annotations

import os
import socket
import stat
import time
from pathlib import Path

import pytest
import torch

from hostagent.fetch import FetchClient
from kvcast import p4constants as c
from kvcast.backend import PoolBackendError
from kvcast.fetch import RecomputeReason
from kvcast.kvclass import KvClass
from kvcast.mooncake import MooncakeBackend, MooncakeUnavailableError
from poolnode import mooncake
from poolnode.mooncake import MasterStartError, MooncakeMaster
from poolnode.server import PoolServer
from tests.poolnode.conftest import needs_mooncake


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@needs_mooncake
def test_master_listens_on_loopback_and_stop_leaves_no_process() -> None:
    master = MooncakeMaster().start()
    pid = master.pid
    assert pid is not None
    with socket.create_connection(("127.0.0.1", master.rpc_port), timeout=1):
        pass
    master.stop()
    assert not _alive(pid)
    assert not master.running()


@needs_mooncake
def test_master_context_manager_stops_it_when_the_body_raises() -> None:
    pids = []
    with pytest.raises(RuntimeError, match="boom"), MooncakeMaster() as master:
        pids.append(master.pid)
        raise RuntimeError("boom")
    assert pids[0] is not None
    assert not _alive(pids[0])


def test_master_that_exits_at_once_raises_with_its_log_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    fake = tmp_path / "mooncake_master"
    fake.write_text("#!/bin/sh\necho 'flag parse failure' >&2\nexit 3\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    master = MooncakeMaster(binary=str(fake), start_timeout_s=5)
    with pytest.raises(MasterStartError, match="flag parse failure"):
        master.start()
    assert not master.running()
    log = master.log_path
    master.stop()  # the failed start kept its log for the user; stop() removes it
    assert not os.path.exists(log)


def test_master_that_never_listens_is_killed_after_the_timeout(tmp_path: Path) -> None:
    fake = tmp_path / "mooncake_master"
    fake.write_text("#!/bin/sh\nexec sleep 30\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    master = MooncakeMaster(binary=str(fake), rpc_port=_free_port(), start_timeout_s=0.3)
    with pytest.raises(MasterStartError, match="did not listen"):
        master.start()
    assert not master.running()
    master.stop()


def test_stop_is_safe_before_start_and_twice(tmp_path: Path) -> None:
    fake = tmp_path / "mooncake_master"
    fake.write_text("#!/bin/sh\nexit 0\n")
    master = MooncakeMaster(binary=str(fake))
    master.stop()
    master.stop()
    assert not master.running()


def test_missing_master_binary_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mooncake, "find_master_binary", lambda: None)
    with pytest.raises(MooncakeUnavailableError, match="mooncake-transfer-engine-non-cuda"):
        MooncakeMaster()


@needs_mooncake
def test_backend_fails_fast_when_no_master_listens() -> None:
    with pytest.raises(PoolBackendError, match="not reachable"):
        MooncakeBackend(f"127.0.0.1:{_free_port()}")


@needs_mooncake
def test_chunk_larger_than_the_client_staging_buffer_round_trips(
    mooncake_backend: MooncakeBackend,
) -> None:
    data = os.urandom(20 << 20)  # the fixture's client has a 16 MiB staging buffer
    mooncake_backend.put(9, 0xB16, data)
    try:
        assert mooncake_backend.get(9, 0xB16) == data
    finally:
        mooncake_backend.delete(9, 0xB16)


@needs_mooncake
def test_objects_are_named_by_prefix_tenant_and_key(mooncake_backend: MooncakeBackend) -> None:
    assert mooncake_backend.name(0x12, 0xABC) == "kvcast/0012/0000000000000abc"


@needs_mooncake
def test_second_client_reads_what_the_first_stored(
    mooncake_master: MooncakeMaster, mooncake_backend: MooncakeBackend
) -> None:
    mooncake_backend.put(9, 0x5EC, b"shared pool")
    other = MooncakeBackend(mooncake_master.address, global_segment_size=0)
    try:
        assert other.get(9, 0x5EC) == b"shared pool"
    finally:
        other.close()


@needs_mooncake
def test_pool_server_serves_a_chunk_stored_in_mooncake(
    mooncake_backend: MooncakeBackend,
) -> None:
    data = os.urandom(40 * c.FRAG_BYTES + 3)
    mooncake_backend.put(9, 0xF00D, data)
    out = torch.zeros(len(data), dtype=torch.uint8)
    with (
        PoolServer(mooncake_backend, "127.0.0.1", 0) as server,
        FetchClient(server.address, timeout_s=0.2, max_timeout_s=0.5) as client,
    ):
        report = client.fetch(9, 0xF00D, out)
        reads = server.stats.backend_reads
        missing = client.fetch(9, 0xF00E, torch.zeros(10, dtype=torch.uint8))
    assert report.ok
    assert out.numpy().tobytes() == data
    assert reads == 1
    assert missing.reason is RecomputeReason.NOT_FOUND


@needs_mooncake
def test_static_chunks_are_soft_pinned_and_outlive_transient_ones_under_pressure() -> None:
    mib = 1 << 20
    with MooncakeMaster() as master:
        store = MooncakeBackend(master.address, global_segment_size=16 * mib)
        try:
            assert "soft_pin_action: ENABLE" in str(store.static_config)
            for k in range(4):
                store.put(1, 0x100 + k, bytes([k]) * mib, kv_class=KvClass.STATIC)
                store.put(1, 0x200 + k, bytes([k]) * mib)  # as old, but transient
            for k in range(40):  # 40 MiB more through a 16 MiB segment
                for _ in range(50):
                    try:
                        store.put(1, 0x300 + k, bytes([k]) * mib)
                        break
                    except PoolBackendError:  # full until the master's eviction runs
                        time.sleep(0.05)
            assert all(store.contains(1, 0x100 + k) for k in range(4))
            assert not any(store.contains(1, 0x200 + k) for k in range(4))
            assert store.get(1, 0x102) == bytes([2]) * mib
        finally:
            store.close()


@needs_mooncake
def test_a_static_put_of_a_chunk_held_as_transient_is_upserted_with_the_pin(
    mooncake_backend: MooncakeBackend,
) -> None:
    key = 0x5717_0000 | os.getpid()
    mooncake_backend.put(3, key, b"same bytes")
    mooncake_backend.put(3, key, b"same bytes", kv_class=KvClass.STATIC)  # no "already exists"
    assert mooncake_backend.get(3, key) == b"same bytes"
