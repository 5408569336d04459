"""Trace-driven evaluation of the switch-SRAM selection policies: tools, not the controller.

The running controller (:mod:`controlplane`) only asks a policy for decisions; this package
replays workloads through the policies offline and measures them against the optimum, for
``benchmarks.policies``, ``experiments.lofo`` and the policy tests.

Modules:
    workloads: workloads for the replays (:class:`~experiments.policies.workloads.Workload`):
        the Mooncake trace with hosts drawn uniformly, and generated prefix traces (RAG behind
        system prompts, agentic fan-out, many tenants, multi-turn chat).
    evaluate: replay one policy over one workload, the offline optimum (Belady), every
        (budget, policy) pair beside the optimum.

May import: :mod:`controlplane.policies` (the policies under test) and
:mod:`experiments.traces` (the trace format); nothing of the emulation or the cluster
simulation (``experiments.sim`` imports this package, not the reverse).
"""
