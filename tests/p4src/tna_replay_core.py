"""The replay of p4testgen's TNA tests into the reference target (see tests/p4src/tna_replay.py).

Imported only by tna_replay after it installed the Tofino-sized ``kvcast.p4constants``: this
module and the reference target it imports read the sizes at import.

Classes:
    UnmappedError: a test names something the reference target does not have.

Functions:
    replay_case: one test, replayed and judged.
    replay_file: every test of one PTF file.
"""

from __future__ import annotations

import dataclasses
import struct
from pathlib import Path
from typing import Any

from finsy.proto import p4i

from kvcast import p4constants as c
from refswitch.errors import SwitchStateError
from refswitch.pipeline import (
    ETH_LEN,
    IPV4_LEN,
    KVP_LEN,
    UDP_LEN,
    Output,
    Pipeline,
    initial_defaults,
)
from refswitch.state import SwitchState
from refswitch.tables import ActionCall, Lpm, MatchSpec, Range, Ternary
from tests.p4src.testgen_ptf import Expected, RegisterCell, TableEntry, TestgenCase, parse_ptf

if c.FRAG_BYTES != 96 or c.CPU_PORT_NUM != 192:  # pragma: no cover - guards the import order
    raise ImportError("tna_replay_core needs the Tofino-sized kvcast.p4constants")

_U16 = struct.Struct("!H")
_U32 = struct.Struct("!I")
_IP = ETH_LEN
_UDP = _IP + IPV4_LEN
_KVP = _UDP + UDP_LEN
_VALUE = _KVP + KVP_LEN

DROP_NAMES = {
    getattr(c, name): name.removeprefix("DROP_")
    for name in dir(c)
    if name.startswith("DROP_") and name != "DROP_REASON_COUNT"
}
EVENT_NAMES = {
    getattr(c, name): name.removeprefix("EV_").lower()
    for name in dir(c)
    if name.startswith("EV_") and name != "EV_COUNT"
}
# Drops that keep a host, a port or a tenant out (the edge guard and the ingress checks).
SECURITY_DROPS = frozenset(
    {
        c.DROP_UNAUTHORIZED,
        c.DROP_SPOOFED,
        c.DROP_BAD_TENANT,
        c.DROP_BAD_GROUP,
        c.DROP_PORT_DENIED,
        c.DROP_VLAN,
        c.DROP_IPV6,
        c.DROP_MPLS,
        c.DROP_LLC,
        c.DROP_OTHER_ETHERTYPE,
        c.DROP_ARP_MALFORMED,
        c.DROP_ARP_SPOOFED,
        c.DROP_IPV4_FRAGMENT,
    }
)
_WORD_BYTES = c.WORD_BITS // 8
_KVP_PORTS = frozenset({c.KVP_UDP_PORT, c.KVP_AGENT_PORT})
# The port a packet is dropped on: v1model's (BMv2's) and, in p4testgen's Tofino model, TNA's.
# The reference target has no interface there, so nothing sent there leaves the switch.
DROP_PORT = 511


class UnmappedError(LookupError):
    """A test names a table, action, key field or register the reference target lacks."""


def _name(name: str) -> str:
    """A control-plane name without the ``pipe.`` prefix bf-rt names carry, or a leading dot."""
    return name.removeprefix("pipe.").lstrip(".")


def _match(state: SwitchState, entry: TableEntry) -> list[MatchSpec]:
    schema = state.schema
    assert schema is not None and entry.key is not None
    info = schema.table(_name(entry.table))
    by_name = {k.name.rsplit(".", 1)[-1]: k for k in entry.key}
    specs: list[MatchSpec] = []
    for f in info.fields:
        k = by_name.get(f.name) or by_name.get(f.name.rsplit(".", 1)[-1])
        if k is None:
            raise UnmappedError(f"{entry.table}: no value for key field {f.name}")
        if k.prefix_len == 0 or k.mask == 0:
            specs.append(None)  # matches anything: P4Runtime omits the field
        elif k.prefix_len is not None:
            # p4testgen leaves bits past the prefix as the solver chose them; P4Runtime wants
            # them zero. They take no part in the match.
            host_bits = (1 << (f.bitwidth - k.prefix_len)) - 1
            specs.append(Lpm(k.value & ~host_bits, k.prefix_len))
        elif k.mask is not None:
            specs.append(Ternary(k.value, k.mask))
        elif k.high is not None:
            specs.append(Range(k.value, k.high))
        else:
            specs.append(k.value)
    return specs


