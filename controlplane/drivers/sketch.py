"""Driver of the HotMissSketch control: the hot-miss threshold and the sketch windows.

The count-min sketch over GET misses reports a key once per window when its estimate reaches
or passes the threshold. Both are the parameters of ``sketch_config``'s default action; a new
window is opened by writing a new window id, and sketch cells written in another window count
from 1 again (p4src/v1model/include/control/hot_sketch.p4). Windows therefore follow the
controller's clock: :meth:`SketchDriver.run` opens one every period.

Window ids wrap at the width of the ``window`` parameter (16 bits: 65,536 windows, 7.6 days at
the default 10 s period): only a cell untouched for exactly that many windows resumes its old
count, far beyond any polling period.

Classes:
    SketchDriver: set the threshold, open windows (on demand or periodically).
"""

from __future__ import annotations

import asyncio
import logging

import finsy as fy

from controlplane.errors import ConfigError, SwitchError
from controlplane.p4rt import SessionInfo, SwitchClient
from kvcast import p4constants as c

_LOG = logging.getLogger(__name__)

TABLE = c.TABLE_INGRESS_HOT_SKETCH_SKETCH_CONFIG
ACTION = c.ACTION_INGRESS_HOT_SKETCH_SET_SKETCH_CONFIG


class SketchDriver:
    """sketch_config's default action: threshold and window id.

    Args:
        client: the switch.
        threshold: misses per window that make a key hot (default: the program's
            ``HOT_MISS_THRESHOLD``).

    Raises:
        ConfigError: the threshold does not fit its parameter.
    """

    def __init__(self, client: SwitchClient, threshold: int = c.HOT_MISS_THRESHOLD) -> None:
        self._client = client
        params = client.schema.actions[ACTION].params
        self._threshold_max = (1 << params["threshold"].bitwidth) - 1
        self._windows = 1 << params["window"].bitwidth
        self._check(threshold)
        self._threshold = threshold
        self._window = 0

    @property
    def threshold(self) -> int:
        """Misses per window that make a key hot."""
        return self._threshold

    @property
    def window(self) -> int:
        """The current window id."""
        return self._window

    async def set_threshold(self, threshold: int) -> None:
        """Changes the threshold (the current window stays open).

        Raises:
            ConfigError: out of range.
            SwitchError: the write failed.
        """
        self._check(threshold)
        await self._write(threshold, self._window)
        self._threshold = threshold

    async def open_window(self) -> int:
        """Opens a new window: every key's miss count starts again from zero.

        Returns:
            The new window id.

        Raises:
            SwitchError: the write failed (the old window stays open).
        """
        window = (self._window + 1) % self._windows
        await self._write(self._threshold, window)
        self._window = window
        return window

    async def run(self, period_s: float) -> None:
        """Opens a new window every ``period_s`` seconds until cancelled.

        A window that cannot be opened (switch down) is logged and tried again next period.

        Raises:
            ConfigError: a non-positive period.
        """
        if period_s <= 0:
            raise ConfigError("the window period must be positive")
        while True:
            await asyncio.sleep(period_s)
            try:
                await self.open_window()
            except SwitchError as exc:
                _LOG.info("sketch window not opened: %s", exc)

    async def reinstall(self, session: SessionInfo) -> None:
        """Writes the current threshold and window id again.

        Raises:
            SwitchError: the write failed.
        """
        await self._write(self._threshold, self._window)

    def _check(self, threshold: int) -> None:
        if not 1 <= threshold <= self._threshold_max:
            raise ConfigError(f"threshold {threshold} outside 1..{self._threshold_max}")

    async def _write(self, threshold: int, window: int) -> None:
        entry = fy.P4TableEntry(
            TABLE,
            action=fy.P4TableAction(ACTION, threshold=threshold, window=window),
            is_default_action=True,
        )
        await self._client.write([~entry])
