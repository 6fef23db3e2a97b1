"""The edge's request logic, runtime-neutral: it sees the Worker only through ``Platform``.

route (a fixed table, ``edge.routes``) → auth (signature, no I/O; revocation memoized)
→ the route: a cached API's pipeline (``edge.pipeline``, over the API's description in
``edge.apis``) or the model list (``edge.models``). Every answer, errors included, gets
the request id and the Server-Timing of the stages that ran; an error is rendered in
the format of the route it was sent to (Anthropic's on its route).
"""

from __future__ import annotations

import itertools
import secrets

from prism import (
    AuthenticationError,
    KeyIdentity,
    MethodNotAllowedError,
    NotFoundError,
    PrismError,
    bearer_token,
    error_json,
)
from prism import headers as h
from prism.routes import MODELS_PATH

from .apis import CACHED_APIS
from .deadlines import DeadlineTimer
from .forward import OriginForwarder
from .models import ModelsRoute
from .origins import Origins
from .pipeline import CachedApiRoute
from .platform import EdgeRequest, EdgeResponse, Platform
from .policy_cache import PolicyCache
from .request_log import EdgeRequestLog, RequestNote
from .revocation import RevocationSet
from .routes import ROUTES, STORED_RESPONSES, EdgeRoute, canonical_path
from .settings import EdgeSettings
from .stored_responses import StoredResponsesRoute
from .timings import Timings, elapsed_ms, origin_stages, survived

__all__ = ["EdgeHandler"]

JSON = "application/json"


class EdgeHandler:
    """One per isolate: the settings, the memoized revocation set and policies, the
    origins, and one route per path (each API's with what this isolate has recently
    parsed and decoded for it: an isolate serves many requests in turn)."""

    def __init__(self, settings: EdgeSettings) -> None:
        self.settings = settings
        self.revoked = RevocationSet(settings.revocation_ttl)
        self.policies = PolicyCache(settings.policy_ttl)
        # While one request tries an origin again, the others avoid it until its probe
        # has had time to tell.
        trial = settings.origin_probe_after + settings.origin_probe_timeout + 2.0
        self.origins = Origins(
            settings.origins, settings.origin_avoid, trial, settings.origin_recheck
        )
        # One timer per request for every stage's limit (see edge/deadlines.py).
        stages = DeadlineTimer(
            min(settings.kv_timeout, settings.body_timeout, settings.origin_timeout)
        )
        forwarder = OriginForwarder(settings, self.origins, stages)
        routes: dict[str, EdgeRoute] = {
            api.path: CachedApiRoute(api, settings, self.policies, forwarder, stages)
            for api in CACHED_APIS
        }
        routes[MODELS_PATH] = ModelsRoute(settings, self.policies, forwarder, stages)
        routes[STORED_RESPONSES] = StoredResponsesRoute(forwarder)
        if routes.keys() != ROUTES.keys():
            raise RuntimeError(f"edge routes {sorted(routes)} are not the table's")
        self.routes = routes
        # What this isolate answers itself is told to the origin (edge/request_log.py).
        self.request_log = (
            EdgeRequestLog(settings.forward_secret, self.origins) if settings.request_log else None
        )
        self._key_ring = settings.key_ring
        # Request ids need to be unique, not secret: a random prefix per isolate and a counter.
        self._id_prefix = secrets.token_hex(4)
        self._ids = itertools.count(1)

    async def handle(self, request: EdgeRequest, platform: Platform) -> EdgeResponse:
        request_id = request.headers.get(h.REQUEST_ID) or f"{self._id_prefix}{next(self._ids):08x}"
        timings: Timings = []
        note = RequestNote(request_id, timings)
        path = canonical_path(request.path)
        route = None if path is None else self.routes[path]
        failure: PrismError | None = None
        try:
            if route is None:
                raise NotFoundError(f"Unknown route {request.method} {request.path[:200]}.")
            response = await self._serve(route, request, platform, note)
        except PrismError as error:
            failure = error
            response = _error_response(error, route)
        except Exception as error:  # a bug still answers in the API's format, and is told
            platform.log_error(f"prism edge: request {request_id} failed: {error!r}")
            failure = PrismError("The gateway failed unexpectedly.")
            response = _error_response(failure, route)
        response.headers[h.REQUEST_ID] = request_id
        edge_timing = h.server_timing(timings)
        origin_timing = response.headers.get(h.SERVER_TIMING)
        response.headers[h.SERVER_TIMING] = (
            f"{edge_timing}, {origin_stages(origin_timing)}" if origin_timing else edge_timing
        )
        log = self.request_log
        if (
            log is not None
            and path is not None
            and origin_timing is None
            and response.passthrough is None
        ):  # a route's request answered here (the origin logs what it answered): sent after
            log.add(note, request.method, path, response, failure, edge_timing, platform.now())
            log.send_soon(platform)
        return response

    async def _serve(
        self,
        route: EdgeRoute,
        request: EdgeRequest,
        platform: Platform,
        note: RequestNote,
    ) -> EdgeResponse:
        if request.method not in route.methods:
            raise MethodNotAllowedError(f"Method {request.method[:20]} is not allowed here.")
        started = platform.now()
        try:
            identity = await self._identify(route, request, platform, note)
        finally:  # a refused key's too: the one stage its record has
            note.timings.append(("auth", elapsed_ms(started, platform.now())))
        note.project, note.key_id = identity.project, identity.key_id
        return await route.serve(request, platform, identity, note)

    async def _identify(
        self, route: EdgeRoute, request: EdgeRequest, platform: Platform, note: RequestNote
    ) -> KeyIdentity:
        """The caller's verified, unrevoked key, or a refusal (401)."""
        key = bearer_token(request.headers.get("authorization"))
        if not key and route.key_header is not None:  # e.g. Anthropic's clients: x-api-key
            key = request.headers.get(route.key_header, "").strip(" \t")
        identity = self._key_ring.verify(key)
        try:
            revoked = await self.revoked.contains(identity.key_id, platform.now(), platform.kv_get)
        except Exception as error:  # KV failing: the last known set still holds
            survived("revocation", error, note.id, platform, note.timings)
            revoked = identity.key_id in self.revoked
        if revoked:
            raise AuthenticationError("This API key has been revoked.", code="key_revoked")
        return identity


def _error_response(error: PrismError, route: EdgeRoute | None) -> EdgeResponse:
    """``error`` in the format of ``route`` (Anthropic's on its route; OpenAI's off any)."""
    headers = {"content-type": JSON, **error.headers, h.CACHE_LAYER: "bypass"}
    body = error_json(error) if route is None else route.error_body(error)
    return EdgeResponse(error.status, headers, body)
