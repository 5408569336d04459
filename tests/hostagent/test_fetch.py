"""The fetch client against the real pool-node server and fake peers on loopback."""

from __future__ import annotations

import os
import socket
import time
from typing import Any

import pytest
import torch

from hostagent.fetch import FetchClient
from hostagent.layout import KVLayout
from kvcast import p4constants as c
from kvcast.backend import InMemoryBackend
from kvcast.fetch import Address, FetchError, FetchOutcome, FetchReport, RecomputeReason
from kvcast.wire import KvpHeader, nack_message
from poolnode.server import PoolServer
from tests.conftest import backend_holding
from tests.hostagent.fakes import (
    Corrupting,
    Dropping,
    DuplicatingReordering,
    FakeServer,
    Mislabelling,
    Partial,
    Replicating,
    Stalling,
    Switch,
    pool,
    silent,
)

# Each test runs on the native data path and on the pure-Python one.
pytestmark = pytest.mark.usefixtures("data_path")

TENANT, KEY = 3, 0x0123456789ABCDEF
NFRAGS = 23
CHUNK = os.urandom(NFRAGS * c.FRAG_BYTES - 77)
# FAST gives up within about 0.15 s (tests of failure paths and fallbacks); STEADY's first timeout
# is long enough that a loaded machine causes no spurious retry (tests that expect one path to
# succeed, or that count exactly).
FAST: dict[str, Any] = {
    "timeout_s": 0.02,
    "max_timeout_s": 0.08,
    "max_retries": 2,
    "deadline_s": 5.0,
}
STEADY: dict[str, Any] = {
    "timeout_s": 0.2,
    "max_timeout_s": 0.4,
    "max_retries": 2,
    "deadline_s": 10.0,
}
# STEADY without tail probes (they could fire on a loaded machine): a lost GET is sent again only
# once later GETs are answered (fast retransmit) or when it times out.
NO_PROBE = {**STEADY, "tail_probe_min_s": 0.2}


def make_client(
    service: Address | None,
    pool_addr: Address | None = None,
    timing: dict[str, float] = FAST,
    group: int = 0,
    pool_addrs: tuple[Address, ...] = (),
) -> FetchClient:
    return FetchClient(
        service,
        pool_addr,
        pool_addrs=pool_addrs,
        timeout_s=timing["timeout_s"],
        max_timeout_s=timing["max_timeout_s"],
        max_retries=int(timing["max_retries"]),
        deadline_s=timing["deadline_s"],
        tail_probe_min_s=timing.get("tail_probe_min_s", 0.2),
        group=group,
    )


@pytest.fixture
def backend() -> InMemoryBackend:
    return backend_holding(TENANT, {KEY: CHUNK})


def dst() -> torch.Tensor:
    return torch.zeros(len(CHUNK), dtype=torch.uint8)


def as_bytes(t: torch.Tensor) -> bytes:
    return t.numpy().tobytes()


def test_the_client_uses_the_selected_data_path(pool_server: PoolServer, data_path: str) -> None:
    with make_client(pool_server.address) as client:
        assert client.data_path == data_path
        assert client.fetch(TENANT, KEY, dst()).ok


def test_complete_fetch_from_the_pool_server(pool_server: PoolServer) -> None:
    out = dst()
    with make_client(pool_server.address, timing=STEADY) as client:
        report = client.fetch(TENANT, KEY, out)
    assert report.ok
    assert as_bytes(out) == CHUNK
    assert (report.frags_pool, report.frags_hit, report.retries) == (NFRAGS, 0, 0)
    assert report.nbytes == len(CHUNK)


def test_fetch_block_fills_the_layout_view(backend: InMemoryBackend) -> None:
    layout = KVLayout(2, 2, 16, torch.bfloat16, block_size=8)
    kv = torch.randn(layout.shape).to(torch.bfloat16)
    backend.put(TENANT, 77, layout.as_bytes(kv).numpy().tobytes())
    chunk = layout.alloc_chunk(pin=False)
    with (
        PoolServer(backend, "127.0.0.1", 0) as srv,
        make_client(srv.address, timing=STEADY) as client,
    ):
        report = client.fetch_block(TENANT, 77, layout, chunk)
    assert report.ok
    assert torch.equal(layout.view(chunk), kv)


def test_not_found_through_the_switch_falls_back_to_the_pool(backend: InMemoryBackend) -> None:
    with (
        FakeServer(pool(InMemoryBackend())) as service,
        FakeServer(pool(backend)) as direct,
        make_client(service.address, direct.address) as client,
    ):
        out = dst()
        report = client.fetch(TENANT, KEY, out)
    assert report.ok and report.fell_back
    assert report.nacks >= 1
    assert as_bytes(out) == CHUNK


