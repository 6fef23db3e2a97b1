"""A project's policy: which models its keys may use, how much it may spend, how fast.

One record per project, canonical JSON, stored in Redis at ``prism:policy:{project}``
(the origin reads it in the same round trip as the entry) and published under the same
key to Workers KV (each edge isolate reads it at most once a minute). ::

    {"allow": ["gpt-4o*"], "budget": {"period": "day", "usd": 25.0}, "deny": ["o1*"],
     "revision": 3, "updated_at": "2026-11-30T22:50:00.000Z", "updated_by": "ops", "v": 1}

Model patterns are globs (``fnmatch``): ``*``, ``?`` and ``[...]``, matched without regard
to case, so ``deny: ["gpt-4o"]`` also refuses ``GPT-4O``: a provider that folds case (an
Azure deployment name, many OpenAI-compatible servers) must not be a way past a deny.
Names reach the provider exactly as sent; ``prism.request.model_name`` refuses the ones
with spaces at the ends or invisible characters before any policy is read.
A model is allowed when no ``deny`` pattern matches it and either ``allow`` is empty
or an ``allow`` pattern matches it: deny wins. No record at all allows every model.

``budget`` (optional): at most ``usd`` US dollars of provider cost per UTC ``day`` or
``month`` for the whole project; the origin enforces it (``origin/governance/budgets.py``), the edge
ignores it (it only serves hits, which cost nothing).

``cache`` (optional) opts the project into the origin's semantic cache (off when absent)::

    "cache": {"semantic": true, "threshold": 0.92}

``threshold`` is the least cosine similarity a paraphrase needs, from
``MIN_SEMANTIC_THRESHOLD`` to ``MAX_SEMANTIC_THRESHOLD``; when left out, the measured
default (``DEFAULT_SEMANTIC_THRESHOLD``) is written into the record.

``rate_limits`` (optional; ``prism.rate_limits``): requests and tokens per minute for the
project and for each of its keys; the origin enforces them (``origin/governance/rate_limiter.py``).

Optional parts appear in the record only when set, so a policy without them keeps its
bytes. Per-key policies are not supported.
"""

from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import dataclass, field
from typing import Any

from .errors import PermissionDeniedError
from .rate_limits import RateLimits

__all__ = [
    "BUDGET_PERIODS",
    "DEFAULT_SEMANTIC_THRESHOLD",
    "MAX_SEMANTIC_THRESHOLD",
    "MIN_SEMANTIC_THRESHOLD",
    "POLICY_KEY_PREFIX",
    "Budget",
    "CacheRules",
    "LogRules",
    "Policy",
    "PolicyMemo",
    "policy_key",
]

POLICY_KEY_PREFIX = "prism:policy:"
FORMAT_VERSION = 1
MAX_PATTERNS = 64
MAX_PATTERN_LEN = 200
_MAX_TEXT = 100
_MAX_DECIDED = 1024  # models remembered per policy: a client cycling names cannot grow it
_RESERVED: tuple[str, ...] = ()
_FIELDS = (
    "allow", "budget", "cache", "deny", "log", "rate_limits", "revision", "updated_at",
    "updated_by", "v",
)  # fmt: skip
BUDGET_PERIODS = ("day", "month")
MAX_BUDGET_USD = 1_000_000_000  # a typo's guard: more than anyone means
_MICROS = 1_000_000
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def policy_key(project: str) -> str:
    """Where ``project``'s policy lives, in Redis and in Workers KV alike."""
    return POLICY_KEY_PREFIX + project


