"""The agent trusts only its paths and the pool nodes it was given, and only answers to its GETs.

Each test plays a hostile host that reaches the agent's socket directly (as it could on a
fabric that does not filter, or through a switch without source binding) and checks that
nothing it sends reaches the tensor: the fetch ends with the producer's bytes, and the report
counts what was dropped. The last plays it with the reference switch (``RefSwitchBridge``) in
the path: forged replicas sent through the switch from a member's host port and around it,
straight to a default follower.
"""

from __future__ import annotations

import os
import socket
from typing import Any

import pytest
import torch

from hostagent.fetch import FetchClient
from kvcast import p4constants as c
from kvcast.backend import InMemoryBackend
from kvcast.wire import KvpHeader, data_message, nack_message
from poolnode.server import PoolServer
from tests.conftest import backend_holding
from tests.hostagent.fakes import FakeServer, pool
from tests.hostagent.refbridge import RefSwitchBridge

# Each test runs on the native data path and on the pure-Python one.
pytestmark = pytest.mark.usefixtures("data_path")

TENANT, KEY, GROUP = 4, 0x5EC0DE5EC0DE5EC0, 12
NFRAGS = 9
CHUNK = os.urandom(NFRAGS * c.FRAG_BYTES - 31)
TIMING: dict[str, Any] = {
    "timeout_s": 0.05,
    "max_timeout_s": 0.2,
    "max_retries": 3,
    "deadline_s": 10.0,
}


@pytest.fixture
def backend() -> InMemoryBackend:
    return backend_holding(TENANT, {KEY: CHUNK})


def _attacker(addr: tuple[str, int] = ("127.0.0.1", 0)) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(addr)
    return s


# A hostile host that sends from the KVP port: once a credential, now nothing (issue 27).
KVP_SOURCE = ("127.0.0.9", c.KVP_UDP_PORT)


def _forged_fragments(group: int, flags: int) -> list[bytes]:
    """Every fragment of the chunk with the wrong bytes and a CRC that matches them."""
    evil = bytes(len(CHUNK))
    out = []
    for i in range(NFRAGS):
        lo, hi = i * c.FRAG_BYTES, min((i + 1) * c.FRAG_BYTES, len(CHUNK))
        out.append(
            data_message(TENANT, KEY, i, NFRAGS, evil[lo:hi], group=group, flags=flags, req_id=1)
        )
    return out


# A host's own address, or the KVP source port on an address the agent was not given as a pool
# node (what a pool node's answer comes from): neither makes a datagram trusted.
SOURCES = pytest.mark.parametrize(
    "source", [("127.0.0.1", 0), KVP_SOURCE], ids=["host-port", "kvp-source-port"]
)


@SOURCES
def test_forged_replicas_never_reach_a_default_follower(
    pool_server: PoolServer, source: tuple[str, int]
) -> None:
    with (
        FetchClient(pool_server.address, group=GROUP, **TIMING) as victim,
        _attacker(source) as evil,
    ):
        for msg in _forged_fragments(GROUP, c.KVP_FLAG_REPLICA | c.KVP_FLAG_HIT):
            evil.sendto(msg, victim.address)
        out = torch.zeros(len(CHUNK), dtype=torch.uint8)
        report = victim.follow(TENANT, KEY, out, stall_s=0.1)
    assert report.ok
    assert report.foreign == NFRAGS and report.frags_stream == 0
    assert out.numpy().tobytes() == CHUNK


@SOURCES
def test_a_forged_nack_naming_the_next_request_is_dropped(
    pool_server: PoolServer, source: tuple[str, int]
) -> None:
    with FetchClient(pool_server.address, **TIMING) as victim, _attacker(source) as evil:
        # The worst case: the attacker knows the request id the victim will use next.
        rid = victim._next_req
        get = KvpHeader(c.KVP_OP_GET, tenant=TENANT, key=KEY, req_id=rid)
        for status in (c.KVP_STATUS_NOT_FOUND, c.KVP_STATUS_BAD_REQUEST):
            evil.sendto(nack_message(get, status), victim.address)
        out = torch.zeros(len(CHUNK), dtype=torch.uint8)
        report = victim.fetch(TENANT, KEY, out)
    assert report.ok and not report.fell_back
    assert report.nacks == 0 and report.foreign == 2
    assert out.numpy().tobytes() == CHUNK


