"""Which tenants a GET's source address may name: what a pool node can vouch for on its own.

A pool node sees a GET's source address. Behind the switch that address is vouched for: a bound
host port may send only from its own address (``bind_host``, ``DROP_SPOOFED``), the switch
rewrites only the destination of a GET it forwards, and the unbound ports of the reference
target are denied. So a node given the controller's host list (address -> tenants, as in
``hosts[].tenants`` of its config) can refuse a GET that names a tenant its sender is not bound
to, even if the switch's ``tenant_binding`` were missing or wrong. It cannot vouch for more
than that: a GET from an address it was not told about (a pool node's peer, a tool on another
network) is refused, and one from an address listed as ``any`` is served for every tenant.
``python -m poolnode`` does not start without a list unless told ``--any-tenant`` (then it checks
no tenant and relies on the switch alone); a ``PoolServer`` made in process without one checks
none.

The controller serves its hosts' bindings at ``GET /v1/sources`` (``SourceTenants.fetch``,
``--source-tenants-url``); a node reads them once at start and refuses to start without them
(the hosts' bindings change only with the controller's configuration).

Classes:
    SourceTenants: source IPv4 address -> the tenants it may name (or any).
"""

from __future__ import annotations

import ipaddress
import json
import urllib.request
from collections.abc import Iterable, Mapping

__all__ = ["SourceTenants"]


class SourceTenants:
    """Source IPv4 address -> the tenants a GET from it may name.

    Args:
        bindings: address (dotted quad or int) -> tenant ids, or None for any tenant.
    """

    def __init__(self, bindings: Mapping[str | int, Iterable[int] | None]) -> None:
        self._by_ip: dict[int, frozenset[int] | None] = {}
        for addr, tenants in bindings.items():
            ip = int(ipaddress.IPv4Address(addr))
            self._by_ip[ip] = None if tenants is None else frozenset(tenants)

    @classmethod
    def parse(cls, specs: Iterable[str]) -> SourceTenants:
        """Reads ``ADDR=T[,T...]`` or ``ADDR=any`` specs (``--source-tenants``).

        Raises:
            ValueError: a spec that is not of that form, a bad address or tenant id.
        """
        bindings: dict[str | int, Iterable[int] | None] = {}
        for spec in specs:
            addr, sep, rest = spec.partition("=")
            if not sep or not rest:
                raise ValueError(f"source tenants {spec!r}: expected ADDR=T[,T...] or ADDR=any")
            if rest.strip() == "any":
                bindings[addr.strip()] = None
                continue
            tenants = [int(t, 0) for t in rest.split(",")]
            if not all(0 <= t <= 0xFFFF for t in tenants):
                raise ValueError(f"source tenants {spec!r}: tenant ids are 16-bit")
            bindings[addr.strip()] = tenants
        return cls(bindings)

    @classmethod
    def fetch(cls, url: str, timeout_s: float = 5.0) -> SourceTenants:
        """Reads the controller's ``/v1/sources`` document (address -> tenant list or "any").

        Raises:
            OSError: the controller could not be read.
            ValueError: the document is not such a mapping (bad address or tenant ids).
        """
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            doc = json.loads(resp.read())
        raw = doc.get("sources") if isinstance(doc, dict) else None
        if not isinstance(raw, dict):
            raise ValueError(f"{url}: no 'sources' mapping")
        bindings: dict[str | int, Iterable[int] | None] = {}
        for addr, tenants in raw.items():
            if tenants == "any":
                bindings[addr] = None
            elif isinstance(tenants, list) and tenants and all(type(t) is int for t in tenants):
                if not all(0 <= t <= 0xFFFF for t in tenants):
                    raise ValueError(f"{url}: {addr}: tenant ids are 16-bit")
                bindings[addr] = tenants
            else:
                raise ValueError(f"{url}: {addr}: expected a list of tenant ids or 'any'")
        return cls(bindings)

    def merged(self, other: SourceTenants) -> SourceTenants:
        """These bindings with ``other``'s added (``other`` wins for an address in both)."""
        out = SourceTenants({})
        out._by_ip = {**self._by_ip, **other._by_ip}
        return out

    def known(self, source: int) -> bool:
        """Whether ``source`` (an IPv4 address as an int) is listed at all."""
        return source in self._by_ip

    def allows(self, source: int, tenant: int) -> bool:
        """Whether a GET from ``source`` may name ``tenant`` (False for an unlisted source)."""
        if source not in self._by_ip:
            return False
        tenants = self._by_ip[source]
        return tenants is None or tenant in tenants
