"""The origins marked down at this PoP, shared by its isolates through the Cache API.

An isolate that finds an origin down tells the others: the marks (``{region: down
until}``, unix seconds) are one entry of the PoP's cache (Workers' ``caches.default``,
kept per data centre and never replicated), so an outage costs a PoP one detection, not
one per isolate. Read on the forward path only when there are several origins, and then
at most once a second per isolate; written in the background when this isolate's marks
change. A cache that fails or is absent (the Cache API does nothing on ``*.workers.dev``)
leaves each isolate with what it learned itself.
"""

from __future__ import annotations

import hashlib
import json
import math

from .origins import Origins
from .platform import Platform

__all__ = ["PopMarks", "marks_key"]

# A cache key is a URL; this host is no real one, nothing is ever fetched from it.
_MARKS_URL = "https://prism-edge.invalid/origin-marks/"
_FRESH = 1.0  # seconds a read serves this isolate before the next one


class PopMarks:
    """One per isolate, over its ``Origins``: the PoP's marks merged in, its own shared."""

    __slots__ = ("_key", "_origins", "_read_at")

    def __init__(self, origins: Origins) -> None:
        self._origins = origins
        self._key = marks_key(origins)
        self._read_at = -math.inf

    def stale(self, now: float) -> bool:
        return now - self._read_at >= _FRESH

    async def read(self, platform: Platform, now: float) -> None:
        """Merge the PoP's marks into this isolate's (a failed read changes nothing)."""
        self._read_at = now
        text = await platform.pop_cache_get(self._key)
        if not text:
            return
        try:
            found = json.loads(text)
        except ValueError:
            return
        if isinstance(found, dict):
            self._origins.merge(
                {
                    str(region): float(until)
                    for region, until in found.items()
                    if isinstance(until, int | float)
                }
            )

    def share(self, platform: Platform, now: float) -> None:
        """This isolate's marks to the PoP, in the background, if they changed."""
        if self._origins.dirty:
            platform.wait_until(self.publish(platform, now))

    async def publish(self, platform: Platform, now: float) -> None:
        """This isolate's marks to the PoP now, if they changed. Kept a while past the
        last one (``avoid_seconds``) so that a passed mark still makes the next request a
        trial in every isolate."""
        origins = self._origins
        if not origins.dirty:
            return
        marks = origins.marks()
        last = max(marks.values(), default=now)
        ttl = max(1, math.ceil(last - now + origins.avoid_seconds))
        await platform.pop_cache_put(self._key, json.dumps(marks), ttl)


def marks_key(origins: Origins) -> str:
    """The cache key of these origins' marks. The cache is the zone's, shared by every
    Worker on it: edges of other origins (a staging deploy) keep marks of their own."""
    listed = ",".join(f"{origin.region}={origin.url}" for origin in origins.origins)
    return _MARKS_URL + hashlib.sha256(listed.encode()).hexdigest()[:32]
