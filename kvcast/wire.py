"""The KVP wire format: header packing, fragment CRCs and Ethernet/IPv4/UDP framing.

docs/protocol.md is the specification; every number here comes from ``kvcast.p4constants``,
which is generated from the P4 source.

Classes:
    KvpHeader: the 40-byte KVP header as a mutable record, with ``pack``/``unpack``.
    WireError: a buffer is not a well-formed KVP message.

Functions:
    fragment_crc: the CRC stored and sent with every fragment.
    chunk_crc_seed: the part of every fragment's CRC seed shared by one chunk.
    fragment_crc_seeded: ``fragment_crc`` from that shared seed.
    get_message, data_message, nack_message, write_message: UDP payloads for each operation.
    udp_frame: a whole Ethernet/IPv4/UDP frame around a payload (for raw sockets, PacketOut).
    ipv4_checksum: the IPv4 header checksum.
    mac_bytes, ip_bytes: address text to bytes.
    mac_int, ip_int: address text to the integers P4Runtime match fields and parameters take.
"""

from __future__ import annotations

import ipaddress
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass

from kvcast import p4constants as c
from kvcast.native import enabled as native_enabled

# zlib's CRC-32; the native module's (PCLMULQDQ, about 3x faster) where it is in use. The two
# give the same values (tests/kvcast/test_native.py).
_native_ext = native_enabled()
_crc32: Callable[..., int] = _native_ext.crc32 if _native_ext is not None else zlib.crc32

KVP_STRUCT = struct.Struct("!BBBBHHQIIHHHHII")
if KVP_STRUCT.size != c.KVP_HDR_BYTES:  # pragma: no cover - guards an edit of the format
    raise ImportError("KVP_STRUCT does not match KVP_HDR_BYTES in defines.p4")

_CRC_SEED = struct.Struct("!HQH")
_CRC_CHUNK = struct.Struct("!HQ")
_CRC_INDEX = struct.Struct("!H")
_ETH = struct.Struct("!6s6sH")
_IPV4 = struct.Struct("!BBHHHBBH4s4s")
_UDP = struct.Struct("!HHHH")
ETH_HDR_BYTES = _ETH.size
FRAME_KVP_OFFSET = ETH_HDR_BYTES + c.IPV4_HDR_BYTES + c.UDP_HDR_BYTES
PLACEHOLDER = bytes(c.FRAG_BYTES)
VALID_OPS = frozenset(
    (c.KVP_OP_GET, c.KVP_OP_DATA, c.KVP_OP_WRITE, c.KVP_OP_WRITE_ACK, c.KVP_OP_NACK)
)


class WireError(ValueError):
    """A buffer is not a well-formed KVP message (too short, wrong version, bad length)."""


@dataclass(slots=True)
class KvpHeader:
    """The KVP header. Field meanings are in docs/protocol.md."""

    op: int
    flags: int = 0
    status: int = 0
    tenant: int = 0
    group: int = 0
    key: int = 0
    req_id: int = 0
    epoch: int = 0
    frag_idx: int = 0
    frag_count: int = 0
    payload_len: int = 0
    index: int = 0
    crc: int = 0
    version: int = c.KVP_VERSION

    def pack(self) -> bytes:
        """Returns the 40 header bytes in network order.

        Raises:
            struct.error: a field does not fit its width.
        """
        return KVP_STRUCT.pack(
            (self.version << 4) | self.op,
            self.flags,
            self.status,
            0,
            self.tenant,
            self.group,
            self.key,
            self.req_id,
            self.epoch,
            self.frag_idx,
            self.frag_count,
            self.payload_len,
            0,
            self.index,
            self.crc,
        )

    @classmethod
    def unpack(cls, buf: bytes | memoryview, offset: int = 0) -> KvpHeader:
        """Parses a header and checks what can be checked without the payload.

        Args:
            buf: a buffer holding a KVP header at ``offset``.
            offset: where the header starts.

        Returns:
            The header.

        Raises:
            WireError: the buffer is too short, or version or op is unknown.
        """
        if len(buf) - offset < KVP_STRUCT.size:
            raise WireError(f"KVP header needs {KVP_STRUCT.size} bytes, got {len(buf) - offset}")
        (
            vo,
            flags,
            status,
            _r0,
            tenant,
            group,
            key,
            req_id,
            epoch,
            frag_idx,
            frag_count,
            payload_len,
            _r1,
            index,
            crc,
        ) = KVP_STRUCT.unpack_from(buf, offset)
        version, op = vo >> 4, vo & 0xF
        if version != c.KVP_VERSION:
            raise WireError(f"KVP version {version}, expected {c.KVP_VERSION}")
        if op not in VALID_OPS:
            raise WireError(f"unknown KVP op {op}")
        return cls(
            op,
            flags,
            status,
            tenant,
            group,
            key,
            req_id,
            epoch,
            frag_idx,
            frag_count,
            payload_len,
            index,
            crc,
            version,
        )


