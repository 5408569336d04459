"""kvcast emulation: switch targets as processes and the Mininet clusters built around them.

Modules:
    targets: BMv2 or the reference target as a process on veth pairs, programmed over P4Runtime.
    switches: those processes as Mininet switch nodes.
    topo: cluster descriptions (a star, a leaf-spine fabric) as pure data and Mininet topologies.
    network: a running star cluster (one switch), programmed and torn down.
    fabric: a running leaf-spine fabric, programmed from kvcast.fabric's plan.

Imports: ``kvcast`` (its tools too: the blocking P4Runtime client) and the components it starts
(``refswitch``, ``controlplane``, ``poolnode``, ``hostagent``); never ``fuzz``, ``experiments``
or ``benchmarks``.
"""
