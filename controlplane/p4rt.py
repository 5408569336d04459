"""The control plane's P4Runtime layer: one client per switch, several switches per process.

Built on finsy (asyncio). finsy's :class:`finsy.Switch` holds the gRPC channel, the stream,
arbitration and the P4Info-driven encoding; this module adds what kvcast needs around it
(docs/controlplane.md says why each piece is not finsy's own):

* a supervisor per switch that reconnects with a bounded exponential backoff, and after every
  (re)connection or promotion to primary makes sure the switch runs our pipeline (pushing it
  when the cookie differs: a restarted switch has none) and then tells every registered driver
  to re-install its state, saying whether the pipeline was just pushed (the switch's tables and
  registers are empty) or was already there (reconcile against what the switch holds);
* typed errors (:mod:`controlplane.errors`) instead of finsy's ``P4ClientError``;
* fan-out of PacketIn and digest lists to handlers, and digest acknowledgement;
* a P4Info repair for P4Info files finsy refuses (missing aliases, ids without their type
  prefix), applied only where needed, so the switch and finsy use the same ids.

Classes:
    SwitchConfig: where a switch is and which program it runs.
    ConnectionState: the supervisor's view of a switch (connecting, syncing, ready, backup).
    SessionInfo: what a driver learns when asked to re-install (generation, pipeline pushed).
    Driver: the protocol drivers implement to be re-installed after a reconnect.
    SwitchClient: one switch: supervisor, writes, reads, packet I/O, digests.
    SwitchFleet: several SwitchClients in one process, started and stopped together.

Functions:
    load_p4info: read a text P4Info file.
    conform_p4info: a copy of a P4Info that finsy accepts (aliases, id prefixes).
    pipeline_cookie: the ForwardingPipelineConfig cookie of a program.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import hashlib
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, cast

import finsy as fy
from finsy import p4entity
from finsy.grpcutil import GRPCStatusCode
from finsy.proto import p4i, p4r
from google.protobuf import text_format
from google.protobuf.message import Message

from controlplane.errors import (
    ConfigError,
    ControlPlaneError,
    EncodingError,
    EntryExistsError,
    EntryNotFoundError,
    NotPrimaryError,
    PipelineError,
    ReadError,
    SwitchError,
    SwitchUnavailableError,
    UpdateFailure,
    WriteError,
)
from controlplane.targets import Target, device_config_for, local_p4info

_LOG = logging.getLogger(__name__)

PacketHandler = Callable[[fy.P4PacketIn], None]
DigestHandler = Callable[[fy.P4DigestList], None]

_STREAM_MESSAGES = (fy.P4PacketOut, fy.P4DigestListAck)
_UNAVAILABLE = {
    GRPCStatusCode.UNAVAILABLE,
    GRPCStatusCode.CANCELLED,
    GRPCStatusCode.DEADLINE_EXCEEDED,
}


# ------------------------------------------------------------------------------ P4Info
def load_p4info(path: Path) -> p4i.P4Info:
    """Reads a text-format P4Info.

    Args:
        path: the file (p4src/build/kvcast.p4info.txtpb).

    Returns:
        The P4Info message.

    Raises:
        ConfigError: the file is missing or not a text P4Info.
    """
    try:
        return text_format.Parse(path.read_text(), p4i.P4Info())
    except OSError as exc:
        raise ConfigError(f"cannot read P4Info {path}: {exc}; build it with `make p4`") from exc
    except text_format.ParseError as exc:
        raise ConfigError(f"{path} is not a text-format P4Info: {exc}") from exc


# P4Info sections with a preamble, and the id prefix (P4Runtime spec 6.3) of their entities.
_PREFIXES: dict[str, int] = {
    "tables": p4i.P4Ids.TABLE,
    "actions": p4i.P4Ids.ACTION,
    "action_profiles": p4i.P4Ids.ACTION_PROFILE,
    "counters": p4i.P4Ids.COUNTER,
    "direct_counters": p4i.P4Ids.DIRECT_COUNTER,
    "meters": p4i.P4Ids.METER,
    "direct_meters": p4i.P4Ids.DIRECT_METER,
    "controller_packet_metadata": p4i.P4Ids.CONTROLLER_HEADER,
    "value_sets": p4i.P4Ids.VALUE_SET,
    "registers": p4i.P4Ids.REGISTER,
    "digests": p4i.P4Ids.DIGEST,
}


def conform_p4info(p4info: p4i.P4Info) -> p4i.P4Info:
    """Returns a P4Info that finsy accepts: every alias set, every id with its type prefix.

    p4c's P4Info already conforms and comes back unchanged (same ids). A hand-written or
    otherwise generated P4Info may leave aliases empty (finsy then indexes two entities under
    the name "") or use ids without the type prefix that the P4Runtime spec (6.3) requires
    (finsy asserts on them); such ids become ``prefix << 24 | (id & 0xffffff)`` and every
    reference to them follows. The result is what the layer pushes to the switch, so the
    switch and finsy agree on every id; code names entities, never ids.

    Args:
        p4info: the program's P4Info.

    Returns:
        A conforming copy (or the same message when nothing needed a change).
    """
    remap: dict[int, int] = {}
    needs_alias = False
    for section, prefix in _PREFIXES.items():
        for ent in getattr(p4info, section):
            pid = ent.preamble.id
            if pid >> 24 != prefix:
                remap[pid] = (prefix << 24) | (pid & 0xFFFFFF)
            needs_alias |= not ent.preamble.alias
    if not remap and not needs_alias:
        return p4info
    out = p4i.P4Info()
    out.CopyFrom(p4info)

    def new(ident: int) -> int:
        return remap.get(ident, ident)

    for section in _PREFIXES:
        for ent in getattr(out, section):
            ent.preamble.id = new(ent.preamble.id)
            if not ent.preamble.alias:
                ent.preamble.alias = ent.preamble.name
    for table in out.tables:
        for ref in table.action_refs:
            ref.id = new(ref.id)
        table.const_default_action_id = new(table.const_default_action_id)
        table.implementation_id = new(table.implementation_id)
        table.direct_resource_ids[:] = [new(i) for i in table.direct_resource_ids]
    for profile in out.action_profiles:
        profile.table_ids[:] = [new(i) for i in profile.table_ids]
    for counter in out.direct_counters:
        counter.direct_table_id = new(counter.direct_table_id)
    for meter in out.direct_meters:
        meter.direct_table_id = new(meter.direct_table_id)
    return out


def pipeline_cookie(p4info: p4i.P4Info, device_config: bytes) -> int:
    """The 64-bit ForwardingPipelineConfig cookie naming a program and its device config.

    Args:
        p4info: the P4Info pushed.
        device_config: the target blob pushed with it.

    Returns:
        The cookie (the first 8 bytes of a SHA-256 over both).
    """
    digest = hashlib.sha256(p4info.SerializeToString(deterministic=True))
    digest.update(device_config)
    return int.from_bytes(digest.digest()[:8], "big")


# ------------------------------------------------------------------------------ config
@dataclass(frozen=True)
class SwitchConfig:
    """Where a switch is and which program it must run.

    Attributes:
        name: unique name of the switch (logs, errors, SwitchFleet lookups).
        address: ``host:port`` of its P4Runtime server.
        p4info: the P4Info file (p4src/build/kvcast.p4info.txtpb).
        device_config: the target's program: a file (the BMv2 JSON; on Tofino the
            compiler's ``.conf``, packed for Stratum) or the bytes to push as they are; empty
            for the reference target.
        target: the kind of switch (:class:`controlplane.targets.Target`).
        device_id: P4Runtime device id.
        election_id: this controller's election id; the highest connected one is primary.
        reconnect_initial_s: first wait after a failed or lost connection.
        reconnect_max_s: the wait doubles after each failure up to this.
        ready_timeout_s: how long ``async with SwitchClient(...)`` waits for the first sync.
        packet_queue_size: PacketIns buffered before finsy drops them.
    """

    name: str
    address: str
    p4info: Path
    device_config: Path | bytes = b""
    target: Target = Target.BMV2
    device_id: int = 1
    election_id: int = 10
    reconnect_initial_s: float = 0.2
    reconnect_max_s: float = 10.0
    ready_timeout_s: float = 30.0
    packet_queue_size: int = 4096


class ConnectionState(enum.Enum):
    """The supervisor's view of one switch."""

    STOPPED = "stopped"
    CONNECTING = "connecting"
    SYNCING = "syncing"
    """Primary; the pipeline is being checked or pushed and drivers are re-installing."""
    READY = "ready"
    BACKUP = "backup"
    """Connected, but another controller is primary: reads only."""


