"""kvcast: what every kvcast component shares.

Modules:
    p4constants: names, ids, opcodes and sizes generated from the P4 source (``make constants``).
    wire: the KVP wire format (header packing, fragment CRCs, Ethernet/IPv4/UDP framing).
    kvclass: the KV classes (static, transient) and their JSON names.
    gen_constants: the generator behind ``make constants``.
    synthetic: deterministic synthetic chunks, so pool nodes and agents agree on bytes.
    fabric: a leaf-spine fabric's forwarding plan (routes, trees, cache placement), which the
        controller and the emulation both install.
"""
