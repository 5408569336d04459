"""The reference target: the kvcast switch pipeline in Python, for machines without BMv2.

It owns the switch side of the project where no BMv2 is installed: the P4 program's pipeline
packet for packet, the runtime state a P4Runtime controller writes (validated as PI validates
it), the P4Runtime server, and raw-socket packet I/O. It imports only the shared layer
(``kvcast``: generated constants, the wire format), never the other components (pool node,
host agent, controller) nor the tools above them.

Modules:
    pipeline: p4src/v1model/kvcast.p4 in Python, packet for packet.
    edge: the edge guard in front of the program's parser (what a host port may send).
    impair: the impairment stage (loss, delay, reordering) for fault experiments.
    state: SwitchState, the front of the P4Info-driven runtime state the pipeline reads and
        the server writes.
    schema: what is derived from the P4Info (PipelineSchema and its per-entity infos).
    tables: table entries, their matching and their validation.
    program: what one SetForwardingPipelineConfig installs, and RECONCILE_AND_COMMIT.
    replication: multicast groups and clone sessions (the packet replication engine).
    digests: digest configuration, batching and duplicate suppression.
    stream: PacketIn and DigestList delivery to the primary controller.
    errors: the typed errors (each with its google.rpc code) and WriteOp.
    p4rt_server: the P4Runtime gRPC server over a SwitchState (requests, pipeline config).
    p4rt_entities: P4Runtime entities of a Write or Read, to and from SwitchState calls.
    p4rt_arbitration: StreamChannel connections and primary election.
    dataplane: raw-socket packet I/O on veth/Mininet interfaces.
    __main__: the ``kvcast-refswitch`` command (simple_switch_grpc's command line).
"""
