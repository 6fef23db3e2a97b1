"""OpenAI's wire format in the local provider: a chat completion, its chunk stream, and
the answer to ``POST /v1/embeddings``.

Apart from Anthropic's (``provider_anthropic``): the same ``ScriptedReply``
(``provider_replies``) in OpenAI's shapes, with ``[DONE]`` and interleaved choices for
``n`` > 1; the embeddings are OpenAI's only, deterministic in the body.
"""

from __future__ import annotations

import base64
import hashlib
import struct
from itertools import zip_longest
from typing import Any

import orjson

from deploy.local.provider_replies import ScriptedReply, require
from deploy.local.provider_settings import ProviderSettings
from deploy.local.provider_sse import StreamPlan, fragments, sse, word_pieces

__all__ = ["EMBEDDING_DIMENSIONS", "openai_completion", "openai_embeddings", "openai_stream"]


def _openai_usage(reply: ScriptedReply) -> dict[str, int]:
    total = reply.prompt_tokens + reply.completion_tokens
    return {
        "prompt_tokens": reply.prompt_tokens,
        "completion_tokens": reply.completion_tokens,
        "total_tokens": total,
    }


def _openai_tool_call(reply: ScriptedReply, index: int) -> dict[str, Any]:
    assert reply.tool_call is not None
    return {
        "id": f"call_{reply.tag}_{index}",
        "type": "function",
        "function": {"name": reply.tool_call.name, "arguments": reply.tool_call.arguments},
    }


def openai_completion(reply: ScriptedReply, created: int) -> dict[str, Any]:
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
    settings: ProviderSettings, reply: ScriptedReply, created: int, include_usage: bool
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
        return sse({**base, "choices": [choice], **extra})

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
                for f in fragments(reply.tool_call.arguments)
            ]
        else:
            body = [
                (chunk(i, {"content": p}), w) for p, w in word_pieces(text, settings.chunk_count)
            ]
        per_choice.append(body)
    # Interleave choices the way OpenAI does for n > 1.
    events += [event for group in zip_longest(*per_choice) for event in group if event]
    terminal = len(events)
    finish = "tool_calls" if calling else "stop"
    events += [(chunk(i, {}, finish), 0) for i in range(len(reply.texts))]
    if include_usage:
        events.append((sse({**base, "choices": [], "usage": _openai_usage(reply)}), 0))
    events.append((b"data: [DONE]\n\n", 0))
    return StreamPlan(events, terminal)


# ---------------------------------------------------------------- embeddings

EMBEDDING_DIMENSIONS = 8  # the default vector length: small, and enough to tell inputs apart


def _embedding_inputs(value: Any) -> list[Any]:
    """The items of an ``input`` (a string, strings, token ids, or token-id arrays)."""
    if isinstance(value, str) and value:
        return [value]
    require(isinstance(value, list) and bool(value), "'input' must be a non-empty string or list")
    assert isinstance(value, list)
    if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return [value]
    require(
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
    require(isinstance(model, str) and bool(model), "'model' is required")
    assert isinstance(model, str)
    items = _embedding_inputs(body.get("input"))
    dimensions = body.get("dimensions") or EMBEDDING_DIMENSIONS
    require(isinstance(dimensions, int) and 1 <= dimensions <= 4096, "'dimensions' must be 1..4096")
    encoding = body.get("encoding_format") or "float"
    require(encoding in ("float", "base64"), "'encoding_format' must be float or base64")
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
