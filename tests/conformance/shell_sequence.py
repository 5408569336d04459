"""One sequence of P4Runtime operations, sent by p4runtime-shell to a switch; prints JSON results.

Runs in p4runtime-shell's own virtual environment (it pins protobuf < 3.21), never in the
project's: it imports only p4runtime_sh, its p4.v1 protos, grpc and the standard library.
tests/conformance/test_p4rt_shell.py runs it against each target and compares the outputs.

Usage: python shell_sequence.py --grpc-addr HOST:PORT --p4info P4INFO.txtpb --bin DEVICE_CONFIG

Output: one JSON list; per operation ``{"op", "code", "updates", "result", "message"}``: ``code``
is the gRPC status name (``OK`` when it succeeded), ``updates`` the per-update error codes of a
failed Write, ``result`` what a read returned (sorted one-line text of each entity).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

import grpc
import p4runtime_sh.shell as sh
from google.protobuf import text_format
from google.rpc import code_pb2, status_pb2
from p4.v1 import p4runtime_pb2 as p4r
from p4runtime_sh.p4runtime import P4RuntimeException, P4RuntimeWriteException

CACHE = "KvcastIngress.cache.cache_table"
ROUTE = "KvcastIngress.forwarding.ipv4_lpm"
L2 = "KvcastIngress.forwarding.l2_fwd"
PORT_ROLE = "KvcastIngress.port_role.port_role"
BINDING = "KvcastIngress.port_role.tenant_binding"
MEMBER = "KvcastIngress.port_role.group_member"
SKETCH = "KvcastIngress.hot_sketch.sketch_config"
OWNER = "KvcastIngress.pool_owner.pool_owner"
REPLICA = "KvcastEgress.replica.replica_dst"
DROPS = "KvcastIngress.stats.drop_counter"
CACHE_COUNTER = "KvcastIngress.cache.cache_counter"
DIGEST = "hot_miss_digest_t"
REGISTER = "KvcastIngress.fragments.frag_epoch"
ELECTION = (0, 20)


class Recorder:
    """Runs named operations and keeps one result record per operation."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def op(self, name: str, fn: Callable[[], Any]) -> Any:
        """Runs ``fn``; records its outcome under ``name``; returns its value (None on error)."""
        rec: dict[str, Any] = {"op": name, "code": "OK", "updates": [], "result": None}
        rec["message"] = ""
        value = None
        try:
            value = fn()
            if isinstance(value, list):
                rec["result"] = sorted(value)
            elif value is not None:
                rec["result"] = value
        except WriteFailedError as exc:
            rec["code"] = "UNKNOWN"
            rec["updates"] = [code_pb2.Code.Name(e.canonical_code) for e in exc.errors]
            rec["message"] = "; ".join(e.message for e in exc.errors if e.message)
        except P4RuntimeWriteException as exc:
            rec["code"] = "UNKNOWN"
            rec["updates"] = [code_pb2.Code.Name(e.canonical_code) for _, e in exc.errors]
            rec["message"] = "; ".join(e.message for _, e in exc.errors)
        except P4RuntimeException as exc:
            rec["code"] = exc.grpc_error.code().name
            rec["message"] = exc.grpc_error.details() or ""
        except grpc.RpcError as exc:
            rec["code"] = exc.code().name
            rec["message"] = exc.details() or ""
        self.records.append(rec)
        return value


def _text(msg: Any) -> str:
    return text_format.MessageToString(msg, as_one_line=True)


def _read(entity: Any) -> list[str]:
    """Reads through the shell's entity object; one-line text of each returned message."""
    return [_text(e.msg()) for e in entity.read()]


def _raw_read(entity: p4r.Entity) -> list[str]:
    req = p4r.ReadRequest(device_id=sh.client.device_id, entities=[entity])
    out: list[str] = []
    for rep in sh.client.stub.Read(req):
        out += [_text(e) for e in rep.entities]
    return out


