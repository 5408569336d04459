"""SwitchState on its own: lookups, validation, counters, PRE, digests, packet-in, reconcile.

P4INFO_TEXT is also the program of tests/refswitch/test_p4rt_server.py.
"""

from __future__ import annotations

import json
import threading

import pytest
from finsy.proto import p4i, p4r
from google.protobuf import text_format

from refswitch.digests import DigestConfig
from refswitch.errors import (
    AlreadyExistsError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    PermissionDeniedError,
    ResourceExhaustedError,
    WriteOp,
)
from refswitch.replication import Replica
from refswitch.state import SwitchState
from refswitch.tables import ActionCall, Lpm, Ternary

# What a BMv2 client pushes: a BMv2 JSON whose pipelines hold the P4Info's tables.
_TABLES = ["port_role", "cache", "route", "acl", "config", "fixed"]
BLOB = json.dumps(
    {"pipelines": [{"name": "ingress", "tables": [{"name": f"Ingress.{t}"} for t in _TABLES]}]}
).encode()

P4INFO_TEXT = """
pkg_info { name: "test.p4" arch: "v1model" }
tables {
  preamble { id: 33554433 name: "Ingress.port_role" alias: "port_role" }
  match_fields { id: 1 name: "standard_metadata.ingress_port" bitwidth: 9 match_type: EXACT }
  action_refs { id: 16777218 }
  action_refs { id: 16777217 }
  size: 512
}
tables {
  preamble { id: 33554434 name: "Ingress.cache" alias: "cache" }
  match_fields { id: 1 name: "hdr.kvp.key" bitwidth: 64 match_type: EXACT }
  match_fields { id: 2 name: "hdr.eth.dst" bitwidth: 48 match_type: EXACT }
  action_refs { id: 16777219 scope: TABLE_ONLY }
  action_refs { id: 16777217 scope: DEFAULT_ONLY }
  direct_resource_ids: 318767105
  size: 1024
}
tables {
  preamble { id: 33554435 name: "Ingress.route" alias: "route" }
  match_fields { id: 1 name: "hdr.ipv4.dst" bitwidth: 32 match_type: LPM }
  action_refs { id: 16777218 }
  action_refs { id: 16777220 }
  action_refs { id: 16777217 }
  size: 1024
}
tables {
  preamble { id: 33554436 name: "Ingress.acl" alias: "acl" }
  match_fields { id: 1 name: "hdr.ipv4.dst" bitwidth: 32 match_type: TERNARY }
  match_fields { id: 2 name: "standard_metadata.ingress_port" bitwidth: 9 match_type: OPTIONAL }
  action_refs { id: 16777218 }
  action_refs { id: 16777220 }
  size: 64
}
tables {
  preamble { id: 33554437 name: "Ingress.config" alias: "config" }
  action_refs { id: 16777221 }
  size: 1
}
tables {
  preamble { id: 33554438 name: "Ingress.fixed" alias: "fixed" }
  match_fields { id: 1 name: "meta.kind" bitwidth: 8 match_type: EXACT }
  action_refs { id: 16777220 }
  const_default_action_id: 16777220
  size: 2
}
actions { preamble { id: 16777217 name: "NoAction" alias: "NoAction" } }
actions {
  preamble { id: 16777218 name: "Ingress.forward" alias: "forward" }
  params { id: 1 name: "port" bitwidth: 9 }
}
actions {
  preamble { id: 16777219 name: "Ingress.cache_hit" alias: "cache_hit" }
  params { id: 1 name: "slot" bitwidth: 32 }
  params { id: 2 name: "port" bitwidth: 9 }
}
actions { preamble { id: 16777220 name: "Ingress.drop" alias: "drop" } }
actions {
  preamble { id: 16777221 name: "Ingress.set_config" alias: "set_config" }
  params { id: 1 name: "threshold" bitwidth: 32 }
  params { id: 2 name: "mode" bitwidth: 8 }
}
counters {
  preamble { id: 302006273 name: "Ingress.port_counter" alias: "port_counter" }
  spec { unit: BOTH }
  size: 16
}
counters {
  preamble { id: 302006274 name: "Ingress.drop_counter" alias: "drop_counter" }
  spec { unit: PACKETS }
  size: 8
}
direct_counters {
  preamble { id: 318767105 name: "Ingress.cache_counter" alias: "cache_counter" }
  spec { unit: BOTH }
  direct_table_id: 33554434
}
controller_packet_metadata {
  preamble { id: 67146229 name: "packet_in" alias: "packet_in" }
  metadata { id: 1 name: "ingress_port" bitwidth: 9 }
  metadata { id: 2 name: "_pad" bitwidth: 7 }
}
controller_packet_metadata {
  preamble { id: 67121543 name: "packet_out" alias: "packet_out" }
  metadata { id: 1 name: "egress_port" bitwidth: 9 }
  metadata { id: 2 name: "_pad" bitwidth: 7 }
}
digests {
  preamble { id: 385924609 name: "hot_miss_digest_t" alias: "hot_miss_digest_t" }
  type_spec { struct { name: "hot_miss_digest_t" } }
}
type_info {
  structs {
    key: "hot_miss_digest_t"
    value {
      members { name: "key" type_spec { bitstring { bit { bitwidth: 64 } } } }
      members { name: "port" type_spec { bitstring { bit { bitwidth: 9 } } } }
    }
  }
}
"""

