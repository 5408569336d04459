"""The TNA program executed: p4testgen's tests of it, replayed into the reference target.

No model of the chip runs here (docs/tofino.md), so the TNA program's behaviour is executed by
p4c's test generator: p4testgen with its Tofino target runs the program symbolically and writes
packet tests (table entries, register cells, the packet in, the packet out or a drop) that hold
for the program's semantics. tests/p4src/tna_replay.py replays each test into the reference
target built with the Tofino sizes and compares verdicts and bytes; a difference must be one
docs/tofino.md lists, or the test fails.

Two levels:

* always: the reader and the replay on a small sample written here in the shape of
  p4testgen's PTF template (``PTF::getTestCaseTemplate`` in p4c's
  backends/p4tools/modules/testgen/targets/tofino/test_backend/ptf.cpp). It is hand-made, not
  p4testgen's output: its expected packets are built from the TNA program's actions as read,
  so it checks the harness (parsing, entries, registers, the fan-out acknowledgement, the
  judgement, which must be able to fail), not the TNA program;
* where p4testgen is installed: p4testgen on the TNA program (fixed seed, bounded number of
  tests), every test replayed, the GET hit, GET miss, WRITE fan-out and security-drop paths
  among them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from emulation.targets import REPO
from emulation.targets import testgen_binary as find_p4testgen
from kvcast import p4constants as c
from kvcast.tools.gen_constants import parse_sizes
from kvcast.wire import KvpHeader, ipv4_checksum, udp_frame
from tests.p4src.testgen_ptf import PtfFormatError, parse_ptf

TOFINO = parse_sizes(REPO / "p4src" / "shared" / "sizes.p4", REPO / "p4src", "__TARGET_TOFINO__")
FRAG = TOFINO["FRAG_BYTES"]
CPU = TOFINO["CPU_PORT_NUM"]

# p4testgen's runs: bounded and reproducible (seed, tests, path selection). Which paths a run
# reaches depends on its seed: depth-first from seed 3 reaches the GET miss, the WRITE fan-out
# and DATA, from seed 6 the GET hit's epoch and bound checks; greedy statement coverage from
# seed 13 a GET hit's reply, from seed 1 the edge guard's and the verdict's security drops.
# About four minutes here in all, and over five under load: the tests that wait for them (the
# module fixture is set up inside the first one's timeout) allow TESTGEN_TEST_TIMEOUT_S.
TESTGEN_RUNS = (
    (3, 1000, "DEPTH_FIRST"),
    (6, 600, "DEPTH_FIRST"),
    (13, 400, "GREEDY_STATEMENT_SEARCH"),
    (1, 1500, "GREEDY_STATEMENT_SEARCH"),
)
TESTGEN_TIMEOUT_S = 1800
TESTGEN_TEST_TIMEOUT_S = 2400
# The paths the issue names, as the reference target classes them (tna_replay).
REQUIRED_PATHS = ("get_hit", "get_miss", "write_fanout_ack", "security_drop")


# ---------------------------------------------------------------------------------- sample
HOST_MAC, SWITCH_MAC, POOL_MAC = "00:00:00:00:00:01", "02:00:00:00:00:fe", "00:00:00:00:01:01"
HOST_IP, VIP, POOL_IP = "10.0.0.1", "10.0.100.1", "10.0.1.1"
KEY, TENANT = 0x1122334455667788, 1
FANOUT_PORT = 68
WORDS = [0x01020304 * (i + 1) & 0xFFFFFFFF for i in range(FRAG // 4)]


def _ip(text: str) -> int:
    return int.from_bytes(bytes(int(x) for x in text.split(".")), "big")


def _mac(text: str) -> int:
    return int(text.replace(":", ""), 16)


def _kvp(src_ip: str, hdr: KvpHeader, payload: bytes, sport: int = 40001) -> bytes:
    return udp_frame(HOST_MAC, SWITCH_MAC, src_ip, VIP, sport, c.KVP_UDP_PORT, hdr.pack() + payload)


def _rewrite(frame: bytes, **fields: bytes) -> bytes:
    """The frame with byte ranges replaced (``at_<offset>=bytes``) and its IPv4 checksum redone."""
    out = bytearray(frame)
    for name, value in fields.items():
        at = int(name.removeprefix("at_"))
        out[at : at + len(value)] = value
    out[24:26] = b"\0\0"
    out[24:26] = ipv4_checksum(bytes(out[14:34])).to_bytes(2, "big")
    return bytes(out)


@dataclass
class SampleTest:
    """One test of the sample, rendered as p4testgen's PTF template renders one."""

    calls: list[str]
    port: int
    frame: bytes
    expect: tuple[int, bytes, list[tuple[int, int]]] | None = None

    def render(self, n: int) -> str:
        lit = "".join(f"\\x{b:02x}" for b in self.frame)
        lines = [f"\nclass Test{n}(AbstractTest):", "    def setupCtrlPlane(self):"]
        lines += [f"        {call}" for call in self.calls] or ["        pass"]
        lines += ["", "    def sendPacket(self):", f"        ig_port = {self.port}"]
        lines += [f"        pkt = b'{lit}'", "        send_packet(self, ig_port, pkt)", ""]
        lines += ["    def verifyPackets(self):"]
        if self.expect is None:
            lines += ["        pass"]
        else:
            port, frame, ignore = self.expect
            exp = "".join(f"\\x{b:02x}" for b in frame)
            lines += [f"        eg_port = {port}", f"        exp_pkt = b'{exp}'"]
            lines += ["        exp_pkt = Mask(exp_pkt)"]
            lines += [f"        exp_pkt.set_do_not_care({a}, {b})" for a, b in ignore]
            lines += ["        verify_packet(self, exp_pkt, eg_port)"]
        lines += ["", "    def runTest(self):", "        self.runTestImpl()", ""]
        return "\n".join(lines)


