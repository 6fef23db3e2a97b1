"""The one governed path every cached API goes through (chat completions, embeddings,
Anthropic messages).

A request is authenticated, parsed and fingerprinted, then ONE Redis round trip brings
its key's revocation, the cache entry, the project's policy and the request-limit
verdict. A denied model is refused (403) before anything is served; a hit is served
from its stored bytes and counted with what it saved; a miss is admitted on its token
bound by the token limit, reserves its cost bound against the budget, joins or starts
the provider call (``origin.routing.coalescing``), and is settled to what the answer used. Usage is
counted in memory (``origin.governance.usage``); nothing here writes to Redis on a hit.

What differs between the APIs is data, an ``Api``: its path and parser, the
``Operation`` that calls a provider,
how its token bounds are computed (``origin.governance.token_bounds``), how a stored answer is
replayed
as its stream, and how its errors look. The answer's usage is read by
``origin.providers.token_counts.tokens_of``, which knows both OpenAI's and Anthropic's forms.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from starlette.types import Receive

from prism import (
    AuthenticationError,
    CacheDecision,
    CachePolicy,
    Envelope,
    Limits,
    PermissionDeniedError,
    PrismError,
    RateLimitError,
    RecentBodies,
    RecentEntries,
    classify,
    error_json,
    fingerprint,
)
from prism import headers as h
from prism.parsers import ParsedRequest

from ..auth import Caller, authenticate, check_forwarded_body
from ..gateway import Gateway
from ..governance.audit import audit_record
from ..governance.billing import Charge
from ..governance.project_policies import ProjectPolicies
from ..governance.rate_limiter import TokenCharge
from ..http.asgi import disconnected, read_body
from ..http.request import Request
from ..http.request import StageTimer as _Timer
from ..http.responses import RawHeaders, Reply
from ..routing.coalescing import Call, ClientStream, Storage
from ..routing.operation import Operation
from ..store.semantic import Pending, Question, SemanticCache

__all__ = ["CLIENT_GONE", "JSON", "SSE", "Api", "ApiRoute"]

JSON = {"content-type": "application/json"}
SSE = {"content-type": "text/event-stream", "cache-control": "no-cache", "x-accel-buffering": "no"}
CLIENT_GONE = 499  # the client closed the connection before the answer (as nginx counts it)

R = TypeVar("R", bound=ParsedRequest)


def _no_usage_chunk(request: object) -> bool:
    return False


@dataclass(frozen=True, slots=True)
class Api(Generic[R]):
    """One API's part of the governed path: everything else is shared."""

    path: str
    parse: Callable[[bytes, Limits], R]
    op: Operation  # how a provider is called
    prompt_tokens: Callable[
        [R], int
    ]  # at least the prompt's tokens (``origin.governance.token_bounds``)
    completion_tokens: Callable[[R], int]  # the most generated tokens it can be billed for
    stream_hit: Callable[[Envelope, R], bytes]  # a stored answer as this API's event stream
    # Whether a streaming client sees the trailing usage chunk (chat's include_usage).
    include_usage: Callable[[R], bool] = _no_usage_chunk
    # The paraphrase the semantic layer looks up (None: this API has no semantic layer).
    question: Callable[[str, str, R], Question | None] | None = None
    key_header: str | None = None  # a header that may carry the key instead of a bearer token
    error_body: Callable[[PrismError], bytes] = error_json  # how this API's errors look
    audit_path: bool = True  # name the path in audit records (chat's records never did)


