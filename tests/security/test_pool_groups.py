"""A pool node serves only the groups it was told about, and (given a list) only the tenants a
GET's source address is bound to."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from http import HTTPStatus

import pytest

from controlplane.reports import HttpApi, Response
from kvcast import p4constants as c
from kvcast.backend import InMemoryBackend
from kvcast.wire import KvpHeader, get_message
from poolnode.__main__ import _parser, main
from poolnode.groups import ANY_GROUP, GroupRegistry, GroupSource, StaticGroups
from poolnode.server import KvpGetHandler, PoolServer
from poolnode.tenants import SourceTenants

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


def _handler(
    groups: GroupSource | None = None, tenants: SourceTenants | None = None
) -> KvpGetHandler:
    backend = InMemoryBackend()
    backend.put(TENANT, KEY, bytes(3 * c.FRAG_BYTES))
    return KvpGetHandler(backend, groups=groups, tenants=tenants)


_REQ_IDS = itertools.count(1)


def _answer(
    handler: KvpGetHandler, group: int, tenant: int = TENANT, source: int | None = None
) -> KvpHeader:
    """The first reply to a fresh GET (a new request id: no duplicate suppression)."""
    get = get_message(tenant, KEY, 0, req_id=next(_REQ_IDS), group=group, count=3)
    return KvpHeader.unpack(handler.handle(get, source)[0][0])


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


# ---------------------------------------------------------------------- secure defaults
def test_a_node_told_nothing_serves_no_group() -> None:
    handler = _handler()
    refused = _answer(handler, 5)
    assert (refused.op, refused.status) == (c.KVP_OP_NACK, c.KVP_STATUS_BAD_REQUEST)
    assert handler.stats.unknown_groups == 1
    assert _answer(handler, 0).op == c.KVP_OP_DATA  # unicast needs no group


def test_a_fixed_group_list_and_the_explicit_any_group() -> None:
    listed = _handler(StaticGroups([5, 7]))
    assert [_answer(listed, g).op for g in (5, 6, 7)] == [
        c.KVP_OP_DATA,
        c.KVP_OP_NACK,
        c.KVP_OP_DATA,
    ]
    assert _answer(_handler(ANY_GROUP), 6).op == c.KVP_OP_DATA


def test_the_command_line_refuses_groups_unless_told() -> None:
    args = _parser().parse_args([])
    assert (args.groups_url, args.group, args.any_group) == (None, None, False)
    with pytest.raises(SystemExit):  # one way of being told at a time
        _parser().parse_args(["--any-group", "--group", "5"])


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        ([], "no tenant policy"),
        (["--any-group"], "no tenant policy"),  # a group policy is not a tenant policy
        (["--any-tenant", "--source-tenants", "10.0.0.1=2"], "--any-tenant contradicts"),
    ],
)
def test_a_node_told_no_tenant_policy_does_not_start(
    argv: list[str], why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = _parser().parse_args([])
    assert (args.source_tenants, args.source_tenants_url, args.any_tenant) == ([], None, False)
    assert main(["--backend", "memory", "--port", "0", *argv]) == 2
    err = capsys.readouterr().err
    assert why in err
    if why == "no tenant policy":  # the refusal names every way of giving one
        for flag in ("--source-tenants-url", "--source-tenants", "--any-tenant"):
            assert flag in err


HOST_A, HOST_B, CONTROLLER = (int.from_bytes(bytes((10, 0, 0, i)), "big") for i in (1, 2, 254))


def test_a_get_naming_a_tenant_its_source_is_not_bound_to_is_refused() -> None:
    tenants = SourceTenants.parse([f"10.0.0.1={TENANT}", "10.0.0.2=3,4", "10.0.0.254=any"])
    handler = _handler(tenants=tenants)
    assert _answer(handler, 0, TENANT, HOST_A).op == c.KVP_OP_DATA
    refused = _answer(handler, 0, TENANT, HOST_B)  # host B asks for host A's tenant
    assert (refused.op, refused.status) == (c.KVP_OP_NACK, c.KVP_STATUS_BAD_REQUEST)
    assert handler.stats.bad_tenants == 1
    assert _answer(handler, 0, TENANT, CONTROLLER).op == c.KVP_OP_DATA  # "any": the controller
    stranger = int.from_bytes(bytes((10, 0, 0, 99)), "big")
    assert _answer(handler, 0, TENANT, stranger).op == c.KVP_OP_NACK
    assert _answer(handler, 0, TENANT, None).op == c.KVP_OP_NACK  # no address: no vouching
    assert handler.stats.unknown_sources == 2


@pytest.mark.parametrize("bad", ["10.0.0.1", "10.0.0.1=", "10.0.0.1=70000", "nowhere=1"])
def test_source_tenant_specs_are_checked(bad: str) -> None:
    with pytest.raises(ValueError):
        SourceTenants.parse([bad])


def test_the_server_checks_the_tenant_of_the_address_a_get_came_from() -> None:
    import socket

    backend = InMemoryBackend()
    backend.put(TENANT, KEY, bytes(c.FRAG_BYTES))
    backend.put(TENANT + 1, KEY, bytes(c.FRAG_BYTES))
    tenants = SourceTenants.parse([f"127.0.0.1={TENANT}"])
    with (
        PoolServer(backend, "127.0.0.1", 0, cache_bytes=0, tenants=tenants) as srv,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client,
    ):
        client.bind(("127.0.0.1", 0))
        client.settimeout(5)
        replies = []
        for tenant in (TENANT, TENANT + 1):
            client.sendto(get_message(tenant, KEY, 0, req_id=next(_REQ_IDS)), srv.address)
            replies.append(KvpHeader.unpack(client.recv(65536)))
    assert [(r.op, r.tenant) for r in replies] == [
        (c.KVP_OP_DATA, TENANT),
        (c.KVP_OP_NACK, TENANT + 1),
    ]
    assert srv.stats.bad_tenants == 1


class _Sources:
    """Serves ``/v1/sources`` with the document the test sets."""

    def __init__(self, doc: object) -> None:
        self.doc = doc
        self.api = HttpApi("127.0.0.1", 0, {("GET", "/v1/sources"): self._get}, name="t")

    def _get(self, _body: bytes) -> Response:
        return Response.json(HTTPStatus.OK, self.doc)  # type: ignore[arg-type]

    @property
    def url(self) -> str:
        host, port = self.api.address
        return f"http://{host}:{port}/v1/sources"


def test_the_bindings_read_from_the_controller_refuse_another_tenant() -> None:
    sources = _Sources({"sources": {"10.0.0.1": [TENANT], "10.0.0.2": [3, 4]}})
    sources.api.start()
    try:
        served = SourceTenants.fetch(sources.url)
    finally:
        sources.api.stop()
    # The controller reads chunks from its own address: added by hand (--source-tenants).
    handler = _handler(tenants=served.merged(SourceTenants.parse(["10.0.0.254=any"])))
    assert _answer(handler, 0, TENANT, HOST_A).op == c.KVP_OP_DATA
    assert _answer(handler, 0, TENANT, HOST_B).op == c.KVP_OP_NACK
    assert _answer(handler, 0, TENANT, CONTROLLER).op == c.KVP_OP_DATA  # "any"
    assert handler.stats.bad_tenants == 1


@pytest.mark.parametrize(
    "doc",
    [{}, {"sources": []}, {"sources": {"10.0.0.1": []}}, {"sources": {"10.0.0.1": [1 << 16]}},
     {"sources": {"10.0.0.1": "all"}}, {"sources": {"nowhere": [1]}}],
)  # fmt: skip
def test_a_bad_sources_document_is_refused(doc: object) -> None:
    sources = _Sources(doc)
    sources.api.start()
    try:
        with pytest.raises(ValueError):
            SourceTenants.fetch(sources.url)
    finally:
        sources.api.stop()


def test_a_node_that_cannot_read_its_bindings_does_not_start() -> None:
    sources = _Sources({})
    sources.api.start()
    dead = sources.url
    sources.api.stop()  # nothing listens there any more
    argv = ["--backend", "memory", "--port", "0", "--source-tenants-url", dead]
    assert main(argv) == 2


def _listening(*args: str) -> tuple[str, str]:
    """A pool node's ``listening`` line and what it logged before it, then the node killed."""
    import subprocess
    import sys

    argv = [sys.executable, "-m", "poolnode", "--backend", "memory", "--host", "127.0.0.1"]
    with subprocess.Popen(
        [*argv, "--port", "0", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        line = next((x for x in proc.stdout if x.startswith("poolnode listening")), "")
        proc.kill()
        return line, proc.stderr.read()


def test_a_node_says_which_checks_it_makes_and_warns_when_it_checks_no_tenant() -> None:
    line, log = _listening("--any-tenant")
    assert line.rstrip().endswith("groups=none tenants=any")
    assert "--any-tenant: no tenant check here" in log
    line, log = _listening("--group", "5", "--source-tenants", "127.0.0.1=any")
    assert line.rstrip().endswith("groups=list tenants=list")
    assert "no tenant check here" not in log
    line, log = _listening()  # told nothing about tenants: no listening line, the reason
    assert line == "" and "no tenant policy" in log