CACHE, ROUTE, ACL, CONFIG, PORTS, FIXED = (
    "Ingress.cache",
    "Ingress.route",
    "Ingress.acl",
    "Ingress.config",
    "Ingress.port_role",
    "Ingress.fixed",
)
DEFAULTS = {CONFIG: ActionCall("Ingress.set_config", {"threshold": 8, "mode": 1})}
KEY, MAC = 0x0123456789ABCDEF, 0x0000_5E00_5301


def make_p4info() -> p4i.P4Info:
    return text_format.Parse(P4INFO_TEXT, p4i.P4Info())


def fwd(port: int) -> ActionCall:
    return ActionCall("Ingress.forward", {"port": port})


def hit(slot: int, port: int = 1) -> ActionCall:
    return ActionCall("Ingress.cache_hit", {"slot": slot, "port": port})


@pytest.fixture
def state() -> SwitchState:
    st = SwitchState()
    st.set_pipeline(make_p4info(), BLOB, DEFAULTS)
    return st


@pytest.fixture
def sink(state: SwitchState) -> list[p4r.StreamMessageResponse]:
    got: list[p4r.StreamMessageResponse] = []

    def take(msg: p4r.StreamMessageResponse) -> bool:
        got.append(msg)
        return True

    state.set_stream_sink(take)
    return got


# ------------------------------------------------------------------------------ pipeline
def test_no_pipeline_means_not_ready_and_lookup_fails() -> None:
    st = SwitchState()
    assert not st.ready
    with pytest.raises(NotFoundError):
        st.lookup(CACHE, (1, 2))
    with pytest.raises(FailedPreconditionError):
        st.insert_entry(CACHE, [1, 2], hit(1))


def test_defaults_come_from_initial_defaults_const_default_or_noaction(state: SwitchState) -> None:
    assert state.ready and state.device_config == BLOB
    assert state.lookup(CONFIG, ()) == (DEFAULTS[CONFIG], None)
    assert state.lookup(FIXED, (3,)) == (ActionCall("Ingress.drop", {}), None)
    assert state.lookup(ROUTE, (1,)) == (ActionCall("NoAction", {}), None)


def test_initial_defaults_for_unknown_table_are_rejected() -> None:
    with pytest.raises(InvalidArgumentError):
        SwitchState().set_pipeline(make_p4info(), initial_defaults={"Ingress.nope": fwd(1)})


def test_set_pipeline_clears_entries_groups_and_digest_config(state: SwitchState) -> None:
    state.insert_entry(CACHE, [KEY, MAC], hit(1))
    state.write_multicast_group(WriteOp.INSERT, 1, [Replica(1)])
    state.write_digest_config(WriteOp.INSERT, "hot_miss_digest_t")
    state.set_pipeline(make_p4info())
    assert state.entries(CACHE) == []
    assert state.multicast_group(1) == ()
    assert state.digest_config("hot_miss_digest_t") is None


