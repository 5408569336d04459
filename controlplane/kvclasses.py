"""Which chunks are static: declared by the application or detected from sustained reuse.

A chunk is **static** while one of these holds, and **transient** otherwise:

* **declared**: an access record said ``"class": "static"`` (the vLLM connector's ``kvcast``
  request options), or ``POST /v1/classes`` declared its key; the declaration lasts
  ``declared_ttl_s`` after the last one. A later ``"transient"`` declaration revokes it (the
  last declaration wins); it never revokes a detection, which is the controller's own measure.
* **detected**: the chunk's last ``min_uses`` reported uses (access records, one per request
  that used it on a host) all fall within ``window_s`` and span at least ``min_span_s``. The
  span is what tells a static prefix (a system prompt every task reuses, minute after minute)
  from one task's shared context (its K branches use it in the same second, then never again):
  a burst of any size does not promote. A detected chunk goes back to transient once it has not
  been used for ``window_s``.

A prefix of a static chunk is static too: a block is served only with its whole prefix, and a
host whose local prefix cache holds the first blocks reports only the later ones. The registry
remembers each reported chunk's parent and promotes the known ancestors with it.

The defaults (``ClassSpec``): 8 uses in 10 minutes spanning at least 1 minute; a declaration
lasts an hour. Sizes: one deque of at most ``min_uses`` floats per tracked chunk, at most
``max_keys`` chunks (least recently used forgotten first).

Classes:
    ClassSpec: the rule's parameters (the ``classes`` section of the configuration).
    StaticEntry: why and since when a chunk is static.
    ClassRegistry: the chunks' classes; observe records, declare, tick to expire and promote.
    ClassDeclaration: a ``POST /v1/classes`` body.
    ClassDeclarationError: a body that is not a valid declaration (answered 400).

Functions:
    parse_declaration: a ``POST /v1/classes`` body to a declaration, or the error.
"""

from __future__ import annotations

import collections
import json
import math
from dataclasses import dataclass

from controlplane.errors import ConfigError
from kvcast.kvclass import KvClass, parse_kv_class
from kvcast.reports import ReportError, parse_key

__all__ = [
    "REASON_DECLARED",
    "REASON_DETECTED",
    "REASON_PREFIX",
    "ClassDeclaration",
    "ClassDeclarationError",
    "ClassRegistry",
    "ClassSpec",
    "StaticEntry",
    "parse_declaration",
]

REASON_DECLARED, REASON_DETECTED, REASON_PREFIX = "declared", "detected", "prefix"


