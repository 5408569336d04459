"""Trace-driven cluster simulation of kvcast: a flow-level model beyond one machine.

The model is event-driven and flow-level (not a packet simulator): every transfer is a fluid
flow across a set of links, and the rates of concurrent flows are max-min fair, solved again
whenever the set of flows changes. A multicast stream is one flow across the links of its tree,
so the pool's link carries it once whatever the number of receivers.

Modules:
    flows: links, flows and the event-driven max-min fair network (:class:`FlowNetwork`).
    hardware: what the model is made of: KV sizes per model (:class:`KVModel`), GPU prefill cost
        (:class:`GpuSpec`), the Tofino switch read from ``p4src/shared/sizes.p4``
        (:class:`SwitchSpec`), packet framing (:class:`WireFormat`).
    workloads: requests for the simulator from the Mooncake trace (read by
        :mod:`experiments.traces`, with a stated host mapping) and from generated workloads
        (Zipf, agentic fan-out, synchronized bursts).
    cluster: the cluster model (:class:`ClusterSim`): hosts with HBM and DRAM prefix caches, pool
        nodes, the kvcast switch (SRAM via a registered cache policy, multicast, miss
        coalescing), per-host GPU prefill queues.
    cluster_config: one run's knobs (:class:`ClusterConfig`) and the names they take.
    cluster_result: what one run measured (:class:`SimResult`).
    incast: the small-scale N-to-1 model of the emulation's modes a-d.
    validate: compare the small-scale model with the emulation's measured summary CSV.
    report: CSV, result lines and plots shared by the experiments, and their one ``main``
        (:func:`~experiments.sim.report.main_for`; for a research question,
        :func:`~experiments.sim.report.tables_main`: its tables written, then its figures).
    q1, q2, q3, q4: one experiment per research question (run through the thin entry modules
        ``experiments.q1_selection``, ``q2_tiers``, ``q3_eviction``, ``q4_breakeven``).
    replication: a hot prefix on k pool replicas vs switch multicast (``experiments.replication``).
    fabric: where in a leaf-spine fabric a shared prefix should be cached (the placement rules).
    crosscheck: the flow model against SimGrid's flow-level model on the same leaf-spine;
        crosscheck_simgrid: its SimGrid side, run in a child process (SimGrid is optional).

The package owns the model and the research questions' runs. It may import :mod:`kvcast`
(the switch's sizes and the fabric), :mod:`controlplane.policies` (the SRAM policies it runs),
:mod:`experiments.traces`, :mod:`experiments.policies.workloads` (the generated workloads) and
:mod:`experiments.output`; nothing of the emulation.
"""
