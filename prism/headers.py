"""Header names of the gateway's contract, and the Server-Timing format."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = [
    "CACHE_KEY",
    "CACHE_KEY_PREFIX_LEN",
    "CACHE_LAYER",
    "ENTRY_EXPIRES",
    "FORWARD",
    "FORWARD_REJECTED",
    "ORIGIN_BUSY",
    "ORIGIN_REGION",
    "PROVIDER",
    "REQUEST_ID",
    "SEMANTIC_SCORE",
    "SERVER_TIMING",
    "server_timing",
]

CACHE_LAYER = "x-prism-edge-cache-layer"  # kv | redis | semantic | miss | bypass
CACHE_KEY = "x-prism-cache-key"  # a short prefix of the fingerprint
REQUEST_ID = "x-request-id"
SERVER_TIMING = "server-timing"
PROVIDER = "x-prism-provider"  # which provider answered a miss
FORWARD = "x-prism-forward"  # the edge's signed identity + fingerprint
ENTRY_EXPIRES = "x-prism-entry-expires"  # on a Redis hit: when the entry expires (unix s)
SEMANTIC_SCORE = "x-prism-semantic-score"  # on a semantic hit: the cosine similarity
ORIGIN_REGION = "x-prism-origin-region"  # from the edge: which origin answered
# On the origin's 401 for a forward it refuses: why (``expired``, ``signature``, ...), so
# the edge tells a refusal of its own signing (re-signed and retried) from the client's.
FORWARD_REJECTED = "x-prism-forward-rejected"
# On the origin's 503 while its event loop lags: the edge asks another origin, as it does
# on a 503 from a proxy in front of one.
ORIGIN_BUSY = "x-prism-origin-busy"

CACHE_KEY_PREFIX_LEN = 16


# "00" to "99": a duration's hundredths without formatting a float, which costs more than
# the rest of the header where this module is compiled (the origin renders it on every answer).
# A stage's ";dur=..." by its time in hundredths of a millisecond, made once: a hit's few
# stages take the same handful of values again and again, and formatting one cost more than
# the rest of the header. Bounded: past the bound, a duration is formatted each time.
_DURATIONS: dict[int, str] = {}
_DURATIONS_BOUND = 20_000


def _duration(hundredths: int) -> str:
    text = _DURATIONS.get(hundredths)
    if text is None:
        text = f";dur={hundredths // 100}.{hundredths % 100:02d}"
        if len(_DURATIONS) < _DURATIONS_BOUND:
            _DURATIONS[hundredths] = text
    return text


def server_timing(stages: Iterable[tuple[str, float]]) -> str:
    """Render ``(name, milliseconds)`` pairs as a Server-Timing header value (``dur`` to
    two decimals)."""
    return ", ".join([name + _duration(round(ms * 100) if ms > 0 else 0) for name, ms in stages])
