"""The one pipeline every cached API goes through at the edge (chat completions,
embeddings, Anthropic messages, OpenAI responses), over its ``EdgeApi`` (``edge.apis``).

body (bytes, bounded in size and time) → parse (memoized per body) → the project's
model policy (memoized; a denied model is a 403 here, before any entry is read) →
fingerprint → KV read (bounded) → hit: answer at the PoP, as stored JSON or replayed as
the API's stream; miss: forward to the origin (``edge.forward``). When the origin
answered from Redis, the entry is written to KV in the background so the next request
stays at the PoP.

Everything per API is read from instance attributes set once per isolate: a request
costs the same attribute reads whichever API it calls.
"""

from __future__ import annotations

import json
from typing import Any, Generic, TypeVar

from prism import (
    InvalidRequestError,
    KeyIdentity,
    Policy,
    RecentBodies,
    RecentEntries,
    RequestTimeoutError,
    RequestTooLargeError,
    encode_envelope,
    entry_key,
    fingerprint,
)
from prism import headers as h
from prism.parsers import ParsedRequest

from .apis import EdgeApi
from .deadlines import DeadlineTimer
from .forward import OriginForwarder
from .platform import EdgeRequest, EdgeResponse, Platform
from .policy_cache import PolicyCache
from .request_log import RequestNote
from .routes import ROUTES
from .settings import EdgeSettings
from .timings import Timings, elapsed_ms, survived

__all__ = ["CachedApiRoute"]

R = TypeVar("R", bound=ParsedRequest)

JSON = "application/json"
SSE = "text/event-stream"
_MIN_KV_TTL = 60  # Workers KV's shortest expiry