def fragment_crc(tenant: int, key: int, frag_idx: int, payload: bytes | memoryview) -> int:
    """CRC-32 of a fragment, bound to the tenant, chunk key and fragment index.

    Seeding the CRC with (tenant, key, index) makes a fragment delivered under the wrong key or
    at the wrong position fail the check, not only a corrupted one.

    Args:
        tenant: tenant id.
        key: 64-bit chunk key.
        frag_idx: index of the (first) fragment the payload starts with.
        payload: the fragment's valid bytes (``payload_len`` of them).

    Returns:
        The 32-bit CRC.
    """
    return _crc32(payload, _crc32(_CRC_SEED.pack(tenant, key, frag_idx)))


def chunk_crc_seed(tenant: int, key: int) -> int:
    """The CRC state after the (tenant, key) part of every fragment's seed.

    A CRC is a running state, so ``fragment_crc(t, k, i, p)`` equals
    ``fragment_crc_seeded(chunk_crc_seed(t, k), i, p)``: a receiver of many fragments of one
    chunk computes this once and skips re-hashing the tenant and key per fragment.

    Args:
        tenant: tenant id.
        key: 64-bit chunk key.

    Returns:
        The 32-bit running CRC.
    """
    return _crc32(_CRC_CHUNK.pack(tenant, key))


def fragment_crc_seeded(seed: int, frag_idx: int, payload: bytes | memoryview) -> int:
    """``fragment_crc`` from a ``chunk_crc_seed`` (same value, less work per fragment).

    Args:
        seed: ``chunk_crc_seed(tenant, key)``.
        frag_idx: index of the (first) fragment the payload starts with.
        payload: the fragment's valid bytes.

    Returns:
        The 32-bit CRC.
    """
    return _crc32(payload, _crc32(_CRC_INDEX.pack(frag_idx), seed))


def get_message(
    tenant: int,
    key: int,
    frag_idx: int,
    req_id: int = 0,
    group: int = 0,
    flags: int = 0,
    count: int = 1,
) -> bytes:
    """UDP payload of a GET: header plus the one-fragment placeholder the switch overwrites.

    Args:
        tenant: tenant id.
        key: chunk key.
        frag_idx: first fragment wanted.
        req_id: echoed in the replies.
        group: multicast group to deliver the reply to (0: the requester only).
        flags: e.g. ``KVP_FLAG_NOCACHE``.
        count: fragments wanted from ``frag_idx`` on (a pool node serves the range; the switch
            serves ``frag_idx`` only).

    Returns:
        The payload bytes.
    """
    hdr = KvpHeader(
        c.KVP_OP_GET,
        flags=flags,
        tenant=tenant,
        group=group,
        key=key,
        req_id=req_id,
        frag_idx=frag_idx,
        frag_count=count,
    )
    return hdr.pack() + PLACEHOLDER


def data_message(
    tenant: int,
    key: int,
    frag_idx: int,
    frag_count: int,
    payload: bytes,
    *,
    req_id: int = 0,
    group: int = 0,
    epoch: int = 0,
    flags: int = c.KVP_FLAG_POOL,
) -> bytes:
    """UDP payload of a DATA message carrying fragments from ``frag_idx`` on.

    Args:
        tenant: tenant id.
        key: chunk key.
        frag_idx: index of the first fragment in ``payload``.
        frag_count: fragments in the whole chunk.
        payload: one or more consecutive fragments' bytes.
        req_id: the GET's request id.
        group: multicast group (0: unicast).
        epoch: version of the copy served.
        flags: ``KVP_FLAG_POOL`` for pool nodes.

    Returns:
        The payload bytes.
    """
    hdr = KvpHeader(
        c.KVP_OP_DATA,
        flags=flags,
        tenant=tenant,
        group=group,
        key=key,
        req_id=req_id,
        epoch=epoch,
        frag_idx=frag_idx,
        frag_count=frag_count,
        payload_len=len(payload),
        crc=fragment_crc(tenant, key, frag_idx, payload),
    )
    return hdr.pack() + payload


