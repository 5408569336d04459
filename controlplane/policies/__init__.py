"""Cache-selection policies for the switch SRAM, behind one interface with a name registry.

Importing this package registers every built-in policy:

* ``lru`` (:class:`~controlplane.policies.lru.LruPolicy`): demand-fill LRU baseline.
* ``lfu`` (:class:`~controlplane.policies.lfu.LfuPolicy`): LFU with dynamic aging.
* ``arc`` (:class:`~controlplane.policies.arc.ArcPolicy`): Adaptive Replacement Cache, in
  bytes; an anchor with nothing to tune.
* ``wtinylfu`` (:class:`~controlplane.policies.wtinylfu.WTinyLfuPolicy`): Caffeine's window
  LRU + frequency-filtered admission + segmented LRU; the other anchor.
* ``sketch`` (:class:`~controlplane.policies.sketch.SketchPolicy`): NetCache-style count-min
  admission, least-hit eviction.
* ``kvcast`` (:class:`~controlplane.policies.kvcast.KvcastPolicy`): decayed, host-weighted
  value per SRAM byte, each access weighted by the learned return rate of its class (access
  count x reuse gap, or the parent's popularity in the prefix tree at first sight),
  prefix-closed, with hysteresis; the controller's default policy. Its C record path's
  binding is :mod:`controlplane.policies.kvcast_native`, the ghost caches of its shadow
  rankings :mod:`controlplane.policies.kvcast_shadows`.
* ``adaptive`` (:class:`~controlplane.policies.adaptive.AdaptivePolicy`): kvcast's
  statistics with the eviction order learned online among three experts (kvcast's score,
  recency, aged frequency) from the misses each expert's decisions caused (LeCaR's regret).
* ``belady`` (:class:`~controlplane.policies.belady.BeladyPolicy`): OFFLINE optimum for
  evaluation only (needs the future).

The interface, events and decisions live in :mod:`controlplane.policies.base`.

The package owns the policies the controller runs and nothing else: the trace-driven
evaluation of policies (replay, offline optimum, workload generators) is a tool and lives in
:mod:`experiments.policies`. It may import :mod:`kvcast` (the shared layer),
:mod:`controlplane.errors` and numpy, never another component, the rest of the controller
(the daemon imports the policies, not the reverse) nor ``experiments``; the optional C helper
``_kvcast_native`` is built from ``_kvcast_native.c`` beside it.

Typical use::

    from controlplane.policies import Access, make_policy

    policy = make_policy("kvcast", capacity_bytes=8 << 20)
    decision = policy.observe(Access(key=0xABC, tenant=1, size=4096, host=3, time=12.5))
    for ev in decision.evict:      # apply evictions first
        ...
    for ad in decision.admit:
        ...
"""

from controlplane.policies.adaptive import AdaptivePolicy
from controlplane.policies.arc import ArcPolicy
from controlplane.policies.base import (
    NO_CHANGE,
    Access,
    AccessColumns,
    Admission,
    CachePolicy,
    Decision,
    EvictAction,
    Eviction,
    FutureMismatchError,
    InvalidAccessError,
    PolicyConfigError,
    PolicyError,
    Ranked,
    available_policies,
    make_policy,
    policy_class,
    register_policy,
)
from controlplane.policies.belady import BeladyPolicy
from controlplane.policies.kvcast import KvcastPolicy
from controlplane.policies.lfu import LfuPolicy
from controlplane.policies.lru import LruPolicy
from controlplane.policies.sketch import SketchPolicy
from controlplane.policies.wtinylfu import WTinyLfuPolicy

__all__ = [
    "NO_CHANGE",
    "Access",
    "AccessColumns",
    "AdaptivePolicy",
    "Admission",
    "ArcPolicy",
    "BeladyPolicy",
    "CachePolicy",
    "Decision",
    "EvictAction",
    "Eviction",
    "FutureMismatchError",
    "InvalidAccessError",
    "KvcastPolicy",
    "LfuPolicy",
    "LruPolicy",
    "PolicyConfigError",
    "PolicyError",
    "Ranked",
    "SketchPolicy",
    "WTinyLfuPolicy",
    "available_policies",
    "make_policy",
    "policy_class",
    "register_policy",
]
