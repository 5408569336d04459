"""Driver of the CacheLookup control: cache_table entries and their direct hit counters.

A cache entry maps (tenant, chunk key) to the slot range holding the chunk's fragments and the
epoch those fragments must carry (p4src/v1model/include/control/cache.p4). This driver only
writes and reads entries; *when* an entry may be inserted or deleted (the safe reload order)
is the :class:`~controlplane.drivers.fragments.FragmentLoader`'s business, which owns one of
these and re-installs it after a reconnect.

Classes:
    ChunkId: (tenant, key), the name of a chunk.
    CacheEntry: one cache_table entry.
    CacheTableDriver: insert / modify / delete entries, read them back, read hit counters.

Functions:
    read_hit_counts: the direct hit counters of every entry (the stats driver reads them too).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import finsy as fy

from controlplane.allocator import SlotRange
from controlplane.drivers.base import EntrySpec, MatchKey, ReconcileResult, TableMirror
from controlplane.errors import EntryExistsError, NotInstalledError
from controlplane.p4rt import SwitchClient
from kvcast import p4constants as c

TABLE = c.TABLE_INGRESS_CACHE_CACHE_TABLE
ACTION_HIT = c.ACTION_INGRESS_CACHE_CACHE_HIT
DIRECT_COUNTER = c.DIRECT_COUNTER_INGRESS_CACHE_CACHE_COUNTER


@dataclass(frozen=True, order=True, slots=True)
class ChunkId:
    """The name of a chunk: its tenant and 64-bit key."""

    tenant: int
    key: int

    def __str__(self) -> str:
        return f"{self.tenant}:{self.key:#x}"


@dataclass(frozen=True, slots=True)
class CacheEntry:
    """One cache_table entry: where a chunk's fragments are and which load wrote them.

    Attributes:
        chunk: the chunk.
        slot_base: its first fragment slot.
        frag_count: its number of fragments (= slots).
        epoch: the epoch every one of its slots must hold.
    """

    chunk: ChunkId
    slot_base: int
    frag_count: int
    epoch: int

    @property
    def slots(self) -> SlotRange:
        """The slot range."""
        return SlotRange(self.slot_base, self.frag_count)

    def spec(self) -> EntrySpec:
        """The entry by P4Info names."""
        return EntrySpec.of(
            _match(self.chunk),
            ACTION_HIT,
            {"slot_base": self.slot_base, "frag_count": self.frag_count, "epoch": self.epoch},
        )

    @classmethod
    def from_spec(cls, spec: EntrySpec) -> CacheEntry:
        """The entry a cache_table spec describes."""
        m = dict(spec.match)
        p = dict(spec.params)
        return cls(
            ChunkId(int(m["tenant"]), int(m["key"])),  # type: ignore[arg-type]
            p["slot_base"],
            p["frag_count"],
            p["epoch"],
        )


def _match(chunk: ChunkId) -> dict[str, int | tuple[int, int]]:
    return {"tenant": chunk.tenant, "key": chunk.key}


def _key(chunk: ChunkId) -> MatchKey:
    return EntrySpec.of(_match(chunk), ACTION_HIT).match


class CacheTableDriver:
    """cache_table: one entry per cached chunk, with a direct hit counter.

    Args:
        client: the switch.
    """

    def __init__(self, client: SwitchClient) -> None:
        self._client = client
        self._mirror = TableMirror(client, TABLE)

    def entry(self, chunk: ChunkId) -> CacheEntry | None:
        """The installed entry of a chunk, if any."""
        spec = self._mirror.get(_key(chunk))
        return CacheEntry.from_spec(spec) if spec is not None else None

    def entries(self) -> list[CacheEntry]:
        """Every installed entry."""
        return [CacheEntry.from_spec(s) for s in self._mirror.specs()]

    async def insert(self, entry: CacheEntry) -> None:
        """Inserts an entry (its slots must already hold its fragments with its epoch).

        Raises:
            EntryExistsError: the chunk has an entry already (delete it first).
            SwitchError: the write failed.
        """
        if _key(entry.chunk) in self._mirror:
            raise EntryExistsError(
                self._client.name,
                f"cache entry for chunk {entry.chunk} exists; delete it first",
                "ALREADY_EXISTS",
            )
        await self._mirror.apply(puts=[entry.spec()])

    async def modify(self, entry: CacheEntry) -> None:
        """Changes an installed entry's slot range or epoch.

        Raises:
            NotInstalledError: the chunk has no entry.
            SwitchError: the write failed.
        """
        if _key(entry.chunk) not in self._mirror:
            raise NotInstalledError(f"no cache entry for chunk {entry.chunk}")
        await self._mirror.apply(puts=[entry.spec()])

    async def delete(self, chunk: ChunkId) -> None:
        """Deletes a chunk's entry: GETs for it miss from now on.

        Raises:
            NotInstalledError: the chunk has no entry.
            SwitchError: the write failed.
        """
        if _key(chunk) not in self._mirror:
            raise NotInstalledError(f"no cache entry for chunk {chunk}")
        await self._mirror.apply(removes=[_key(chunk)])

    async def read_installed(self) -> list[CacheEntry]:
        """Reads the entries the switch holds now (whoever installed them).

        Raises:
            SwitchError: the read failed.
        """
        return [CacheEntry.from_spec(s) for s in (await self._mirror.read_installed()).values()]

    async def hit_counts(self) -> dict[ChunkId, int]:
        """Reads every entry's direct counter: GETs served per cached chunk.

        Raises:
            SwitchError: the read failed.
        """
        return await read_hit_counts(self._client)

    async def reconcile(self) -> ReconcileResult:
        """Makes the switch's cache_table hold exactly the entries this driver installed.

        Raises:
            SwitchError: a read or write failed.
        """
        return await self._mirror.reconcile()

    def adopt(self, entries: Iterable[CacheEntry]) -> None:
        """Records entries read back from the switch as installed (writes nothing)."""
        self._mirror.adopt(e.spec() for e in entries)

    def forget(self, chunk: ChunkId) -> None:
        """Forgets a chunk's entry without writing (the switch lost it)."""
        self._mirror.forget(_key(chunk))

    def forget_all(self) -> None:
        """Forgets every entry without writing (the switch lost its tables)."""
        self._mirror.forget_all()


async def read_hit_counts(client: SwitchClient) -> dict[ChunkId, int]:
    """Reads the cache table's direct counters: GETs served per cached chunk.

    Args:
        client: the switch.

    Returns:
        Packets counted per cached chunk.

    Raises:
        SwitchError: the read failed.
    """
    out: dict[ChunkId, int] = {}
    for ent in await client.read([fy.P4DirectCounterEntry(DIRECT_COUNTER)]):
        if ent.table_entry is None or not ent.table_entry.match:
            continue
        m = ent.table_entry.match
        out[ChunkId(int(m["tenant"]), int(m["key"]))] = ent.packet_count
    return out
