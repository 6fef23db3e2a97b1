"""``POST /v1/chat/completions``: auth, parse, fingerprint, Redis, then the provider.

A route handler over plain ASGI (``origin.asgi``). It makes one Redis round trip
(revocation and entry in one script), serves a hit's stored bytes without parsing
them, and on a miss answers as soon as the provider does; the cache writes (Redis
and Workers KV, in parallel) run after, in the background, never in front of the
client.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from starlette.types import Receive

from prism import (
    AuthenticationError,
    CacheDecision,
    CachePolicy,
    ChatRequest,
    RecentBodies,
    RecentEntries,
    classify,
    fingerprint,
    parse_chat_request,
    replay,
)
from prism import headers as h
from prism.routes import CHAT_PATH

from .asgi import Request, read_body
from .asgi import StageTimer as _Timer
from .auth import authenticate, check_forwarded_body
from .flight import Flight
from .gateway import Gateway
from .providers.base import UpstreamCompletion
from .responses import Reply

__all__ = ["ChatCompletions"]

JSON = {"content-type": "application/json"}
SSE = {"content-type": "text/event-stream", "cache-control": "no-cache", "x-accel-buffering": "no"}


class ChatCompletions:
    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway
        self.policy = CachePolicy(default_ttl=gateway.settings.default_ttl)
        self._bodies = RecentBodies()
        self._entries = RecentEntries()

    async def __call__(self, request: Request) -> Reply:
        """A route handler (``asgi.Routes``): errors are raised, and rendered there."""
        return await self._handle(request.headers, request.receive, request.id, request.timer)

    async def _handle(
        self, headers: dict[str, str], receive: Receive, request_id: str, timer: _Timer
    ) -> Reply:
        gw = self.gw
        # Routes admits only POST here; a forward signed for anything else is refused.
        caller = authenticate(
            headers, gw.settings.key_ring, gw.settings.forward_secret, "POST", CHAT_PATH, gw.metrics
        )
        timer.mark("auth")
        limits = gw.settings.limits
        raw = await read_body(receive, limits.max_body_bytes, headers.get("content-length"))
        known = self._bodies.get(caller.project, raw)
        if known is None:
            chat = parse_chat_request(raw, limits)
            fp = fingerprint(caller.project, CHAT_PATH, chat)
            self._bodies.put(caller.project, raw, chat, fp)
        else:
            chat, fp = known
        # A forward vouches for this body only: its signed fingerprint must be this one.
        check_forwarded_body(caller, fp, gw.metrics)
        decision = classify(chat, headers.get("cache-control"), self.policy)
        timer.mark("parse")
        lookup = await gw.cache.lookup(caller.key_id, fp if decision.read else None)
        timer.mark("redis")
        if lookup.revoked:
            raise AuthenticationError("This API key has been revoked.", code="key_revoked")
        out = {h.REQUEST_ID: request_id, h.CACHE_KEY: fp[: h.CACHE_KEY_PREFIX_LEN]}
        if lookup.entry is not None:
            envelope = self._entries.decode(lookup.entry, time.time())
            if envelope is not None:
                out[h.CACHE_LAYER] = "redis"
                if caller.fingerprint is not None:  # the edge: it writes KV with the time left
                    out[h.ENTRY_EXPIRES] = str(envelope.expires_at())
                out[h.SERVER_TIMING] = h.server_timing(timer.stages)
                if chat.stream:
                    body = replay(envelope.completion(), chat.include_usage)
                    return Reply(200, {**SSE, **out}, body)
                return Reply(200, {**JSON, **out}, envelope.body)
        cacheable = lookup.available and not decision.bypass
        out[h.CACHE_LAYER] = "miss" if cacheable else "bypass"
        return await self._miss(chat, fp, decision, cacheable, out, timer)

    async def _miss(
        self,
        chat: ChatRequest,
        fp: str,
        decision: CacheDecision,
        cacheable: bool,
        headers: dict[str, str],
        timer: _Timer,
    ) -> Reply:
        gw = self.gw
        on_complete = None
        if cacheable and decision.write:

            def on_complete(result: UpstreamCompletion, fallback: bool) -> None:
                # A fallback's answer is kept briefly: the primary's takes over once it is back.
                ttl = min(decision.ttl, gw.settings.fallback_ttl) if fallback else decision.ttl
                gw.store(fp, result, chat.model, ttl)

        # Join only requests that would accept a cached answer anyway.
        join_key = fp if cacheable and decision.read and gw.settings.coalesce else None
        flight = gw.flights.get_or_start(join_key, chat.body, chat.model, chat.stream, on_complete)
        if chat.stream:
            flight.join()  # left by _stream_body when the client is done or gone
            try:
                await flight.wait_started()
            except BaseException:
                flight.leave()
                raise
            if flight.error is not None and not flight.events:
                flight.leave()
                raise flight.error
            timer.mark("upstream")
            headers[h.PROVIDER] = flight.provider
            headers[h.SERVER_TIMING] = h.server_timing(timer.stages)
            stream = self._stream_body(flight, chat.include_usage)
            return Reply(200, {**SSE, **headers}, stream=stream)
        await flight.wait_done()
        timer.mark("upstream")
        if flight.error is not None:
            raise flight.error
        assert flight.result is not None
        headers[h.PROVIDER] = flight.provider
        headers[h.SERVER_TIMING] = h.server_timing(timer.stages)
        return Reply(200, {**JSON, **headers}, flight.result.body)

    async def _stream_body(self, flight: Flight, include_usage: bool) -> AsyncIterator[bytes]:
        try:
            if flight.done and flight.result is not None and not flight.events:
                # Joined a non-stream call: replay its answer.
                yield replay(flight.result.completion, include_usage)
                return
            async for chunk in flight.follow(include_usage):
                yield chunk
        finally:
            flight.leave()
