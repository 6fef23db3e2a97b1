"""``GET /v1/models`` at the PoP: the list the origin publishes to Workers KV, filtered by
the project's model policy, with no trip to the origin.

The list is read at most once per ``ttl`` per isolate, like the revoked set; while KV
has none (an origin without KV replication, or not yet published) or cannot be read,
the request is forwarded to the origin as before, and so is one sent with
``cache-control: no-cache`` (it asks the origin itself: ``prism status`` proves the
path so).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from prism import KeyIdentity, Policy, PrismError, error_json
from prism import headers as h
from prism.routes import MODELS_KEY, MODELS_PATH

from .deadlines import DeadlineTimer
from .forward import OriginForwarder
from .platform import EdgeRequest, EdgeResponse, Platform
from .policy_cache import PolicyCache
from .request_log import RequestNote
from .routes import ROUTES
from .settings import EdgeSettings
from .timings import Timings, elapsed_ms, survived

__all__ = ["ModelList", "ModelsRoute", "models_response"]

_ENCODE = json.JSONEncoder(separators=(",", ":")).encode


class ModelList:
    """The origin's published model list, memoized per isolate, rendered once per policy."""

    def __init__(self, ttl: float) -> None:
        self._ttl = ttl
        self._fetched_at = float("-inf")
        self._raw: str | None = None
        self._entries: list[dict[str, Any]] = []
        self._bodies: dict[Policy | None, bytes] = {}

    async def _refresh(self, now: float, kv_get: Callable[[str], Awaitable[str | None]]) -> None:
        self._fetched_at = now  # also on failure: a broken KV is not asked again per request
        raw = await kv_get(MODELS_KEY)
        if raw == self._raw:
            return
        entries: list[dict[str, Any]] = []
        if raw:
            data = json.loads(raw)
            listed = data.get("data") if isinstance(data, dict) else None
            if not isinstance(listed, list):
                raise ValueError("the published model list is not an OpenAI model list")
            entries = [e for e in listed if isinstance(e, dict) and isinstance(e.get("id"), str)]
        self._raw, self._entries, self._bodies = raw, entries, {}

    async def body(
        self,
        now: float,
        kv_get: Callable[[str], Awaitable[str | None]],
        policy: Policy | None,
    ) -> bytes | None:
        """The list as ``policy`` allows it, or None when KV has no list (or a refresh
        failed before any was read): then the origin answers."""
        if now - self._fetched_at >= self._ttl:
            await self._refresh(now, kv_get)
        if self._raw is None:
            return None
        body = self._bodies.get(policy)
        if body is None:
            allowed = [e for e in self._entries if policy is None or policy.allows(e["id"])]
            if len(self._bodies) >= 64:
                self._bodies.clear()
            body = self._bodies[policy] = _ENCODE({"object": "list", "data": allowed}).encode()
        return body


def models_response(body: bytes) -> EdgeResponse:
    return EdgeResponse(200, {"content-type": "application/json", h.CACHE_LAYER: "kv"}, body)


class ModelsRoute:
    """``GET /v1/models`` for the handler: the published list, or the origin's answer."""

    __slots__ = ("_forwarder", "_kv_timeout", "_models", "_policies", "_stages", "error_body",
                 "key_header", "methods")  # fmt: skip

    def __init__(
        self,
        settings: EdgeSettings,
        policies: PolicyCache,
        forwarder: OriginForwarder,
        stages: DeadlineTimer,
    ) -> None:
        self.methods = ROUTES[MODELS_PATH]
        self.key_header: str | None = None
        self.error_body: Callable[[PrismError], bytes] = error_json
        self._models = ModelList(settings.models_ttl)
        self._kv_timeout = settings.kv_timeout
        self._policies = policies
        self._forwarder = forwarder
        self._stages = stages

    async def serve(
        self,
        request: EdgeRequest,
        platform: Platform,
        identity: KeyIdentity,
        note: RequestNote,
    ) -> EdgeResponse:
        if "no-cache" not in request.headers.get("cache-control", ""):
            listed = await self._published(platform, identity, note.timings, note.id)
            if listed is not None:
                return listed
        return await self._forwarder.forward(
            "GET", MODELS_PATH, request, platform, identity, "", None, note
        )

    async def _published(
        self, platform: Platform, identity: KeyIdentity, timings: Timings, request_id: str
    ) -> EdgeResponse | None:
        """The published model list as the project's policy allows it; None: ask the origin."""
        started = platform.now()
        timeout = self._kv_timeout
        try:
            async with self._stages.within(timeout):
                policy = await self._policies.get(identity.project, platform.now(), platform.kv_get)
        except Exception as error:  # the origin answers with the policy it reads itself
            survived("policy", error, request_id, platform, timings)
            return None
        try:
            async with self._stages.within(timeout):
                body = await self._models.body(platform.now(), platform.kv_get, policy)
        except Exception as error:  # KV failing: the origin answers
            survived("models", error, request_id, platform, timings)
            return None
        timings.append(("kv", elapsed_ms(started, platform.now())))
        return None if body is None else models_response(body)
