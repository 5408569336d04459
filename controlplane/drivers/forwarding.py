"""Driver of the Forwarding and PortRole controls: ipv4_lpm, l2_fwd, port_role, tenant_binding.

Routes (IPv4 prefix -> port and the MACs to rewrite), L2 entries (destination MAC -> port) for
non-IP frames, and port roles: which ports face pool nodes (and so may send DATA and NACK),
which face GPU hosts (each bound to its source address and, where configured, to its tenants),
and what an unknown port is (the program's default, an unbound host, or DENY: no KVP at all).
docs/security.md gives the threat model.

Classes:
    Route: one ipv4_lpm entry.
    ForwardingDriver: add / remove routes, L2 entries and port roles; re-installed after a
        reconnect.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

import finsy as fy

from controlplane.drivers.base import EntrySpec, MatchKey, TableMirror, ip_int, mac_int
from controlplane.errors import ConfigError, NotInstalledError
from controlplane.p4rt import SessionInfo, SwitchClient
from kvcast import p4constants as c

T_LPM = c.TABLE_INGRESS_FORWARDING_IPV4_LPM
T_L2 = c.TABLE_INGRESS_FORWARDING_L2_FWD
T_ROLE = c.TABLE_INGRESS_PORT_ROLE_PORT_ROLE
A_ROUTE = c.ACTION_INGRESS_FORWARDING_ROUTE
A_L2 = c.ACTION_INGRESS_FORWARDING_L2_FORWARD
A_ROLE = c.ACTION_INGRESS_PORT_ROLE_SET_PORT_ROLE
A_BIND = c.ACTION_INGRESS_PORT_ROLE_BIND_HOST
T_TENANT = c.TABLE_INGRESS_PORT_ROLE_TENANT_BINDING
A_TENANT_OK = c.ACTION_INGRESS_PORT_ROLE_TENANT_OK


@dataclass(frozen=True)
class Route:
    """An IPv4 route.

    Attributes:
        prefix: e.g. "10.0.1.0/24" (host bits must be zero).
        port: egress port.
        smac: source MAC written into routed frames (the switch's).
        dmac: destination MAC written into routed frames (the next hop's).
    """

    prefix: str
    port: int
    smac: str
    dmac: str


def _network(prefix: str) -> ipaddress.IPv4Network:
    try:
        return ipaddress.IPv4Network(prefix)
    except ValueError as exc:
        raise ConfigError(f"not an IPv4 prefix with zero host bits: {prefix!r} ({exc})") from exc


def _lpm_key(prefix: str) -> MatchKey:
    net = _network(prefix)
    return (("dst_addr", (int(net.network_address), net.prefixlen)),)


class ForwardingDriver:
    """ipv4_lpm, l2_fwd and port_role entries.

    Args:
        client: the switch.
    """

    def __init__(self, client: SwitchClient) -> None:
        self._lpm = TableMirror(client, T_LPM)
        self._l2 = TableMirror(client, T_L2)
        self._client = client
        self._roles = TableMirror(client, T_ROLE)
        self._tenants = TableMirror(client, T_TENANT)
        self._deny_unknown = False

    # ------------------------------------------------------------------ routes
    async def add_route(self, route: Route) -> None:
        """Installs a route, or changes the one for its prefix.

        Raises:
            ConfigError: a bad prefix or MAC.
            SwitchError: the write failed.
        """
        spec = EntrySpec.of(
            dict(_lpm_key(route.prefix)),
            A_ROUTE,
            {"port": route.port, "smac": mac_int(route.smac), "dmac": mac_int(route.dmac)},
        )
        await self._lpm.apply(puts=[spec])

    async def remove_route(self, prefix: str) -> None:
        """Removes the route of a prefix.

        Raises:
            NotInstalledError: no route for it.
            SwitchError: the write failed.
        """
        key = _lpm_key(prefix)
        if key not in self._lpm:
            raise NotInstalledError(f"no route for {prefix}")
        await self._lpm.apply(removes=[key])

    # ------------------------------------------------------------------ L2
    async def add_l2(self, mac: str, port: int) -> None:
        """Sends non-IP frames for ``mac`` out of ``port``.

        Raises:
            ConfigError: a bad MAC.
            SwitchError: the write failed.
        """
        spec = EntrySpec.of({"dst_addr": mac_int(mac)}, A_L2, {"port": port})
        await self._l2.apply(puts=[spec])

    async def remove_l2(self, mac: str) -> None:
        """Removes the L2 entry of a MAC.

        Raises:
            NotInstalledError: none installed.
            SwitchError: the write failed.
        """
        key: MatchKey = (("dst_addr", mac_int(mac)),)
        if key not in self._l2:
            raise NotInstalledError(f"no L2 entry for {mac}")
        await self._l2.apply(removes=[key])

    # ------------------------------------------------------------------ port roles
    async def set_port_role(self, port: int, role: int) -> None:
        """Gives a port a role (``c.PORT_ROLE_POOL`` for ports facing pool nodes).

        Setting ``c.PORT_ROLE_HOST`` removes the entry: the port then takes the table's
        default, a DENY port on the reference target and under ``deny_unknown_ports`` (an
        unbound host on the committed P4 programs otherwise); ``bind_host`` makes a host port.

        Raises:
            SwitchError: the write failed.
        """
        key: MatchKey = (("port", port),)
        if role == c.PORT_ROLE_HOST:
            await self._roles.apply(removes=[key])
        else:
            await self._roles.apply(puts=[EntrySpec.of(dict(key), A_ROLE, {"role": role})])

    async def bind_host(self, port: int, ip: str, tenants: Iterable[int] | None) -> None:
        """Binds a host port to its source address and (unless None) to these tenants.

        The switch then drops any IPv4 packet from the port with another source address
        (DROP_SPOOFED) and any GET naming a tenant not listed (DROP_BAD_TENANT).

        Raises:
            ConfigError: a bad address or tenant.
            SwitchError: the write failed.
        """
        wanted = None if tenants is None else sorted(set(tenants))
        if wanted is not None and not all(0 <= t <= 0xFFFF for t in wanted):
            raise ConfigError(f"tenants of port {port} must be 16-bit: {wanted}")
        key: MatchKey = (("port", port),)
        check = 0 if wanted is None else 1
        await self._roles.apply(
            puts=[EntrySpec.of(dict(key), A_BIND, {"addr": ip_int(ip), "check_tenant": check})]
        )
        held = {m for m in (s.match for s in self._tenants.specs()) if dict(m)["port"] == port}
        want = {(("port", port), ("tenant", t)) for t in wanted or ()}
        await self._tenants.apply(
            puts=[EntrySpec.of(dict(m), A_TENANT_OK, {}) for m in sorted(want)],
            removes=sorted(held - want),
        )

    async def deny_unknown_ports(self, deny: bool) -> None:
        """Makes every port without a port_role entry a DENY port (or an unbound host again).

        Raises:
            SwitchError: the write failed.
        """
        role = c.PORT_ROLE_DENY if deny else c.PORT_ROLE_HOST
        entry = fy.P4TableEntry(
            T_ROLE, action=fy.P4TableAction(A_ROLE, role=role), is_default_action=True
        )
        await self._client.write([~entry])
        self._deny_unknown = deny

    # ------------------------------------------------------------------ reinstall
    async def reinstall(self, session: SessionInfo) -> None:
        """Makes the switch's tables hold exactly this driver's entries and port default.

        Raises:
            SwitchError: a read or write failed.
        """
        for mirror in (self._roles, self._tenants, self._l2, self._lpm):
            await mirror.reconcile()
        if self._deny_unknown:
            await self.deny_unknown_ports(True)
