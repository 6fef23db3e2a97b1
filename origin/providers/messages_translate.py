"""Anthropic Messages ⇄ OpenAI chat completions, as pure functions (no I/O): the way a
``/v1/messages`` request reaches an OpenAI-compatible provider and its answer returns.

- ``to_chat_request``: a Messages body → a chat-completions body.
- ``to_message``: a ``chat.completion`` → an Anthropic ``message``.
- ``ChunkTranslator``: ``chat.completion.chunk`` dicts → Messages stream events.

The reverse of ``anthropic_request`` and ``anthropic_answer`` (chat → Anthropic), reading
their tables backwards.
What chat completions cannot carry (documents, thinking) is refused with a 400 or
dropped where it changes nothing the model is asked (``top_k``, a thinking budget).
"""

from __future__ import annotations

from typing import Any

import orjson

from prism import InvalidRequestError

from .anthropic_answer import FINISH_REASONS, tool_call_of
from .anthropic_request import TOOL_CHOICES
from .token_counts import token_count

__all__ = ["ChunkTranslator", "stop_reason", "to_chat_request", "to_message"]

# Reversed: the first Anthropic reason listed for each OpenAI one is the usual one.
_STOP_REASONS: dict[str, str] = {}
for _anthropic, _openai in FINISH_REASONS.items():
    _STOP_REASONS.setdefault(_openai, _anthropic)
_TOOL_CHOICES = {anthropic: openai for openai, anthropic in TOOL_CHOICES.items()}


def stop_reason(finish: Any) -> str:
    """Anthropic's ``stop_reason`` for an OpenAI ``finish_reason``."""
    return _STOP_REASONS.get(finish, "end_turn") if isinstance(finish, str) else "end_turn"


# ---------------------------------------------------------------- requests


def _invalid(message: str, param: str) -> InvalidRequestError:
    return InvalidRequestError(message, param=param)


def _text(content: Any, param: str) -> str:
    """A string, or an array of text blocks, as one string."""
    if isinstance(content, str):
        return content
    texts = []
    for index, block in enumerate(content if isinstance(content, list) else ()):
        if not isinstance(block, dict) or block.get("type") != "text":
            raise _invalid(f"{param}.{index}: only text is supported here for this model.", param)
        texts.append(str(block.get("text", "")))
    return "\n\n".join(texts)


def _image_part(block: dict[str, Any], param: str) -> dict[str, Any]:
    source = block.get("source")
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "base64":
        assert isinstance(source, dict)
        url = f"data:{source.get('media_type')};base64,{source.get('data')}"
    elif kind == "url":
        assert isinstance(source, dict)
        url = str(source.get("url"))
    else:
        raise _invalid(f"{param}.source: must be a base64 or url image source.", param)
    return {"type": "image_url", "image_url": {"url": url}}