class WriteFailedError(Exception):
    """A failed Write's per-update errors, every one of them (OK ones included)."""

    def __init__(self, errors: list[Any]) -> None:
        super().__init__("Write failed")
        self.errors = errors


def _raw_write(*updates: p4r.Update, election: tuple[int, int] = ELECTION, **fields: Any) -> None:
    """A Write of these updates; ``fields`` set other WriteRequest fields (device_id...).

    Its errors are parsed here: p4runtime-shell 0.0.6's parser loops forever on a failed Write's
    OK details (P4RuntimeErrorIterator never advances past one), so a batch with one good update
    cannot go through ``client.write``.
    """
    req = p4r.WriteRequest(updates=list(updates), **fields)
    if "device_id" not in fields:
        req.device_id = sh.client.device_id
    req.election_id.high, req.election_id.low = election
    try:
        sh.client.stub.Write(req)
    except grpc.RpcError as exc:
        if exc.code() != grpc.StatusCode.UNKNOWN:
            raise
        errors = []
        for key, value in exc.trailing_metadata() or ():
            if key == "grpc-status-details-bin":
                status = status_pb2.Status()
                status.ParseFromString(value)
                for detail in status.details:
                    error = p4r.Error()
                    detail.Unpack(error)
                    errors.append(error)
        raise WriteFailedError(errors) from None


def _update(kind: int, te: p4r.TableEntry) -> p4r.Update:
    upd = p4r.Update(type=kind)
    upd.entity.table_entry.CopyFrom(te)
    return upd


def _set_pipeline(action: int, p4info: Any, blob: bytes) -> None:
    req = p4r.SetForwardingPipelineConfigRequest(device_id=sh.client.device_id, action=action)
    req.election_id.high, req.election_id.low = ELECTION
    req.config.p4info.CopyFrom(p4info)
    req.config.p4_device_config = blob
    sh.client.stub.SetForwardingPipelineConfig(req)


def _get_pipeline(kind: int) -> p4r.ForwardingPipelineConfig:
    req = p4r.GetForwardingPipelineConfigRequest(device_id=sh.client.device_id, response_type=kind)
    return sh.client.stub.GetForwardingPipelineConfig(req).config


def cache_entry(tenant: int, key: int, slot: int = 64, frags: int = 4, epoch: int = 7) -> Any:
    te = sh.TableEntry(CACHE)(action="KvcastIngress.cache.cache_hit")
    te.match["tenant"] = str(tenant)
    te.match["key"] = str(key)
    te.action["slot_base"], te.action["frag_count"], te.action["epoch"] = (
        str(slot),
        str(frags),
        str(epoch),
    )
    return te


