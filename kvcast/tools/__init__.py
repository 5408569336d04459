"""kvcast.tools: programs and clients that serve builds, tests and the emulation, not the product.

Nothing in a component (refswitch, poolnode, hostagent, controlplane) imports this package;
emulation, experiments, benchmarks and tests may. It imports only the rest of ``kvcast``.

Modules:
    gen_constants: the generator behind ``make constants`` (P4 source and P4Info to
        ``kvcast/p4constants.py``).
    tofino_summary: what the Tofino compile placed (stages, memory) from bf-p4c's outputs, and
        the freshness hash of the committed Tofino build (``make p4-tofino``).
    p4rt_client: a small blocking P4Runtime client for the conformance harness, the
        benchmarks and the emulation's bring-up (the controller has its own, asynchronous one).
"""
