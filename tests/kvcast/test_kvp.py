"""kvcast.kvp: the framing arithmetic every component shares."""

from __future__ import annotations

import pytest

from kvcast import kvp
from kvcast import p4constants as c


def test_max_fragments_is_what_the_16_bit_header_field_addresses() -> None:
    assert c.KVP_FRAG_COUNT_BITS == c.KVP_FRAG_IDX_BITS == 16
    assert kvp.MAX_FRAGMENTS == 0xFFFF


@pytest.mark.parametrize(("nbytes", "frags"), [(0, 0), (1, 1), (256, 1), (257, 2), (4096, 16)])
def test_frag_count_rounds_up(nbytes: int, frags: int) -> None:
    assert c.FRAG_BYTES == 256
    assert kvp.frag_count(nbytes) == frags
    assert kvp.padded_bytes(nbytes) == frags * 256


def test_frags_per_data_fits_the_mtu_and_refuses_a_tiny_one() -> None:
    per = kvp.frags_per_data(kvp.DEFAULT_MTU)
    headers = c.IPV4_HDR_BYTES + c.UDP_HDR_BYTES + c.KVP_HDR_BYTES
    assert headers + per * c.FRAG_BYTES <= 1500 < headers + (per + 1) * c.FRAG_BYTES
    assert kvp.frags_per_data(9000, frag_bytes=96) == (9000 - headers) // 96
    with pytest.raises(ValueError, match="cannot carry one"):
        kvp.frags_per_data(headers + c.FRAG_BYTES - 1)
