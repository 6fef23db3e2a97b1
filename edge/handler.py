"""The edge's request logic, runtime-neutral: it sees the Worker only through ``Platform``.

route (a fixed table) → auth (signature, no I/O; revocation memoized) → body
(bytes, bounded in size and time) → parse → the project's model policy (memoized;
a denied model is a 403 here, before any entry is read) →
fingerprint → KV read (bounded) → hit: answer at the PoP; miss: forward to the
origin, signed, and stream its answer back untouched. When the origin answered
from Redis, the entry is written to KV in the background so the next request
stays at the PoP.
"""

from __future__ import annotations

import itertools
import secrets

from prism import (
    AuthenticationError,
    ChatRequest,
    InvalidRequestError,
    KeyIdentity,
    MethodNotAllowedError,
    NotFoundError,
    Policy,
    PrismError,
    RecentBodies,
    RecentEntries,
    RequestTimeoutError,
    RequestTooLargeError,
    UpstreamError,
    UpstreamTimeoutError,
    bearer_token,
    classify,
    encode_envelope,
    entry_key,
    fingerprint,
    parse_chat_request,
    replay,
    sign_forward,
)
from prism import headers as h
from prism.routes import CHAT_PATH, MESSAGES_PATH, MODELS_PATH
from prism.trace_context import TRACEPARENT, edge_trace_headers

from .apis import APIS, ApiRoutes, error_format
from .deadlines import DeadlineTimer
from .models import ModelList, models_response
from .origins import ORIGIN_DOWN, Origins
from .platform import EdgeRequest, EdgeResponse, Platform
from .policy_cache import PolicyCache
from .revocation import RevocationSet
from .routes import ROUTES, canonical_path
from .settings import EdgeSettings

__all__ = ["EdgeHandler"]

JSON = "application/json"
SSE = "text/event-stream"
_MIN_KV_TTL = 60
# Request headers the origin may need; everything else (cookies, the API key) stays here.
_FORWARDED = ("content-type", "cache-control", "accept", "openai-organization")
# Failing over after a timeout stays under the ~100 s Cloudflare allows a response to
# start; a failover gets at least this much time, else the last failure is the answer.
_ORIGIN_BUDGET = 95.0
_MIN_ATTEMPT = 1.0


