"""``POST /v1/chat/completions``: auth, parse, fingerprint, Redis, then the provider.

A plain ASGI endpoint: no framework on the hot path. It makes one Redis round trip
(revocation and entry in one script), serves a hit's stored bytes without parsing
them, and on a miss answers as soon as the provider does; the cache writes (Redis
and Workers KV, in parallel) run after, in the background, never in front of the
client.
"""

from __future__ import annotations

import itertools
import logging
import secrets
import time
from collections.abc import AsyncIterator

from prism import (
    AuthenticationError,
    CacheDecision,
    CachePolicy,
    ChatRequest,
    MethodNotAllowedError,
    PrismError,
    RecentBodies,
    RecentEntries,
    classify,
    error_json,
    fingerprint,
    parse_chat_request,
    replay,
)
from prism import headers as h

from .asgi import Receive, Reply, Scope, Send, read_body, request_headers, send_reply
from .auth import authenticate, check_forwarded_body
from .flight import Flight
from .gateway import Gateway
from .providers.base import UpstreamCompletion
from .responses import error_headers

__all__ = ["ChatCompletions"]

log = logging.getLogger("prism.origin")

PATH = "/v1/chat/completions"
JSON = {"content-type": "application/json"}
SSE = {"content-type": "text/event-stream", "cache-control": "no-cache", "x-accel-buffering": "no"}


class _Timer:
    __slots__ = ("_last", "stages")

    def __init__(self) -> None:
        self._last = time.perf_counter()
        self.stages: list[tuple[str, float]] = []

    def mark(self, stage: str) -> None:
        now = time.perf_counter()
        self.stages.append((stage, (now - self._last) * 1000))
        self._last = now


def _error_reply(error: PrismError, request_id: str) -> Reply:
    return Reply(error.status, error_headers(error, request_id), error_json(error))


class ChatCompletions:
    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway
        self.policy = CachePolicy(default_ttl=gateway.settings.default_ttl)
        self._bodies = RecentBodies()
        self._entries = RecentEntries()
        # Request ids need to be unique, not secret: a random prefix and a counter.
        self._id_prefix = secrets.token_hex(4)
        self._ids = itertools.count(1)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = request_headers(scope)
        request_id = headers.get(h.REQUEST_ID) or f"{self._id_prefix}{next(self._ids):08x}"
        try:
            if scope["method"] != "POST":
                raise MethodNotAllowedError(f"Method {scope['method']} is not allowed here.")
            reply = await self._handle(headers, receive, request_id)
        except PrismError as error:
            reply = _error_reply(error, request_id)
        except Exception:  # a bug must still answer in the API's format, and be logged
            log.exception("unhandled error in chat completions (request %s)", request_id)
            reply = _error_reply(PrismError("The gateway failed unexpectedly."), request_id)
        self.gw.metrics.count_request(
            "chat", reply.status, reply.headers.get(h.CACHE_LAYER, "bypass")
        )
        await send_reply(reply, receive, send)

    async def _handle(self, headers: dict[str, str], receive: Receive, request_id: str) -> Reply:
        gw = self.gw
        timer = _Timer()
        # __call__ admits only POST; a forward signed for anything else is refused here.
        caller = authenticate(
            headers, gw.settings.key_ring, gw.settings.forward_secret, "POST", PATH, gw.metrics
        )
        timer.mark("auth")
        limits = gw.settings.limits
        raw = await read_body(receive, limits.max_body_bytes, headers.get("content-length"))
        known = self._bodies.get(caller.project, raw)
        if known is None:
            chat = parse_chat_request(raw, limits)
            fp = fingerprint(caller.project, PATH, chat)
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
