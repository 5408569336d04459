"""kvcast DRAM pool node: the KVP server that answers GETs from a pool backend (a component).

Modules:
    server: the UDP server answering KVP GETs with DATA or NACK.
    mooncake: the ``mooncake_master`` process manager (start, supervise, stop).
    groups: the multicast groups a node may echo (none unless told).
    tenants: the tenants a GET's source address may name (what the node vouches for itself).
    threads: the one start/stop lifecycle of the node's background threads.
    __main__: ``python -m poolnode``, a pool node daemon.

Imports: the shared layer ``kvcast`` only (the pool backend interface and its Mooncake client,
the wire format and framing, synthetic chunks); never another component (``refswitch``,
``hostagent``, ``controlplane``) nor a layer above. ``tests/test_layers.py`` checks it.
"""
