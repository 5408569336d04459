"""kvcast experiments; each runs as ``python -m experiments.<name>`` and prints result lines.

The package owns the experiments: the drivers that build an emulated cluster (or the cluster
simulation), run the product's components on it, measure and write CSVs, plots and ``result``
lines. It may import every package below it (kvcast, the components refswitch, poolnode,
hostagent and controlplane, and emulation), never benchmarks, which sit above it.

Modules:
    incast: N-to-1 incast on the emulated cluster (modes a-d, r2, r4): runs the points;
        incast_results: its modes, a point's result, CSVs, the plot and the relief table.
    faults: the incast and the trace replay under injected faults and restarts.
    trace_replay: the shared conversation trace replayed on the emulated cluster with the
        controller daemon live, against the same replay with the switch cache off (a package:
        plan, agent, processes, restarts, run).
    serving: real vLLM engines share a prefix through the switch (time to first token);
        serving_plan: its model, link scaling and prompts; serving_engine: one engine process
        and the driver of one per host; serving_checks: its fault checks.
    prefill_rate: a model shape's prefill rate on a GPU.
    prefix_share: one host publishes a prompt's KV, the others fetch it through the switch.
    sram_tokens: how many tokens of KV one Tofino pipe's SRAM holds for real model shapes.
    lofo: selection policies, parameters chosen leaving one workload family out.
    replication, q1_selection, q2_tiers, q3_eviction, q4_breakeven: the research questions on
        the cluster simulation (experiments/sim).
    output: CSV and plot helpers the experiments share.
"""
