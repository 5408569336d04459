"""Driver of the FragmentStore control: loads chunks into switch SRAM in the safe order.

BMv2's P4Runtime server cannot write registers, so fragments reach the switch as KVP WRITE
packets sent through P4Runtime PacketOut into the CPU port; the switch stores each one and
answers with a WRITE_ACK PacketIn (docs/protocol.md, "Controller packet I/O"). A load of a slot
range always follows the safe order of docs/protocol.md:

1. delete the cache entry that names the range, if any (GETs for it now miss to the pool);
2. WRITE every fragment with a new epoch and wait for each one's WRITE_ACK (matched by req_id,
   slot and epoch; an unanswered WRITE is sent again, WRITEs being idempotent; after the last
   try the load fails with :class:`~controlplane.errors.WriteAckTimeoutError`);
3. insert the entry for the new chunk with the new epoch.

A GET racing the load is then served the old chunk (before 1), sent to the pool (between 1
and 3), served the new chunk under the new key (after 3), or dropped as BAD_EPOCH if it read a
rewritten slot through a stale entry: never the new bytes under the old key.

Epochs come from an :class:`EpochClock`: strictly increasing for every load, so per slot range
too, and never below an epoch read back from the switch or below the clock's time floor, so a
restarted controller does not reuse the epochs of entries still installed; with a state file it
never reuses any epoch at all.

Classes:
    EpochClock: epochs for loads (monotonic, time floor, read-back, optional state file).
    CpuEndpoint: the addresses WRITE frames carry (the switch only checks the CPU port).
    FragmentLoader: load / replace / evict chunks; re-installs cache entries and reloads SRAM
        after a reconnect or a switch restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import finsy as fy

from controlplane.allocator import SlotAllocator, SlotRange
from controlplane.drivers.cache_table import ACTION_HIT, CacheEntry, CacheTableDriver, ChunkId
from controlplane.errors import (
    AllocationError,
    ConfigError,
    ControlPlaneError,
    FragmentLoadError,
    NotInstalledError,
    WriteAckTimeoutError,
)
from controlplane.p4rt import SessionInfo, SwitchClient
from kvcast import p4constants as c
from kvcast.kvp import frag_count
from kvcast.wire import FRAME_KVP_OFFSET, KvpHeader, WireError, udp_frame, write_message

_LOG = logging.getLogger(__name__)

EPOCH_ORIGIN_UNIX = 1_704_067_200
"""2024-01-01T00:00:00Z: the time floor counts seconds from here (32 bits last until 2160)."""


class EpochClock:
    """Epochs for loads: each :meth:`next` is larger than every epoch seen or issued before.

    Three sources bound an epoch from below, so that a restarted controller never reuses the
    epoch of an entry still installed:

    * the last epoch issued, plus one;
    * every epoch read back from the switch (:meth:`observe`);
    * the time floor: whole seconds since :data:`EPOCH_ORIGIN_UNIX`. A controller issuing
      fewer than one epoch per second on average never reaches it, so its successor starts
      above everything it issued even without reading anything back.

    With ``state_file``, the clock also persists a high-water mark ahead of what it issues (in
    blocks, so the file is written once per ``block`` epochs) and starts above it: no epoch is
    ever issued twice, at any load rate.

    Args:
        bits: width of the epoch field (the cache_hit action's ``epoch`` parameter).
        time_fn: wall clock in seconds (injectable for tests).
        state_file: where to persist the high-water mark, or None.
        block: epochs reserved per write of the state file.

    Raises:
        ConfigError: the state file exists but does not hold an integer.
    """

    def __init__(
        self,
        bits: int = 32,
        time_fn: Callable[[], float] = time.time,
        state_file: Path | None = None,
        block: int = 1024,
    ) -> None:
        self._max = (1 << bits) - 1
        self._time_fn = time_fn
        self._state_file = state_file
        self._block = block
        self._last = 0
        self._reserved = 0
        if state_file is not None and state_file.exists():
            try:
                self._last = self._reserved = int(state_file.read_text().strip() or 0)
            except ValueError as exc:
                raise ConfigError(f"epoch state file {state_file} is not an integer") from exc

    @property
    def last(self) -> int:
        """The largest epoch issued or observed (0 before any)."""
        return self._last

    def observe(self, epoch: int) -> None:
        """Notes an epoch read back from the switch: later epochs will be larger."""
        self._last = max(self._last, epoch)

    def next(self) -> int:
        """A new epoch, larger than every epoch issued or observed before.

        Raises:
            FragmentLoadError: the epoch field is exhausted.
        """
        floor = int(self._time_fn()) - EPOCH_ORIGIN_UNIX
        epoch = max(self._last + 1, floor)
        if epoch > self._max:
            raise FragmentLoadError(
                f"epoch {epoch} exceeds the {self._max.bit_length()}-bit epoch field"
            )
        self._last = epoch
        if self._state_file is not None and epoch > self._reserved:
            self._reserved = min(epoch + self._block, self._max)
            tmp = self._state_file.with_suffix(".tmp")
            tmp.write_text(f"{self._reserved}\n")
            os.replace(tmp, self._state_file)
        return epoch


@dataclass(frozen=True)
class CpuEndpoint:
    """Addresses of the WRITE frames the controller injects.

    The switch accepts a WRITE because it comes from the CPU port, whatever its addresses; they
    only have to form a valid Ethernet/IPv4/UDP frame to the KVP port.
    """

    src_mac: str = "02:00:00:00:00:fe"
    dst_mac: str = "02:00:00:00:00:ff"
    src_ip: str = "169.254.0.1"
    dst_ip: str = "169.254.0.2"


@dataclass
class _Resident:
    entry: CacheEntry
    data: bytes | None  # None: adopted from the switch, bytes unknown
    stale: bool = False  # the switch lost its slots: reload before inserting the entry


class FragmentLoader:
    """Loads chunks into fragment slots with WRITE PacketOuts, in the safe order.

    Owns the cache table (through a :class:`CacheTableDriver`), the slot allocator and the
    epoch clock of one switch. Register it with the client (``client.add_driver(loader)``) and
    not its cache driver: after a reconnect it reconciles the cache table; after a switch
    restart (pipeline pushed: SRAM empty) it reloads every chunk it has the bytes of into the
    same slots with new epochs; on its first session it adopts the entries a previous
    controller left on the switch (bytes unknown: served while the switch keeps them, dropped
    with ``on_lost`` when it restarts).

    Args:
        client: the switch.
        cache: its cache table driver (created if not given).
        allocator: its slot allocator (all ``NUM_FRAG_SLOTS`` slots if not given).
        clock: its epoch clock (created with the P4Info's epoch width if not given).
        endpoint: addresses of the WRITE frames.
        ack_timeout_s: how long to wait for each WRITE_ACK before sending the WRITE again.
        tries: WRITEs sent per fragment before the load fails.
        window: WRITEs in flight at once.
        on_lost: called with each chunk the switch lost and that cannot be reloaded.
        ack_ports: on a switch with several pipes (Tofino), the WRITE fan-out ports: a WRITE
            is stored by each pipe, which acknowledges it from its fan-out port (the PacketIn's
            ``ingress_port``), and counts as written once every one of them has. None: one
            acknowledgement (BMv2, the reference target).
    """

    def __init__(
        self,
        client: SwitchClient,
        cache: CacheTableDriver | None = None,
        allocator: SlotAllocator | None = None,
        clock: EpochClock | None = None,
        *,
        endpoint: CpuEndpoint | None = None,
        ack_timeout_s: float = 0.5,
        tries: int = 4,
        window: int = 32,
        on_lost: Callable[[ChunkId], None] | None = None,
        ack_ports: Iterable[int] | None = None,
    ) -> None:
        if tries < 1 or window < 1 or ack_timeout_s <= 0:
            raise ConfigError("tries and window must be >= 1 and ack_timeout_s > 0")
        self._ack_ports = None if ack_ports is None else frozenset(ack_ports)
        if self._ack_ports is not None and not self._ack_ports:
            raise ConfigError("ack_ports, when given, names at least one fan-out port")
        self._client = client
        self._cache = cache or CacheTableDriver(client)
        self._alloc = allocator or SlotAllocator()
        epoch_bits = client.schema.actions[ACTION_HIT].params["epoch"].bitwidth
        self._clock = clock or EpochClock(bits=epoch_bits)
        self._endpoint = endpoint or CpuEndpoint()
        self._ack_timeout_s = ack_timeout_s
        self._tries = tries
        self._window = window
        self._on_lost = on_lost
        self._resident: dict[ChunkId, _Resident] = {}
        # req_id -> (slot, epoch, fan-out ports not yet heard from, done)
        self._waiting: dict[int, tuple[int, int, set[int], asyncio.Future[None]]] = {}
        self._req_id = 0
        self._lock = asyncio.Lock()
        self._synced = False
        self._dirty = False
        self._packet_out_md = {
            md.name: 0 for md in client.schema.controller_packet_metadata["packet_out"].metadata
        }
        client.on_packet_in(self._on_packet_in)

    # ------------------------------------------------------------------ state
    @property
    def cache(self) -> CacheTableDriver:
        """The cache table driver."""
        return self._cache

    @property
    def allocator(self) -> SlotAllocator:
        """The slot allocator."""
        return self._alloc

    @property
    def clock(self) -> EpochClock:
        """The epoch clock."""
        return self._clock

    def resident(self) -> dict[ChunkId, CacheEntry]:
        """The chunks loaded (entry installed, or to be reinstalled after a reconnect)."""
        return {chunk: r.entry for chunk, r in self._resident.items()}

    def entry(self, chunk: ChunkId) -> CacheEntry | None:
        """A chunk's entry, if it is resident."""
        r = self._resident.get(chunk)
        return r.entry if r is not None else None

    # ------------------------------------------------------------------ operations
    async def load(self, tenant: int, key: int, data: bytes) -> CacheEntry:
        """Loads a chunk into newly allocated slots: WRITE each fragment, then insert its entry.

        Loading a chunk that is resident with the same bytes returns its entry.

        Args:
            tenant: the chunk's tenant.
            key: the chunk's key.
            data: the chunk's bytes (split into FRAG_BYTES fragments).

        Returns:
            The installed entry.

        Raises:
            ConfigError: empty data, too many fragments, or the chunk is resident with other
                bytes.
            AllocationError: no slot range (or cache entry) is free: evict first.
            WriteAckTimeoutError: a fragment was never acknowledged (slots released).
            SwitchError: a write failed (slots released).
        """
        chunk = ChunkId(tenant, key)
        count = self._frag_count(data)
        async with self._lock:
            await self._clean_if_dirty()
            current = self._resident.get(chunk)
            if current is not None:
                if current.data not in (None, data):
                    raise ConfigError(f"chunk {chunk} is resident with other bytes; evict it")
                return current.entry
            slots = self._alloc.allocate(count)
            return await self._load_into(chunk, data, slots)

    async def replace(self, old: ChunkId, tenant: int, key: int, data: bytes) -> CacheEntry:
        """Reloads the slots of ``old`` with another chunk (eviction and load in one).

        The new chunk takes the first slots of the old one's range when it fits there (the
        rest is freed), else a new range after the old one is freed. The safe order holds:
        the old entry is deleted before any slot is rewritten.

        Args:
            old: the resident chunk to evict.
            tenant: the new chunk's tenant.
            key: the new chunk's key.
            data: the new chunk's bytes.

        Returns:
            The new chunk's entry.

        Raises:
            NotInstalledError: ``old`` is not resident.
            ConfigError: bad data, or the new chunk is resident already.
            AllocationError: the new chunk fits nowhere (the old one is evicted all the same).
            WriteAckTimeoutError: a fragment was never acknowledged (slots released).
            SwitchError: a write failed.
        """
        chunk = ChunkId(tenant, key)
        count = self._frag_count(data)
        async with self._lock:
            await self._clean_if_dirty()
            gone = self._resident.get(old)
            if gone is None:
                raise NotInstalledError(f"chunk {old} is not resident")
            if chunk in self._resident:
                raise ConfigError(f"chunk {chunk} is resident already")
            await self._delete_entry(old)
            del self._resident[old]
            slots = gone.entry.slots
            self._alloc.free_range(slots)
            if count <= slots.count:
                slots = self._alloc.reserve(slots.base, count)
            else:
                slots = self._alloc.allocate(count)
            return await self._load_into(chunk, data, slots)

    async def evict(self, chunk: ChunkId) -> None:
        """Deletes a chunk's entry and frees its slots (their bytes stay, unreachable).

        Raises:
            NotInstalledError: the chunk is not resident.
            SwitchError: the delete failed (the chunk stays resident).
        """
        async with self._lock:
            await self._clean_if_dirty()
            r = self._resident.get(chunk)
            if r is None:
                raise NotInstalledError(f"chunk {chunk} is not resident")
            await self._delete_entry(chunk)
            del self._resident[chunk]
            self._alloc.free_range(r.entry.slots)

    async def reinstall(self, session: SessionInfo) -> None:
        """Re-installs the cache table and, after a switch restart, reloads SRAM.

        Args:
            session: the new session.

        Raises:
            SwitchError: a read or write failed (the next session tries again).
            WriteAckTimeoutError: a reload was not acknowledged.
        """
        async with self._lock:
            if session.pipeline_pushed:
                # A new program: every table and register of the switch is empty.
                self._cache.forget_all()
                for r in self._resident.values():
                    r.stale = True
            elif not self._synced:
                await self._adopt()
            else:
                await self._cache.reconcile()
            self._synced = True
            self._dirty = False
            for chunk, r in list(self._resident.items()):
                if r.stale:
                    await self._reload(chunk, r)

    # ------------------------------------------------------------------ internals
    @staticmethod
    def _frag_count(data: bytes) -> int:
        if not data:
            raise ConfigError("a chunk needs at least one byte")
        count = frag_count(len(data))
        if count >= 1 << 16:
            raise ConfigError(f"{count} fragments exceed the 16-bit frag_count")
        return count

    async def _clean_if_dirty(self) -> None:
        # A write whose outcome is unknown may have left an entry the mirror does not know.
        if self._dirty:
            await self._cache.reconcile()
            self._dirty = False

    async def _delete_entry(self, chunk: ChunkId) -> None:
        if self._cache.entry(chunk) is None:
            return  # stale: the switch lost the entry already
        try:
            await self._cache.delete(chunk)
        except ControlPlaneError:
            self._dirty = True
            raise

    async def _load_into(self, chunk: ChunkId, data: bytes, slots: SlotRange) -> CacheEntry:
        """Steps 2 and 3 of the safe order into ``slots`` (allocated, no entry names them)."""
        try:
            epoch = self._clock.next()
            await self._write_fragments(chunk, data, slots.base, epoch)
            entry = CacheEntry(chunk, slots.base, slots.count, epoch)
            try:
                await self._cache.insert(entry)
            except ControlPlaneError:
                self._dirty = True
                raise
        except BaseException:
            self._alloc.free_range(slots)
            raise
        self._resident[chunk] = _Resident(entry, data)
        return entry

    async def _reload(self, chunk: ChunkId, r: _Resident) -> None:
        if r.data is None:
            _LOG.warning("%s: chunk %s lost with the switch's SRAM", self._client.name, chunk)
            del self._resident[chunk]
            self._alloc.free_range(r.entry.slots)
            if self._on_lost is not None:
                self._on_lost(chunk)
            return
        epoch = self._clock.next()
        await self._write_fragments(chunk, r.data, r.entry.slot_base, epoch)
        entry = CacheEntry(chunk, r.entry.slot_base, r.entry.frag_count, epoch)
        await self._cache.insert(entry)
        r.entry, r.stale = entry, False

    async def _adopt(self) -> None:
        """Takes over the entries a previous controller left on the switch."""
        orphans: list[CacheEntry] = []
        for entry in await self._cache.read_installed():
            self._clock.observe(entry.epoch)
            if entry.chunk in self._resident:
                continue
            try:
                self._alloc.reserve(entry.slot_base, entry.frag_count)
            except AllocationError as exc:
                _LOG.warning("%s: dropping cache entry %s: %s", self._client.name, entry, exc)
                orphans.append(entry)
                continue
            self._resident[entry.chunk] = _Resident(entry, None)
        self._cache.adopt(self._resident[ch].entry for ch in self._resident)
        self._cache.adopt(orphans)
        for entry in orphans:
            await self._cache.delete(entry.chunk)

    async def _write_fragments(self, chunk: ChunkId, data: bytes, base: int, epoch: int) -> None:
        frag = c.FRAG_BYTES
        count = -(-len(data) // frag)
        gate = asyncio.Semaphore(self._window)

        async def one(i: int) -> None:
            async with gate:
                await self._write_one(chunk, i, base + i, epoch, data[i * frag : (i + 1) * frag])

        tasks = [asyncio.ensure_future(one(i)) for i in range(count)]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def _write_one(
        self, chunk: ChunkId, frag_idx: int, slot: int, epoch: int, fragment: bytes
    ) -> None:
        loop = asyncio.get_running_loop()
        req_id = 0
        for _ in range(self._tries):
            self._req_id = (self._req_id + 1) & 0xFFFFFFFF
            req_id = self._req_id
            done: asyncio.Future[None] = loop.create_future()
            self._waiting[req_id] = (slot, epoch, set(self._ack_ports or ()), done)
            payload = write_message(
                chunk.tenant, chunk.key, frag_idx, slot, epoch, fragment, req_id=req_id
            )
            ep = self._endpoint
            port = c.KVP_UDP_PORT
            frame = udp_frame(ep.src_mac, ep.dst_mac, ep.src_ip, ep.dst_ip, port, port, payload)
            try:
                await self._client.packet_out(frame, **self._packet_out_md)
                await asyncio.wait_for(done, self._ack_timeout_s)
                return
            except TimeoutError:
                _LOG.info("%s: WRITE slot %d req %d unanswered", self._client.name, slot, req_id)
            finally:
                self._waiting.pop(req_id, None)
        raise WriteAckTimeoutError(
            self._client.name, slot, req_id, self._tries, self._ack_timeout_s
        )

    def _on_packet_in(self, packet: fy.P4PacketIn) -> None:
        try:
            hdr = KvpHeader.unpack(packet.payload, FRAME_KVP_OFFSET)
        except WireError:
            return
        if hdr.op != c.KVP_OP_WRITE_ACK:
            return
        waiting = self._waiting.get(hdr.req_id)
        if waiting is None:
            return  # a late ack of a WRITE already retried or given up
        slot, epoch, pending, done = waiting
        if hdr.index != slot or hdr.epoch != epoch:
            _LOG.warning(
                "%s: WRITE_ACK req %d for slot %d epoch %d, expected slot %d epoch %d",
                self._client.name,
                hdr.req_id,
                hdr.index,
                hdr.epoch,
                slot,
                epoch,
            )
            return
        if pending:
            port = packet.metadata.get("ingress_port")
            pending.discard(port if isinstance(port, int) else -1)
            if pending:
                return  # another pipe has not stored it yet
        if not done.done():
            done.set_result(None)
