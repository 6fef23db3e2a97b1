"""AWS Bedrock's wire format in the local provider: Converse and ConverseStream, and
InvokeModel for Titan text embeddings.

A request is checked as Bedrock checks it: its SigV4 signature recomputed with botocore
from the known test credentials (or a Bedrock API key as a bearer token), its body against
the Converse shapes (alternating turns that start with the user, one member per content
block, a tool configuration wherever tool blocks are). It is then read into the same
``ScriptedReply`` as the other APIs' (``provider_replies``, through the Anthropic reading
of it) and answered as a ``ConverseResponse``, or as the AWS binary event stream
(``application/vnd.amazon.eventstream``: each message a prelude with its CRC32, string
headers, a JSON payload, the message's CRC32) that ``provider_sse``'s pacing and the
faults (``provider_faults``) spoil like any stream. Errors are Bedrock's: the type in
``x-amzn-ErrorType``, the reason in the body's ``message``.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import os
import re
import struct
import time
import uuid
import zlib
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import orjson
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import ReadOnlyCredentials
from starlette.requests import Request
from starlette.responses import Response

from deploy.local.provider_faults import Fault
from deploy.local.provider_openai import openai_embeddings
from deploy.local.provider_replies import ScriptedReply, anthropic_reply
from deploy.local.provider_settings import ProviderSettings
from deploy.local.provider_sse import StreamPlan, fragments, word_pieces

__all__ = [
    "EVENT_STREAM",
    "TEST_ACCESS_KEY_ID",
    "TEST_API_KEY",
    "TEST_SECRET_ACCESS_KEY",
    "TEST_SESSION_TOKEN",
    "BedrockRejection",
    "bedrock_error_response",
    "bedrock_fault_response",
    "bedrock_stream",
    "check_bedrock",
    "check_titan",
    "converse_answer",
    "credentials_env",
    "encode_message",
]

EVENT_STREAM = "application/vnd.amazon.eventstream"
# The credentials the stand-in knows (what AWS's IAM would): tests sign with them.
TEST_ACCESS_KEY_ID = "AKIAPRISMLOCALTEST01"
TEST_SECRET_ACCESS_KEY = "prism-local-bedrock-secret-access-key-0001"
TEST_SESSION_TOKEN = "prism-local-bedrock-session-token"
TEST_API_KEY = "prism-local-bedrock-api-key"  # a Bedrock API key (bearer), when settings have none
_SIGNATURE_MAX_SKEW = 300  # seconds: AWS refuses a signature older or newer than 5 minutes
_AUTHORIZATION = re.compile(
    r"AWS4-HMAC-SHA256 Credential=(?P<key>[^/,\s]+)/(?P<date>\d{8})/(?P<region>[^/,\s]+)/"
    r"(?P<service>[^/,\s]+)/aws4_request,\s*SignedHeaders=(?P<signed>[^,\s]+),\s*"
    r"Signature=(?P<signature>[0-9a-f]{64})"
)
_ERROR_TYPES = {
    400: "ValidationException",
    403: "AccessDeniedException",
    404: "ResourceNotFoundException",
    408: "ModelTimeoutException",
    424: "ModelErrorException",
    429: "ThrottlingException",
    500: "InternalServerException",
    503: "ServiceUnavailableException",
}
_REQUEST_KEYS = frozenset(
    {
        "messages",
        "system",
        "inferenceConfig",
        "toolConfig",
        "guardrailConfig",
        "additionalModelRequestFields",
        "additionalModelResponseFieldPaths",
        "promptVariables",
        "requestMetadata",
        "performanceConfig",
        "serviceTier",
        "outputConfig",
        "projectIdentifier",
    }
)
_BLOCK_KEYS = frozenset(
    {
        "text",
        "image",
        "document",
        "video",
        "audio",
        "toolUse",
        "toolResult",
        "guardContent",
        "cachePoint",
        "reasoningContent",
        "citationsContent",
        "searchResult",
    }
)
_INFERENCE_KEYS = frozenset({"maxTokens", "temperature", "topP", "stopSequences"})
_IMAGE_FORMATS = frozenset({"png", "jpeg", "gif", "webp"})


def credentials_env() -> dict[str, str]:
    """Variables that point botocore's standard credential chain at the test credentials,
    and at nothing else (no profile files, no instance metadata service)."""
    return {
        "AWS_ACCESS_KEY_ID": TEST_ACCESS_KEY_ID,
        "AWS_SECRET_ACCESS_KEY": TEST_SECRET_ACCESS_KEY,
        "AWS_SESSION_TOKEN": TEST_SESSION_TOKEN,
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_EC2_METADATA_DISABLED": "true",
    }


class BedrockRejection(Exception):
    """A request Bedrock would refuse, with the answer it would give."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.response = bedrock_error_response(status, message, kind)