class _OutOfRange:
    """The pool, but the first answer carries the fragments after the ones asked for."""

    def __init__(self, backend: InMemoryBackend, *, wrong_group: bool = False) -> None:
        self.inner = pool(backend)
        self.wrong_group = wrong_group
        self.done = False

    def __call__(self, datagram: bytes) -> list[bytes]:
        hdr = KvpHeader.unpack(datagram)
        if self.done or hdr.op != c.KVP_OP_GET:
            return self.inner(datagram)
        self.done = True
        if self.wrong_group:  # the range asked for, under a group the GET did not name
            first, count, group = hdr.frag_idx, hdr.frag_count, GROUP + 1
        else:  # the fragment right after the range asked for
            first, count, group = hdr.frag_idx + hdr.frag_count, 1, 0
        shifted = KvpHeader(
            c.KVP_OP_GET,
            tenant=TENANT,
            key=KEY,
            req_id=hdr.req_id,
            group=group,
            frag_idx=first,
            frag_count=count,
        )
        return self.inner(shifted.pack() + bytes(c.FRAG_BYTES))


@pytest.mark.parametrize("wrong_group", [False, True], ids=["range", "group"])
def test_an_answer_outside_the_request_is_invalid(
    backend: InMemoryBackend, wrong_group: bool
) -> None:
    with (
        FakeServer(_OutOfRange(backend, wrong_group=wrong_group)) as srv,
        FetchClient(srv.address, frags_per_get=2, **TIMING) as client,
    ):
        out = torch.zeros(len(CHUNK), dtype=torch.uint8)
        report = client.fetch(TENANT, KEY, out)
    assert report.ok
    assert report.invalid == 1
    assert out.numpy().tobytes() == CHUNK


def test_a_pool_node_the_agent_was_given_is_trusted(backend: InMemoryBackend) -> None:
    """The counterpart: replicas from a listed pool node's address are taken."""
    with (
        FetchClient(("127.0.0.1", 9), group=GROUP, pool_addrs=[KVP_SOURCE], **TIMING) as follower,
        _attacker(KVP_SOURCE) as listed_pool,
    ):
        true = [
            data_message(
                TENANT,
                KEY,
                i,
                NFRAGS,
                CHUNK[i * c.FRAG_BYTES : (i + 1) * c.FRAG_BYTES],
                group=GROUP,
                flags=c.KVP_FLAG_REPLICA,
                req_id=1,
            )
            for i in range(NFRAGS)
        ]
        for msg in true:
            listed_pool.sendto(msg, follower.address)
        out = torch.zeros(len(CHUNK), dtype=torch.uint8)
        report = follower.follow(TENANT, KEY, out, stall_s=0.5)
    assert report.ok and report.foreign == 0 and report.frags_stream == NFRAGS
    assert out.numpy().tobytes() == CHUNK


@pytest.mark.parametrize("source", [("127.0.0.1", 0), KVP_SOURCE], ids=["ephemeral", "kvp_port"])
def test_forged_replicas_through_the_reference_switch_or_around_it_never_reach_a_follower(
    pool_server: PoolServer, source: tuple[str, int]
) -> None:
    """A default follower (trusting only the switch) takes no forged replica from a member."""
    with (
        RefSwitchBridge(pool_server.address) as bridge,
        FetchClient(bridge.vip, group=GROUP, **TIMING) as victim,
        _attacker(source) as evil,
    ):
        member = bridge.register(evil.getsockname())
        bridge.add_group(GROUP, [bridge.register(victim.address), member])
        for msg in _forged_fragments(GROUP, c.KVP_FLAG_REPLICA | c.KVP_FLAG_HIT):
            evil.sendto(msg, bridge.vip)  # through the switch, from the member's host port
            evil.sendto(msg, victim.address)  # around it
        out = torch.zeros(len(CHUNK), dtype=torch.uint8)
        # No leader: the follower stalls, then repairs through the switch from the pool.
        report = victim.follow(TENANT, KEY, out, stall_s=0.1)
        with bridge.lock:
            drops = bridge.target.state.counter_values(c.COUNTER_INGRESS_STATS_DROP_COUNTER)
    assert report.ok
    assert report.frags_stream == 0 and report.foreign == NFRAGS
    assert out.numpy().tobytes() == CHUNK
    # The switch refused every forged DATA from the host port: nothing was replicated.
    assert drops[c.DROP_UNAUTHORIZED][0] == NFRAGS