@dataclass(frozen=True)
class SessionInfo:
    """What a driver learns when it is asked to re-install its state.

    Attributes:
        generation: 1 for the first session of this client, +1 for each later one.
        pipeline_pushed: the layer just installed the pipeline, so the switch's tables,
            groups, digest configs and registers are all empty (a new or restarted switch).
            False: the switch already ran this program and kept its state (a reconnect):
            reconcile against what it holds.
    """

    generation: int
    pipeline_pushed: bool


class Driver(Protocol):
    """A driver whose switch state the layer re-installs after every (re)connection."""

    async def reinstall(self, session: SessionInfo) -> None:
        """Makes the switch hold this driver's state again.

        Args:
            session: the new session (see :class:`SessionInfo`).
        """


# ------------------------------------------------------------------------------ errors
def _describe_update(update: Message, schema: fy.P4Schema) -> str:
    if not isinstance(update, p4r.Update):
        return type(update).__name__
    op = p4r.Update.Type.Name(update.type)
    try:
        ent = p4entity.decode_entity(update.entity, schema)
    except Exception:  # noqa: BLE001 - a description must never fail
        return f"{op} {update.entity.WhichOneof('entity')}"
    if isinstance(ent, fy.P4TableEntry):
        what = "default action" if ent.is_default_action else f"match {dict(ent.match or {})}"
        return f"{op} {ent.table_id} {what}"
    if isinstance(ent, fy.P4MulticastGroupEntry):
        return f"{op} multicast group {ent.multicast_group_id}"
    return f"{op} {type(ent).__name__}"