def bedrock_error_response(status: int, message: str, kind: str | None = None) -> Response:
    """An error as Bedrock answers it (the type's default follows the status)."""
    kind = (
        kind
        or _ERROR_TYPES.get(status)
        or ("ValidationException" if status < 500 else "InternalServerException")
    )
    headers = {
        "x-amzn-ErrorType": f"{kind}:http://internal.amazon.com/coral/com.amazon.bedrock/",
        "x-amzn-RequestId": str(uuid.uuid4()),
    }
    return Response(orjson.dumps({"message": message}), status, headers, "application/json")


def bedrock_fault_response(fault: Fault) -> Response:
    """The answer to a ``status`` or ``rate_limit`` fault (Bedrock sends no Retry-After)."""
    if fault.mode == "rate_limit":
        return bedrock_error_response(429, "Too many requests, please wait before trying again.")
    return bedrock_error_response(fault.status, fault.message)


# ---------------------------------------------------------------- the signature


def _check_signature(request: Request, raw: bytes, settings: ProviderSettings) -> None:
    """Refuse the request unless its SigV4 signature is right (or it carries the API key)."""
    headers = request.headers
    authorization = headers.get("authorization", "")
    if authorization.startswith("Bearer "):
        if not hmac.compare_digest(authorization[7:], settings.api_key or TEST_API_KEY):
            raise BedrockRejection(403, "AccessDeniedException", "Invalid API Key format.")
        return
    match = _AUTHORIZATION.fullmatch(authorization)
    if match is None:
        raise BedrockRejection(
            403, "MissingAuthenticationTokenException", "Missing Authentication Token"
        )
    if match["key"] != TEST_ACCESS_KEY_ID:
        raise BedrockRejection(
            403,
            "UnrecognizedClientException",
            "The security token included in the request is invalid.",
        )
    if match["service"] != "bedrock":
        raise BedrockRejection(
            403,
            "InvalidSignatureException",
            "Credential should be scoped to correct service: 'bedrock'.",
        )
    token = headers.get("x-amz-security-token")
    if token is not None and token != TEST_SESSION_TOKEN:
        raise BedrockRejection(
            403,
            "UnrecognizedClientException",
            "The security token included in the request is invalid.",
        )
    stamp = headers.get("x-amz-date", "")
    try:
        signed_at = datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    except ValueError:
        raise BedrockRejection(
            400,
            "IncompleteSignatureException",
            "Authorization header requires existence of either a 'X-Amz-Date' or a 'Date' header.",
        ) from None
    if abs(time.time() - signed_at.timestamp()) > _SIGNATURE_MAX_SKEW or stamp[:8] != match["date"]:
        raise BedrockRejection(403, "InvalidSignatureException", "Signature expired.")
    signed = match["signed"].split(";")
    if "host" not in signed or (token is not None and "x-amz-security-token" not in signed):
        raise BedrockRejection(403, "InvalidSignatureException", "Required headers not signed.")
    # Recomputed from the request as it arrived: its raw path, the headers it signed, the
    # body's bytes.
    scope = request.scope
    query = scope.get("query_string") or b""
    url = f"http://{headers.get('host', '')}{scope['raw_path'].decode()}"
    if query:
        url += "?" + query.decode()
    signed_request = AWSRequest(
        method=request.method,
        url=url,
        data=raw,
        headers={name: ",".join(headers.getlist(name)) for name in signed},
    )
    signed_request.context["timestamp"] = stamp
    signer = SigV4Auth(
        ReadOnlyCredentials(TEST_ACCESS_KEY_ID, TEST_SECRET_ACCESS_KEY, token),
        "bedrock",
        match["region"],
    )
    canonical = signer.canonical_request(signed_request)
    expected = signer.signature(signer.string_to_sign(signed_request, canonical), signed_request)
    if not hmac.compare_digest(expected, match["signature"]):
        raise BedrockRejection(
            403,
            "InvalidSignatureException",
            "The request signature we calculated does not match the signature you provided. "
            "Check your AWS Secret Access Key and signing method.",
        )


# ---------------------------------------------------------------- the body