def _entry(table: str, key: list[tuple[str, str]], action: str, params: dict[str, int]) -> str:
    keys = "".join(f"gc.KeyTuple('{k}', {v}), " for k, v in key)
    data = "".join(f"gc.DataTuple('{p}', {hex(v)}), " for p, v in params.items())
    return f"self.insertTableEntry('{table}', [{keys}], '{action}', [{data}])"


def _role(port: int, role: int) -> str:
    return _entry(
        "pipe.KvcastIngress.port_role.port_role",
        [("port", hex(port))],
        "KvcastIngress.port_role.set_port_role",
        {"role": role},
    )


def sample_tests() -> list[SampleTest]:
    """The hand-made sample: a GET hit, a GET miss, a fan-out WRITE, two security drops, a
    GET miss routed to the drop port.

    Expected packets follow the TNA program's actions (KvpReply.make_reply, PoolOwner,
    Forwarding.route, the WRITE_ACK of a fan-out port), built with kvcast.wire.
    """
    slot, idx, epoch, crc, stored_len = 17, 1, 5, 0x1234ABCD, 90
    value = b"".join(w.to_bytes(4, "big") for w in WORDS)
    get = _kvp(
        HOST_IP,
        KvpHeader(op=c.KVP_OP_GET, tenant=TENANT, key=KEY, req_id=7, frag_idx=idx),
        bytes(FRAG),
    )
    hit_reply = udp_frame(
        SWITCH_MAC,
        HOST_MAC,
        VIP,
        HOST_IP,
        c.KVP_UDP_PORT,
        40001,
        KvpHeader(
            op=c.KVP_OP_DATA,
            flags=c.KVP_FLAG_HIT,
            tenant=TENANT,
            key=KEY,
            req_id=7,
            epoch=epoch,
            frag_idx=idx,
            frag_count=3,
            payload_len=stored_len,
            crc=crc,
        ).pack()
        + value,
    )
    # p4testgen marks bits it cannot tell as don't-care: here the IPv4 identification, set to
    # a value the reference target does not send.
    hit_expected = _rewrite(hit_reply, at_18=b"\xbe\xef")
    hit = SampleTest(
        [
            _role(1, c.PORT_ROLE_HOST),
            _entry(
                "pipe.KvcastIngress.cache.cache_table",
                [("tenant", hex(TENANT)), ("key", hex(KEY))],
                "KvcastIngress.cache.cache_hit",
                {"slot_base": slot - idx, "frag_count": 3, "epoch": epoch},
            ),
            f"self.setRegisterValue('pipe.KvcastIngress.fragments.frag_epoch', {epoch}, {slot})",
            f"self.setRegisterValue('pipe.KvcastIngress.fragments.frag_crc', {crc}, {slot})",
            f"self.setRegisterValue('pipe.KvcastIngress.fragments.frag_len', {stored_len}, {slot})",
            *(
                f"self.setRegisterValue('pipe.KvcastIngress.fragments.slice_{i:02d}.frag_word', "
                f"{hex(w)}, {slot})"
                for i, w in enumerate(WORDS)
            ),
        ],
        1,
        get,
        (1, hit_expected, [(18 * 8, 16), (24 * 8, 16)]),
    )
    pool_mac = "00:00:00:00:01:01"
    miss_expected = _rewrite(
        get,
        at_0=bytes.fromhex(pool_mac.replace(":", "")) + bytes.fromhex(SWITCH_MAC.replace(":", "")),
        at_22=bytes([63]),
        at_30=bytes(int(x) for x in POOL_IP.split(".")),
    )
    miss = SampleTest(
        [
            _role(1, c.PORT_ROLE_HOST),
            _entry(
                "pipe.KvcastIngress.pool_owner.pool_owner",
                [("bucket", hex(KEY & (TOFINO["POOL_BUCKETS"] - 1)))],
                "KvcastIngress.pool_owner.set_pool",
                {"pool_ip": _ip(POOL_IP)},
            ),
            _entry(
                "pipe.KvcastIngress.forwarding.ipv4_lpm",
                [("dst_addr", f"{hex(_ip(POOL_IP))}, prefix_len=32")],
                "KvcastIngress.forwarding.route",
                {"port": 4, "smac": _mac(SWITCH_MAC), "dmac": _mac(pool_mac)},
            ),
            "self.setRegisterValue('pipe.KvcastIngress.hot_sketch.row0.cms_row', "
            "[('KvcastIngress.hot_sketch.row0.cms_row.count', 0x2), "
            "('KvcastIngress.hot_sketch.row0.cms_row.window', 0x0)], 7)",
        ],
        1,
        get,
        (4, miss_expected, []),
    )
    write_hdr = KvpHeader(
        op=c.KVP_OP_WRITE,
        tenant=TENANT,
        key=KEY,
        epoch=epoch,
        payload_len=FRAG,
        index=slot,
        crc=crc,
    )
    write = _kvp(HOST_IP, write_hdr, value, sport=c.KVP_AGENT_PORT)
    ack = bytearray(write)
    ack[42] = (c.KVP_VERSION << 4) | c.KVP_OP_WRITE_ACK
    ack[40:42] = b"\0\0"
    fanout = SampleTest(
        [_role(FANOUT_PORT, c.PORT_ROLE_FANOUT)],
        FANOUT_PORT,
        write,
        (CPU, (FANOUT_PORT << 7).to_bytes(2, "big") + bytes(ack), []),
    )
    spoofed = SampleTest(
        [
            _entry(
                "pipe.KvcastIngress.port_role.port_role",
                [("port", "0x2")],
                "KvcastIngress.port_role.bind_host",
                {"addr": _ip("10.0.0.2"), "check_tenant": 1},
            )
        ],
        2,
        _kvp("10.0.0.9", KvpHeader(op=c.KVP_OP_GET, tenant=TENANT, key=KEY), bytes(FRAG)),
    )
    from_cpu = SampleTest([], CPU, b"\0\0" + get)
    # Routed to the drop port: dropped on both.
    to_drop_port = SampleTest(
        [e.replace("'port', 0x4", "'port', 0x1ff") for e in miss.calls], 1, get
    )
    return [hit, miss, fanout, spoofed, from_cpu, to_drop_port]


