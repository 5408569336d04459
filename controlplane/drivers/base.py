"""What the drivers share: table entries as values, and a per-table mirror that reconciles.

Each driver keeps the entries it wants a table to hold in a :class:`TableMirror`. The mirror
changes only after the switch accepted a write, so after a lost connection it still says what
the switch *should* hold, and :meth:`TableMirror.reconcile` makes the switch hold exactly that
(deleting orphans, fixing changed entries, inserting missing ones) whether the switch kept its
state (a reconnect) or lost it (a restart).

Classes:
    EntrySpec: one table entry by names and integers (match, action, parameters).
    ReconcileResult: what a reconcile changed.
    TableMirror: the desired entries of one table, written through a SwitchClient.

Functions:
    mac_int, ip_int: address text to the integer a match field or parameter takes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import finsy as fy

from controlplane.errors import ConfigError
from controlplane.p4rt import SwitchClient
from kvcast import wire
from kvcast.wire import WireError

T = TypeVar("T")

MatchValue = int | tuple[int, int]
"""An exact (or optional) match value, or ``(value, prefix_len)`` for an LPM field."""
MatchKey = tuple[tuple[str, MatchValue], ...]


def mac_int(mac: str) -> int:
    """``"00:00:00:00:00:01"`` as an integer.

    Raises:
        ConfigError: not a MAC address.
    """
    try:
        return wire.mac_int(mac)
    except (WireError, ValueError) as exc:
        raise ConfigError(f"not a MAC address: {mac!r}") from exc


def ip_int(ip: str) -> int:
    """``"10.0.0.1"`` as an integer.

    Raises:
        ConfigError: not an IPv4 address.
    """
    try:
        return wire.ip_int(ip)
    except ValueError as exc:
        raise ConfigError(f"not an IPv4 address: {ip!r}") from exc


@dataclass(frozen=True, slots=True)
class EntrySpec:
    """One table entry by names and integers.

    Attributes:
        match: (field name, value) pairs, sorted by field name.
        action: the action's full P4Info name.
        params: (parameter name, value) pairs, sorted by name.
    """

    match: MatchKey
    action: str
    params: tuple[tuple[str, int], ...]

    @classmethod
    def of(
        cls, match: Mapping[str, MatchValue], action: str, params: Mapping[str, int] | None = None
    ) -> EntrySpec:
        """Builds a spec from mappings."""
        return cls(tuple(sorted(match.items())), action, tuple(sorted((params or {}).items())))

    def entry(self, table: str, schema: fy.P4Schema) -> fy.P4TableEntry:
        """The finsy entry (match and action) for an INSERT or MODIFY.

        Fields and parameters go out in P4Info order, as p4c and p4runtime-shell send them.
        """
        params = _ordered(dict(self.params), [p.name for p in schema.actions[self.action].params])
        return fy.P4TableEntry(
            table,
            match=_match(table, self.match, schema),
            action=fy.P4TableAction(self.action, **params),
        )


def _ordered(values: dict[str, T], names: Sequence[str]) -> dict[str, T]:
    # Unknown names stay (last), so that finsy reports them as encoding errors.
    return {n: values[n] for n in names if n in values} | {
        k: v for k, v in values.items() if k not in names
    }


def _match(table: str, match: MatchKey, schema: fy.P4Schema) -> fy.P4TableMatch:
    names = [f.name for f in schema.tables[table].match_fields]
    return fy.P4TableMatch(_ordered(dict(match), names))


def key_entry(table: str, match: MatchKey, schema: fy.P4Schema) -> fy.P4TableEntry:
    """The finsy entry for a DELETE (match only)."""
    return fy.P4TableEntry(table, match=_match(table, match, schema))


@dataclass(frozen=True, slots=True)
class ReconcileResult:
    """Entries a reconcile deleted (orphans), modified (differing) and inserted (missing)."""

    deleted: int = 0
    modified: int = 0
    inserted: int = 0


class TableMirror:
    """The entries the control plane wants in one table, written through a SwitchClient.

    Args:
        client: the switch.
        table: the table's P4Info name (a generated ``c.TABLE_...`` constant).
    """

    def __init__(self, client: SwitchClient, table: str) -> None:
        self._client = client
        self._table = table
        self._entries: dict[MatchKey, EntrySpec] = {}

    @property
    def table(self) -> str:
        """The table's name."""
        return self._table

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, match: object) -> bool:
        return match in self._entries

    def get(self, match: MatchKey) -> EntrySpec | None:
        """The desired entry with this match, if any."""
        return self._entries.get(match)

    def specs(self) -> list[EntrySpec]:
        """Every desired entry, sorted by match."""
        return [self._entries[k] for k in sorted(self._entries, key=repr)]

    async def apply(
        self, puts: Sequence[EntrySpec] = (), removes: Iterable[MatchKey] = ()
    ) -> ReconcileResult:
        """Writes a batch of changes as one WriteRequest: deletes, then modifies, then inserts.

        A put of an entry already desired unchanged, or a remove of one not desired, sends
        nothing for it.

        Args:
            puts: entries to hold (inserted when new, modified when changed).
            removes: matches to delete.

        Returns:
            What was written.

        Raises:
            SwitchError: the write failed; the mirror is unchanged.
        """
        puts = list({s.match: s for s in puts}.values())
        deletes = [m for m in dict.fromkeys(removes) if m in self._entries]
        modifies = [s for s in puts if s.match in self._entries and self._entries[s.match] != s]
        inserts = [s for s in puts if s.match not in self._entries]
        schema = self._client.schema
        updates: list[Any] = [-key_entry(self._table, m, schema) for m in deletes]
        updates += [~s.entry(self._table, schema) for s in modifies]
        updates += [+s.entry(self._table, schema) for s in inserts]
        if updates:
            await self._client.write(updates)
        for m in deletes:
            del self._entries[m]
        for s in (*modifies, *inserts):
            self._entries[s.match] = s
        return ReconcileResult(len(deletes), len(modifies), len(inserts))

    async def read_installed(self) -> dict[MatchKey, EntrySpec]:
        """Reads what the switch's table holds now.

        Raises:
            SwitchError: the read failed.
        """
        schema = self._client.schema
        out: dict[MatchKey, EntrySpec] = {}
        for ent in await self._client.read([fy.P4TableEntry(self._table)]):
            if ent.is_default_action or ent.action is None:
                continue
            action = schema.actions[ent.action.name].name
            spec = EntrySpec.of(dict(ent.match or {}), action, dict(ent.action.args))
            out[spec.match] = spec
        return out

    async def reconcile(self) -> ReconcileResult:
        """Makes the switch's table hold exactly the desired entries.

        Returns:
            What was written (one WriteRequest: orphans deleted, differing entries modified,
            missing entries inserted).

        Raises:
            SwitchError: a read or write failed.
        """
        installed = await self.read_installed()
        deletes = [m for m in installed if m not in self._entries]
        modifies = [s for m, s in self._entries.items() if m in installed and installed[m] != s]
        inserts = [s for m, s in self._entries.items() if m not in installed]
        schema = self._client.schema
        orphans = sorted(deletes, key=repr)
        updates: list[Any] = [-key_entry(self._table, m, schema) for m in orphans]
        updates += [~s.entry(self._table, schema) for s in modifies]
        updates += [+s.entry(self._table, schema) for s in inserts]
        if updates:
            await self._client.write(updates)
        return ReconcileResult(len(deletes), len(modifies), len(inserts))

    def adopt(self, specs: Iterable[EntrySpec]) -> None:
        """Records entries the switch holds already (read back) as desired, writing nothing."""
        for spec in specs:
            self._entries[spec.match] = spec

    def forget(self, match: MatchKey) -> None:
        """Drops an entry from the desired set without writing (the switch lost it)."""
        self._entries.pop(match, None)

    def forget_all(self) -> None:
        """Drops every desired entry without writing."""
        self._entries.clear()