def _invalid(message: str) -> BedrockRejection:
    return BedrockRejection(400, "ValidationException", message)


def _one_member(block: Any, where: str, allowed: frozenset[str]) -> str:
    if not isinstance(block, dict) or len(block) != 1 or next(iter(block)) not in allowed:
        raise _invalid(f"{where} must set exactly one of {', '.join(sorted(allowed))}.")
    return str(next(iter(block)))


def _check_block(block: Any, where: str) -> tuple[str, bool]:
    """A content block's text (what the reply echoes) and whether it is a tool block."""
    kind = _one_member(block, where, _BLOCK_KEYS)
    value = block[kind]
    if kind == "text":
        if not isinstance(value, str) or not value.strip():
            raise _invalid(
                f"The text field in the ContentBlock object at {where} is blank. "
                "Add text to the text field, and try again."
            )
        return value, False
    if kind == "image":
        source = value.get("source") if isinstance(value, dict) else None
        data = source.get("bytes") if isinstance(source, dict) else None
        if not isinstance(value, dict) or value.get("format") not in _IMAGE_FORMATS:
            raise _invalid(f"{where}.image.format must be one of png, jpeg, gif, webp.")
        try:
            base64.b64decode(data if isinstance(data, str) else "?", validate=True)
        except binascii.Error:
            raise _invalid(f"{where}.image.source.bytes must be base64.") from None
    elif kind == "toolUse":
        if (
            not isinstance(value, dict)
            or not all(isinstance(value.get(k), str) and value[k] for k in ("toolUseId", "name"))
            or "input" not in value
        ):
            raise _invalid(f"{where}.toolUse needs toolUseId, name and input.")
        return "", True
    elif kind == "toolResult":
        content = value.get("content") if isinstance(value, dict) else None
        if not isinstance(value.get("toolUseId"), str) or not isinstance(content, list):
            raise _invalid(f"{where}.toolResult needs toolUseId and content.")
        for i, part in enumerate(content):
            _one_member(
                part,
                f"{where}.toolResult.content.{i}",
                frozenset({"text", "json", "image", "document", "video", "searchResult"}),
            )
        return "", True
    return "", False


def _check_messages(messages: Any) -> tuple[list[dict[str, Any]], bool]:
    """The turns as Anthropic-shaped text messages, and whether tool blocks are in them."""
    if not isinstance(messages, list) or not messages:
        raise _invalid("The model returned the following errors: messages: must not be empty")
    turns: list[dict[str, Any]] = []
    tools_used = False
    for index, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        content = message.get("content") if isinstance(message, dict) else None
        if role not in ("user", "assistant") or not isinstance(content, list) or not content:
            raise _invalid(f"messages.{index} needs a role (user or assistant) and content.")
        if (index == 0 and role != "user") or (turns and turns[-1]["role"] == role):
            raise _invalid(
                "A conversation must start with a user message and alternate between user "
                "and assistant roles. Try again with a conversation that does."
            )
        texts = []
        for position, block in enumerate(content):
            text, tool = _check_block(block, f"messages.{index}.content.{position}")
            tools_used |= tool
            if text:
                texts.append({"type": "text", "text": text})
        turns.append({"role": role, "content": texts})
    return turns, tools_used


def _check_inference(config: Any) -> int:
    """The ``maxTokens`` (4096 when absent) of a valid ``inferenceConfig``."""
    if config is None:
        return 4096
    if not isinstance(config, dict) or set(config) - _INFERENCE_KEYS:
        raise _invalid(f"inferenceConfig may hold only {', '.join(sorted(_INFERENCE_KEYS))}.")
    limit = config.get("maxTokens", 4096)
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise _invalid("inferenceConfig.maxTokens must be a positive integer.")
    for name in ("temperature", "topP"):
        value = config.get(name, 0)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
            raise _invalid(f"inferenceConfig.{name} must be between 0 and 1.")
    stops = config.get("stopSequences", [])
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise _invalid("inferenceConfig.stopSequences must be a list of strings.")
    return limit


