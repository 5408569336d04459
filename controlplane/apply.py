"""The controller's apply step: a policy's decision turned into switch writes.

Evictions first: an evicted chunk's entry is deleted and its slots freed; a DEMOTE also makes
sure the DRAM pool still holds the chunk (``ChunkSource.ensure``), and is logged and counted
either way. Then every chunk the policy holds resident but the switch does not is loaded (bytes
read from the DRAM pool, WRITEs in the safe order), skipping what does not fit now (it is tried
again next tick) and, for a while (``max(30 s, 10 ticks)``, or until a host fetches it again),
what the pool no longer has. A chunk on the switch that the policy does not hold is evicted.

Classes:
    DecisionApplier: applies one switch's decision each tick and says in the tick's summary
        what it loaded, unloaded and skipped.
"""

from __future__ import annotations

import logging
from typing import Any

from controlplane.chunksource import ChunkNotFoundError, ChunkUnavailableError
from controlplane.drivers import ChunkId
from controlplane.errors import (
    AllocationError,
    ConfigError,
    ControlPlaneError,
    FragmentLoadError,
    NotInstalledError,
    SwitchError,
)
from controlplane.policies import Decision, EvictAction
from controlplane.runtime import HitAccount, SwitchRuntime, TickStep, TickSummary
from kvcast.kvp import frag_count

__all__ = ["DecisionApplier"]

_LOG = logging.getLogger("controlplane.daemon")


class _StopApplying(Exception):  # noqa: N818 - internal control flow
    """The switch failed a write: stop applying this tick, retry next tick."""


