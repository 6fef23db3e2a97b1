"""A local stand-in for OpenAI and Anthropic, with fault injection.

Real HTTP, deterministic and fast: the floor in benchmarks, the provider in
the test suite and the "local demo provider" of ``prism dev``.

Reply rule: ``Echo: <last user text, truncated> [<tag>]``, where ``tag`` is a
short hash of the request body minus transport-only fields (``stream``,
``stream_options``, ``user``, ``metadata``). The same body always gets the
same content, streamed or not; different bodies get different content.

Run it: ``python -m deploy.local.provider --host 127.0.0.1 --port 9100``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import re
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from itertools import zip_longest
from types import TracebackType
from typing import Any

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from deploy.local.asgi_thread import ThreadedServer
from deploy.local.ports import free_port
from deploy.local.provider_faults import (
    Api,
    Fault,
    ProviderControl,
    ProviderState,
    control_routes,
    error_response,
    fault_error_response,
    header_fault,
    json_response,
)

__all__ = [
    "DEFAULT_MODELS",
    "Fault",
    "ProviderControl",
    "ProviderServer",
    "ProviderSettings",
    "closed_port",
    "create_provider_app",
    "main",
]

DEFAULT_MODELS = (
    "gpt-4o-mini",
    "gpt-4o",
    "claude-3-5-haiku-latest",
    "claude-sonnet-4-5",
    "prism-local-echo",
)


@dataclass(frozen=True, slots=True)
class ProviderSettings:
    """How the provider behaves when no fault is injected."""

    latency_ms: float = 0.0  # delay before the first byte of every chat response
    tokens_per_second: float = 0.0  # stream pacing; 0 = as fast as possible
    chunk_count: int = 8  # content chunks per streamed reply (at most one per word)
    reply_words: int = 0  # pad replies with filler words up to this length
    echo_chars: int = 80  # how much of the last user message is echoed
    models: tuple[str, ...] = DEFAULT_MODELS
    api_key: str | None = None  # when set, requests must carry it


# ---------------------------------------------------------------- replies

_TRANSPORT_KEYS = frozenset({"stream", "stream_options", "user", "metadata"})
_FILLER = ("lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit")
_WORDS = re.compile(r"\s*\S+\s*")
_MALFORMED = b'{"id": "malformed", "object": "chat.completion", "choices": [<<not json>>'
_MAX_N = 16


@dataclass(frozen=True, slots=True)
class _ToolCall:
    name: str
    input: dict[str, Any]
    arguments: str  # the same input as JSON text


@dataclass(frozen=True, slots=True)
class _Reply:
    tag: str
    model: str
    texts: tuple[str, ...]  # one per choice; unused when the choices are tool calls
    tool_call: _ToolCall | None
    prompt_tokens: int
    completion_tokens: int


def _digest(body: dict[str, Any]) -> str:
    kept = {k: v for k, v in body.items() if k not in _TRANSPORT_KEYS}
    return hashlib.sha256(orjson.dumps(kept, option=orjson.OPT_SORT_KEYS)).hexdigest()[:10]


def _text_of(content: Any) -> str:
    """Text of a message content: a string, or OpenAI parts / Anthropic blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, dict) and part.get("type") == "text"
        )
    return ""


def _pieces(text: str, count: int) -> list[tuple[str, int]]:
    """Split at word boundaries into at most ``count`` (piece, words); joins back to text."""
    words = _WORDS.findall(text)
    if not words:
        return [(text, 0)] if text else []
    size = -(-len(words) // max(1, count))
    return [
        ("".join(words[i : i + size]), len(words[i : i + size])) for i in range(0, len(words), size)
    ]


def _sample_input(schema: Any, text: str, tag: str) -> dict[str, Any]:
    """Deterministic arguments that fit a JSON schema's top-level properties."""
    props = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(props, dict):
        return {}
    snippet = text[:40] or tag
    out: dict[str, Any] = {}
    for key, spec in props.items():
        spec = spec if isinstance(spec, dict) else {}
        enum = spec.get("enum")
        kind = spec.get("type")
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), "string")
        if isinstance(enum, list) and enum:
            out[key] = enum[0]
        else:
            samples = {"integer": len(text), "number": len(text) / 2, "boolean": True}
            out[key] = {"array": [], "object": {}, **samples}.get(str(kind), snippet)
    return out


