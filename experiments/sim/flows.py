"""Event-driven flow-level network: links, fluid flows and max-min fair rates.

A :class:`Link` has a capacity in its own units per second (bytes/s for a NIC, packets/s for a
switch pipeline). A :class:`Flow` moves ``size`` payload bytes at one rate over a set of links;
for each link it has a *coefficient*, the link units one payload byte costs there (wire bytes
per payload byte with headers, packets per payload byte on a packet-rate link). A multicast
stream is a single flow over the union of its tree's links: the pool link appears once in its
path, each receiver's link once per receiver, and the flow runs at the rate of its slowest
branch (single-rate reliable multicast).

Rates are max-min fair with those coefficients: progressive filling raises every unfrozen
flow's rate equally until some link is full (the link whose remaining capacity over the sum of
its unfrozen flows' coefficients is smallest), freezes the flows that cross it, and repeats.
Whenever the set of flows changes (a flow starts, ends, gains a receiver or is split) only the
connected component of flows and links around the change is solved again, so independent parts
of a big cluster cost nothing. Between changes rates are constant, so the next event is the
earliest completion: :class:`FlowNetwork` keeps them in a heap with lazy invalidation.

Classes:
    FlowError: an invalid link or flow (non-positive capacity or size, empty path).
    Link: one capacity shared by the flows crossing it, with byte accounting.
    Flow: one fluid transfer (unicast or a multicast tree) and its state.
    FlowNetwork: the simulator: start, extend and split flows, advance time, fire callbacks.

Functions:
    max_min_rates: the max-min fair rates of a static set of flows (a pure helper).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

__all__ = ["Flow", "FlowError", "FlowNetwork", "Link", "max_min_rates"]

_REL_TOL = 1e-12
"""Relative tolerance for treating two event times as the same instant."""


class FlowError(ValueError):
    """A link or flow that the model cannot represent (message says which and why)."""


class Link:
    """A shared capacity.

    Args:
        name: a label for reports.
        capacity: units per second (> 0, finite).

    Attributes:
        name: the label.
        capacity: units per second.
        flows: the active flows crossing the link, each with its coefficient.
        committed: units the link will carry for every flow that crossed it so far (coefficient
            x bytes, counted when a flow starts or gains the link).
        moved: units actually carried so far (integrated rate x coefficient).

    Raises:
        FlowError: for a non-positive or infinite capacity.
    """

    __slots__ = ("_mark", "_n", "_rem", "_w", "capacity", "committed", "flows", "moved", "name")

    def __init__(self, name: str, capacity: float) -> None:
        if not capacity > 0 or math.isinf(capacity):
            raise FlowError(f"link {name!r}: capacity must be positive and finite, got {capacity}")
        self.name = name
        self.capacity = float(capacity)
        self.flows: dict[Flow, float] = {}
        self.committed = 0.0
        self.moved = 0.0
        self._rem = 0.0
        self._w = 0.0
        self._n = 0
        self._mark = 0

    def load(self) -> float:
        """Units per second the link carries now (sum of coefficient x rate)."""
        return sum(c * f.rate for f, c in self.flows.items())

    def __repr__(self) -> str:
        return f"Link({self.name!r}, {self.capacity:g}, flows={len(self.flows)})"


class Flow:
    """One fluid transfer.

    Attributes:
        fid: sequence number (start order).
        size: payload bytes the flow was started with (plus bytes moved in by splits: never).
        remaining: payload bytes left at time ``t0``.
        rate: payload bytes per second since ``t0``.
        t0: when ``remaining`` was last brought up to date.
        path: link -> coefficient (link units per payload byte).
        done: whether the flow has completed.
        finish: completion time (NaN until done).
        on_done: called as ``on_done(flow, time)`` when the flow completes.
        data: free slot for the owner (the cluster model keeps its bookkeeping here).
    """

    __slots__ = (
        "_frozen",
        "_mark",
        "data",
        "done",
        "fid",
        "finish",
        "on_done",
        "path",
        "rate",
        "remaining",
        "size",
        "t0",
        "version",
    )

    def __init__(
        self,
        fid: int,
        size: float,
        path: dict[Link, float],
        now: float,
        on_done: Callable[[Flow, float], None] | None,
        data: Any,
    ) -> None:
        self.fid = fid
        self.size = size
        self.remaining = size
        self.rate = 0.0
        self.t0 = now
        self.path = path
        self.done = False
        self.finish = math.nan
        self.on_done = on_done
        self.data = data
        self.version = 0
        self._frozen = 0
        self._mark = 0

    def __repr__(self) -> str:
        return (
            f"Flow(#{self.fid}, size={self.size:g}, remaining={self.remaining:g}, "
            f"rate={self.rate:g}, links={[link.name for link in self.path]})"
        )


def _check_path(path: dict[Link, float]) -> None:
    if not path:
        raise FlowError("a flow needs at least one link")
    for link, coef in path.items():
        if not coef > 0 or math.isinf(coef):
            raise FlowError(f"coefficient on {link.name!r} must be positive and finite: {coef}")


class FlowNetwork:
    """The event-driven fluid network.

    Typical loop: start flows at ``now``; ``t = next_time()``; ``advance(t)`` completes the
    flows that end at ``t`` and calls their ``on_done``; callbacks may start new flows. To
    interleave external events (request arrivals), call ``advance(t_event)`` first: it
    completes everything that ends up to ``t_event`` and leaves ``now == t_event``.

    Attributes:
        now: simulated time in seconds.
        solves: component re-solves so far (a cost counter).
        completions: flows completed so far.
        active: flows not yet completed.
    """

    def __init__(self) -> None:
        self.now = 0.0
        self.solves = 0
        self.completions = 0
        self.active: dict[Flow, None] = {}
        self._links: dict[str, Link] = {}
        self._heap: list[tuple[float, int, int, Flow]] = []
        self._seq = 0
        self._fid = 0
        self._stamp = 0
        self._dirty_flows: dict[Flow, None] = {}
        self._dirty_links: dict[Link, None] = {}
        self._reschedule: dict[Flow, None] = {}

    # ------------------------------------------------------------------ topology
    def link(self, name: str, capacity: float) -> Link:
        """Create (or return the existing) link named ``name``.

        Args:
            name: unique label.
            capacity: units per second.

        Returns:
            The link.

        Raises:
            FlowError: for a bad capacity, or a name reused with another capacity.
        """
        link = self._links.get(name)
        if link is None:
            link = Link(name, capacity)
            self._links[name] = link
        elif link.capacity != capacity:
            raise FlowError(f"link {name!r} exists with capacity {link.capacity}, not {capacity}")
        return link

    @property
    def links(self) -> list[Link]:
        """Every link created, in creation order."""
        return list(self._links.values())

    # ------------------------------------------------------------------ flows
    def start(
        self,
        size: float,
        path: Iterable[tuple[Link, float]],
        on_done: Callable[[Flow, float], None] | None = None,
        data: Any = None,
    ) -> Flow:
        """Start a flow at ``now``.

        Args:
            size: payload bytes (> 0).
            path: (link, coefficient) pairs; a link given twice adds its coefficients.
            on_done: completion callback ``(flow, time)``.
            data: owner's bookkeeping.

        Returns:
            The flow (its rate is set at the next :meth:`next_time` or :meth:`advance`).

        Raises:
            FlowError: for a non-positive size, an empty path or a bad coefficient.
        """
        if not size > 0 or math.isinf(size):
            raise FlowError(f"flow size must be positive and finite, got {size}")
        merged: dict[Link, float] = {}
        for link, coef in path:
            merged[link] = merged.get(link, 0.0) + coef
        _check_path(merged)
        self._fid += 1
        flow = Flow(self._fid, float(size), merged, self.now, on_done, data)
        for link, coef in merged.items():
            link.flows[flow] = coef
            link.committed += coef * size
        self.active[flow] = None
        self._dirty_flows[flow] = None
        return flow

    def current_remaining(self, flow: Flow) -> float:
        """Payload bytes the flow still has to move at ``now``."""
        if flow.done:
            return 0.0
        return max(0.0, flow.remaining - flow.rate * (self.now - flow.t0))

    def extend(self, flow: Flow, path: Iterable[tuple[Link, float]]) -> None:
        """Add links to an active flow (a receiver joins a multicast stream).

        Links already in the flow's path are left as they are: a second receiver on the same
        link (the same host) costs that link nothing more.

        Args:
            flow: an active flow.
            path: (link, coefficient) pairs to add.

        Raises:
            FlowError: if the flow has completed or a coefficient is bad.
        """
        if flow.done:
            raise FlowError(f"cannot extend completed flow #{flow.fid}")
        self._sync(flow)
        added = {link: coef for link, coef in path if link not in flow.path}
        if not added:
            return
        for link, coef in added.items():
            if not coef > 0 or math.isinf(coef):
                raise FlowError(f"coefficient on {link.name!r} must be positive: {coef}")
            flow.path[link] = coef
            link.flows[flow] = coef
            link.committed += coef * flow.remaining
        self._dirty_flows[flow] = None

    def split(
        self,
        flow: Flow,
        nbytes: float,
        on_done: Callable[[Flow, float], None] | None = None,
        data: Any = None,
    ) -> Flow:
        """Move ``nbytes`` of an active flow's remaining bytes into a new flow on the same path.

        Both flows then run side by side (max-min gives them equal rates while their paths
        are equal); committed link bytes do not change.

        Args:
            flow: an active flow.
            nbytes: bytes to move, 0 < nbytes < remaining.
            on_done: the new flow's callback.
            data: the new flow's bookkeeping.

        Returns:
            The new flow.

        Raises:
            FlowError: if the flow completed or ``nbytes`` is out of range.
        """
        if flow.done:
            raise FlowError(f"cannot split completed flow #{flow.fid}")
        self._sync(flow)
        if not 0 < nbytes < flow.remaining:
            raise FlowError(f"split of {nbytes} bytes from a flow with {flow.remaining} left")
        flow.remaining -= nbytes
        flow.size -= nbytes
        self._reschedule[flow] = None
        self._fid += 1
        new = Flow(self._fid, float(nbytes), dict(flow.path), self.now, on_done, data)
        for link, coef in new.path.items():
            link.flows[new] = coef
        self.active[new] = None
        self._dirty_flows[flow] = None
        self._dirty_flows[new] = None
        return new

    # ------------------------------------------------------------------ time
    def next_time(self) -> float:
        """The earliest completion time (``inf`` when no flow is active)."""
        self._resolve()
        return self._peek()

    def advance(self, until: float) -> int:
        """Complete every flow that ends at or before ``until`` and move ``now`` there.

        Callbacks run after all flows ending at the same instant were removed; flows they
        start begin at that instant.

        Args:
            until: target time (``inf``: run until no flow is left).

        Returns:
            Number of flows completed.
        """
        if until < self.now:
            raise FlowError(f"cannot go back in time from {self.now} to {until}")
        n = 0
        while True:
            self._resolve()
            t = self._peek()
            if t > until or math.isinf(t):
                break
            tol = _REL_TOL * max(1.0, abs(t))
            self.now = max(self.now, t)
            finished: list[Flow] = []
            while self._heap and self._heap[0][0] <= t + tol:
                _, _, version, flow = heapq.heappop(self._heap)
                if flow.done or version != flow.version:
                    continue
                self._finish(flow)
                finished.append(flow)
            n += len(finished)
            for flow in finished:
                if flow.on_done is not None:
                    flow.on_done(flow, self.now)
        if not math.isinf(until):
            self.now = max(self.now, until)
        return n

    # ------------------------------------------------------------------ internals
    def _sync(self, flow: Flow) -> None:
        """Bring ``flow.remaining`` up to ``now`` (rate unchanged), accounting moved bytes."""
        dt = self.now - flow.t0
        if dt > 0 and flow.rate > 0:
            moved = min(flow.rate * dt, flow.remaining)
            flow.remaining -= moved
            for link, coef in flow.path.items():
                link.moved += coef * moved
        flow.t0 = self.now

    def _finish(self, flow: Flow) -> None:
        self._sync(flow)
        if flow.remaining > 0:
            for link, coef in flow.path.items():
                link.moved += coef * flow.remaining
            flow.remaining = 0.0
        flow.done = True
        flow.finish = self.now
        flow.rate = 0.0
        for link in flow.path:
            del link.flows[flow]
            self._dirty_links[link] = None
        del self.active[flow]
        self._dirty_flows.pop(flow, None)
        self.completions += 1

    def _peek(self) -> float:
        heap = self._heap
        while heap:
            _, _, version, flow = heap[0]
            if flow.done or version != flow.version:
                heapq.heappop(heap)
                continue
            return heap[0][0]
        return math.inf

    def _resolve(self) -> None:
        if not (self._dirty_flows or self._dirty_links):
            return
        self._stamp += 1
        stamp = self._stamp
        stack: list[Link] = list(self._dirty_links)
        for flow in self._dirty_flows:
            stack.extend(flow.path)
        self._dirty_flows.clear()
        self._dirty_links.clear()
        links: list[Link] = []
        flows: list[Flow] = []
        while stack:
            link = stack.pop()
            if link._mark == stamp:
                continue
            link._mark = stamp
            links.append(link)
            for flow in link.flows:
                if flow._mark != stamp:
                    flow._mark = stamp
                    flows.append(flow)
                    stack.extend(flow.path)
        if flows:
            self._solve(flows, links, stamp)

    def _solve(self, flows: list[Flow], links: list[Link], stamp: int) -> None:
        self.solves += 1
        old = [f.rate for f in flows]
        for flow in flows:
            self._sync(flow)
        heap: list[tuple[float, int, Link]] = []
        for i, link in enumerate(links):
            link._rem = link.capacity
            link._w = sum(link.flows.values())
            link._n = len(link.flows)
            if link._n:
                heap.append((link._rem / link._w, i, link))
        heapq.heapify(heap)
        while heap:
            share, i, link = heapq.heappop(heap)
            if link._n == 0:
                continue
            cur = link._rem / link._w if link._w > 0 else math.inf
            if cur > share * (1 + 1e-12):
                heapq.heappush(heap, (cur, i, link))
                continue
            rate = max(cur, 0.0)
            for flow in link.flows:
                if flow._frozen == stamp:
                    continue
                flow._frozen = stamp
                flow.rate = rate
                for other, coef in flow.path.items():
                    other._rem -= coef * rate
                    other._w -= coef
                    other._n -= 1
        now = self.now
        force = self._reschedule
        for flow, before in zip(flows, old, strict=True):
            if flow.rate != before or flow.version == 0 or flow in force:
                flow.version += 1
                if flow.rate > 0:
                    t = now + flow.remaining / flow.rate
                elif flow.remaining <= 0:
                    t = now
                else:
                    continue
                self._seq += 1
                heapq.heappush(self._heap, (t, self._seq, flow.version, flow))
        force.clear()


def max_min_rates(
    capacities: Sequence[float], paths: Sequence[Sequence[tuple[int, float]]]
) -> list[float]:
    """Max-min fair rates of a static set of flows.

    Args:
        capacities: link capacities, indexed by link number.
        paths: per flow, (link number, coefficient) pairs.

    Returns:
        One rate per flow, in payload bytes (units) per second.

    Raises:
        FlowError: for a bad capacity, coefficient or empty path.
    """
    net = FlowNetwork()
    links = [net.link(f"l{i}", c) for i, c in enumerate(capacities)]
    flows = [net.start(1.0, [(links[i], c) for i, c in path]) for path in paths]
    net.next_time()
    return [f.rate for f in flows]