class ApiRoute(Generic[R]):
    """The route handler (``asgi.Routes``) for one ``Api``: errors are raised, and
    rendered there in the API's format."""

    def __init__(
        self, gateway: Gateway, api: Api[R], policies: ProjectPolicies | None = None
    ) -> None:
        self.gw = gateway
        self.api = api
        self.policies = policies or ProjectPolicies()
        self.audit = gateway.audit
        self.limiter = gateway.limiter
        self.billing = gateway.billing
        self.policy = CachePolicy(default_ttl=gateway.settings.default_ttl)
        # Read on every request: one attribute, not two.
        self._path, self._key_header = api.path, api.key_header
        self._bodies: RecentBodies[R] = RecentBodies()
        self._entries = RecentEntries()

    async def __call__(self, request: Request) -> Reply:
        headers, receive, request_id, timer = (
            request.headers,
            request.receive,
            request.id,
            request.timer,
        )
        gw, path = self.gw, self._path
        # Routes admits only POST here; a forward signed for anything else is refused.
        caller = authenticate(
            headers,
            gw.settings.key_ring,
            gw.settings.forward_secret,
            "POST",
            path,
            gw.metrics,
            self._key_header,
        )
        timer.mark("auth")
        request.project = caller.project  # for the access log and the trace
        limits = gw.settings.limits
        raw = await read_body(receive, limits.max_body_bytes, headers.get("content-length"))
        known = self._bodies.get(caller.project, raw)
        if known is None:
            parsed = self.api.parse(raw, limits)
            fp = fingerprint(caller.project, path, parsed)
            self._bodies.put(caller.project, raw, parsed, fp)
        else:
            parsed, fp = known
        # A forward vouches for this body only: its signed fingerprint must be this one.
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
        # The policy came in the same round trip; it is checked before any entry is served.
        try:
            policy = self.policies.resolve(caller.project, lookup)
            if policy is not None:
                policy.check_model(parsed.model)
        except PermissionDeniedError as refusal:
            self._audit_refusal(caller, parsed.model, refusal)
            raise
        out = {h.REQUEST_ID: request_id, h.CACHE_KEY: fp[: h.CACHE_KEY_PREFIX_LEN]}
        # The request rate limit's verdict came in the same round trip.
        rated: RawHeaders | None = None
        if lookup.rate is not None:  # no call on the hot path when no limit applies
            rated = self.limiter.check_requests(caller.project, caller.key_id, lookup.rate)
        if lookup.entry is not None:
            now = time.time()  # once: a clock read is not free on every machine
            envelope = self._entries.decode(lookup.entry, now)
            if envelope is not None:
                request.usage = envelope.usage
                if caller.fingerprint is not None:  # the edge: it writes KV with the time left
                    out[h.ENTRY_EXPIRES] = str(envelope.expires_at())
                return self._hit(caller, parsed, envelope, "redis", now, out, timer, rated)
        # Not served from Redis (inline, not a call: every miss pays for a frame): the
        # semantic layer when the policy opts in, then the token limit and the budget, then
        # the provider call (joined when one is running).
        available = lookup.available
        cacheable = available and not decision.bypass
        out[h.CACHE_LAYER] = layer = "miss" if cacheable else "bypass"
        pending: Pending | None = None
        # Only for a project whose policy opts in: any other request pays one attribute check.
        rules = policy.cache if policy is not None else None
        if rules is not None and rules.semantic and cacheable and gw.semantic is not None:
            found = await self._semantic(
                gw.semantic, rules.threshold, caller, parsed, decision, out, timer, rated
            )
            if isinstance(found, Reply):
                return found
            pending = found
        # The budget is the policy's, from the same lookup: none set, no Redis command here.
        budget = policy.budget if policy is not None else None
        rate_limits = policy.rate_limits if policy is not None else None
        limits_tokens = (
            rate_limits is not None and available and rate_limits.limits_tokens(caller.key_id)
        )
        bounds = (0, 0)
        if budget is not None or limits_tokens:
            bounds = (self.api.prompt_tokens(parsed), self.api.completion_tokens(parsed))
        # A request that joins the call in flight neither reserves budget nor takes tokens:
        # the call's starter pays. Its charge reserves nothing, so opening it never
        # suspends, and nothing else awaits up to the subscription: the call it found in
        # flight here is the one it joins.
        joins = (budget is not None or limits_tokens) and decision.read and fp in gw.flights
        tokens: TokenCharge | None = None
        try:
            if limits_tokens and not joins:
                # Tokens are limited on misses only: admitted on the request's bound now,
                # settled to its usage when the call ends.
                tokens = await self.limiter.admit_tokens(
                    caller.project, caller.key_id, *bounds, out, lookup.rate is not None
                )
            try:
                charge = await self.billing.open(
                    caller.project,
                    caller.key_id,
                    parsed.model,
                    layer,
                    None if joins else budget,
                    bounds,
                )
            except (RateLimitError, PermissionDeniedError) as refusal:
                self._audit_refusal(caller, parsed.model, refusal, "budget.refuse")
                raise
            # The call's end settles the tokens with the budget (``Charge``): a client
            # that leaves early does not give back what the call goes on to use.
            charge.rate_tokens = tokens
            request.charge = charge  # for the access log and the trace
            return await self._call(
                parsed,
                fp,
                decision,
                cacheable,
                out,
                rated,
                timer,
                receive,
                request_id,
                charge,
                pending,
            )
        except BaseException:
            if tokens is not None:  # no call, or it failed: a no-op once the call settled
                tokens.settle(None)
            raise

    async def _semantic(
        self,
        semantic: SemanticCache,
        threshold: float,
        caller: Caller,
        parsed: R,
        decision: CacheDecision,
        out: dict[str, str],
        timer: _Timer,
        rated: RawHeaders | None,
    ) -> Reply | Pending | None:
        """A paraphrase's answer from the semantic layer (a hit: nothing spent, like a
        Redis hit), or the question for the miss to index once its answer is stored
        (None: the request is not a question, or the API has no semantic layer)."""
        question = self.api.question
        asked = question(caller.project, self._path, parsed) if question is not None else None
        if asked is None or not semantic.available:
            return None
        if not decision.read:
            return semantic.pending(asked) if decision.write else None
        match, pending = await semantic.lookup(asked, threshold)
        timer.mark("semantic")
        if match is None:
            return pending
        out[h.CACHE_KEY] = match.fingerprint[: h.CACHE_KEY_PREFIX_LEN]
        out[h.SEMANTIC_SCORE] = f"{match.score:.4f}"
        return self._hit(caller, parsed, match.envelope, "semantic", time.time(), out, timer, rated)

    def _hit(
        self,
        caller: Caller,
        parsed: R,
        envelope: Envelope,
        layer: str,
        now: float,
        out: dict[str, str],
        timer: _Timer,
        rated: RawHeaders | None,
    ) -> Reply:
        """A stored answer (from Redis or the semantic layer): nothing spent, its savings
        counted, replayed as its stream when the client streams."""
        self.billing.hit(caller.project, caller.key_id, parsed.model, envelope, now, layer)
        out[h.CACHE_LAYER] = layer
        out[h.SERVER_TIMING] = h.server_timing(timer.stages)
        if parsed.stream:
            return Reply(200, {**SSE, **out}, self.api.stream_hit(envelope, parsed), None, rated)
        return Reply(200, {**JSON, **out}, envelope.body, None, rated)

    def _audit_refusal(
        self, caller: Caller, model: str, refusal: PrismError, action: str = "policy.refuse"
    ) -> None:
        """Into the audit log after the response, never delaying or failing it."""
        if self.gw.cache.available and self.audit.admit():
            detail = {"model": model[:200], "code": refusal.code}
            if action == "budget.refuse":
                detail["message"] = refusal.message
            if self.api.audit_path:
                detail["path"] = self._path
            record = audit_record(action, caller.project, f"key:{caller.key_id}", detail=detail)
            self.gw.spawn(self.audit.append(record))

    async def _call(
        self,
        parsed: R,
        fp: str,
        decision: CacheDecision,
        cacheable: bool,
        headers: dict[str, str],
        rated: RawHeaders | None,
        timer: _Timer,
        receive: Receive,
        request_id: str,
        charge: Charge,
        semantic: Pending | None = None,
    ) -> Reply:
        gw = self.gw
        storage = Storage(fp, decision.ttl, semantic) if cacheable and decision.write else None
        call = Call(
            op=self.api.op,
            body=parsed.body,
            model=parsed.model,
            stream=parsed.stream,
            request_id=request_id,
            storage=storage,
            on_end=charge,
        )
        # Join only requests that would accept a cached answer anyway; Redis being down
        # is no reason to call the provider once per identical request.
        key = fp if decision.read else None
        client_gone = functools.partial(disconnected, receive)
        async with gw.flights.subscribe(key, call) as subscription:
            if subscription.call is not call:
                charge.joined()
            stream: ClientStream | None = None
            if parsed.stream:
                if not await subscription.started(client_gone):
                    return Reply(CLIENT_GONE, headers)
                # Closing it is the leave.
                stream = subscription.follow(self.api.include_usage(parsed))
                body, kind = b"", SSE
            else:
                answer = await subscription.answer(client_gone)
                if answer is None:
                    return Reply(CLIENT_GONE, headers)
                body, kind = answer.body, JSON
            timer.mark("upstream")
            headers[h.PROVIDER] = subscription.provider
        headers[h.SERVER_TIMING] = h.server_timing(timer.stages)
        return Reply(200, {**kind, **headers}, body, stream, rated)