def _patterns(name: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{name}: must be a list of model patterns")
    if len(value) > MAX_PATTERNS:
        raise ValueError(f"{name}: at most {MAX_PATTERNS} patterns (got {len(value)})")
    seen: list[str] = []
    for index, pattern in enumerate(value):
        where = f"{name}[{index}]"
        if not isinstance(pattern, str) or not pattern:
            raise ValueError(f"{where}: must be a non-empty string")
        if len(pattern) > MAX_PATTERN_LEN:
            raise ValueError(f"{where}: at most {MAX_PATTERN_LEN} characters")
        if not pattern.isprintable() or any(c.isspace() for c in pattern):
            raise ValueError(f"{where}: {pattern[:40]!r} has whitespace or control characters")
        if pattern not in seen:
            seen.append(pattern)
    return tuple(seen)


def _text(name: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > _MAX_TEXT or not value.isprintable():
        raise ValueError(f"{name}: must be at most {_MAX_TEXT} printable characters, or null")
    return value


def _matcher(patterns: tuple[str, ...]) -> re.Pattern[str] | None:
    # One regex per list, built once per policy: a check is one match per list.
    if not patterns:
        return None
    return re.compile("|".join(fnmatch.translate(p) for p in patterns), re.IGNORECASE)


# The semantic cache's threshold, compared with a candidate's judged score: its cosine
# similarity (all-MiniLM-L6-v2 on onnxruntime int8) weighed by the content words the two
# questions share, +-0.03 at most (origin.store.semantic.guard.judged). The default is the
# lowest with at most 1 % wrong hits on labelled question pairs and none on the repository's
# near misses (docs/architecture.md, "The semantic cache"; the float32 numpy engine's scores
# run about 0.005 higher). Any value from 0 to 1 is accepted: a lower one only trades
# precision for hits within the project's own partitions, never across them.
DEFAULT_SEMANTIC_THRESHOLD = 0.93
MIN_SEMANTIC_THRESHOLD = 0.0
MAX_SEMANTIC_THRESHOLD = 1.0
_CACHE_FIELDS = ("semantic", "threshold")


@dataclass(frozen=True, slots=True)
class CacheRules:
    """A project's cache options: whether its misses may be answered semantically."""

    semantic: bool = False
    threshold: float = DEFAULT_SEMANTIC_THRESHOLD

    def __post_init__(self) -> None:
        if not isinstance(self.semantic, bool):
            raise ValueError("cache.semantic: must be true or false")
        low, high = MIN_SEMANTIC_THRESHOLD, MAX_SEMANTIC_THRESHOLD
        value = self.threshold
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not low <= value <= high
        ):
            raise ValueError(f"cache.threshold: must be a number from {low} to {high}")
        object.__setattr__(self, "threshold", float(value))

    @classmethod
    def from_dict(cls, data: Any) -> CacheRules:
        if not isinstance(data, dict):
            raise ValueError('cache: must be an object, e.g. {"semantic": true}')
        for name in data:
            if name not in _CACHE_FIELDS:
                raise ValueError(
                    f"cache.{str(name)[:40]}: unknown field (known: {', '.join(_CACHE_FIELDS)})"
                )
        return cls(
            semantic=data.get("semantic", False),
            threshold=data.get("threshold", DEFAULT_SEMANTIC_THRESHOLD),
        )

    def to_dict(self) -> dict[str, Any]:
        return {"semantic": self.semantic, "threshold": self.threshold}


_LOG_FIELDS = ("bodies", "redact_emails")


@dataclass(frozen=True, slots=True)
class LogRules:
    """What a project's request-log records may hold beyond the request's facts: its
    prompt and answer (``bodies``, redacted of common secrets), with email addresses
    redacted too (``redact_emails``)."""

    bodies: bool = False
    redact_emails: bool = False

    def __post_init__(self) -> None:
        for name in _LOG_FIELDS:
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"log.{name}: must be true or false")

    @classmethod
    def from_dict(cls, data: Any) -> LogRules:
        if not isinstance(data, dict):
            raise ValueError('log: must be an object, e.g. {"bodies": true}')
        for name in data:
            if name not in _LOG_FIELDS:
                raise ValueError(
                    f"log.{str(name)[:40]}: unknown field (known: {', '.join(_LOG_FIELDS)})"
                )
        return cls(bodies=data.get("bodies", False), redact_emails=data.get("redact_emails", False))

    def to_dict(self) -> dict[str, Any]:
        return {"bodies": self.bodies, "redact_emails": self.redact_emails}


@dataclass(frozen=True, slots=True)
class Budget:
    """At most ``usd`` dollars of provider cost per UTC ``period`` (``day`` or ``month``).
    Kept exact to the micro-dollar: the origin counts in integer micro-USD."""

    usd: float
    period: str = "month"

    def __post_init__(self) -> None:
        usd = self.usd
        if isinstance(usd, bool) or not isinstance(usd, (int, float)) or usd != usd:
            raise ValueError("budget.usd: must be a number of US dollars")
        if not 0 < usd <= MAX_BUDGET_USD:
            raise ValueError(f"budget.usd: must be above 0 and at most {MAX_BUDGET_USD:,}")
        if round(usd * _MICROS) < 1:
            raise ValueError("budget.usd: must be at least 0.000001 (one micro-dollar)")
        if self.period not in BUDGET_PERIODS:
            periods = " or ".join(BUDGET_PERIODS)
            raise ValueError(f"budget.period: must be {periods}, got {str(self.period)[:20]!r}")
        object.__setattr__(self, "usd", round(usd * _MICROS) / _MICROS)

    @property
    def micro_usd(self) -> int:
        return round(self.usd * _MICROS)

    @classmethod
    def from_value(cls, value: Any) -> Budget:
        if not isinstance(value, dict):
            raise ValueError('budget: must be an object like {"usd": 25, "period": "day"}')
        unknown = set(value) - {"usd", "period"}
        if unknown:
            raise ValueError(f"budget.{sorted(map(str, unknown))[0][:40]}: unknown field")
        if "usd" not in value:
            raise ValueError("budget.usd: required")
        return cls(usd=value["usd"], period=value.get("period", "month"))

    def to_dict(self) -> dict[str, Any]:
        return {"period": self.period, "usd": self.usd}


