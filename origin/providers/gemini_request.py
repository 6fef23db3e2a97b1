"""OpenAI chat completions → Gemini ``generateContent`` requests, as pure functions (no I/O).

``to_gemini_request``: an OpenAI chat body → a Generative Language API body (``contents``,
``systemInstruction``, ``tools``, ``toolConfig``, ``generationConfig``). What Gemini cannot
express is either dropped (knobs with no equivalent) or rejected with a 400 (``n`` > 1,
content it cannot carry). The way back is apart: the answer in ``gemini_answer``, the
stream in ``gemini_stream``.
"""

from __future__ import annotations

import mimetypes
import re
from typing import Any

from prism import InvalidRequestError

from .chat_turns import tool_call

__all__ = ["SKIP_SIGNATURE", "is_generated_call_id", "to_gemini_request"]

# OpenAI tool_choice -> Gemini functionCallingConfig.mode
_MODES = {"auto": "AUTO", "required": "ANY", "none": "NONE"}
_DATA_URL = re.compile(r"data:(?P<media>[\w.+-]+/[\w.+-]+);base64,(?P<data>.*)", re.DOTALL)
# The ids ``gemini_answer`` makes up for calls Gemini sent without one: never sent back.
_GENERATED_ID = re.compile(r"call_[0-9a-f]{24}")
# Gemini 3 models refuse a replayed functionCall without its thoughtSignature; an OpenAI
# client keeps no such field, so replays carry the validator-skip value Google documents.
SKIP_SIGNATURE = "skip_thought_signature_validator"
# Models that predate thought signatures (they never ask for one).
_NO_SIGNATURES = re.compile(r"(?:models/)?(?:gemini-1|gemini-2\.0|gemma)")
_AUDIO_FORMATS = {"wav": "audio/wav", "mp3": "audio/mp3"}


def is_generated_call_id(call_id: str) -> bool:
    return _GENERATED_ID.fullmatch(call_id) is not None


def _invalid(message: str, param: str) -> InvalidRequestError:
    return InvalidRequestError(message, param=param)


def _inline(url: str, param: str) -> dict[str, Any]:
    match = _DATA_URL.fullmatch(url)
    if match is None:
        raise _invalid(f"'{param}' must be a base64 data URL (data:<type>;base64,...).", param)
    return {"inlineData": {"mimeType": match["media"], "data": match["data"]}}


def _image_part(part: dict[str, Any], param: str) -> dict[str, Any]:
    image = part.get("image_url")
    url = image.get("url") if isinstance(image, dict) else image
    where = f"{param}.image_url"
    if not isinstance(url, str):
        raise _invalid(f"'{where}.url' must be a string.", where)
    if url.startswith("data:"):
        return _inline(url, where)
    if url.startswith(("https://", "http://")):
        file_data = {"fileUri": url}
        media, _ = mimetypes.guess_type(url.split("?", 1)[0])
        if media is not None:
            file_data["mimeType"] = media
        return {"fileData": file_data}
    raise _invalid(f"'{where}.url' must be an http(s) or data URL.", where)


def _audio_part(part: dict[str, Any], param: str) -> dict[str, Any]:
    audio = part.get("input_audio")
    audio = audio if isinstance(audio, dict) else {}
    media = _AUDIO_FORMATS.get(str(audio.get("format")))
    data = audio.get("data")
    if media is None or not isinstance(data, str):
        raise _invalid(
            f"'{param}.input_audio' needs base64 'data' and a wav or mp3 'format'.", param
        )
    return {"inlineData": {"mimeType": media, "data": data}}


def _file_part(part: dict[str, Any], param: str) -> dict[str, Any]:
    file = part.get("file")
    data = file.get("file_data") if isinstance(file, dict) else None
    if not isinstance(data, str):
        # An uploaded file's id means nothing to Gemini.
        raise _invalid(f"'{param}.file.file_data' must be a base64 data URL.", param)
    return _inline(data, f"{param}.file.file_data")