# ------------------------------------------------------------------------------ exact tables
def test_exact_entry_hits_with_its_action_and_a_handle(state: SwitchState) -> None:
    state.insert_entry(CACHE, [KEY, MAC], hit(7, 3))
    action, handle = state.lookup(CACHE, (KEY, MAC))
    assert action == hit(7, 3) and handle is not None


def test_exact_miss_returns_default_and_no_handle(state: SwitchState) -> None:
    state.insert_entry(CACHE, [KEY, MAC], hit(7))
    assert state.lookup(CACHE, (KEY, MAC + 1)) == (ActionCall("NoAction", {}), None)


def test_insert_of_existing_key_is_already_exists(state: SwitchState) -> None:
    state.insert_entry(CACHE, [KEY, MAC], hit(1))
    with pytest.raises(AlreadyExistsError):
        state.insert_entry(CACHE, [KEY, MAC], hit(2))


def test_modify_and_delete_of_missing_key_are_not_found(state: SwitchState) -> None:
    with pytest.raises(NotFoundError):
        state.modify_entry(CACHE, [KEY, MAC], hit(1))
    with pytest.raises(NotFoundError):
        state.delete_entry(CACHE, [KEY, MAC])


def test_modify_changes_what_lookup_returns(state: SwitchState) -> None:
    state.insert_entry(CACHE, [KEY, MAC], hit(1))
    state.modify_entry(CACHE, [KEY, MAC], hit(2))
    assert state.lookup(CACHE, (KEY, MAC))[0] == hit(2)


def test_delete_makes_lookup_miss(state: SwitchState) -> None:
    state.insert_entry(CACHE, [KEY, MAC], hit(1))
    state.delete_entry(CACHE, [KEY, MAC])
    assert state.lookup(CACHE, (KEY, MAC))[1] is None


def test_table_full_is_resource_exhausted(state: SwitchState) -> None:
    state.insert_entry(FIXED, [1], ActionCall("Ingress.drop"))
    state.insert_entry(FIXED, [2], ActionCall("Ingress.drop"))
    with pytest.raises(ResourceExhaustedError):
        state.insert_entry(FIXED, [3], ActionCall("Ingress.drop"))


# ------------------------------------------------------------------------------ validation
@pytest.mark.parametrize(
    ("table", "match", "action"),
    [
        (PORTS, [512], fwd(1)),  # 9-bit key
        (CACHE, [1 << 64, MAC], hit(1)),  # 64-bit key
        (CACHE, [KEY, 1 << 48], hit(1)),  # 48-bit key
        (PORTS, [1], fwd(512)),  # 9-bit parameter
    ],
)
def test_value_wider_than_its_field_is_invalid(
    state: SwitchState, table: str, match: list[int], action: ActionCall
) -> None:
    with pytest.raises(InvalidArgumentError, match="does not fit within"):
        state.insert_entry(table, match, action)


def test_wrong_key_field_count_is_invalid(state: SwitchState) -> None:
    with pytest.raises(InvalidArgumentError):
        state.insert_entry(CACHE, [KEY], hit(1))


def test_missing_exact_field_is_invalid(state: SwitchState) -> None:
    with pytest.raises(InvalidArgumentError, match="Missing non-ternary field"):
        state.insert_entry(CACHE, [KEY, None], hit(1))


def test_param_count_mismatch_is_invalid(state: SwitchState) -> None:
    with pytest.raises(InvalidArgumentError, match="number of action parameters"):
        state.insert_entry(CACHE, [KEY, MAC], ActionCall("Ingress.cache_hit", {"slot": 1}))


def test_action_of_another_table_is_invalid(state: SwitchState) -> None:
    with pytest.raises(InvalidArgumentError, match="Invalid action for table"):
        state.insert_entry(CACHE, [KEY, MAC], fwd(1))


def test_default_only_action_in_an_entry_is_denied(state: SwitchState) -> None:
    with pytest.raises(PermissionDeniedError):
        state.insert_entry(CACHE, [KEY, MAC], ActionCall("NoAction"))


