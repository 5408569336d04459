"""kvcast control plane: decides what the switch caches and installs it.

Subpackages:
    policies: cache-selection policies behind one interface (``CachePolicy``), a name
        registry and factory, and the trace-driven evaluation that compares them.
"""
