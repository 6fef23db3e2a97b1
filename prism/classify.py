"""Is a request cacheable, and for how long.

Decisions, documented in docs/caching.md:
- ``stream`` never prevents caching: streamed and plain requests share an entry.
- ``n > 1`` is cached: the entry holds all ``n`` choices and a hit replays them all.
- Non-zero ``temperature`` is cached by default (the client gets the stored sample,
  as with any response cache); a project turns that off with ``cache_sampled=False``,
  and then only ``temperature == 0`` or a ``seed`` make a request cacheable.
- ``Cache-Control: no-cache`` skips the read, ``no-store`` the write (both: bypass),
  ``max-age=N`` sets the TTL, clamped to [``MIN_TTL``, ``max_ttl``] (KV's floor is 60 s).
"""

from __future__ import annotations

from dataclasses import dataclass

from .fingerprint import ParsedBody

__all__ = ["MIN_TTL", "CacheDecision", "CachePolicy", "classify"]

MIN_TTL = 60
_MAX_AGE_DIGITS = 12


@dataclass(frozen=True, slots=True)
class CachePolicy:
    default_ttl: int = 86_400
    max_ttl: int = 30 * 86_400
    cache_sampled: bool = True
    enabled: bool = True


class CacheDecision:
    """Whether a request reads and writes the cache, for how long, and why. A plain class:
    made on every request, and compiled its ``__init__`` is native code (a NamedTuple's
    ``__new__`` is generated Python)."""

    __slots__ = ("read", "reason", "ttl", "write")

    def __init__(self, read: bool, write: bool, ttl: int, reason: str) -> None:
        self.read = read
        self.write = write
        self.ttl = ttl
        self.reason = reason

    @property
    def bypass(self) -> bool:
        return not (self.read or self.write)


DEFAULT_POLICY = CachePolicy()


def _directives(cache_control: str) -> dict[str, str]:
    found: dict[str, str] = {}
    if not cache_control.isascii():
        # Header bytes outside ASCII decode differently at the edge and the origin, and
        # str.lower()/isdigit() accept look-alikes: such a header carries no directives.
        return found
    for part in cache_control.lower().split(","):
        name, _, value = part.strip().partition("=")
        if name:
            found[name] = value.strip().strip('"')
    return found


def classify(
    request: ParsedBody, cache_control: str | None = None, policy: CachePolicy = DEFAULT_POLICY
) -> CacheDecision:
    ttl = max(MIN_TTL, min(policy.default_ttl, policy.max_ttl))
    if not policy.enabled:
        return CacheDecision(False, False, ttl, "cache disabled for project")
    temperature = request.body.get("temperature")
    if not policy.cache_sampled and temperature != 0 and request.body.get("seed") is None:
        return CacheDecision(False, False, ttl, "sampled request (temperature != 0, no seed)")
    read = write = True
    reasons = []
    if cache_control:
        directives = _directives(cache_control)
        if "no-cache" in directives:
            read = False
            reasons.append("no-cache")
        if "no-store" in directives:
            write = False
            reasons.append("no-store")
        max_age = directives.get("max-age")
        if max_age is not None and max_age.isdigit():
            # More digits than any TTL needs is the longest TTL (and int() refuses
            # strings of thousands of digits).
            seconds = int(max_age) if len(max_age) <= _MAX_AGE_DIGITS else policy.max_ttl
            ttl = max(MIN_TTL, min(seconds, policy.max_ttl))
            reasons.append(f"max-age={ttl}")
    return CacheDecision(read, write, ttl, ", ".join(reasons) or "cacheable")