def tables(rec: Recorder) -> None:
    """Entries of every kind of table: keyed, LPM, keyless, const default; their errors."""
    for name in (PORT_ROLE, BINDING, MEMBER, CACHE, SKETCH, OWNER, ROUTE, L2, REPLICA):
        short = name.rsplit(".", 1)[1]
        rec.op(f"read default {short}", lambda n=name: _read(sh.TableEntry(n)(is_default=True)))
        rec.op(f"read all {short} (empty)", lambda n=name: _read(sh.TableEntry(n)))

    rec.op("insert cache entry", lambda: cache_entry(1, 0xABCDEF).insert())
    rec.op("insert cache entry again", lambda: cache_entry(1, 0xABCDEF).insert())
    rec.op("read cache entries", lambda: _read(sh.TableEntry(CACHE)))
    rec.op("modify cache entry", lambda: cache_entry(1, 0xABCDEF, slot=128, epoch=8).modify())
    one = sh.TableEntry(CACHE)
    one.match["tenant"], one.match["key"] = "1", str(0xABCDEF)
    rec.op("read cache entry by key", lambda: _read(one))
    rec.op("modify missing cache entry", lambda: cache_entry(2, 5).modify())
    rec.op("delete missing cache entry", lambda: cache_entry(2, 5).delete())

    te = cache_entry(1, 0xABCDEF).msg()
    wide = p4r.TableEntry()
    wide.CopyFrom(te)
    wide.match[0].exact.value = b"\x01\x00\x00"  # 17 bits in a 16-bit field
    rec.op("insert value wider than field", lambda: _raw_write(_update(p4r.Update.INSERT, wide)))
    padded = p4r.TableEntry()
    padded.CopyFrom(te)
    padded.match[0].exact.value = b"\x00\x00\x02"
    rec.op("insert with leading zero bytes", lambda: _raw_write(_update(p4r.Update.INSERT, padded)))
    rec.op("read after padded insert", lambda: _read(sh.TableEntry(CACHE)))
    missing = p4r.TableEntry()
    missing.CopyFrom(te)
    del missing.match[1]
    rec.op("insert missing match field", lambda: _raw_write(_update(p4r.Update.INSERT, missing)))
    bad_table = p4r.TableEntry()
    bad_table.CopyFrom(te)
    bad_table.table_id = 0x02FFFFFF
    rec.op("insert unknown table", lambda: _raw_write(_update(p4r.Update.INSERT, bad_table)))
    bad_action = p4r.TableEntry()
    bad_action.CopyFrom(te)
    bad_action.action.action.action_id = sh.context.get_action_id("KvcastIngress.forwarding.route")
    rec.op("insert action not in table", lambda: _raw_write(_update(p4r.Update.INSERT, bad_action)))
    few = p4r.TableEntry()
    few.CopyFrom(te)
    del few.action.action.params[2]
    rec.op("insert too few params", lambda: _raw_write(_update(p4r.Update.INSERT, few)))
    noact = p4r.TableEntry()
    noact.CopyFrom(te)
    noact.match[1].exact.value = b"\x09"
    noact.ClearField("action")
    rec.op("insert without action", lambda: _raw_write(_update(p4r.Update.INSERT, noact)))
    prio = p4r.TableEntry()
    prio.CopyFrom(te)
    prio.match[1].exact.value = b"\x0a"
    prio.priority = 5
    rec.op("insert priority in exact table", lambda: _raw_write(_update(p4r.Update.INSERT, prio)))
    mixed = p4r.Update(type=p4r.Update.INSERT)
    mixed.entity.table_entry.CopyFrom(cache_entry(3, 3).msg())
    rec.op(
        "write batch one good one duplicate",
        lambda: _raw_write(mixed, _update(p4r.Update.INSERT, te)),
    )

    route = sh.TableEntry(ROUTE)(action="KvcastIngress.forwarding.route")
    route.match["dst_addr"] = "10.0.1.0/24"
    route.action["port"], route.action["smac"], route.action["dmac"] = (
        "2",
        "00:00:00:00:01:01",
        "00:00:00:00:02:02",
    )
    rec.op("insert lpm route", route.insert)
    rec.op("read lpm routes", lambda: _read(sh.TableEntry(ROUTE)))
    lpm = route.msg()
    bad_lpm = p4r.TableEntry()
    bad_lpm.CopyFrom(lpm)
    bad_lpm.match[0].lpm.value = b"\x0a\x00\x01\x05"  # bits past the prefix length
    rec.op(
        "insert lpm with bits past prefix", lambda: _raw_write(_update(p4r.Update.INSERT, bad_lpm))
    )
    zero = p4r.TableEntry()
    zero.CopyFrom(lpm)
    zero.match[0].lpm.prefix_len = 0
    zero.match[0].lpm.value = b"\x00"
    rec.op("insert lpm prefix length 0", lambda: _raw_write(_update(p4r.Update.INSERT, zero)))
    rec.op("delete lpm route", route.delete)
    rec.op("read lpm routes after delete", lambda: _read(sh.TableEntry(ROUTE)))

    miss = sh.TableEntry(CACHE)(is_default=True, action="KvcastIngress.cache.cache_miss")
    rec.op("modify default cache (cache_miss)", miss.modify)
    rec.op("read default cache after modify", lambda: _read(sh.TableEntry(CACHE)(is_default=True)))
    rec.op("insert default entry", miss.insert)
    rec.op("delete default entry", miss.delete)
    hit_default = sh.TableEntry(CACHE)(is_default=True, action="KvcastIngress.cache.cache_hit")
    hit_default.action["slot_base"], hit_default.action["frag_count"] = "1", "1"
    hit_default.action["epoch"] = "1"
    rec.op("modify default cache to a table-only action", hit_default.modify)
    keyed_default = p4r.TableEntry()
    keyed_default.CopyFrom(miss.msg())
    keyed_default.match.extend(te.match)
    rec.op(
        "modify default with a key",
        lambda: _raw_write(_update(p4r.Update.MODIFY, keyed_default)),
    )
    denied = sh.TableEntry(BINDING)(is_default=True, action="KvcastIngress.port_role.tenant_ok")
    rec.op("modify const default action", denied.modify)

    sketch = sh.TableEntry(SKETCH)(
        is_default=True, action="KvcastIngress.hot_sketch.set_sketch_config"
    )
    sketch.action["threshold"], sketch.action["window"] = "8", "1000"
    rec.op("modify keyless default", sketch.modify)
    rec.op("read keyless default", lambda: _read(sh.TableEntry(SKETCH)(is_default=True)))
    normal = p4r.TableEntry()
    normal.CopyFrom(sketch.msg())
    normal.is_default_action = False
    rec.op(
        "insert normal entry in keyless table",
        lambda: _raw_write(_update(p4r.Update.INSERT, normal)),
    )
    rec.op("read all keyless (no normal entry)", lambda: _read(sh.TableEntry(SKETCH)))

    rec.op(
        "read all tables (table_id 0)",
        lambda: _raw_read(p4r.Entity(table_entry=p4r.TableEntry())),
    )