# ------------------------------------------------------------------------------ lpm
def test_lpm_longest_prefix_wins_and_falls_back_after_delete(state: SwitchState) -> None:
    state.insert_entry(ROUTE, [Lpm(0x0A000000, 8)], fwd(1))
    state.insert_entry(ROUTE, [Lpm(0x0A010000, 16)], fwd(2))
    state.insert_entry(ROUTE, [0x0A010203], fwd(3))
    assert state.lookup(ROUTE, (0x0A010203,))[0] == fwd(3)
    assert state.lookup(ROUTE, (0x0A010204,))[0] == fwd(2)
    assert state.lookup(ROUTE, (0x0A020000,))[0] == fwd(1)
    state.delete_entry(ROUTE, [Lpm(0x0A010000, 16)])
    assert state.lookup(ROUTE, (0x0A010204,))[0] == fwd(1)


def test_lpm_value_with_bits_beyond_prefix_is_invalid(state: SwitchState) -> None:
    with pytest.raises(InvalidArgumentError, match="trailing zeros"):
        state.insert_entry(ROUTE, [Lpm(0x0A000001, 8)], fwd(1))


def test_lpm_prefix_length_zero_or_too_long_is_invalid(state: SwitchState) -> None:
    with pytest.raises(InvalidArgumentError, match="don't care"):
        state.insert_entry(ROUTE, [Lpm(0, 0)], fwd(1))
    with pytest.raises(InvalidArgumentError, match="Prefix length"):
        state.insert_entry(ROUTE, [Lpm(0, 33)], fwd(1))


def test_lpm_wildcard_entry_matches_everything(state: SwitchState) -> None:
    state.insert_entry(ROUTE, [None], fwd(9))
    assert state.lookup(ROUTE, (0xFFFFFFFF,))[0] == fwd(9)


# ------------------------------------------------------------------------------ ternary
def test_ternary_highest_priority_match_wins(state: SwitchState) -> None:
    state.insert_entry(ACL, [Ternary(0x0A000000, 0xFF000000), None], fwd(1), priority=10)
    state.insert_entry(ACL, [Ternary(0x0A000000, 0xFF000000), 5], fwd(2), priority=20)
    assert state.lookup(ACL, (0x0A0B0C0D, 5))[0] == fwd(2)
    assert state.lookup(ACL, (0x0A0B0C0D, 6))[0] == fwd(1)
    assert state.lookup(ACL, (0x0B000000, 5))[1] is None


def test_ternary_entry_without_priority_is_invalid(state: SwitchState) -> None:
    with pytest.raises(InvalidArgumentError, match="Zero priority"):
        state.insert_entry(ACL, [Ternary(1, 1), None], fwd(1))


def test_priority_on_exact_table_is_invalid(state: SwitchState) -> None:
    with pytest.raises(InvalidArgumentError, match="Non-zero priority"):
        state.insert_entry(PORTS, [1], fwd(1), priority=5)


def test_ternary_value_outside_mask_is_invalid(state: SwitchState) -> None:
    with pytest.raises(InvalidArgumentError, match="value & mask"):
        state.insert_entry(ACL, [Ternary(0x0A000001, 0xFF000000), None], fwd(1), priority=1)


# ------------------------------------------------------------------------------ default entry
def test_set_default_action_then_reset_restores_program_default(state: SwitchState) -> None:
    state.set_default_action(ROUTE, ActionCall("Ingress.drop"))
    assert state.lookup(ROUTE, (1,))[0] == ActionCall("Ingress.drop", {})
    state.set_default_action(ROUTE, None)
    assert state.lookup(ROUTE, (1,))[0] == ActionCall("NoAction", {})


def test_const_default_action_cannot_be_changed(state: SwitchState) -> None:
    with pytest.raises(PermissionDeniedError, match="const default action"):
        state.set_default_action(FIXED, ActionCall("Ingress.drop"))


def test_table_only_action_cannot_be_default(state: SwitchState) -> None:
    with pytest.raises(PermissionDeniedError, match="TABLE_ONLY"):
        state.set_default_action(CACHE, hit(1))


def test_actions_given_by_alias_are_stored_by_name(state: SwitchState) -> None:
    state.insert_entry("port_role", [1], ActionCall("forward", {"port": 2}))
    assert state.lookup(PORTS, (1,))[0] == fwd(2)


