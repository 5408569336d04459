"""The runtime state of one reference-target switch, shaped by the P4Info of its program.

The per-packet pipeline (:mod:`refswitch.pipeline`) reads this state and the P4Runtime server
(:mod:`refswitch.p4rt_server`) writes it; both go through :class:`SwitchState`, so the two never
share anything else. Values are plain ints here; bytestrings exist only on the P4Runtime side.

Classes:
    SwitchState: the front of one switch's state, with the per-packet calls (``lookup``,
        ``count``, ``emit_digest`` ...) and the control-plane calls (``insert_entry``,
        ``write_multicast_group`` ...). Validates every write the way PI (simple_switch_grpc's
        P4Runtime front end) does. It holds the installed program
        (:class:`refswitch.program.Program`: tables, counters, digests, replication engine)
        and the stream to the controller (:class:`refswitch.stream.ControllerStream`), and
        keeps the locks.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence

from finsy.proto import p4i

from refswitch.digests import Digest, DigestConfig
from refswitch.errors import (
    AlreadyExistsError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    ResourceExhaustedError,
    WriteOp,
)
from refswitch.program import Counter, Program, check_index, reconcile_program
from refswitch.replication import CloneSession, MulticastGroup, Replica, check_clone_session
from refswitch.replication import multicast_group as checked_multicast_group
from refswitch.schema import PipelineSchema, check_device_config
from refswitch.stream import ControllerStream, StreamSink, SwitchStats
from refswitch.tables import (
    ActionCall,
    Entry,
    MatchSpec,
    Table,
    TableEntryView,
    check_action,
    check_extras,
    normalize_match,
    set_extras,
)

_LOG = logging.getLogger(__name__)


class SwitchState:
    """The runtime state of one switch: what the P4 program's tables, counters and PRE hold.

    Per-packet calls (``lookup``, ``count_direct``, ``count``, ``multicast_group``,
    ``emit_digest``, ``emit_packet_in``) take no lock on the lookup path: each pipeline
    structure is a dict changed one key at a time or a tuple replaced whole, and a new program
    replaces the whole set at once (one attribute store), so a lookup sees either the old or
    the new entry, never a torn one. Counter increments take a small lock so that
    concurrent pipeline threads do not lose counts. Control-plane writes and reads hold
    :attr:`lock` (an RLock; hold it around a batch to make it atomic for other writers).

    Args:
        device_id: P4Runtime device id.
        cpu_port: the port whose packets are PacketIn / PacketOut (for the pipeline).

    Attributes:
        packet_out_handler: set by the pipeline; called with (payload, packet_out metadata by
            field name) for every PacketOut from the primary controller, in the gRPC stream's
            thread.
        stats: what was delivered to or dropped before the controller.
    """

    def __init__(self, device_id: int = 1, cpu_port: int = 255) -> None:
        self.device_id = device_id
        self.cpu_port = cpu_port
        self.packet_out_handler: Callable[[bytes, Mapping[str, int]], None] | None = None
        self._stream = ControllerStream()
        self.stats: SwitchStats = self._stream.stats
        self._lock = threading.RLock()
        self._counter_lock = threading.Lock()
        self._program = Program(None)
        self._warned: set[str] = set()

    # ------------------------------------------------------------------ program
    def set_pipeline(
        self,
        p4info: p4i.P4Info,
        device_config: bytes = b"",
        initial_defaults: Mapping[str, ActionCall] | None = None,
        *,
        cookie: int | None = None,
        reconcile: bool = False,
    ) -> None:
        """Installs a program, replacing the previous one and everything written for it.

        Args:
            p4info: the program's P4Info.
            device_config: empty, or the program's BMv2 JSON (kept for
                GetForwardingPipelineConfig; see :func:`check_device_config`).
            initial_defaults: table name -> the program's default action (P4Info carries no
                default parameters); other tables default to the P4Info initial default action,
                else the const default action, else NoAction.
            cookie: ForwardingPipelineConfig cookie, if the controller sent one.
            reconcile: keep table entries (with their direct counters), default actions set by
                the controller, multicast groups, clone sessions and digest configurations
                whose ids exist in the new P4Info (RECONCILE_AND_COMMIT); indirect counters
                restart at zero. If any kept entry is invalid under the new P4Info, nothing
                changes.

        Raises:
            InvalidArgumentError: bad P4Info, device config or initial defaults.
            UnimplementedError: the P4Info uses something the reference target lacks.
            FailedPreconditionError: reconcile could not carry an entry over.
        """
        schema = PipelineSchema(p4info)
        check_device_config(schema, bytes(device_config))
        new = Program(schema, bytes(device_config), cookie, initial_defaults)
        with self._lock:
            old = self._program
            if reconcile and old.schema is not None:
                reconcile_program(old, new)
            self._stream.reset(old.unique_digests())
            self._program = new
            self._warned.clear()
        _LOG.info("pipeline installed: %s", p4info.pkg_info.name or "(unnamed)")

    @property
    def ready(self) -> bool:
        """A pipeline is installed."""
        return self._program.schema is not None

    @property
    def schema(self) -> PipelineSchema | None:
        """The installed program's P4Info, indexed; None before the first one."""
        return self._program.schema

    @property
    def p4info(self) -> p4i.P4Info | None:
        """The installed program's P4Info."""
        schema = self._program.schema
        return schema.p4info if schema is not None else None

    @property
    def device_config(self) -> bytes:
        """The installed program's device config blob."""
        return self._program.device_config

    @property
    def cookie(self) -> int | None:
        """The installed program's ForwardingPipelineConfig cookie, if it had one."""
        return self._program.cookie

    @property
    def lock(self) -> threading.RLock:
        """The control-plane lock; hold it to make several writes or reads one batch."""
        return self._lock

    def set_stream_sink(self, sink: StreamSink | None) -> None:
        """Sets where PacketIn and DigestList messages go (the P4Runtime server's primary)."""
        self._stream.set_sink(sink)

    def _require(self) -> PipelineSchema:
        schema = self._program.schema
        if schema is None:
            raise FailedPreconditionError("No forwarding pipeline config set for this device")
        return schema

    def _table(self, table: str | int) -> Table:
        self._require()
        try:
            return self._program.tables[table]
        except KeyError:
            raise InvalidArgumentError(f"Invalid P4 id: no table {table!r}") from None

    # ------------------------------------------------------------------ per packet
    def lookup(self, table: str, key: Sequence[int]) -> tuple[ActionCall, object | None]:
        """Matches a key against a table.

        Args:
            table: table name (or alias).
            key: one int per key field, in P4Info order.

        Returns:
            The matching entry's action and an opaque handle for count_direct, or the default
            action and None on a miss.

        Raises:
            NotFoundError: no such table (or no pipeline).
        """
        try:
            t = self._program.tables[table]
        except KeyError:
            raise NotFoundError(f"no table {table!r} in the installed pipeline") from None
        entry = t.find(key)
        if entry is None:
            return t.default.action, None
        return entry.action, entry

    def count_direct(self, entry: object | None, packets: int = 1, nbytes: int = 0) -> None:
        """Adds to the direct counter of the entry lookup() returned; no-op for None."""
        if isinstance(entry, Entry):
            with self._counter_lock:
                entry.packets += packets
                entry.bytes += nbytes

    def count(self, counter: str, index: int, packets: int = 1, nbytes: int = 0) -> None:
        """Adds to one cell of an indirect counter; an index outside it is ignored (logged once).

        Raises:
            NotFoundError: no such counter.
        """
        try:
            c = self._program.counters[counter]
        except KeyError:
            raise NotFoundError(f"no counter {counter!r} in the installed pipeline") from None
        if 0 <= index < c.info.size:
            with self._counter_lock:
                c.packets[index] += packets
                c.bytes[index] += nbytes
            return
        self.stats.counter_index_errors += 1
        if counter not in self._warned:
            self._warned.add(counter)
            _LOG.warning("counter %s: index %d outside 0..%d ignored", counter, index, c.info.size)

    def multicast_group(self, group_id: int) -> Sequence[tuple[int, int]]:
        """The (egress_port, instance) replicas of a multicast group; empty if unknown."""
        return self._program.pre.ports(group_id)

    def clone_session(self, session_id: int) -> CloneSession | None:
        """A clone session, or None if unknown."""
        return self._program.pre.sessions.get(session_id)

    def emit_digest(self, digest: str, values: Sequence[int]) -> None:
        """Sends one digest sample towards the primary controller.

        The sample is dropped (``stats.digests_unconfigured``) unless a DigestEntry configured
        the digest, as on BMv2. Samples are batched per DigestConfig and sent as DigestList
        messages (list ids from 1, wall-clock timestamps in ns, members as canonical
        bitstrings).

        Args:
            digest: digest name as in P4Info (the struct type name, e.g. "hot_miss_digest_t").
            values: the struct members in order.

        Raises:
            NotFoundError: no such digest.
            InvalidArgumentError: wrong number of values or a value too wide.
        """
        try:
            d = self._program.digests[digest]
        except KeyError:
            raise NotFoundError(f"no digest {digest!r} in the installed pipeline") from None
        self._stream.emit_digest(d, values)

    def emit_packet_in(self, payload: bytes, metadata: Mapping[str, int]) -> None:
        """Sends a PacketIn to the primary controller (dropped, and counted, if none).

        Args:
            payload: the packet, without the packet_in header.
            metadata: packet_in header fields by P4Info name; missing ones are 0, unknown names
                are ignored (logged once).

        Raises:
            InvalidArgumentError: a metadata value is too wide for its field.
        """
        schema = self._program.schema
        self._stream.emit_packet_in(schema.packet_in if schema else None, payload, metadata)

    # ------------------------------------------------------------------ tables
    def insert_entry(
        self,
        table: str | int,
        match: Sequence[MatchSpec],
        action: ActionCall,
        *,
        priority: int = 0,
        counter: tuple[int, int] | None = None,
        metadata: bytes = b"",
        controller_metadata: int = 0,
        idle_timeout_ns: int = 0,
    ) -> None:
        """Adds an entry (const tables included: the program may install its const entries).

        Args:
            table: table id, name or alias.
            match: one MatchSpec per key field, in P4Info order.
            action: the entry's action (by P4Info name or alias).
            priority: required (> 0) iff a key field is ternary, range or optional.
            counter: initial direct counter (packets, bytes); only for tables with one.
            metadata: opaque controller cookie.
            controller_metadata: deprecated integer cookie.
            idle_timeout_ns: accepted for tables that support idle timeout; never fires.

        Raises:
            InvalidArgumentError: bad key, action or parameters.
            PermissionDeniedError: the action's scope forbids it here.
            AlreadyExistsError: an entry with this key and priority exists.
            ResourceExhaustedError: the table is full.
        """
        with self._lock:
            t, specs, call = self._checked(table, match, action, priority, counter, idle_timeout_ns)
            if (specs, priority) in t.entries:
                raise AlreadyExistsError(
                    "Match entry exists, use MODIFY if you wish to change action"
                )
            if 0 < t.info.size <= len(t.entries):
                raise ResourceExhaustedError(f"Table {t.info.name!r} is full ({t.info.size})")
            entry = Entry(specs, priority, call)
            set_extras(entry, counter, metadata, controller_metadata, idle_timeout_ns)
            t.add(entry)

    def modify_entry(
        self,
        table: str | int,
        match: Sequence[MatchSpec],
        action: ActionCall,
        *,
        priority: int = 0,
        counter: tuple[int, int] | None = None,
        metadata: bytes = b"",
        controller_metadata: int = 0,
        idle_timeout_ns: int = 0,
    ) -> None:
        """Changes the action (and cookies, and the direct counter if given) of an entry.

        Raises:
            NotFoundError: no entry with this key and priority.
            InvalidArgumentError, PermissionDeniedError: as for insert_entry.
        """
        with self._lock:
            t, specs, call = self._checked(table, match, action, priority, counter, idle_timeout_ns)
            entry = t.entries.get((specs, priority))
            if entry is None:
                raise NotFoundError("Cannot find match entry")
            entry.action = call
            with self._counter_lock:
                set_extras(entry, counter, metadata, controller_metadata, idle_timeout_ns)

    def _checked(
        self,
        table: str | int,
        match: Sequence[MatchSpec],
        action: ActionCall,
        priority: int,
        counter: tuple[int, int] | None,
        idle_timeout_ns: int,
    ) -> tuple[Table, tuple[MatchSpec, ...], ActionCall]:
        """The table, normalized key and checked action of an entry to insert or modify."""
        t = self._table(table)
        schema = self._require()
        specs = normalize_match(t.info, match, priority)
        call = check_action(schema, t.info, action, default=False)
        check_extras(t.info, counter, idle_timeout_ns)
        return t, specs, call

    def delete_entry(
        self, table: str | int, match: Sequence[MatchSpec], *, priority: int = 0
    ) -> None:
        """Removes an entry.

        Raises:
            NotFoundError: no entry with this key and priority.
            InvalidArgumentError: bad key.
        """
        with self._lock:
            t = self._table(table)
            specs = normalize_match(t.info, match, priority)
            entry = t.entries.get((specs, priority))
            if entry is None:
                raise NotFoundError("Cannot find match entry")
            t.remove(entry)

    def set_default_action(
        self,
        table: str | int,
        action: ActionCall | None,
        *,
        counter: tuple[int, int] | None = None,
    ) -> None:
        """Sets a table's default action, or with None restores the program's initial one.

        Raises:
            PermissionDeniedError: the table has a const default action, or the action is
                TABLE_ONLY.
            InvalidArgumentError: bad action, or the table is indirect.
        """
        with self._lock:
            t = self._table(table)
            schema = self._require()
            if t.info.implementation_id:
                raise InvalidArgumentError(
                    f"Cannot set / reset default action for indirect table {t.info.name!r}"
                )
            if t.info.const_default_action_id:
                raise PermissionDeniedError(
                    f"Cannot set / reset default action for table {t.info.name!r} which has a "
                    "const default action"
                )
            call = (
                t.initial_default
                if action is None
                else check_action(schema, t.info, action, default=True)
            )
            check_extras(t.info, counter, 0)
            t.default.action = call
            if counter is not None:
                with self._counter_lock:
                    t.default.packets, t.default.bytes = counter

    def entries(self, table: str | int) -> list[TableEntryView]:
        """All entries of a table (not the default one), in insertion order."""
        with self._lock:
            t = self._table(table)
            return [t.view(e) for e in t.entries.values()]

    def get_entry(
        self, table: str | int, match: Sequence[MatchSpec], *, priority: int = 0
    ) -> TableEntryView | None:
        """The entry with exactly this key and priority, or None.

        Raises:
            InvalidArgumentError: bad key.
        """
        with self._lock:
            t = self._table(table)
            entry = t.entries.get((normalize_match(t.info, match, priority), priority))
            return t.view(entry) if entry is not None else None

    def default_entry(self, table: str | int) -> TableEntryView:
        """The default entry of a table."""
        with self._lock:
            t = self._table(table)
            return t.view(t.default, is_default=True)

    def set_direct_counter(
        self,
        table: str | int,
        match: Sequence[MatchSpec] | None,
        packets: int,
        nbytes: int,
        *,
        priority: int = 0,
    ) -> None:
        """Sets the direct counter of an entry (match None: of the default entry).

        Raises:
            InvalidArgumentError: the table has no direct counter, or no such entry (PI's code).
        """
        with self._lock:
            t = self._table(table)
            if not t.info.direct_counter_id:
                raise InvalidArgumentError("Table has no direct counters")
            if match is None:
                entry: Entry | None = t.default
            else:
                entry = t.entries.get((normalize_match(t.info, match, priority), priority))
            if entry is None:
                raise InvalidArgumentError("Cannot map table entry to handle")
            with self._counter_lock:
                entry.packets, entry.bytes = packets, nbytes

    def direct_counter_value(self, table: str, key: Sequence[int]) -> tuple[int, int]:
        """The direct counter (packets, bytes) of the entry a lookup of ``key`` hits.

        Raises:
            NotFoundError: the key hits no entry.
        """
        _, entry = self.lookup(table, key)
        if not isinstance(entry, Entry):
            raise NotFoundError(f"{table}: no entry matches {list(key)}")
        return entry.packets, entry.bytes

    # ------------------------------------------------------------------ counters
    def _counter(self, counter: str | int) -> Counter:
        schema = self._require()
        cinfo = schema.counter(counter)
        return self._program.counters[cinfo.id]

    def set_counter(self, counter: str | int, index: int | None, packets: int, nbytes: int) -> None:
        """Sets one cell of an indirect counter, or every cell if index is None.

        Raises:
            InvalidArgumentError: no such counter, or a negative index.
            OutOfRangeError: index beyond the counter's size.
        """
        with self._lock:
            c = self._counter(counter)
            indices = range(c.info.size) if index is None else (check_index(c.info, index),)
            with self._counter_lock:
                for i in indices:
                    c.packets[i], c.bytes[i] = packets, nbytes

    def counter_value(self, counter: str, index: int) -> tuple[int, int]:
        """(packets, bytes) of one counter cell.

        Raises:
            InvalidArgumentError: no such counter, or a negative index.
            OutOfRangeError: index beyond the counter's size.
        """
        c = self._counter(counter)
        i = check_index(c.info, index)
        return c.packets[i], c.bytes[i]

    def counter_values(self, counter: str | int) -> list[tuple[int, int]]:
        """(packets, bytes) of every cell of a counter."""
        c = self._counter(counter)
        with self._counter_lock:
            return list(zip(c.packets, c.bytes, strict=True))

    # ------------------------------------------------------------------ replication engine
    def write_multicast_group(
        self,
        op: WriteOp,
        group_id: int,
        replicas: Iterable[Replica] = (),
        metadata: bytes = b"",
    ) -> None:
        """Inserts, modifies or deletes a multicast group.

        Raises:
            InvalidArgumentError: group 0, or a duplicate (port, instance).
            OutOfRangeError: group id in the reserved range.
            AlreadyExistsError / NotFoundError: as the operation requires.
        """
        group = checked_multicast_group(group_id, replicas, metadata)
        with self._lock:
            self._require()
            self._program.pre.write_group(op, group)

    def multicast_groups(self) -> list[MulticastGroup]:
        """All multicast groups, by group id."""
        with self._lock:
            groups = self._program.pre.groups
            return [groups[g] for g in sorted(groups)]

    def write_clone_session(self, op: WriteOp, session: CloneSession) -> None:
        """Inserts, modifies or deletes a clone session (stored for the pipeline and reads).

        Raises:
            InvalidArgumentError: session 0, or a duplicate (port, instance).
            AlreadyExistsError / NotFoundError: as the operation requires.
        """
        check_clone_session(session)
        with self._lock:
            self._require()
            self._program.pre.write_session(op, session)

    def clone_sessions(self) -> list[CloneSession]:
        """All clone sessions, by session id."""
        with self._lock:
            sessions = self._program.pre.sessions
            return [sessions[s] for s in sorted(sessions)]

    # ------------------------------------------------------------------ digests
    def write_digest_config(
        self, op: WriteOp, digest: str | int, config: DigestConfig | None = None
    ) -> None:
        """Configures (INSERT / MODIFY) or unconfigures (DELETE) a digest, as a DigestEntry does.

        Raises:
            NotFoundError: no such digest, or MODIFY / DELETE of an unconfigured one.
            AlreadyExistsError: INSERT of a configured one.
        """
        with self._lock:
            d = self._digest(digest)
            self._stream.configure_digest(d, op, config)

    def digest_config(self, digest: str | int) -> DigestConfig | None:
        """A digest's configuration, or None if unconfigured.

        Raises:
            NotFoundError: no such digest.
        """
        with self._lock:
            return self._digest(digest).config

    def ack_digest_list(self, digest: str | int, list_id: int) -> None:
        """DigestListAck: lets the samples of that list through again. Unknown ids are ignored."""
        d = self._program.digests.get(digest)
        if d is None:
            return
        self._stream.ack_digest(d, list_id)

    def _digest(self, digest: str | int) -> Digest:
        schema = self._require()
        return self._program.digests[schema.digest(digest).id]
