"""A pool node given the controller's groups refuses a GET naming any other group."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from http import HTTPStatus

import pytest

from controlplane.reports import HttpApi, Response
from kvcast import p4constants as c
from kvcast.wire import KvpHeader, get_message
from poolnode.backend import InMemoryBackend
from poolnode.groups import GroupRegistry
from poolnode.server import KvpGetHandler

TENANT, KEY = 2, 0x6060


class _Controller:
    """Serves ``/v1/groups/s1`` from a set the test changes."""

    def __init__(self) -> None:
        self.groups: set[int] = set()
        self.api = HttpApi("127.0.0.1", 0, {("GET", "/v1/groups/s1"): self._get}, name="t")

    def _get(self, _body: bytes) -> Response:
        return Response.json(HTTPStatus.OK, {"switch": "s1", "groups": sorted(self.groups)})

    @property
    def url(self) -> str:
        host, port = self.api.address
        return f"http://{host}:{port}/v1/groups/s1"


@pytest.fixture
def controller() -> Iterator[_Controller]:
    ctl = _Controller()
    ctl.api.start()
    try:
        yield ctl
    finally:
        ctl.api.stop()


def _handler(groups: GroupRegistry) -> KvpGetHandler:
    backend = InMemoryBackend()
    backend.put(TENANT, KEY, bytes(3 * c.FRAG_BYTES))
    return KvpGetHandler(backend, groups=groups)


_REQ_IDS = itertools.count(1)


def _answer(handler: KvpGetHandler, group: int) -> KvpHeader:
    """The first reply to a fresh GET (a new request id: no duplicate suppression)."""
    get = get_message(TENANT, KEY, 0, req_id=next(_REQ_IDS), group=group, count=3)
    return KvpHeader.unpack(handler.handle(get)[0][0])


def test_known_groups_are_served_and_unknown_ones_refused(controller: _Controller) -> None:
    controller.groups = {5}
    registry = GroupRegistry(controller.url, min_refresh_s=0.0).start()
    try:
        handler = _handler(registry)
        served = _answer(handler, 5)
        assert (served.op, served.group) == (c.KVP_OP_DATA, 5)
        refused = _answer(handler, 6)
        assert (refused.op, refused.status) == (c.KVP_OP_NACK, c.KVP_STATUS_BAD_REQUEST)
        assert handler.stats.unknown_groups == 1
        # A group the controller made since: found by the read on demand, not refused.
        controller.groups.add(6)
        assert _answer(handler, 6).op == c.KVP_OP_DATA
        # Unicast GETs need no group.
        assert _answer(handler, 0).op == c.KVP_OP_DATA
    finally:
        registry.stop()


def test_without_the_controller_no_group_is_served(controller: _Controller) -> None:
    url = controller.url
    controller.api.stop()
    registry = GroupRegistry(url, timeout_s=0.5, min_refresh_s=0.0)
    handler = _handler(registry)
    assert _answer(handler, 5).op == c.KVP_OP_NACK  # fail closed
    assert registry.read_errors >= 1 and handler.stats.unknown_groups == 1
