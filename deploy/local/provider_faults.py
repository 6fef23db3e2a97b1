"""Fault injection, accounting and error bodies for the local provider.

Faults are queued out-of-band through ``/_control/faults`` (the gateway under
test does not forward arbitrary client headers) or set per request with
``x-fault-*`` headers when a test calls the provider directly. All state is
per app instance and only touched from the server's event loop, so the
check-and-decrement in ``FaultQueue.take`` cannot race.

Modes: ``status`` (an error status), ``rate_limit`` (429 with ``Retry-After``),
``stall_before_first_byte`` (silence, then the answer), ``stall_after_headers``
(headers, silence, then the answer), ``stall_mid_stream``, ``truncated_stream``
(part of the answer and no end; ``abort=1`` also drops the connection),
``no_done`` (a stream whose choices all finish, ending cleanly without ``[DONE]``),
``error_event`` (a 200 stream whose first event is the API's error event, as Anthropic
reports an overload), ``malformed_json`` and ``latency``. A queued fault with
``probability`` hits that share of requests, drawn from a generator seeded with ``seed``.
A stall before the first byte (``stall_before_first_byte``) and a stream's stall
(``stall_after_headers``, ``stall_mid_stream``) last ``seconds`` or until ``/_control/release``,
whichever comes first; a release ends the stall before the first byte of every request
received before it, even one that had not reached its stall yet.

A fault queued with ``"endpoint": "models"`` is for the model lists (``GET /v1/models``,
either API's) instead of the chat requests: ``status``, ``rate_limit``, ``malformed_json``,
``latency`` and the stalls apply to it as to a JSON answer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx
import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

__all__ = [
    "FAULT_MODES",
    "Api",
    "Fault",
    "FaultQueue",
    "ProviderControl",
    "ProviderState",
    "ProviderStats",
    "control_routes",
    "error_response",
    "fault_error_response",
    "header_fault",
    "json_response",
]

Api = Literal["openai", "anthropic", "azure"]

FAULT_MODES = frozenset(
    {
        "status",
        "rate_limit",
        "stall_before_first_byte",
        "stall_mid_stream",
        "malformed_json",
        "truncated_stream",
        "latency",
        "stall_after_headers",
        "no_done",
        "error_event",
    }
)

_RECENT_REQUESTS = 64
# Per-request records kept for ``GET /_control/log``: a benchmark scenario's worth, a few MB.
_LOG_REQUESTS = 50_000


@dataclass(frozen=True, slots=True)
class Fault:
    """One injected fault; only the fields its ``mode`` uses matter."""

    mode: str
    status: int = 500
    retry_after: float = 1.0
    seconds: float = 5.0
    ms: float = 0.0
    # Events sent before a mid-stream stall or a truncation (role chunk included).
    after_chunks: int = 2
    message: str = "Injected fault from the local provider"
    # Queued faults: the share of requests that get it, drawn from a generator seeded with
    # ``seed``, so a run is reproducible; ``count`` then counts the requests that got it.
    probability: float = 1.0
    seed: int = 0
    # truncated_stream: 1 = drop the connection after the partial body instead of ending the
    # HTTP response cleanly (no chunked terminator, or fewer bytes than Content-Length).
    abort: int = 0

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> Fault:
        """Build from JSON or header values; raise ValueError on anything unknown."""
        mode = data.get("mode")
        if mode not in FAULT_MODES:
            raise ValueError(f"unknown fault mode {mode!r}; expected one of {sorted(FAULT_MODES)}")
        values: dict[str, Any] = {}
        for name, raw in data.items():
            if name in ("mode", "count"):
                continue
            convert = _PARAM_TYPES.get(name)
            if convert is None:
                raise ValueError(f"unknown fault parameter {name!r}")
            try:
                values[name] = convert(raw)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"bad value for fault parameter {name!r}: {raw!r}") from exc
        fault = cls(mode=str(mode), **values)
        if fault.mode == "status" and not 400 <= fault.status <= 599:
            raise ValueError("status must be an HTTP error status (400-599)")
        if not 0.0 < fault.probability <= 1.0:
            raise ValueError("probability must be in (0, 1]")
        return fault

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_PARAM_TYPES: dict[str, type[int] | type[float] | type[str]] = {
    "status": int,
    "retry_after": float,
    "seconds": float,
    "ms": float,
    "after_chunks": int,
    "message": str,
    "probability": float,
    "seed": int,
    "abort": int,
}


def header_fault(headers: Mapping[str, str]) -> Fault | None:
    """The per-request fault named by ``x-fault-mode`` and ``x-fault-<param>`` headers."""
    if "x-fault-mode" not in headers:
        return None
    data = {
        key[len("x-fault-") :].replace("-", "_"): value
        for key, value in headers.items()
        if key.startswith("x-fault-")
    }
    return Fault.from_mapping(data)


@dataclass(slots=True)
class _Pending:
    fault: Fault
    remaining: int  # -1 = until cleared
    draws: random.Random  # decides which requests a probabilistic fault hits


class FaultQueue:
    """Faults for the next chat requests, first in first out."""

    def __init__(self) -> None:
        self._pending: deque[_Pending] = deque()

    def push(self, fault: Fault, count: int = 1) -> None:
        if count == 0 or count < -1:
            raise ValueError("count must be a positive integer or -1 (until cleared)")
        self._pending.append(_Pending(fault, count, random.Random(fault.seed)))

    def take(self) -> Fault | None:
        """The fault for this request, if any; no await inside, so atomic under asyncio.

        Only the head of the queue is considered: a request that a probabilistic head
        spares gets no fault at all, and the head stays.
        """
        if not self._pending:
            return None
        head = self._pending[0]
        if head.fault.probability < 1.0 and head.draws.random() >= head.fault.probability:
            return None
        if head.remaining > 0:
            head.remaining -= 1
            if head.remaining == 0:
                self._pending.popleft()
        return head.fault

    def clear(self) -> None:
        self._pending.clear()

    def describe(self) -> list[dict[str, Any]]:
        return [{**p.fault.as_dict(), "count": p.remaining} for p in self._pending]


@dataclass(slots=True)
class ProviderStats:
    """Counters exposed by ``GET /_control/stats``."""

    chat_requests: int = 0
    paths: Counter[str] = field(default_factory=Counter)
    open_streams: int = 0
    streams_completed: int = 0
    # Streams the client went away from before the last event was sent.
    streams_aborted: int = 0
    faults_applied: int = 0
    # Chat requests by what they got: "ok" or the fault's mode.
    outcomes: Counter[str] = field(default_factory=Counter)
    # Model-list pages answered, by API ("openai", "anthropic"), and those a fault spoiled:
    # apart from ``paths``, which counts the API calls (a gateway lists in the background).
    model_lists: Counter[str] = field(default_factory=Counter)
    model_list_faults: int = 0

    def snapshot(self) -> dict[str, Any]:
        return {
            "outcomes": dict(self.outcomes),
            "chat_requests": self.chat_requests,
            "paths": dict(self.paths),
            "open_streams": self.open_streams,
            "streams_completed": self.streams_completed,
            "streams_aborted": self.streams_aborted,
            "faults_applied": self.faults_applied,
            "model_lists": dict(self.model_lists),
            "model_list_faults": self.model_list_faults,
        }


@dataclass(slots=True)
class ProviderState:
    """Everything mutable about one provider app."""

    faults: FaultQueue = field(default_factory=FaultQueue)
    model_faults: FaultQueue = field(default_factory=FaultQueue)  # for GET /v1/models
    stats: ProviderStats = field(default_factory=ProviderStats)
    # Recent requests (path, headers, body) so tests can see what a gateway forwarded.
    recent: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=_RECENT_REQUESTS))
    # One record per chat request, for timelines: [unix time, outcome, streamed].
    log: deque[tuple[float, str, bool]] = field(default_factory=lambda: deque(maxlen=_LOG_REQUESTS))
    # Set to end every stall in progress before its ``seconds`` (``/_control/release``): a
    # test holds a call or a stream still for as long as it needs, not for a guessed time.
    release: asyncio.Event = field(default_factory=asyncio.Event)
    # Responses the Responses API was asked to keep (``store: true``), by id, as OpenAI keeps
    # them for ``GET``/``DELETE /v1/responses/{id}``.
    stored: dict[str, dict[str, Any]] = field(default_factory=dict)

    def release_stalls(self) -> None:
        released, self.release = self.release, asyncio.Event()  # later stalls wait anew
        released.set()

    def record(self, fault: Fault | None, stream: bool) -> None:
        """Account for one chat request that got past validation."""
        outcome = "ok" if fault is None else fault.mode
        self.stats.outcomes[outcome] += 1
        if fault is not None:
            self.stats.faults_applied += 1
        self.log.append((time.time(), outcome, stream))

    def reset(self) -> None:
        self.faults.clear()
        self.model_faults.clear()
        self.stats = ProviderStats()
        self.recent.clear()
        self.log.clear()
        self.stored.clear()


def json_response(
    data: Any, status: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    return Response(orjson.dumps(data), status, headers, media_type="application/json")


_OPENAI_ERROR_TYPES = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", "permission_denied"),
    404: ("invalid_request_error", "not_found"),
    429: ("requests", "rate_limit_exceeded"),
}
_ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


def error_response(
    api: Api, status: int, message: str, headers: Mapping[str, str] | None = None
) -> Response:
    """An error in the wire format of the provider being imitated."""
    body: dict[str, Any]
    if api == "azure" and status != 400:
        # Azure's own errors carry the status as their code; its 400s are OpenAI's.
        body = {"error": {"code": str(status), "message": message}}
    elif api == "anthropic":
        kind = _ANTHROPIC_ERROR_TYPES.get(status, "api_error")
        body = {"type": "error", "error": {"type": kind, "message": message}}
    else:
        fallback = ("invalid_request_error" if status < 500 else "server_error", None)
        kind, code = _OPENAI_ERROR_TYPES.get(status, fallback)
        body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return json_response(body, status, headers)


def fault_error_response(api: Api, fault: Fault) -> Response:
    """The response for a ``status`` or ``rate_limit`` fault."""
    if fault.mode == "rate_limit":
        seconds = fault.retry_after
        retry_after = str(int(seconds)) if seconds == int(seconds) else f"{seconds:g}"
        headers = {"retry-after": retry_after, "retry-after-ms": str(int(seconds * 1000))}
        return error_response(api, 429, "Rate limit reached (injected)", headers)
    return error_response(api, fault.status, fault.message)


def control_routes(state: ProviderState) -> list[Route]:
    """The out-of-band control API under ``/_control``."""

    async def set_fault(request: Request) -> Response:
        try:
            data = orjson.loads(await request.body())
            if not isinstance(data, dict):
                raise ValueError("body must be a JSON object")
            endpoint = data.pop("endpoint", "chat")
            if endpoint not in ("chat", "models"):
                raise ValueError("endpoint must be chat or models")
            queue = state.model_faults if endpoint == "models" else state.faults
            fault = Fault.from_mapping(data)
            queue.push(fault, int(data.get("count", 1)))
        except (orjson.JSONDecodeError, TypeError, ValueError) as exc:
            return error_response("openai", 400, str(exc))
        return json_response({"queued": fault.as_dict(), "pending": queue.describe()})

    async def clear_faults(request: Request) -> Response:
        state.faults.clear()
        state.model_faults.clear()
        return json_response({"pending": []})

    async def stats(request: Request) -> Response:
        return json_response(
            {
                **state.stats.snapshot(),
                "pending_faults": state.faults.describe(),
                "pending_model_faults": state.model_faults.describe(),
            }
        )

    async def reset(request: Request) -> Response:
        state.reset()
        return json_response({"reset": True})

    async def release(request: Request) -> Response:
        state.release_stalls()
        return json_response({"released": True})

    async def recent(request: Request) -> Response:
        return json_response(list(state.recent))

    async def log(request: Request) -> Response:
        return json_response(
            [{"t": t, "outcome": outcome, "stream": stream} for t, outcome, stream in state.log]
        )

    return [
        Route("/_control/faults", set_fault, methods=["POST"]),
        Route("/_control/faults", clear_faults, methods=["DELETE"]),
        Route("/_control/stats", stats, methods=["GET"]),
        Route("/_control/reset", reset, methods=["POST"]),
        Route("/_control/release", release, methods=["POST"]),
        Route("/_control/requests", recent, methods=["GET"]),
        Route("/_control/log", log, methods=["GET"]),
    ]


class ProviderControl:
    """A sync client for the control API, for tests and benchmarks."""

    def __init__(self, base_url: str, *, timeout: float = 5.0) -> None:
        # trust_env=False: a proxy from the environment must never see loopback traffic.
        self._client = httpx.Client(base_url=base_url, timeout=timeout, trust_env=False)

    def set_fault(self, mode: str, count: int = 1, **params: Any) -> dict[str, Any]:
        """Queue ``mode`` for the next ``count`` chat requests (-1 = until cleared), or
        with ``endpoint="models"`` for the next model lists.

        With ``probability=p`` (and ``seed``), each request gets it with chance p.
        """
        queued: dict[str, Any] = self._call(
            "POST", "/_control/faults", {"mode": mode, "count": count, **params}
        )
        return queued

    def clear(self) -> None:
        self._call("DELETE", "/_control/faults")

    def stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = self._call("GET", "/_control/stats")
        return stats

    def reset(self) -> None:
        self._call("POST", "/_control/reset")

    def release(self) -> None:
        """End every stall in progress now (``stall_before_first_byte`` of any request
        received so far, a stream's ``stall_mid_stream`` or ``stall_after_headers``): the
        answers go on."""
        self._call("POST", "/_control/release")

    def requests(self) -> list[dict[str, Any]]:
        """The most recent chat requests received (method, path, headers, body)."""
        recent: list[dict[str, Any]] = self._call("GET", "/_control/requests")
        return recent

    def log(self) -> list[dict[str, Any]]:
        """Every chat request since the last reset: unix time, outcome, streamed or not."""
        records: list[dict[str, Any]] = self._call("GET", "/_control/log")
        return records

    def close(self) -> None:
        self._client.close()

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        content = None if body is None else orjson.dumps(body)
        response = self._client.request(method, path, content=content)
        response.raise_for_status()
        return orjson.loads(response.content)
