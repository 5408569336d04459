"""kvcast emulation: switch targets as processes, and (to come) Mininet topologies.

Modules:
    targets: BMv2 or the reference target as a process on veth pairs, programmed over P4Runtime.
"""