def _install(state: SwitchState, entry: TableEntry) -> None:
    table = _name(entry.table)
    schema = state.schema
    assert schema is not None
    try:
        schema.table(table)
        schema.action(_name(entry.action))
    except Exception as exc:
        raise UnmappedError(f"{entry.table} / {entry.action}: {exc}") from exc
    call = ActionCall(_name(entry.action), dict(entry.params))
    try:
        if entry.key is None:
            state.set_default_action(table, call)
        else:
            state.insert_entry(table, _match(state, entry), call)
    except SwitchStateError as exc:
        raise UnmappedError(
            f"{entry.table}: the reference target refuses the entry: {exc}"
        ) from exc


def _set_register(pipe: Pipeline, cell: RegisterCell) -> bool:
    """Writes a fragment-store cell; False for a cell not replayed (the sketch's)."""
    regs, name, i = pipe.regs, _name(cell.register), cell.index
    if ".hot_sketch." in name:
        return False
    if name.endswith("fragments.frag_epoch"):
        regs.frag_epoch[i] = cell.value
    elif name.endswith("fragments.frag_crc"):
        regs.frag_crc[i] = cell.value
    elif name.endswith("fragments.frag_len"):
        regs.frag_len[i] = cell.value
    elif name.endswith(".frag_word") and ".slice_" in name:
        word = int(name.rsplit(".slice_", 1)[1].split(".", 1)[0])
        at = i * c.FRAG_BYTES + word * _WORD_BYTES
        regs.frag_words[at : at + _WORD_BYTES] = cell.value.to_bytes(_WORD_BYTES, "big")
    else:
        raise UnmappedError(f"register {cell.register}")
    return True


def _role(case: TestgenCase) -> int | None:
    """The role the test's port_role entries give its ingress port, or None."""
    for e in case.entries:
        if e.key and _name(e.table) == c.TABLE_INGRESS_PORT_ROLE_PORT_ROLE:
            if (
                e.key[0].value == case.port
                and _name(e.action) == c.ACTION_INGRESS_PORT_ROLE_SET_PORT_ROLE
            ):
                return e.params.get("role")
    return None


def _is_kvp(frame: bytes, op: int) -> bool:
    return (
        len(frame) >= _VALUE
        and frame[12:14] == b"\x08\x00"
        and frame[_IP] == 0x45
        and frame[_IP + 9] == c.IP_PROTO_UDP
        and bool(_KVP_PORTS & {_U16.unpack_from(frame, at)[0] for at in (_UDP, _UDP + 2)})
        and frame[_KVP] & 0xF == op
    )


def _with_packet_in(out: Output) -> bytes:
    if out.port != c.CPU_PORT_NUM:
        return out.frame
    return ((out.ingress_port & 0x1FF) << 7).to_bytes(2, "big") + out.frame


def _as_tna_write_ack(ack: bytes, write: bytes, fanout_port: int) -> bytes:
    """The reference target's WRITE_ACK as the TNA program sends it from a fan-out port.

    Two documented differences: the TNA program keeps the fragment in the acknowledgement
    (with the lengths that cover it), and its PacketIn names the fan-out port it came in on
    (the pipe), where the reference target's names the CPU port.
    """
    frame = bytearray(ack[2:])
    frame[_VALUE:_VALUE] = write[_VALUE : _VALUE + c.FRAG_BYTES]
    for at in (_IP + 2, _UDP + 4):
        _U16.pack_into(frame, at, _U16.unpack_from(frame, at)[0] + c.FRAG_BYTES)
    packet_in = ((fanout_port & 0x1FF) << 7).to_bytes(2, "big")
    return packet_in + with_ipv4_checksum(bytes(frame), 0)