def _translate(
    exc: fy.P4ClientError, switch: str, what: str, schema: fy.P4Schema | None = None
) -> SwitchError:
    """A typed error for a failed P4Runtime call."""
    code = exc.code
    message = exc.message
    if code in _UNAVAILABLE:
        return SwitchUnavailableError(
            switch, f"{what} failed ({code.name}: {message}); the layer reconnects by itself"
        )
    if code == GRPCStatusCode.PERMISSION_DENIED:
        return NotPrimaryError(switch, f"{what} refused ({message}): another controller is primary")
    if exc.is_pipeline_missing:
        return SwitchUnavailableError(
            switch, f"{what}: the switch has no pipeline (restarted?); it is re-pushed on sync"
        )
    if what != "Write":
        return ReadError(switch, f"{what} failed ({code.name}): {message}")
    failures = [
        UpdateFailure(
            index=i,
            code=err.canonical_code.name,
            message=err.message,
            entity=_describe_update(err.subvalue, schema)
            if err.subvalue is not None and schema is not None
            else "?",
        )
        for i, err in sorted(exc.details.items())
    ]
    codes = {f.code for f in failures}
    if codes == {"ALREADY_EXISTS"}:
        return EntryExistsError(switch, "Write refused", code.name, failures)
    if codes == {"NOT_FOUND"}:
        return EntryNotFoundError(switch, "Write refused", code.name, failures)
    return WriteError(switch, f"Write failed ({code.name}: {message})", code.name, failures)


# ------------------------------------------------------------------------------ client
@dataclass
class _Subscribers:
    packets: list[PacketHandler] = field(default_factory=list)
    digests: dict[str, list[DigestHandler]] = field(default_factory=dict)
    lost: list[Callable[[], None]] = field(default_factory=list)


