"""vLLM's KV cache events into the controller's reports: what each engine holds, without an agent.

A vLLM engine started with ``--kv-events-config '{"enable_kv_cache_events": true, "publisher":
"zmq", "endpoint": "tcp://*:5557"}'`` publishes, every step, a ``KVEventBatch`` of the blocks its
prefix cache stored (``BlockStored``) and dropped (``BlockRemoved``, ``AllBlocksCleared``): over
ZMQ PUB, three frames per message (topic, 8-byte big-endian sequence number, msgpack payload).
The engine binds the endpoint when it contains ``*`` and connects to it otherwise, so this
subscriber connects or binds the other way round.

``EventTranslator`` turns the events into the controller's records (``kvcast.reports``):

* ``BlockStored`` (GPU medium): one ``access`` record per block, ``hit`` unknown (the engine
  computed the block or loaded it), with its parent and its position in the prefix chain (the
  parent's plus one; a block without a parent is position 0). The key is the low 64 bits of
  vLLM's block hash (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``, the default, sends exactly that;
  raw hashes are cut the same way). The tenant is the one configured for the request's
  ``cache_salt`` (the first block's extra key in the event), inherited by the blocks chained on it.
* ``BlockRemoved`` and ``AllBlocksCleared`` update ``resident``, the blocks the engine holds now.
  The controller's report API has no record for "an engine dropped a block" yet, so residency
  stays here (``resident``, ``EventStats``) rather than being sent.

Events of other media (a CPU offload tier) are counted and skipped. A gap in the sequence numbers
(the engine's high-water mark dropped messages) is counted in ``missed``; replay through the
engine's ``replay_endpoint`` is not implemented.

Classes:
    EventStats: what the translator and subscriber saw.
    EventTranslator: KV event batches -> access records, and the residency set.
    KvEventSubscriber: a ZMQ SUB socket and a thread that feeds a translator.

Functions:
    main: ``python -m hostagent.vllm_events``: subscribe and post to the controller.
"""

from __future__ import annotations

import argparse
import json
import logging
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import msgspec
import zmq
from vllm.distributed.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
)

from hostagent.chunkkeys import WIRE_KEY_MASK, wire_key
from hostagent.layout import KVLayout
from kvcast.reports import AccessReport, HttpReporter, ReportSink

__all__ = ["EventStats", "EventTranslator", "KvEventSubscriber", "main"]

_LOG = logging.getLogger(__name__)

MEDIUM_GPU = "GPU"
MAX_TRACKED = 1 << 20
"""Blocks whose tenant and position are remembered for their children (oldest forgotten)."""


def block_key(block_hash: int | bytes) -> int:
    """The 64-bit chunk key of a block hash as an event carries it (an int or the raw bytes)."""
    if isinstance(block_hash, bytes):
        return wire_key(block_hash)
    return int(block_hash) & WIRE_KEY_MASK


@dataclass(slots=True)
class EventStats:
    """Counters of one translator (and its subscriber).

    Attributes:
        batches: event batches handled.
        stored: blocks stored (records made).
        removed: blocks removed.
        cleared: ``AllBlocksCleared`` events.
        other_medium: events of another medium than the GPU, skipped.
        missed: batches lost, by gaps in the sequence numbers.
        undecodable: messages that were not a KV event batch.
    """

    batches: int = 0
    stored: int = 0
    removed: int = 0
    cleared: int = 0
    other_medium: int = 0
    missed: int = 0
    undecodable: int = 0

    def as_dict(self) -> dict[str, int]:
        """The counters by name."""
        return asdict(self)


class EventTranslator:
    """KV event batches -> access records for the controller; the set of resident blocks.

    Args:
        sink: where the records go (``HttpReporter`` to the controller).
        host: the engine's name in the records (as the controller's configuration names it).
        chunk_bytes: bytes of one block's KV (``KVLayout.chunk_bytes``): the records' ``size``.
        tenant: tenant id of requests without a cache salt.
        tenants: tenant id per ``cache_salt``; a salt not listed uses ``tenant``.
    """

    def __init__(
        self,
        sink: ReportSink,
        host: str | int,
        chunk_bytes: int,
        tenant: int = 0,
        tenants: Mapping[str, int] | None = None,
    ) -> None:
        if chunk_bytes <= 0:
            raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
        self.sink = sink
        self.host = host
        self.chunk_bytes = chunk_bytes
        self.tenant = tenant
        self.tenants = dict(tenants or {})
        self.stats = EventStats()
        self.resident: set[int] = set()
        """Keys of the blocks the engine's GPU prefix cache holds now."""
        self._chain: OrderedDict[int, tuple[int, int]] = OrderedDict()

    def _salt(self, event: BlockStored) -> str | None:
        if not event.extra_keys or not event.extra_keys[0]:
            return None
        keys = list(event.extra_keys[0])
        if event.lora_name and keys and keys[0] == event.lora_name:
            keys = keys[1:]
        return next((k for k in keys if isinstance(k, str)), None)

    def handle(self, batch: KVEventBatch) -> list[AccessReport]:
        """Translates one batch and hands its records to the sink.

        Args:
            batch: a decoded ``KVEventBatch``.

        Returns:
            The records made (already submitted).
        """
        self.stats.batches += 1
        entries: list[AccessReport] = []
        for event in batch.events:
            if isinstance(event, AllBlocksCleared):
                self.stats.cleared += 1
                self.resident.clear()
            elif getattr(event, "medium", None) not in (None, MEDIUM_GPU):
                self.stats.other_medium += 1
            elif isinstance(event, BlockStored):
                entries.extend(self._stored(event, batch.ts))
            elif isinstance(event, BlockRemoved):
                for h in event.block_hashes:
                    self.resident.discard(block_key(h))
                    self.stats.removed += 1
        if entries:
            self.sink.submit(entries)
        return entries

    def _stored(self, event: BlockStored, ts: float) -> list[AccessReport]:
        parent = None if event.parent_block_hash is None else block_key(event.parent_block_hash)
        if parent is None:
            salt = self._salt(event)
            tenant = self.tenants.get(salt, self.tenant) if salt else self.tenant
            position = 0
        elif parent in self._chain:
            tenant, parent_pos = self._chain[parent]
            position = parent_pos + 1 if parent_pos >= 0 else -1
        else:  # a parent stored before we subscribed: tenant and position unknown
            tenant, position = self.tenant, -1
        out = []
        for h in event.block_hashes:
            key = block_key(h)
            out.append(
                AccessReport(
                    tenant=tenant,
                    key=key,
                    size=self.chunk_bytes,
                    host=self.host,
                    time=ts,
                    parent=parent,
                    position=position if position >= 0 else None,
                )
            )
            self._chain[key] = (tenant, position)
            self._chain.move_to_end(key)
            if len(self._chain) > MAX_TRACKED:
                self._chain.popitem(last=False)
            self.resident.add(key)
            self.stats.stored += 1
            parent = key
            position = position + 1 if position >= 0 else -1
        return out


