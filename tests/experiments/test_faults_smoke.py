"""The fault campaign's quick mode on the emulated cluster: faults cost time, never a wrong byte."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from refswitch.impair import Impairment, ImpairSpec
from tests.mininet_env import MININET_MISSING


def test_impairment_specs_parse_and_refuse_nonsense() -> None:
    spec = ImpairSpec.parse("loss=0.01,reorder=0.05,seed=3")
    assert (spec.loss, spec.reorder, spec.seed, str(spec)) == (
        0.01,
        0.05,
        3,
        "loss=0.01,reorder=0.05",
    )
    assert str(ImpairSpec.parse("")) == "none"
    assert ImpairSpec.parse("jitter=0.005").jitter == 0.005
    for bad in ("loss=2", "jitter=2", "delay=0.1", "loss"):
        with pytest.raises(ValueError):
            ImpairSpec.parse(bad)


def test_the_impairment_stage_does_what_it_says() -> None:
    sent: list[tuple[int, bytes]] = []
    frames = [bytes([i % 256]) * 100 for i in range(2000)]
    imp = Impairment(ImpairSpec(loss=0.1, dup=0.1, corrupt=0.1, reorder=0.1, seed=5))
    for f in frames:
        imp.send(1, f, lambda port, frame: sent.append((port, frame)))
    imp.flush(lambda port, frame: sent.append((port, frame)))
    counts = imp.counts
    assert counts["frames"] == 2000
    assert all(150 < counts[k] < 260 for k in ("lost", "duplicated", "reordered"))
    assert len(sent) == 2000 - counts["lost"] + counts["duplicated"]
    originals = set(frames)
    corrupted = [f for _, f in sent if f not in originals]
    assert 0 < len(corrupted) <= counts["corrupted"] * (1 + 0.1)  # a duplicate may repeat one
    for f in corrupted:  # one bit flipped, after the Ethernet, IPv4 and UDP headers
        original = bytes([f[0]]) * len(f)
        diff = [i for i in range(len(f)) if f[i] != original[i]]
        assert (
            len(diff) == 1 and diff[0] >= 42 and bin(f[diff[0]] ^ original[diff[0]]).count("1") == 1
        )


def test_relief_is_paired_by_repeat_and_divided_by_the_fault_free_median() -> None:
    from experiments.faults import _add_relief

    def row(fault: str, mode: str, repeat: int, t: float) -> dict[str, object]:
        return {"fault": fault, "mode": mode, "repeat": repeat, "t_s": t, "relief": None,
                "relief_vs_clean": None}  # fmt: skip

    rows = [
        *(row("none", "a", r, 0.4) for r in range(3)),
        row("none", "b", 0, 0.1), row("none", "b", 1, 0.05), row("none", "b", 2, 0.08),
        row("loss 1%", "a", 0, 0.4), row("loss 1%", "b", 0, 0.2),
        row("loss 1%", "a", 1, 0.8), row("loss 1%", "b", 1, 0.1),
        row("loss 1%", "d", 0, 0.1),
    ]  # fmt: skip
    _add_relief(rows)
    # Fault-free reliefs 4, 8, 5: median 5.
    assert [r["relief"] for r in rows[3:6]] == [4.0, 8.0, 5.0]
    assert [r["relief"] for r in rows[6:]] == [None, 2.0, None, 8.0, None]
    assert [r["relief_vs_clean"] for r in rows[6:]] == [None, 0.4, None, 1.6, None]


def test_jitter_delays_each_frame_within_its_bound_and_loses_none() -> None:
    now = [0.0]
    sent: list[tuple[float, bytes]] = []
    imp = Impairment(ImpairSpec(jitter=0.01, seed=2), clock=lambda: now[0])
    frames = [i.to_bytes(2, "big") * 40 for i in range(500)]
    sent_at: dict[bytes, float] = {}
    for f in frames:
        sent_at[f] = now[0]
        imp.send(1, f, lambda _port, frame: sent.append((now[0], frame)))
        now[0] += 0.001
    while imp.next_due() is not None:
        now[0] += imp.next_due() or 0.0
        imp.release_due(lambda _port, frame: sent.append((now[0], frame)))
    assert sorted(f for _, f in sent) == sorted(frames)  # none lost, none repeated
    assert all(0.0 <= t - sent_at[f] <= 0.01 + 0.001 for t, f in sent)
    assert [f for _, f in sent] != frames  # delays that cross reorder, as netem's jitter
    assert imp.counts["delayed"] == 500


@pytest.mark.slow
@pytest.mark.netns
# About 3 minutes alone (a dozen emulated clusters: three faults, the incast kill, five restarts,
# the trace replay under loss); the suite's 300 s would leave a loaded machine no margin.
@pytest.mark.timeout(900)
def test_quick_campaign_completes_every_fetch_with_the_right_bytes(tmp_path: Path) -> None:
    if MININET_MISSING:
        pytest.skip(MININET_MISSING)
    from experiments.faults import main

    rc = main(["--quick", "--out", str(tmp_path)])
    # What went wrong, if anything, in the failure's message: every row with an error.
    errors = [
        f"{path.name}: {row}"
        for path in sorted(tmp_path.glob("*.csv"))
        for row in csv.DictReader(path.open())
        if row.get("error") and "restarted and re-programmed" not in row["error"]
    ]
    assert rc == 0, errors
    rows = (tmp_path / "faults.csv").read_text().splitlines()
    header = rows[0].split(",")
    recs = [dict(zip(header, r.split(","), strict=True)) for r in rows[1:]]
    assert {r["fault"] for r in recs} == {"none", "loss 1%", "corrupt 1%"}
    assert all(r["wrong_bytes"] == "0" for r in recs)
    assert all(int(r["completed"]) + int(r["refused"]) == int(r["attempted"]) for r in recs)
    assert "no netem" in (tmp_path / "faults.txt").read_text()
    # The restarts: the controller daemon re-programmed the restarted switch, a restarted
    # daemon adopted the cache without orphans, a restarted pool answered again; hits returned,
    # no wrong byte.
    with (tmp_path / "restarts.csv").open() as fh:
        switch, controller, during_load, pool, master = list(csv.DictReader(fh))
    for row in (switch, controller, during_load, pool):
        assert row["error"] == "" and row["wrong_bytes"] == "0" and row["missing"] == "0", row
        assert row["hits_return_s"], row
    assert switch["resync_s"] and controller["resync_s"] and during_load["resync_s"]
    assert int(switch["resident_after"]) >= int(switch["resident_before"]), switch
    assert controller["orphans"] == "0" and during_load["orphans"] == "0"
    # Killed with part of a block's WRITEs in SRAM (not a multiple of its 64 fragments).
    assert 0 < int(during_load["partial_frags"]) < 64, during_load
    assert pool["up_s"]  # listening again, its blocks loaded
    # mooncake_master: restarted by the pool node, its blocks put back, nothing lost.
    if not master.get("skipped"):
        assert master["error"] == "" and master["wrong_bytes"] == "0", master
        assert master["up_s"] and int(master["reput"]) > 0 and master["blocks_failed"] == "0"
    with (tmp_path / "trace-faults.csv").open() as fh:
        (traced,) = list(csv.DictReader(fh))
    assert traced["fault"] == "loss 1%" and traced["error"] == "", traced
    assert traced["wrong_bytes"] == "0" and traced["blocks_failed"] == "0", traced
    # The switch killed during an incast point: that point refused cleanly, the sweep restarted
    # and re-programmed the switch, and every later point completed.
    with (tmp_path / "switch-kill.csv").open() as fh:
        killed, *later = list(csv.DictReader(fh))
    assert killed["wrong_bytes"] == "0" and "restarted and re-programmed" in killed["error"]
    assert len(later) == 3 and all(r["completed"] == r["attempted"] for r in later), later
