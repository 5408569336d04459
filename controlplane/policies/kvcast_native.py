"""The C record path of kvcast's policy: the extension's binding and the batch record on it.

``record_many`` and ``record_arrays`` of :class:`~controlplane.policies.kvcast.KvcastPolicy` run
the per-access update in C (``controlplane.policies._kvcast_native``, built by ``pip install -e
.``) when it is built and ``KVCAST_NATIVE`` is not ``0``. The C loop reads the policy's
parameters, its chunk statistics and the scalar state named in ``_NATIVE_STATE``, and writes the
state back; the policy keeps the scoring, the ranking and the decisions.

Classes:
    NativeRecordPolicy: the base of :class:`~controlplane.policies.kvcast.KvcastPolicy` that
        records batches through the C loop when one is in use (``_ext``), else as
        :class:`~controlplane.policies.base.CachePolicy` does.

Functions:
    native_record: the C record path when it is built and turned on, else None.
"""

from __future__ import annotations

import importlib
import os
from abc import abstractmethod
from collections.abc import Iterable
from types import ModuleType
from typing import Any

from controlplane.policies.base import Access, AccessColumns, CachePolicy, InvalidAccessError

__all__ = ["NativeRecordPolicy", "native_record"]

_NATIVE_STATE = (
    "_clock_t",
    "_clock_v",
    "_half_life",
    "_log_gap",
    "_gap_samples",
    "_cls_samples",
    "_latest",
)
"""The scalar state the C loop reads and writes back, in the order of its ``state`` list."""

_ext: ModuleType | None
try:
    _ext = importlib.import_module("controlplane.policies._kvcast_native")
    _ext.bind_access(Access)
except ImportError:  # not compiled here: the Python record path runs
    _ext = None


def native_record() -> ModuleType | None:
    """The C record path when it is built and ``KVCAST_NATIVE`` is not ``0``; else None."""
    if _ext is None or os.environ.get("KVCAST_NATIVE", "1") == "0":
        return None
    return _ext


class NativeRecordPolicy(CachePolicy):
    """A policy whose batches the C loop records when ``_ext`` is set (the loop's fields below).

    The subclass sets every attribute annotated here and the scalar state of
    ``_NATIVE_STATE``, and provides :meth:`_prune` and :meth:`_push`, which the loop's result
    needs.
    """

    _ext: ModuleType | None
    _meta: dict[int, Any]
    _adaptive: bool
    _learned: bool
    _gap_factor: float
    _min_half_life: float
    _max_half_life: float
    _log_repeat: float
    _max_tracked: int
    _log_history: float
    _cls_entries: list[float]
    _cls_reuses: list[float]

    @abstractmethod
    def _prune(self, keep: int) -> None:
        """Forget the least valuable non-resident chunks (called by the C loop)."""

    @abstractmethod
    def _push(self, key: int, m: Any) -> None:
        """Give a resident key a fresh live entry in the eviction heap."""

    @property
    def native(self) -> bool:
        """Whether batches are recorded by the C path."""
        return self._ext is not None

    def _native_args(self) -> tuple[Any, ...]:
        params = (
            self._adaptive,
            self._learned,
            self._gap_factor,
            self._min_half_life,
            self._max_half_life,
            self._log_repeat,
            self._max_tracked,
            self._log_history,
        )
        state = [getattr(self, name) for name in _NATIVE_STATE]
        return (self._meta, self._resident, self._prune, params, state)

    def _native_done(self, state: list[Any], pushed: list[int]) -> None:
        """Take the scalar state back from the C loop and push the resident keys it touched."""
        for name, value in zip(_NATIVE_STATE, state, strict=True):
            setattr(self, name, value)
        if pushed:
            # One live heap entry per resident key, in the order of their last access: the
            # heap the Python path leaves (its earlier entries for the same keys are stale).
            for key in reversed(list(dict.fromkeys(reversed(pushed)))):
                self._push(key, self._meta[key])
            pushed.clear()

    def record_many(self, accesses: Iterable[Access]) -> int:
        """Batch mode: record every access (in C when built; the same result as one by one).

        Args:
            accesses: access events in time order.

        Returns:
            How many accesses were recorded.

        Raises:
            InvalidAccessError: if an access is malformed (the ones before it stay recorded).
        """
        ext = self._ext
        if ext is None:
            return super().record_many(accesses)
        seq = accesses if isinstance(accesses, list) else list(accesses)
        i, n = 0, len(seq)
        pushed: list[int] = []
        while i < n:
            meta, resident, prune, params, state = self._native_args()
            entries, reuses = self._cls_entries, self._cls_reuses
            try:
                stop = ext.record(
                    meta, resident, prune, params, state, entries, reuses, pushed, seq, i
                )
            finally:
                self._native_done(state, pushed)
            if stop >= n:
                break
            self.record(seq[stop])  # one the C loop leaves to Python (or a malformed one)
            i = stop + 1
        return n

    def _record_columns(self, cols: AccessColumns) -> int:
        """Batch mode over checked columns (see :meth:`CachePolicy.record_arrays`), in C when built.

        Args:
            cols: the columns.

        Returns:
            How many accesses were recorded.

        Raises:
            InvalidAccessError: a size <= 0 (the accesses before it stay recorded).
        """
        ext = self._ext
        if ext is None:
            return super()._record_columns(cols)
        n = len(cols.keys)
        meta, resident, prune, params, state = self._native_args()
        pushed: list[int] = []
        try:
            stop = ext.record_arrays(
                meta,
                resident,
                prune,
                params,
                state,
                self._cls_entries,
                self._cls_reuses,
                pushed,
                n,
                *cols,
                0,
            )
        finally:
            self._native_done(state, pushed)
        if stop < n:
            bad = cols.access(stop)
            raise InvalidAccessError(f"chunk {bad.key}: size must be > 0, got {bad.size}")
        return n
