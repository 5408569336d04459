from __future__ import annotations

from collections.abc import Iterator

import pytest

from kvcast import p4constants as c
from kvcast import wire
from kvcast.tools.p4rt_client import P4RuntimeClient, P4RuntimeClientError
from tests.conformance.harness import InProcessRefTarget
from tests.conformance.vectors import HOSTS, VIP, host_frame


@pytest.fixture()
def target() -> Iterator[InProcessRefTarget]:
    t = InProcessRefTarget()
    # Host 1's port bound to its address (the reference target denies an unknown port).
    t.client.insert(
        c.TABLE_INGRESS_PORT_ROLE_PORT_ROLE,
        {"port": 1},
        c.ACTION_INGRESS_PORT_ROLE_BIND_HOST,
        {"addr": int.from_bytes(wire.ip_bytes(HOSTS[1][1]), "big"), "check_tenant": 0},
    )
    yield t
    t.close()


def _hit(t: InProcessRefTarget, key: int, frag: int) -> wire.KvpHeader:
    frame = host_frame(1, VIP, wire.get_message(1, key, frag))
    (out,) = t.pipeline.process(1, frame)
    return wire.KvpHeader.unpack(out.frame, wire.FRAME_KVP_OFFSET)


def test_load_chunk_makes_a_get_hit_with_the_loaded_bytes(target: InProcessRefTarget) -> None:
    data = bytes(range(256)) * 2 + b"tail"
    assert target.client.load_chunk(1, 0x42, data, slot_base=10, epoch=3) == 3
    hdr = _hit(target, 0x42, 2)
    assert (hdr.op, hdr.frag_count, hdr.epoch, hdr.payload_len) == (c.KVP_OP_DATA, 3, 3, 4)
    assert hdr.crc == wire.fragment_crc(1, 0x42, 2, b"tail")


def test_reloading_a_cached_chunk_replaces_entry_and_epoch(target: InProcessRefTarget) -> None:
    target.client.load_chunk(1, 0x42, b"a" * 300, slot_base=0, epoch=1)
    target.client.load_chunk(1, 0x42, b"b" * 300, slot_base=0, epoch=2)
    assert _hit(target, 0x42, 0).epoch == 2
    assert len(target.client.table_entries(c.TABLE_INGRESS_CACHE_CACHE_TABLE)) == 1


def test_deleting_an_absent_entry_is_reported_as_not_found(target: InProcessRefTarget) -> None:
    with pytest.raises(P4RuntimeClientError) as info:
        target.client.delete(c.TABLE_INGRESS_CACHE_CACHE_TABLE, {"tenant": 1, "key": 7})
    assert info.value.not_found


def test_unknown_names_and_wide_values_are_refused_before_sending(
    target: InProcessRefTarget,
) -> None:
    with pytest.raises(P4RuntimeClientError, match="no table"):
        target.client.insert("Nope.table", {}, c.ACTION_NOACTION)
    with pytest.raises(P4RuntimeClientError, match="does not fit"):
        target.client.insert(
            c.TABLE_INGRESS_PORT_ROLE_PORT_ROLE,
            {"port": 1 << 9},
            c.ACTION_INGRESS_PORT_ROLE_SET_PORT_ROLE,
            {"role": 1},
        )


def test_connect_to_nothing_fails_clearly() -> None:
    client = P4RuntimeClient("127.0.0.1:1", timeout=1)
    with pytest.raises(P4RuntimeClientError, match="no P4Runtime server"):
        client.connect(wait_ready=0.5)
