"""kvcast control plane: decides what the switch caches and installs it.

Modules and subpackages (each layer replaceable):
    errors: typed errors of every layer (``ControlPlaneError`` and subclasses).
    p4rt: one P4Runtime client object per switch.
    allocator: the SRAM slot allocator for cached chunks.
    policies: cache-selection policies behind one interface (``CachePolicy``) with a name
        registry and factory, and the trace-driven evaluation that compares them.
    kvclasses: which chunks are static (declared, or detected by sustained reuse).
    push: the push plan of static prefixes to the hosts of a group, paced per tick.
"""
