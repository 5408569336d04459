"""kvcast DRAM pool node: chunk storage and the KVP server that answers GETs from it.

Modules:
    backend: the ``PoolBackend`` interface and an in-memory backend.
    mooncake: the Mooncake Store backend and the ``mooncake_master`` process manager.
    server: the UDP server answering KVP GETs with DATA or NACK.
    __main__: ``python -m poolnode``, a pool node daemon.
"""
