"""The one governed path every cached API goes through (chat completions, embeddings,
Anthropic messages, OpenAI responses).

A request is authenticated, parsed and fingerprinted, then ONE Redis round trip brings
its key's revocation, the cache entry, the project's policy and the request-limit
verdict. A denied model is refused (403) before anything is served; a hit is served
from its stored bytes and counted with what it saved; a miss is admitted on its token
bound by the token limit, reserves its cost bound against the budget, joins or starts
the provider call (``origin.routing.coalescing``), and is settled to what the answer used. Usage is
counted in memory (``origin.governance.usage``); nothing here writes to Redis on a hit.

What differs between the APIs is data, an ``Api``: its path and parser, whether a request
may be cached (chat's ``classify``; a stateful Responses request never is), the
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

from mypy_extensions import mypyc_attr

from prism import (
    AuthenticationError,
    CacheDecision,
    CachePolicy,
    Envelope,
    Limits,
    PermissionDeniedError,
    Policy,
    PrismError,
    RateLimitError,
    RecentBodies,
    RecentEntries,
    error_json,
)
from prism import headers as h

# From their modules: a compiled module would bind ``prism.classify`` (the module) instead.
from prism.classify import classify
from prism.fingerprint import fingerprint
from prism.parsers import ParsedRequest

from ..auth import Caller, authenticate, check_forwarded_body
from ..gateway import Gateway
from ..governance.audit import audit_record
from ..governance.billing import Charge
from ..governance.project_policies import ProjectPolicies
from ..governance.rate_limiter import TokenCharge
from ..http.asgi import disconnected, read_body
from ..http.request import Request
from ..http.responses import RawHeaders, Reply
from ..providers.base import UpstreamCompletion
from ..routing.operation import Operation
from ..routing.shared_call import Call, Storage
from ..routing.subscription import ClientStream
from ..store.redis_cache import Lookup
from ..store.semantic import Pending, Question, SemanticCache

__all__ = ["CLIENT_GONE", "JSON", "SSE", "Api", "ApiRoute", "Asked"]

JSON = {"content-type": "application/json"}
SSE = {"content-type": "text/event-stream", "cache-control": "no-cache", "x-accel-buffering": "no"}
CLIENT_GONE = 499  # the client closed the connection before the answer (as nginx counts it)

R = TypeVar("R", bound=ParsedRequest)


def _no_usage_chunk(request: object) -> bool:
    return False


# A Python class even where this module is compiled: mypyc cannot build a generic dataclass
# as a native class (and its fields are read once per route, not per request).
@mypyc_attr(native_class=False)
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
    # Whether the request may be read from and written to the cache, and for how long.
    cache_decision: Callable[[R, str | None, CachePolicy], CacheDecision] = classify
    # Told (gateway, project, request, answer, provider) when a miss's own call answered.
    on_answer: Callable[[Gateway, str, R, UpstreamCompletion, str], None] | None = None


class Asked(Generic[R]):
    """One request on its way down the pipeline: who asked, what (parsed and
    fingerprinted), how it may be cached, and the headers its answer will carry."""

    __slots__ = ("caller", "decision", "fp", "out", "parsed", "rated", "request")

    def __init__(
        self, request: Request, caller: Caller, parsed: R, fp: str, decision: CacheDecision
    ) -> None:
        self.request = request
        self.caller = caller
        self.parsed = parsed
        self.fp = fp
        self.decision = decision
        self.out = {h.REQUEST_ID: request.id, h.CACHE_KEY: fp[: h.CACHE_KEY_PREFIX_LEN]}
        self.rated: RawHeaders | None = None  # the request rate limit's headers, when one applies


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
        self._path, self._key_header, self._classify = api.path, api.key_header, api.cache_decision
        self._bodies: RecentBodies[R] = RecentBodies()
        self._entries = RecentEntries()

    async def __call__(self, request: Request) -> Reply:
        asked = await self._read(request)
        caller = asked.caller
        # One round trip: the key's revocation, the entry, the policy, the rate verdict.
        lookup = await self.gw.cache.lookup(
            caller.key_id, asked.fp if asked.decision.read else None, caller.project, count=True
        )
        request.timer.mark("redis")
        leads = lookup.leads  # a miss whose lookup took its flight's lease: see _lead
        if leads:
            self._lead(asked, lookup)
        try:
            policy = self._admit(asked, lookup)
        except BaseException:
            if leads:
                self._let_go(asked, lookup)
            raise
        if policy is not None and policy.log is not None:
            request.log_rules = policy.log  # the request log reads it after the response
        if lookup.entry is not None:
            now = time.time()  # once: a clock read is not free on every machine
            envelope = self._entries.decode(lookup.entry, now)
            if envelope is not None and self._servable(envelope):
                request.usage = envelope.usage
                if caller.fingerprint is not None and not envelope.fallback:
                    # The edge writes KV with the time left (never a fallback's answer).
                    asked.out[h.ENTRY_EXPIRES] = str(envelope.expires_at())
                return self._hit(asked, envelope, "redis", now)
        # Not served from Redis: the semantic layer when the policy opts in, then the limits,
        # the budget and the provider call.
        cacheable = lookup.available and not asked.decision.bypass
        asked.out[h.CACHE_LAYER] = "miss" if cacheable else "bypass"
        pending: Pending | None = None
        # Only for a project whose policy opts in: any other request pays one attribute check.
        rules = policy.cache if policy is not None else None
        try:
            if rules is not None and rules.semantic and cacheable and self.gw.semantic is not None:
                found = await self._semantic(self.gw.semantic, rules.threshold, asked)
                if isinstance(found, Reply):
                    return found
                pending = found
            return await self._miss(asked, policy, lookup, cacheable, pending)
        finally:
            if leads:  # a no-op once the request's flight leads with it
                self._let_go(asked, lookup)

    def _lead(self, asked: Asked[R], lookup: Lookup) -> None:
        """The lease the lookup took, held for the flight this request starts (or one that
        starts here first: ``FlightLeases.adopt``)."""
        leases, flight = self.gw.flight_leases, lookup.flight
        if leases is not None and flight is not None:
            leases.taken(asked.fp, flight)

    def _let_go(self, asked: Asked[R], lookup: Lookup) -> None:
        """This request will not lead with the lease its lookup took: released now, so that
        no other process's identical request waits for it to lapse."""
        leases, flight = self.gw.flight_leases, lookup.flight
        if leases is not None and flight is not None:
            leases.let_go(asked.fp, flight)

    async def _read(self, request: Request) -> Asked[R]:
        """The request authenticated, its body parsed, fingerprinted and classified."""
        headers, gw, path = request.headers, self.gw, self._path
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
        request.timer.mark("auth")
        request.project = caller.project  # for the request log and the trace
        request.key_id = caller.key_id
        limits = gw.settings.limits
        raw = await read_body(request.receive, limits.max_body_bytes, headers.get("content-length"))
        known = self._bodies.get(caller.project, raw)
        if known is None:
            parsed = self.api.parse(raw, limits)
            fp = fingerprint(caller.project, path, parsed)
            self._bodies.put(caller.project, raw, parsed, fp)
        else:
            parsed, fp = known
        # A forward vouches for this body only: its signed fingerprint must be this one.
        check_forwarded_body(caller, fp, gw.metrics)
        decision = self._classify(parsed, headers.get("cache-control"), self.policy)
        request.timer.mark("parse")
        request.parsed = parsed
        request.fingerprint = fp
        return Asked(request, caller, parsed, fp, decision)

    def _admit(self, asked: Asked[R], lookup: Lookup) -> Policy | None:
        """What the lookup says of the caller: its key revoked, its model denied by the
        project's policy (both refused before anything is served), its request rate."""
        if lookup.revoked:
            raise AuthenticationError("This API key has been revoked.", code="key_revoked")
        caller = asked.caller
        try:
            policy = self.policies.resolve(caller.project, lookup)
            if policy is not None:
                policy.check_model(asked.parsed.model)
        except PermissionDeniedError as refusal:
            self._audit_refusal(caller, asked.parsed.model, refusal)
            raise
        if lookup.rate is not None:  # no call on the hot path when no limit applies
            asked.rated = self.limiter.check_requests(caller.project, caller.key_id, lookup.rate)
        return policy

    async def _miss(
        self,
        asked: Asked[R],
        policy: Policy | None,
        lookup: Lookup,
        cacheable: bool,
        pending: Pending | None,
    ) -> Reply:
        """The token limit and the budget, then the provider call (joined when one is
        running)."""
        caller, parsed = asked.caller, asked.parsed
        # The budget is the policy's, from the same lookup: none set, no Redis command here.
        budget = policy.budget if policy is not None else None
        rate_limits = policy.rate_limits if policy is not None else None
        limits_tokens = (
            rate_limits is not None
            and lookup.available
            and rate_limits.limits_tokens(caller.key_id)
        )
        bounds = (0, 0)
        if budget is not None or limits_tokens:
            bounds = (self.api.prompt_tokens(parsed), self.api.completion_tokens(parsed))
        # A request that joins the call in flight neither reserves budget nor takes tokens:
        # the call's starter pays. Its charge reserves nothing, so opening it never
        # suspends, and nothing else awaits up to the subscription: the call it found in
        # flight here is the one it joins.
        joins = (
            (budget is not None or limits_tokens)
            and asked.decision.read
            and asked.fp in self.gw.flights
        )
        tokens: TokenCharge | None = None
        try:
            if limits_tokens and not joins:
                # Tokens are limited on misses only: admitted on the request's bound now,
                # settled to its usage when the call ends.
                tokens = await self.limiter.admit_tokens(
                    caller.project, caller.key_id, *bounds, asked.out, asked.rated is not None
                )
            try:
                # The call's end settles the tokens with the budget (``Charge``): a client
                # that leaves early does not give back what the call goes on to use.
                charge = await self.billing.open(
                    caller.project,
                    caller.key_id,
                    parsed.model,
                    asked.out[h.CACHE_LAYER],
                    None if joins else budget,
                    bounds,
                    tokens,
                )
            except (RateLimitError, PermissionDeniedError) as refusal:
                self._audit_refusal(caller, parsed.model, refusal, "budget.refuse")
                raise
            asked.request.charge = charge  # for the access log and the trace
            return await self._call(asked, cacheable, charge, pending, lookup)
        except BaseException:
            if tokens is not None:  # no call, or it failed: a no-op once the call settled
                tokens.settle(None)
            raise

    async def _semantic(
        self, semantic: SemanticCache, threshold: float, asked: Asked[R]
    ) -> Reply | Pending | None:
        """A paraphrase's answer from the semantic layer (a hit: nothing spent, like a
        Redis hit), or the question for the miss to index once its answer is stored
        (None: the request is not a question, or the API has no semantic layer)."""
        question = self.api.question
        caller, decision = asked.caller, asked.decision
        asked_question = (
            question(caller.project, self._path, asked.parsed) if question is not None else None
        )
        if asked_question is None or not semantic.available:
            return None
        if not decision.read:
            return semantic.pending(asked_question) if decision.write else None
        match, pending = await semantic.lookup(asked_question, threshold)
        asked.request.timer.mark("semantic")
        if match is None or not self._servable(match.envelope):
            return pending
        asked.out[h.CACHE_KEY] = match.fingerprint[: h.CACHE_KEY_PREFIX_LEN]
        asked.out[h.SEMANTIC_SCORE] = f"{match.score:.4f}"
        return self._hit(asked, match.envelope, "semantic", time.time())

    def _servable(self, envelope: Envelope) -> bool:
        """A stored answer may be served: any but a fallback's once its route's primary is
        healthy again (then the miss asks the primary, whose answer replaces it)."""
        return not envelope.fallback or not self.gw.router.primary_healthy(envelope.model)

    def _hit(self, asked: Asked[R], envelope: Envelope, layer: str, now: float) -> Reply:
        """A stored answer (from Redis or the semantic layer): nothing spent, its savings
        counted, replayed as its stream when the client streams."""
        caller, parsed, out = asked.caller, asked.parsed, asked.out
        asked.request.hit_cost = self.billing.hit(
            caller.project, caller.key_id, parsed.model, envelope, now, layer
        )
        out[h.CACHE_LAYER] = layer
        out[h.SERVER_TIMING] = h.server_timing(asked.request.timer.stages)
        if parsed.stream:
            body = self.api.stream_hit(envelope, parsed)
            return Reply(200, {**SSE, **out}, body, None, asked.rated)
        return Reply(200, {**JSON, **out}, envelope.body, None, asked.rated)

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
        asked: Asked[R],
        cacheable: bool,
        charge: Charge,
        semantic: Pending | None,
        lookup: Lookup,
    ) -> Reply:
        gw, parsed, decision, headers = self.gw, asked.parsed, asked.decision, asked.out
        storage = (
            Storage(asked.fp, decision.ttl, semantic) if cacheable and decision.write else None
        )
        call = Call(
            op=self.api.op,
            body=parsed.body,
            model=parsed.model,
            stream=parsed.stream,
            request_id=asked.request.id,
            storage=storage,
            on_end=charge,
            on_answer=None
            if self.api.on_answer is None
            else functools.partial(self.api.on_answer, gw, asked.caller.project, parsed),
            flight=lookup.flight,
        )
        # Join only requests that would accept a cached answer anyway; Redis being down
        # is no reason to call the provider once per identical request.
        key = asked.fp if decision.read else None
        client_gone = functools.partial(disconnected, asked.request.receive)
        async with gw.flights.subscribe(key, call) as subscription:
            asked.request.attempts = subscription.attempts  # filled as the call goes
            if subscription.call is not call:
                charge.joined()
                asked.request.joined = True
                if lookup.leads:  # joined a flight running here: the lease is not needed
                    self._let_go(asked, lookup)
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
            asked.request.timer.mark("upstream")
            headers[h.PROVIDER] = subscription.provider
        headers[h.SERVER_TIMING] = h.server_timing(asked.request.timer.stages)
        return Reply(200, {**kind, **headers}, body, stream, asked.rated)
