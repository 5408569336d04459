"""kvcast experiments; each runs as ``python -m experiments.<name>`` and prints result lines.

Modules:
    incast: N-to-1 incast on the emulated cluster (modes a-d), CSV and a plot.
"""
