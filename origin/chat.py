"""``POST /v1/chat/completions``: auth, parse, fingerprint, Redis, then the provider.

A route handler over plain ASGI (``origin.asgi``). It makes one Redis round trip
(revocation, entry and the project's policy in one script), refuses a model the policy
denies (403) before anything is served, serves a hit's stored bytes without parsing
them, and on a miss answers as soon as the provider does; the cache writes (Redis
and Workers KV, in parallel) run after, in the background, never in front of the
client. A miss of a project with a budget reserves its bound before the provider is
called and settles after (``origin/billing.py``); usage is counted in memory.
"""

from __future__ import annotations

import functools
import time

from starlette.types import Receive

from prism import (
    AuthenticationError,
    CacheDecision,
    CachePolicy,
    ChatRequest,
    PermissionDeniedError,
    PrismError,
    RateLimitError,
    RecentBodies,
    RecentEntries,
    classify,
    fingerprint,
    parse_chat_request,
    replay,
)
from prism import headers as h
from prism.routes import CHAT_PATH

from .asgi import Request, disconnected, read_body
from .asgi import StageTimer as _Timer
from .audit import audit_record
from .auth import Caller, authenticate, check_forwarded_body
from .billing import Charge
from .flight import Call, ClientStream, Storage
from .gateway import Gateway
from .policies import ProjectPolicies
from .ratelimits import SettlingStream, TokenCharge
from .responses import Reply
from .semantic import Pending, SemanticCache, question
from .tokens import completion_token_bound, prompt_token_bound

__all__ = ["ChatCompletions"]

JSON = {"content-type": "application/json"}
SSE = {"content-type": "text/event-stream", "cache-control": "no-cache", "x-accel-buffering": "no"}
CLIENT_GONE = 499  # the client closed the connection before the answer (as nginx counts it)


