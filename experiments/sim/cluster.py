"""The cluster model: GPU hosts, DRAM pool nodes and a kvcast switch, driven by requests.

Topology. ``hosts`` GPU hosts in racks of ``hosts_per_rack`` under leaf switches, ``pools``
DRAM pool nodes under the pool leaf, a spine between them. The pool leaf is the kvcast switch
(a Tofino): every pool response passes it, so it is where SRAM hits, miss coalescing and
multicast happen; the other switches replicate multicast packets along the tree (ordinary PRE
groups). Links in the flow model: each host's NIC (receive direction), each pool node's NIC
(send direction), each host's PCIe (host DRAM to HBM), each rack's spine downlinks when the
fabric is oversubscribed (``rack_oversub > 1``; at 1 the fabric is non-blocking and they are
left out), and the switch pipeline's packet rate for SRAM-served fragments. Writes to the pool
use the other direction of full-duplex links, so they are counted, not simulated.

Request path (at arrival, in arrival order). For each block of the prompt, block 0 first, the
host uses the fastest tier that has it: its GPU HBM prefix cache, its DRAM, the switch SRAM
(when resident and loaded; the switch caches pool chunks, so only for blocks the pool lists),
the pool node that owns the key (splitmix64 of the key mod ``pools``); the first block found
nowhere ends the usable prefix and the rest of the prompt is recomputed (prefill). SRAM and pool
fetches are network accesses: the switch's cache policy (any policy of
:mod:`controlplane.policies`, by registry name) observes each one as an ``Access`` and its
decisions load or evict SRAM chunks (a chunk is served once loaded: loads take
``SwitchSpec.load_s`` each and queue one after another on the CPU port). Pool blocks
of one request from one pool node form one flow; with coalescing, a block that is already on
its way from the pool to another host is not sent again: the new host joins that stream (the
block is split out of its flow into a multicast flow with both receivers) and fetches only the
bytes it missed (a unicast *repair*). The request's fetch ends when all its flows end (plus a
fixed latency per source); its prefill then runs on the host's GPU, first come first served;
TTFT = fetch, queueing and prefill.

Caches. HBM and DRAM are per-host LRUs with three rules (``tier_rule``): ``inclusive`` (every
block used goes to both), ``exclusive`` (HBM victims are demoted to DRAM, DRAM hits promoted)
and ``hbm-only``. The pool keeps what is written to it (``pool_write``): ``through`` (Mooncake:
every computed block, available once its prefill would have ended), ``demote`` (only blocks that
leave a host's last tier), ``demote-value`` (those whose residual value by the ``kvcast``
policy's estimator is at least ``demote_threshold``) or ``none``; a bounded pool is an LRU.
Local caches and the pool change at arrival time, so which blocks reach the network does not
depend on timing or on the switch policy: the network access stream can be computed in advance
(:meth:`ClusterSim.network_stream`), which the offline optimum (``belady``) needs.

The run's knobs are :class:`~experiments.sim.cluster_config.ClusterConfig`, what it measured
:class:`~experiments.sim.cluster_result.SimResult`.

Classes:
    ClusterSim: runs a workload through the model.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict

import numpy as np

from controlplane.policies import NO_CHANGE, Access, CachePolicy, EvictAction, make_policy
from experiments.sim.cluster_config import DRAM, HBM, POOL, SRAM, ClusterConfig
from experiments.sim.cluster_result import SimResult, SramEviction
from experiments.sim.flows import Flow, FlowNetwork, Link
from experiments.sim.workloads import SimRequest, SimWorkload
from experiments.traces import mix64

__all__ = ["ClusterSim"]

_GIB = 1 << 30
_MISSING = object()


class _Req:
    """A request in flight."""

    __slots__ = (
        "arrival",
        "cached_tokens",
        "fetch_done",
        "host",
        "index",
        "latency",
        "pending",
        "tier_done",
        "tiers_used",
        "tokens",
        "waiters",
    )

    def __init__(self, r: SimRequest, index: int) -> None:
        self.index = index
        self.arrival = r.time
        self.host = r.host
        self.tokens = r.tokens
        self.cached_tokens = 0
        self.pending = 0
        self.fetch_done = math.nan
        self.latency = 0.0
        self.tier_done = [r.time, r.time, r.time, r.time]
        self.tiers_used = [False, False, False, False]
        self.waiters: list[_Req] = []


class _Stream:
    """Bookkeeping of one flow: which blocks it carries, for which requests, from which tier."""

    __slots__ = ("keys", "reqs", "tier")

    def __init__(self, keys: list[int], reqs: list[_Req], tier: int) -> None:
        self.keys = keys
        self.reqs = reqs
        self.tier = tier


class ClusterSim:
    """Run one workload through the cluster model.

    Args:
        config: the cluster.
        workload: the requests (hosts must be below ``config.hosts``).
        future: for the offline policy (``belady``): the network access keys in order; computed
            with :meth:`network_stream` when not given.
        record_streams: keep the network access stream and eviction logs in the result.

    Raises:
        ValueError: if a request names a host outside the cluster.
    """

    def __init__(
        self,
        config: ClusterConfig,
        workload: SimWorkload,
        *,
        future: list[int] | None = None,
        record_streams: bool = False,
    ) -> None:
        self.cfg = config
        self.workload = workload
        if any(not 0 <= r.host < config.hosts for r in workload.requests):
            raise ValueError(f"{workload.name}: a request's host is outside 0..{config.hosts - 1}")
        self._record = record_streams
        self._future = future

    # ------------------------------------------------------------------ public
    @classmethod
    def network_stream(cls, config: ClusterConfig, workload: SimWorkload) -> list[int]:
        """The keys of every network access, in the order the switch policy observes them.

        Args:
            config: the cluster (its fabric and policy do not matter).
            workload: the requests.

        Returns:
            The key sequence (what ``belady`` needs as ``future``).
        """
        sim = cls(config.with_(fabric="unicast"), workload)
        sim._setup(dry=True)
        for i, r in enumerate(workload.requests):
            sim._arrive(r, i)
        return [k for _, k in sim.res.net_stream]

    def run(self) -> SimResult:
        """Simulate every request to completion.

        Returns:
            The measurements.
        """
        t0 = time.perf_counter()
        self._setup(dry=False)
        net = self.net
        for i, r in enumerate(self.workload.requests):
            net.advance(r.time)
            self._arrive(r, i)
        net.advance(math.inf)
        res = self.res
        res.fetch_s = self._fetch
        res.ttft_s = self._ttft
        res.measured_from = self.workload.warmup
        res.flows = net._fid
        res.solves = net.solves
        res.sim_end_s = net.now
        res.pool_wire_bytes = sum(link.committed for link in self._pool_links)
        res.wall_s = time.perf_counter() - t0
        if res.requests != len(self.workload.requests):
            raise RuntimeError(
                f"{res.requests} of {len(self.workload.requests)} requests completed: a flow "
                "or dependency was lost (a model bug)"
            )
        return res

    # ------------------------------------------------------------------ setup
    def _setup(self, dry: bool) -> None:
        cfg = self.cfg
        self.dry = dry
        self.res = SimResult(cfg, self.workload.name)
        if dry:
            self.res.net_stream = []
        self._chunk = cfg.chunk_bytes
        self.net = FlowNetwork()
        self._host_bps = cfg.host_gbps * 1e9 / 8
        self._pool_bps = cfg.pool_gbps * 1e9 / 8
        frag = cfg.switch.frag_bytes
        self._pool_coef = cfg.wire.pool_coef(frag)
        self._sram_coef = cfg.wire.sram_coef(frag)
        self._pool_links = [self.net.link(f"pool{p}", self._pool_bps) for p in range(cfg.pools)]
        self._host_links: dict[int, Link] = {}
        self._rack_links: dict[int, Link] = {}
        self._pcie_links: dict[int, Link] = {}
        self._pipeline: Link | None = None
        if cfg.uses_sram and cfg.pipeline_limit:
            self._pipeline = self.net.link("pipeline", cfg.switch.pipes * cfg.switch.pipe_pps)
        hbm_blocks = int(cfg.hbm_cache_gib * _GIB // self._chunk)
        dram_blocks = (
            int(cfg.dram_cache_gib * _GIB // self._chunk) if cfg.tier_rule != "hbm-only" else 0
        )
        self._hbm_cap = hbm_blocks
        self._dram_cap = dram_blocks
        self._hbm: dict[int, OrderedDict[int, _Req | None]] = {}
        self._dram: dict[int, OrderedDict[int, _Req | None]] = {}
        self._pool_cap = (
            None if cfg.pool_gib is None else int(cfg.pool_gib * _GIB // self._chunk) * cfg.pools
        )
        self._pool_ready: dict[int, float] = {}
        self._pool_lru: OrderedDict[int, None] = OrderedDict()
        self._streams: dict[int, Flow] = {}
        self._gpu_free: dict[int, float] = {}
        n = len(self.workload.requests)
        self._fetch = np.full(n, math.nan)
        self._ttft = np.full(n, math.nan)
        self._sram_ready: dict[int, float] = {}
        self._misses: dict[int, tuple[int, int]] = {}
        self._policy: CachePolicy | None = None
        if cfg.uses_sram and not dry:
            params = dict(cfg.policy_params)
            if cfg.policy == "belady" and "future" not in params:
                params["future"] = (
                    self._future
                    if self._future is not None
                    else self.network_stream(cfg, self.workload)
                )
            self._policy = make_policy(cfg.policy, capacity_bytes=cfg.sram_budget, **params)
        self._estimator: CachePolicy | None = None
        if cfg.pool_write == "demote-value":
            # The residual value Q3's thresholds were set in: a decayed count of accesses
            # (the learned weights make it a count of expected reuses, a different scale).
            self._estimator = make_policy(
                "kvcast",
                capacity_bytes=self._chunk,
                demote_threshold=cfg.demote_threshold,
                learned_weights=False,
            )
        self._load_s = 0.0 if cfg.instant_load else cfg.switch.load_s(self._chunk)
        self._cpu_free = 0.0

    # ------------------------------------------------------------------ links
    def _host_link(self, h: int) -> Link:
        link = self._host_links.get(h)
        if link is None:
            link = self.net.link(f"host{h}", self._host_bps)
            self._host_links[h] = link
        return link

    def _rack_link(self, h: int) -> Link | None:
        cfg = self.cfg
        if cfg.rack_oversub <= 1:
            return None
        r = h // cfg.hosts_per_rack
        link = self._rack_links.get(r)
        if link is None:
            cap = cfg.hosts_per_rack * self._host_bps / cfg.rack_oversub
            link = self.net.link(f"rack{r}", cap)
            self._rack_links[r] = link
        return link

    def _down_path(self, h: int, coef: float) -> list[tuple[Link, float]]:
        path = [(self._host_link(h), coef)]
        rack = self._rack_link(h)
        if rack is not None:
            path.append((rack, coef))
        return path

    def _pcie_link(self, h: int) -> Link:
        link = self._pcie_links.get(h)
        if link is None:
            link = self.net.link(f"pcie{h}", self.cfg.pcie_gbytes * 1e9)
            self._pcie_links[h] = link
        return link

    # ------------------------------------------------------------------ arrival
    def _arrive(self, r: SimRequest, index: int) -> None:
        cfg = self.cfg
        res = self.res
        t = r.time
        h = r.host
        size = self._chunk
        st = _Req(r, index)
        hbm = self._hbm.get(h)
        if hbm is None:
            hbm = self._hbm[h] = OrderedDict()
            self._dram[h] = OrderedDict()
        dram = self._dram[h]
        pool_ready = self._pool_ready
        sram_ready = self._sram_ready
        uses_sram = cfg.uses_sram
        estimator = self._estimator
        n_dram = 0
        sram_keys: list[int] = []
        pool_keys: list[int] = []
        deps: list[_Req] = []
        usable = 0
        parent: int | None = None
        res.block_refs += len(r.blocks)
        for pos, key in enumerate(r.blocks):
            if estimator is not None:
                estimator.record(Access(key, 0, size, h, t, None, parent, pos))
            loader = hbm.get(key, _MISSING)
            if loader is not _MISSING:
                tier = HBM
            else:
                loader = dram.get(key, _MISSING)
                if loader is not _MISSING:
                    tier = DRAM
                    n_dram += 1
                else:
                    ready = pool_ready.get(key)
                    if ready is None or ready > t:
                        break
                    hit = uses_sram and sram_ready.get(key, math.inf) <= t
                    self._observe(key, h, t, parent, pos, hit)
                    if self._pool_cap is not None:
                        self._pool_lru.move_to_end(key)
                    if hit:
                        tier = SRAM
                        sram_keys.append(key)
                    else:
                        tier = POOL
                        pool_keys.append(key)
                    loader = None
            if isinstance(loader, _Req) and math.isnan(loader.fetch_done):
                deps.append(loader)
            res.tier_refs[tier] += 1
            res.tier_bytes[tier] += size
            usable += 1
            parent = key
        n = len(r.blocks)
        st.cached_tokens = min(usable * self.workload.block_tokens, r.tokens)
        res.computed_blocks += n - usable
        self._update_caches(st, r, usable)
        if self.dry:
            return
        lat = 0.0
        if pool_keys:
            lat = cfg.pool_latency_s
        if sram_keys:
            lat = max(lat, cfg.sram_latency_s)
        if (pool_keys or sram_keys) and cfg.fabric != "unicast":
            lat += cfg.extra_hop_s
        st.latency = lat
        if n_dram:
            self._start(st, n_dram * size, [(self._pcie_link(h), 1.0)], [], DRAM)
        if sram_keys:
            path = self._down_path(h, self._sram_coef)
            if self._pipeline is not None:
                path.append((self._pipeline, 1.0 / cfg.switch.frag_bytes))
            self._start(st, len(sram_keys) * size, path, [], SRAM)
            res.sram_hit_bytes += len(sram_keys) * size
        if pool_keys:
            self._fetch_pool(st, pool_keys)
        for dep in dict.fromkeys(deps):
            if dep is not st:
                st.pending += 1
                dep.waiters.append(st)
        if st.pending == 0:
            self._fetched(st, t)

    def _update_caches(self, st: _Req, r: SimRequest, usable: int) -> None:
        """Every block of the request ends up in the host's caches; computed ones in the pool."""
        cfg = self.cfg
        t = r.time
        h = r.host
        hbm = self._hbm[h]
        dram = self._dram[h]
        rule = cfg.tier_rule
        hbm_cap = self._hbm_cap
        dram_cap = self._dram_cap
        res = self.res
        for key in r.blocks:
            if key in hbm:
                hbm.move_to_end(key)
            else:
                hbm[key] = st
                if key in dram:
                    res.dram_to_hbm += 1
                    if rule == "exclusive":
                        del dram[key]
            if rule == "inclusive":
                if key in dram:
                    dram.move_to_end(key)
                else:
                    dram[key] = st
            while len(hbm) > hbm_cap:
                victim, loader = hbm.popitem(last=False)
                if rule == "exclusive":
                    dram[victim] = loader
                    res.hbm_to_dram += 1
                elif rule == "hbm-only" or victim not in dram:
                    self._host_evict(t, h, victim)
            while len(dram) > dram_cap:
                victim, _ = dram.popitem(last=False)
                if victim not in hbm:
                    self._host_evict(t, h, victim)
        if cfg.pool_write == "through" and usable < len(r.blocks):
            ready = t + cfg.gpu.prefill_s(cfg.model, st.cached_tokens, r.tokens)
            for key in r.blocks[usable:]:
                if key not in self._pool_ready:
                    self._pool_insert(key, ready)

    def _host_evict(self, t: float, h: int, key: int) -> None:
        res = self.res
        res.host_evictions += 1
        if self._record:
            res.host_evicted.append((t, h, key))
        mode = self.cfg.pool_write
        if key in self._pool_ready or mode in ("through", "none"):
            return
        if mode == "demote-value":
            assert self._estimator is not None
            if self._estimator.residual_value(key, t) < self.cfg.demote_threshold:
                return
        res.host_demotions += 1
        self._pool_insert(key, t)

    def _pool_insert(self, key: int, ready: float) -> None:
        res = self.res
        self._pool_ready[key] = ready
        res.pool_write_bytes += self._chunk
        if self._pool_cap is None:
            return
        lru = self._pool_lru
        lru[key] = None
        while len(lru) > self._pool_cap:
            victim, _ = lru.popitem(last=False)
            del self._pool_ready[victim]
            res.pool_evictions += 1

    # ------------------------------------------------------------------ switch policy
    def _observe(self, key: int, h: int, t: float, parent: int | None, pos: int, hit: bool) -> None:
        res = self.res
        res.net_refs += 1
        if self._record or self.dry:
            res.net_stream.append((t, key))
        cfg = self.cfg
        sw = cfg.switch
        if not hit and cfg.uses_sram:
            window = int(t // cfg.digest_window_s)
            w, count = self._misses.get(key, (window, 0))
            count = count + 1 if w == window else 1
            self._misses[key] = (window, count)
            if count == sw.hot_miss_threshold:
                res.digests += 1
                res.control_bytes += sw.digest_msg_bytes
        policy = self._policy
        if policy is None:
            return
        d = policy.observe(Access(key, 0, self._chunk, h, t, hit, parent, pos))
        if d is NO_CHANGE:
            return
        for ev in d.evict:
            self._sram_ready.pop(ev.key, None)
            res.evictions += 1
            res.table_writes += 1
            res.control_bytes += sw.table_msg_bytes
            demote = ev.action is EvictAction.DEMOTE
            res.demotes += demote
            if self._record:
                index = len(res.net_stream) - 1
                res.sram_evictions.append(SramEviction(t, index, ev.key, demote, ev.residual))
        for ad in d.admit:
            ready = max(t, self._cpu_free) + self._load_s
            self._cpu_free = ready
            self._sram_ready[ad.key] = ready
            res.load_wait_s += ready - t
            if self._record:
                res.sram_admissions.append((len(res.net_stream) - 1, ad.key))
            res.admissions += 1
            packets = sw.frags(ad.size) * sw.pipes
            res.write_packets += packets
            res.table_writes += 1
            res.control_bytes += (
                packets * (cfg.wire.frame(sw.frag_bytes) + sw.write_msg_bytes) + sw.table_msg_bytes
            )

    # ------------------------------------------------------------------ flows
    def _start(
        self,
        st: _Req,
        nbytes: float,
        path: list[tuple[Link, float]],
        keys: list[int],
        tier: int,
    ) -> Flow:
        st.pending += 1
        st.tiers_used[tier] = True
        return self.net.start(nbytes, path, self._flow_done, _Stream(keys, [st], tier))

    def _fetch_pool(self, st: _Req, keys: list[int]) -> None:
        cfg = self.cfg
        res = self.res
        size = self._chunk
        pools = cfg.pools
        streams = self._streams
        by_owner: dict[int, list[int]] = {}
        res.unicast_pool_bytes += len(keys) * size
        for key in keys:
            flow = streams.get(key) if cfg.coalesce else None
            if flow is not None and self._join(st, key, flow):
                continue
            by_owner.setdefault(mix64(key) % pools, []).append(key)
        coef = self._pool_coef
        for owner, owned in by_owner.items():
            path = [(self._pool_links[owner], coef), *self._down_path(st.host, coef)]
            flow = self._start(st, len(owned) * size, path, owned, POOL)
            res.pool_egress_bytes += len(owned) * size
            if cfg.coalesce:
                for key in owned:
                    streams[key] = flow

    def _join(self, st: _Req, key: int, flow: Flow) -> bool:
        """Join ``st`` to the stream carrying ``key``; False when it is about to end."""
        net = self.net
        res = self.res
        stream: _Stream = flow.data
        left = net.current_remaining(flow)
        per = left / len(stream.keys)
        if per <= 1.0:
            return False
        target = flow
        if len(stream.keys) > 1:
            stream.keys.remove(key)
            target = net.split(flow, per, self._flow_done, _Stream([key], list(stream.reqs), POOL))
            for q in stream.reqs:
                q.pending += 1
            self._streams[key] = target
        target.data.reqs.append(st)
        st.pending += 1
        st.tiers_used[POOL] = True
        net.extend(target, self._down_path(st.host, self._pool_coef))
        res.coalesced_joins += 1
        res.group_updates += 1
        res.control_bytes += self.cfg.switch.group_msg_bytes
        missed = self._chunk - per
        if missed > 1.0:
            owner = mix64(key) % self.cfg.pools
            path = [
                (self._pool_links[owner], self._pool_coef),
                *self._down_path(st.host, self._pool_coef),
            ]
            self._start(st, missed, path, [], POOL)
            res.repair_bytes += missed
            res.pool_egress_bytes += missed
        return True

    def _flow_done(self, flow: Flow, t: float) -> None:
        stream: _Stream = flow.data
        streams = self._streams
        for key in stream.keys:
            if streams.get(key) is flow:
                del streams[key]
        tier = stream.tier
        for q in stream.reqs:
            if t > q.tier_done[tier]:
                q.tier_done[tier] = t
            q.pending -= 1
            if q.pending == 0:
                self._fetched(q, t)

    def _fetched(self, st: _Req, t: float) -> None:
        """All of the request's prefix KV is present: queue its prefill on the host's GPU."""
        cfg = self.cfg
        res = self.res
        done = t + st.latency
        st.fetch_done = done
        fetch = done - st.arrival
        start = max(done, self._gpu_free.get(st.host, 0.0))
        prefill = cfg.gpu.prefill_s(cfg.model, st.cached_tokens, st.tokens)
        if prefill <= 0:
            prefill = cfg.gpu.prefill_s(cfg.model, st.tokens - 1, st.tokens)
        self._gpu_free[st.host] = start + prefill
        res.requests += 1
        res.recompute_tokens += max(st.tokens - st.cached_tokens, 1)
        res.gpu_busy_s += prefill
        self._fetch[st.index] = fetch
        self._ttft[st.index] = start + prefill - st.arrival
        last = -1
        last_t = -math.inf
        for tier in range(4):
            if st.tiers_used[tier]:
                dt = st.tier_done[tier] - st.arrival
                res.tier_time_s[tier] += dt
                if dt >= last_t:
                    last, last_t = tier, dt
        if last < 0:
            last = HBM
        res.critical_s[last] += fetch
        waiters = st.waiters
        st.waiters = []
        for w in waiters:
            w.pending -= 1
            if w.pending == 0:
                self._fetched(w, max(done, w.arrival))
