"""Epochs under any interleaving: no reply ever carries bytes of another load (hypothesis).

The control plane's safe order (delete the entry, WRITE the fragments, insert the entry with a
fresh epoch) is one of many orders a buggy, restarted or racing controller could apply. This
state machine drives the reference pipeline with every order: loads that begin (a fresh epoch),
WRITEs of their fragments one at a time into slots other loads may still use, entries inserted,
modified or deleted before, during or after the WRITEs, and GETs at any point. Each chunk's
bytes depend on its key and epoch, so a fragment served from any other load is caught. The
invariant: a GET that hits is answered with exactly the fragment that the load named by the
entry's epoch wrote; everything else is a miss or a counted drop.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from emulation.targets import load_p4info
from kvcast import p4constants as c
from kvcast import wire
from kvcast.wire import ip_int
from refswitch.pipeline import PACKET_OUT_LEN, Pipeline, initial_defaults
from refswitch.state import SwitchState
from refswitch.tables import ActionCall, Lpm

TENANT = 5
KEYS = (0xA1, 0xB2, 0xC3)
SLOTS = 8
HOST_PORT, POOL_PORT = 1, 2
HOST_MAC, SWITCH_MAC, POOL_MAC = "00:00:00:00:00:01", "02:00:00:00:00:fe", "00:00:00:00:00:02"
HOST_IP, VIP, POOL_IP = "10.0.0.1", "10.0.100.1", "10.0.1.1"
T_CACHE = c.TABLE_INGRESS_CACHE_CACHE_TABLE
DROPS = c.COUNTER_INGRESS_STATS_DROP_COUNTER
P4INFO = load_p4info()


def content(key: int, epoch: int, frag: int) -> bytes:
    """The bytes of fragment ``frag`` of the chunk loaded under ``key`` with ``epoch``."""
    seed = f"{key}:{epoch}:{frag}".encode()
    return hashlib.blake2b(seed, digest_size=64).digest() * (c.FRAG_BYTES // 64)


@dataclass
class Load:
    """One load: a chunk of ``count`` fragments for ``key`` at ``base``, epoch ``epoch``."""

    key: int
    base: int
    count: int
    epoch: int
    written: int = 0


class EpochInterleavings(RuleBasedStateMachine):
    """Loads, WRITEs, entry changes and GETs in any order against one reference pipeline."""

    def __init__(self) -> None:
        super().__init__()
        self.state = SwitchState()
        self.state.set_pipeline(P4INFO, initial_defaults=initial_defaults())
        self.pipeline = Pipeline(self.state)
        # The host's port is bound to its address and tenant (an unbound port is denied).
        self.state.insert_entry(
            c.TABLE_INGRESS_PORT_ROLE_PORT_ROLE,
            [HOST_PORT],
            ActionCall(
                c.ACTION_INGRESS_PORT_ROLE_BIND_HOST, {"addr": ip_int(HOST_IP), "check_tenant": 1}
            ),
        )
        self.state.insert_entry(
            c.TABLE_INGRESS_PORT_ROLE_TENANT_BINDING,
            [HOST_PORT, TENANT],
            ActionCall(c.ACTION_INGRESS_PORT_ROLE_TENANT_OK, {}),
        )
        self.state.insert_entry(
            c.TABLE_INGRESS_FORWARDING_IPV4_LPM,
            [Lpm(ip_int(POOL_IP), 32)],
            ActionCall(
                c.ACTION_INGRESS_FORWARDING_ROUTE,
                {"port": POOL_PORT, "smac": 2, "dmac": 3},
            ),
        )
        for bucket in range(c.POOL_BUCKETS):
            self.state.insert_entry(
                c.TABLE_INGRESS_POOL_OWNER_POOL_OWNER,
                [bucket],
                ActionCall(c.ACTION_INGRESS_POOL_OWNER_SET_POOL, {"pool_ip": ip_int(POOL_IP)}),
            )
        self.next_epoch = 1
        self.loads: list[Load] = []
        self.entries: dict[int, Load] = {}
        self.hits = 0

    # ---------------------------------------------------------------- the control plane
    @rule(key=st.sampled_from(KEYS), base=st.integers(0, SLOTS - 1), count=st.integers(1, 3))
    def begin_load(self, key: int, base: int, count: int) -> None:
        count = min(count, SLOTS - base)
        self.loads.append(Load(key, base, count, self.next_epoch))
        self.next_epoch += 1

    @precondition(lambda self: any(ld.written < ld.count for ld in self.loads))
    @rule(pick=st.integers(0, 1000))
    def write_next_fragment(self, pick: int) -> None:
        pending = [ld for ld in self.loads if ld.written < ld.count]
        ld = pending[pick % len(pending)]
        i = ld.written
        payload = wire.write_message(
            TENANT, ld.key, i, ld.base + i, ld.epoch, content(ld.key, ld.epoch, i), req_id=i
        )
        frame = wire.udp_frame(
            SWITCH_MAC, SWITCH_MAC, VIP, VIP, c.KVP_UDP_PORT, c.KVP_UDP_PORT, payload
        )
        outs = self.pipeline.process(c.CPU_PORT_NUM, bytes(PACKET_OUT_LEN) + frame)
        assert [o.port for o in outs] == [c.CPU_PORT_NUM]  # the WRITE_ACK
        ld.written += 1

    @precondition(lambda self: bool(self.loads))
    @rule(pick=st.integers(0, 1000))
    def point_entry_at_a_load(self, pick: int) -> None:
        """Insert or modify the key's entry, whether or not the load's WRITEs are done."""
        ld = self.loads[pick % len(self.loads)]
        call = ActionCall(
            c.ACTION_INGRESS_CACHE_CACHE_HIT,
            {"slot_base": ld.base, "frag_count": ld.count, "epoch": ld.epoch},
        )
        if ld.key in self.entries:
            self.state.modify_entry(T_CACHE, [TENANT, ld.key], call)
        else:
            self.state.insert_entry(T_CACHE, [TENANT, ld.key], call)
        self.entries[ld.key] = ld

    @precondition(lambda self: bool(self.entries))
    @rule(pick=st.integers(0, 1000))
    def evict(self, pick: int) -> None:
        key = sorted(self.entries)[pick % len(self.entries)]
        self.state.delete_entry(T_CACHE, [TENANT, key])
        del self.entries[key]

    # ---------------------------------------------------------------- a host
    @rule(key=st.sampled_from(KEYS), frag=st.integers(0, 3))
    def get(self, key: int, frag: int) -> None:
        drops = sum(p for p, _ in self.state.counter_values(DROPS))
        get = wire.get_message(TENANT, key, frag, req_id=frag)
        frame = wire.udp_frame(HOST_MAC, SWITCH_MAC, HOST_IP, VIP, 40000, c.KVP_UDP_PORT, get)
        outs = self.pipeline.process(HOST_PORT, frame)
        if not outs:
            assert sum(p for p, _ in self.state.counter_values(DROPS)) == drops + 1
            return
        (out,) = outs
        hdr = wire.KvpHeader.unpack(out.frame, wire.FRAME_KVP_OFFSET)
        if hdr.op == c.KVP_OP_GET:
            assert out.port == POOL_PORT  # a miss, forwarded to the pool owner
            return
        assert hdr.op == c.KVP_OP_DATA and hdr.flags & c.KVP_FLAG_HIT
        entry = self.entries.get(key)
        assert entry is not None, "served a key with no entry"
        assert hdr.epoch == entry.epoch, "served under another epoch than the entry's"
        body = out.frame[wire.FRAME_KVP_OFFSET + c.KVP_HDR_BYTES :][: hdr.payload_len]
        assert body == content(key, entry.epoch, frag), "bytes of another load were served"
        assert frag < entry.written, "a fragment its load never wrote was served"
        self.hits += 1

    @invariant()
    def epochs_are_never_reused(self) -> None:
        assert len({ld.epoch for ld in self.loads}) == len(self.loads)


EpochInterleavings.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_no_interleaving_serves_another_loads_bytes = EpochInterleavings.TestCase


def test_the_safe_order_hits_with_the_loads_bytes() -> None:
    m = EpochInterleavings()
    m.begin_load(KEYS[0], 0, 2)
    m.write_next_fragment(0)
    m.write_next_fragment(0)
    m.point_entry_at_a_load(0)
    m.get(KEYS[0], 0)
    m.get(KEYS[0], 1)
    assert m.hits == 2


def test_a_slot_rewritten_under_a_live_entry_is_dropped_not_served() -> None:
    """The wrong order: B's load overwrites A's slot while A's entry still points at it."""
    m = EpochInterleavings()
    m.begin_load(KEYS[0], 0, 1)
    m.write_next_fragment(0)
    m.point_entry_at_a_load(0)
    m.begin_load(KEYS[1], 0, 1)
    m.write_next_fragment(0)  # the only pending load: B's, into slot 0
    drops = m.pipeline.state.counter_values(DROPS)[c.DROP_BAD_EPOCH][0]
    m.get(KEYS[0], 0)  # asserts inside: a drop, counted
    assert m.pipeline.state.counter_values(DROPS)[c.DROP_BAD_EPOCH][0] == drops + 1
    assert m.hits == 0
