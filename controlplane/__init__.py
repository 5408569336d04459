"""kvcast control plane: decides what the switch caches and installs it.

The package owns the controller: the P4Runtime client of each switch, one driver per P4 control,
the SRAM slot allocator, the cache-selection policies, the KV classes of chunks, the push plan
and the engine pusher, the access-report API and the daemon (``python -m controlplane``,
``kvcast-controller``) that composes them.

Layers: a component package. It may import only the shared layer ``kvcast`` (wire constants,
the fabric plan, KV classes, the report record and client, the pool backend interface, the
torch-free fetch engine its chunk source reads with, the agent's port) and third-party
libraries, never another component (``refswitch``, ``poolnode``, ``hostagent``) nor anything
above (``emulation``, ``experiments``, ``benchmarks``): it runs without torch.
``tests/test_layers.py`` checks it.

Modules and subpackages (each layer replaceable):
    errors: typed errors of every layer (``ControlPlaneError`` and subclasses).
    targets: what differs between the switch targets (reference, BMv2, Tofino).
    p4rt: one P4Runtime client object per switch, and a fleet of them.
    drivers: one driver per P4 control (forwarding, pool owner, multicast, cache table and
        fragment loader, sketch, stats).
    allocator: the SRAM slot allocator for cached chunks.
    policies: cache-selection policies behind one interface (``CachePolicy``) with a name
        registry and factory (their trace-driven evaluation is a tool: ``experiments.policies``).
    admission: the learned doorkeeper bar (how many reported uses a chunk needs).
    kvclasses: which chunks are static (declared, or detected by sustained reuse).
    push: the push plan of static prefixes to the hosts of a group, paced per tick.
    pusher: static prefixes registered with the controller and sent to the hosts' engines
        (completions requests on a thread pool), counted and retried.
    reports: the access-report API's server side (the record and client: ``kvcast.reports``).
    chunksource: where the controller reads chunk bytes (the DRAM pool).
    configspec: the daemon's configuration as typed records.
    configfields: typed readers of single YAML values, errors naming the setting's path.
    config: the configuration file's layout: ``parse_config``, ``load_config``.
    metrics: the daemon's Prometheus metrics.
    logs: JSON-lines logging.
    runtime: one switch as the daemon holds it (client, drivers, policy, base state), and the
        chunks it has heard of.
    intake: the report and class API's intake, and each tick's accesses of a switch.
    apply: a policy's decision turned into switch writes.
    fabric: on a leaf-spine fabric, multicast groups as trees across the switches, and spine
        failover.
    daemon: the ``Controller`` composing the above, and ``serve``.
    __main__: the command line (``run``, ``status``, ``validate-config``).
"""