def nack_message(request: KvpHeader, status: int) -> bytes:
    """UDP payload of a NACK answering ``request``.

    Args:
        request: the GET being refused.
        status: a ``KVP_STATUS_*`` code.

    Returns:
        The payload bytes.
    """
    hdr = KvpHeader(
        c.KVP_OP_NACK,
        flags=c.KVP_FLAG_POOL,
        status=status,
        tenant=request.tenant,
        group=request.group,
        key=request.key,
        req_id=request.req_id,
        frag_idx=request.frag_idx,
    )
    return hdr.pack()


def write_message(
    tenant: int,
    key: int,
    frag_idx: int,
    slot: int,
    epoch: int,
    fragment: bytes,
    req_id: int = 0,
) -> bytes:
    """UDP payload of a WRITE that stores one fragment in switch slot ``slot``.

    Args:
        tenant: tenant id of the chunk.
        key: chunk key (bound into the CRC).
        frag_idx: the fragment's index within its chunk.
        slot: absolute fragment slot (register index) to write.
        epoch: epoch of this load; must equal the cache entry's epoch.
        fragment: at most FRAG_BYTES bytes; padded with zeros on the wire.
        req_id: echoed in the WRITE_ACK.

    Returns:
        The payload bytes.

    Raises:
        WireError: the fragment is larger than FRAG_BYTES.
    """
    if len(fragment) > c.FRAG_BYTES:
        raise WireError(f"fragment of {len(fragment)} bytes exceeds FRAG_BYTES={c.FRAG_BYTES}")
    hdr = KvpHeader(
        c.KVP_OP_WRITE,
        tenant=tenant,
        key=key,
        req_id=req_id,
        epoch=epoch,
        frag_idx=frag_idx,
        payload_len=len(fragment),
        index=slot,
        crc=fragment_crc(tenant, key, frag_idx, fragment),
    )
    return hdr.pack() + fragment + bytes(c.FRAG_BYTES - len(fragment))


def mac_bytes(mac: str) -> bytes:
    """``"00:00:00:00:00:01"`` to 6 bytes."""
    raw = bytes.fromhex(mac.replace(":", "").replace("-", ""))
    if len(raw) != 6:
        raise WireError(f"not a MAC address: {mac!r}")
    return raw


def ip_bytes(ip: str) -> bytes:
    """``"10.0.0.1"`` to 4 bytes."""
    return ipaddress.IPv4Address(ip).packed


def mac_int(mac: str) -> int:
    """``"00:00:00:00:00:01"`` as an integer.

    Raises:
        WireError: not a MAC address.
    """
    return int.from_bytes(mac_bytes(mac), "big")


def ip_int(ip: str) -> int:
    """``"10.0.0.1"`` as an integer.

    Raises:
        ValueError: not an IPv4 address.
    """
    return int(ipaddress.IPv4Address(ip))


def ipv4_checksum(header: bytes) -> int:
    """The ones'-complement checksum of an IPv4 header whose checksum field is zero."""
    if len(header) % 2:
        header += b"\0"
    total: int = sum(struct.unpack(f"!{len(header) // 2}H", header))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def udp_frame(
    src_mac: str,
    dst_mac: str,
    src_ip: str,
    dst_ip: str,
    sport: int,
    dport: int,
    payload: bytes,
    ttl: int = 64,
    ident: int = 0,
) -> bytes:
    """An Ethernet/IPv4/UDP frame around ``payload`` (UDP checksum 0, as IPv4 allows).

    Args:
        src_mac: source MAC text.
        dst_mac: destination MAC text.
        src_ip: source IPv4 text.
        dst_ip: destination IPv4 text.
        sport: UDP source port.
        dport: UDP destination port.
        payload: UDP payload.
        ttl: IPv4 TTL.
        ident: IPv4 identification.

    Returns:
        The frame bytes.
    """
    udp_len = c.UDP_HDR_BYTES + len(payload)
    ip_wo_sum = _IPV4.pack(
        0x45,
        0,
        c.IPV4_HDR_BYTES + udp_len,
        ident,
        0,
        ttl,
        c.IP_PROTO_UDP,
        0,
        ip_bytes(src_ip),
        ip_bytes(dst_ip),
    )
    ip_hdr = ip_wo_sum[:10] + struct.pack("!H", ipv4_checksum(ip_wo_sum)) + ip_wo_sum[12:]
    return (
        _ETH.pack(mac_bytes(dst_mac), mac_bytes(src_mac), c.ETHERTYPE_IPV4)
        + ip_hdr
        + _UDP.pack(sport, dport, udp_len, 0)
        + payload
    )
