"""kvcast: the contracts every kvcast component shares, and nothing above them.

The switch target (``refswitch``), the pool node (``poolnode``), the host agent
(``hostagent``) and the controller (``controlplane``) import this package and never each other;
this package imports no other kvcast package (numpy is its one heavy dependency: no torch).

Modules:
    p4constants: names, ids, opcodes, sizes and KVP field widths generated from the P4 source
        (``make constants``).
    wire: the KVP wire format (header packing, fragment CRCs, Ethernet/IPv4/UDP framing).
    kvp: KVP framing arithmetic (fragment counts, fragments per DATA, the MTU, MAX_FRAGMENTS).
    backend: the pool backend interface (``PoolBackend``) and the in-memory backend.
    reports: the access-report record agents send and the client that sends it.
    integrity: the keyed per-tenant chunk MAC and the MAC object's key.
    ports: the host agent's UDP port.
    fetch: the KVP fetch engine (switch, then pool, then recompute; group fetch), torch-free.
    kvclass: the KV classes (static, transient) and their JSON names.
    synthetic: deterministic synthetic chunks, so pool nodes and agents agree on bytes.
    fabric: a leaf-spine fabric's forwarding plan (routes, trees, cache placement), which the
        controller and the emulation both install.
    procs: stopping a child process (SIGTERM, wait, SIGKILL) the same way everywhere.
    lifecycle: ``Service``, one ``with`` protocol for whatever starts and stops.
    native: the optional C extension (batched I/O, CRCs) and whether it is on.

Packages:
    tools: builds, tests and the emulation use these (constants generator, Tofino summary, a
        blocking P4Runtime client); no component does.
"""
