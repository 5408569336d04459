"""kvcast DRAM pool node: chunk storage and the KVP server that answers GETs from it.

Modules:
    backend: the ``PoolBackend`` interface and an in-memory backend.
    mooncake: the Mooncake Store backend and the ``mooncake_master`` process manager.
    server: the UDP server answering KVP GETs with DATA or NACK.
    groups: the multicast groups a node may echo (none unless told).
    tenants: the tenants a GET's source address may name (what the node vouches for itself).
    __main__: ``python -m poolnode``, a pool node daemon.
"""