def _build_reply(
    settings: ProviderSettings,
    body: dict[str, Any],
    texts_in: list[str],
    last_user: str,
    tool: tuple[str, Any] | None,
    n: int,
) -> _Reply:
    tag = _digest(body)
    prompt_tokens = max(1, sum(len(t.split()) for t in texts_in))
    snippet = " ".join(last_user.split())[: settings.echo_chars]
    if tool is not None:
        tool_input = _sample_input(tool[1], snippet, tag)
        arguments = orjson.dumps(tool_input).decode()
        call = _ToolCall(tool[0], tool_input, arguments)
        completion = n * max(1, len(arguments) // 4)
        return _Reply(tag, str(body["model"]), ("",) * n, call, prompt_tokens, completion)
    words = ["Echo:", *snippet.split()]
    filler = max(0, settings.reply_words - len(words) - 1)
    words += [_FILLER[i % len(_FILLER)] for i in range(filler)]
    base = " ".join(words)
    # Each choice gets its own tag so n > 1 yields distinct, still deterministic, choices.
    texts = tuple(f"{base} [{tag if i == 0 else f'{tag}.{i}'}]" for i in range(n))
    completion = sum(len(t.split()) for t in texts)
    return _Reply(tag, str(body["model"]), texts, None, prompt_tokens, completion)


def _mentioned(tools: list[tuple[str, Any]], text: str) -> tuple[str, Any] | None:
    return next((t for t in tools if t[0] and t[0] in text), None)


def _named(tools: list[tuple[str, Any]], name: Any) -> tuple[str, Any]:
    return next((t for t in tools if t[0] == name), (str(name), {}))


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def _openai_reply(settings: ProviderSettings, body: dict[str, Any]) -> _Reply:
    messages = body.get("messages")
    _require(isinstance(body.get("model"), str) and bool(body["model"]), "'model' is required")
    _require(isinstance(messages, list) and bool(messages), "'messages' must be a non-empty list")
    assert isinstance(messages, list)
    _require(all(isinstance(m, dict) for m in messages), "each message must be an object")
    n = 1 if body.get("n") is None else body["n"]
    _require(isinstance(n, int) and 1 <= n <= _MAX_N, f"'n' must be an integer in 1..{_MAX_N}")
    texts = [_text_of(m.get("content")) for m in messages]
    users = [t for m, t in zip(messages, texts, strict=True) if m.get("role") == "user"]
    last_user = users[-1] if users else ""
    tools = [
        (str(t["function"].get("name", "")), t["function"].get("parameters"))
        for t in body.get("tools") or []
        if isinstance(t, dict) and isinstance(t.get("function"), dict)
    ]
    choice = body.get("tool_choice")
    tool: tuple[str, Any] | None = None
    if tools and choice == "required":
        tool = tools[0]
    elif tools and isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        tool = _named(tools, choice["function"].get("name"))
    elif tools and choice in (None, "auto") and messages[-1].get("role") == "user":
        tool = _mentioned(tools, last_user)
    return _build_reply(settings, body, texts, last_user, tool, n)


def _anthropic_reply(settings: ProviderSettings, body: dict[str, Any]) -> _Reply:
    messages = body.get("messages")
    _require(isinstance(body.get("model"), str) and bool(body["model"]), "model: Field required")
    _require(isinstance(body.get("max_tokens"), int), "max_tokens: Field required")
    _require(isinstance(messages, list) and bool(messages), "messages: must be a non-empty list")
    assert isinstance(messages, list)
    _require(all(isinstance(m, dict) for m in messages), "messages: each must be an object")
    texts = [_text_of(body.get("system")), *(_text_of(m.get("content")) for m in messages)]
    users = [t for m, t in zip(messages, texts[1:], strict=True) if m.get("role") == "user"]
    last_user = users[-1] if users else ""
    tools = [
        (str(t.get("name", "")), t.get("input_schema"))
        for t in body.get("tools") or []
        if isinstance(t, dict)
    ]
    choice = body.get("tool_choice") or {"type": "auto"}
    kind = choice.get("type") if isinstance(choice, dict) else None
    tool: tuple[str, Any] | None = None
    if tools and kind == "any":
        tool = tools[0]
    elif tools and kind == "tool":
        tool = _named(tools, choice.get("name"))
    elif tools and kind == "auto" and messages[-1].get("role") == "user":
        # A tool_result turn has no text blocks, so the conversation can end with text.
        tool = _mentioned(tools, last_user)
    return _build_reply(settings, body, texts, last_user, tool, 1)


# ---------------------------------------------------------------- wire formats


@dataclass(frozen=True, slots=True)
class _StreamPlan:
    events: list[tuple[bytes, int]]  # (SSE bytes, words it carries, for pacing)
    terminal: int  # index of the first event that says the reply is complete


def _sse(data: Any) -> bytes:
    return b"data: " + orjson.dumps(data) + b"\n\n"


def _sse_event(data: dict[str, Any]) -> bytes:
    kind: str = data["type"]
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def _fragments(text: str, parts: int = 3) -> list[str]:
    size = max(1, -(-len(text) // parts))
    return [text[i : i + size] for i in range(0, len(text), size)]


def _openai_usage(reply: _Reply) -> dict[str, int]:
    total = reply.prompt_tokens + reply.completion_tokens
    return {
        "prompt_tokens": reply.prompt_tokens,
        "completion_tokens": reply.completion_tokens,
        "total_tokens": total,
    }


def _openai_tool_call(reply: _Reply, index: int) -> dict[str, Any]:
    assert reply.tool_call is not None
    return {
        "id": f"call_{reply.tag}_{index}",
        "type": "function",
        "function": {"name": reply.tool_call.name, "arguments": reply.tool_call.arguments},
    }


def _openai_completion(reply: _Reply, created: int) -> dict[str, Any]:
    choices = []
    for i, text in enumerate(reply.texts):
        message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
        if reply.tool_call is not None:
            message.update(content=None, tool_calls=[_openai_tool_call(reply, i)])
        finish = "stop" if reply.tool_call is None else "tool_calls"
        choices.append({"index": i, "message": message, "finish_reason": finish, "logprobs": None})
    return {
        "id": f"chatcmpl-{reply.tag}",
        "object": "chat.completion",
        "created": created,
        "model": reply.model,
        "choices": choices,
        "usage": _openai_usage(reply),
        "system_fingerprint": None,
    }


def _openai_stream(
    settings: ProviderSettings, reply: _Reply, created: int, include_usage: bool
) -> _StreamPlan:
    base = {
        "id": f"chatcmpl-{reply.tag}",
        "object": "chat.completion.chunk",
        "created": created,
        "model": reply.model,
        "system_fingerprint": None,
    }
    extra = {"usage": None} if include_usage else {}

    def chunk(index: int, delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
        return _sse({**base, "choices": [choice], **extra})

    calling = reply.tool_call is not None
    role = {"role": "assistant", "content": None if calling else ""}
    events = [(chunk(i, role), 0) for i in range(len(reply.texts))]
    per_choice: list[list[tuple[bytes, int]]] = []
    for i, text in enumerate(reply.texts):
        if reply.tool_call is not None:
            call = _openai_tool_call(reply, i)
            call["function"] = {**call["function"], "arguments": ""}
            body = [(chunk(i, {"tool_calls": [{"index": 0, **call}]}), 1)]
            body += [
                (chunk(i, {"tool_calls": [{"index": 0, "function": {"arguments": f}}]}), 1)
                for f in _fragments(reply.tool_call.arguments)
            ]
        else:
            body = [(chunk(i, {"content": p}), w) for p, w in _pieces(text, settings.chunk_count)]
        per_choice.append(body)
    # Interleave choices the way OpenAI does for n > 1.
    events += [event for group in zip_longest(*per_choice) for event in group if event]
    terminal = len(events)
    finish = "tool_calls" if calling else "stop"
    events += [(chunk(i, {}, finish), 0) for i in range(len(reply.texts))]
    if include_usage:
        events.append((_sse({**base, "choices": [], "usage": _openai_usage(reply)}), 0))
    events.append((b"data: [DONE]\n\n", 0))
    return _StreamPlan(events, terminal)


def _anthropic_block(reply: _Reply) -> dict[str, Any]:
    if reply.tool_call is None:
        return {"type": "text", "text": reply.texts[0]}
    call = reply.tool_call
    return {"type": "tool_use", "id": f"toolu_{reply.tag}", "name": call.name, "input": call.input}


def _anthropic_message(reply: _Reply) -> dict[str, Any]:
    return {
        "id": f"msg_{reply.tag}",
        "type": "message",
        "role": "assistant",
        "model": reply.model,
        "content": [_anthropic_block(reply)],
        "stop_reason": "end_turn" if reply.tool_call is None else "tool_use",
        "stop_sequence": None,
        "usage": {"input_tokens": reply.prompt_tokens, "output_tokens": reply.completion_tokens},
    }


def _anthropic_stream(settings: ProviderSettings, reply: _Reply) -> _StreamPlan:
    start = {**_anthropic_message(reply), "content": [], "stop_reason": None}
    start["usage"] = {"input_tokens": reply.prompt_tokens, "output_tokens": 1}
    # The block starts empty; its text or input arrives in the deltas.
    block = _anthropic_block(reply)
    deltas: list[tuple[dict[str, Any], int]]
    if reply.tool_call is None:
        block["text"] = ""
        pieces = _pieces(reply.texts[0], settings.chunk_count)
        deltas = [({"type": "text_delta", "text": p}, w) for p, w in pieces]
    else:
        block["input"] = {}
        parts = ["", *_fragments(reply.tool_call.arguments)]
        deltas = [({"type": "input_json_delta", "partial_json": p}, 1) for p in parts]
    events = [
        (_sse_event({"type": "message_start", "message": start}), 0),
        (_sse_event({"type": "content_block_start", "index": 0, "content_block": block}), 0),
        (_sse_event({"type": "ping"}), 0),
    ]
    events += [
        (_sse_event({"type": "content_block_delta", "index": 0, "delta": d}), w) for d, w in deltas
    ]
    terminal = len(events)
    message_delta = {
        "type": "message_delta",
        "delta": {"stop_reason": _anthropic_message(reply)["stop_reason"], "stop_sequence": None},
        "usage": {"output_tokens": reply.completion_tokens},
    }
    events += [
        (_sse_event({"type": "content_block_stop", "index": 0}), 0),
        (_sse_event(message_delta), 0),
        (_sse_event({"type": "message_stop"}), 0),
    ]
    return _StreamPlan(events, terminal)


def _malformed_stream(api: Api, plan: _StreamPlan) -> _StreamPlan:
    """The first event, then one whose data is not JSON, then the usual end marker."""
    if api == "anthropic":
        bad = b'event: content_block_delta\ndata: {"type": "content_block_delta", <<not json>>\n\n'
        return _StreamPlan([plan.events[0], (bad, 0)], 2)
    bad = b'data: {"id": "malformed", "choices": [<<not json>>\n\n'
    return _StreamPlan([plan.events[0], (bad, 0), (b"data: [DONE]\n\n", 0)], 2)


# ---------------------------------------------------------------- the app


class _Provider:
    """Request handlers over one settings object and one per-app state."""

    def __init__(self, settings: ProviderSettings, state: ProviderState) -> None:
        self.settings = settings
        self.state = state

    async def models(self, request: Request) -> Response:
        self.state.stats.paths[request.url.path] += 1
        key = self.settings.api_key
        if key is not None:
            bearer = request.headers.get("authorization", "").removeprefix("Bearer ")
            given = request.headers.get("x-api-key", bearer)
            if not hmac.compare_digest(given.encode(), key.encode()):
                return error_response("openai", 401, "Incorrect API key provided.")
        data = [
            {"id": m, "object": "model", "created": 0, "owned_by": "prism-local"}
            for m in self.settings.models
        ]
        return json_response({"object": "list", "data": data})

    async def chat_completions(self, request: Request) -> Response:
        return await self._chat(request, "openai")

    async def messages(self, request: Request) -> Response:
        return await self._chat(request, "anthropic")

    def _denied(self, request: Request, api: Api) -> Response | None:
        headers, key = request.headers, self.settings.api_key
        if api == "anthropic":
            given = headers.get("x-api-key")
            if given is None or (key is not None and not _same(given, key)):
                return error_response(api, 401, "invalid x-api-key")
            if "anthropic-version" not in headers:
                return error_response(api, 400, "anthropic-version: header is required")
        elif key is not None and not _same(headers.get("authorization", ""), f"Bearer {key}"):
            return error_response(api, 401, "Incorrect API key provided.")
        return None

    async def _chat(self, request: Request, api: Api) -> Response:
        state, settings = self.state, self.settings
        state.stats.chat_requests += 1
        state.stats.paths[request.url.path] += 1
        raw = await request.body()
        denied = self._denied(request, api)
        if denied is not None:
            return denied
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return error_response(api, 400, "The request body is not valid JSON.")
        if not isinstance(body, dict):
            return error_response(api, 400, "The request body must be a JSON object.")
        state.recent.append(
            {
                "method": request.method,
                "path": request.url.path,
                "headers": dict(request.headers),
                "body": body,
            }
        )
        try:
            reply = (_openai_reply if api == "openai" else _anthropic_reply)(settings, body)
            fault = header_fault(request.headers) or state.faults.take()
        except ValueError as exc:
            return error_response(api, 400, str(exc))
        stream = body.get("stream") is True
        if fault is not None:
            state.stats.faults_applied += 1
        delay = settings.latency_ms / 1000 + _fault_delay(fault, stream)
        if delay > 0:
            await asyncio.sleep(delay)
        if fault is not None and fault.mode in ("status", "rate_limit"):
            return fault_error_response(api, fault)
        return self._answer(api, body, reply, fault, stream)

    def _answer(
        self, api: Api, body: dict[str, Any], reply: _Reply, fault: Fault | None, stream: bool
    ) -> Response:
        """The reply as JSON or as an event stream, spoiled as the fault says."""
        settings = self.settings
        created = int(time.time())
        if not stream:
            data = (
                _openai_completion(reply, created) if api == "openai" else _anthropic_message(reply)
            )
            payload = orjson.dumps(data)
            if fault is not None and fault.mode == "malformed_json":
                payload = _MALFORMED
            elif fault is not None and fault.mode == "truncated_stream":
                payload = payload[: len(payload) // 2]
            return Response(payload, media_type="application/json")
        if api == "openai":
            options = body.get("stream_options")
            include_usage = isinstance(options, dict) and options.get("include_usage") is True
            plan = _openai_stream(settings, reply, created, include_usage)
        else:
            plan = _anthropic_stream(settings, reply)
        if fault is not None and fault.mode == "malformed_json":
            plan = _malformed_stream(api, plan)
        events = self._emit(plan, fault)
        return StreamingResponse(events, media_type="text/event-stream", headers=_SSE_HEADERS)

    async def _emit(self, plan: _StreamPlan, fault: Fault | None) -> AsyncIterator[bytes]:
        """Yield each event as its own write, paced by tokens_per_second."""
        stop_at = stall_at = -1
        if fault is not None and fault.mode == "truncated_stream":
            stop_at = min(fault.after_chunks, plan.terminal)
        elif fault is not None and fault.mode == "stall_mid_stream":
            stall_at = min(fault.after_chunks, len(plan.events) - 1)
        rate = self.settings.tokens_per_second
        # Bound once: a reset while this stream is open must not skew the new counters.
        stats = self.state.stats
        stats.open_streams += 1
        finished = False
        try:
            started, words = time.monotonic(), 0
            for i, (event, weight) in enumerate(plan.events):
                if i == stop_at:
                    break
                if i == stall_at:
                    assert fault is not None
                    await asyncio.sleep(fault.seconds)
                    started = time.monotonic() - words / rate if rate else started
                if rate and weight:
                    # Pace against a schedule, not per chunk, so sleeps do not drift.
                    words += weight
                    wait = started + words / rate - time.monotonic()
                    if wait > 0:
                        await asyncio.sleep(wait)
                yield event
            finished = True
        finally:
            stats.open_streams -= 1
            if finished:
                stats.streams_completed += 1
            else:
                stats.streams_aborted += 1


_SSE_HEADERS = {"cache-control": "no-cache"}


async def _http_error(request: Request, exc: Exception) -> Response:
    """Unknown routes and methods, in OpenAI's error format rather than plain text."""
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    return error_response("openai", status, f"{request.method} {request.url.path}: {exc}")


def _same(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())


def _fault_delay(fault: Fault | None, stream: bool) -> float:
    """Seconds a fault adds before the first byte."""
    if fault is None:
        return 0.0
    if fault.mode == "latency":
        return fault.ms / 1000
    if fault.mode == "stall_before_first_byte" or (fault.mode == "stall_mid_stream" and not stream):
        return fault.seconds
    return 0.0


def create_provider_app(settings: ProviderSettings | None = None) -> Starlette:
    """The provider as an ASGI app; all mutable state lives on this instance."""
    settings = settings or ProviderSettings()
    state = ProviderState()
    provider = _Provider(settings, state)
    routes = [
        Route("/v1/chat/completions", provider.chat_completions, methods=["POST"]),
        Route("/v1/messages", provider.messages, methods=["POST"]),
        Route("/v1/models", provider.models, methods=["GET"]),
        *control_routes(state),
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: _http_error})
    app.state.provider = state  # for in-process tests that want to look inside
    return app


# ---------------------------------------------------------------- running it


def closed_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on, for connection-refused tests."""
    return free_port(host)


class ProviderServer:
    """The provider on a free loopback port, served by uvicorn in a background thread."""

    def __init__(
        self,
        settings: ProviderSettings | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        startup_timeout: float = 10.0,
    ) -> None:
        self.settings = settings or ProviderSettings()
        self._server = ThreadedServer(
            create_provider_app(self.settings),
            host=host,
            port=port,
            lifespan="off",
            graceful_shutdown=1,  # stalled streams must not hold up stop()
        )
        self._startup_timeout = startup_timeout
        self._control: ProviderControl | None = None

    @property
    def host(self) -> str:
        return self._server.host

    @property
    def port(self) -> int:
        return self._server.port

    @property
    def url(self) -> str:
        return self._server.url

    @property
    def control(self) -> ProviderControl:
        if self._control is None:
            raise RuntimeError("ProviderServer is not running")
        return self._control

    def start(self) -> ProviderServer:
        if self._control is not None:
            raise RuntimeError("ProviderServer already started")
        self._server.start(timeout=self._startup_timeout)
        self._control = ProviderControl(self.url)
        return self

    def stop(self) -> None:
        if self._control is not None:
            self._control.close()
            self._control = None
        self._server.stop()

    def __enter__(self) -> ProviderServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def main(argv: Sequence[str] | None = None) -> None:
    """Command-line runner (``python -m deploy.local.provider``)."""
    parser = argparse.ArgumentParser(
        prog="python -m deploy.local.provider",
        description="Local OpenAI/Anthropic stand-in with fault injection.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9100)
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--tokens-per-second", type=float, default=0.0)
    parser.add_argument("--chunk-count", type=int, default=ProviderSettings().chunk_count)
    parser.add_argument("--reply-words", type=int, default=0)
    parser.add_argument("--api-key", default=None)
    args = parser.parse_args(argv)
    settings = ProviderSettings(
        latency_ms=args.latency_ms,
        tokens_per_second=args.tokens_per_second,
        chunk_count=args.chunk_count,
        reply_words=args.reply_words,
        api_key=args.api_key,
    )
    # uvicorn's default http="auto" picks httptools when it is installed, h11 otherwise.
    uvicorn.run(
        create_provider_app(settings),
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
    )


if __name__ == "__main__":
    main()
