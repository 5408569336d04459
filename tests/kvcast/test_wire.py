from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvcast import p4constants as c
from kvcast import wire
from kvcast.wire import KvpHeader, WireError


def test_header_is_the_size_defines_p4_says() -> None:
    assert len(KvpHeader(c.KVP_OP_GET).pack()) == c.KVP_HDR_BYTES


def test_header_round_trips_every_field() -> None:
    hdr = KvpHeader(
        c.KVP_OP_DATA,
        flags=0x0B,
        status=2,
        tenant=0xBEEF,
        group=0x1234,
        key=2**64 - 2,
        req_id=2**32 - 1,
        epoch=77,
        frag_idx=65535,
        frag_count=9,
        payload_len=256,
        index=12345,
        crc=0xDEADBEEF,
    )
    assert KvpHeader.unpack(hdr.pack()) == hdr


def test_fields_are_big_endian_at_their_documented_offsets() -> None:
    raw = KvpHeader(
        c.KVP_OP_GET,
        tenant=1,
        group=2,
        key=3,
        req_id=4,
        epoch=5,
        frag_idx=6,
        frag_count=7,
        payload_len=8,
        index=9,
        crc=10,
    ).pack()
    assert raw[0] == (1 << 4) | c.KVP_OP_GET
    assert struct.unpack_from("!HHQIIHHH", raw, 4) == (1, 2, 3, 4, 5, 6, 7, 8)
    assert struct.unpack_from("!II", raw, 32) == (9, 10)


def test_unpack_rejects_short_buffers_bad_versions_and_unknown_ops() -> None:
    good = KvpHeader(c.KVP_OP_GET).pack()
    with pytest.raises(WireError, match="needs 40 bytes"):
        KvpHeader.unpack(good[:39])
    with pytest.raises(WireError, match="version"):
        KvpHeader.unpack(bytes([(2 << 4) | 1]) + good[1:])
    with pytest.raises(WireError, match="unknown KVP op"):
        KvpHeader.unpack(bytes([(1 << 4) | 0]) + good[1:])


def test_crc_binds_tenant_key_and_index_not_only_bytes() -> None:
    data = b"kv" * 50
    base = wire.fragment_crc(1, 42, 0, data)
    assert base != wire.fragment_crc(2, 42, 0, data)
    assert base != wire.fragment_crc(1, 43, 0, data)
    assert base != wire.fragment_crc(1, 42, 1, data)
    assert base != wire.fragment_crc(1, 42, 0, data[:-1] + b"x")
    assert base == wire.fragment_crc(1, 42, 0, memoryview(data))


@given(
    tenant=st.integers(0, 0xFFFF),
    key=st.integers(0, (1 << 64) - 1),
    idx=st.integers(0, 0xFFFF),
    data=st.binary(min_size=1, max_size=300),
)
def test_seeded_crc_equals_the_full_crc(tenant: int, key: int, idx: int, data: bytes) -> None:
    seed = wire.chunk_crc_seed(tenant, key)
    assert wire.fragment_crc_seeded(seed, idx, data) == wire.fragment_crc(tenant, key, idx, data)


def test_get_carries_exactly_one_fragment_of_placeholder() -> None:
    msg = wire.get_message(1, 2, 3)
    assert len(msg) == c.KVP_HDR_BYTES + c.FRAG_BYTES
    assert msg[c.KVP_HDR_BYTES :] == bytes(c.FRAG_BYTES)


def test_write_pads_short_fragments_and_records_their_length() -> None:
    msg = wire.write_message(1, 2, 0, slot=7, epoch=3, fragment=b"abc")
    hdr = KvpHeader.unpack(msg)
    assert (hdr.payload_len, hdr.index, hdr.epoch) == (3, 7, 3)
    assert len(msg) == c.KVP_HDR_BYTES + c.FRAG_BYTES
    assert hdr.crc == wire.fragment_crc(1, 2, 0, b"abc")


def test_write_refuses_a_fragment_larger_than_frag_bytes() -> None:
    with pytest.raises(WireError, match="exceeds FRAG_BYTES"):
        wire.write_message(1, 2, 0, 0, 0, bytes(c.FRAG_BYTES + 1))


def test_data_crc_covers_the_payload() -> None:
    msg = wire.data_message(5, 6, 2, 4, b"payload")
    hdr = KvpHeader.unpack(msg)
    assert hdr.crc == wire.fragment_crc(5, 6, 2, b"payload")
    assert hdr.flags == c.KVP_FLAG_POOL and hdr.payload_len == 7


def test_ipv4_checksum_of_a_known_header() -> None:
    # RFC 1071 style example header (checksum field zeroed); known checksum 0xb861.
    hdr = bytes.fromhex("450000730000400040110000c0a80001c0a800c7")
    assert wire.ipv4_checksum(hdr) == 0xB861


def test_udp_frame_lengths_are_consistent() -> None:
    frame = wire.udp_frame(
        "00:00:00:00:00:01", "00:00:00:00:00:02", "10.0.0.1", "10.0.0.2", 1, 2, b"x" * 10
    )
    assert len(frame) == 14 + 20 + 8 + 10
    assert struct.unpack_from("!H", frame, 16)[0] == 20 + 8 + 10
    assert struct.unpack_from("!H", frame, 38)[0] == 8 + 10


def test_bad_mac_text_is_refused() -> None:
    with pytest.raises(WireError):
        wire.mac_bytes("00:11")
