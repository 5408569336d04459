"""A pool node sends no more than a bounded window of fragments for one GET."""

from __future__ import annotations

from kvcast import p4constants as c
from kvcast.backend import InMemoryBackend
from kvcast.wire import KvpHeader, get_message
from poolnode.server import MAX_GET_FRAGMENTS, KvpGetHandler

TENANT, KEY = 3, 0xA3A3


def _handler(nfrags: int, limit: int = MAX_GET_FRAGMENTS) -> KvpGetHandler:
    backend = InMemoryBackend()
    backend.put(TENANT, KEY, bytes(nfrags * c.FRAG_BYTES))
    return KvpGetHandler(backend, max_get_fragments=limit)


def test_a_get_for_more_than_the_window_is_refused_and_counted() -> None:
    handler = _handler(MAX_GET_FRAGMENTS + 10)
    get = get_message(TENANT, KEY, 0, req_id=9, count=MAX_GET_FRAGMENTS + 1)
    replies = handler.handle(get)
    assert len(replies) == 1
    nack = KvpHeader.unpack(replies[0][0])
    assert (nack.op, nack.status, nack.req_id) == (c.KVP_OP_NACK, c.KVP_STATUS_BAD_REQUEST, 9)
    assert handler.stats.oversized_gets == 1 and handler.stats.data_sent == 0


def test_a_get_within_the_window_is_answered_in_full() -> None:
    handler = _handler(40, limit=32)
    replies = handler.handle(get_message(TENANT, KEY, 8, req_id=2, count=32))
    sent = sum(KvpHeader.unpack(h).payload_len for h, _ in replies)
    assert sent == 32 * c.FRAG_BYTES
    assert handler.stats.oversized_gets == 0
