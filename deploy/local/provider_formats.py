"""Wire formats of the local provider: replies, and OpenAI and Anthropic bodies and streams."""

from __future__ import annotations

import base64
import hashlib
import re
import struct
from dataclasses import dataclass
from itertools import zip_longest
from typing import Any

import orjson

from deploy.local.provider_faults import Api
from deploy.local.provider_settings import ProviderSettings

__all__ = [
    "MALFORMED_JSON",
    "Reply",
    "StreamPlan",
    "anthropic_message",
    "anthropic_reply",
    "anthropic_stream",
    "error_event",
    "malformed_stream",
    "openai_completion",
    "openai_embeddings",
    "openai_reply",
    "openai_stream",
    "without_done",
]

# ---------------------------------------------------------------- replies

_TRANSPORT_KEYS = frozenset({"stream", "stream_options", "user", "metadata"})
_FILLER = ("lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit")
_WORDS = re.compile(r"\s*\S+\s*")
# The body a non-streamed reply gets under the ``malformed_json`` fault.
MALFORMED_JSON = b'{"id": "malformed", "object": "chat.completion", "choices": [<<not json>>'
_MAX_N = 16


@dataclass(frozen=True, slots=True)
class _ToolCall:
    name: str
    input: dict[str, Any]
    arguments: str  # the same input as JSON text


@dataclass(frozen=True, slots=True)
class Reply:
    """One answer to a chat request, before it is put in either API's format."""

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
) -> Reply:
    tag = _digest(body)
    prompt_tokens = max(1, sum(len(t.split()) for t in texts_in))
    snippet = " ".join(last_user.split())[: settings.echo_chars]
    if tool is not None:
        tool_input = _sample_input(tool[1], snippet, tag)
        arguments = orjson.dumps(tool_input).decode()
        call = _ToolCall(tool[0], tool_input, arguments)
        completion = n * max(1, len(arguments) // 4)
        return Reply(tag, str(body["model"]), ("",) * n, call, prompt_tokens, completion)
    words = ["Echo:", *snippet.split()]
    filler = max(0, settings.reply_words - len(words) - 1)
    words += [_FILLER[i % len(_FILLER)] for i in range(filler)]
    base = " ".join(words)
    # Each choice gets its own tag so n > 1 yields distinct, still deterministic, choices.
    texts = tuple(f"{base} [{tag if i == 0 else f'{tag}.{i}'}]" for i in range(n))
    completion = sum(len(t.split()) for t in texts)
    return Reply(tag, str(body["model"]), texts, None, prompt_tokens, completion)


def _mentioned(tools: list[tuple[str, Any]], text: str) -> tuple[str, Any] | None:
    return next((t for t in tools if t[0] and t[0] in text), None)


def _named(tools: list[tuple[str, Any]], name: Any) -> tuple[str, Any]:
    return next((t for t in tools if t[0] == name), (str(name), {}))


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def openai_reply(settings: ProviderSettings, body: dict[str, Any]) -> Reply:
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


def anthropic_reply(settings: ProviderSettings, body: dict[str, Any]) -> Reply:
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
class StreamPlan:
    """The events of one streamed reply, in order."""

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


def _openai_usage(reply: Reply) -> dict[str, int]:
    total = reply.prompt_tokens + reply.completion_tokens
    return {
        "prompt_tokens": reply.prompt_tokens,
        "completion_tokens": reply.completion_tokens,
        "total_tokens": total,
    }


def _openai_tool_call(reply: Reply, index: int) -> dict[str, Any]:
    assert reply.tool_call is not None
    return {
        "id": f"call_{reply.tag}_{index}",
        "type": "function",
        "function": {"name": reply.tool_call.name, "arguments": reply.tool_call.arguments},
    }


def openai_completion(reply: Reply, created: int) -> dict[str, Any]:
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


def openai_stream(
    settings: ProviderSettings, reply: Reply, created: int, include_usage: bool
) -> StreamPlan:
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
    return StreamPlan(events, terminal)


def _anthropic_block(reply: Reply) -> dict[str, Any]:
    if reply.tool_call is None:
        return {"type": "text", "text": reply.texts[0]}
    call = reply.tool_call
    return {"type": "tool_use", "id": f"toolu_{reply.tag}", "name": call.name, "input": call.input}


def anthropic_message(reply: Reply) -> dict[str, Any]:
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


def anthropic_stream(settings: ProviderSettings, reply: Reply) -> StreamPlan:
    start = {**anthropic_message(reply), "content": [], "stop_reason": None}
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
        "delta": {"stop_reason": anthropic_message(reply)["stop_reason"], "stop_sequence": None},
        "usage": {"output_tokens": reply.completion_tokens},
    }
    events += [
        (_sse_event({"type": "content_block_stop", "index": 0}), 0),
        (_sse_event(message_delta), 0),
        (_sse_event({"type": "message_stop"}), 0),
    ]
    return StreamPlan(events, terminal)


