"""EdgeGuard: default-deny at the switch's edge, a block the reference target runs first.

A check that applies only to what the parser takes as IPv4 is no check: a Linux host hands VLAN-
tagged, 802.1ad and other frames to an ordinary UDP socket with their source port intact, and the
P4 programs as committed forward anything that is not plain IPv4 by destination MAC, unchecked
(issue 27). The guard therefore lets a frame from a host port go on to the P4 pipeline's blocks
only if it is something a host may send:

- ARP for IPv4 over Ethernet, well formed, whose sender address is the port's bound address
  (ARP is then switched by ``l2_fwd`` like before);
- IPv4 that is not a fragment (PortRole, KvpValidate and the rest then check it as before; IPv4
  with options is dropped there as ``DROP_MALFORMED``, as the P4 programs do).

Everything else from a host port is dropped here and counted under its own reason: 802.1Q and
802.1ad tags, IPv6, MPLS, 802.3 length/LLC frames, every other EtherType, malformed or spoofed
ARP, IPv4 fragments. A DENY port (the reference target's default for a port without a
``port_role`` entry) sends nothing at all. Pool ports, fan-out ports and the CPU port are
trusted parties (docs/security.md) and pass untouched.

These reasons are not in ``kvcast.p4constants``: that module is generated from P4, and the P4
programs do not have this block yet (docs/security.md, "What the P4 programs still need"). So
they are counted in a counter of the reference target's own,
``KvcastIngress.edge_guard.drop_counter`` (:data:`EDGE_DROP_COUNTER`), which is not in the P4Info
and is read in process (:class:`EdgeCounters`) or from the refswitch process's log at exit; the
P4 program's drop counter does not count these packets.

Classes:
    EdgeReason: why the guard dropped a frame (the edge counter's index).
    EdgeCounters: the guard's packet counts per reason.

Functions:
    edge_verdict: the guard's decision for one frame from a port of a given role.
"""

from __future__ import annotations

import enum
import struct

from kvcast import p4constants as c

EDGE_DROP_COUNTER = "KvcastIngress.edge_guard.drop_counter"

ETHERTYPE_IPV4 = c.ETHERTYPE_IPV4
ETHERTYPE_ARP = 0x0806
# 802.1Q C-tag, 802.1ad S-tag, and the pre-standard QinQ TPIDs still found in switches.
VLAN_TPIDS = frozenset({0x8100, 0x88A8, 0x9100, 0x9200})
ETHERTYPE_IPV6 = 0x86DD
MPLS_ETHERTYPES = frozenset({0x8847, 0x8848})
# Below 0x0600 the field is an 802.3 length: an LLC/SNAP frame follows.
MAX_8023_LENGTH = 0x05FF

_ETH_LEN = 14
_ARP_LEN = 28
# htype Ethernet, ptype IPv4, hlen 6, plen 4.
_ARP_IPV4_OVER_ETHERNET = struct.pack("!HHBB", 1, ETHERTYPE_IPV4, 6, 4)
_ARP_OPS = (1, 2)
_U16 = struct.Struct("!H")
_U32 = struct.Struct("!I")


class EdgeReason(enum.IntEnum):
    """Why EdgeGuard dropped a frame: the index into :data:`EDGE_DROP_COUNTER`."""

    PORT_DENIED = 0
    """Anything from a DENY port (and so, by default, from a port nobody configured)."""
    VLAN = 1
    """A frame carrying an 802.1Q or 802.1ad (QinQ) tag."""
    IPV6 = 2
    """IPv6: the switch checks and routes IPv4 only."""
    MPLS = 3
    """MPLS unicast or multicast."""
    LLC = 4
    """An 802.3 frame (length field, LLC/SNAP)."""
    OTHER_ETHERTYPE = 5
    """Any other EtherType (PPPoE, LLDP, 802.1X, MACsec, RARP, experimental, ...)."""
    ARP_MALFORMED = 6
    """ARP that is not a well-formed IPv4-over-Ethernet request or reply."""
    ARP_SPOOFED = 7
    """ARP from a bound port whose sender address is not the port's."""
    IPV4_FRAGMENT = 8
    """An IPv4 fragment (MF set or a non-zero offset): the switch cannot check what reassembles."""


EDGE_REASON_COUNT = len(EdgeReason)


class EdgeCounters:
    """Packets dropped by EdgeGuard, per :class:`EdgeReason`.

    Not thread-safe on its own: the dataplane thread counts, readers take a snapshot.
    """

    def __init__(self) -> None:
        self._packets = [0] * EDGE_REASON_COUNT

    def count(self, reason: EdgeReason) -> None:
        """Adds one packet to ``reason``."""
        self._packets[reason] += 1

    def value(self, reason: EdgeReason) -> int:
        """Packets counted under ``reason``."""
        return self._packets[reason]

    def snapshot(self) -> dict[EdgeReason, int]:
        """Every reason's count (zeros included)."""
        return {reason: self._packets[reason] for reason in EdgeReason}

    def nonzero(self) -> dict[str, int]:
        """The reasons that counted something, by name (for logs)."""
        return {reason.name: n for reason, n in self.snapshot().items() if n}


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
        short for an Ethernet header goes on (the parser drops it as malformed).
    """
    if role == c.PORT_ROLE_DENY:
        return EdgeReason.PORT_DENIED
    if role != c.PORT_ROLE_HOST:
        return None  # pool and fan-out ports: trusted (docs/security.md)
    if len(frame) - eth < _ETH_LEN:
        return None
    ether_type = _U16.unpack_from(frame, eth + 12)[0]
    if ether_type == ETHERTYPE_IPV4:
        ip = eth + _ETH_LEN
        if len(frame) - ip >= 8 and _U16.unpack_from(frame, ip + 6)[0] & 0x3FFF:
            return EdgeReason.IPV4_FRAGMENT
        return None
    if ether_type == ETHERTYPE_ARP:
        return _arp_verdict(bound_addr, frame, eth + _ETH_LEN)
    if ether_type in VLAN_TPIDS:
        return EdgeReason.VLAN
    if ether_type == ETHERTYPE_IPV6:
        return EdgeReason.IPV6
    if ether_type in MPLS_ETHERTYPES:
        return EdgeReason.MPLS
    if ether_type <= MAX_8023_LENGTH:
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