def test_not_found_everywhere_is_recompute(pool_server: PoolServer) -> None:
    with make_client(pool_server.address, pool_server.address) as client:
        report = client.fetch(TENANT, KEY + 1, dst())
    assert report.outcome is FetchOutcome.RECOMPUTE
    assert report.reason is RecomputeReason.NOT_FOUND
    assert report.fell_back and not report.ok


def test_silent_service_times_out_then_falls_back(pool_server: PoolServer) -> None:
    with (
        FakeServer(silent) as service,
        make_client(service.address, pool_server.address) as client,
    ):
        out = dst()
        report = client.fetch(TENANT, KEY, out)
    assert report.ok and report.fell_back
    assert report.timeouts > 0 and report.retries > 0
    assert as_bytes(out) == CHUNK


def test_no_answer_anywhere_is_recompute() -> None:
    with (
        FakeServer(silent) as a,
        FakeServer(silent) as b,
        make_client(a.address, b.address) as client,
    ):
        report = client.fetch(TENANT, KEY, dst())
    assert report.reason is RecomputeReason.NO_ANSWER
    assert not report.ok


def test_corrupted_fragment_is_counted_and_fetched_again(backend: InMemoryBackend) -> None:
    with (
        FakeServer(Corrupting(backend, frag=7)) as srv,
        make_client(srv.address, timing=STEADY) as cl,
    ):
        out = dst()
        report = cl.fetch(TENANT, KEY, out)
    assert report.ok
    assert report.crc_failures == 1
    assert report.retries >= 1
    assert as_bytes(out) == CHUNK


def test_lost_fragments_are_retried(backend: InMemoryBackend) -> None:
    responder = Dropping(backend, frags={0, 10, 20})
    with FakeServer(responder) as srv, make_client(srv.address, timing=STEADY) as client:
        out = dst()
        report = client.fetch(TENANT, KEY, out)
    assert report.ok
    assert report.retries == 3
    assert report.timeouts + report.fast_retransmits + report.tail_probes == 3
    assert not report.fell_back
    assert as_bytes(out) == CHUNK


def test_a_lost_get_overtaken_by_later_answers_is_sent_again_before_its_timeout(
    backend: InMemoryBackend,
) -> None:
    with (
        FakeServer(Dropping(backend, frags={0})) as srv,
        make_client(srv.address, timing=NO_PROBE) as client,
    ):
        report = client.fetch(TENANT, KEY, dst())
    assert report.ok
    assert (report.fast_retransmits, report.retries, report.timeouts) == (1, 1, 0)