def malformed_stream(api: Api, plan: StreamPlan) -> StreamPlan:
    """The first event, then one whose data is not JSON, then the usual end marker."""
    if api == "anthropic":
        bad = b'event: content_block_delta\ndata: {"type": "content_block_delta", <<not json>>\n\n'
        return StreamPlan([plan.events[0], (bad, 0)], 2)
    bad = b'data: {"id": "malformed", "choices": [<<not json>>\n\n'
    return StreamPlan([plan.events[0], (bad, 0), (b"data: [DONE]\n\n", 0)], 2)


def error_event(api: Api, message: str) -> StreamPlan:
    """A stream that is only the API's error event (Anthropic: an overload after the 200)."""
    if api == "anthropic":
        error = {"type": "error", "error": {"type": "overloaded_error", "message": message}}
        return StreamPlan([(_sse_event(error), 0)], 0)
    return StreamPlan([(_sse({"error": {"message": message, "type": "server_error"}}), 0)], 0)


def without_done(plan: StreamPlan) -> StreamPlan:
    """Every choice finished, then a clean end but no end marker (``[DONE]``, ``message_stop``)."""
    return StreamPlan(plan.events[:-1], plan.terminal)


# ---------------------------------------------------------------- embeddings

EMBEDDING_DIMENSIONS = 8  # the default vector length: small, and enough to tell inputs apart


def _embedding_inputs(value: Any) -> list[Any]:
    """The items of an ``input`` (a string, strings, token ids, or token-id arrays)."""
    if isinstance(value, str) and value:
        return [value]
    _require(isinstance(value, list) and bool(value), "'input' must be a non-empty string or list")
    assert isinstance(value, list)
    if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return [value]
    _require(
        all((isinstance(v, str) and v) or (isinstance(v, list) and v) for v in value),
        "'input' items must be non-empty strings or token arrays",
    )
    return value


def _vector(model: str, item: Any, dimensions: int) -> list[float]:
    """A unit vector derived from a hash of the model and the input: the same input
    always gets the same vector, other inputs other ones."""
    seed = hashlib.sha256(orjson.dumps([model, item])).digest()
    raw = b"".join(
        hashlib.sha256(seed + i.to_bytes(4, "big")).digest() for i in range(-(-dimensions // 8))
    )
    values = [(v / 2**31) - 1.0 for v in struct.unpack(f">{dimensions}I", raw[: 4 * dimensions])]
    norm = sum(v * v for v in values) ** 0.5 or 1.0
    # Rounded through float32, as a provider's vectors are, so base64 and float agree.
    packed = struct.pack(f"<{dimensions}f", *(v / norm for v in values))
    return list(struct.unpack(f"<{dimensions}f", packed))


def _tokens(item: Any) -> int:
    return len(item) if isinstance(item, list) else max(1, len(str(item).split()))


def openai_embeddings(body: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's answer to ``POST /v1/embeddings``, deterministic in the body."""
    model = body.get("model")
    _require(isinstance(model, str) and bool(model), "'model' is required")
    assert isinstance(model, str)
    items = _embedding_inputs(body.get("input"))
    dimensions = body.get("dimensions") or EMBEDDING_DIMENSIONS
    _require(
        isinstance(dimensions, int) and 1 <= dimensions <= 4096, "'dimensions' must be 1..4096"
    )
    encoding = body.get("encoding_format") or "float"
    _require(encoding in ("float", "base64"), "'encoding_format' must be float or base64")
    data = []
    for index, item in enumerate(items):
        vector = _vector(model, item, dimensions)
        embedding: Any = vector
        if encoding == "base64":
            embedding = base64.b64encode(struct.pack(f"<{dimensions}f", *vector)).decode()
        data.append({"object": "embedding", "index": index, "embedding": embedding})
    tokens = sum(_tokens(item) for item in items)
    return {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