def counters(rec: Recorder) -> None:
    """Indirect and direct counters: reads by index and wildcard, writes, errors."""
    c = sh.CounterEntry(DROPS)
    c.index = 3
    rec.op("read counter index 3", lambda: _read(c))
    rec.op("read counter all cells", lambda: _read(sh.CounterEntry(DROPS)))
    w = sh.CounterEntry(DROPS)
    w.index, w.packet_count = 2, 11
    rec.op("write counter index 2", w.modify)
    r2 = sh.CounterEntry(DROPS)
    r2.index = 2
    rec.op("read counter index 2 after write", lambda: _read(r2))
    big = sh.CounterEntry(DROPS)
    big.index = 1000
    rec.op("read counter index out of range", lambda: _read(big))
    rec.op(
        "read all counters (counter_id 0)",
        lambda: _raw_read(p4r.Entity(counter_entry=p4r.CounterEntry())),
    )

    d = sh.DirectCounterEntry(CACHE_COUNTER)
    d.table_entry = cache_entry(1, 0xABCDEF)
    rec.op("read direct counter of an entry", lambda: _read(d))
    d.packet_count = 5
    rec.op("write direct counter of an entry", d.modify)
    d2 = sh.DirectCounterEntry(CACHE_COUNTER)
    d2.table_entry = cache_entry(1, 0xABCDEF)
    rec.op("read direct counter after write", lambda: _read(d2))
    d3 = sh.DirectCounterEntry(CACHE_COUNTER)
    d3.table_entry = cache_entry(9, 9)
    rec.op("read direct counter of a missing entry", lambda: _read(d3))
    dd = sh.DirectCounterEntry(CACHE_COUNTER)
    dd.table_entry = sh.TableEntry(CACHE)(is_default=True)
    rec.op("read direct counter of the default entry", lambda: _read(dd))
    rec.op(
        "read cache entries with counter data",
        lambda: _raw_read(
            p4r.Entity(
                table_entry=p4r.TableEntry(
                    table_id=sh.context.get_table_id(CACHE), counter_data=p4r.CounterData()
                )
            )
        ),
    )