class CachedApiRoute(Generic[R]):
    """One per API and isolate: the API's description, what the isolate has recently
    parsed and decoded for it, and the parts every API shares (the policy cache, the
    forwarder, the stage timer)."""

    __slots__ = (
        "_bodies",
        "_body_timeout",
        "_classify",
        "_entries",
        "_forwarder",
        "_kv_timeout",
        "_limits",
        "_parse",
        "_path",
        "_policies",
        "_stages",
        "_stream_hit",
        "error_body",
        "key_header",
        "methods",
    )

    def __init__(
        self,
        api: EdgeApi[R],
        settings: EdgeSettings,
        policies: PolicyCache,
        forwarder: OriginForwarder,
        stages: DeadlineTimer,
    ) -> None:
        self.methods = ROUTES[api.path]
        self.key_header = api.key_header
        self.error_body = api.error_body
        self._path = api.path
        self._parse = api.parse
        self._stream_hit = api.stream_hit
        self._classify = api.cache_decision
        self._limits = settings.limits
        self._kv_timeout = settings.kv_timeout
        self._body_timeout = settings.body_timeout
        self._policies = policies
        self._forwarder = forwarder
        self._stages = stages
        self._bodies: RecentBodies[R] = RecentBodies(size=api.recent_bodies)
        self._entries = RecentEntries(size=api.recent_entries)

    async def serve(
        self,
        request: EdgeRequest,
        platform: Platform,
        identity: KeyIdentity,
        note: RequestNote,
    ) -> EdgeResponse:
        project = identity.project
        timings, request_id = note.timings, note.id
        started = platform.now()
        body = await self._read_body(request, platform)
        known = self._bodies.get(project, body)
        if known is None:
            parsed = self._parse(body, self._limits)
            fp = fingerprint(project, self._path, parsed)
            self._bodies.put(project, body, parsed, fp)
        else:
            parsed, fp = known
        note.model, note.stream, note.fingerprint = parsed.model, parsed.stream, fp
        decision = self._classify(parsed, request.headers.get("cache-control"))
        # CPU only, and the Workers clock stands still while code runs: I/O stages only.
        timings.append(("parse", elapsed_ms(started, platform.now())))
        policy = await self._policy(project, platform, timings, request_id)
        if policy is not None:
            policy.check_model(parsed.model)  # before any entry: a denied model is never served
        headers = {h.CACHE_KEY: fp[: h.CACHE_KEY_PREFIX_LEN]}
        if decision.read:
            started = platform.now()
            try:
                async with self._stages.within(self._kv_timeout):
                    cached = await platform.kv_get(entry_key(fp))
            except Exception as error:  # slow or failing KV is a miss, never a failed request
                cached = None
                survived("kv", error, request_id, platform, timings)
            timings.append(("kv", elapsed_ms(started, platform.now())))
            envelope = self._entries.decode(cached, platform.now()) if cached else None
            if envelope is not None:
                headers[h.CACHE_LAYER] = "kv"
                note.usage = envelope.usage
                if parsed.stream:
                    headers["content-type"] = SSE
                    headers["cache-control"] = "no-cache"
                    return EdgeResponse(200, headers, self._stream_hit(envelope, parsed))
                headers["content-type"] = JSON
                return EdgeResponse(200, headers, envelope.body)
        response = await self._forwarder.forward(
            "POST", self._path, request, platform, identity, fp, body, note
        )
        if not parsed.stream and decision.write:
            await self._keep_redis_hit(response, platform, fp, parsed.model)
        return response

    async def _read_body(self, request: EdgeRequest, platform: Platform) -> bytes:
        """The body's bytes, read only up to the limit and within the body timeout."""
        limit = self._limits.max_body_bytes
        declared = request.headers.get("content-length")
        length = None
        if declared is not None:
            # ASCII digits only (str.isdigit() takes other scripts' digits too), and few
            # enough of them for int(); anything else is not a length.
            if not (declared.isascii() and declared.isdigit() and len(declared) <= 18):
                raise InvalidRequestError(
                    "Content-Length must be a non-negative integer.",
                    code="invalid_content_length",
                )
            length = int(declared)
            if length > limit:
                raise RequestTooLargeError(f"Request body is {length} bytes; the limit is {limit}.")
        try:
            async with self._stages.within(self._body_timeout):
                body = await platform.read_body(limit, length)
        except TimeoutError:
            raise RequestTimeoutError(
                f"The request body did not arrive in time ({self._body_timeout * 1000:.0f} ms)."
            ) from None
        except Exception:  # the runtime's read failed: the client ended the body early
            raise InvalidRequestError(
                "The request body ended before its Content-Length.", code="incomplete_body"
            ) from None
        if len(body) > limit:
            raise RequestTooLargeError(f"Request body exceeds the limit of {limit} bytes.")
        return body

    async def _policy(
        self, project: str, platform: Platform, timings: Timings, request_id: str
    ) -> Policy | None:
        """The project's policy as this isolate knows it: read from KV when stale, the last
        one known while KV fails (the origin checks again anyway)."""
        policies = self._policies
        policy = policies.last(project)
        if not policies.fresh(project, platform.now()):
            try:
                async with self._stages.within(self._kv_timeout):
                    policy = await policies.get(project, platform.now(), platform.kv_get)
            except Exception as error:
                survived("policy", error, request_id, platform, timings)
                policy = policies.last(project)
        return policy

    async def _keep_redis_hit(
        self, response: EdgeResponse, platform: Platform, fp: str, model: str
    ) -> None:
        """A JSON Redis hit the origin sent: read its (complete, small) body so it can also
        be written to KV, in the background, for as long as Redis keeps it."""
        if not (
            response.passthrough is not None
            and response.status == 200
            and response.headers.get(h.CACHE_LAYER) == "redis"
        ):
            return
        expires = response.passthrough.header(h.ENTRY_EXPIRES)
        text = await response.passthrough.text()
        response.body, response.passthrough = text, None
        ttl = int(expires) - int(platform.now()) if expires and expires.isdigit() else 0
        if ttl >= _MIN_KV_TTL:
            # With the answer's usage, as the origin's entries have it: a KV hit on it then
            # counts its tokens and what it saved (origin/apis/edge_records.py).
            data = encode_envelope(
                text.encode(),
                model=model,
                ttl=ttl,
                usage=_usage_of(text),
                created=int(platform.now()),
            )
            platform.wait_until(platform.kv_put(entry_key(fp), data.decode(), ttl))


def _usage_of(answer: str) -> dict[str, Any] | None:
    """The token usage an answer's JSON reports (every API's answer carries ``usage``)."""
    try:
        parsed = json.loads(answer)
    except ValueError:
        return None
    usage = parsed.get("usage") if isinstance(parsed, dict) else None
    return usage if isinstance(usage, dict) else None