def test_a_lost_get_at_the_tail_is_probed_before_its_timeout(backend: InMemoryBackend) -> None:
    timing = {**STEADY, "timeout_s": 5.0, "max_timeout_s": 5.0, "tail_probe_min_s": 0.005}
    responder = Dropping(backend, frags=set())
    with FakeServer(responder) as srv, make_client(srv.address, timing=timing) as client:
        k = client.frags_per_get
        responder.pending = {(NFRAGS - 1) // k * k}  # the last GET's answer is lost
        report = client.fetch(TENANT, KEY, dst())
    assert report.ok
    assert report.timeouts == 0 and report.tail_probes >= 1


def test_a_stalled_path_costs_one_tail_probe_not_the_window(backend: InMemoryBackend) -> None:
    # The whole chunk's GETs (one fragment each) go out at once; the pool answers three, then
    # stalls for 80 ms (a busy process) with the other 20 queued, then answers them all. The
    # silence is a probe time many times over, but one probe tells as much as twenty: the
    # rule that re-sent every GET whose probe time had passed sent 20 probes, which then timed
    # out behind the stall as well (83 GETs for 23 fragments); now one probe goes out, timed
    # as a first try (5 s here), so it does not time out behind the stall either.
    with (
        FakeServer(Stalling(backend, at=4, stall_s=0.08)) as srv,
        FetchClient(
            srv.address, None, window=NFRAGS, frags_per_get=1, tail_probe_min_s=0.005,
            **LONG_FIRST,
        ) as client,
    ):  # fmt: skip
        out = dst()
        report = client.fetch(TENANT, KEY, out)
        time.sleep(0.05)  # the last re-sent GETs reach the server's count
        received = srv.received
    assert report.ok and as_bytes(out) == CHUNK
    # One probe per quiet spell; a second only if the loaded machine paused the answers again.
    assert 1 <= report.tail_probes <= 2 and report.timeouts == 0
    assert report.gets_sent == received == NFRAGS + report.tail_probes


# Timing under which an old-style retry (waiting twice the first timeout) ends in DEADLINE: only a
# retry sent on evidence of loss, or timed by the measured round trip, completes the fetch.
LONG_FIRST: dict[str, Any] = {
    "timeout_s": 5.0,
    "max_timeout_s": 5.0,
    "max_retries": 2,
    "deadline_s": 3.0,
}


def test_lost_retries_overtaken_by_later_answers_are_sent_again_without_using_up_retries(
    backend: InMemoryBackend,
) -> None:
    # Fragment 0's answer is lost three times, one more than max_retries: each loss is shown by
    # later GETs answered (one fragment per GET, two in flight), so each re-send is a fast one,
    # and the path, which answers everything else, is not given up. The retry timeout's floor is
    # long, so that a loaded machine's scheduling delay cannot turn a fast re-send into a timeout;
    # the chunk is long, so that the fetch does not reach its tail (where no later GET can show a
    # loss, and a retry is left to its timeout) before the third loss is seen, even when a loaded
    # machine's jitter widens the reordering window (with 23 fragments it did).
    key, chunk = KEY + 1, os.urandom(150 * c.FRAG_BYTES - 5)
    backend.put(TENANT, key, chunk)
    with (
        FakeServer(Dropping(backend, set(), times={0: 3})) as srv,
        FetchClient(
            srv.address,
            None,
            window=2,
            frags_per_get=1,
            tail_probe_min_s=0.2,
            min_retry_timeout_s=1.0,
            **LONG_FIRST,
        ) as client,  # fmt: skip
    ):
        out = torch.zeros(len(chunk), dtype=torch.uint8)
        report = client.fetch(TENANT, key, out)
    assert report.ok and as_bytes(out) == chunk and not report.fell_back
    assert (report.fast_retransmits, report.retries, report.timeouts) == (3, 3, 0)


def test_gets_after_a_retry_keep_asking_for_frags_per_get_fragments(
    backend: InMemoryBackend,
) -> None:
    # Fragment 0 is lost once; its re-send goes out in the same pass as first GETs for later
    # fragments, which must still ask for frags_per_get fragments each (a retry's failure count
    # once overwrote the run length there, and every later GET of the pass asked for one).
    k = 4
    with (
        FakeServer(Dropping(backend, set(), times={0: 1})) as srv,
        FetchClient(
            srv.address, None, window=2, frags_per_get=k, tail_probe_min_s=0.2, **LONG_FIRST
        ) as client,
    ):
        out = dst()
        report = client.fetch(TENANT, KEY, out)
    assert report.ok and as_bytes(out) == CHUNK
    assert report.retries == 1
    assert report.gets_sent == -(-NFRAGS // k) + report.retries


def test_a_lost_probe_at_the_tail_waits_the_measured_timeout_not_the_first(
    backend: InMemoryBackend,
) -> None:
    # The last GET's answer is lost, and so is its probe's: nothing can overtake the probe, so
    # its timeout decides, and a retry's timeout comes from the measured round trips (with the
    # 10 ms floor) instead of twice the 5 s first timeout.
    responder = Dropping(backend, set())
    with (
        FakeServer(responder) as srv,
        FetchClient(srv.address, None, tail_probe_min_s=0.005, **LONG_FIRST) as client,
    ):
        k = client.frags_per_get
        responder.times = {(NFRAGS - 1) // k * k: 2}
        out = dst()
        report = client.fetch(TENANT, KEY, out)
    assert report.ok and as_bytes(out) == CHUNK
    assert (report.tail_probes, report.timeouts, report.retries) == (1, 1, 2)


def test_duplicate_and_reordered_data_complete_the_chunk(backend: InMemoryBackend) -> None:
    with (
        FakeServer(DuplicatingReordering(backend)) as srv,
        make_client(srv.address, timing=STEADY) as client,
    ):
        out = dst()
        report = client.fetch(TENANT, KEY, out)
    assert report.ok
    assert report.duplicates >= 1
    assert as_bytes(out) == CHUNK


def test_data_for_another_key_tenant_or_request_is_ignored(backend: InMemoryBackend) -> None:
    with (
        FakeServer(Mislabelling(backend)) as srv,
        make_client(srv.address, timing=STEADY) as client,
    ):
        out = dst()
        report = client.fetch(TENANT, KEY, out)
    assert report.ok
    assert report.ignored >= 3
    assert as_bytes(out) == CHUNK


def test_switch_hits_are_one_fragment_per_get_and_counted_as_hit(
    backend: InMemoryBackend,
) -> None:
    switch = Switch(TENANT, KEY, CHUNK, hit_below=NFRAGS, behind=pool(backend))
    with FakeServer(switch) as srv, make_client(srv.address, timing=STEADY) as client:
        out = dst()
        report = client.fetch(TENANT, KEY, out)
    assert report.ok
    assert (report.frags_hit, report.frags_pool) == (NFRAGS, 0)
    assert report.gets_sent == NFRAGS
    assert as_bytes(out) == CHUNK


def test_switch_and_pool_fragments_are_counted_apart(backend: InMemoryBackend) -> None:
    switch = Switch(TENANT, KEY, CHUNK, hit_below=10, behind=pool(backend))
    with FakeServer(switch) as srv, make_client(srv.address, timing=STEADY) as client:
        out = dst()
        report = client.fetch(TENANT, KEY, out)
    assert report.ok
    assert (report.frags_hit, report.frags_pool) == (10, NFRAGS - 10)
    assert as_bytes(out) == CHUNK


def test_fallback_gets_carry_nocache(backend: InMemoryBackend) -> None:
    # A "switch" that would serve everything from SRAM unless told NOCACHE: after the service
    # path fails, the direct GETs must bypass it.
    switch = Switch(TENANT, KEY, CHUNK, hit_below=NFRAGS, behind=pool(backend))
    with (
        FakeServer(silent) as service,
        FakeServer(switch) as direct,
        make_client(service.address, direct.address) as client,
    ):
        report = client.fetch(TENANT, KEY, dst())
    assert report.ok and report.fell_back
    assert (report.frags_hit, report.frags_pool) == (0, NFRAGS)


def test_replicas_of_another_hosts_request_are_accepted_in_its_group(
    backend: InMemoryBackend,
) -> None:
    with (
        FakeServer(Replicating(backend, group=42)) as srv,
        make_client(srv.address, timing=STEADY, group=42) as client,
    ):
        out = dst()
        report = client.fetch(TENANT, KEY, out)
    assert report.ok
    assert as_bytes(out) == CHUNK


def test_replicas_for_another_group_are_ignored(backend: InMemoryBackend) -> None:
    with (
        FakeServer(Replicating(backend, group=42)) as srv,
        make_client(srv.address, group=0) as client,
    ):
        report = client.fetch(TENANT, KEY, dst())
    assert report.reason is RecomputeReason.NO_ANSWER
    assert report.ignored > 0


def test_partly_served_chunk_is_never_reported_valid(backend: InMemoryBackend) -> None:
    with FakeServer(Partial(backend, upto=12)) as srv, make_client(srv.address) as client:
        report = client.fetch(TENANT, KEY, dst())
    assert report.outcome is FetchOutcome.RECOMPUTE
    assert report.frags_pool == 12
    assert not report.ok


def test_pool_holding_a_shorter_chunk_refuses_the_gets(backend: InMemoryBackend) -> None:
    backend.put(TENANT, 5, CHUNK[: 4 * c.FRAG_BYTES])
    with PoolServer(backend, "127.0.0.1", 0) as srv, make_client(srv.address) as client:
        report = client.fetch(TENANT, 5, dst())
        stats = srv.stats
    assert report.reason is RecomputeReason.REFUSED
    assert stats.bad_ranges > 0 and stats.unknown_groups == 0  # the pool's count says why


def test_overall_deadline_bounds_a_fetch() -> None:
    timing = dict(FAST, deadline_s=0.05, max_retries=50)
    with FakeServer(silent) as srv, make_client(srv.address, timing=timing) as client:
        report = client.fetch(TENANT, KEY, dst())
    assert report.reason is RecomputeReason.DEADLINE


def test_consecutive_fetches_on_one_client_do_not_mix(backend: InMemoryBackend) -> None:
    other = os.urandom(5 * c.FRAG_BYTES)
    backend.put(TENANT, 6, other)
    with (
        PoolServer(backend, "127.0.0.1", 0) as srv,
        make_client(srv.address, timing=STEADY) as client,
    ):
        a, b = dst(), torch.zeros(len(other), dtype=torch.uint8)
        assert client.fetch(TENANT, KEY, a).ok
        assert client.fetch(TENANT, 6, b).ok
    assert (as_bytes(a), as_bytes(b)) == (CHUNK, other)


def test_destination_must_be_a_flat_uint8_tensor(pool_server: PoolServer) -> None:
    with FetchClient(pool_server.address) as client:
        with pytest.raises(FetchError, match="uint8"):
            client.fetch(TENANT, KEY, torch.zeros(10, dtype=torch.float32))
        with pytest.raises(FetchError, match="chunk length"):
            client.fetch(TENANT, KEY, torch.zeros(10, dtype=torch.uint8), nbytes=11)


def test_client_needs_an_address() -> None:
    with pytest.raises(ValueError, match="address"):
        FetchClient(None, None)


def test_unavailable_pool_is_retried(backend: InMemoryBackend) -> None:
    inner = pool(backend)
    refused: list[int] = []

    def flaky(datagram: bytes) -> list[bytes]:
        if not refused:
            refused.append(1)
            return [nack_message(KvpHeader.unpack(datagram), c.KVP_STATUS_UNAVAILABLE)]
        return inner(datagram)

    with FakeServer(flaky) as srv, make_client(srv.address, timing=STEADY) as client:
        out = dst()
        report = client.fetch(TENANT, KEY, out)
    assert report.ok
    assert (report.nacks, report.retries) == (1, 1)
    assert as_bytes(out) == CHUNK


def test_a_pool_unavailable_for_a_while_is_waited_for_not_given_up(
    backend: InMemoryBackend,
) -> None:
    # A pool whose store is recovering answers UNAVAILABLE at once, for 30 ms. Re-sent at once,
    # the GETs used up their two retries within a millisecond and the fetch, with no other path,
    # ended NO_ANSWER; waiting for each GET's timeout (20 ms, then 20 ms) outlasts the outage.
    inner = pool(backend)
    until: list[float] = []

    def recovering(datagram: bytes) -> list[bytes]:
        if not until:
            until.append(time.monotonic() + 0.03)
        if time.monotonic() < until[0]:
            return [nack_message(KvpHeader.unpack(datagram), c.KVP_STATUS_UNAVAILABLE)]
        return inner(datagram)

    with FakeServer(recovering) as srv, make_client(srv.address, timing=FAST) as client:
        out = dst()
        report = client.fetch(TENANT, KEY, out)
    assert report.ok and as_bytes(out) == CHUNK and not report.fell_back
    assert report.nacks >= 1 and report.timeouts >= 1


ELSEWHERE = ("127.0.0.2", c.KVP_UDP_PORT)


class _AnsweredFromElsewhere:
    """The service forwards every GET to a pool that answers from its own address, as the
    switch does with a miss: the replies to a path's GETs do not come from the path's address.
    The pool answers from the KVP port, as every pool node does; the agent takes its answers
    only if it was given the pool's address (``pool_addrs``)."""

    def __init__(self, backend: InMemoryBackend, port: int = c.KVP_UDP_PORT) -> None:
        self.handler = pool(backend)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.2", port))
        self.client: Address | None = None

    def __call__(self, datagram: bytes) -> list[bytes]:
        assert self.client is not None
        for out in self.handler(datagram):
            self.sock.sendto(out, self.client)
        return []


def test_replies_from_another_address_than_the_path_are_received(
    backend: InMemoryBackend,
) -> None:
    elsewhere = _AnsweredFromElsewhere(backend)
    try:
        with (
            FakeServer(elsewhere) as service,
            make_client(service.address, timing=STEADY, pool_addrs=(ELSEWHERE,)) as client,
        ):
            elsewhere.client = ("127.0.0.1", client.address[1])
            out = dst()
            report = client.fetch(TENANT, KEY, out)
    finally:
        elsewhere.sock.close()
    assert report.ok and not report.fell_back
    assert as_bytes(out) == CHUNK
    assert report.frags_pool == NFRAGS and report.foreign == 0


def test_replies_from_the_kvp_port_of_an_address_not_given_are_dropped(
    backend: InMemoryBackend,
) -> None:
    # The KVP source port alone is no credential.
    report = _fetch_answered_from_elsewhere(_AnsweredFromElsewhere(backend))
    assert not report.ok and report.frags_pool == 0
    assert report.foreign > 0


def test_replies_from_a_host_port_that_is_no_path_are_dropped(backend: InMemoryBackend) -> None:
    # An ephemeral port: not a KVP service.
    report = _fetch_answered_from_elsewhere(_AnsweredFromElsewhere(backend, port=0))
    assert not report.ok and report.frags_pool == 0
    assert report.foreign > 0


def _fetch_answered_from_elsewhere(elsewhere: _AnsweredFromElsewhere) -> FetchReport:
    """A fetch whose GETs the service takes and whose replies come from ``elsewhere``."""
    try:
        with (
            FakeServer(elsewhere) as service,
            make_client(service.address, timing=FAST) as client,
        ):
            elsewhere.client = ("127.0.0.1", client.address[1])
            return client.fetch(TENANT, KEY, dst())
    finally:
        elsewhere.sock.close()


def test_no_other_socket_can_share_the_client_port() -> None:
    with make_client(("127.0.0.1", 9), ("127.0.0.2", 9)) as client:
        other = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            with pytest.raises(OSError):
                other.bind(("0.0.0.0", client.address[1]))
        finally:
            other.close()


def test_the_get_timeout_follows_measured_round_trips(backend: InMemoryBackend) -> None:
    # A pool that takes 30 ms per GET, one at a time: with a window of 4 a reply waits up to
    # about 120 ms, six times the first timeout. A fixed 20 ms timeout would send nearly every
    # GET again (and give up after two retries); measured round trips raise it instead.
    handler = pool(backend)

    def slow(datagram: bytes) -> list[bytes]:
        time.sleep(0.03)
        return handler(datagram)

    timing: dict[str, Any] = {
        "timeout_s": 0.02,
        "max_timeout_s": 1.0,
        "max_retries": 2,
        "deadline_s": 20.0,
    }
    with FakeServer(slow) as srv:
        client = FetchClient(srv.address, None, window=4, bind=("127.0.0.1", 0), **timing)
        with client:
            out = dst()
            report = client.fetch(TENANT, KEY, out)
    # Before the timeout followed round trips this fetch ended RECOMPUTE (no answer in time).
    assert report.ok and as_bytes(out) == CHUNK and not report.fell_back
    assert report.srtt_s > 0.05 and report.rto_s > report.srtt_s


# ------------------------------------------------------------------ lone misses, direct reads
class _Reader(InMemoryBackend):
    """The pool's own client (Mooncake's in deployment): counts reads, can fail."""

    def __init__(self, backend: InMemoryBackend, fail: bool = False) -> None:
        super().__init__()
        self.inner, self.fail, self.reads = backend, fail, 0

    def get_into(self, tenant: int, key: int, dst: memoryview) -> int | None:
        self.reads += 1
        if self.fail:
            raise ConnectionError("master gone")
        return self.inner.get_into(tenant, key, dst)


def _direct_client(service: Address, reader: _Reader, group: int = 0) -> FetchClient:
    # A small window: the first answers cannot already be the whole chunk.
    return FetchClient(service, direct=reader, group=group, frags_per_get=1, window=2, **STEADY)


def test_a_lone_miss_reads_the_rest_through_the_pools_own_client(
    pool_server: PoolServer, backend: InMemoryBackend
) -> None:
    reader = _Reader(backend)
    with _direct_client(pool_server.address, reader) as client:
        out = dst()
        report = client.fetch(TENANT, KEY, out)
    assert report.ok and report.path == "direct" and report.direct_bytes == len(CHUNK)
    assert reader.reads == 1 and as_bytes(out) == CHUNK
    # The first pool answer is what showed the miss: a few KVP fragments came before.
    assert 1 <= report.frags_pool < NFRAGS


def test_a_failing_direct_read_leaves_the_kvp_fetch_going(
    pool_server: PoolServer, backend: InMemoryBackend
) -> None:
    reader = _Reader(backend, fail=True)
    with _direct_client(pool_server.address, reader) as client:
        out = dst()
        report = client.fetch(TENANT, KEY, out)
        assert client.direct is reader
    assert report.ok and report.path == "pool" and report.direct_bytes == 0
    assert reader.reads == 1 and report.frags_pool == NFRAGS and as_bytes(out) == CHUNK


def test_switch_hits_and_group_fetches_never_read_directly(backend: InMemoryBackend) -> None:
    reader = _Reader(backend)
    with FakeServer(Switch(TENANT, KEY, CHUNK, hit_below=NFRAGS, behind=pool(backend))) as sw:
        with _direct_client(sw.address, reader) as client:
            hit = client.fetch(TENANT, KEY, dst())
        with _direct_client(sw.address, reader, group=5) as client:
            grouped = client.fetch(TENANT, KEY, dst())
    assert hit.ok and hit.path == "switch" and grouped.ok
    assert reader.reads == 0