def replication(rec: Recorder) -> None:
    """Multicast groups and clone sessions."""
    g = sh.MulticastGroupEntry(7).add(1, 1).add(2, 1)
    rec.op("insert multicast group", g.insert)
    rec.op("insert multicast group again", g.insert)
    rec.op("read multicast group 7", lambda: _read(sh.MulticastGroupEntry(7)))
    rec.op("modify multicast group", sh.MulticastGroupEntry(7).add(3, 2).modify)
    rec.op("read all multicast groups", lambda: _read(sh.MulticastGroupEntry()))
    rec.op("read missing multicast group", lambda: _read(sh.MulticastGroupEntry(99)))
    rec.op("delete multicast group", sh.MulticastGroupEntry(7).delete)
    rec.op("delete missing multicast group", sh.MulticastGroupEntry(7).delete)
    zero = p4r.Update(type=p4r.Update.INSERT)
    zero.entity.packet_replication_engine_entry.multicast_group_entry.multicast_group_id = 0
    rec.op("insert multicast group 0", lambda: _raw_write(zero))
    s = sh.CloneSessionEntry(5).add(3, 1)
    rec.op("insert clone session", s.insert)
    rec.op("read clone session", lambda: _read(sh.CloneSessionEntry(5)))
    rec.op("delete clone session", sh.CloneSessionEntry(5).delete)


def digests_and_more(rec: Recorder, p4info: Any) -> None:
    """Digest configs, registers, packet-out, arbitration and request-level errors."""
    d = sh.DigestEntry(DIGEST)
    d.max_timeout_ns, d.max_list_size, d.ack_timeout_ns = 1000000, 10, 1000000000
    rec.op("insert digest entry", d.insert)
    rec.op("read digest entry", lambda: _read(sh.DigestEntry(DIGEST)))
    d.max_list_size = 20
    rec.op("modify digest entry", d.modify)
    rec.op("delete digest entry", sh.DigestEntry(DIGEST).delete)
    rec.op("read digest entry after delete", lambda: _read(sh.DigestEntry(DIGEST)))

    reg = p4r.Entity()
    (reg.register_entry.register_id,) = (
        r.preamble.id for r in p4info.registers if r.preamble.name == REGISTER
    )
    reg.register_entry.index.index = 0
    rec.op("read register cell", lambda: _raw_read(reg))

    rec.op(
        "packet out (stream, no answer)",
        lambda: sh.PacketOut(b"\x00" * 60, egress_port="1", pad="0").send(),
    )
    good = p4r.Update(type=p4r.Update.INSERT)
    good.entity.table_entry.CopyFrom(cache_entry(4, 4).msg())
    rec.op("write as a backup election id", lambda: _raw_write(good, election=(0, 1), device_id=1))
    rec.op("write with wrong device id", lambda: _raw_write(good, device_id=9))
    rec.op(
        "write with rollback atomicity",
        lambda: _raw_write(good, atomicity=p4r.WriteRequest.ROLLBACK_ON_ERROR),
    )
    rec.op("write with no updates", lambda: _raw_write())
    rec.op(
        "read with wrong device id",
        lambda: list(sh.client.stub.Read(p4r.ReadRequest(device_id=9))),
    )