def _check_tools(config: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A valid ``toolConfig`` as Anthropic-shaped tools and tool choice."""
    tools = config.get("tools") if isinstance(config, dict) else None
    if not isinstance(tools, list) or not tools:
        raise _invalid("toolConfig.tools must be a non-empty list.")
    converted = []
    for i, tool in enumerate(tools):
        spec = tool.get("toolSpec") if isinstance(tool, dict) else None
        schema = spec.get("inputSchema") if isinstance(spec, dict) else None
        if (
            not isinstance(spec, dict)
            or not isinstance(spec.get("name"), str)
            or not (isinstance(schema, dict) and isinstance(schema.get("json"), dict))
        ):
            raise _invalid(f"toolConfig.tools.{i}.toolSpec needs a name and inputSchema.json.")
        converted.append({"name": spec["name"], "input_schema": schema["json"]})
    assert isinstance(config, dict)
    choice = config.get("toolChoice", {"auto": {}})
    kind = _one_member(choice, "toolConfig.toolChoice", frozenset({"auto", "any", "tool"}))
    if kind == "tool":
        name = choice["tool"].get("name") if isinstance(choice["tool"], dict) else None
        return converted, {"type": "tool", "name": name}
    return converted, {"type": kind}


def check_bedrock(
    request: Request, raw: bytes, settings: ProviderSettings
) -> tuple[dict[str, Any], ScriptedReply]:
    """The Converse body of a request Bedrock would take, and the reply to it; else a
    ``BedrockRejection`` with Bedrock's answer."""
    _check_signature(request, raw, settings)
    model = request.path_params.get("model_id") or ""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise _invalid(
            "Malformed input request, please reformat your input and try again."
        ) from None
    if not isinstance(body, dict):
        raise _invalid("Malformed input request, please reformat your input and try again.")
    unknown = set(body) - _REQUEST_KEYS
    if unknown:
        raise _invalid(
            f"Malformed input request: extraneous key [{sorted(unknown)[0]}] is not permitted"
        )
    turns, tools_used = _check_messages(body.get("messages"))
    system = body.get("system", [])
    if not isinstance(system, list):
        raise _invalid("system must be a list of blocks.")
    texts = [
        b["text"]
        for i, b in enumerate(system)
        if _one_member(b, f"system.{i}", frozenset({"text", "cachePoint", "guardContent"}))
        == "text"
    ]
    reading: dict[str, Any] = {
        "model": model,
        "max_tokens": _check_inference(body.get("inferenceConfig")),
        "messages": turns,
        "converse": body,  # the reply's tag follows the whole Converse body
    }
    if texts:
        reading["system"] = "\n".join(texts)
    if "toolConfig" in body:
        reading["tools"], reading["tool_choice"] = _check_tools(body["toolConfig"])
    elif tools_used:
        raise _invalid(
            "The toolConfig field must be defined when using toolUse and toolResult content blocks."
        )
    try:
        return body, anthropic_reply(settings, reading)
    except ValueError as error:
        raise _invalid(str(error)) from None


def check_titan(
    request: Request, raw: bytes, settings: ProviderSettings
) -> tuple[dict[str, Any], dict[str, Any]]:
    """InvokeModel's body for a Titan text embedding, and the answer to it (deterministic
    vectors, 1024 dimensions unless it asks for 256 or 512); else a ``BedrockRejection``."""
    _check_signature(request, raw, settings)
    model = request.path_params.get("model_id") or ""
    if not model.startswith("amazon.titan-embed"):
        raise BedrockRejection(404, "ResourceNotFoundException", "Model not found in the stand-in.")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        body = None
    text = body.get("inputText") if isinstance(body, dict) else None
    if not isinstance(body, dict) or not isinstance(text, str) or not text:
        raise _invalid("Malformed input request: #: required key [inputText] not found")
    unknown = set(body) - {"inputText", "dimensions", "normalize", "embeddingTypes"}
    if unknown:
        raise _invalid(
            f"Malformed input request: extraneous key [{sorted(unknown)[0]}] is not permitted"
        )
    dimensions = body.get("dimensions", 1024)
    if dimensions not in (256, 512, 1024):
        raise _invalid("Malformed input request: #/dimensions: 8 is not a valid enum value")
    vector = openai_embeddings({"model": model, "input": text, "dimensions": dimensions})
    answer = {
        "embedding": vector["data"][0]["embedding"],
        "embeddingsByType": {"float": vector["data"][0]["embedding"]},
        "inputTextTokenCount": vector["usage"]["prompt_tokens"],
    }
    return body, answer


# ---------------------------------------------------------------- the answers


def _block(reply: ScriptedReply) -> dict[str, Any]:
    if reply.tool_call is None:
        return {"text": reply.texts[0]}
    call = reply.tool_call
    return {
        "toolUse": {"toolUseId": f"tooluse_{reply.tag}", "name": call.name, "input": call.input}
    }


def _stop_reason(reply: ScriptedReply) -> str:
    return "end_turn" if reply.tool_call is None else "tool_use"


def _usage(reply: ScriptedReply) -> dict[str, int]:
    total = reply.prompt_tokens + reply.completion_tokens
    return {
        "inputTokens": reply.prompt_tokens,
        "outputTokens": reply.completion_tokens,
        "totalTokens": total,
    }


def converse_answer(reply: ScriptedReply) -> dict[str, Any]:
    """The ``ConverseResponse`` for a reply."""
    return {
        "output": {"message": {"role": "assistant", "content": [_block(reply)]}},
        "stopReason": _stop_reason(reply),
        "usage": _usage(reply),
        "metrics": {"latencyMs": 1},
    }


def _header(name: str, value: str) -> bytes:
    """One event-stream header of the string type (7): length-prefixed name and value."""
    name_bytes, value_bytes = name.encode(), value.encode()
    return (
        struct.pack("!B", len(name_bytes))
        + name_bytes
        + struct.pack("!BH", 7, len(value_bytes))
        + value_bytes
    )


def encode_message(headers: Mapping[str, str], payload: bytes) -> bytes:
    """One event-stream message: the prelude (total length, headers length) and its CRC32,
    the headers, the payload, and the CRC32 of everything before it."""
    encoded = b"".join(_header(name, value) for name, value in headers.items())
    prelude = struct.pack("!II", 12 + len(encoded) + len(payload) + 4, len(encoded))
    message = prelude + struct.pack("!I", zlib.crc32(prelude)) + encoded + payload
    return message + struct.pack("!I", zlib.crc32(message))


def _event(kind: str, data: dict[str, Any]) -> bytes:
    # Bedrock pads each event's JSON with a "p" member of varying length (against
    # length side channels); clients must ignore it.
    payload = orjson.dumps({**data, "p": "abcdefghijklmnopqrstuvwxyzABCDEF"[: len(kind)]})
    headers = {":event-type": kind, ":content-type": "application/json", ":message-type": "event"}
    return encode_message(headers, payload)


def _exception(kind: str, message: str) -> bytes:
    headers = {
        ":exception-type": kind,
        ":content-type": "application/json",
        ":message-type": "exception",
    }
    return encode_message(headers, orjson.dumps({"message": message}))


def _plan(settings: ProviderSettings, reply: ScriptedReply) -> StreamPlan:
    events = [(_event("messageStart", {"role": "assistant"}), 0)]
    if reply.tool_call is None:
        pieces = word_pieces(reply.texts[0], settings.chunk_count)
        events += [
            (_event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": p}}), w)
            for p, w in pieces
        ]
    else:
        call = reply.tool_call
        start = {"toolUse": {"toolUseId": f"tooluse_{reply.tag}", "name": call.name}}
        events.append((_event("contentBlockStart", {"contentBlockIndex": 0, "start": start}), 0))
        events += [
            (
                _event(
                    "contentBlockDelta",
                    {"contentBlockIndex": 0, "delta": {"toolUse": {"input": f}}},
                ),
                1,
            )
            for f in fragments(call.arguments)
        ]
    terminal = len(events)
    metadata = {"usage": _usage(reply), "metrics": {"latencyMs": 1}}
    events += [
        (_event("contentBlockStop", {"contentBlockIndex": 0}), 0),
        (_event("messageStop", {"stopReason": _stop_reason(reply)}), 0),
        (_event("metadata", metadata), 0),
    ]
    return StreamPlan(events, terminal)


def bedrock_stream(
    settings: ProviderSettings, reply: ScriptedReply, fault: Fault | None
) -> StreamPlan:
    """The reply's ConverseStream, spoiled as the fault says: ``malformed_json`` (an event
    whose payload is not JSON), ``no_done`` (no final ``metadata``), ``error_event`` (only
    a ``serviceUnavailableException``); pacing and cuts are the server's."""
    plan = _plan(settings, reply)
    mode = fault.mode if fault is not None else None
    if mode == "malformed_json":
        headers = {
            ":event-type": "contentBlockDelta",
            ":content-type": "application/json",
            ":message-type": "event",
        }
        return StreamPlan([plan.events[0], (encode_message(headers, b'{"delta": <<not'), 0)], 2)
    if mode == "no_done":
        return StreamPlan(plan.events[:-1], plan.terminal)
    if mode == "error_event":
        assert fault is not None
        return StreamPlan([(_exception("serviceUnavailableException", fault.message), 0)], 0)
    return plan