class ChatCompletions:
    def __init__(self, gateway: Gateway, policies: ProjectPolicies | None = None) -> None:
        self.gw = gateway
        self.policies = policies or ProjectPolicies()
        self.audit = gateway.audit
        self.limiter = gateway.limiter
        self.billing = gateway.billing
        self.policy = CachePolicy(default_ttl=gateway.settings.default_ttl)
        self._bodies: RecentBodies[ChatRequest] = RecentBodies()
        self._entries = RecentEntries()

    async def __call__(self, request: Request) -> Reply:
        """A route handler (``asgi.Routes``): errors are raised, and rendered there."""
        headers, receive, request_id, timer = (
            request.headers,
            request.receive,
            request.id,
            request.timer,
        )
        gw = self.gw
        # Routes admits only POST here; a forward signed for anything else is refused.
        caller = authenticate(
            headers, gw.settings.key_ring, gw.settings.forward_secret, "POST", CHAT_PATH, gw.metrics
        )
        timer.mark("auth")
        request.project = caller.project  # for the access log and the trace
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
        request.chat = chat
        lookup = await gw.cache.lookup(
            caller.key_id, fp if decision.read else None, caller.project, count=True
        )
        timer.mark("redis")
        if lookup.revoked:
            raise AuthenticationError("This API key has been revoked.", code="key_revoked")
        # The policy came in the same round trip; it is checked before any entry is served.
        try:
            policy = self.policies.resolve(caller.project, lookup)
            if policy is not None:
                policy.check_model(chat.model)
        except PermissionDeniedError as refusal:
            self._audit_refusal(caller, chat.model, refusal)
            raise
        out = {h.REQUEST_ID: request_id, h.CACHE_KEY: fp[: h.CACHE_KEY_PREFIX_LEN]}
        # The request rate limit's verdict came in the same round trip.
        if lookup.rate is not None:  # no call on the hot path when no limit applies
            self.limiter.check_requests(caller.project, caller.key_id, lookup.rate, out)
        if lookup.entry is not None:
            now = time.time()  # once: a clock read is not free on every machine
            envelope = self._entries.decode(lookup.entry, now)
            if envelope is not None:
                out[h.CACHE_LAYER] = "redis"
                request.usage = envelope.usage
                self.billing.hit(caller.project, caller.key_id, chat.model, envelope, now)
                if caller.fingerprint is not None:  # the edge: it writes KV with the time left
                    out[h.ENTRY_EXPIRES] = str(envelope.expires_at())
                out[h.SERVER_TIMING] = h.server_timing(timer.stages)
                if chat.stream:
                    body = replay(envelope.completion(), chat.include_usage)
                    return Reply(200, {**SSE, **out}, body)
                return Reply(200, {**JSON, **out}, envelope.body)
        cacheable = lookup.available and not decision.bypass
        out[h.CACHE_LAYER] = layer = "miss" if cacheable else "bypass"
        pending: Pending | None = None
        # Only for a project whose policy opts in: any other request pays one attribute check.
        rules = policy.cache if policy is not None else None
        if rules is not None and rules.semantic and cacheable and gw.semantic is not None:
            found = await self._semantic(
                gw.semantic, rules.threshold, caller, chat, decision, out, timer
            )
            if isinstance(found, Reply):
                return found
            pending = found
        # The budget is the policy's, from the same lookup: none set, no Redis command here.
        budget = policy.budget if policy is not None else None
        if budget is not None and decision.read and fp in self.gw.flights:
            budget = None  # joins the call in flight, which its starter pays for
        tokens: TokenCharge | None = None
        rate_limits = policy.rate_limits if policy is not None else None
        if (
            rate_limits is not None
            and lookup.available
            and rate_limits.limits_tokens(caller.key_id)
        ):
            # Tokens are limited on misses only: admitted on the request's bound now,
            # settled to its usage once answered (all given back when it joins a call).
            tokens = await self.limiter.admit_tokens(
                caller.project,
                caller.key_id,
                prompt_token_bound(chat),
                completion_token_bound(chat),
                out,
                lookup.rate is not None,
            )
        try:
            try:
                charge = await self.billing.open(caller.project, caller.key_id, chat, layer, budget)
            except (RateLimitError, PermissionDeniedError) as refusal:
                self._audit_refusal(caller, chat.model, refusal, "budget.refuse")
                raise
            request.charge = charge
            reply = await self._miss(
                chat, fp, decision, cacheable, out, timer, receive, request_id, charge, pending,
                tokens,
            )  # fmt: skip
        except BaseException:
            if tokens is not None:
                tokens.settle(None)  # no answer: every admitted token goes back
            raise
        if tokens is not None and reply.status != 200:
            tokens.settle(None)
        return reply

    async def _semantic(
        self,
        semantic: SemanticCache,
        threshold: float,
        caller: Caller,
        chat: ChatRequest,
        decision: CacheDecision,
        out: dict[str, str],
        timer: _Timer,
    ) -> Reply | Pending | None:
        """A paraphrase's answer from the semantic layer (a hit: nothing spent, like a
        Redis hit), or the question for the miss to index once its answer is stored
        (None: the request is not a question)."""
        asked = question(caller.project, CHAT_PATH, chat)
        if asked is None or not semantic.available:
            return None
        if not decision.read:
            return semantic.pending(asked) if decision.write else None
        match, pending = await semantic.lookup(asked, threshold)
        timer.mark("semantic")
        if match is None:
            return pending
        envelope = match.envelope
        self.billing.hit(caller.project, caller.key_id, chat.model, envelope, time.time())
        out[h.CACHE_LAYER] = "semantic"
        out[h.CACHE_KEY] = match.fingerprint[: h.CACHE_KEY_PREFIX_LEN]
        out[h.SEMANTIC_SCORE] = f"{match.score:.4f}"
        out[h.SERVER_TIMING] = h.server_timing(timer.stages)
        if chat.stream:
            body = replay(envelope.completion(), chat.include_usage)
            return Reply(200, {**SSE, **out}, body)
        return Reply(200, {**JSON, **out}, envelope.body)

    def _audit_refusal(
        self, caller: Caller, model: str, refusal: PrismError, action: str = "policy.refuse"
    ) -> None:
        """Into the audit log after the response, never delaying or failing it."""
        if self.gw.cache.available and self.audit.admit():
            detail = {"model": model[:200], "code": refusal.code}
            if action == "budget.refuse":
                detail["message"] = refusal.message
            record = audit_record(action, caller.project, f"key:{caller.key_id}", detail=detail)
            self.gw.spawn(self.audit.append(record))

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
        charge: Charge,
        semantic: Pending | None = None,
        tokens: TokenCharge | None = None,
    ) -> Reply:
        gw = self.gw
        storage = Storage(fp, decision.ttl, semantic) if cacheable and decision.write else None
        call = Call(chat.body, chat.model, chat.stream, request_id, storage, charge)
        # Join only requests that would accept a cached answer anyway; Redis being down
        # is no reason to call the provider once per identical request.
        key = fp if decision.read else None
        client_gone = functools.partial(disconnected, receive)
        async with gw.flights.subscribe(key, call) as subscription:
            if subscription.call is not call:
                charge.joined()
                if tokens is not None:
                    tokens.settle(None)  # joined a call in flight: it pays nothing
            stream: ClientStream | SettlingStream | None = None
            if chat.stream:
                if not await subscription.started(client_gone):
                    return Reply(CLIENT_GONE, headers)
                stream = subscription.follow(chat.include_usage)  # closing it is the leave
                if tokens is not None:  # settled when the stream ends or is closed
                    stream = SettlingStream(stream, tokens)
                body, kind = b"", SSE
            else:
                answer = await subscription.answer(client_gone)
                if answer is None:
                    return Reply(CLIENT_GONE, headers)
                body, kind = answer.body, JSON
                if tokens is not None:
                    tokens.settle(answer.completion)
            timer.mark("upstream")
            headers[h.PROVIDER] = subscription.provider
        headers[h.SERVER_TIMING] = h.server_timing(timer.stages)
        return Reply(200, {**kind, **headers}, body, stream)