def _first_difference(exp: Expected, got: bytes) -> int | None:
    """The first byte where ``got`` differs from ``exp`` in a checked bit, or None."""
    if len(got) != len(exp.frame):
        return min(len(got), len(exp.frame))
    for i, (e, g, m) in enumerate(zip(exp.frame, got, exp.care_mask(), strict=True)):
        if (e ^ g) & m:
            return i
    return None


def _deltas(state: SwitchState) -> tuple[list[int], list[int]]:
    drops = [p for p, _ in state.counter_values(c.COUNTER_INGRESS_STATS_DROP_COUNTER)]
    eg = [p for p, _ in state.counter_values(c.COUNTER_EGRESS_STATS_DROP_COUNTER)]
    events = [p for p, _ in state.counter_values(c.COUNTER_INGRESS_STATS_KVP_EVENT_COUNTER)]
    return [a + b for a, b in zip(drops, eg, strict=True)], events


def _path(fanout_write: bool, drops: list[int], events: list[int]) -> str:
    dropped = [r for r, n in enumerate(drops) if n]
    if dropped:
        reason = dropped[0]
        kind = "security_drop" if reason in SECURITY_DROPS else "drop"
        return f"{kind}:{DROP_NAMES[reason]}"
    happened = [EVENT_NAMES[e] for e, n in enumerate(events) if n and e != c.EV_HOT_DIGEST]
    if fanout_write and happened == ["write"]:
        return "write_fanout_ack"
    if happened == ["write"]:
        return "write_multicast"
    return happened[0] if happened else "forward"


def with_ipv4_checksum(frame: bytes, eth: int) -> bytes:
    """The frame with the checksum of the IPv4 header at ``eth + 14`` made correct.

    Frames that are not IPv4, or too short for its 20-byte header, are returned as they are.
    """
    ip = eth + ETH_LEN
    if len(frame) < ip + IPV4_LEN or frame[eth + 12 : eth + 14] != b"\x08\x00":
        return frame
    out = bytearray(frame)
    out[ip + 10 : ip + 12] = b"\0\0"
    total = sum(_U16.unpack_from(out, ip + 2 * i)[0] for i in range(10))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    _U16.pack_into(out, ip + 10, ~total & 0xFFFF)
    return bytes(out)


def replay_case(case: TestgenCase, p4info: p4i.P4Info, fix_checksum: bool) -> dict[str, Any]:
    """Replays one test into a fresh reference target and judges the outcome.

    Args:
        case: the test.
        p4info: the v1model program's P4Info.
        fix_checksum: make the input's IPv4 checksum correct first (for tests generated from
            the program with its checksum verification taken out: see test_tna_testgen).

    Returns:
        ``name``, ``path``, ``outcome`` and ``detail`` (see tna_replay).
    """
    if fix_checksum:
        eth = 2 if case.port == c.CPU_PORT_NUM else 0
        case = dataclasses.replace(case, frame=with_ipv4_checksum(case.frame, eth))
    state = SwitchState(cpu_port=c.CPU_PORT_NUM)
    state.set_pipeline(p4info, initial_defaults=initial_defaults())
    pipe = Pipeline(state)
    result: dict[str, Any] = {"name": case.name, "path": "", "outcome": "", "detail": ""}
    try:
        for entry in case.entries:
            _install(state, entry)
        skipped = [cell.register for cell in case.registers if not _set_register(pipe, cell)]
    except UnmappedError as exc:
        result.update(outcome="unmapped", detail=str(exc))
        return result
    if skipped:
        result["detail"] = f"not replayed: {sorted(set(skipped))}; "
    # A WRITE on a fan-out port is the TNA program's copy of a WRITE the CPU port multicast;
    # the v1model program stores a WRITE where it enters from the CPU port.
    fanout_write = (
        case.port != c.CPU_PORT_NUM
        and _role(case) == c.PORT_ROLE_FANOUT
        and _is_kvp(case.frame, c.KVP_OP_WRITE)
    )
    if fanout_write:
        outputs = pipe.process(c.CPU_PORT_NUM, b"\x00\x00" + case.frame)
    else:
        outputs = pipe.process(case.port, case.frame)
    drops, events = _deltas(state)
    result["path"] = path = _path(fanout_write, drops, events)
    got = [(o.port, _with_packet_in(o)) for o in outputs if o.port != DROP_PORT]
    if fanout_write and len(got) == 1 and got[0][0] == c.CPU_PORT_NUM:
        got = [(c.CPU_PORT_NUM, _as_tna_write_ack(got[0][1], case.frame, case.port))]
    result["outcome"], detail = _judge(case, path, got)
    result["detail"] += detail
    if result["outcome"] in ("mismatch", "unmodelled:multicast") and _cpu_port_entry(case):
        # The TNA program looks the CPU port up in port_role, the v1model program does not;
        # the controller writes no entry for it (docs/tofino.md).
        result["outcome"] = "documented:cpu_port_role"
    return result


