"""Gemini's wire format in the local provider: the Generative Language API's
``generateContent``, its SSE stream, ``embedContent`` / ``batchEmbedContents``, the model
list, and its errors.

A request is checked as the real API checks it (the key in ``x-goog-api-key`` or ``?key=``,
the path, unknown fields, roles, empty parts, function responses that answer the call
turn, Gemini 3's thought signatures) and read into the same ``ScriptedReply``
(``provider_replies``) as the other APIs: one candidate, text or one ``functionCall``,
streamed as whole ``GenerateContentResponse`` events, the last with its ``finishReason``
and the usage. The server side (pacing, faults, counters) is ``provider_app``'s.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.responses import Response

from deploy.local.provider_faults import Fault, json_response
from deploy.local.provider_openai import openai_embeddings
from deploy.local.provider_replies import (
    ScriptedReply,
    _build_reply,
    _mentioned,
    _named,
    require,
)
from deploy.local.provider_settings import ProviderSettings
from deploy.local.provider_sse import StreamPlan, word_pieces

__all__ = [
    "GEMINI_MODELS",
    "GeminiCall",
    "camel_case",
    "gemini_call",
    "gemini_embeddings",
    "gemini_error",
    "gemini_fault_response",
    "gemini_json_stream",
    "gemini_models",
    "gemini_reply",
    "gemini_response",
    "gemini_stream",
]

GEMINI_MODELS = ("gemini-2.5-flash", "gemini-2.5-pro", "gemini-3-flash", "gemini-embedding-001")
VERSIONS = frozenset({"v1", "v1beta"})
_GENERATE = frozenset({"generateContent", "streamGenerateContent"})
_EMBED = frozenset({"embedContent", "batchEmbedContents"})
_STATUS_NAMES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    402: "RESOURCE_EXHAUSTED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "NOT_IMPLEMENTED",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
# The fields the API knows (what it does not know is a 400, as there).
_REQUEST_FIELDS = frozenset(
    {
        "contents",
        "systemInstruction",
        "tools",
        "toolConfig",
        "generationConfig",
        "safetySettings",
        "cachedContent",
    }
)
_CONFIG_FIELDS = frozenset(
    {
        "stopSequences",
        "responseMimeType",
        "responseSchema",
        "responseJsonSchema",
        "responseModalities",
        "candidateCount",
        "maxOutputTokens",
        "temperature",
        "topP",
        "topK",
        "seed",
        "presencePenalty",
        "frequencyPenalty",
        "responseLogprobs",
        "logprobs",
        "enableEnhancedCivicAnswers",
        "speechConfig",
        "thinkingConfig",
        "imageConfig",
        "mediaResolution",
    }
)
_PART_FIELDS = frozenset(
    {
        "text",
        "inlineData",
        "fileData",
        "functionCall",
        "functionResponse",
        "executableCode",
        "codeExecutionResult",
        "thought",
        "thoughtSignature",
        "videoMetadata",
        "mediaResolution",
        "partMetadata",
    }
)
_DATA_FIELDS = ("text", "inlineData", "fileData", "functionCall", "functionResponse")
_DECLARATION_FIELDS = frozenset(
    {
        "name",
        "description",
        "parameters",
        "parametersJsonSchema",
        "response",
        "responseJsonSchema",
        "behavior",
    }
)
_MODES = frozenset({"AUTO", "ANY", "NONE", "VALIDATED"})


# ---------------------------------------------------------------- errors


def gemini_error(
    status: int,
    message: str,
    details: list[dict[str, Any]] | None = None,
    headers: Mapping[str, str] | None = None,
) -> Response:
    """An error as Google's APIs send it: ``{"error": {code, message, status, details}}``."""
    error: dict[str, Any] = {
        "code": status,
        "message": message,
        "status": _STATUS_NAMES.get(status, "UNKNOWN"),
    }
    if details:
        error["details"] = details
    return json_response({"error": error}, status, headers)


def gemini_fault_response(fault: Fault) -> Response:
    """A ``status`` or ``rate_limit`` fault: a 429 says when to retry in its RetryInfo
    (Gemini sends no Retry-After header)."""
    if fault.mode == "rate_limit":
        delay = {"@type": "type.googleapis.com/google.rpc.RetryInfo"}
        delay["retryDelay"] = f"{fault.retry_after:g}s"
        return gemini_error(429, "Resource has been exhausted (injected).", [delay])
    return gemini_error(fault.status, fault.message)