def _user_turn(content: Any, param: str) -> list[dict[str, Any]]:
    """A user turn: its tool results become ``tool`` messages (first, as chat wants them
    right after the assistant's calls), the rest one ``user`` message."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for index, block in enumerate(content):
        where = f"{param}.{index}"
        kind = block.get("type")
        if kind == "text":
            parts.append({"type": "text", "text": str(block.get("text", ""))})
        elif kind == "image":
            parts.append(_image_part(block, where))
        elif kind == "tool_result":
            result = block.get("content")
            text = "" if result is None else _text(result, f"{where}.content")
            if block.get("is_error") is True:
                text = f"Error: {text}"
            out.append({"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": text})
        else:
            raise _invalid(
                f"{where}: content block type {kind!r} is not supported for this model.", where
            )
    if parts:
        if all(part["type"] == "text" for part in parts):
            out.append({"role": "user", "content": "".join(p["text"] for p in parts)})
        else:
            out.append({"role": "user", "content": parts})
    return out


def _assistant_turn(content: Any, param: str) -> dict[str, Any]:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for index, block in enumerate(content):
        kind = block.get("type")
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "tool_use":
            calls.append(tool_call_of(block))
        elif kind in ("thinking", "redacted_thinking"):
            continue  # the model's own reasoning: chat completions takes none back
        else:
            where = f"{param}.{index}"
            raise _invalid(
                f"{where}: content block type {kind!r} is not supported for this model.", where
            )
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
    if calls:
        message["tool_calls"] = calls
    return message


def _tool(tool: Any, param: str) -> dict[str, Any]:
    if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
        raise _invalid(f"{param}.name: must be a string.", param)
    if tool.get("type") not in (None, "custom"):
        raise _invalid(f"{param}: server tool {tool.get('type')!r} is not supported here.", param)
    function: dict[str, Any] = {
        "name": tool["name"],
        "parameters": tool.get("input_schema") or {"type": "object", "properties": {}},
    }
    if isinstance(tool.get("description"), str):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _tool_choice(choice: dict[str, Any]) -> Any:
    kind = choice.get("type")
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}
    if kind not in _TOOL_CHOICES:
        raise _invalid("tool_choice.type: must be auto, any, tool or none.", "tool_choice")
    return _TOOL_CHOICES[kind]


def to_chat_request(body: dict[str, Any], stream: bool = False) -> dict[str, Any]:
    """The chat-completions body for a (validated) Messages body."""
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system:
        messages.append({"role": "system", "content": _text(system, "system")})
    for index, turn in enumerate(body["messages"]):
        param = f"messages.{index}.content"
        if turn["role"] == "user":
            messages += _user_turn(turn["content"], param)
        else:
            messages.append(_assistant_turn(turn["content"], param))
    request: dict[str, Any] = {
        "model": body["model"],
        "messages": messages,
        "max_tokens": body["max_tokens"],
    }
    for name in ("temperature", "top_p"):
        if body.get(name) is not None:
            request[name] = body[name]
    stop = body.get("stop_sequences")
    if stop:
        request["stop"] = stop[:4]
    tools = body.get("tools")
    if tools:
        request["tools"] = [_tool(tool, f"tools.{i}") for i, tool in enumerate(tools)]
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        if tools:
            request["tool_choice"] = _tool_choice(choice)
        if choice.get("disable_parallel_tool_use") is True:
            request["parallel_tool_calls"] = False
    metadata = body.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("user_id"), str):
        request["user"] = metadata["user_id"]
    if stream:
        # The usage chunk is the only place an OpenAI stream states its token counts.
        request["stream"] = True
        request["stream_options"] = {"include_usage": True}
    return request


# ---------------------------------------------------------------- responses


def _usage(usage: Any) -> dict[str, int]:
    usage = usage if isinstance(usage, dict) else {}
    return {
        "input_tokens": token_count(usage.get("prompt_tokens")),
        "output_tokens": token_count(usage.get("completion_tokens")),
    }


def _tool_input(arguments: Any) -> dict[str, Any]:
    try:
        value = orjson.loads(arguments) if isinstance(arguments, str) and arguments else {}
    except orjson.JSONDecodeError:
        value = None
    # Anthropic's input is always an object; arguments that are not one are kept whole.
    return value if isinstance(value, dict) else {"arguments": arguments}


def to_message(completion: dict[str, Any], model: str) -> dict[str, Any]:
    """The Anthropic ``message`` for a ``chat.completion`` (its first choice)."""
    choices = completion.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    reply = choice.get("message") if isinstance(choice.get("message"), dict) else {}
    assert isinstance(reply, dict)
    content: list[dict[str, Any]] = []
    text = reply.get("content") or reply.get("refusal")
    if isinstance(text, str) and text:
        content.append({"type": "text", "text": text})
    for call in reply.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            content.append(
                {
                    "type": "tool_use",
                    "id": call.get("id"),
                    "name": function.get("name"),
                    "input": _tool_input(function.get("arguments")),
                }
            )
    return {
        "id": str(completion.get("id") or ""),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason(choice.get("finish_reason")),
        "stop_sequence": None,
        "usage": _usage(completion.get("usage")),
    }


# ---------------------------------------------------------------- streams


class ChunkTranslator:
    """OpenAI ``chat.completion.chunk`` dicts in, Messages stream events out.

    Text opens a text block, each tool call a ``tool_use`` block (one open at a time, as
    Anthropic streams them). ``finish`` (at ``[DONE]``) closes the open block and ends
    the message with the stop reason and the usage the last chunks gave.
    """

    def __init__(self, model: str) -> None:
        self._model = model
        self._started = False
        self._index = -1  # the open content block, -1: none
        self._open: str | None = None  # "text", or "tool:<openai tool index>"
        self._finish: Any = None
        self._usage: dict[str, int] = {"input_tokens": 0, "output_tokens": 0}

    def _start(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        self._started = True
        message: dict[str, Any] = {
            "id": str(chunk.get("id") or ""),
            "type": "message",
            "role": "assistant",
            "model": self._model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": dict(self._usage),
        }
        return [{"type": "message_start", "message": message}]

    def _close(self) -> list[dict[str, Any]]:
        if self._open is None:
            return []
        self._open = None
        return [{"type": "content_block_stop", "index": self._index}]

    def _open_block(self, name: str, block: dict[str, Any]) -> list[dict[str, Any]]:
        events = self._close()
        self._index += 1
        self._open = name
        events.append({"type": "content_block_start", "index": self._index, "content_block": block})
        return events

    def feed(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        events = [] if self._started else self._start(chunk)
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self._usage = _usage(usage)
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue  # a Messages answer has one choice
            delta = choice.get("delta")
            delta = delta if isinstance(delta, dict) else {}
            text = delta.get("content") or delta.get("refusal")
            if isinstance(text, str) and text:
                if self._open != "text":
                    events += self._open_block("text", {"type": "text", "text": ""})
                events.append(
                    {
                        "type": "content_block_delta",
                        "index": self._index,
                        "delta": {"type": "text_delta", "text": text},
                    }
                )
            for call in delta.get("tool_calls") or ():
                if not isinstance(call, dict):
                    continue
                name = f"tool:{call.get('index', 0)}"
                function = call.get("function")
                function = function if isinstance(function, dict) else {}
                if self._open != name:
                    block: dict[str, Any] = {
                        "type": "tool_use",
                        "id": call.get("id"),
                        "name": function.get("name"),
                        "input": {},
                    }
                    events += self._open_block(name, block)
                arguments = function.get("arguments")
                if isinstance(arguments, str) and arguments:
                    events.append(
                        {
                            "type": "content_block_delta",
                            "index": self._index,
                            "delta": {"type": "input_json_delta", "partial_json": arguments},
                        }
                    )
            if choice.get("finish_reason"):
                self._finish = choice["finish_reason"]
        return events

    def finish(self) -> list[dict[str, Any]]:
        """The closing events, once the chat stream has ended whole (``[DONE]``)."""
        events = [] if self._started else self._start({})
        events += self._close()
        events.append(
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason(self._finish), "stop_sequence": None},
                "usage": dict(self._usage),
            }
        )
        events.append({"type": "message_stop"})
        return events

    @property
    def finished(self) -> bool:
        """A finish_reason came: ``[DONE]`` may end the message."""
        return self._finish is not None
