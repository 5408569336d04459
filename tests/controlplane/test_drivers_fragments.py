"""FragmentLoader and EpochClock: exact WRITEs and entries, safe order, retries, adoption."""

from __future__ import annotations

from pathlib import Path

import pytest
from finsy.proto import p4r

from controlplane.allocator import SlotAllocator
from controlplane.drivers import CacheEntry, ChunkId, CpuEndpoint, EpochClock, FragmentLoader
from controlplane.drivers.fragments import EPOCH_ORIGIN_UNIX
from controlplane.errors import (
    ConfigError,
    EntryExistsError,
    FragmentLoadError,
    NotInstalledError,
    OutOfSlotsError,
    WriteAckTimeoutError,
)
from controlplane.p4rt import SwitchClient
from kvcast import p4constants as c
from kvcast import wire
from refswitch.pipeline import PACKET_OUT_LEN

from .test_p4rt_harness import (
    CPU,
    Expect,
    RefSwitch,
    config,
    refswitch_fixture,  # noqa: F401 - provides the refswitch fixture
    run,
)

T_CACHE = c.TABLE_INGRESS_CACHE_CACHE_TABLE
A_HIT = c.ACTION_INGRESS_CACHE_CACHE_HIT
F = c.FRAG_BYTES


def at_origin() -> float:
    """A wall clock at the epoch origin: the time floor is 0, epochs count 1, 2, 3..."""
    return float(EPOCH_ORIGIN_UNIX)


def loader_for(client: SwitchClient, **kw: object) -> FragmentLoader:
    loader = FragmentLoader(client, clock=EpochClock(time_fn=at_origin), **kw)  # type: ignore[arg-type]
    client.add_driver(loader)
    return loader


def write_frame(
    chunk: ChunkId, frag_idx: int, slot: int, epoch: int, data: bytes, req_id: int
) -> bytes:
    ep = CpuEndpoint()
    payload = wire.write_message(
        chunk.tenant, chunk.key, frag_idx, slot, epoch, data, req_id=req_id
    )
    port = c.KVP_UDP_PORT
    return wire.udp_frame(ep.src_mac, ep.dst_mac, ep.src_ip, ep.dst_ip, port, port, payload)