class KvEventSubscriber:
    """Subscribes to one engine's KV events and feeds them to a translator, in a thread.

    Args:
        endpoint: the engine's ``kv_events_config.endpoint`` as seen from here; with ``bind``
            this side binds it (the engine was given a ``tcp://host:port`` to connect to).
        translator: what turns the batches into records.
        topic: the engine's ``kv_events_config.topic``.
        bind: bind instead of connecting (see above).
    """

    def __init__(
        self, endpoint: str, translator: EventTranslator, topic: str = "", bind: bool = False
    ) -> None:
        self.translator = translator
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.SUB)
        self._sock.setsockopt(zmq.SUBSCRIBE, topic.encode("utf-8"))
        if bind:
            self._sock.bind(endpoint)
        else:
            self._sock.connect(endpoint)
        self._decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        self._next_seq: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def stats(self) -> EventStats:
        """The translator's counters."""
        return self.translator.stats

    def poll(self, timeout_s: float) -> int:
        """Handles every message that arrives within ``timeout_s``; returns how many."""
        handled = 0
        deadline = time.monotonic() + timeout_s
        while True:
            wait_ms = max(0, int((deadline - time.monotonic()) * 1000))
            if not self._sock.poll(wait_ms):
                return handled
            self._receive(self._sock.recv_multipart())
            handled += 1

    def _receive(self, frames: Sequence[bytes]) -> None:
        stats = self.translator.stats
        if len(frames) != 3 or len(frames[1]) != 8:
            stats.undecodable += 1
            return
        seq = int.from_bytes(frames[1], "big")
        if self._next_seq is not None and seq > self._next_seq:
            stats.missed += seq - self._next_seq
        self._next_seq = seq + 1
        try:
            batch = self._decoder.decode(frames[2])
        except msgspec.DecodeError:
            stats.undecodable += 1
            return
        self.translator.handle(batch)

    def start(self) -> KvEventSubscriber:
        """Runs ``poll`` in a daemon thread until ``close``."""
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll(0.1)
            except zmq.ZMQError as exc:
                if not self._stop.is_set():
                    _LOG.warning("kv events: %s", exc)
                return

    def close(self) -> None:
        """Stops the thread and closes the socket."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        self._sock.close(linger=0)
        self._ctx.term()

    def __enter__(self) -> KvEventSubscriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m hostagent.vllm_events", description=__doc__.splitlines()[0]
    )
    p.add_argument("--endpoint", required=True, help="the engine's KV event endpoint")
    p.add_argument("--bind", action="store_true", help="bind the endpoint (engine connects)")
    p.add_argument("--topic", default="")
    p.add_argument("--report-url", required=True, help="controller API, http://IP:PORT")
    p.add_argument("--model-config", required=True, help="the model's config.json (KV size)")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--kv-dtype", default="", help="KV dtype (default: the config's)")
    p.add_argument("--host", default=socket.gethostname(), help="the engine's name")
    p.add_argument("--tenant", type=int, default=0)
    p.add_argument("--tenants", default="{}", help='JSON {"cache_salt": tenant id}')
    p.add_argument("--stats-every", type=float, default=10.0, help="log counters every S s")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Subscribes to an engine's KV events and posts the records to the controller.

    Returns:
        0 after an interrupt.
    """
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    with open(args.model_config, encoding="utf-8") as f:
        config: dict[str, Any] = json.load(f)
    layout = KVLayout.from_hf_config(config, args.block_size, args.kv_dtype)
    reporter = HttpReporter(args.report_url)
    translator = EventTranslator(
        reporter, args.host, layout.chunk_bytes, args.tenant, json.loads(args.tenants)
    )
    with KvEventSubscriber(args.endpoint, translator, args.topic, args.bind) as sub:
        try:
            while True:
                sub.poll(args.stats_every)
                _LOG.info("kv events %s reports %s", sub.stats.as_dict(), reporter.stats())
        except KeyboardInterrupt:
            pass
    reporter.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
