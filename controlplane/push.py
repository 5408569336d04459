"""The push plan: which static prefixes go to which hosts ahead of demand, paced per tick.

A static prefix (``controlplane.kvclasses``) is reused by every branch of every task, so it is
worth landing in each engine host's local tier before the host asks: an instruction prefetch.
The plan decides it and the controller counts it. The push itself travels through the engines
(docs/design.md, "How a push travels": one request per engine for the prefix, in one multicast
group, so one pool read lands in every engine's prefix cache). The daemon plans static chunks
here and counts the plan; the prefixes it sends to the engines (``controlplane.pusher``) are
planned here too, as candidates of their own.

Rules, per tick and per switch (a switch's hosts are its multicast group):

* Candidates are the static chunks whose length the controller knows. A chunk's targets are the
  hosts of the switch that may ask for its tenant (a host's ``tenants``; None: any) and are not
  known to hold it: no record of theirs named it (they fetched, computed or were pushed it). A
  host that joins later has no such record, so the next plan includes it.
* Chunks go in prefix order (a block is useful only after its whole prefix): by position in
  the chain, then key. A chunk whose parent is a candidate still waiting is not planned before
  its parent.
* Pacing: the pool link carries ``budget_bytes`` per tick for pulls and pushes together; the
  tick's pulls (bytes hosts read from the pool) come off first, pushes get what is left. A
  multicast push costs one copy on the pool link whatever the number of targets
  (``PushOrder.pool_bytes``), the unicast pushes it replaces would cost one per target
  (``PushOrder.unicast_bytes``). The plan stops at the first chunk that does not fit, so the
  prefix order holds; a chunk larger than the whole budget can never go and is counted
  ``too_large`` (its descendants wait behind it).
* A planned (host, chunk) is remembered as delivered, so it is never planned twice.

Classes:
    PushCandidate: a static chunk that may be pushed.
    PushHost: a host that may receive pushes.
    PushOrder: one chunk to push, once, to some hosts.
    PushPlan: one tick's orders and what waits.
    PushPlanner: builds plans and remembers who holds what.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

__all__ = ["PushCandidate", "PushHost", "PushOrder", "PushPlan", "PushPlanner"]


@dataclass(frozen=True, slots=True)
class PushCandidate:
    """A static chunk the plan may push.

    Attributes:
        tenant: its tenant.
        key: chunk key.
        nbytes: its length.
        parent: the previous block of its chain, if known.
        position: its index in its chain (0 when unknown).
    """

    tenant: int
    key: int
    nbytes: int
    parent: int | None = None
    position: int = 0


@dataclass(frozen=True, slots=True)
class PushHost:
    """A host of the group.

    Attributes:
        name: its configured name.
        tenants: the tenants it may ask for (None: any).
    """

    name: str
    tenants: tuple[int, ...] | None = None

    def serves(self, tenant: int) -> bool:
        """Whether the host may hold a chunk of ``tenant``."""
        return self.tenants is None or tenant in self.tenants


@dataclass(frozen=True, slots=True)
class PushOrder:
    """Push one chunk once, multicast, to some hosts.

    Attributes:
        tenant: its tenant.
        key: chunk key.
        nbytes: its length.
        hosts: the hosts it goes to.
    """

    tenant: int
    key: int
    nbytes: int
    hosts: tuple[str, ...]

    @property
    def pool_bytes(self) -> int:
        """Bytes on the pool link: one copy, the switch replicates it."""
        return self.nbytes

    @property
    def unicast_bytes(self) -> int:
        """Bytes on the pool link if each host got its own copy."""
        return self.nbytes * len(self.hosts)


@dataclass(slots=True)
class PushPlan:
    """One tick's plan.

    Attributes:
        orders: the chunks to push now, in prefix order.
        budget_bytes: what pushes could use this tick (the budget less the tick's pulls).
        deferred: chunks with targets left for a later tick (budget spent, or behind a parent).
        too_large: chunks larger than the whole per-tick budget (never pushed).
    """

    orders: list[PushOrder] = field(default_factory=list)
    budget_bytes: int = 0
    deferred: int = 0
    too_large: int = 0

    @property
    def pool_bytes(self) -> int:
        """Pool-link bytes of the plan (one copy per order)."""
        return sum(o.pool_bytes for o in self.orders)

    @property
    def unicast_bytes(self) -> int:
        """Pool-link bytes the same deliveries would cost as unicasts."""
        return sum(o.unicast_bytes for o in self.orders)

    @property
    def deliveries(self) -> int:
        """Host copies the plan lands."""
        return sum(len(o.hosts) for o in self.orders)


class PushPlanner:
    """Plans pushes of static chunks to the hosts of one group, paced by a byte budget.

    Args:
        budget_bytes: pool-link bytes per tick for pulls and pushes together (> 0).
        max_keys: chunks whose holders are remembered (least recently noted forgotten first).

    Raises:
        ValueError: a budget or bound that is not positive.
    """

    def __init__(self, budget_bytes: int, max_keys: int = 1 << 20) -> None:
        if budget_bytes <= 0 or max_keys <= 0:
            raise ValueError(f"budget_bytes ({budget_bytes}) and max_keys must be positive")
        self.budget_bytes = budget_bytes
        self._max_keys = max_keys
        self._holders: collections.OrderedDict[int, set[str]] = collections.OrderedDict()

    def note_held(self, key: int, host: str) -> None:
        """Records that ``host`` holds ``key`` (a record of its named it, or it was pushed)."""
        holders = self._holders.get(key)
        if holders is None:
            holders = self._holders[key] = set()
            if len(self._holders) > self._max_keys:
                self._holders.popitem(last=False)
        else:
            self._holders.move_to_end(key)
        holders.add(host)

    def forget(self, key: int, host: str) -> None:
        """Records that ``host`` does not hold ``key`` after all (its push failed)."""
        holders = self._holders.get(key)
        if holders is not None:
            holders.discard(host)

    def holders(self, key: int) -> frozenset[str]:
        """The hosts known to hold ``key``."""
        return frozenset(self._holders.get(key, ()))

    def plan(
        self,
        candidates: Iterable[PushCandidate],
        hosts: Sequence[PushHost],
        *,
        pull_bytes: int = 0,
    ) -> PushPlan:
        """The pushes of this tick; what it plans is remembered as delivered.

        Args:
            candidates: the static chunks with a known length.
            hosts: the hosts of the group.
            pull_bytes: pool-link bytes this tick's pulls used (they come first).

        Returns:
            The plan.
        """
        plan = PushPlan(budget_bytes=max(0, self.budget_bytes - max(0, pull_bytes)))
        left = plan.budget_bytes
        waiting: set[int] = set()  # candidates with targets that are not planned this tick
        blocked = False
        for cand in sorted(candidates, key=lambda c: (c.position, c.key)):
            held = self._holders.get(cand.key, set())
            targets = tuple(
                sorted(h.name for h in hosts if h.serves(cand.tenant) and h.name not in held)
            )
            if not targets:
                continue
            if cand.nbytes > self.budget_bytes:
                plan.too_large += 1
                waiting.add(cand.key)
                continue
            if blocked or cand.parent in waiting or cand.nbytes > left:
                blocked = blocked or cand.nbytes > left
                plan.deferred += 1
                waiting.add(cand.key)
                continue
            left -= cand.nbytes
            plan.orders.append(PushOrder(cand.tenant, cand.key, cand.nbytes, targets))
            for name in targets:
                self.note_held(cand.key, name)
        return plan
