"""UDP ports of the host agent, a contract between the switch program, the controller and agents.

The emulation programs every GPU host's multicast replica destination (``replica_dst``) with
``AGENT_PORT``, and every agent that takes part in a group fetch binds it: the switch rewrites
each replica's destination to ``(host ip, AGENT_PORT)``, whoever sent the request. Each host has
its own network namespace (or machine), so one port number serves every host.

Constants:
    AGENT_PORT: the UDP port host agents receive DATA (and multicast replicas) on.
"""

from __future__ import annotations

from typing import Final

AGENT_PORT: Final = 19287
"""UDP port host agents bind; one above ``KVP_UDP_PORT`` (19286)."""
