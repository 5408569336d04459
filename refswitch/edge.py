"""EdgeGuard: default-deny at the switch's edge, the reference target's copy of the P4 block.

A check that applies only to what the parser takes as IPv4 is no check: a Linux host hands VLAN-
tagged, 802.1ad and other frames to an ordinary UDP socket with their source port intact, and a
program that forwards anything not plain IPv4 by destination MAC forwards those unchecked (issue
27). The guard (``EdgeGuard`` in p4src/shared/control/edge_guard.p4, applied right after
``port_role``) therefore lets a frame from a host port go on to the pipeline's other blocks only
if it is something a host may send:

- ARP for IPv4 over Ethernet, well formed, whose sender address is the port's bound address
  (ARP is then switched by ``l2_fwd`` like before);
- IPv4 that is not a fragment (PortRole, KvpValidate and the rest then check it; IPv4 with
  options is dropped there as ``DROP_MALFORMED``).

Everything else from a host port is dropped and counted under its own reason: 802.1Q and
802.1ad tags, IPv6, MPLS, 802.3 length/LLC frames, every other EtherType, malformed or spoofed
ARP, IPv4 fragments. A DENY port (the program's default for a port without a ``port_role``
entry) sends nothing at all. Pool ports, fan-out ports and the CPU port are trusted parties
(docs/security.md) and pass untouched. The reasons are the program's drop reasons
(``c.DROP_PORT_DENIED`` .. ``c.DROP_IPV4_FRAGMENT``), counted in its ``drop_counter``.

Classes:
    EdgeReason: why the guard dropped a frame (the generated drop reason).

Functions:
    edge_verdict: the guard's decision for one frame from a port of a given role.
"""

from __future__ import annotations

import enum
import struct

from kvcast import p4constants as c

VLAN_TPIDS = frozenset(
    {c.ETHERTYPE_VLAN, c.ETHERTYPE_QINQ, c.ETHERTYPE_QINQ_9100, c.ETHERTYPE_QINQ_9200}
)
MPLS_ETHERTYPES = frozenset({c.ETHERTYPE_MPLS, c.ETHERTYPE_MPLS_MCAST})

_ETH_LEN = 14
_ARP_LEN = 28
_IPV4_LEN = 20
_ARP_IPV4_OVER_ETHERNET = struct.pack(
    "!HHBB", c.ARP_HTYPE_ETHERNET, c.ETHERTYPE_IPV4, c.ARP_HLEN_ETHERNET, c.ARP_PLEN_IPV4
)
_ARP_OPS = (c.ARP_OP_REQUEST, c.ARP_OP_REPLY)
_U16 = struct.Struct("!H")
_U32 = struct.Struct("!I")


class EdgeReason(enum.IntEnum):
    """Why EdgeGuard dropped a frame: its index into the program's ``drop_counter``."""

    PORT_DENIED = c.DROP_PORT_DENIED
    """Anything from a DENY port (and so, by default, from a port nobody configured)."""
    VLAN = c.DROP_VLAN
    """A frame carrying an 802.1Q or 802.1ad (QinQ) tag."""
    IPV6 = c.DROP_IPV6
    """IPv6: the switch checks and routes IPv4 only."""
    MPLS = c.DROP_MPLS
    """MPLS unicast or multicast."""
    LLC = c.DROP_LLC
    """An 802.3 frame (length field, LLC/SNAP)."""
    OTHER_ETHERTYPE = c.DROP_OTHER_ETHERTYPE
    """Any other EtherType (PPPoE, LLDP, 802.1X, MACsec, RARP, experimental, ...)."""
    ARP_MALFORMED = c.DROP_ARP_MALFORMED
    """ARP that is not a well-formed IPv4-over-Ethernet request or reply."""
    ARP_SPOOFED = c.DROP_ARP_SPOOFED
    """ARP from a bound port whose sender address is not the port's."""
    IPV4_FRAGMENT = c.DROP_IPV4_FRAGMENT
    """An IPv4 fragment (MF set or a non-zero offset): the switch cannot check what reassembles."""


def edge_verdict(
    role: int, bound_addr: int | None, frame: bytes | bytearray, eth: int = 0
) -> EdgeReason | None:
    """EdgeGuard's decision for one frame from a data port.

    Args:
        role: the port's role (``c.PORT_ROLE_*``) from ``port_role``; a bound host is HOST.
        bound_addr: the port's bound IPv4 address, or None for an unbound port.
        frame: the frame as received.
        eth: where its Ethernet header starts.

    Returns:
        None if the frame may go on to the pipeline, else the reason to drop it. A frame too
        short for an Ethernet or IPv4 header goes on (the parser drops it as malformed, as the
        P4 parser's error does).
    """
    if role == c.PORT_ROLE_DENY:
        return EdgeReason.PORT_DENIED
    if role != c.PORT_ROLE_HOST:
        return None  # pool and fan-out ports: trusted (docs/security.md)
    if len(frame) - eth < _ETH_LEN:
        return None
    ether_type = _U16.unpack_from(frame, eth + 12)[0]
    if ether_type == c.ETHERTYPE_IPV4:
        ip = eth + _ETH_LEN
        if len(frame) - ip >= _IPV4_LEN and _U16.unpack_from(frame, ip + 6)[0] & 0x3FFF:
            return EdgeReason.IPV4_FRAGMENT
        return None
    if ether_type == c.ETHERTYPE_ARP:
        return _arp_verdict(bound_addr, frame, eth + _ETH_LEN)
    if ether_type in VLAN_TPIDS:
        return EdgeReason.VLAN
    if ether_type == c.ETHERTYPE_IPV6:
        return EdgeReason.IPV6
    if ether_type in MPLS_ETHERTYPES:
        return EdgeReason.MPLS
    if ether_type <= c.MAX_8023_LENGTH:
        return EdgeReason.LLC
    return EdgeReason.OTHER_ETHERTYPE


def _arp_verdict(bound_addr: int | None, frame: bytes | bytearray, arp: int) -> EdgeReason | None:
    if len(frame) - arp < _ARP_LEN or frame[arp : arp + 6] != _ARP_IPV4_OVER_ETHERNET:
        return EdgeReason.ARP_MALFORMED
    if _U16.unpack_from(frame, arp + 6)[0] not in _ARP_OPS:
        return EdgeReason.ARP_MALFORMED
    if bound_addr is not None and _U32.unpack_from(frame, arp + 14)[0] != bound_addr:
        return EdgeReason.ARP_SPOOFED
    return None
