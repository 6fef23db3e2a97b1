"""The cached API routes other than chat completions, at the edge: embeddings and
Anthropic messages.

The same steps as the handler's chat path (body, parse, the project's model policy,
fingerprint, KV read, hit at the PoP or a signed forward, the KV write after a Redis
hit), over an ``EdgeApi``: its path, parser, stream replay and error format. Chat keeps
its own path in ``edge.handler``, so nothing here adds work to a chat request.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prism import (
    Envelope,
    KeyIdentity,
    Limits,
    PrismError,
    RecentBodies,
    RecentEntries,
    classify,
    entry_key,
    error_json,
    fingerprint,
)
from prism import headers as h
from prism.embeddings_request import parse_embeddings_request
from prism.messages_request import parse_messages_request
from prism.messages_sse import anthropic_error_json, replay_message
from prism.parsers import ParsedRequest
from prism.routes import EMBEDDINGS_PATH, MESSAGES_PATH

from .platform import EdgeRequest, EdgeResponse, Platform

if TYPE_CHECKING:
    from .handler import EdgeHandler

__all__ = ["APIS", "ApiRoutes", "EdgeApi", "error_format"]

_JSON = "application/json"
_SSE = "text/event-stream"


def _replay_message(envelope: Envelope) -> bytes:
    return replay_message(envelope.completion())


@dataclass(frozen=True, slots=True)
class EdgeApi:
    path: str
    parse: Callable[[bytes, Limits], ParsedRequest]
    replay: Callable[[Envelope], bytes] | None  # a stored answer as this API's stream
    error_json: Callable[[PrismError], bytes]


APIS: dict[str, EdgeApi] = {
    EMBEDDINGS_PATH: EdgeApi(EMBEDDINGS_PATH, parse_embeddings_request, None, error_json),
    MESSAGES_PATH: EdgeApi(
        MESSAGES_PATH, parse_messages_request, _replay_message, anthropic_error_json
    ),
}


def error_format(path: str | None) -> Callable[[PrismError], bytes]:
    """How errors look on the (canonical) route ``path``: Anthropic's on its route."""
    api = APIS.get(path) if path is not None else None
    return error_json if api is None else api.error_json


class ApiRoutes:
    """Per isolate: what each API route has recently parsed and decoded."""

    def __init__(self) -> None:
        self._bodies: dict[str, RecentBodies[ParsedRequest]] = {
            path: RecentBodies(64) for path in APIS
        }
        self._entries = RecentEntries(size=32)

    async def serve(
        self,
        handler: EdgeHandler,
        api: EdgeApi,
        request: EdgeRequest,
        platform: Platform,
        identity: KeyIdentity,
        timings: list[tuple[str, float]],
        request_id: str,
    ) -> EdgeResponse:
        project = identity.project
        started = platform.now()
        body = await handler._read_body(request, platform)
        memo = self._bodies[api.path]
        known = memo.get(project, body)
        if known is None:
            parsed = api.parse(body, handler.settings.limits)
            fp = fingerprint(project, api.path, parsed)
            memo.put(project, body, parsed, fp)
        else:
            parsed, fp = known
        decision = classify(parsed, request.headers.get("cache-control"))
        timings.append(("parse", _ms(started, platform.now())))
        policy = await handler.project_policy(project, platform, timings, request_id)
        if policy is not None:
            policy.check_model(parsed.model)
        headers = {h.CACHE_KEY: fp[: h.CACHE_KEY_PREFIX_LEN]}
        if decision.read:
            started = platform.now()
            try:
                async with handler._stages.within(handler.settings.kv_timeout):
                    cached = await platform.kv_get(entry_key(fp))
            except Exception as error:  # slow or failing KV is a miss, never a failed request
                cached = None
                _failed(handler, "kv", error, request_id, platform, timings)
            timings.append(("kv", _ms(started, platform.now())))
            envelope = self._entries.decode(cached, platform.now()) if cached else None
            if envelope is not None:
                headers[h.CACHE_LAYER] = "kv"
                if parsed.stream and api.replay is not None:
                    headers["content-type"] = _SSE
                    headers["cache-control"] = "no-cache"
                    return EdgeResponse(200, headers, api.replay(envelope))
                headers["content-type"] = _JSON
                return EdgeResponse(200, headers, envelope.body)
        response = await handler._forward(
            "POST", api.path, request, platform, identity, fp, body, timings
        )
        if not parsed.stream and decision.write:
            await handler.keep_redis_hit(response, platform, fp, parsed.model)
        return response


def _failed(
    handler: EdgeHandler,
    stage: str,
    error: Exception,
    request_id: str,
    platform: Platform,
    timings: list[tuple[str, float]],
) -> None:
    what = "timed out" if isinstance(error, TimeoutError) else f"failed: {error!r}"
    platform.log_error(f"prism edge: request {request_id}: {stage} {what}")
    timings.append((f"{stage}-error", 0.0))


def _ms(started: float, ended: float) -> float:
    return max(0.0, (ended - started) * 1000)