def pipelines(rec: Recorder, p4info: Any, blob: bytes) -> None:
    """Set / Get ForwardingPipelineConfig: verify, save and commit, reconcile, bad configs."""
    S = p4r.SetForwardingPipelineConfigRequest  # noqa: N806
    G = p4r.GetForwardingPipelineConfigRequest  # noqa: N806

    def summary(kind: int) -> dict[str, str]:
        config = _get_pipeline(kind)
        dc = config.p4_device_config
        return {
            "p4info": "absent" if not config.HasField("p4info") else str(config.p4info == p4info),
            "device_config": "as pushed"
            if dc == blob and kind != G.COOKIE_ONLY
            else "absent"
            if not dc
            else "other",
        }

    rec.op("get pipeline (all)", lambda: summary(G.ALL))
    rec.op("get pipeline (cookie only)", lambda: summary(G.COOKIE_ONLY))
    rec.op("get pipeline (device config)", lambda: summary(G.DEVICE_CONFIG_AND_COOKIE))
    rec.op("verify good config", lambda: _set_pipeline(S.VERIFY, p4info, blob))
    rec.op("verify garbage device config", lambda: _set_pipeline(S.VERIFY, p4info, b"garbage"))
    rec.op("reconcile and commit", lambda: _set_pipeline(S.RECONCILE_AND_COMMIT, p4info, blob))
    rec.op("entries kept by reconcile", lambda: _read(sh.TableEntry(CACHE)))
    rec.op("verify and save", lambda: _set_pipeline(S.VERIFY_AND_SAVE, p4info, blob))
    rec.op("commit saved", lambda: _set_pipeline(S.COMMIT, p4info, blob))
    rec.op("verify and commit", lambda: _set_pipeline(S.VERIFY_AND_COMMIT, p4info, blob))
    rec.op("entries cleared by commit", lambda: _read(sh.TableEntry(CACHE)))
    rec.op("groups cleared by commit", lambda: _read(sh.MulticastGroupEntry()))
    rec.op("default restored by commit", lambda: _read(sh.TableEntry(CACHE)(is_default=True)))
    # Last: either leaves BMv2 unable to save, reconcile or (the garbage) read its tables.
    rec.op("commit with nothing saved", lambda: _set_pipeline(S.COMMIT, p4info, blob))
    rec.op("insert before a garbage commit", lambda: cache_entry(1, 1).insert())
    rec.op(
        "commit garbage device config",
        lambda: _set_pipeline(S.VERIFY_AND_COMMIT, p4info, b"\xff\x00garbage"),
    )
    rec.op("entries after a refused commit", lambda: _read(sh.TableEntry(CACHE)))


def main(argv: list[str] | None = None) -> int:
    """Runs the whole sequence against one switch; prints the records as JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grpc-addr", required=True)
    ap.add_argument("--p4info", required=True)
    ap.add_argument("--bin", required=True, help="the target's device config (may be empty)")
    ap.add_argument("--device-id", type=int, default=1)
    args = ap.parse_args(argv)
    rec = Recorder()
    # Before any pipeline: a raw client (the shell's setup needs a pipeline to read).
    client = sh.P4RuntimeClient(args.device_id, args.grpc_addr, ELECTION)
    sh.client = client
    rec.op("capabilities", lambda: client.api_version())
    rec.op("get pipeline before any", lambda: _get_pipeline(0) and None)
    rec.op("read before any pipeline", lambda: list(client.stub.Read(p4r.ReadRequest(device_id=1))))
    p4info = p4r.ForwardingPipelineConfig().p4info
    with open(args.p4info) as f:
        text_format.Merge(f.read(), p4info, allow_unknown_field=True)
    with open(args.bin, "rb") as f:
        blob = f.read()
    S = p4r.SetForwardingPipelineConfigRequest  # noqa: N806
    rec.op("commit first pipeline", lambda: _set_pipeline(S.VERIFY_AND_COMMIT, p4info, blob))
    client.tear_down()
    sh.setup(
        device_id=args.device_id, grpc_addr=args.grpc_addr, election_id=ELECTION, verbose=False
    )
    try:
        tables(rec)
        counters(rec)
        replication(rec)
        digests_and_more(rec, p4info)
        pipelines(rec, p4info, blob)
    finally:
        sh.teardown()
    json.dump(rec.records, sys.stdout, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