def _parts(content: Any, param: str) -> list[dict[str, Any]]:
    """A message's content (string or parts) as Gemini parts; empty text is dropped."""
    if content is None:
        return []
    if isinstance(content, str):
        return [{"text": content}] if content else []
    if not isinstance(content, list):
        raise _invalid(f"'{param}' must be a string or an array of content parts.", param)
    parts: list[dict[str, Any]] = []
    for position, part in enumerate(content):
        where = f"{param}[{position}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("text", "refusal"):
            assert isinstance(part, dict)
            text = part.get(kind)
            if not isinstance(text, str):
                raise _invalid(f"'{where}.{kind}' must be a string.", where)
            if text:
                parts.append({"text": text})
        elif kind == "image_url":
            assert isinstance(part, dict)
            parts.append(_image_part(part, where))
        elif kind == "input_audio":
            assert isinstance(part, dict)
            parts.append(_audio_part(part, where))
        elif kind == "file":
            assert isinstance(part, dict)
            parts.append(_file_part(part, where))
        else:
            raise _invalid(f"Content part type {kind!r} is not supported for this model.", where)
    return parts


def _text(content: Any, param: str) -> str:
    parts = _parts(content, param)
    if any("text" not in part for part in parts):
        raise _invalid(f"'{param}' may contain only text.", param)
    return "\n\n".join(part["text"] for part in parts)


def _function_call(call: Any, param: str) -> tuple[str, dict[str, Any]]:
    """An OpenAI tool call's id and its ``functionCall`` part."""
    call_id, name, args = tool_call(call, param)
    converted: dict[str, Any] = {"name": name, "args": args}
    if not is_generated_call_id(call_id):
        converted["id"] = call_id  # Gemini's own id goes back to it
    return call_id, {"functionCall": converted}


def _function_response(
    message: dict[str, Any], names: dict[str, str], param: str
) -> dict[str, Any]:
    call_id = message.get("tool_call_id")
    if not isinstance(call_id, str) or not call_id:
        raise _invalid(f"'{param}.tool_call_id' must be a non-empty string.", param)
    name = names.get(call_id)
    if name is None:
        # Gemini matches a response to its call by the function's name.
        raise _invalid(
            f"'{param}.tool_call_id' names no tool call of an earlier assistant message.",
            f"{param}.tool_call_id",
        )
    content = message.get("content")
    output = content if isinstance(content, str) else _text(content, f"{param}.content")
    response: dict[str, Any] = {"name": name, "response": {"output": output}}
    if not is_generated_call_id(call_id):
        response["id"] = call_id
    return {"functionResponse": response}


def _contents(messages: Any, signed: bool) -> tuple[list[str], list[dict[str, Any]]]:
    """System texts, and the conversation as Gemini ``contents`` (roles user and model)."""
    if not isinstance(messages, list):
        raise _invalid("'messages' must be an array of message objects.", "messages")
    system: list[str] = []
    contents: list[dict[str, Any]] = []
    names: dict[str, str] = {}  # tool call id -> function name, for the responses
    previous_tool = False
    for index, message in enumerate(messages):
        param = f"messages[{index}]"
        if not isinstance(message, dict):
            raise _invalid(f"'{param}' must be an object.", param)
        role = message.get("role")
        content = message.get("content")
        is_tool = role == "tool"
        if role in ("system", "developer"):
            text = _text(content, f"{param}.content")
            if text:
                system.append(text)
            continue
        if role == "user":
            parts = _parts(content, f"{param}.content")
        elif role == "assistant":
            role, parts = "model", _parts(content, f"{param}.content")
            calls = message.get("tool_calls") or []
            if not isinstance(calls, list):
                raise _invalid(f"'{param}.tool_calls' must be an array.", f"{param}.tool_calls")
            for position, call in enumerate(calls):
                call_id, part = _function_call(call, f"{param}.tool_calls[{position}]")
                if signed and position == 0:
                    # Only a turn's first call carries the signature (parallel calls too).
                    part["thoughtSignature"] = SKIP_SIGNATURE
                names[call_id] = part["functionCall"]["name"]
                parts.append(part)
        elif is_tool:
            role, parts = "user", [_function_response(message, names, param)]
        else:
            raise _invalid(
                f"Role {role!r} is not supported for this model; use 'tool' messages.",
                f"{param}.role",
            )
        if not parts:
            continue  # an empty turn says nothing, and Gemini rejects a content without parts
        if is_tool and previous_tool:
            # Parallel results: one turn with as many responses as the call turn had calls.
            contents[-1]["parts"].extend(parts)
        else:
            contents.append({"role": role, "parts": parts})
        previous_tool = is_tool
    return system, contents


