"""``POST /v1/chat/completions``: auth, parse, fingerprint, Redis, then the provider.

A plain ASGI endpoint: no framework on the hot path. It makes one Redis round trip
(revocation and entry in one script), serves a hit's stored bytes without parsing
them, and on a miss answers as soon as the provider does; the cache writes (Redis
and Workers KV, in parallel) run after, in the background, never in front of the
client.
"""

from __future__ import annotations

import functools
import itertools
import logging
import secrets
import time

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
from .auth import authenticate
from .flight import Call, ClientStream, Storage
from .gateway import Gateway
from .responses import error_headers

__all__ = ["ChatCompletions"]

log = logging.getLogger("prism.origin")

PATH = "/v1/chat/completions"
JSON = {"content-type": "application/json"}
SSE = {"content-type": "text/event-stream", "cache-control": "no-cache", "x-accel-buffering": "no"}
CLIENT_GONE = 499  # the client closed the connection before the answer (as nginx counts it)


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
        caller = authenticate(headers, gw.settings.key_ring, gw.settings.forward_secret)
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
        # The edge's signed fingerprint wins: both halves compute it the same way anyway.
        fp = caller.fingerprint or fp
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
        return await self._miss(chat, fp, decision, cacheable, out, timer, receive, request_id)

    async def _miss(
        self,
        chat: ChatRequest,
        fp: str,
        decision: CacheDecision,
        cacheable: bool,
        headers: dict[str, str],
        timer: _Timer,
        receive: Receive,
        request_id: str,
    ) -> Reply:
        gw = self.gw
        storage = Storage(fp, decision.ttl) if cacheable and decision.write else None
        call = Call(chat.body, chat.model, chat.stream, request_id, storage)
        # Join only requests that would accept a cached answer anyway; Redis being down
        # is no reason to call the provider once per identical request.
        key = fp if decision.read and gw.settings.coalesce else None
        client_gone = functools.partial(_client_gone, receive)
        async with gw.flights.subscribe(key, call) as subscription:
            stream: ClientStream | None = None
            if chat.stream:
                if not await subscription.started(client_gone):
                    return Reply(CLIENT_GONE, headers)
                stream = subscription.follow(chat.include_usage)  # closing it is the leave
                body, kind = b"", SSE
            else:
                answer = await subscription.answer(client_gone)
                if answer is None:
                    return Reply(CLIENT_GONE, headers)
                body, kind = answer.body, JSON
            timer.mark("upstream")
            headers[h.PROVIDER] = subscription.provider
        headers[h.SERVER_TIMING] = h.server_timing(timer.stages)
        return Reply(200, {**kind, **headers}, body, stream)


async def _client_gone(receive: Receive) -> None:
    """Returns when the client has closed the connection (the body has been read)."""
    while (await receive())["type"] != "http.disconnect":
        pass
