"""The multicast groups a pool node will echo in a DATA: what the controller says exist.

A GET naming group G makes a pool node's DATA go to every member of G. The switch already takes
such a GET only from a member's port (docs/security.md); a pool node also refuses, by default,
every group it has not been told about, so a GET that reached it some other way (another fabric,
a switch without the check) cannot make it feed a group. It is told by the controller
(``--groups-url``), by a fixed list (``--group``, for a switch programmed without the
controller), or, explicitly and logged, allowed any group (``--any-group``); told nothing, it
refuses them all. The controller serves its groups per switch at ``GET /v1/groups/<switch>`` on
its report API; the registry polls that and, when a GET names a group it does not know, asks
once more right away (at most every ``min_refresh_s``) before refusing, so a group created a
moment ago is not refused.

Classes:
    GroupSource: what the server asks (``allows(group)``).
    GroupRegistry: the known groups, refreshed from the controller.
    StaticGroups: a fixed set of groups.
    AnyGroup: every group (the explicit opt-out; ``ANY_GROUP``).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable
from typing import Protocol

from poolnode.threads import BackgroundThread

_LOG = logging.getLogger(__name__)

__all__ = ["ANY_GROUP", "AnyGroup", "GroupRegistry", "GroupSource", "StaticGroups"]


class GroupSource(Protocol):
    """The groups a pool node may echo in its DATA."""

    def allows(self, group: int) -> bool:
        """Whether a GET naming ``group`` may be served."""
        ...


class StaticGroups:
    """A fixed set of group ids (a switch whose groups are programmed without the controller).

    Args:
        groups: the group ids.
    """

    def __init__(self, groups: Iterable[int]) -> None:
        self.groups = frozenset(groups)

    def allows(self, group: int) -> bool:
        """Whether ``group`` is one of the set."""
        return group in self.groups


class AnyGroup:
    """Every group: the node trusts the switch's membership check alone (explicit opt-out)."""

    def allows(self, group: int) -> bool:
        """Always True."""
        return True


ANY_GROUP = AnyGroup()


class GroupRegistry:
    """Group ids a pool node may echo, from the controller's ``/v1/groups/<switch>``.

    Until the first successful read no group is allowed (fail closed); after a failed read the
    last known set stays in force.

    Args:
        url: the full URL of the switch's groups document.
        refresh_s: period of the background refresh (``start``; > 0).
        min_refresh_s: the least time between two reads on demand.
        timeout_s: HTTP timeout of one read.
        clock: monotonic clock (tests).

    Raises:
        ValueError: ``refresh_s`` is not positive.
    """

    def __init__(
        self,
        url: str,
        *,
        refresh_s: float = 1.0,
        min_refresh_s: float = 0.05,
        timeout_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url
        self.refresh_s = refresh_s
        self.min_refresh_s = min_refresh_s
        self.timeout_s = timeout_s
        self._clock = clock
        self._groups: frozenset[int] = frozenset()
        self._last_read = -float("inf")
        self._lock = threading.Lock()
        self._refresher = BackgroundThread.every(refresh_s, self.refresh, "group-registry")
        self.reads = 0
        self.read_errors = 0

    @property
    def groups(self) -> frozenset[int]:
        """The group ids known now."""
        return self._groups

    def refresh(self) -> bool:
        """Reads the controller's groups now; False (and the old set kept) when that fails."""
        with self._lock:
            self._last_read = self._clock()
            try:
                with urllib.request.urlopen(self.url, timeout=self.timeout_s) as resp:
                    doc = json.loads(resp.read())
                groups = frozenset(int(g) for g in doc["groups"])
            except (OSError, ValueError, KeyError, TypeError) as exc:
                self.read_errors += 1
                _LOG.info("groups from %s not read: %s", self.url, exc)
                return False
            self._groups = groups
            self.reads += 1
            return True

    def allows(self, group: int) -> bool:
        """Whether ``group`` exists; an unknown one triggers one rate-limited read first."""
        if group in self._groups:
            return True
        if self._clock() - self._last_read >= self.min_refresh_s:
            self.refresh()
        return group in self._groups

    def start(self) -> GroupRegistry:
        """Reads once, then refreshes every ``refresh_s`` in a daemon thread."""
        self.refresh()
        self._refresher.start()
        return self

    def stop(self) -> None:
        """Stops the background refresh."""
        self._refresher.stop(timeout_s=5)
