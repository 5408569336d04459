"""Fuzzing at volume: mutated packets into every parser kvcast has (``make fuzz``).

Targets, each fed mutants of the packets it really sees (truncations, bit flips, random KVP
headers, lying lengths, trailing garbage, random bytes):

- ``refswitch``: the reference pipeline, in process, from host and pool ports. Every packet
  must end in exactly one accounted outcome (a frame out, a drop counted under a reason, or a
  KVP event), and the cache state (registers, cache entries) must not change.
- ``bmv2``: the same P4 program in simple_switch_grpc on veth pairs (where installed). BMv2 is
  fed the same mutants; afterwards it must still answer a GET hit with the right bytes, and its
  drop and event counters must account for what it did not forward.
- ``pool``: the pool node's protocol handler. No exception; every datagram is counted once
  (a GET, a malformed datagram or an unexpected op); every reply is a well-formed DATA with a
  correct CRC or a NACK.
- ``agent``: the fetch client, during real fetches from a pool-node server on loopback, while
  mutants of real DATA and NACK messages arrive from a KVP service address (the worst case: a
  trusted source sending garbage). Every fetch ends complete with exactly the chunk's bytes, or
  refused (RECOMPUTE); never complete with a wrong byte; a fetch after the mutants completes.

Modules:
    mutators: the seeds and the mutation operators.
    targets: one function per target, returning its counts.

Imports: ``kvcast``, the components it feeds and ``emulation`` (a BMv2 process); never
``experiments`` or ``benchmarks``.
"""