# ------------------------------------------------------------------------------ counters
def test_count_direct_adds_to_the_hit_entry_and_ignores_none(state: SwitchState) -> None:
    state.insert_entry(CACHE, [KEY, MAC], hit(1))
    _, handle = state.lookup(CACHE, (KEY, MAC))
    state.count_direct(handle, 1, 100)
    state.count_direct(handle, 2, 50)
    state.count_direct(None, 5, 5)
    assert state.direct_counter_value(CACHE, (KEY, MAC)) == (3, 150)


def test_count_adds_to_one_cell(state: SwitchState) -> None:
    state.count("Ingress.port_counter", 3, 1, 64)
    state.count("Ingress.port_counter", 3, 1, 64)
    assert state.counter_value("Ingress.port_counter", 3) == (2, 128)
    assert state.counter_value("Ingress.port_counter", 4) == (0, 0)


def test_count_outside_the_array_is_ignored_and_counted(state: SwitchState) -> None:
    state.count("Ingress.drop_counter", 8)
    state.count("Ingress.drop_counter", -1)
    assert state.stats.counter_index_errors == 2
    assert sum(p for p, _ in state.counter_values("Ingress.drop_counter")) == 0


def test_set_counter_without_index_sets_every_cell(state: SwitchState) -> None:
    state.count("Ingress.port_counter", 1, 5, 5)
    state.set_counter("Ingress.port_counter", None, 0, 0)
    assert state.counter_values("Ingress.port_counter") == [(0, 0)] * 16
    with pytest.raises(OutOfRangeError):
        state.set_counter("Ingress.port_counter", 16, 0, 0)


# ------------------------------------------------------------------------------ multicast
def test_multicast_group_insert_modify_delete(state: SwitchState) -> None:
    state.write_multicast_group(WriteOp.INSERT, 5, [Replica(1), Replica(2, 1)])
    assert list(state.multicast_group(5)) == [(1, 0), (2, 1)]
    state.write_multicast_group(WriteOp.MODIFY, 5, [Replica(3)])
    assert list(state.multicast_group(5)) == [(3, 0)]
    state.write_multicast_group(WriteOp.DELETE, 5)
    assert state.multicast_group(5) == ()


def test_multicast_group_errors(state: SwitchState) -> None:
    with pytest.raises(InvalidArgumentError):
        state.write_multicast_group(WriteOp.INSERT, 0, [Replica(1)])
    with pytest.raises(OutOfRangeError):
        state.write_multicast_group(WriteOp.INSERT, 1 << 15, [Replica(1)])
    with pytest.raises(InvalidArgumentError, match="Duplicate replica"):
        state.write_multicast_group(WriteOp.INSERT, 1, [Replica(1), Replica(1)])
    with pytest.raises(NotFoundError):
        state.write_multicast_group(WriteOp.MODIFY, 1, [Replica(1)])


# ------------------------------------------------------------------------------ digests
DIGEST = "hot_miss_digest_t"


def test_digest_is_dropped_until_configured(
    state: SwitchState, sink: list[p4r.StreamMessageResponse]
) -> None:
    state.emit_digest(DIGEST, (KEY, 3))
    assert sink == [] and state.stats.digests_unconfigured == 1
    state.write_digest_config(WriteOp.INSERT, DIGEST)
    state.emit_digest(DIGEST, (KEY, 3))
    (msg,) = sink
    assert msg.digest.digest_id == 385924609 and msg.digest.list_id == 1
    members = msg.digest.data[0].struct.members
    assert [m.bitstring for m in members] == [KEY.to_bytes(8, "big"), b"\x03"]


def test_digest_list_fills_up_to_max_list_size(
    state: SwitchState, sink: list[p4r.StreamMessageResponse]
) -> None:
    config = DigestConfig(max_timeout_ns=10**10, max_list_size=2)
    state.write_digest_config(WriteOp.INSERT, DIGEST, config)
    state.emit_digest(DIGEST, (1, 1))
    assert sink == []
    state.emit_digest(DIGEST, (2, 1))
    assert [len(m.digest.data) for m in sink] == [2]