class DecisionApplier(TickStep):
    """Applies a policy's decision to its switch: evictions, then loads.

    Args: those of :class:`~controlplane.runtime.TickStep`. A chunk the pool did not have is
    not read again for ``max(30 s, 10 ticks)`` (or until a host fetches it).
    """

    def _absent_backoff_s(self) -> float:
        return max(30.0, 10 * self._config.tick_s)

    async def apply(
        self, rt: SwitchRuntime, decision: Decision, now: float, summary: TickSummary
    ) -> None:
        """Applies ``decision`` to ``rt``'s switch, stopping at the first failed write.

        ``summary.applied`` says whether it went through; a failed write counts one error and
        leaves the rest for the next tick.

        Args:
            rt: the switch.
            decision: the policy's decision this tick.
            now: the tick's time.
            summary: the tick's summary of the switch.
        """
        try:
            await self._apply(rt, decision, now, summary)
            summary.applied = True
        except _StopApplying:
            summary.errors += 1

    async def _apply(
        self, rt: SwitchRuntime, decision: Decision, now: float, summary: TickSummary
    ) -> None:
        loaded = rt.loader.resident()
        by_key = {chunk.key: chunk for chunk in loaded}
        for ev in decision.evict:
            chunk = by_key.get(ev.key)
            if chunk is not None:
                await self._unload(rt, chunk, ev.action, ev.residual, summary)
        wanted = rt.policy.resident_keys()
        for chunk in list(rt.loader.resident()):
            if chunk.key not in wanted:
                await self._unload(rt, chunk, EvictAction.DROP, 0.0, summary)
        loaded_keys = {chunk.key for chunk in rt.loader.resident()}
        order = [a.key for a in decision.admit]
        order += sorted(wanted - set(order))
        budget = self._config.max_loads_per_tick
        for key in order:
            if key in loaded_keys or key not in wanted:
                continue
            if budget == 0:
                self._skip(rt, summary, "deferred")
                continue
            if rt.absent.get(key, now) > now:
                continue  # the pool did not have it lately
            budget -= 1
            await self._load(rt, key, now, summary)

    def _skip(self, rt: SwitchRuntime, summary: TickSummary, reason: str) -> None:
        summary.skipped[reason] = summary.skipped.get(reason, 0) + 1
        self._metrics.load_skipped.labels(rt.name, reason).inc()

    async def _unload(
        self,
        rt: SwitchRuntime,
        chunk: ChunkId,
        action: EvictAction,
        residual: float,
        summary: TickSummary,
    ) -> None:
        try:
            await rt.loader.evict(chunk)
        except NotInstalledError:
            return
        except ControlPlaneError as exc:
            self._metrics.write_errors.labels(rt.name).inc()
            _LOG.warning(
                "eviction failed: %s", exc, extra={"event": "evict_error", "switch": rt.name}
            )
            raise _StopApplying from exc
        data = rt.data.pop(chunk, None)
        rt.hits.pop(chunk, None)
        rt.adopted.discard(chunk)
        summary.unloaded[action.value] = summary.unloaded.get(action.value, 0) + 1
        self._metrics.evictions.labels(rt.name, action.value).inc()
        self._metrics.class_evictions.labels(rt.name, rt.count_class(chunk.key, "evictions")).inc()
        record: dict[str, Any] = {
            "event": "evict",
            "switch": rt.name,
            "chunk": str(chunk),
            "action": action.value,
            "residual": round(residual, 4),
        }
        if action is EvictAction.DEMOTE:
            try:
                record["written_back"] = await self._source.ensure(chunk.tenant, chunk.key, data)
                record["in_pool"] = True
            except ChunkUnavailableError as exc:
                record["in_pool"] = False
                record["error"] = str(exc)
                self._metrics.demotions_unreturned.labels(rt.name).inc()
            rt.demoted.append(record)
        _LOG.info("chunk evicted", extra=record)

    async def _load(self, rt: SwitchRuntime, key: int, now: float, summary: TickSummary) -> None:
        """Loads one chunk the policy holds resident, or says in ``summary`` why not."""
        info = self._keys.get(key)
        if info is None:
            self._skip(rt, summary, "unknown_key")
            return
        tenant = info.tenant
        frags = frag_count(info.nbytes) if info.nbytes is not None else None
        stats = rt.loader.allocator.stats()
        if stats.ranges >= stats.max_ranges or (frags is not None and stats.largest_free < frags):
            self._skip(rt, summary, "no_fit")
            return
        try:
            data = await self._source.read(tenant, key, info.nbytes)
        except ChunkNotFoundError as exc:
            self._skip(rt, summary, "not_in_pool")
            rt.absent[key] = now + self._absent_backoff_s()
            _LOG.info(
                "chunk not in the pool; not tried again for %.0f s: %s",
                self._absent_backoff_s(),
                exc,
                extra={"event": "load", "switch": rt.name, "key": f"{key:#x}"},
            )
            return
        except ChunkUnavailableError as exc:
            self._skip(rt, summary, "pool_unavailable")
            _LOG.info("chunk not read: %s", exc, extra={"event": "load", "switch": rt.name})
            if info.nbytes is not None and "another length" in str(exc):
                info.nbytes = None  # probed again next time
            return
        info.nbytes = len(data)
        try:
            entry = await rt.loader.load(tenant, key, data)
        except AllocationError:
            self._skip(rt, summary, "no_fit")
            return
        except (FragmentLoadError, SwitchError) as exc:
            self._metrics.write_errors.labels(rt.name).inc()
            _LOG.warning("load failed: %s", exc, extra={"event": "load_error", "switch": rt.name})
            raise _StopApplying from exc
        except ConfigError as exc:  # resident with other bytes, or too many fragments
            self._skip(rt, summary, "rejected")
            _LOG.warning("load refused: %s", exc, extra={"event": "load", "switch": rt.name})
            return
        rt.data[entry.chunk] = data
        rt.hits[entry.chunk] = HitAccount(entry.epoch)
        summary.loaded += 1
        self._metrics.loads.labels(rt.name).inc()
        self._metrics.load_bytes.labels(rt.name).inc(len(data))
        name = rt.count_class(key, "load_bytes", len(data))
        self._metrics.class_load_bytes.labels(rt.name, name).inc(len(data))
        _LOG.debug(
            "chunk loaded",
            extra={
                "event": "load",
                "switch": rt.name,
                "chunk": str(entry.chunk),
                "slot_base": entry.slot_base,
                "frag_count": entry.frag_count,
                "epoch": entry.epoch,
            },
        )