def _cpu_port_entry(case: TestgenCase) -> bool:
    """The test sends from the CPU port and gives the CPU port a port_role entry."""
    return case.port == c.CPU_PORT_NUM and any(
        e.key
        and _name(e.table) == c.TABLE_INGRESS_PORT_ROLE_PORT_ROLE
        and e.key[0].value == c.CPU_PORT_NUM
        for e in case.entries
    )


def _judge(case: TestgenCase, path: str, got: list[tuple[int, bytes]]) -> tuple[str, str]:
    exp = case.expected
    multicast = path in ("write_multicast", "data_mcast") or (path == "get_hit" and not got)
    if exp is None:
        if not got:
            return ("unmodelled:multicast" if multicast else "agree"), "both drop"
        if path == "write_multicast":
            return "unmodelled:multicast", (
                "the TNA program multicasts a WRITE from the CPU port to its fan-out ports; the "
                "reference target stores it and acknowledges it itself"
            )
        if multicast:
            return "unmodelled:multicast", f"reference target: {len(got)} copies"
        return "mismatch", f"p4testgen: drop; reference target: out on {[p for p, _ in got]}"
    if not got:
        documented = _documented_drop(case, path)
        if documented:
            return f"documented:{documented}", f"reference target: {path}"
        return "mismatch", f"p4testgen: out on {exp.port}; reference target: {path}"
    if len(got) != 1 or got[0][0] != exp.port:
        return "mismatch", f"p4testgen: out on {exp.port}; reference target: {[p for p, _ in got]}"
    at = _first_difference(exp, got[0][1])
    if at is None:
        return "agree", f"{len(exp.frame)} bytes out on {exp.port}"
    return "mismatch", (
        f"byte {at} differs: p4testgen {exp.frame[at : at + 8].hex()} "
        f"reference target {got[0][1][at : at + 8].hex()} ({len(exp.frame)}/{len(got[0][1])} B)"
    )


def _documented_drop(case: TestgenCase, path: str) -> str | None:
    """The docs/tofino.md difference that explains a packet the TNA program sends and the
    reference target drops, or None."""
    if path == "drop:BAD_FRAGMENT" and _is_kvp(case.frame, c.KVP_OP_GET):
        frag_idx = _U16.unpack_from(case.frame, _KVP + 24)[0]
        tenant = _U16.unpack_from(case.frame, _KVP + 4)[0]
        key = int.from_bytes(case.frame[_KVP + 8 : _KVP + 16], "big")
        for e in case.entries:
            if e.key and _name(e.table) == c.TABLE_INGRESS_CACHE_CACHE_TABLE:
                fields = {k.name.rsplit(".", 1)[-1]: k.value for k in e.key}
                hit = fields.get("tenant") == tenant and fields.get("key") == key
                if hit and e.params.get("slot_base", 0) + frag_idx >= c.NUM_FRAG_SLOTS:
                    return "slot_address_wraps"
    if path == "drop:BAD_FRAGMENT" and _is_kvp(case.frame, c.KVP_OP_WRITE):
        if _U32.unpack_from(case.frame, _KVP + 32)[0] >= c.NUM_FRAG_SLOTS:
            return "fanout_copy_index_unchecked"
    return None


def replay_file(path: Path, p4info: p4i.P4Info, fix_checksum: bool) -> list[dict[str, Any]]:
    """Replays every test of one PTF file (see tna_replay.replay_file)."""
    return [replay_case(case, p4info, fix_checksum) for case in parse_ptf(path.read_text())]
