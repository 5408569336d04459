"""Trace replay: the Mooncake conversation trace on the emulated cluster, switch cache on vs off.

The first ``--max-requests`` requests of ``conversation_trace.jsonl`` (from ``--start``) are
replayed onto an emulated cluster (:class:`emulation.network.Cluster`: one switch, BMv2 where
installed or the reference target, ``--hosts`` GPU hosts, one DRAM pool node) twice:

* ``cache-off``: the controller runs its policy in dry-run mode: it takes the same reports and
  decides, but never writes the switch cache (the policy admitting nothing), so every block
  comes from the pool;
* ``cache-on``: the controller applies its decisions: chunks it picks are loaded into switch
  SRAM, and hosts' GETs hit there.

How the replay maps the trace:

* **Blocks.** Each trace ``hash_id`` (a 512-token block) becomes a 64-bit key (BLAKE2b of the
  id) of ``--block-bytes`` synthetic bytes (``kvcast.synthetic``; 2 KiB by default: the
  2 MiB of BMv2 fragment SRAM, ``NUM_FRAG_SLOTS * FRAG_BYTES``, then holds 1,024 blocks, where
  real 512-token blocks of an 8B model are 64 MiB). The pool node preloads every block of the
  slice (as if each request's prefill had stored its blocks).
* **Hosts.** The trace names none; each request goes to a host drawn uniformly at random
  (``--seed``), a load balancer that is not prefix-aware, as in the policy evaluation
  (``experiments.policies.workloads.load_mooncake_trace``).
* **What a host fetches.** A request's leading blocks that an earlier request of the slice
  already used are its reusable prefix: the host's agent fetches them (switch first, the pool
  behind it on a miss, the pool directly as the last resort), checking every fragment's CRC and
  the whole block against its synthetic bytes. The blocks from the first never-seen one on are
  computed by prefill, not fetched. The agent reports every block of the request to the
  controller (``POST /v1/reports``: fetched ones with ``hit`` = all fragments came from switch
  SRAM, computed ones with ``hit`` null), with parent and position.
* **Time.** Request ``i`` is dispatched at ``t0 + (ts_i - ts_first) / speedup``; each host's
  agent serves its requests in order (a busy host queues them).

The controller is the real daemon (``python -m controlplane run``), a process in the root
namespace talking P4Runtime to the switch with election id 20, above the Cluster's own client
(10), so it becomes primary; it pushes its pipeline and installs routes, pool owners and replica
destinations itself. Agents and the controller talk over a management network: one veth pair
per node between its namespace and the root namespace (10.254.N.0/24), outside the emulated data
plane; the controller also reads chunk bytes from the pool node over it (NOCACHE GETs).

Measured per run: the pool node's data-plane egress bytes (its interface counter), its
management egress (the controller's chunk loads), per-request fetch time, blocks and fragments
served by the switch, and the controller's loads and evictions. Written: ``requests.csv``,
``summary.csv`` and ``trace_replay.png`` under ``--out``, and ``result trace_replay ...`` lines.


Run: ``python -m experiments.trace_replay`` (root; Mininet). ``--help`` lists the parameters.
``python -m experiments.trace_replay agent ...`` is the per-host agent the replay starts.

The package owns the trace replay experiment, split by role:

Modules:
    plan: what is replayed (trace blocks as chunk keys, requests with their fetched prefix).
    agent: the per-host agent process (fetches, verifies and reports one request per line).
    processes: the cluster's processes and plumbing (management network, controller daemon,
        pool node, controller configuration and metrics).
    restarts: the fault injections (switch, controller, pool node and master restarts in the
        middle of a run) and their outcome.
    run: one run and both runs on a cluster, the outputs and the command line (``main``).

It may import every package below experiments (kvcast, the components, emulation) and the
experiments' shared helpers (experiments.output), never benchmarks.
"""