SAMPLE_PATHS = [
    "get_hit",
    "get_miss",
    "write_fanout_ack",
    "security_drop:SPOOFED",
    "security_drop:BAD_TENANT",
    "get_miss",
]


def render_sample(tests: list[SampleTest]) -> str:
    """The sample as one PTF file (the template's preamble shortened to its imports)."""
    head = (
        "# PTF test for kvcast: a hand-made sample in p4testgen's PTF template, not its output\n"
        "from ptf.mask import Mask\nimport bfrt_grpc.client as gc\n"
    )
    return head + "".join(t.render(i) for i, t in enumerate(tests))


def replay(
    tmp_path: Path, ptf_files: list[Path], fix_checksum: bool = False
) -> list[dict[str, Any]]:
    """Runs tests/p4src/tna_replay.py in its own process (it swaps in the Tofino constants)."""
    out = tmp_path / "outcomes.json"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    flags = ["--fix-ipv4-checksum"] if fix_checksum else []
    proc = subprocess.run(
        [sys.executable, "-m", "tests.p4src.tna_replay", "--workdir", str(tmp_path), *flags]
        + ["--out", str(out), *map(str, ptf_files)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    outcomes: list[dict[str, Any]] = json.loads(out.read_text())
    return outcomes


# ---------------------------------------------------------------------------------- always
def test_the_reader_takes_the_templates_statements() -> None:
    cases = parse_ptf(render_sample(sample_tests()))
    assert [case.name for case in cases] == [f"Test{i}" for i in range(6)]
    hit = cases[0]
    assert hit.port == 1 and len(hit.registers) == 3 + FRAG // 4
    cache = hit.entries[1]
    assert cache.table == "pipe.KvcastIngress.cache.cache_table"
    assert [(k.name, k.value) for k in cache.key or ()] == [("tenant", TENANT), ("key", KEY)]
    assert cache.params == {"slot_base": 16, "frag_count": 3, "epoch": 5}
    assert hit.expected is not None and hit.expected.port == 1
    mask = hit.expected.care_mask()
    assert mask[18:20] == b"\0\0" and mask[17] == 0xFF and mask[20] == 0xFF
    lpm = cases[1].entries[2].key
    assert lpm is not None and lpm[0].prefix_len == 32
    assert cases[1].registers[0].fields["KvcastIngress.hot_sketch.row0.cms_row.count"] == 2
    assert cases[3].expected is None and cases[4].port == CPU


def test_the_reader_refuses_what_the_template_does_not_write() -> None:
    text = render_sample(sample_tests()[:1]).replace(
        "self.setRegisterValue(", "self.setRegisterParam(", 1
    )
    with pytest.raises(PtfFormatError, match="unknown call setRegisterParam"):
        parse_ptf(text)


def test_the_sample_replays_with_the_expected_verdicts(tmp_path: Path) -> None:
    ptf = tmp_path / "sample.py"
    ptf.write_text(render_sample(sample_tests()))
    outcomes = replay(tmp_path, [ptf])
    assert [o["path"] for o in outcomes] == SAMPLE_PATHS, outcomes
    assert [o["outcome"] for o in outcomes] == ["agree"] * 6, outcomes
    assert "hot_sketch.row0.cms_row" in outcomes[1]["detail"]


def test_the_replay_reports_a_checked_bit_that_differs(tmp_path: Path) -> None:
    tests = sample_tests()
    port, frame, ignore = tests[0].expect or (0, b"", [])
    # One bit of the fragment (checked) flipped; and the hit's don't-care ident left as is.
    bad = bytearray(frame)
    bad[100] ^= 0x10
    tests[0].expect = (port, bytes(bad), ignore)
    # The spoofed GET expected out instead of dropped.
    tests[3].expect = (2, tests[3].frame, [])
    ptf = tmp_path / "sample.py"
    ptf.write_text(render_sample(tests))
    outcomes = replay(tmp_path, [ptf])
    assert outcomes[0]["outcome"] == "mismatch" and "byte 100" in outcomes[0]["detail"]
    assert outcomes[3]["outcome"] == "mismatch"
    assert [o["outcome"] for o in outcomes[1:3] + outcomes[4:]] == ["agree"] * 4


def test_a_wrong_input_checksum_is_dropped_unless_corrected(tmp_path: Path) -> None:
    tests = sample_tests()[:1]
    bad = bytearray(tests[0].frame)
    bad[24] ^= 0xFF  # the IPv4 header checksum
    tests[0].frame = bytes(bad)
    ptf = tmp_path / "sample.py"
    ptf.write_text(render_sample(tests))
    as_sent = replay(tmp_path, [ptf])
    assert (as_sent[0]["path"], as_sent[0]["outcome"]) == ("drop:MALFORMED", "mismatch")
    corrected = replay(tmp_path, [ptf], fix_checksum=True)
    assert (corrected[0]["path"], corrected[0]["outcome"]) == ("get_hit", "agree")


# ---------------------------------------------------------------------------------- p4testgen
# p4testgen's Tofino target returns an unknown value from Checksum.verify (it does not sum the
# added fields), and every verdict after a branch on an unknown value is unknown: no IPv4
# packet would get a test. So it runs on a copy of p4src in which the parser's verification
# is `false` (a correct checksum), and the replay makes each input's checksum correct: the
# copy and the program agree on every such packet. The malformed-checksum drop is the
# conformance vectors' (reference target, BMv2), not this test's.
CHECKSUM_VERIFY = "meta.checksum_error = ipv4_checksum.verify();"


def program_without_checksum_verification(dest: Path) -> Path:
    """A copy of p4src whose TNA parser takes every IPv4 checksum as correct; its main file."""
    for part in ("tna", "shared"):
        shutil.copytree(REPO / "p4src" / part, dest / part)
    parser = dest / "tna" / "include" / "parser.p4"
    text = parser.read_text()
    assert text.count(CHECKSUM_VERIFY) == 1, "the TNA parser's checksum verification moved"
    parser.write_text(text.replace(CHECKSUM_VERIFY, "meta.checksum_error = false;"))
    return dest / "tna" / "kvcast.p4"


@pytest.fixture(scope="module")
def testgen_outcomes(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    binary = find_p4testgen()
    if binary is None:
        pytest.skip("p4testgen (p4c's testgen with its Tofino target) is not installed")
    out = tmp_path_factory.mktemp("testgen")
    main = program_without_checksum_verification(tmp_path_factory.mktemp("p4src"))
    files = []
    for seed, max_tests, selection in TESTGEN_RUNS:
        run_dir = out / f"seed{seed}"
        cmd = [
            binary,
            *("--target", "tofino", "--arch", "tna", "--std", "p4-16"),
            *("-I", str(main.parents[1]), "-D__TARGET_TOFINO__=1"),
            *("--test-backend", "PTF", "--seed", str(seed), "--max-tests", str(max_tests)),
            *("--path-selection", selection, "--out-dir", str(run_dir), str(main)),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TESTGEN_TIMEOUT_S)
        assert proc.returncode == 0, proc.stderr[-3000:]
        found = sorted(run_dir.glob("*.py"))
        assert found, f"p4testgen wrote no PTF file: {proc.stdout[-2000:]}"
        files += found
    return replay(out, files, fix_checksum=True)


@pytest.mark.timeout(TESTGEN_TEST_TIMEOUT_S)
def test_every_generated_test_agrees_or_is_a_documented_difference(
    testgen_outcomes: list[dict[str, Any]],
) -> None:
    bad = [o for o in testgen_outcomes if o["outcome"] in ("mismatch", "unmapped")]
    assert not bad, json.dumps(bad, indent=1)
    documented = {o["outcome"] for o in testgen_outcomes if o["outcome"].startswith("documented")}
    text = (REPO / "docs" / "tofino.md").read_text()
    for outcome in documented:
        assert f"`{outcome.split(':', 1)[1]}`" in text, f"{outcome} is not in docs/tofino.md"


@pytest.mark.timeout(TESTGEN_TEST_TIMEOUT_S)
def test_the_generated_tests_cover_the_issues_paths(testgen_outcomes: list[dict[str, Any]]) -> None:
    agreed = {o["path"].split(":")[0] for o in testgen_outcomes if o["outcome"] == "agree"}
    missing = [p for p in REQUIRED_PATHS if p not in agreed]
    assert not missing, f"no agreeing generated test on {missing}: " + json.dumps(
        [(o["name"], o["path"], o["outcome"]) for o in testgen_outcomes]
    )
