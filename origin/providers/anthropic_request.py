"""OpenAI chat completions → Anthropic Messages requests, as pure functions (no I/O).

``to_messages_request``: an OpenAI chat body → an Anthropic ``/v1/messages`` body. What
Anthropic cannot express is either dropped (sampling knobs with no equivalent) or
rejected with a 400 (``n`` > 1, content it cannot carry). The way back is apart: the
answer in ``anthropic_answer``, the stream in ``anthropic_stream``.
"""

from __future__ import annotations

import re
from typing import Any

from prism import InvalidRequestError

from .anthropic_answer import STRUCTURED_TOOL
from .chat_turns import TurnBlocks, alternating_turns, tool_call

__all__ = ["DEFAULT_MAX_TOKENS", "TOOL_CHOICES", "structured_schema", "to_messages_request"]

# Anthropic requires max_tokens; OpenAI lets the model run to its own limit.
DEFAULT_MAX_TOKENS = 4096

# OpenAI tool_choice -> Anthropic tool_choice type (``messages_translate`` reads it in reverse)
TOOL_CHOICES = {"auto": "auto", "required": "any", "none": "none"}
_DATA_URL = re.compile(r"data:(?P<media>[\w.+-]+/[\w.+-]+);base64,(?P<data>.*)", re.DOTALL)


def _invalid(message: str, param: str) -> InvalidRequestError:
    return InvalidRequestError(message, param=param)


def _image_block(part: dict[str, Any], param: str) -> dict[str, Any]:
    image = part.get("image_url")
    url = image.get("url") if isinstance(image, dict) else image
    if not isinstance(url, str):
        raise _invalid(f"'{param}.image_url.url' must be a string.", f"{param}.image_url")
    if url.startswith("data:"):
        match = _DATA_URL.fullmatch(url)
        if match is None:
            raise _invalid(
                f"'{param}.image_url.url' must be a base64 data URL (data:<type>;base64,...).",
                f"{param}.image_url",
            )
        source = {"type": "base64", "media_type": match["media"], "data": match["data"]}
        return {"type": "image", "source": source}
    if url.startswith(("https://", "http://")):
        return {"type": "image", "source": {"type": "url", "url": url}}
    raise _invalid(f"'{param}.image_url.url' must be an http(s) or data URL.", f"{param}.image_url")


def _content_blocks(content: Any, param: str) -> list[dict[str, Any]]:
    """A message's content (string or parts) as Anthropic blocks; empty text is dropped
    because Anthropic rejects empty text blocks."""
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    if not isinstance(content, list):
        raise _invalid(f"'{param}' must be a string or an array of content parts.", param)
    blocks: list[dict[str, Any]] = []
    for position, part in enumerate(content):
        where = f"{param}[{position}]"
        kind = part.get("type") if isinstance(part, dict) else None
        block: dict[str, Any]
        if kind in ("text", "refusal"):
            assert isinstance(part, dict)
            text = part.get(kind)
            if not isinstance(text, str):
                raise _invalid(f"'{where}.{kind}' must be a string.", where)
            if not text:
                continue
            block = {"type": "text", "text": text}
        elif kind == "image_url":
            assert isinstance(part, dict)
            block = _image_block(part, where)
        else:
            # Audio and files would be silently lost; say so instead.
            raise _invalid(f"Content part type {kind!r} is not supported for this model.", where)
        if isinstance(part.get("cache_control"), dict):
            # Clients that know they talk to Claude mark prompt-cache breakpoints this way.
            block["cache_control"] = part["cache_control"]
        blocks.append(block)
    return blocks


def _tool_use_block(call: Any, param: str) -> dict[str, Any]:
    checked = tool_call(call, param)
    return {"type": "tool_use", "id": checked.id, "name": checked.name, "input": checked.arguments}


def _tool_result_block(message: dict[str, Any], param: str) -> dict[str, Any]:
    call_id = message.get("tool_call_id")
    if not isinstance(call_id, str) or not call_id:
        raise _invalid(f"'{param}.tool_call_id' must be a non-empty string.", param)
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": call_id}
    content = message.get("content")
    if isinstance(content, str):
        if content:
            block["content"] = content
    else:
        parts = _content_blocks(content, f"{param}.content")
        if parts:
            block["content"] = parts
    return block


