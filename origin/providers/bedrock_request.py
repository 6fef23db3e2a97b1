"""OpenAI chat completions → Bedrock Converse requests, as pure functions (no I/O).

``to_converse_request``: an OpenAI chat body → the JSON body of ``POST
/model/{modelId}/converse`` (and of ``converse-stream``: the same body); the model is in
the path, not the body. What Converse cannot express is dropped (sampling knobs with no
equivalent) or rejected with a 400 (``n`` > 1, image URLs, audio and files). The way back
is apart: the answer in ``bedrock_answer``, the stream in ``bedrock_stream``.
"""

from __future__ import annotations

import re
from typing import Any

from prism import InvalidRequestError

from .chat_turns import TurnBlocks, alternating_turns, tool_call

__all__ = ["IMAGE_FORMATS", "to_converse_request"]

# An image's media type -> Converse ``image.format``
IMAGE_FORMATS = {
    "image/png": "png",
    "image/jpeg": "jpeg",
    "image/jpg": "jpeg",
    "image/gif": "gif",
    "image/webp": "webp",
}
_DATA_URL = re.compile(r"data:(?P<media>[\w.+-]+/[\w.+-]+);base64,(?P<data>.*)", re.DOTALL)
# Converse marks a prompt-cache breakpoint with a block of its own after the cached ones.
_CACHE_POINT = {"cachePoint": {"type": "default"}}


def _invalid(message: str, param: str) -> InvalidRequestError:
    return InvalidRequestError(message, param=param)


def _image_block(part: dict[str, Any], param: str) -> dict[str, Any]:
    image = part.get("image_url")
    url = image.get("url") if isinstance(image, dict) else image
    match = _DATA_URL.fullmatch(url) if isinstance(url, str) else None
    if match is None:
        # Converse takes an image's bytes (or an S3 location), never a web URL.
        raise _invalid(
            f"'{param}.image_url.url' must be a base64 data URL (data:<type>;base64,...) "
            "for this model.",
            f"{param}.image_url",
        )
    image_format = IMAGE_FORMATS.get(match["media"].lower())
    if image_format is None:
        raise _invalid(
            f"'{param}.image_url.url': images must be PNG, JPEG, GIF or WebP for this model.",
            f"{param}.image_url",
        )
    # JSON carries the blob as its base64 text: the data URL's own.
    return {"image": {"format": image_format, "source": {"bytes": match["data"]}}}


def _content_blocks(content: Any, param: str) -> list[dict[str, Any]]:
    """A message's content (string or parts) as Converse blocks; empty text is dropped
    because Converse rejects blank text blocks."""
    if content is None:
        return []
    if isinstance(content, str):
        return [{"text": content}] if content else []
    if not isinstance(content, list):
        raise _invalid(f"'{param}' must be a string or an array of content parts.", param)
    blocks: list[dict[str, Any]] = []
    for position, part in enumerate(content):
        where = f"{param}[{position}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("text", "refusal"):
            assert isinstance(part, dict)
            text = part.get(kind)
            if not isinstance(text, str):
                raise _invalid(f"'{where}.{kind}' must be a string.", where)
            if text:
                blocks.append({"text": text})
        elif kind == "image_url":
            assert isinstance(part, dict)
            blocks.append(_image_block(part, where))
        else:
            raise _invalid(f"Content part type {kind!r} is not supported for this model.", where)
        if isinstance(part.get("cache_control"), dict) and blocks:
            blocks.append(dict(_CACHE_POINT))  # Claude clients mark cache breakpoints so
    return blocks


def _tool_use_block(call: Any, param: str) -> dict[str, Any]:
    checked = tool_call(call, param)
    return {"toolUse": {"toolUseId": checked.id, "name": checked.name, "input": checked.arguments}}


