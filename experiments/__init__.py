"""kvcast experiments; each runs as ``python -m experiments.<name>`` and prints result lines.

Modules:
    incast: N-to-1 incast on the emulated cluster (modes a-d), CSV and a plot.
    trace_replay: the shared conversation trace replayed on the emulated cluster with the
        controller daemon live, against the same replay with the switch cache off.
    q1_selection, q2_tiers, q3_eviction, q4_breakeven: the research questions on the cluster
        simulation (experiments/sim).
"""