def _system_text(content: Any, param: str) -> str:
    blocks = _content_blocks(content, param)
    if any(block["type"] != "text" for block in blocks):
        raise _invalid(f"'{param}' may contain only text.", param)
    return "\n\n".join(block["text"] for block in blocks)


def _system(content: Any, param: str) -> list[str]:
    text = _system_text(content, param)
    return [text] if text else []


_BLOCKS = TurnBlocks(_system, _content_blocks, _tool_use_block, _tool_result_block)


def _tool(tool: Any, param: str) -> dict[str, Any]:
    function = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(tool, dict) or tool.get("type", "function") != "function":
        raise _invalid(f"'{param}' must be a function tool.", param)
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise _invalid(f"'{param}.function.name' must be a string.", param)
    schema = function.get("parameters") or {"type": "object", "properties": {}}
    converted: dict[str, Any] = {"name": function["name"], "input_schema": schema}
    if isinstance(function.get("description"), str):
        converted["description"] = function["description"]
    return converted


def _tool_choice(choice: Any, parallel: Any) -> dict[str, Any] | None:
    converted: dict[str, Any]
    if choice is None:
        if parallel is not False:
            return None
        converted = {"type": "auto"}
    elif choice in ("auto", "required", "none"):
        converted = {"type": TOOL_CHOICES[choice]}
    elif isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if not isinstance(name, str):
            raise _invalid("'tool_choice.function.name' must be a string.", "tool_choice")
        converted = {"type": "tool", "name": name}
    else:
        raise _invalid("'tool_choice' is not a valid tool choice.", "tool_choice")
    if parallel is False and converted["type"] != "none":
        converted["disable_parallel_tool_use"] = True
    return converted


def structured_schema(body: dict[str, Any]) -> dict[str, Any] | None:
    """The JSON schema a chat body's ``response_format`` asks its answer to fit (an object
    for ``json_object``), when it can be asked of Anthropic: with no tools of the caller's,
    as the one tool it must call. None: a plain answer."""
    form = body.get("response_format")
    kind = form.get("type") if isinstance(form, dict) else None
    if kind not in ("json_schema", "json_object") or body.get("tools"):
        return None
    assert isinstance(form, dict)
    spec = form.get("json_schema") if kind == "json_schema" else None
    schema = spec.get("schema") if isinstance(spec, dict) else None
    return schema if isinstance(schema, dict) else {"type": "object"}


def to_messages_request(body: dict[str, Any], model: str) -> dict[str, Any]:
    """The Anthropic Messages body for an OpenAI chat body; ``stream`` is left to the caller.

    A ``response_format`` asking for JSON becomes one tool Anthropic must call, whose input
    is the answer (``structured_schema``; read back by the answer and stream translators).
    Dropped (no equivalent): seed, penalties, logit_bias, logprobs, ``response_format``
    beside the caller's own tools, service_tier, store, OpenAI ``metadata`` and the like.
    """
    n = body.get("n")
    if n is not None and n != 1:
        raise _invalid("This model supports only n=1.", "n")
    system, turns = alternating_turns(body.get("messages"), _BLOCKS)
    limit = body.get("max_completion_tokens")
    if limit is None:
        limit = body.get("max_tokens")
    request: dict[str, Any] = {
        "model": model,
        "max_tokens": DEFAULT_MAX_TOKENS if limit is None else limit,
        "messages": turns,
    }
    if system:
        request["system"] = "\n\n".join(system)
    for name in ("temperature", "top_p"):
        if body.get(name) is not None:
            request[name] = body[name]
    stop = body.get("stop")
    if stop:
        request["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    tools = body.get("tools")
    if tools:
        if not isinstance(tools, list):
            raise _invalid("'tools' must be an array.", "tools")
        request["tools"] = [_tool(tool, f"tools[{i}]") for i, tool in enumerate(tools)]
        choice = _tool_choice(body.get("tool_choice"), body.get("parallel_tool_calls"))
        if choice is not None:
            request["tool_choice"] = choice
    schema = structured_schema(body)
    if schema is not None:
        request["tools"] = [
            {
                "name": STRUCTURED_TOOL,
                "description": "Give the whole answer as this tool's input: a JSON object "
                "that fits its schema.",
                "input_schema": schema,
            }
        ]
        request["tool_choice"] = {"type": "tool", "name": STRUCTURED_TOOL}
    user = body.get("user")
    if isinstance(user, str) and user:
        request["metadata"] = {"user_id": user}
    return request
