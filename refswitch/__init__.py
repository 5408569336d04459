"""The reference target: the kvcast switch pipeline in Python, for machines without BMv2.

Modules:
    pipeline: p4src/v1model/kvcast.p4 in Python, packet for packet.
    runtime: the P4Info-driven runtime state (tables, counters, multicast groups, digests).
    p4rt_server: the P4Runtime gRPC server over that state.
    dataplane: raw-socket packet I/O on veth/Mininet interfaces.
    __main__: the ``kvcast-refswitch`` command (simple_switch_grpc's command line).
"""