class EdgeHandler:
    """One per isolate: the settings, the memoized revocation set, and what this isolate
    has recently parsed and decoded (an isolate serves many requests in turn)."""

    def __init__(self, settings: EdgeSettings) -> None:
        self.settings = settings
        self.revoked = RevocationSet(settings.revocation_ttl)
        self.policies = PolicyCache(settings.policy_ttl)
        self.origins = Origins(settings.origins, settings.origin_avoid)
        self._bodies: RecentBodies[ChatRequest] = RecentBodies(size=256)
        self._entries = RecentEntries(size=64)
        self.apis = ApiRoutes()  # the other cached routes (embeddings, messages)
        self.models = ModelList(settings.models_ttl)
        # One timer per request for every stage's limit (see edge/deadlines.py).
        self._stages = DeadlineTimer(
            min(settings.kv_timeout, settings.body_timeout, settings.origin_timeout)
        )
        # Request ids need to be unique, not secret: a random prefix per isolate and a counter.
        self._id_prefix = secrets.token_hex(4)
        self._ids = itertools.count(1)

    async def handle(self, request: EdgeRequest, platform: Platform) -> EdgeResponse:
        request_id = request.headers.get(h.REQUEST_ID) or f"{self._id_prefix}{next(self._ids):08x}"
        timings: list[tuple[str, float]] = []
        try:
            response = await self._route(request, platform, timings, request_id)
        except PrismError as error:
            response = _error_response(error, request.path)
        except Exception as error:  # a bug still answers in the API's format, and is told
            platform.log_error(f"prism edge: request {request_id} failed: {error!r}")
            failed = PrismError("The gateway failed unexpectedly.")
            response = _error_response(failed, request.path)
        response.headers[h.REQUEST_ID] = request_id
        edge_timing = h.server_timing(timings)
        origin_timing = response.headers.get(h.SERVER_TIMING)
        response.headers[h.SERVER_TIMING] = (
            f"{edge_timing}, {_prefixed(origin_timing)}" if origin_timing else edge_timing
        )
        return response

    async def _route(
        self,
        request: EdgeRequest,
        platform: Platform,
        timings: list[tuple[str, float]],
        request_id: str,
    ) -> EdgeResponse:
        path = canonical_path(request.path)
        if path is None:
            raise NotFoundError(f"Unknown route {request.method} {request.path[:200]}.")
        if request.method != ROUTES[path]:
            raise MethodNotAllowedError(f"Method {request.method[:20]} is not allowed here.")
        started = platform.now()
        key = bearer_token(request.headers.get("authorization"))
        if not key and path == MESSAGES_PATH:  # Anthropic's clients send x-api-key
            key = request.headers.get("x-api-key", "").strip(" \t")
        identity = self.settings.key_ring.verify(key)
        try:
            revoked = await self.revoked.contains(identity.key_id, platform.now(), platform.kv_get)
        except Exception as error:  # KV failing: the last known set still holds
            _failed("revocation", error, request_id, platform, timings)
            revoked = identity.key_id in self.revoked
        if revoked:
            raise AuthenticationError("This API key has been revoked.", code="key_revoked")
        timings.append(("auth", _ms(started, platform.now())))
        if path != CHAT_PATH:
            api = APIS.get(path)
            if api is not None:
                return await self.apis.serve(
                    self, api, request, platform, identity, timings, request_id
                )
            # ``no-cache`` asks the origin itself (``prism status`` proves the path so).
            if path == MODELS_PATH and "no-cache" not in request.headers.get("cache-control", ""):
                listed = await self._models(platform, identity, timings, request_id)
                if listed is not None:
                    return listed
            return await self._forward(
                request.method, path, request, platform, identity, "", None, timings
            )
        return await self._chat(request, platform, identity, timings, request_id)

    async def _chat(
        self,
        request: EdgeRequest,
        platform: Platform,
        identity: KeyIdentity,
        timings: list[tuple[str, float]],
        request_id: str,
    ) -> EdgeResponse:
        project = identity.project
        started = platform.now()
        body = await self._read_body(request, platform)
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
        policy = await self.project_policy(project, platform, timings, request_id)
        if policy is not None:
            policy.check_model(chat.model)  # before any entry: a denied model is never served
        headers = {h.CACHE_KEY: fp[: h.CACHE_KEY_PREFIX_LEN]}
        if decision.read:
            started = platform.now()
            try:
                async with self._stages.within(self.settings.kv_timeout):
                    cached = await platform.kv_get(entry_key(fp))
            except Exception as error:  # slow or failing KV is a miss, never a failed request
                cached = None
                _failed("kv", error, request_id, platform, timings)
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
        response = await self._forward(
            "POST", CHAT_PATH, request, platform, identity, fp, body, timings
        )
        if not chat.stream and decision.write:
            await self.keep_redis_hit(response, platform, fp, chat.model)
        return response

    async def keep_redis_hit(
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
            data = encode_envelope(text.encode(), model=model, ttl=ttl, created=int(platform.now()))
            platform.wait_until(platform.kv_put(entry_key(fp), data.decode(), ttl))

    async def _models(
        self,
        platform: Platform,
        identity: KeyIdentity,
        timings: list[tuple[str, float]],
        request_id: str,
    ) -> EdgeResponse | None:
        """The published model list as the project's policy allows it; None: ask the origin."""
        started = platform.now()
        timeout = self.settings.kv_timeout
        try:
            async with self._stages.within(timeout):
                policy = await self.policies.get(identity.project, platform.now(), platform.kv_get)
        except Exception as error:  # the origin answers with the policy it reads itself
            _failed("policy", error, request_id, platform, timings)
            return None
        try:
            async with self._stages.within(timeout):
                body = await self.models.body(platform.now(), platform.kv_get, policy)
        except Exception as error:  # KV failing: the origin answers
            _failed("models", error, request_id, platform, timings)
            return None
        timings.append(("kv", _ms(started, platform.now())))
        return None if body is None else models_response(body)

    async def _read_body(self, request: EdgeRequest, platform: Platform) -> bytes:
        """The body's bytes, read only up to the limit and within the body timeout."""
        limit = self.settings.limits.max_body_bytes
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
            async with self._stages.within(self.settings.body_timeout):
                body = await platform.read_body(limit, length)
        except TimeoutError:
            raise RequestTimeoutError(
                "The request body did not arrive in time "
                f"({self.settings.body_timeout * 1000:.0f} ms)."
            ) from None
        if len(body) > limit:
            raise RequestTooLargeError(f"Request body exceeds the limit of {limit} bytes.")
        return body

    async def project_policy(
        self, project: str, platform: Platform, timings: list[tuple[str, float]], request_id: str
    ) -> Policy | None:
        """The project's policy as this isolate knows it: read from KV when stale, the last
        one known while KV fails (the origin checks again anyway)."""
        policy = self.policies.last(project)
        if not self.policies.fresh(project, platform.now()):
            try:
                async with self._stages.within(self.settings.kv_timeout):
                    policy = await self.policies.get(project, platform.now(), platform.kv_get)
            except Exception as error:
                _failed("policy", error, request_id, platform, timings)
                policy = self.policies.last(project)
        return policy

    async def _forward(
        self,
        method: str,
        path: str,
        request: EdgeRequest,
        platform: Platform,
        identity: KeyIdentity,
        fp: str,
        body: bytes | None,
        timings: list[tuple[str, float]],
    ) -> EdgeResponse:
        """``method path`` at the origin (the route's own spelling, no query: the API
        routes take none), signed for exactly that method, path and fingerprint."""
        headers = {name: request.headers[name] for name in _FORWARDED if name in request.headers}
        if h.REQUEST_ID in request.headers:
            headers[h.REQUEST_ID] = request.headers[h.REQUEST_ID]
        started = platform.now()
        if self.settings.trace:
            # The edge's span in the request's trace: the client's traceparent continued (or
            # a new trace), and its stages so far for the origin to rebuild it from.
            headers.update(edge_trace_headers(request.headers.get(TRACEPARENT), started, timings))
        elif TRACEPARENT in request.headers:  # the origin's spans join the client's trace
            headers[TRACEPARENT] = request.headers[TRACEPARENT]
        # Nearest origin first; the next one when it does not answer (see edge/origins.py).
        plan = self.origins.plan(platform.location, started)
        deadline = started + max(self.settings.origin_timeout, _ORIGIN_BUDGET)
        for attempt, origin in enumerate(plan, 1):
            tried = platform.now()
            # Signed per attempt: the header lives a few seconds, a failover may come later.
            headers[h.FORWARD] = sign_forward(
                self.settings.forward_secret,
                method=method,
                path=path,
                project=identity.project,
                key_id=identity.key_id,
                fingerprint=fp,
                now=tried,
            )
            last = attempt == len(plan)
            wait = min(self.settings.origin_timeout, deadline - tried)
            try:
                async with self._stages.within(wait):
                    reply = await platform.fetch_origin(method, origin.url + path, headers, body)
            except TimeoutError:
                failure: UpstreamError = UpstreamTimeoutError(
                    f"The Prism origin did not start its answer in time ({wait:g} s).",
                    code="origin_timeout",
                )
            except Exception:
                failure = UpstreamError(
                    "The Prism origin is unreachable from this edge.", code="origin_unreachable"
                )
            else:
                # Any answer but a 502/503/504 without the origin's own headers (which never
                # reached Prism: a proxy in front of it says the origin is down) is final.
                if reply.status not in ORIGIN_DOWN or reply.header(h.CACHE_LAYER) is not None:
                    self.origins.answered(origin)
                    break
                if last:  # every origin is down: the last one's reply is passed on as it is
                    self.origins.failed(origin, platform.now())
                    break
                failure = UpstreamError("The Prism origin is down.", code="origin_unreachable")
            self.origins.failed(origin, platform.now())
            if origin.region:
                timings.append((f'origin-error;desc="{origin.region}"', _ms(tried, platform.now())))
            if last or deadline - platform.now() < _MIN_ATTEMPT:
                raise failure
        timings.append(
            (
                f'origin;desc="{origin.region}"' if origin.region else "origin",
                _ms(tried, platform.now()),
            )
        )
        out = reply.headers()
        out.pop("content-length", None)  # the runtime sets it for what it actually sends
        out.pop(h.ENTRY_EXPIRES, None)  # for this edge only (read from the reply itself)
        out.setdefault(h.CACHE_LAYER, "bypass")
        if origin.region:
            out[h.ORIGIN_REGION] = origin.region
        # A semantic hit names the entry that answered (another question's), as the origin said.
        if fp and out[h.CACHE_LAYER] != "semantic":
            out[h.CACHE_KEY] = fp[: h.CACHE_KEY_PREFIX_LEN]
        return EdgeResponse(reply.status, out, passthrough=reply)


def _error_response(error: PrismError, path: str) -> EdgeResponse:
    """``error`` in the format of the route ``path`` names (Anthropic's on its route)."""
    headers = {"content-type": JSON, **error.headers, h.CACHE_LAYER: "bypass"}
    return EdgeResponse(error.status, headers, error_format(canonical_path(path))(error))


def _failed(
    stage: str,
    error: Exception,
    request_id: str,
    platform: Platform,
    timings: list[tuple[str, float]],
) -> None:
    """A dependency failure the request survives: logged, and named in Server-Timing as
    ``{stage}-error`` (``kv-error``, ``revocation-error``) so a client can see it too."""
    what = "timed out" if isinstance(error, TimeoutError) else f"failed: {error!r}"
    platform.log_error(f"prism edge: request {request_id}: {stage} {what}")
    timings.append((f"{stage}-error", 0.0))


def _ms(started: float, ended: float) -> float:
    # The Workers clock moves only across I/O and is coarse: never report a negative stage.
    return max(0.0, (ended - started) * 1000)


def _prefixed(timing: str) -> str:
    """The origin's Server-Timing stages, renamed ``origin-*`` next to the edge's own."""
    return ", ".join(f"origin-{part.strip()}" for part in timing.split(",") if part.strip())