def _declaration(tool: Any, param: str) -> dict[str, Any]:
    function = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(tool, dict) or tool.get("type", "function") != "function":
        raise _invalid(f"'{param}' must be a function tool.", param)
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise _invalid(f"'{param}.function.name' must be a string.", param)
    declaration: dict[str, Any] = {"name": function["name"]}
    if isinstance(function.get("description"), str):
        declaration["description"] = function["description"]
    if function.get("parameters"):
        # JSON Schema as OpenAI clients write it (``parameters`` takes only an OpenAPI subset).
        declaration["parametersJsonSchema"] = function["parameters"]
    return declaration


def _tool_config(choice: Any) -> dict[str, Any] | None:
    if choice is None:
        return None
    config: dict[str, Any]
    if isinstance(choice, str) and choice in _MODES:
        config = {"mode": _MODES[choice]}
    elif isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if not isinstance(name, str):
            raise _invalid("'tool_choice.function.name' must be a string.", "tool_choice")
        config = {"mode": "ANY", "allowedFunctionNames": [name]}
    else:
        raise _invalid("'tool_choice' is not a valid tool choice.", "tool_choice")
    return {"functionCallingConfig": config}


def _response_format(value: Any) -> dict[str, Any]:
    kind = value.get("type") if isinstance(value, dict) else None
    if value is None or kind == "text":
        return {}
    if kind == "json_object":
        return {"responseMimeType": "application/json"}
    if kind == "json_schema":
        assert isinstance(value, dict)
        spec = value.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise _invalid(
                "'response_format.json_schema.schema' must be an object.", "response_format"
            )
        return {"responseMimeType": "application/json", "responseJsonSchema": schema}
    raise _invalid("'response_format' must be text, json_object or json_schema.", "response_format")


def _generation_config(body: dict[str, Any]) -> dict[str, Any]:
    config: dict[str, Any] = {}
    limit = body.get("max_completion_tokens")
    if limit is None:
        limit = body.get("max_tokens")
    if limit is not None:
        config["maxOutputTokens"] = limit
    for name, key in (
        ("temperature", "temperature"),
        ("top_p", "topP"),
        ("seed", "seed"),
        ("presence_penalty", "presencePenalty"),
        ("frequency_penalty", "frequencyPenalty"),
    ):
        if body.get(name) is not None:
            config[key] = body[name]
    stop = body.get("stop")
    if stop:
        config["stopSequences"] = [stop] if isinstance(stop, str) else list(stop)
    config.update(_response_format(body.get("response_format")))
    return config


def to_gemini_request(
    body: dict[str, Any], model: str, safety_settings: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The ``generateContent`` body for an OpenAI chat body (the model is in the URL).

    Dropped (no equivalent): logit_bias, logprobs, parallel_tool_calls, reasoning_effort,
    service_tier, store, user, OpenAI ``metadata`` and the like.
    """
    n = body.get("n")
    if n is not None and n != 1:
        raise _invalid("This model supports only n=1.", "n")
    signed = _NO_SIGNATURES.match(model) is None
    system, contents = _contents(body.get("messages"), signed)
    request: dict[str, Any] = {"contents": contents}
    if system:
        request["systemInstruction"] = {"parts": [{"text": "\n\n".join(system)}]}
    tools = body.get("tools")
    if tools:
        if not isinstance(tools, list):
            raise _invalid("'tools' must be an array.", "tools")
        declarations = [_declaration(tool, f"tools[{i}]") for i, tool in enumerate(tools)]
        request["tools"] = [{"functionDeclarations": declarations}]
        tool_config = _tool_config(body.get("tool_choice"))
        if tool_config is not None:
            request["toolConfig"] = tool_config
    config = _generation_config(body)
    if config:
        request["generationConfig"] = config
    if safety_settings:
        request["safetySettings"] = safety_settings
    return request