def _tool_result_block(message: dict[str, Any], param: str) -> dict[str, Any]:
    call_id = message.get("tool_call_id")
    if not isinstance(call_id, str) or not call_id:
        raise _invalid(f"'{param}.tool_call_id' must be a non-empty string.", param)
    parts = _content_blocks(message.get("content"), f"{param}.content")
    parts = [block for block in parts if "cachePoint" not in block]
    # Converse requires a result's content; an empty result is an empty JSON object.
    return {"toolResult": {"toolUseId": call_id, "content": parts or [{"json": {}}]}}


def _system_blocks(content: Any, param: str) -> list[dict[str, Any]]:
    blocks = _content_blocks(content, param)
    if any("image" in block for block in blocks):
        raise _invalid(f"'{param}' may contain only text.", param)
    return blocks


_BLOCKS = TurnBlocks(_system_blocks, _content_blocks, _tool_use_block, _tool_result_block)


def _tool(tool: Any, param: str) -> dict[str, Any]:
    function = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(tool, dict) or tool.get("type", "function") != "function":
        raise _invalid(f"'{param}' must be a function tool.", param)
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise _invalid(f"'{param}.function.name' must be a string.", param)
    schema = function.get("parameters") or {"type": "object", "properties": {}}
    spec: dict[str, Any] = {"name": function["name"], "inputSchema": {"json": schema}}
    if isinstance(function.get("description"), str) and function["description"]:
        spec["description"] = function["description"]
    return {"toolSpec": spec}


def _tool_choice(choice: Any) -> dict[str, Any] | None:
    if choice is None:
        return None
    if choice == "auto":
        return {"auto": {}}
    if choice == "required":
        return {"any": {}}
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if not isinstance(name, str):
            raise _invalid("'tool_choice.function.name' must be a string.", "tool_choice")
        return {"tool": {"name": name}}
    raise _invalid("'tool_choice' is not a valid tool choice.", "tool_choice")


def _uses_tools(turns: list[dict[str, Any]]) -> bool:
    return any("toolUse" in b or "toolResult" in b for t in turns for b in t["content"])


def _tool_config(body: dict[str, Any], turns: list[dict[str, Any]]) -> dict[str, Any] | None:
    tools = body.get("tools")
    if not tools:
        return None
    if not isinstance(tools, list):
        raise _invalid("'tools' must be an array.", "tools")
    converted = [_tool(tool, f"tools[{i}]") for i, tool in enumerate(tools)]
    choice = body.get("tool_choice")
    if choice == "none":
        # Converse has no "none": the tools stay away, unless the conversation holds tool
        # calls (then Converse requires the tool configuration, and the model chooses).
        return {"tools": converted} if _uses_tools(turns) else None
    config: dict[str, Any] = {"tools": converted}
    converted_choice = _tool_choice(choice)
    if converted_choice is not None:
        config["toolChoice"] = converted_choice
    return config


def to_converse_request(body: dict[str, Any]) -> dict[str, Any]:
    """The Converse body for an OpenAI chat body.

    Dropped (no equivalent): seed, penalties, logit_bias, logprobs, response_format,
    parallel_tool_calls, service_tier, store, user, OpenAI ``metadata`` and the like.
    """
    n = body.get("n")
    if n is not None and n != 1:
        raise _invalid("This model supports only n=1.", "n")
    system, turns = alternating_turns(body.get("messages"), _BLOCKS)
    request: dict[str, Any] = {"messages": turns}
    if system:
        request["system"] = system
    inference: dict[str, Any] = {}
    limit = body.get("max_completion_tokens")
    if limit is None:
        limit = body.get("max_tokens")
    if limit is not None:
        inference["maxTokens"] = limit
    if body.get("temperature") is not None:
        inference["temperature"] = body["temperature"]
    if body.get("top_p") is not None:
        inference["topP"] = body["top_p"]
    stop = body.get("stop")
    if stop:
        inference["stopSequences"] = [stop] if isinstance(stop, str) else list(stop)
    if inference:
        request["inferenceConfig"] = inference
    tool_config = _tool_config(body, turns)
    if tool_config is not None:
        request["toolConfig"] = tool_config
    return request