class SwitchClient:
    """One switch: a supervised finsy session, typed writes and reads, packet I/O, digests.

    Register the drivers (:meth:`add_driver`) and the PacketIn / digest handlers, then
    :meth:`start` (or ``async with``). The supervisor connects, arbitrates, makes sure the
    switch runs the pipeline, asks each driver (in registration order) to re-install, and then
    reports READY; it does this again after every lost connection, switch restart or promotion
    from backup to primary, with an exponential backoff between failed attempts.

    Writes while the switch is not connected raise :class:`SwitchUnavailableError` at once
    rather than queueing: the caller (a driver) keeps its desired state and the next sync
    re-installs it.

    Args:
        config: the switch.

    Raises:
        ConfigError: the P4Info or device config cannot be read.
    """

    def __init__(self, config: SwitchConfig) -> None:
        self._config = config
        raw = load_p4info(config.p4info)
        self._p4info = conform_p4info(raw)
        if isinstance(config.device_config, Path):
            self._device_config = device_config_for(config.target, config.device_config)
        else:
            self._device_config = bytes(config.device_config)
        self._cookie = pipeline_cookie(self._p4info, self._device_config)
        options = fy.SwitchOptions(
            device_id=config.device_id, initial_election_id=config.election_id
        )
        self._switch = fy.Switch(config.name, config.address, options)
        # No p4blob: finsy only reads the switch's pipeline; this layer decides about pushing.
        # The switch gets the compiler's P4Info; the schema the drivers name entities through
        # may differ in names only (Tofino's pipeline prefix), never in ids.
        self._switch.p4info.set_p4info(local_p4info(self._p4info, config.target))
        self._switch.ee.on(fy.SwitchEvent.CHANNEL_READY, self._on_channel_ready)
        self._switch.ee.on(fy.SwitchEvent.CHANNEL_DOWN, self._on_channel_down)
        self._switch.ee.on(fy.SwitchEvent.BECOME_BACKUP, self._on_become_backup)
        self._events: asyncio.Queue[str] = asyncio.Queue()
        self._drivers: list[Driver] = []
        self._subs = _Subscribers()
        self._state = ConnectionState.STOPPED
        self._ready = asyncio.Event()
        self._synced = asyncio.Condition()
        self._generation = 0
        self._synced_generation = 0
        self._pipeline_pushes = 0
        self._last_error: ControlPlaneError | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._readers: list[asyncio.Task[None]] = []
        self._stream_lock = asyncio.Lock()

    # ------------------------------------------------------------------ properties
    @property
    def name(self) -> str:
        """The switch's name."""
        return self._config.name

    @property
    def config(self) -> SwitchConfig:
        """The switch's configuration."""
        return self._config

    @property
    def schema(self) -> fy.P4Schema:
        """The P4Info as finsy indexes it (entities by name)."""
        return self._switch.p4info

    @property
    def p4info(self) -> p4i.P4Info:
        """The P4Info pushed to the switch (conformed, see :func:`conform_p4info`)."""
        return self._p4info

    @property
    def state(self) -> ConnectionState:
        """Where the supervisor is."""
        return self._state

    @property
    def generation(self) -> int:
        """Number of sessions that reached the driver re-install (0 before the first)."""
        return self._generation

    @property
    def synced_generation(self) -> int:
        """The last session whose driver re-install completed (0 before the first).

        It trails :attr:`generation` while a session re-installs: what was read of the drivers
        while the two differ may predate that session's adoption or reloads.
        """
        return self._synced_generation

    @property
    def pipeline_pushes(self) -> int:
        """How many times this client installed the pipeline."""
        return self._pipeline_pushes

    @property
    def last_error(self) -> ControlPlaneError | None:
        """Why the last connection attempt or session failed (None once READY)."""
        return self._last_error

    @property
    def is_ready(self) -> bool:
        """Connected, primary, pipeline installed and drivers re-installed."""
        return self._state is ConnectionState.READY

    # ------------------------------------------------------------------ registration
    def add_driver(self, driver: Driver) -> None:
        """Registers a driver to re-install after each (re)connection, in registration order.

        Raises:
            ConfigError: the client is already started (register drivers before start()).
        """
        if self._supervisor is not None:
            raise ConfigError(f"switch {self.name!r}: add drivers before start()")
        self._drivers.append(driver)

    def on_packet_in(self, handler: PacketHandler) -> Callable[[], None]:
        """Calls ``handler`` with every PacketIn (in the event loop; keep it short).

        Returns:
            A function that unsubscribes the handler.
        """
        self._subs.packets.append(handler)
        return lambda: self._subs.packets.remove(handler)

    def on_digest(self, digest: str, handler: DigestHandler) -> Callable[[], None]:
        """Calls ``handler`` with every DigestList of ``digest``; the layer acknowledges them.

        Args:
            digest: digest name in the P4Info, e.g. ``c.DIGEST_HOT_MISS_DIGEST_T``.
            handler: called in the event loop.

        Returns:
            A function that unsubscribes the handler.

        Raises:
            EncodingError: no such digest in the P4Info.
        """
        try:
            self.schema.digests[digest]
        except (KeyError, ValueError) as exc:
            raise EncodingError(f"no digest {digest!r} in the P4Info: {exc}") from exc
        handlers = self._subs.digests.setdefault(digest, [])
        if not handlers and self._supervisor is not None:
            self._readers.append(asyncio.create_task(self._read_digests(digest)))
        handlers.append(handler)
        return lambda: handlers.remove(handler)

    def on_session_lost(self, handler: Callable[[], None]) -> Callable[[], None]:
        """Calls ``handler`` when an established session's stream goes down.

        Called in the event loop (keep it short: schedule the work), each time a connection
        that had been up is lost (the switch died, restarted or became unreachable), never
        while the client stops. The next session's driver re-install says it is back.

        Returns:
            A function that unsubscribes the handler.
        """
        self._subs.lost.append(handler)
        return lambda: self._subs.lost.remove(handler)

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Starts the supervisor (returns at once; see :meth:`wait_ready`)."""
        if self._supervisor is not None:
            return
        self._readers = [asyncio.create_task(self._read_packets(), name=f"{self.name}-pkts")]
        self._readers += [
            asyncio.create_task(self._read_digests(d), name=f"{self.name}-{d}")
            for d in self._subs.digests
        ]
        self._supervisor = asyncio.create_task(self._supervise(), name=f"{self.name}-sup")
        # Let the readers register their finsy queues before anything can arrive.
        await asyncio.sleep(0)

    async def stop(self) -> None:
        """Closes the session and stops reconnecting."""
        tasks = [t for t in (self._supervisor, *self._readers) if t is not None]
        self._supervisor = None
        self._readers = []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._ready.clear()
        self._state = ConnectionState.STOPPED

    async def wait_ready(self, timeout: float | None = None) -> None:
        """Waits until the switch is READY.

        Args:
            timeout: seconds; None waits forever.

        Raises:
            SwitchUnavailableError: not READY in time (the message has the last error).
        """
        try:
            await asyncio.wait_for(self._ready.wait(), timeout)
        except TimeoutError:
            raise SwitchUnavailableError(
                self.name,
                f"not ready after {timeout} s at {self._config.address} "
                f"(state {self._state.value}; last error: {self._last_error})",
            ) from None

    async def wait_synced(self, after: int, timeout: float | None = None) -> int:
        """Waits until a session later than generation ``after`` is READY.

        Use it after provoking or expecting a reconnect: ``g = client.generation``, then
        ``await client.wait_synced(g)`` returns once the switch is re-synced.

        Args:
            after: a generation number previously read from :attr:`generation`.
            timeout: seconds; None waits forever.

        Returns:
            The new generation.

        Raises:
            SwitchUnavailableError: no such session in time.
        """

        def synced() -> bool:
            return self.is_ready and self._generation > after

        try:
            async with self._synced:
                await asyncio.wait_for(self._synced.wait_for(synced), timeout)
        except TimeoutError:
            raise SwitchUnavailableError(
                self.name,
                f"not re-synced after generation {after} within {timeout} s "
                f"(state {self._state.value}; last error: {self._last_error})",
            ) from None
        return self._generation

    async def __aenter__(self) -> SwitchClient:
        await self.start()
        try:
            await self.wait_ready(self._config.ready_timeout_s)
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    # ------------------------------------------------------------------ operations
    async def write(self, updates: Iterable[Any]) -> None:
        """Sends finsy updates (``+entry``, ``~entry``, ``-entry``) as one WriteRequest.

        Stream messages among them (PacketOut, DigestListAck) go out on the stream first.

        Args:
            updates: finsy entities marked with their update type.

        Raises:
            SwitchUnavailableError: not connected (nothing was sent).
            NotPrimaryError: this controller is a backup.
            EncodingError: a name or value that does not fit the P4Info.
            WriteError: the switch refused updates (``failures`` says which and why).
        """
        self._require_writer()
        batch = list(updates)
        try:
            if any(isinstance(u, _STREAM_MESSAGES) for u in batch):
                # grpc.aio allows one pending write per stream and finsy does not serialize
                # them: concurrent PacketOuts fail with "Internal error from Core".
                async with self._stream_lock:
                    await self._switch.write(batch)
            else:
                await self._switch.write(batch)
        except fy.P4ClientError as exc:
            raise _translate(exc, self.name, "Write", self.schema) from None
        except (ValueError, KeyError) as exc:
            raise EncodingError(f"switch {self.name!r}: cannot encode update: {exc}") from exc
        except AssertionError:  # finsy asserts its client is open: the session just ended
            raise SwitchUnavailableError(self.name, "session closed during Write") from None

    async def read(self, entities: Sequence[Any]) -> list[Any]:
        """Reads entities (wildcards allowed, as finsy builds them).

        Args:
            entities: finsy entities to read, e.g. ``fy.P4TableEntry(table)``.

        Returns:
            The decoded finsy entities.

        Raises:
            SwitchUnavailableError: not connected.
            EncodingError: a name that is not in the P4Info.
            ReadError: the switch refused the Read.
        """
        if self._state in (ConnectionState.STOPPED, ConnectionState.CONNECTING):
            raise self._unavailable()
        try:
            # finsy declares read()'s overloads as coroutines; the real method is an async
            # generator.
            reader: AsyncIterator[Any] = cast(Any, self._switch).read(entities)
            return [ent async for ent in reader]
        except fy.P4ClientError as exc:
            raise _translate(exc, self.name, "Read", self.schema) from None
        except (ValueError, KeyError) as exc:
            raise EncodingError(f"switch {self.name!r}: cannot encode read: {exc}") from exc
        except AssertionError:
            raise SwitchUnavailableError(self.name, "session closed during Read") from None

    async def packet_out(self, payload: bytes, **metadata: int) -> None:
        """Sends a PacketOut on the stream.

        Args:
            payload: the frame.
            **metadata: packet_out header fields by P4Info name (all of them).

        Raises:
            SwitchUnavailableError: not connected.
            NotPrimaryError: this controller is a backup (a switch ignores its PacketOuts).
            EncodingError: unknown or too wide metadata.
        """
        await self.write([fy.P4PacketOut(payload, **metadata)])

    # ------------------------------------------------------------------ internals
    def _unavailable(self) -> SwitchUnavailableError:
        why = f"; last error: {self._last_error}" if self._last_error else ""
        return SwitchUnavailableError(
            self.name,
            f"not connected to {self._config.address} (state {self._state.value}{why}); "
            "the layer reconnects by itself: wait_ready() and retry",
        )

    def _require_writer(self) -> None:
        if self._state is ConnectionState.BACKUP:
            raise NotPrimaryError(
                self.name,
                f"election id {self._switch.election_id} is a backup; primary is "
                f"{self._switch.primary_id}",
            )
        if self._state not in (ConnectionState.SYNCING, ConnectionState.READY):
            raise self._unavailable()

    def _on_channel_ready(self, _switch: fy.Switch) -> None:
        self._events.put_nowait("ready")

    def _on_channel_down(self, _switch: fy.Switch) -> None:
        self._ready.clear()
        if self._state is not ConnectionState.STOPPED:
            self._state = ConnectionState.CONNECTING
        self._events.put_nowait("down")
        if self._supervisor is not None:  # not stopping
            for handler in list(self._subs.lost):
                try:
                    handler()
                except Exception:
                    _LOG.exception("%s: session-lost handler failed", self.name)

    def _on_become_backup(self, _switch: fy.Switch) -> None:
        self._ready.clear()
        self._state = ConnectionState.BACKUP

    async def _supervise(self) -> None:
        delay = self._config.reconnect_initial_s
        while True:
            self._state = ConnectionState.CONNECTING
            while not self._events.empty():
                self._events.get_nowait()
            synced = False
            try:
                async with self._switch:
                    while (event := await self._events.get()) != "down":
                        if event == "ready" and self._switch.is_primary:
                            await self._sync()
                            synced = True
                        elif event == "ready":
                            self._ready.clear()
                            self._state = ConnectionState.BACKUP
            except ControlPlaneError as exc:
                self._last_error = exc
                _LOG.warning("%s: session failed: %s", self.name, exc)
            except Exception as exc:  # noqa: BLE001 - the supervisor must outlive any failure
                self._last_error = SwitchUnavailableError(
                    self.name, f"connection to {self._config.address} failed: {exc!r}"
                )
                # Connection failures are routine while a switch is down; anything else is a bug
                # worth a traceback.
                routine = isinstance(exc, fy.P4ClientError | OSError | ConnectionError)
                _LOG.log(
                    logging.INFO if routine else logging.WARNING,
                    "%s: %s",
                    self.name,
                    self._last_error,
                    exc_info=not routine,
                )
            self._ready.clear()
            self._state = ConnectionState.CONNECTING
            if synced:
                delay = self._config.reconnect_initial_s
            await asyncio.sleep(delay)
            delay = min(delay * 2, self._config.reconnect_max_s)

    async def _sync(self) -> None:
        self._ready.clear()
        self._state = ConnectionState.SYNCING
        pushed = await self._ensure_pipeline()
        self._generation += 1
        session = SessionInfo(self._generation, pushed)
        _LOG.info("%s: session %d (pipeline pushed: %s)", self.name, self._generation, pushed)
        for driver in self._drivers:
            await driver.reinstall(session)
        self._last_error = None
        self._synced_generation = self._generation
        self._state = ConnectionState.READY
        self._ready.set()
        async with self._synced:
            self._synced.notify_all()

    async def _ensure_pipeline(self) -> bool:
        """Pushes the pipeline unless the switch runs it already; returns whether it pushed."""
        # finsy has no public call for Get/SetForwardingPipelineConfig and does not say whether
        # it pushed; a short-lived finsy P4Client on its own channel does both.
        client = fy.P4Client(self._config.address, wait_for_ready=False)
        await client.open()
        try:
            try:
                reply = await client.request(
                    p4r.GetForwardingPipelineConfigRequest(
                        device_id=self._config.device_id,
                        response_type=p4r.GetForwardingPipelineConfigRequest.COOKIE_ONLY,
                    )
                )
                has_cookie = reply.config.HasField("cookie")
                current = reply.config.cookie.cookie if has_cookie else None
            except fy.P4ClientError as exc:
                if not exc.is_pipeline_missing:
                    raise _translate(exc, self.name, "GetForwardingPipelineConfig") from None
                current = None
            if current == self._cookie:
                return False
            request = p4r.SetForwardingPipelineConfigRequest(
                device_id=self._config.device_id,
                action=p4r.SetForwardingPipelineConfigRequest.VERIFY_AND_COMMIT,
                config=p4r.ForwardingPipelineConfig(
                    p4info=self._p4info,
                    p4_device_config=self._device_config,
                    cookie=p4r.ForwardingPipelineConfig.Cookie(cookie=self._cookie),
                ),
            )
            eid = self._switch.election_id
            request.election_id.high, request.election_id.low = eid >> 64, eid & (2**64 - 1)
            try:
                await client.request(request)
            except fy.P4ClientError as exc:
                if exc.code in _UNAVAILABLE or exc.code == GRPCStatusCode.PERMISSION_DENIED:
                    raise _translate(exc, self.name, "SetForwardingPipelineConfig") from None
                raise PipelineError(
                    self.name,
                    f"pipeline refused ({exc.code.name}: {exc.message}). Check that "
                    f"{self._config.p4info} and the device config belong to the program this "
                    "target runs (BMv2 needs p4src/build/kvcast.json; `make p4`)",
                ) from None
            self._pipeline_pushes += 1
            return True
        finally:
            await client.close()

    async def _read_packets(self) -> None:
        async for packet in self._switch.read_packets(queue_size=self._config.packet_queue_size):
            for handler in list(self._subs.packets):
                try:
                    handler(packet)
                except Exception:
                    _LOG.exception("%s: PacketIn handler failed", self.name)

    async def _read_digests(self, digest: str) -> None:
        async for digest_list in self._switch.read_digests(digest):
            for handler in list(self._subs.digests.get(digest, ())):
                try:
                    handler(digest_list)
                except Exception:
                    _LOG.exception("%s: digest handler failed", self.name)
            if self._state in (ConnectionState.SYNCING, ConnectionState.READY):
                try:
                    async with self._stream_lock:
                        await self._switch.write([digest_list.ack()])
                except (fy.P4ClientError, AssertionError) as exc:
                    _LOG.debug("%s: digest ack not sent: %r", self.name, exc)


# ------------------------------------------------------------------------------ fleet
class SwitchFleet:
    """Several switches in one process: started, stopped and awaited together.

    Each switch keeps its own supervisor, so one switch's failures never stall another's.

    Args:
        clients: the switches.

    Raises:
        ConfigError: two switches share a name.
    """

    def __init__(self, clients: Iterable[SwitchClient] = ()) -> None:
        self._clients: dict[str, SwitchClient] = {}
        self._running = False
        for client in clients:
            self._insert(client)

    def _insert(self, client: SwitchClient) -> None:
        if client.name in self._clients:
            raise ConfigError(f"two switches named {client.name!r}")
        self._clients[client.name] = client

    def __getitem__(self, name: str) -> SwitchClient:
        return self._clients[name]

    def __iter__(self) -> Iterator[SwitchClient]:
        return iter(list(self._clients.values()))

    def __len__(self) -> int:
        return len(self._clients)

    async def add(self, client: SwitchClient) -> None:
        """Adds a switch; starts it if the fleet is running.

        Raises:
            ConfigError: the name is taken.
        """
        self._insert(client)
        if self._running:
            await client.start()

    async def remove(self, name: str) -> SwitchClient:
        """Stops and removes a switch.

        Returns:
            The removed client.
        """
        client = self._clients.pop(name)
        await client.stop()
        return client

    async def start(self) -> None:
        """Starts every switch's supervisor."""
        self._running = True
        for client in self:
            await client.start()

    async def stop(self) -> None:
        """Stops every switch."""
        self._running = False
        await asyncio.gather(*(client.stop() for client in self))

    async def wait_ready(self, timeout: float | None = None) -> None:
        """Waits until every switch is READY.

        Raises:
            SwitchUnavailableError: one is not READY in time.
        """
        await asyncio.gather(*(client.wait_ready(timeout) for client in self))

    @contextlib.asynccontextmanager
    async def running(self, timeout: float | None = None) -> AsyncIterator[SwitchFleet]:
        """Starts the fleet, waits until every switch is READY, stops it on exit."""
        await self.start()
        try:
            await self.wait_ready(timeout)
            yield self
        finally:
            await self.stop()
