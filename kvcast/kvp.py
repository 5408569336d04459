"""KVP framing arithmetic: how many fragments a chunk has and how many one DATA carries.

Every component computes these the same way from the generated constants, so a pool node, an
agent, the controller and the simulation cannot drift apart.

Constants:
    DEFAULT_MTU: the Ethernet IP MTU a default DATA fits in.
    MAX_FRAGMENTS: the most fragments a chunk may have (the width of the header's
        ``frag_count`` field, generated from ``p4src/shared/headers.p4``).

Functions:
    frag_count: fragments of a chunk of ``nbytes``.
    padded_bytes: ``nbytes`` rounded up to whole fragments (what a chunk occupies in SRAM).
    frags_per_data: whole fragments one DATA carries within an IP MTU.
"""

from __future__ import annotations

from typing import Final

from kvcast import p4constants as c

DEFAULT_MTU: Final = 1500
"""Ethernet MTU the default DATA size fits in (IPv4 + UDP + KVP header + fragments)."""

MAX_FRAGMENTS: Final = (1 << c.KVP_FRAG_COUNT_BITS) - 1
"""The most fragments a chunk may have: ``frag_count`` and ``frag_idx`` are 16-bit fields."""


def frag_count(nbytes: int, frag_bytes: int = c.FRAG_BYTES) -> int:
    """Fragments of a chunk of ``nbytes`` (the last one may be partial).

    Args:
        nbytes: the chunk's size in bytes (>= 0).
        frag_bytes: fragment size (the program's ``FRAG_BYTES`` unless a model asks otherwise).

    Returns:
        ``ceil(nbytes / frag_bytes)``.
    """
    return -(-nbytes // frag_bytes)


def padded_bytes(nbytes: int) -> int:
    """``nbytes`` rounded up to whole fragments: the SRAM a chunk of that size occupies."""
    return frag_count(nbytes) * c.FRAG_BYTES


def frags_per_data(mtu: int, frag_bytes: int = c.FRAG_BYTES) -> int:
    """Whole fragments one DATA can carry within an IP MTU.

    Args:
        mtu: IP MTU in bytes (1500 for Ethernet).
        frag_bytes: fragment size.

    Returns:
        ``(mtu - IPv4 - UDP - KVP header) // frag_bytes``.

    Raises:
        ValueError: the MTU cannot carry even one fragment.
    """
    n = (mtu - c.IPV4_HDR_BYTES - c.UDP_HDR_BYTES - c.KVP_HDR_BYTES) // frag_bytes
    if n < 1:
        raise ValueError(
            f"an MTU of {mtu} cannot carry one {frag_bytes}-byte fragment with its headers"
        )
    return n
