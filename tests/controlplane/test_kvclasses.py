"""The class registry: declarations, the static-detection rule, prefixes, expiry."""

from __future__ import annotations

import pytest

from controlplane.errors import ConfigError
from controlplane.kvclasses import ClassRegistry, ClassSpec
from kvcast.kvclass import KvClass

S, T = KvClass.STATIC, KvClass.TRANSIENT
SPEC = ClassSpec(min_uses=4, window_s=100.0, min_span_s=30.0, declared_ttl_s=50.0)


def test_a_prefix_is_promoted_only_after_the_stated_reuse() -> None:
    reg = ClassRegistry(SPEC)
    for i in range(3):  # three uses over 40 s: one short of min_uses
        reg.observe(1, 0xA, 1000.0 + 20 * i)
        assert reg.kv_class(0xA) is T
    assert reg.tick(1041.0) == {}
    reg.observe(1, 0xA, 1060.0)  # the fourth, the four spanning 60 s >= 30 s
    assert reg.kv_class(0xA) is S
    assert reg.tick(1061.0) == {0xA: S}
    assert reg.static()[0xA].reason == "detected" and reg.promoted["detected"] == 1


def test_a_burst_of_any_size_does_not_promote() -> None:
    reg = ClassRegistry(SPEC)
    for i in range(50):  # one task's 50 branches within one second
        reg.observe(1, 0xB, 1000.0 + i * 0.02)
    assert reg.kv_class(0xB) is T and reg.tick(1001.0) == {}


def test_uses_spread_wider_than_the_window_do_not_promote() -> None:
    reg = ClassRegistry(SPEC)
    for i in range(4):
        reg.observe(1, 0xC, 1000.0 + 40 * i)  # 120 s > window_s
    assert reg.kv_class(0xC) is T


def test_a_detected_prefix_goes_back_to_transient_after_a_window_unused() -> None:
    reg = ClassRegistry(SPEC)
    for i in range(4):
        reg.observe(1, 0xA, 1000.0 + 20 * i)
    reg.tick(1060.0)
    reg.observe(1, 0xA, 1090.0)  # a use renews it until 1190
    assert reg.tick(1189.0) == {} and reg.kv_class(0xA) is S
    assert reg.tick(1190.0) == {0xA: T}
    assert reg.demoted["detected"] == 1


def test_detection_off_leaves_only_declarations() -> None:
    reg = ClassRegistry(ClassSpec(detect=False, min_uses=2, min_span_s=0.0))
    for i in range(10):
        reg.observe(1, 0xA, 1000.0 + i)
    assert reg.kv_class(0xA) is T
    reg.observe(1, 0xB, 1000.0, declared=S)
    assert reg.kv_class(0xB) is S


def test_a_declaration_lasts_its_ttl_and_a_transient_one_revokes_it() -> None:
    reg = ClassRegistry(SPEC)
    reg.observe(1, 0xD, 1000.0, declared=S)
    assert reg.tick(1000.0) == {0xD: S}
    assert reg.tick(1049.0) == {}
    reg.declare(1, 0xD, S, 1040.0, ttl_s=100.0)  # renewed until 1140
    assert reg.tick(1100.0) == {}
    reg.observe(1, 0xD, 1101.0, declared=T)
    assert reg.kv_class(0xD) is T and reg.tick(1101.0) == {0xD: T}


def test_a_transient_declaration_never_revokes_a_detection() -> None:
    reg = ClassRegistry(SPEC)
    for i in range(4):
        reg.observe(1, 0xA, 1000.0 + 20 * i)
    reg.declare(1, 0xA, T, 1061.0)
    assert reg.kv_class(0xA) is S


def test_the_known_ancestors_of_a_static_chunk_are_static_with_it() -> None:
    reg = ClassRegistry(SPEC)
    reg.observe(1, 1, 1000.0)
    reg.observe(1, 2, 1000.0, parent=1)
    reg.observe(1, 3, 1000.0, parent=2)
    reg.observe(1, 3, 1000.0, declared=S)
    assert reg.tick(1000.0) == {1: S, 2: S, 3: S}
    assert {k: e.reason for k, e in reg.static().items()} == {
        3: "declared",
        2: "prefix",
        1: "prefix",
    }
    # They last as long as the chunk below them.
    assert reg.tick(1050.0) == {1: T, 2: T, 3: T}


def test_a_class_that_changes_and_changes_back_within_a_tick_is_not_listed() -> None:
    reg = ClassRegistry(SPEC)
    reg.declare(1, 9, S, 1000.0)
    reg.declare(1, 9, T, 1000.5)
    assert reg.tick(1001.0) == {}


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"min_uses": 1}, "min_uses"),
        ({"window_s": 0.0}, "window_s"),
        ({"min_span_s": 700.0}, "min_span_s"),
        ({"declared_ttl_s": float("inf")}, "declared_ttl_s"),
    ],
)
def test_bad_parameters_are_config_errors(params: dict[str, float], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ClassSpec(**params)  # type: ignore[arg-type]


def test_promotions_beyond_max_keys_are_refused_and_counted() -> None:
    reg = ClassRegistry(ClassSpec(max_keys=2))
    for key in (1, 2, 3):
        reg.declare(1, key, S, 1000.0)
    assert set(reg.static()) == {1, 2} and reg.refused == 1
