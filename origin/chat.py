"""``POST /v1/chat/completions``: auth, parse, fingerprint, Redis, then the provider.

The hot path does one Redis round trip (revocation + entry, pipelined), serves
a hit's stored bytes without parsing them, and on a miss answers as soon as
the provider does; the cache writes (Redis and Workers KV, in parallel) run
after, in the background, never in front of the client.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from prism import (
    AuthenticationError,
    CacheDecision,
    CachePolicy,
    ChatRequest,
    PrismError,
    RequestTooLargeError,
    classify,
    decode_envelope,
    fingerprint,
    parse_chat_request,
    replay,
)
from prism import headers as h

from .auth import authenticate
from .flight import Flight
from .gateway import Gateway
from .providers.base import UpstreamCompletion
from .responses import error_response

__all__ = ["ChatCompletions"]

PATH = "/v1/chat/completions"
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


class _Timer:
    __slots__ = ("_last", "stages")

    def __init__(self) -> None:
        self._last = time.perf_counter()
        self.stages: list[tuple[str, float]] = []

    def mark(self, stage: str) -> None:
        now = time.perf_counter()
        self.stages.append((stage, (now - self._last) * 1000))
        self._last = now


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestTooLargeError(f"Request body is {declared} bytes; the limit is {limit}.")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestTooLargeError(f"Request body exceeds the limit of {limit} bytes.")
        chunks.append(chunk)
    return b"".join(chunks)


class ChatCompletions:
    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway
        self.policy = CachePolicy(default_ttl=gateway.settings.default_ttl)

    async def handle(self, request: Request) -> Response:
        request_id = request.headers.get(h.REQUEST_ID) or secrets.token_hex(8)
        layer = "bypass"
        status = 500
        try:
            response = await self._handle(request, request_id)
            layer = response.headers.get(h.CACHE_LAYER, "bypass")
            status = response.status_code
            return response
        except PrismError as error:
            status = error.status
            return error_response(error, request_id)
        finally:
            self.gw.metrics.requests.labels("chat", str(status), layer).inc()

    async def _handle(self, request: Request, request_id: str) -> Response:
        gw = self.gw
        timer = _Timer()
        caller = authenticate(request.headers, gw.settings.key_ring, gw.settings.forward_secret)
        timer.mark("auth")
        chat = parse_chat_request(await _read_body(request, gw.settings.limits.max_body_bytes))
        decision = classify(chat, request.headers.get("cache-control"), self.policy)
        timer.mark("parse")
        fp = caller.fingerprint or fingerprint(caller.project, PATH, chat)
        timer.mark("fingerprint")
        lookup = await gw.cache.lookup(caller.key_id, fp if decision.read else None)
        timer.mark("redis")
        if lookup.revoked:
            raise AuthenticationError("This API key has been revoked.", code="key_revoked")
        headers = {h.REQUEST_ID: request_id, h.CACHE_KEY: fp[: h.CACHE_KEY_PREFIX_LEN]}
        if lookup.entry is not None:
            envelope = decode_envelope(lookup.entry)
            if envelope is not None:
                headers[h.CACHE_LAYER] = "redis"
                headers[h.ENTRY_EXPIRES] = str(envelope.expires_at())
                headers[h.SERVER_TIMING] = h.server_timing(timer.stages)
                if chat.stream:
                    body = replay(envelope.completion(), chat.include_usage)
                    return Response(body, 200, {**headers, **SSE_HEADERS}, "text/event-stream")
                return Response(envelope.body, 200, headers, "application/json")
        cacheable = lookup.available and not decision.bypass
        headers[h.CACHE_LAYER] = "miss" if cacheable else "bypass"
        return await self._miss(chat, fp, decision, cacheable, headers, timer)

    async def _miss(
        self,
        chat: ChatRequest,
        fp: str,
        decision: CacheDecision,
        cacheable: bool,
        headers: dict[str, str],
        timer: _Timer,
    ) -> Response:
        gw = self.gw
        on_complete = None
        if cacheable and decision.write:

            def on_complete(result: UpstreamCompletion) -> None:
                gw.store(fp, result, chat.model, decision.ttl)

        # Join only requests that would accept a cached answer anyway.
        join_key = fp if cacheable and decision.read and gw.settings.coalesce else None
        flight, _joined = gw.flights.get_or_start(
            join_key, chat.body, chat.model, chat.stream, on_complete
        )
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
            return StreamingResponse(
                self._stream_body(flight, chat.include_usage),
                200,
                {**headers, **SSE_HEADERS},
                media_type="text/event-stream",
            )
        await flight.wait_done()
        timer.mark("upstream")
        if flight.error is not None:
            raise flight.error
        assert flight.result is not None
        headers[h.PROVIDER] = flight.provider
        headers[h.SERVER_TIMING] = h.server_timing(timer.stages)
        return Response(flight.result.body, 200, headers, "application/json")

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