@dataclass(frozen=True)
class ClassSpec:
    """The static-detection rule and the life of a declaration.

    Attributes:
        detect: promote chunks by the reuse rule (False: only declarations make a chunk
            static).
        min_uses: reported uses that promote a chunk (>= 2).
        window_s: those uses must fall within this many seconds; a detected chunk unused this
            long is transient again.
        min_span_s: and spread over at least this many seconds (0: any burst promotes).
        declared_ttl_s: a declaration lasts this long after the last one.
        max_keys: chunks whose use history is kept, and the most chunks static at once (a
            promotion beyond it is refused and counted in ``ClassRegistry.refused``).

    Raises:
        ConfigError: a value out of range (checked in ``__post_init__``).
    """

    detect: bool = True
    min_uses: int = 8
    window_s: float = 600.0
    min_span_s: float = 60.0
    declared_ttl_s: float = 3600.0
    max_keys: int = 1 << 20

    def __post_init__(self) -> None:
        if not 2 <= self.min_uses <= 1 << 16:
            raise ConfigError(f"classes.min_uses: {self.min_uses} is outside 2..65536")
        for name in ("window_s", "declared_ttl_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(f"classes.{name}: expected a positive number, got {value!r}")
        if not (math.isfinite(self.min_span_s) and 0 <= self.min_span_s < self.window_s):
            raise ConfigError(
                f"classes.min_span_s: {self.min_span_s!r} must be >= 0 and below window_s "
                f"({self.window_s})"
            )
        if self.max_keys < 1:
            raise ConfigError(f"classes.max_keys: {self.max_keys} must be positive")


@dataclass
class StaticEntry:
    """A static chunk.

    Attributes:
        tenant: its tenant.
        reason: ``"declared"``, ``"detected"`` or ``"prefix"`` (an ancestor of a static chunk).
        since: when it became static.
        until: when it goes back to transient unless renewed (a declaration's expiry, or the
            last use plus ``window_s``; a ``"prefix"`` entry lasts while a static chunk names
            it as its parent).
        child: for a ``"prefix"`` entry, the static chunk that made it static.
    """

    tenant: int
    reason: str
    since: float
    until: float
    child: int | None = None


@dataclass
class _Uses:
    tenant: int
    times: collections.deque[float]
    parent: int | None = None


class ClassRegistry:
    """The chunks' classes, from declarations and the reuse rule.

    Not thread-safe: the controller calls it from its tick (reports) and from the HTTP threads
    under its own lock (declarations).

    Args:
        spec: the rule's parameters.
    """

    def __init__(self, spec: ClassSpec | None = None) -> None:
        self.spec = spec or ClassSpec()
        self._uses: collections.OrderedDict[int, _Uses] = collections.OrderedDict()
        self._static: dict[int, StaticEntry] = {}
        self._changed: dict[int, KvClass] = {}
        self.promoted: collections.Counter[str] = collections.Counter()
        self.demoted: collections.Counter[str] = collections.Counter()
        self.refused = 0

    # ------------------------------------------------------------------ queries
    def kv_class(self, key: int) -> KvClass:
        """A chunk's class now."""
        return KvClass.STATIC if key in self._static else KvClass.TRANSIENT

    def static(self) -> dict[int, StaticEntry]:
        """The static chunks (a copy): key -> why and until when."""
        return dict(self._static)

    def parent(self, key: int) -> int | None:
        """The parent a record named for ``key``, if one did and it is still tracked."""
        uses = self._uses.get(key)
        return None if uses is None else uses.parent

    # ------------------------------------------------------------------ inputs
    def observe(
        self,
        tenant: int,
        key: int,
        when: float,
        *,
        parent: int | None = None,
        declared: KvClass | None = None,
        use: bool = True,
    ) -> None:
        """Takes one record: a use (an access) or not (a put), and any declared class.

        Args:
            tenant: the chunk's tenant.
            key: chunk key.
            when: the record's time (Unix seconds, clamped by the caller).
            parent: its parent key, if the record named one.
            declared: the class the record declared, if any.
            use: whether the record is a use (access) rather than a put (stored).
        """
        uses = self._uses.get(key)
        if uses is None:
            uses = _Uses(tenant, collections.deque(maxlen=self.spec.min_uses))
            self._uses[key] = uses
            if len(self._uses) > self.spec.max_keys:
                self._uses.popitem(last=False)
        else:
            self._uses.move_to_end(key)
        if parent is not None and uses.parent != parent:
            uses.parent = parent
            if key in self._static:
                self._promote_ancestors(key, tenant, when, self._static[key].until)
        if declared is not None:
            self.declare(tenant, key, declared, when)
        if not use:
            return
        uses.times.append(when)
        entry = self._static.get(key)
        until = when + self.spec.window_s
        if entry is not None and entry.reason == REASON_DETECTED:
            entry.until = max(entry.until, until)
        elif (entry is None or entry.reason == REASON_PREFIX) and self._detected(uses):
            if entry is None:
                self._promote(key, tenant, REASON_DETECTED, when, until)
            else:
                self.promoted[REASON_DETECTED] += 1
                entry.reason, entry.until, entry.child = REASON_DETECTED, until, None

    def declare(
        self, tenant: int, key: int, kv_class: KvClass, when: float, ttl_s: float | None = None
    ) -> None:
        """Declares a chunk's class (a record's ``class``, or ``POST /v1/classes``).

        Args:
            tenant: the chunk's tenant.
            key: chunk key.
            kv_class: STATIC (for ``ttl_s``, default ``declared_ttl_s``) or TRANSIENT (revokes
                an earlier declaration; a detection stands).
            when: now.
            ttl_s: how long a static declaration lasts.
        """
        entry = self._static.get(key)
        if kv_class is KvClass.TRANSIENT:
            if entry is not None and entry.reason == REASON_DECLARED:
                self._demote(key, REASON_DECLARED)
            return
        until = when + (self.spec.declared_ttl_s if ttl_s is None else ttl_s)
        if entry is not None and entry.reason == REASON_DECLARED:
            entry.until = max(entry.until, until)
            return
        if entry is not None:
            self.promoted[REASON_DECLARED] += 1
            entry.reason, entry.until, entry.child = REASON_DECLARED, until, None
            return
        self._promote(key, tenant, REASON_DECLARED, when, until)

    def tick(self, now: float) -> dict[int, KvClass]:
        """Expires what is due and returns every class change since the last tick.

        Args:
            now: current time.

        Returns:
            key -> its new class, for each chunk whose class changed (a chunk that changed and
            changed back is not listed).
        """
        for key, entry in list(self._static.items()):
            if entry.reason != REASON_PREFIX and entry.until <= now:
                self._demote(key, entry.reason)
        # A prefix entry lives as long as some static chunk names it as its parent.
        while True:
            needed = {self.parent(k) for k in self._static}
            orphans = [
                k for k, e in self._static.items() if e.reason == REASON_PREFIX and k not in needed
            ]
            if not orphans:
                break
            for key in orphans:
                self._demote(key, REASON_PREFIX)
        changed, self._changed = self._changed, {}
        return changed

    # ------------------------------------------------------------------ internals
    def _detected(self, uses: _Uses) -> bool:
        spec = self.spec
        if not spec.detect or len(uses.times) < spec.min_uses:
            return False
        span = max(uses.times) - min(uses.times)  # records may arrive out of time order
        return spec.min_span_s <= span <= spec.window_s

    def _promote(self, key: int, tenant: int, reason: str, when: float, until: float) -> None:
        if len(self._static) >= self.spec.max_keys:
            self.refused += 1
            return
        self._static[key] = StaticEntry(tenant, reason, when, until)
        self.promoted[reason] += 1
        self._note(key, KvClass.STATIC)
        self._promote_ancestors(key, tenant, when, until)

    def _promote_ancestors(self, key: int, tenant: int, when: float, until: float) -> None:
        """Makes the known ancestors of a static chunk static (a prefix of a static prefix)."""
        child, seen = key, {key}
        parent = self.parent(key)
        while parent is not None and parent not in seen:
            seen.add(parent)
            entry = self._static.get(parent)
            if entry is None:
                if len(self._static) >= self.spec.max_keys:
                    self.refused += 1
                    return
                uses = self._uses.get(parent)
                self._static[parent] = StaticEntry(
                    uses.tenant if uses else tenant, REASON_PREFIX, when, until, child
                )
                self.promoted[REASON_PREFIX] += 1
                self._note(parent, KvClass.STATIC)
            elif entry.reason != REASON_PREFIX:
                break  # static in its own right: its ancestors already are
            child, parent = parent, self.parent(parent)

    def _demote(self, key: int, reason: str) -> None:
        del self._static[key]
        self.demoted[reason] += 1
        self._note(key, KvClass.TRANSIENT)

    def _note(self, key: int, kv_class: KvClass) -> None:
        if self._changed.get(key) is not None and self._changed[key] is not kv_class:
            del self._changed[key]  # changed and changed back since the last tick
        else:
            self._changed[key] = kv_class


# ------------------------------------------------------------------------------ the API body
@dataclass(frozen=True)
class ClassDeclaration:
    """One ``POST /v1/classes`` body: the class of some chunks of one tenant.

    Attributes:
        tenant: their tenant.
        keys: chunk keys (every block of the prefix; the ancestors a record named are promoted
            with them anyway).
        kv_class: the class declared.
        ttl_s: how long a static declaration lasts (None: ``declared_ttl_s``).
    """

    tenant: int
    keys: tuple[int, ...]
    kv_class: KvClass
    ttl_s: float | None = None


class ClassDeclarationError(ConfigError):
    """A ``POST /v1/classes`` body that is not a valid declaration (answered 400)."""


MAX_DECLARED_KEYS = 65536
"""The most keys one declaration may name."""


def parse_declaration(body: bytes) -> ClassDeclaration:
    """Parses ``{"tenant": 7, "keys": ["0x1a2b", ...], "class": "static", "ttl_s": 600}``.

    Keys are integers or strings (``0x`` hex or decimal), as in access records.

    Raises:
        ClassDeclarationError: not JSON, a missing or unknown field, a bad value; the message
            names the field.
    """
    try:
        doc = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ClassDeclarationError(f"body is not UTF-8 JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ClassDeclarationError("body must be a JSON object {tenant, keys, class, ttl_s?}")
    fields = ("tenant", "keys", "class", "ttl_s")
    unknown = sorted(set(doc) - set(fields))
    if unknown:
        raise ClassDeclarationError(f"unknown field {unknown[0]!r} (fields: {', '.join(fields)})")
    for name in ("tenant", "keys", "class"):
        if name not in doc:
            raise ClassDeclarationError(f"missing field {name!r}")
    tenant = doc["tenant"]
    if isinstance(tenant, bool) or not isinstance(tenant, int) or not 0 <= tenant <= 0xFFFF:
        raise ClassDeclarationError(f"tenant: expected an integer 0..65535, got {tenant!r}")
    raw_keys = doc["keys"]
    if not isinstance(raw_keys, list) or not 0 < len(raw_keys) <= MAX_DECLARED_KEYS:
        raise ClassDeclarationError(f"keys: expected a list of 1..{MAX_DECLARED_KEYS} keys")
    keys = tuple(_key(k, f"keys[{i}]") for i, k in enumerate(raw_keys))
    try:
        kv_class = parse_kv_class(doc["class"])
    except ValueError as exc:
        raise ClassDeclarationError(f"class: {exc}") from None
    ttl = doc.get("ttl_s")
    if ttl is not None and (
        isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl < math.inf
    ):
        raise ClassDeclarationError(f"ttl_s: expected a positive number of seconds, got {ttl!r}")
    return ClassDeclaration(tenant, keys, kv_class, None if ttl is None else float(ttl))


def _key(value: object, path: str) -> int:
    try:
        return parse_key(value, path)
    except ReportError as exc:
        raise ClassDeclarationError(str(exc)) from None
