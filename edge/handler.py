"""The edge's request logic, runtime-neutral: it sees the Worker only through ``Platform``.

route → auth (signature, no I/O; revocation memoized) → body limit → parse →
fingerprint → KV read (bounded) → hit: answer at the PoP; miss: forward to the
origin, signed, and stream its answer back untouched. When the origin answered
from Redis, the entry is written to KV in the background so the next request
stays at the PoP.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets

from prism import (
    AuthenticationError,
    MethodNotAllowedError,
    NotFoundError,
    PrismError,
    RecentBodies,
    RecentEntries,
    RequestTooLargeError,
    UpstreamError,
    bearer_token,
    classify,
    encode_envelope,
    entry_key,
    error_json,
    fingerprint,
    parse_chat_request,
    replay,
    sign_forward,
)
from prism import headers as h
from prism.routes import CHAT_PATH

from .platform import EdgeRequest, EdgeResponse, Platform
from .revocation import RevocationSet
from .settings import EdgeSettings

__all__ = ["EdgeHandler"]

JSON = "application/json"
SSE = "text/event-stream"
_MIN_KV_TTL = 60
# Request headers the origin may need; everything else (cookies, the API key) stays here.
_FORWARDED = ("content-type", "cache-control", "accept", "openai-organization")


class EdgeHandler:
    """One per isolate: the settings, the memoized revocation set, and what this isolate
    has recently parsed and decoded (an isolate serves many requests in turn)."""

    def __init__(self, settings: EdgeSettings) -> None:
        self.settings = settings
        self.revoked = RevocationSet(settings.revocation_ttl)
        self._bodies = RecentBodies(size=256)
        self._entries = RecentEntries(size=64)
        # Request ids need to be unique, not secret: a random prefix per isolate and a counter.
        self._id_prefix = secrets.token_hex(4)
        self._ids = itertools.count(1)

    async def handle(self, request: EdgeRequest, platform: Platform) -> EdgeResponse:
        request_id = request.headers.get(h.REQUEST_ID) or f"{self._id_prefix}{next(self._ids):08x}"
        timings: list[tuple[str, float]] = []
        try:
            response = await self._route(request, platform, timings)
        except PrismError as error:
            response = EdgeResponse(
                error.status, {"content-type": JSON, **error.headers}, error_json(error)
            )
            response.headers.setdefault(h.CACHE_LAYER, "bypass")
        response.headers[h.REQUEST_ID] = request_id
        edge_timing = h.server_timing(timings)
        origin_timing = response.headers.get(h.SERVER_TIMING)
        response.headers[h.SERVER_TIMING] = (
            f"{edge_timing}, {_prefixed(origin_timing)}" if origin_timing else edge_timing
        )
        return response

    async def _route(
        self, request: EdgeRequest, platform: Platform, timings: list[tuple[str, float]]
    ) -> EdgeResponse:
        path = request.path
        if not path.startswith("/v1/"):
            raise NotFoundError(f"Unknown route {request.method} {path}.")
        if path == CHAT_PATH and request.method != "POST":
            raise MethodNotAllowedError(f"Method {request.method} is not allowed here.")
        started = platform.now()
        key = bearer_token(request.headers.get("authorization"))
        identity = self.settings.key_ring.verify(key)
        if await self.revoked.contains(identity.key_id, platform.now(), platform.kv_get):
            raise AuthenticationError("This API key has been revoked.", code="key_revoked")
        timings.append(("auth", _ms(started, platform.now())))
        if path != CHAT_PATH:
            return await self._forward(
                request, platform, identity.project, identity.key_id, "", None, timings
            )
        return await self._chat(request, platform, identity.project, identity.key_id, timings)

    async def _chat(
        self,
        request: EdgeRequest,
        platform: Platform,
        project: str,
        key_id: str,
        timings: list[tuple[str, float]],
    ) -> EdgeResponse:
        limit = self.settings.limits.max_body_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise RequestTooLargeError(f"Request body is {declared} bytes; the limit is {limit}.")
        started = platform.now()
        body = await platform.read_body()
        known = self._bodies.get(project, body)
        if known is None:
            chat = parse_chat_request(body, self.settings.limits)
            fp = fingerprint(project, CHAT_PATH, chat)
            self._bodies.put(project, body, chat, fp)
        else:
            chat, fp = known
        decision = classify(chat, request.headers.get("cache-control"))
        # CPU only, and the Workers clock stands still while code runs: I/O stages only.
        timings.append(("parse", _ms(started, platform.now())))
        headers = {h.CACHE_KEY: fp[: h.CACHE_KEY_PREFIX_LEN]}
        if decision.read:
            started = platform.now()
            cached = await self._kv_read(platform, entry_key(fp))
            timings.append(("kv", _ms(started, platform.now())))
            envelope = self._entries.decode(cached, platform.now()) if cached else None
            if envelope is not None:
                headers[h.CACHE_LAYER] = "kv"
                if chat.stream:
                    headers["content-type"] = SSE
                    headers["cache-control"] = "no-cache"
                    return EdgeResponse(
                        200, headers, replay(envelope.completion(), chat.include_usage)
                    )
                headers["content-type"] = JSON
                return EdgeResponse(200, headers, envelope.body)
        response = await self._forward(request, platform, project, key_id, fp, body, timings)
        if (
            response.passthrough is not None
            and response.status == 200
            and response.headers.get(h.CACHE_LAYER) == "redis"
            and not chat.stream
            and decision.write
        ):
            # Read the (complete, small) JSON body so it can also be written to KV.
            expires = response.passthrough.header(h.ENTRY_EXPIRES)
            text = await response.passthrough.text()
            response.body, response.passthrough = text, None
            ttl = int(expires) - int(platform.now()) if expires and expires.isdigit() else 0
            if ttl >= _MIN_KV_TTL:
                data = encode_envelope(
                    text.encode(), model=chat.model, ttl=ttl, created=int(platform.now())
                )
                platform.wait_until(platform.kv_put(entry_key(fp), data.decode(), ttl))
        return response

    async def _kv_read(self, platform: Platform, key: str) -> str | None:
        """KV, bounded: an error or a slow read is a miss, never a failed request."""
        try:
            async with asyncio.timeout(self.settings.kv_timeout):
                return await platform.kv_get(key)
        except Exception:
            return None

    async def _forward(
        self,
        request: EdgeRequest,
        platform: Platform,
        project: str,
        key_id: str,
        fp: str,
        body: str | None,
        timings: list[tuple[str, float]],
    ) -> EdgeResponse:
        headers = {name: request.headers[name] for name in _FORWARDED if name in request.headers}
        headers[h.FORWARD] = sign_forward(
            self.settings.forward_secret,
            project=project,
            key_id=key_id,
            fingerprint=fp,
            now=platform.now(),
        )
        if h.REQUEST_ID in request.headers:
            headers[h.REQUEST_ID] = request.headers[h.REQUEST_ID]
        url = (
            self.settings.origin_url + request.path + (f"?{request.query}" if request.query else "")
        )
        started = platform.now()
        try:
            reply = await platform.fetch_origin(request.method, url, headers, body)
        except Exception:
            raise UpstreamError(
                "The Prism origin is unreachable from this edge.", code="origin_unreachable"
            ) from None
        timings.append(("origin", _ms(started, platform.now())))
        out = reply.headers()
        out.pop("content-length", None)  # the runtime sets it for what it actually sends
        out.setdefault(h.CACHE_LAYER, "bypass")
        if fp:
            out[h.CACHE_KEY] = fp[: h.CACHE_KEY_PREFIX_LEN]
        return EdgeResponse(reply.status, out, passthrough=reply)


def _ms(started: float, ended: float) -> float:
    # The Workers clock moves only across I/O and is coarse: never report a negative stage.
    return max(0.0, (ended - started) * 1000)


def _prefixed(timing: str) -> str:
    """The origin's Server-Timing stages, renamed ``origin-*`` next to the edge's own."""
    return ", ".join(f"origin-{part.strip()}" for part in timing.split(",") if part.strip())