@dataclass(frozen=True, slots=True)
class Policy:
    """A project's model policy; immutable, and checked without I/O."""

    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    revision: int = 0  # +1 on every change (the store sets it)
    updated_at: str | None = None  # ISO 8601 UTC
    updated_by: str | None = None
    budget: Budget | None = None
    cache: CacheRules | None = None  # None: no cache options (no semantic cache)
    rate_limits: RateLimits | None = None  # None: no rate limit
    log: LogRules | None = None  # None: request-log records hold no bodies
    _allow: re.Pattern[str] | None = field(default=None, init=False, repr=False, compare=False)
    _deny: re.Pattern[str] | None = field(default=None, init=False, repr=False, compare=False)
    # model -> allowed, for the models this policy has been asked about (bounded)
    _decided: dict[str, bool] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        allow = _patterns("allow", self.allow)
        deny = _patterns("deny", self.deny)
        if isinstance(self.revision, bool) or not isinstance(self.revision, int):
            raise ValueError("revision: must be a whole number")
        if self.revision < 0:
            raise ValueError("revision: must not be negative")
        _text("updated_at", self.updated_at)
        _text("updated_by", self.updated_by)
        if self.budget is not None and not isinstance(self.budget, Budget):
            raise ValueError("budget: must be a Budget")
        if self.cache is not None and not isinstance(self.cache, CacheRules):
            raise ValueError("cache: must be cache options")
        if self.rate_limits is not None and not isinstance(self.rate_limits, RateLimits):
            raise ValueError("rate_limits: must be a RateLimits")
        if self.log is not None and not isinstance(self.log, LogRules):
            raise ValueError("log: must be log options")
        object.__setattr__(self, "allow", allow)
        object.__setattr__(self, "deny", deny)
        object.__setattr__(self, "_allow", _matcher(allow))
        object.__setattr__(self, "_deny", _matcher(deny))

    @classmethod
    def parse(cls, raw: str | bytes) -> Policy:
        """A policy from its JSON; ``ValueError`` naming the field for anything invalid."""
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as error:
            raise ValueError(f"policy: not valid JSON ({error})") from None
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: Any) -> Policy:
        if not isinstance(data, dict):
            raise ValueError("policy: must be a JSON object")
        for name in data:
            if name in _RESERVED:
                raise ValueError(f"{name}: reserved for a later version; not supported yet")
            if name not in _FIELDS:
                known = ", ".join(f for f in _FIELDS if f != "v")
                raise ValueError(f"{str(name)[:40]}: unknown field (known: {known})")
        version = data.get("v", FORMAT_VERSION)
        if version != FORMAT_VERSION or isinstance(version, bool):
            raise ValueError(f"v: unsupported policy format {version!r} (this Prism reads 1)")
        return cls(
            allow=data.get("allow", ()),
            deny=data.get("deny", ()),
            revision=data.get("revision", 0),
            updated_at=data.get("updated_at"),
            updated_by=data.get("updated_by"),
            budget=None if data.get("budget") is None else Budget.from_value(data["budget"]),
            cache=None if data.get("cache") is None else CacheRules.from_dict(data["cache"]),
            rate_limits=(
                None
                if data.get("rate_limits") is None
                else RateLimits.from_dict(data["rate_limits"])
            ),
            log=None if data.get("log") is None else LogRules.from_dict(data["log"]),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "allow": list(self.allow),
            "deny": list(self.deny),
            "revision": self.revision,
            "updated_at": self.updated_at,
            "updated_by": self.updated_by,
            "v": FORMAT_VERSION,
        }
        if self.budget is not None:  # absent when unset: older records keep their bytes
            out["budget"] = self.budget.to_dict()
        if self.cache is not None:  # absent rather than null: older readers know no "cache"
            out["cache"] = self.cache.to_dict()
        if self.rate_limits is not None:
            out["rate_limits"] = self.rate_limits.to_dict()
        if self.log is not None:
            out["log"] = self.log.to_dict()
        return out

    def encode(self) -> bytes:
        """Canonical JSON: equal policies, equal bytes."""
        return _ENCODER.encode(self.to_dict()).encode()

    def allows(self, model: str) -> bool:
        decided = self._decided.get(model)
        if decided is None:
            decided = (self._deny is None or self._deny.match(model) is None) and (
                self._allow is None or self._allow.match(model) is not None
            )
            if len(self._decided) >= _MAX_DECIDED:
                self._decided.clear()
            self._decided[model] = decided
        return decided

    def check_model(self, model: str) -> None:
        """Raise ``PermissionDeniedError`` (403 ``model_not_allowed``) for a refused model."""
        if not self.allows(model):
            raise PermissionDeniedError(
                f"Model '{model[:200]}' is not allowed for this project.",
                param="model",
                code="model_not_allowed",
            )


class PolicyMemo:
    """Parsed policies by their exact bytes: a record is parsed once, however often it is
    read (the origin reads it on every request). Bounded: cleared when full. A record that
    does not parse raises its ``ValueError`` every time, parsed once too."""

    __slots__ = ("_items", "_size")

    def __init__(self, size: int = 256) -> None:
        self._items: dict[bytes | str, Policy | ValueError] = {}
        self._size = size

    def get(self, raw: bytes | str) -> Policy:
        found = self._items.get(raw)
        if found is None:
            try:
                found = Policy.parse(raw)
            except ValueError as error:
                found = error
            if len(self._items) >= self._size:
                self._items.clear()
            self._items[raw] = found
        if isinstance(found, ValueError):
            raise found
        return found
