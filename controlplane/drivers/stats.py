"""Driver of the Stats control and of hot-miss digests: what the switch counted and reported.

Drops are counted by reason in ``drop_counter`` (ingress and egress each have one), KVP events
in ``kvp_event_counter``, hits per cached chunk in the cache table's direct counter, and keys
that missed often in one sketch window arrive as ``hot_miss_digest_t`` digests
(docs/protocol.md, "Drops" and "Misses and the pool owner"). Reason and event names come from
the generated constants (``DROP_*``, ``EV_*``), never typed again here.

Classes:
    HotMiss: one hot-miss report (tenant, key, estimated misses this window).
    SwitchCounters: a snapshot of drops and events by name.
    StatsDriver: counter reads, cache hit counters, and the hot-miss stream as an async
        iterator.

Functions:
    drop_reasons, kvp_events: index -> name maps from the generated constants.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator
from dataclasses import dataclass

import finsy as fy

from controlplane.drivers.cache_table import ChunkId, read_hit_counts
from controlplane.errors import ConfigError, EntryExistsError
from controlplane.p4rt import SessionInfo, SwitchClient
from kvcast import p4constants as c

_LOG = logging.getLogger(__name__)

DIGEST = c.DIGEST_HOT_MISS_DIGEST_T
IG_DROPS = c.COUNTER_INGRESS_STATS_DROP_COUNTER
EG_DROPS = c.COUNTER_EGRESS_STATS_DROP_COUNTER
IG_EVENTS = c.COUNTER_INGRESS_STATS_KVP_EVENT_COUNTER
EG_EVENTS = c.COUNTER_EGRESS_STATS_KVP_EVENT_COUNTER
# The TNA program's own (docs/tofino.md): a Tofino counter runs once per pass, so the hot-key
# event of a GET miss is counted here rather than in kvp_event_counter; egress counts no events.
HOT_DIGESTS = "KvcastIngress.stats.hot_digest_counter"


def _names(prefix: str, count_name: str) -> dict[int, str]:
    return {
        int(getattr(c, n)): n[len(prefix) :].lower()
        for n in dir(c)
        if n.startswith(prefix) and n != count_name
    }


def drop_reasons() -> dict[int, str]:
    """drop_counter index -> reason name ("malformed", "bad_epoch", ...)."""
    return _names("DROP_", "DROP_REASON_COUNT")


def kvp_events() -> dict[int, str]:
    """kvp_event_counter index -> event name ("get_hit", "get_miss", ...)."""
    return _names("EV_", "EV_COUNT")


@dataclass(frozen=True, slots=True)
class HotMiss:
    """A key the switch's sketch reports as hot and uncached.

    Attributes:
        tenant: the chunk's tenant.
        key: the chunk's key.
        estimate: its estimated misses in the current window (min of the sketch rows, at or
            above the threshold).
    """

    tenant: int
    key: int
    estimate: int

    @property
    def chunk(self) -> ChunkId:
        """The chunk."""
        return ChunkId(self.tenant, self.key)


@dataclass(frozen=True)
class SwitchCounters:
    """Drops and events, by name, summed over ingress and egress.

    Attributes:
        drops: reason name -> packets dropped.
        events: event name -> packets.
    """

    drops: dict[str, int]
    events: dict[str, int]


class StatsDriver:
    """Counters and the hot-miss digest stream of one switch.

    Args:
        client: the switch.
        max_list_size: digests the switch may batch into one DigestList.
        max_timeout_ns: how long it may hold a batch (0: send each at once).
        ack_timeout_ns: how long it suppresses a repeat of an unacknowledged digest.
        queue_size: hot misses buffered per iterator before the oldest are dropped.
    """

    def __init__(
        self,
        client: SwitchClient,
        *,
        max_list_size: int = 1,
        max_timeout_ns: int = 0,
        ack_timeout_ns: int = 1_000_000_000,
        queue_size: int = 4096,
    ) -> None:
        if queue_size < 1:
            raise ConfigError("queue_size must be >= 1")
        self._client = client
        self._digest_config = (max_list_size, max_timeout_ns, ack_timeout_ns)
        self._queue_size = queue_size
        self._queues: list[asyncio.Queue[HotMiss]] = []
        self._received = 0
        self._dropped = 0
        self._reasons = drop_reasons()
        self._events = kvp_events()
        client.on_digest(DIGEST, self._on_digest)

    @property
    def hot_misses_received(self) -> int:
        """Hot-miss reports received since creation."""
        return self._received

    @property
    def hot_misses_dropped(self) -> int:
        """Reports dropped because an iterator's queue was full."""
        return self._dropped

    async def counters(self) -> SwitchCounters:
        """Reads drops and events of ingress and egress, summed per name.

        Raises:
            SwitchError: the read failed.
        """
        drops = dict.fromkeys(self._reasons.values(), 0)
        events = dict.fromkeys(self._events.values(), 0)
        schema = self._client.schema
        # Those the program has: the TNA program has no egress event counter and a counter of
        # its own for hot digests (EV_HOT_DIGEST).
        present = {ctr.name for ctr in schema.counters}
        wanted = (IG_DROPS, EG_DROPS, IG_EVENTS, EG_EVENTS, HOT_DIGESTS)
        read = [fy.P4CounterEntry(n) for n in wanted if n in present]
        drop_names = {schema.counters[n].name for n in (IG_DROPS, EG_DROPS)}
        for ent in await self._client.read(read):
            if ent.index is None:
                continue
            counter = schema.counters[ent.counter_id].name
            if counter in drop_names:
                name = self._reasons.get(ent.index)
                if name is not None:
                    drops[name] += ent.packet_count
            else:
                index = c.EV_HOT_DIGEST if counter == HOT_DIGESTS else ent.index
                name = self._events.get(index)
                if name is not None:
                    events[name] += ent.packet_count
        return SwitchCounters(drops, events)

    async def cache_hits(self) -> dict[ChunkId, int]:
        """Reads the cache table's direct counters: GETs served per cached chunk.

        Raises:
            SwitchError: the read failed.
        """
        return await read_hit_counts(self._client)

    async def hot_misses(self) -> AsyncGenerator[HotMiss, None]:
        """Yields every hot-miss report from now on (each iterator gets every report).

        Reports are buffered per iterator (``queue_size``); when one is full its oldest report
        is dropped and counted in :attr:`hot_misses_dropped`.
        """
        queue: asyncio.Queue[HotMiss] = asyncio.Queue(self._queue_size)
        self._queues.append(queue)
        try:
            while True:
                yield await queue.get()
        finally:
            self._queues.remove(queue)

    async def reinstall(self, session: SessionInfo) -> None:
        """Configures hot-miss digest delivery (switches send none until configured).

        Raises:
            SwitchError: the write failed.
        """
        size, timeout, ack = self._digest_config
        entry = fy.P4DigestEntry(
            DIGEST, max_list_size=size, max_timeout_ns=timeout, ack_timeout_ns=ack
        )
        try:
            await self._client.write([+entry])
        except EntryExistsError:
            await self._client.write(
                [
                    ~fy.P4DigestEntry(
                        DIGEST, max_list_size=size, max_timeout_ns=timeout, ack_timeout_ns=ack
                    )
                ]
            )

    def _on_digest(self, digest_list: fy.P4DigestList) -> None:
        for item in digest_list.data:
            miss = HotMiss(int(item["tenant"]), int(item["key"]), int(item["estimate"]))
            self._received += 1
            for queue in self._queues:
                if queue.full():
                    with contextlib.suppress(asyncio.QueueEmpty):
                        queue.get_nowait()
                    self._dropped += 1
                queue.put_nowait(miss)