def test_digest_repeat_is_suppressed_until_acked(
    state: SwitchState, sink: list[p4r.StreamMessageResponse]
) -> None:
    state.write_digest_config(WriteOp.INSERT, DIGEST, DigestConfig(ack_timeout_ns=10**10))
    state.emit_digest(DIGEST, (1, 1))
    state.emit_digest(DIGEST, (1, 1))
    assert len(sink) == 1 and state.stats.digests_suppressed == 1
    state.ack_digest_list(DIGEST, sink[0].digest.list_id)
    state.emit_digest(DIGEST, (1, 1))
    assert [m.digest.list_id for m in sink] == [1, 2]


def test_digest_config_insert_twice_is_already_exists(state: SwitchState) -> None:
    state.write_digest_config(WriteOp.INSERT, DIGEST)
    with pytest.raises(AlreadyExistsError):
        state.write_digest_config(WriteOp.INSERT, DIGEST)
    state.write_digest_config(WriteOp.DELETE, DIGEST)
    with pytest.raises(NotFoundError):
        state.write_digest_config(WriteOp.DELETE, DIGEST)


# ------------------------------------------------------------------------------ packet in
def test_packet_in_carries_canonical_metadata_by_p4info_id(
    state: SwitchState, sink: list[p4r.StreamMessageResponse]
) -> None:
    state.emit_packet_in(b"frame", {"ingress_port": 260})
    (msg,) = sink
    assert msg.packet.payload == b"frame"
    assert [(m.metadata_id, m.value) for m in msg.packet.metadata] == [
        (1, b"\x01\x04"),
        (2, b"\x00"),
    ]


def test_packet_in_without_a_controller_is_counted_as_dropped(state: SwitchState) -> None:
    state.emit_packet_in(b"frame", {"ingress_port": 1})
    assert state.stats.packet_ins_dropped == 1


# ------------------------------------------------------------------------------ reconcile
def test_reconcile_keeps_entries_defaults_and_groups(state: SwitchState) -> None:
    state.insert_entry(CACHE, [KEY, MAC], hit(1), counter=(4, 40))
    state.set_default_action(ROUTE, ActionCall("Ingress.drop"))
    state.write_multicast_group(WriteOp.INSERT, 2, [Replica(1)])
    state.set_pipeline(make_p4info(), initial_defaults=DEFAULTS, reconcile=True)
    assert state.lookup(CACHE, (KEY, MAC))[0] == hit(1)
    assert state.direct_counter_value(CACHE, (KEY, MAC)) == (4, 40)
    assert state.lookup(ROUTE, (1,))[0] == ActionCall("Ingress.drop", {})
    assert list(state.multicast_group(2)) == [(1, 0)]


def test_reconcile_that_cannot_keep_an_entry_changes_nothing(state: SwitchState) -> None:
    state.insert_entry(PORTS, [300], fwd(1))
    narrower = make_p4info()
    narrower.tables[0].match_fields[0].bitwidth = 8
    with pytest.raises(FailedPreconditionError, match="reconciling"):
        state.set_pipeline(narrower, reconcile=True)
    assert state.lookup(PORTS, (300,))[0] == fwd(1)


# ------------------------------------------------------------------------------ concurrency
def test_lookups_during_concurrent_writes_see_whole_entries(state: SwitchState) -> None:
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            n = 0
            while not stop.is_set():
                n = (n + 1) % 200
                state.insert_entry(ROUTE, [Lpm(n << 24, 8)], fwd(n))
                state.insert_entry(ACL, [Ternary(n, 0xFF), None], fwd(n), priority=n + 1)
                state.delete_entry(ROUTE, [Lpm(n << 24, 8)])
                state.delete_entry(ACL, [Ternary(n, 0xFF), None], priority=n + 1)
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=writer)
    t.start()
    try:
        for i in range(20000):
            n = i % 200
            action, _ = state.lookup(ROUTE, ((n << 24) | 1,))
            assert action in (fwd(n), ActionCall("NoAction", {}))
            action, _ = state.lookup(ACL, (n, 1))
            assert action == fwd(n) or action.action == "NoAction"
    finally:
        stop.set()
        t.join()
    assert errors == []