def check_writes(outs: list[bytes], chunk: ChunkId, base: int, epoch: int, data: bytes) -> None:
    """Every fragment was sent as exactly the WRITE frame the protocol defines, once."""
    seen: dict[int, bytes] = {}
    for frame in outs:
        hdr = wire.KvpHeader.unpack(frame, wire.FRAME_KVP_OFFSET)
        i = hdr.frag_idx
        assert i not in seen
        seen[i] = frame
        assert frame == write_frame(
            chunk, i, base + i, epoch, data[i * F : (i + 1) * F], hdr.req_id
        )
    assert sorted(seen) == list(range(-(-len(data) // F)))


def cache_insert(expect: Expect, chunk: ChunkId, base: int, count: int, epoch: int) -> p4r.Update:
    return expect.insert(
        T_CACHE,
        {"tenant": chunk.tenant, "key": chunk.key},
        A_HIT,
        {"slot_base": base, "frag_count": count, "epoch": epoch},
    )


def test_load_writes_every_fragment_then_inserts_the_entry(refswitch: RefSwitch) -> None:
    data = bytes(range(256)) * 2 + b"tail"  # 3 fragments, the last one short
    chunk = ChunkId(7, 0xFEED)

    async def main() -> CacheEntry:
        client = SwitchClient(config(refswitch))
        loader = loader_for(client)
        async with client:
            mark, log = refswitch.mark(), len(refswitch.log)
            entry = await loader.load(7, 0xFEED, data)
            assert refswitch.writes(mark) == [[cache_insert(Expect(refswitch), chunk, 0, 3, 1)]]
            ops = refswitch.log[log:]
            # Safe order: all three WRITEs before the insert.
            assert [isinstance(op, bytes) for op in ops] == [True, True, True, False]
            check_writes([op for op in ops if isinstance(op, bytes)], chunk, 0, 1, data)
            return entry

    assert run(main()) == CacheEntry(chunk, 0, 3, 1)


def test_loading_a_resident_chunk_again_writes_nothing(refswitch: RefSwitch) -> None:
    async def main() -> None:
        client = SwitchClient(config(refswitch))
        loader = loader_for(client)
        async with client:
            first = await loader.load(1, 1, b"x" * 300)
            mark, outs = refswitch.mark(), len(refswitch.packet_outs)
            assert await loader.load(1, 1, b"x" * 300) == first
            assert refswitch.mark() == mark and len(refswitch.packet_outs) == outs
            with pytest.raises(ConfigError, match="other bytes"):
                await loader.load(1, 1, b"y")

    run(main())


def test_replace_deletes_the_old_entry_before_rewriting_its_slots(refswitch: RefSwitch) -> None:
    old, new = ChunkId(1, 0xA), ChunkId(1, 0xB)
    new_data = b"N" * (F + 10)

    async def main() -> None:
        client = SwitchClient(config(refswitch))
        loader = loader_for(client)
        async with client:
            await loader.load(1, 0xA, b"O" * (3 * F))
            log = len(refswitch.log)
            entry = await loader.replace(old, 1, 0xB, new_data)
            assert entry == CacheEntry(new, 0, 2, 2)
            ops = refswitch.log[log:]
            expect = Expect(refswitch)
            first, *writes, last = ops
            assert isinstance(first, p4r.WriteRequest) and isinstance(last, p4r.WriteRequest)
            assert list(first.updates) == [
                expect.delete(T_CACHE, {"tenant": old.tenant, "key": old.key})
            ]
            check_writes([w for w in writes if isinstance(w, bytes)], new, 0, 2, new_data)
            assert len(writes) == 2
            assert list(last.updates) == [cache_insert(expect, new, 0, 2, 2)]
            # The new chunk took the first two slots; the third is free again.
            assert loader.allocator.free_ranges()[0].base == 2
            assert set(loader.resident()) == {new}

    run(main())


def test_evict_deletes_the_entry_and_frees_the_slots(refswitch: RefSwitch) -> None:
    async def main() -> None:
        client = SwitchClient(config(refswitch))
        loader = loader_for(client)
        async with client:
            await loader.load(3, 9, b"z" * 10)
            mark = refswitch.mark()
            await loader.evict(ChunkId(3, 9))
            assert refswitch.writes(mark) == [
                [Expect(refswitch).delete(T_CACHE, {"tenant": 3, "key": 9})]
            ]
            assert loader.allocator.used == 0
            with pytest.raises(NotInstalledError):
                await loader.evict(ChunkId(3, 9))

    run(main())


def test_an_unanswered_write_is_sent_again_with_a_new_req_id(refswitch: RefSwitch) -> None:
    dropped: list[bytes] = []

    def drop_first(frame: bytes) -> bool:
        if not dropped:
            dropped.append(frame)
            return True
        return False

    async def main() -> None:
        client = SwitchClient(config(refswitch))
        loader = loader_for(client, ack_timeout_s=0.05)
        async with client:
            outs = len(refswitch.packet_outs)
            refswitch.drop_packet_out = drop_first
            await loader.load(1, 2, b"retry me")
            sent = refswitch.packet_outs[outs:]
            assert len(sent) == 2
            a, b = (wire.KvpHeader.unpack(f, wire.FRAME_KVP_OFFSET) for f in sent)
            assert (a.index, a.epoch) == (b.index, b.epoch) and a.req_id != b.req_id
            assert len(refswitch.state.entries(T_CACHE)) == 1

    run(main())


def test_a_write_never_acknowledged_fails_the_load_and_frees_its_slots(
    refswitch: RefSwitch,
) -> None:
    async def main() -> None:
        client = SwitchClient(config(refswitch))
        loader = loader_for(client, ack_timeout_s=0.02, tries=3)
        async with client:
            mark, outs = refswitch.mark(), len(refswitch.packet_outs)
            refswitch.drop_packet_out = lambda _frame: True
            with pytest.raises(WriteAckTimeoutError, match="after 3 tries") as info:
                await loader.load(1, 2, b"lost")
            assert info.value.slot == 0
            assert len(refswitch.packet_outs) - outs == 3
            assert refswitch.writes(mark) == []  # no entry was inserted
            assert loader.allocator.used == 0 and loader.resident() == {}

    run(main())


def test_a_full_sram_refuses_the_load_before_writing(refswitch: RefSwitch) -> None:
    async def main() -> None:
        client = SwitchClient(config(refswitch))
        loader = loader_for(client, allocator=SlotAllocator(capacity=4, max_ranges=4))
        async with client:
            await loader.load(1, 1, bytes(2 * F))
            outs = len(refswitch.packet_outs)
            with pytest.raises(OutOfSlotsError):
                await loader.load(1, 2, bytes(3 * F))
            assert len(refswitch.packet_outs) == outs

    run(main())


def test_a_new_controller_adopts_the_entries_it_finds(refswitch: RefSwitch) -> None:
    async def main() -> None:
        first = SwitchClient(config(refswitch))
        old = loader_for(first)
        async with first:
            a = await old.load(1, 0xA, bytes(2 * F))
            b = await old.load(1, 0xB, bytes(F))
        second = SwitchClient(config(refswitch))
        # This controller's clock would start at 1 again: the read-back epochs must win.
        new = loader_for(second)
        async with second:
            assert new.resident() == {a.chunk: a, b.chunk: b}
            assert new.clock.last == b.epoch
            mark = refswitch.mark()
            c2 = await new.load(1, 0xC, b"c")
            assert c2.epoch > b.epoch and c2.slot_base == 3
            assert refswitch.writes(mark) == [
                [cache_insert(Expect(refswitch), c2.chunk, 3, 1, c2.epoch)]
            ]

    run(main())


def test_a_restart_loses_adopted_chunks_whose_bytes_are_unknown(refswitch: RefSwitch) -> None:
    lost: list[ChunkId] = []

    async def main() -> None:
        first = SwitchClient(config(refswitch))
        old = loader_for(first)
        async with first:
            await old.load(1, 0xA, b"adopted")
        second = SwitchClient(config(refswitch))
        new = loader_for(second, on_lost=lost.append)
        async with second:
            kept = await new.load(1, 0xB, b"known bytes")
            generation = second.generation
            refswitch.restart()
            await second.wait_synced(generation, timeout=10)
            assert set(new.resident()) == {kept.chunk}
            assert [e.action.params["slot_base"] for e in refswitch.state.entries(T_CACHE)] == [
                kept.slot_base
            ]

    run(main())
    assert lost == [ChunkId(1, 0xA)]


def test_cache_driver_refuses_a_second_insert_without_writing(refswitch: RefSwitch) -> None:
    async def main() -> None:
        client = SwitchClient(config(refswitch))
        loader = loader_for(client)
        async with client:
            entry = await loader.load(1, 1, b"a")
            mark = refswitch.mark()
            with pytest.raises(EntryExistsError):
                await loader.cache.insert(entry)
            assert refswitch.writes(mark) == []

    run(main())


# ------------------------------------------------------------------------------ EpochClock
def test_epochs_increase_and_never_fall_below_what_was_read_back() -> None:
    clock = EpochClock(time_fn=at_origin)
    assert [clock.next(), clock.next()] == [1, 2]
    clock.observe(100)
    assert clock.next() == 101
    clock.observe(5)
    assert clock.next() == 102


def test_the_time_floor_lifts_a_fresh_clock_above_an_earlier_controllers_epochs() -> None:
    now = [EPOCH_ORIGIN_UNIX + 1000.0]
    clock = EpochClock(time_fn=lambda: now[0])
    assert clock.next() == 1000
    assert clock.next() == 1001


def test_a_state_file_keeps_epochs_unique_across_restarts(tmp_path: Path) -> None:
    state = tmp_path / "epoch"
    first = EpochClock(time_fn=at_origin, state_file=state, block=10)
    issued = [first.next() for _ in range(25)]
    second = EpochClock(time_fn=at_origin, state_file=state, block=10)
    assert second.next() > max(issued)


def test_an_exhausted_epoch_field_is_an_error() -> None:
    clock = EpochClock(bits=2, time_fn=at_origin)
    assert [clock.next() for _ in range(3)] == [1, 2, 3]
    with pytest.raises(FragmentLoadError, match="2-bit"):
        clock.next()


def acks_from(refswitch: RefSwitch, ports: list[int]) -> None:
    """Makes every WRITE acknowledged once from each of ``ports``, as Tofino's pipes do."""

    def fan_out(payload: bytes) -> bool:
        header = (0).to_bytes(PACKET_OUT_LEN, "big")
        for out in refswitch.pipeline.process(CPU, header + payload):
            if out.port == CPU:
                for port in ports:
                    refswitch.state.emit_packet_in(out.frame, {"ingress_port": port})
        return True  # answered here; the harness does not run it again

    refswitch.drop_packet_out = fan_out


def test_with_fanout_ports_a_write_waits_for_every_pipe(refswitch: RefSwitch) -> None:
    async def main() -> None:
        client = SwitchClient(config(refswitch))
        loader = loader_for(client, ack_timeout_s=0.05, tries=2, ack_ports=[68, 196])
        async with client:
            acks_from(refswitch, [196, 68])
            await loader.load(1, 2, b"both pipes")
            assert len(refswitch.state.entries(T_CACHE)) == 1
            outs = len(refswitch.packet_outs)
            acks_from(refswitch, [68])  # pipe 1 never stores it
            with pytest.raises(WriteAckTimeoutError, match="after 2 tries"):
                await loader.load(1, 3, b"one pipe")
            assert len(refswitch.packet_outs) - outs == 2
            assert len(refswitch.state.entries(T_CACHE)) == 1

    run(main())


def test_fanout_ports_must_name_a_port() -> None:
    with pytest.raises(ConfigError, match="at least one fan-out port"):
        FragmentLoader(None, ack_ports=[])  # type: ignore[arg-type]
