"""Static prefixes pushed into the engines: registered, planned, sent, counted, retried.

The controller knows chunks by key only; the tokens that make a static prefix come from
whoever declares it. ``POST /v1/static {"tenant", "tokens", "cache_salt"?}`` registers one
(the application or orchestrator that also marks it with ``static_tokens`` in its requests);
the controller keeps it in memory (``GET /v1/static`` lists it, with the hosts it reached) and
pushes it to every host of its tenant that has an ``engine_url`` (the host's OpenAI-compatible
server): one completions request per engine for the prefix alone, ``max_tokens: 1``, with the
``kv_transfer_params`` the serving experiment uses. When an order goes to several hosts, the
daemon gives it one multicast group of exactly those hosts: the first engine leads the group
fetch, the others follow, so the switch replicates one pool read to all of them; each engine's
vLLM keeps the blocks in its own prefix cache.

Planning is ``controlplane.push``'s, one planner per switch, a prefix being one candidate of
``len(tokens) * push.bytes_per_token`` bytes, paced by ``push.budget_bytes_per_tick`` after
the tick's pulls. Sending never blocks the tick: the requests run on a thread pool
(``push.max_inflight`` at once, each bounded by ``push.timeout_s``), and the next tick collects
what has finished. A failed request (no answer, a timeout, a non-2xx status) is counted, and
the host is planned again ``push.retry_s`` later, or at the first tick after its first report
(a host that joins later: its engine may not have been up at the first try). A host not bound
to the prefix's tenant is never sent it (the planner skips it, and :meth:`EnginePusher.admit`
checks each order again and counts a refusal).

Not kept across a controller restart: registrations (the declarer registers again), and which
hosts hold a prefix (a restarted controller pushes again; an engine that has the prefix
cached answers at once). An engine that restarts is not pushed again until the controller is.

Classes:
    StaticPrefix: a registered prefix (tenant, token ids, cache salt, size).
    StaticPrefixError: a ``POST /v1/static`` body that is not a valid registration (400).
    PrefixRegistry: the registered prefixes (thread-safe, bounded).
    Flight: one order's requests in flight.
    EnginePusher: plans, sends and collects the engine pushes of every switch.

Functions:
    parse_static: a ``POST /v1/static`` body to a prefix, or the error.
    completion_body: the completions request of one engine's part of an order.
    post_completion: sends one completions request (urllib), raising on any failure.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import logging
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from controlplane.configspec import DaemonConfig, HostSpec
from controlplane.metrics import ControllerMetrics
from controlplane.push import PushCandidate, PushHost, PushOrder, PushPlan, PushPlanner
from controlplane.reports import Handler, Response

__all__ = [
    "EnginePusher",
    "Flight",
    "PrefixRegistry",
    "StaticPrefix",
    "StaticPrefixError",
    "completion_body",
    "parse_static",
    "post_completion",
]

_LOG = logging.getLogger("controlplane.pusher")

Sender = Callable[[str, Mapping[str, Any], float], None]
"""Sends one completions request ``(engine_url, body, timeout_s)``; raises on failure."""


class StaticPrefixError(ValueError):
    """A ``POST /v1/static`` body that is not a valid registration."""


@dataclass(frozen=True, slots=True)
class StaticPrefix:
    """A static prefix registered for pushes.

    Attributes:
        id: its id (a digest of tenant, salt and tokens; the planner's key for it).
        tenant: its tenant.
        tokens: its token ids.
        cache_salt: the requests' ``cache_salt`` (vLLM hashes it into the blocks), if any.
        nbytes: its KV bytes (tokens times the model's bytes per token).
    """

    id: int
    tenant: int
    tokens: tuple[int, ...]
    cache_salt: str | None
    nbytes: int


def _prefix_id(tenant: int, tokens: Iterable[int], salt: str | None) -> int:
    text = json.dumps([tenant, salt, list(tokens)], separators=(",", ":"))
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big") >> 1


def parse_static(
    body: bytes, *, bytes_per_token: int, max_tokens: int, max_bytes: int
) -> StaticPrefix:
    """A ``POST /v1/static`` body (``{"tenant", "tokens", "cache_salt"?}``) to a prefix.

    Args:
        body: the request body.
        bytes_per_token: the model's KV bytes per token.
        max_tokens: the longest prefix accepted.
        max_bytes: the per-tick push budget (a larger prefix could never be pushed).

    Raises:
        StaticPrefixError: not JSON, a missing or unknown field, a bad value, too long.
    """
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise StaticPrefixError(f"body is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise StaticPrefixError("body must be a JSON object")
    unknown = sorted(set(doc) - {"tenant", "tokens", "cache_salt"})
    if unknown:
        raise StaticPrefixError(f"unknown field {unknown[0]!r}")
    tenant = doc.get("tenant")
    if isinstance(tenant, bool) or not isinstance(tenant, int) or not 0 <= tenant < 1 << 16:
        raise StaticPrefixError(f"tenant: {tenant!r} is not a 16-bit tenant id")
    tokens = doc.get("tokens")
    if not isinstance(tokens, list) or not tokens:
        raise StaticPrefixError("tokens: expected a non-empty list of token ids")
    if len(tokens) > max_tokens:
        raise StaticPrefixError(f"tokens: {len(tokens)} tokens, at most {max_tokens}")
    for i, t in enumerate(tokens):
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < 1 << 32:
            raise StaticPrefixError(f"tokens[{i}]: {t!r} is not a token id")
    salt = doc.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise StaticPrefixError(f"cache_salt: {salt!r} is not a non-empty string")
    nbytes = len(tokens) * bytes_per_token
    if nbytes > max_bytes:
        raise StaticPrefixError(
            f"tokens: {len(tokens)} tokens are {nbytes} KV bytes, more than the whole "
            f"per-tick push budget ({max_bytes}); such a prefix could never be pushed"
        )
    return StaticPrefix(_prefix_id(tenant, tokens, salt), tenant, tuple(tokens), salt, nbytes)


class PrefixRegistry:
    """The registered static prefixes (thread-safe: HTTP threads register, the tick reads).

    Args:
        max_prefixes: the most prefixes held; a registration beyond it is refused.
    """

    def __init__(self, max_prefixes: int) -> None:
        self._max = max_prefixes
        self._lock = threading.Lock()
        self._prefixes: dict[int, StaticPrefix] = {}

    def register(self, prefix: StaticPrefix) -> bool:
        """Adds a prefix (again: no change).

        Returns:
            Whether it is held now (False: the registry is full).
        """
        with self._lock:
            if prefix.id not in self._prefixes and len(self._prefixes) >= self._max:
                return False
            self._prefixes[prefix.id] = prefix
            return True

    def get(self, prefix_id: int) -> StaticPrefix | None:
        """A prefix by id."""
        with self._lock:
            return self._prefixes.get(prefix_id)

    def prefixes(self) -> list[StaticPrefix]:
        """Every prefix, in registration order."""
        with self._lock:
            return list(self._prefixes.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._prefixes)


def completion_body(
    prefix: StaticPrefix, *, group: int, leader: bool, model: str | None
) -> dict[str, Any]:
    """The completions request that lands ``prefix`` in one engine's prefix cache.

    The prompt is the prefix alone and one token is generated; the connector's options
    (``hostagent.vllm_connector.config.LoadOptions``) load it from the pool without publishing
    anything, in ``group`` (0: alone) as its leader or a follower.
    """
    kvcast: dict[str, Any] = {"save": False, "class": "static"}
    if group:
        kvcast.update(group=group, role="leader" if leader else "follower")
    body: dict[str, Any] = {
        "prompt": list(prefix.tokens),
        "max_tokens": 1,
        "temperature": 0.0,
        "kv_transfer_params": {"kvcast": kvcast},
    }
    if model is not None:
        body["model"] = model
    if prefix.cache_salt is not None:
        body["cache_salt"] = prefix.cache_salt
    return body


def post_completion(engine_url: str, body: Mapping[str, Any], timeout_s: float) -> None:
    """Sends one completions request to ``engine_url`` + ``/v1/completions``.

    Raises:
        OSError: no connection, a timeout, or an answer that is not 2xx JSON (``HTTPError``
            and ``URLError`` are subclasses).
    """
    req = urllib.request.Request(
        f"{engine_url}/v1/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=timeout_s) as reply:
        data = reply.read()
    try:
        json.loads(data)
    except ValueError:
        raise OSError(f"{engine_url}: the answer is not JSON") from None


@dataclass(slots=True)
class Flight:
    """One order's requests, sent, not all collected yet.

    Attributes:
        switch: the switch whose hosts it went to.
        key: the prefix's id.
        nbytes: the prefix's bytes.
        group: its multicast group (0: one host, no group).
        requests: host name -> its request.
    """

    switch: str
    key: int
    nbytes: int
    group: int
    requests: dict[str, concurrent.futures.Future[None]] = field(default_factory=dict)


class EnginePusher:
    """Plans, sends and collects the pushes of registered static prefixes to the engines.

    Args:
        config: the daemon's configuration (its hosts with an ``engine_url``, the ``push``
            section).
        metrics: where the requests are counted.
        send: sends one request (default: :func:`post_completion`); tests may replace it.
    """

    def __init__(
        self,
        config: DaemonConfig,
        metrics: ControllerMetrics,
        send: Sender = post_completion,
    ) -> None:
        self._spec = config.push_engines
        self._budget = config.push_budget_bytes
        self._metrics = metrics
        self._send = send
        self.registry = PrefixRegistry(self._spec.max_prefixes)
        self._hosts: dict[str, HostSpec] = {
            h.name: h for h in config.hosts if h.engine_url is not None
        }
        self._planners = {s.name: PushPlanner(max(1, self._budget)) for s in config.switches}
        self._pool = concurrent.futures.ThreadPoolExecutor(
            self._spec.max_inflight, thread_name_prefix="push"
        )
        self._flights: list[Flight] = []
        self._retry_at: dict[str, float] = {}
        self._seen: set[str] = set()
        self._groups: dict[tuple[str, int], int] = {}  # groups it created -> flights using them
        # The planners are changed by the tick and read by GET /v1/static (an HTTP thread).
        self._held_lock = threading.Lock()

    def close(self) -> None:
        """Stops sending: queued requests are dropped, running ones end on their own."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ registration API
    def routes(self) -> dict[tuple[str, str], Handler]:
        """``POST /v1/static`` registers a prefix; ``GET /v1/static`` lists them."""

        def register(body: bytes) -> Response:
            try:
                prefix = parse_static(
                    body,
                    bytes_per_token=self._spec.bytes_per_token,
                    max_tokens=self._spec.max_tokens,
                    max_bytes=self._budget,
                )
            except StaticPrefixError as exc:
                return self._answer(HTTPStatus.BAD_REQUEST, {"error": str(exc)})
            if not self.registry.register(prefix):
                return self._answer(
                    HTTPStatus.SERVICE_UNAVAILABLE,
                    {"error": f"push.max_prefixes: {self._spec.max_prefixes} held already"},
                )
            self._metrics.static_prefixes.set(len(self.registry))
            return self._answer(
                HTTPStatus.OK,
                {"id": f"{prefix.id:016x}", "tokens": len(prefix.tokens), "nbytes": prefix.nbytes},
            )

        def listing(_body: bytes) -> Response:
            return Response.json(HTTPStatus.OK, {"prefixes": self.describe()})

        return {("POST", "/v1/static"): register, ("GET", "/v1/static"): listing}

    def _answer(self, status: HTTPStatus, doc: Mapping[str, Any]) -> Response:
        self._metrics.static_registrations.labels(str(int(status))).inc()
        return Response.json(status, doc)

    def describe(self) -> list[dict[str, Any]]:
        """The registered prefixes and, per switch, the hosts known to hold each."""
        out = []
        for p in self.registry.prefixes():
            with self._held_lock:
                held = sorted(h for pl in self._planners.values() for h in pl.holders(p.id))
            out.append(
                {
                    "id": f"{p.id:016x}",
                    "tenant": p.tenant,
                    "tokens": len(p.tokens),
                    "nbytes": p.nbytes,
                    "hosts": held,
                }
            )
        return out

    # ------------------------------------------------------------------ the tick's part
    def saw(self, host: str) -> None:
        """A report from ``host``: at its first, a wait for a retry ends (a late joiner)."""
        if host not in self._seen:
            self._seen.add(host)
            self._retry_at.pop(host, None)

    def plan(self, switch: str, pull_bytes: int, now: float) -> PushPlan:
        """This tick's orders for the engines of ``switch`` (remembered as delivered).

        Hosts waiting for a retry are left out; the prefixes they lack wait for them.
        """
        hosts = [
            PushHost(h.name, h.tenants)
            for h in self._hosts.values()
            if h.switch == switch and self._retry_at.get(h.name, 0.0) <= now
        ]
        candidates = [PushCandidate(p.tenant, p.id, p.nbytes) for p in self.registry.prefixes()]
        with self._held_lock:
            return self._planners[switch].plan(candidates, hosts, pull_bytes=pull_bytes)

    def admit(self, switch: str, order: PushOrder) -> tuple[str, ...]:
        """The order's hosts that may receive it: an engine, bound to the prefix's tenant.

        Any other is refused and counted, and never sent the prefix.
        """
        allowed: list[str] = []
        for name in order.hosts:
            host = self._hosts.get(name)
            if host is not None and (host.tenants is None or order.tenant in host.tenants):
                allowed.append(name)
                continue
            self._metrics.push_requests.labels(switch, "refused").inc()
            _LOG.error(
                "push refused: host %s is not bound to tenant %d",
                name,
                order.tenant,
                extra={"event": "push_refused", "switch": switch, "host": name},
            )
        return tuple(allowed)

    def cancel(self, switch: str, order: PushOrder, hosts: Iterable[str]) -> None:
        """An order that could not be sent (no group): its hosts are planned again next tick."""
        with self._held_lock:
            for name in hosts:
                self._planners[switch].forget(order.key, name)

    def send(
        self,
        switch: str,
        order: PushOrder,
        hosts: tuple[str, ...],
        group: int = 0,
        created: bool = False,
    ) -> bool:
        """Sends the order to ``hosts`` (from :meth:`admit`), the first leading ``group``.

        Args:
            switch: the switch whose hosts they are.
            order: the planned order.
            hosts: who gets it.
            group: the multicast group of exactly ``hosts`` (0: one host, none).
            created: the daemon made ``group`` for the pusher (deleted once no flight uses it;
                :meth:`collect` says when).

        Returns:
            Whether it was sent (False: the prefix is no longer registered).
        """
        prefix = self.registry.get(order.key)
        if prefix is None:
            return False
        if group and (created or (switch, group) in self._groups):
            self._groups[(switch, group)] = self._groups.get((switch, group), 0) + 1
        flight = Flight(switch, order.key, order.nbytes, group)
        for i, name in enumerate(hosts):
            body = completion_body(prefix, group=group, leader=i == 0, model=self._spec.model)
            url = self._hosts[name].engine_url
            assert url is not None  # only hosts with an engine are planned
            flight.requests[name] = self._pool.submit(self._send, url, body, self._spec.timeout_s)
        self._flights.append(flight)
        self._metrics.push_requests.labels(switch, "sent").inc(len(hosts))
        self._metrics.push_prefix_bytes.labels(switch).inc(order.nbytes)
        self._metrics.push_inflight.inc(len(hosts))
        _LOG.info(
            "push sent",
            extra={
                "event": "push_send",
                "switch": switch,
                "prefix": f"{order.key:016x}",
                "hosts": list(hosts),
                "group": group,
            },
        )
        return True

    def collect(self, now: float) -> list[tuple[str, int]]:
        """Counts the flights that have finished; failed hosts are tried again later.

        Returns:
            The groups the pusher created that no flight uses any more (to delete).
        """
        done: list[tuple[str, int]] = []
        running: list[Flight] = []
        for flight in self._flights:
            if not all(f.done() for f in flight.requests.values()):
                running.append(flight)
                continue
            for name, fut in flight.requests.items():
                self._metrics.push_inflight.dec()
                exc = None if fut.cancelled() else fut.exception()
                if not fut.cancelled() and exc is None:
                    self._metrics.push_requests.labels(flight.switch, "succeeded").inc()
                    self._retry_at.pop(name, None)
                    continue
                self._metrics.push_requests.labels(flight.switch, "failed").inc()
                with self._held_lock:
                    self._planners[flight.switch].forget(flight.key, name)
                self._retry_at[name] = now + self._spec.retry_s
                _LOG.warning(
                    "push to %s failed: %s",
                    name,
                    exc if exc is not None else "cancelled",
                    extra={"event": "push_failed", "switch": flight.switch, "host": name},
                )
            gkey = (flight.switch, flight.group)
            if gkey in self._groups:
                self._groups[gkey] -= 1
                if self._groups[gkey] == 0:
                    del self._groups[gkey]
                    done.append(gkey)
        self._flights = running
        return done

    def waiting(self) -> dict[str, float]:
        """Hosts whose last push failed, and when each is tried again."""
        return dict(self._retry_at)

    def inflight(self) -> int:
        """Requests sent and not answered yet."""
        return sum(not r.done() for f in self._flights for r in f.requests.values())
