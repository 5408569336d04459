"""The conformance vectors against every switch target present.

The reference target always runs (in-process, and as a process on veth where root is
available); BMv2 runs where simple_switch_grpc is installed, on the committed BMv2 JSON and
P4Info (``p4src/build/``; whether they are what p4c makes of ``p4src/`` now is the freshness
test's business, which needs p4c). Every target must give exactly the frames, counter changes
and digests the vectors specify.
"""

from __future__ import annotations

import os
import queue
from collections.abc import Iterator

import pytest

from emulation.targets import BMV2_JSON_PATH, bmv2_binary
from tests.conformance.harness import InProcessRefTarget, Target, VethTarget
from tests.conformance.vectors import COUNTERS, CPU, VECTORS, Vector, program_switch


def _make(kind: str) -> Target:
    if kind == "refswitch-inprocess":
        return InProcessRefTarget()
    if os.geteuid() != 0:
        pytest.skip("veth targets need root (CAP_NET_ADMIN) to create veth pairs")
    if kind == "bmv2":
        if bmv2_binary() is None:
            pytest.skip("BMv2 not installed: simple_switch_grpc not found (docs/bmv2.md)")
        if not BMV2_JSON_PATH.exists():
            pytest.skip(f"no BMv2 JSON at {BMV2_JSON_PATH} (make p4 needs p4c-bm2-ss)")
        return VethTarget("bmv2")
    return VethTarget("refswitch")


@pytest.fixture(scope="module", params=["refswitch-inprocess", "refswitch-veth", "bmv2"])
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    t = _make(request.param)
    try:
        program_switch(t.client)
        yield t
    finally:
        t.close()


def _counters(t: Target) -> dict[tuple[str, int], int]:
    out: dict[tuple[str, int], int] = {}
    for name in COUNTERS:
        for index, packets in t.client.counters(name).items():
            out[(name, index)] = packets
    return out


def _drain_digests(t: Target) -> list[tuple[int, int, int]]:
    rows: list[tuple[int, int, int]] = []
    while True:
        try:
            _name, data = t.client.digests.get(timeout=0.05)
        except queue.Empty:
            return rows
        rows += [tuple(r) for r in data]  # type: ignore[misc]


@pytest.mark.parametrize("vector", VECTORS, ids=[v.name for v in VECTORS])
def test_vector(target: Target, vector: Vector) -> None:
    _drain_digests(target)
    for n, step in enumerate(vector.steps):
        before = _counters(target)
        target.send(step.port, step.frame, step.out_port)
        frames = sum(1 for p, _ in step.expect if p != CPU)
        got = target.collect(frames, len(step.expect) - frames)
        after = _counters(target)
        assert sorted(got) == sorted(step.expect), f"step {n}: frames out differ"
        changed = {
            k: after.get(k, 0) - before.get(k, 0)
            for k in after
            if after.get(k, 0) != before.get(k, 0)
        }
        assert changed == step.counters, f"step {n}: counter changes differ"
        if step.digests:
            assert _drain_digests(target) == step.digests, f"step {n}: digests differ"
    assert _drain_digests(target) == [], "a digest arrived that no step expected"
