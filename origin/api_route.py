"""A cached API route other than chat completions (embeddings, Anthropic messages).

The same steps as ``origin.chat`` (auth, parse, fingerprint, one Redis round trip with
revocation and policy, hit or coalesced miss, cache writes after the answer), over an
``Api``: its path, its parser, its ``Operation`` and how its errors look. Chat keeps
its own handler, so nothing here adds work to a chat request.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass

from prism import (
    AuthenticationError,
    CachePolicy,
    Limits,
    PermissionDeniedError,
    PrismError,
    RecentBodies,
    RecentEntries,
    classify,
    error_json,
    fingerprint,
)
from prism import headers as h
from prism.parsers import ParsedRequest

from .asgi import Request, disconnected, read_body
from .audit import audit_record
from .auth import authenticate, check_forwarded_body
from .chat import CLIENT_GONE, JSON, SSE
from .flight import Call, ClientStream, Storage
from .gateway import Gateway
from .operation import Operation
from .policies import ProjectPolicies
from .providers.base import UpstreamCompletion
from .responses import Reply

__all__ = ["Api", "ApiRoute"]


@dataclass(frozen=True, slots=True)
class Api:
    path: str
    parse: Callable[[bytes, Limits], ParsedRequest]
    op: Operation
    key_header: str | None = None  # a header that may carry the key instead of a bearer token
    error_body: Callable[[PrismError], bytes] = error_json  # how this API's errors look


class ApiRoute:
    """The route handler (``asgi.Routes``) for one ``Api``."""

    def __init__(self, gateway: Gateway, api: Api, policies: ProjectPolicies) -> None:
        self.gw = gateway
        self.api = api
        self.policies = policies
        self.policy = CachePolicy(default_ttl=gateway.settings.default_ttl)
        self._bodies: RecentBodies[ParsedRequest] = RecentBodies()
        self._entries = RecentEntries()
        self.audit = gateway.audit
        self.limiter = gateway.limiter

    def _audit_refusal(self, project: str, key_id: str, model: str, code: str) -> None:
        """Into the audit log after the response, as chat's refusals are."""
        if self.gw.cache.available and self.audit.admit():
            record = audit_record(
                "policy.refuse",
                project,
                f"key:{key_id}",
                detail={"model": model[:200], "code": code, "path": self.api.path},
            )
            self.gw.spawn(self.audit.append(record))

    async def __call__(self, request: Request) -> Reply:
        gw, api, headers, timer = self.gw, self.api, request.headers, request.timer
        caller = authenticate(
            headers,
            gw.settings.key_ring,
            gw.settings.forward_secret,
            "POST",
            api.path,
            gw.metrics,
            api.key_header,
        )
        timer.mark("auth")
        request.project = caller.project  # for the access log and the trace
        limits = gw.settings.limits
        raw = await read_body(request.receive, limits.max_body_bytes, headers.get("content-length"))
        known = self._bodies.get(caller.project, raw)
        if known is None:
            parsed = api.parse(raw, limits)
            fp = fingerprint(caller.project, api.path, parsed)
            self._bodies.put(caller.project, raw, parsed, fp)
        else:
            parsed, fp = known
        check_forwarded_body(caller, fp, gw.metrics)
        decision = classify(parsed, headers.get("cache-control"), self.policy)
        timer.mark("parse")
        request.chat = parsed
        lookup = await gw.cache.lookup(
            caller.key_id, fp if decision.read else None, caller.project, count=True
        )
        timer.mark("redis")
        if lookup.revoked:
            raise AuthenticationError("This API key has been revoked.", code="key_revoked")
        try:
            policy = self.policies.resolve(caller.project, lookup)
            if policy is not None:
                policy.check_model(parsed.model)
        except PermissionDeniedError as refusal:
            self._audit_refusal(caller.project, caller.key_id, parsed.model, refusal.code)
            raise
        out = {h.REQUEST_ID: request.id, h.CACHE_KEY: fp[: h.CACHE_KEY_PREFIX_LEN]}
        self.limiter.check_requests(caller.project, caller.key_id, lookup.rate, out)
        if lookup.entry is not None:
            envelope = self._entries.decode(lookup.entry, time.time())
            if envelope is not None:
                out[h.CACHE_LAYER] = "redis"
                request.usage = envelope.usage
                if caller.fingerprint is not None:  # the edge: it writes KV with the time left
                    out[h.ENTRY_EXPIRES] = str(envelope.expires_at())
                out[h.SERVER_TIMING] = h.server_timing(timer.stages)
                if parsed.stream:
                    stored = UpstreamCompletion(envelope.body, envelope.completion())
                    return Reply(200, {**SSE, **out}, api.op.replay(stored))
                return Reply(200, {**JSON, **out}, envelope.body)
        cacheable = lookup.available and not decision.bypass
        out[h.CACHE_LAYER] = "miss" if cacheable else "bypass"
        storage = Storage(fp, decision.ttl) if cacheable and decision.write else None
        call = Call(parsed.body, parsed.model, parsed.stream, request.id, storage, op=api.op)
        client_gone = functools.partial(disconnected, request.receive)
        async with gw.flights.subscribe(fp if decision.read else None, call) as subscription:
            stream: ClientStream | None = None
            if parsed.stream:
                if not await subscription.started(client_gone):
                    return Reply(CLIENT_GONE, out)
                stream = subscription.follow(False)  # closing it is the leave
                body, kind = b"", SSE
            else:
                answer = await subscription.answer(client_gone)
                if answer is None:
                    return Reply(CLIENT_GONE, out)
                body, kind = answer.body, JSON
            timer.mark("upstream")
            out[h.PROVIDER] = subscription.provider
        out[h.SERVER_TIMING] = h.server_timing(timer.stages)
        return Reply(200, {**kind, **out}, body, stream)