class _Refused(ValueError):
    """A request the real API would refuse, with its status."""

    def __init__(self, message: str, status: int = 400, details: list[Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.details = details


# Values that are the caller's own data, whose keys are kept as sent.
_FREE_FORM = frozenset(
    {
        "args",
        "response",
        "parameters",
        "parametersJsonSchema",
        "responseSchema",
        "responseJsonSchema",
    }
)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(word[:1].upper() + word[1:] for word in rest)


def camel_case(value: Any) -> Any:
    """A request with its field names in lowerCamelCase: the API's JSON parser takes the
    proto names too (``function_declarations``), as Google's own client sends some."""
    if isinstance(value, list):
        return [camel_case(item) for item in value]
    if not isinstance(value, dict):
        return value
    out = {}
    for key, item in value.items():
        name = _camel(key) if isinstance(key, str) else key
        out[name] = item if name in _FREE_FORM else camel_case(item)
    return out


def _unknown(where: str, value: Any, known: frozenset[str]) -> None:
    if not isinstance(value, dict):
        raise _Refused(f"Invalid JSON payload received. {where} must be an object.")
    for name in value:
        if name not in known:
            raise _Refused(
                f"Invalid JSON payload received. Unknown name \"{name}\" at '{where}': "
                "Cannot find field."
            )


# ---------------------------------------------------------------- requests


@dataclass(frozen=True, slots=True)
class GeminiCall:
    """A checked request: its model, method and body, and the reply to a generate call."""

    model: str
    method: str
    body: dict[str, Any]
    reply: ScriptedReply | None  # None for the embedding methods
    sse: bool  # streamGenerateContent?alt=sse

    @property
    def stream(self) -> bool:
        return self.method == "streamGenerateContent"


def _check_key(headers: Mapping[str, str], query: Mapping[str, str], key: str | None) -> None:
    given = headers.get("x-goog-api-key") or query.get("key")
    if not given:
        raise _Refused(
            "Method doesn't allow unregistered callers (callers without established identity)."
            " Please use API Key or other form of API consumer identity to call this API.",
            403,
        )
    if key is not None and not hmac.compare_digest(given.encode(), key.encode()):
        info = {
            "@type": "type.googleapis.com/google.rpc.ErrorInfo",
            "reason": "API_KEY_INVALID",
            "domain": "googleapis.com",
            "metadata": {"service": "generativelanguage.googleapis.com"},
        }
        raise _Refused("API key not valid. Please pass a valid API key.", 400, [info])


def _check_parts(where: str, parts: Any) -> list[dict[str, Any]]:
    if not isinstance(parts, list) or not parts:
        raise _Refused(f"* GenerateContentRequest.{where}.parts: contents.parts must not be empty.")
    for index, part in enumerate(parts):
        _unknown(f"{where}.parts[{index}]", part, _PART_FIELDS)
        if sum(name in part for name in _DATA_FIELDS) > 1:
            raise _Refused(f"* GenerateContentRequest.{where}.parts[{index}]: only one data field.")
    return parts


def _check_contents(body: dict[str, Any], model: str) -> list[dict[str, Any]]:
    contents = body.get("contents")
    if not isinstance(contents, list) or not contents:
        raise _Refused("* GenerateContentRequest.contents: contents is not specified")
    previous: dict[str, Any] | None = None
    for index, content in enumerate(contents):
        where = f"contents[{index}]"
        _unknown(where, content, frozenset({"role", "parts"}))
        if content.get("role", "user") not in ("user", "model"):
            raise _Refused("Please use a valid role: user, model.")
        parts = _check_parts(where, content.get("parts"))
        calls = [p for p in parts if "functionCall" in p]
        if calls and model.startswith("gemini-3") and "thoughtSignature" not in calls[0]:
            raise _Refused(
                "Function call is missing a thought_signature in functionCall parts. This is "
                "required for tools to work correctly. Additional data, function call "
                f"`{calls[0]['functionCall'].get('name')}`, position {index}."
            )
        responses = sum("functionResponse" in p for p in parts)
        if responses:
            asked = (
                sum("functionCall" in p for p in previous["parts"])
                if previous is not None and previous.get("role") == "model"
                else 0
            )
            if asked != responses:
                raise _Refused(
                    "Please ensure that the number of function response parts is equal to the "
                    "number of function call parts of the function call turn."
                )
        previous = content
    return contents


def _tools(body: dict[str, Any]) -> list[tuple[str, Any]]:
    found: list[tuple[str, Any]] = []
    for t_index, tool in enumerate(body.get("tools") or []):
        if not isinstance(tool, dict):
            raise _Refused(f"Invalid JSON payload received. tools[{t_index}] must be an object.")
        for d_index, declaration in enumerate(tool.get("functionDeclarations") or []):
            where = f"tools[{t_index}].function_declarations[{d_index}]"
            _unknown(where, declaration, _DECLARATION_FIELDS)
            if not declaration.get("name"):
                raise _Refused(f"* GenerateContentRequest.{where}.name: Name cannot be empty.")
            if "parameters" in declaration and "parametersJsonSchema" in declaration:
                raise _Refused(f"{where}: parameters and parametersJsonSchema are exclusive.")
            schema = declaration.get("parametersJsonSchema", declaration.get("parameters"))
            found.append((str(declaration["name"]), schema))
    return found


def _text(parts: list[dict[str, Any]]) -> str:
    return " ".join(str(p["text"]) for p in parts if isinstance(p.get("text"), str))


def gemini_reply(settings: ProviderSettings, body: dict[str, Any], model: str) -> ScriptedReply:
    """The reply to a checked ``generateContent`` body for ``model``."""
    _unknown("GenerateContentRequest", body, _REQUEST_FIELDS)
    contents = _check_contents(body, model)
    if "generationConfig" in body:
        _unknown("generation_config", body["generationConfig"], _CONFIG_FIELDS)
    tools = _tools(body)
    config = (body.get("toolConfig") or {}).get("functionCallingConfig") or {}
    mode = config.get("mode", "AUTO")
    require(mode in _MODES, f"Invalid value at 'tool_config.function_calling_config.mode': {mode}")
    system = body.get("systemInstruction")
    texts = [_text(system.get("parts") or []) if isinstance(system, dict) else ""]
    texts += [_text(c["parts"]) for c in contents]
    users = [t for c, t in zip(contents, texts[1:], strict=True) if c.get("role", "user") == "user"]
    last_user = users[-1] if users else ""
    allowed = config.get("allowedFunctionNames") or []
    tool: tuple[str, Any] | None = None
    if tools and mode == "ANY":
        tool = _named(tools, allowed[0]) if allowed else tools[0]
    elif tools and mode in ("AUTO", "VALIDATED") and contents[-1].get("role", "user") == "user":
        # A functionResponse turn has no text, so the conversation can end with text.
        tool = _mentioned(tools, last_user)
    return _build_reply(settings, {**body, "model": model}, texts, last_user, tool, 1)


def gemini_call(
    settings: ProviderSettings,
    version: str,
    target: str,
    headers: Mapping[str, str],
    query: Mapping[str, str],
    raw: bytes,
) -> GeminiCall | Response:
    """``POST /{version}/models/{model}:{method}`` checked; its error answer if refused."""
    model, _, method = target.partition(":")
    try:
        if version not in VERSIONS or not model or method not in _GENERATE | _EMBED:
            raise _Refused(f"Method not found: {version}/models/{target}.", 404)
        _check_key(headers, query, settings.api_key)
        try:
            body = camel_case(orjson.loads(raw))
        except orjson.JSONDecodeError:
            raise _Refused("Invalid JSON payload received. Unexpected token.") from None
        if not isinstance(body, dict):
            raise _Refused("Invalid JSON payload received. Expected an object.")
        reply = gemini_reply(settings, body, model) if method in _GENERATE else None
        if reply is None:
            gemini_embeddings(model, method, body)  # checked now, answered after the faults
    except _Refused as refused:
        return gemini_error(refused.status, str(refused), refused.details)
    except ValueError as invalid:
        return gemini_error(400, str(invalid))
    sse = query.get("alt") == "sse"
    return GeminiCall(model, method, body, reply, sse)


# ---------------------------------------------------------------- answers


def _usage(reply: ScriptedReply) -> dict[str, Any]:
    return {
        "promptTokenCount": reply.prompt_tokens,
        "candidatesTokenCount": reply.completion_tokens,
        "totalTokenCount": reply.prompt_tokens + reply.completion_tokens,
        "promptTokensDetails": [{"modality": "TEXT", "tokenCount": reply.prompt_tokens}],
    }


def _call_part(reply: ScriptedReply) -> dict[str, Any]:
    assert reply.tool_call is not None
    call = {"name": reply.tool_call.name, "args": reply.tool_call.input}
    # Gemini 2.5 and later sign the turn's first call (opaque bytes, base64).
    return {"functionCall": call, "thoughtSignature": "c2lnbmF0dXJl"}


def _envelope(
    reply: ScriptedReply, candidate: dict[str, Any], usage: dict[str, Any]
) -> dict[str, Any]:
    return {
        "candidates": [{**candidate, "index": 0}],
        "usageMetadata": usage,
        "modelVersion": reply.model,
        "responseId": f"resp-{reply.tag}",
    }


def gemini_response(reply: ScriptedReply) -> dict[str, Any]:
    """The ``GenerateContentResponse`` of a reply."""
    part = {"text": reply.texts[0]} if reply.tool_call is None else _call_part(reply)
    candidate = {"content": {"parts": [part], "role": "model"}, "finishReason": "STOP"}
    return _envelope(reply, candidate, _usage(reply))


def gemini_chunks(
    settings: ProviderSettings, reply: ScriptedReply
) -> list[tuple[dict[str, Any], int]]:
    """The stream's events as responses (with the words each carries): text in pieces,
    or the call whole; the last with the finishReason and the whole usage."""
    partial = {"promptTokenCount": reply.prompt_tokens}
    if reply.tool_call is not None:
        return [(gemini_response(reply), 1)]
    chunks: list[tuple[dict[str, Any], int]] = []
    for piece, words in word_pieces(reply.texts[0], settings.chunk_count):
        content = {"content": {"parts": [{"text": piece}], "role": "model"}}
        chunks.append((_envelope(reply, content, partial), words))
    last = {"content": {"parts": [{"text": ""}], "role": "model"}, "finishReason": "STOP"}
    chunks.append((_envelope(reply, last, _usage(reply)), 0))
    return chunks


def _event(data: Any) -> bytes:
    return b"data: " + orjson.dumps(data) + b"\r\n\r\n"


def gemini_stream(
    settings: ProviderSettings, reply: ScriptedReply, fault: Fault | None
) -> StreamPlan:
    """The SSE stream of a reply, spoiled as the fault says (``no_done``: no event with a
    ``finishReason``; ``error_event``: Gemini's error as the first event)."""
    chunks = gemini_chunks(settings, reply)
    events = [(_event(chunk), words) for chunk, words in chunks]
    mode = fault.mode if fault is not None else None
    if mode == "malformed_json":
        return StreamPlan([events[0], (b'data: {"candidates": [<<not json>>\r\n\r\n', 0)], 2)
    if mode == "error_event":
        assert fault is not None
        error = {"code": 503, "message": fault.message, "status": "UNAVAILABLE"}
        return StreamPlan([(_event({"error": error}), 0)], 0)
    if mode == "no_done":
        return StreamPlan(events[:-1], len(events) - 1)
    return StreamPlan(events, len(events) - 1)


def gemini_json_stream(settings: ProviderSettings, reply: ScriptedReply) -> bytes:
    """``streamGenerateContent`` without ``alt=sse``: the events as one JSON array."""
    return orjson.dumps([chunk for chunk, _ in gemini_chunks(settings, reply)])


def gemini_embeddings(model: str, method: str, body: dict[str, Any]) -> dict[str, Any]:
    """``embedContent`` or ``batchEmbedContents``: deterministic vectors (those of the
    OpenAI stand-in for the same texts)."""
    requests: Any = [body]
    if method == "batchEmbedContents":
        _unknown("BatchEmbedContentsRequest", body, frozenset({"requests"}))
        requests = body.get("requests")
        require(isinstance(requests, list) and bool(requests), "* requests: must not be empty")
    known = frozenset({"model", "content", "taskType", "title", "outputDimensionality"})
    vectors = []
    for index, request in enumerate(requests):
        _unknown(f"requests[{index}]", request, known)
        if method == "batchEmbedContents" and request.get("model") != f"models/{model}":
            raise _Refused(
                f"* BatchEmbedContentsRequest.requests[{index}].model: unexpected model name format"
                if not request.get("model")
                else f"Model in requests[{index}] must be the model of the URL (models/{model})."
            )
        content = request.get("content")
        _unknown(f"requests[{index}].content", content, frozenset({"role", "parts"}))
        assert isinstance(content, dict)
        text = _text(_check_parts(f"requests[{index}].content", content.get("parts")))
        dimensions = request.get("outputDimensionality")
        asked: dict[str, Any] = {"model": model, "input": text or " "}
        if dimensions is not None:
            asked["dimensions"] = dimensions
        vectors.append({"values": openai_embeddings(asked)["data"][0]["embedding"]})
    if method == "embedContent":
        return {"embedding": vectors[0]}
    return {"embeddings": vectors}


def gemini_models(
    version: str, headers: Mapping[str, str], query: Mapping[str, str], key: str | None
) -> Response:
    """``GET /{version}/models``: the Gemini models this stand-in lists."""
    try:
        if version not in VERSIONS:
            raise _Refused(f"Method not found: {version}/models.", 404)
        _check_key(headers, query, key)
    except _Refused as refused:
        return gemini_error(refused.status, str(refused), refused.details)
    models = []
    for name in GEMINI_MODELS:
        embedding = "embedding" in name
        methods = (
            ["embedContent", "batchEmbedContents"]
            if embedding
            else ["generateContent", "countTokens", "streamGenerateContent"]
        )
        models.append(
            {
                "name": f"models/{name}",
                "version": "001",
                "displayName": name,
                "inputTokenLimit": 1_048_576,
                "outputTokenLimit": 65_536,
                "supportedGenerationMethods": methods,
            }
        )
    return json_response({"models": models})
