"""Synthetic chunks: deterministic, distinct per name, parsed from TENANT:KEY:NBYTES[:SEED]."""

from __future__ import annotations

import pytest

from kvcast.synthetic import ChunkSpec, parse_key, synthetic_chunk


def test_same_name_same_bytes_and_length() -> None:
    a = synthetic_chunk(1, 0xABC, 1000, 3)
    assert a == synthetic_chunk(1, 0xABC, 1000, 3)
    assert len(a) == 1000


def test_pattern_is_pinned() -> None:
    # A change of the pattern would silently break pools and agents of different versions.
    assert synthetic_chunk(1, 2, 8, 3).hex() == "964df9027a77dfa1"


@pytest.mark.parametrize(
    "other", [(2, 0xABC, 1000, 3), (1, 0xABD, 1000, 3), (1, 0xABC, 1000, 4), (1, 0xABC, 999, 3)]
)
def test_any_other_name_gives_other_bytes(other: tuple[int, int, int, int]) -> None:
    assert synthetic_chunk(*other)[:999] != synthetic_chunk(1, 0xABC, 1000, 3)[:999]


def test_keys_parse_as_decimal_or_hex() -> None:
    assert parse_key("1234") == 1234
    assert parse_key("0xBEEF") == parse_key("beef") == 0xBEEF
    with pytest.raises(ValueError):
        parse_key("0x1" + "0" * 16)
    with pytest.raises(ValueError):
        parse_key("xyz")


def test_chunk_spec_parses_with_and_without_seed() -> None:
    assert ChunkSpec.parse("1:0x10:300:5") == ChunkSpec(1, 16, 300, 5)
    assert ChunkSpec.parse("1:16:300").seed == 0
    assert ChunkSpec.parse("1:16:300:5").data() == synthetic_chunk(1, 16, 300, 5)


@pytest.mark.parametrize("bad", ["1:2", "70000:1:10:0", "1:1:0:0", "1:1:10:-1", "a:b:c:d"])
def test_bad_chunk_specs_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        ChunkSpec.parse(bad)
