"""OpenAI chat completions ⇄ Anthropic Messages, as pure functions (no I/O).

- ``to_messages_request``: an OpenAI chat body → an Anthropic ``/v1/messages`` body.
- ``to_chat_completion``: an Anthropic ``message`` → an OpenAI ``chat.completion``.
- ``StreamTranslator``: Anthropic stream events → OpenAI ``chat.completion.chunk`` dicts.

The completion and the chunks have exactly the shape ``prism.sse.StreamAssembler``
rebuilds, so a streamed and a non-streamed answer to one request are the same
cache entry. What Anthropic cannot express is either dropped (sampling knobs
with no equivalent) or rejected with a 400 (``n`` > 1, content it cannot carry).
"""

from __future__ import annotations

import re
import time
from typing import Any

import orjson

from prism import InvalidRequestError, UpstreamError, UpstreamUnavailableError

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "FINISH_REASONS",
    "TOOL_CHOICES",
    "StreamTranslator",
    "finish_reason",
    "to_chat_completion",
    "to_messages_request",
    "tool_call_of",
]

# Anthropic requires max_tokens; OpenAI lets the model run to its own limit.
DEFAULT_MAX_TOKENS = 4096

# Anthropic stop_reason -> OpenAI finish_reason (``messages_translate`` reads it in reverse)
FINISH_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}
# OpenAI tool_choice -> Anthropic tool_choice type (``messages_translate`` reads it in reverse)
TOOL_CHOICES = {"auto": "auto", "required": "any", "none": "none"}
_DATA_URL = re.compile(r"data:(?P<media>[\w.+-]+/[\w.+-]+);base64,(?P<data>.*)", re.DOTALL)


# ---------------------------------------------------------------- requests


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
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise _invalid(f"'{param}.function.name' must be a string.", param)
    assert isinstance(call, dict)
    arguments = function.get("arguments") or "{}"
    try:
        tool_input = orjson.loads(arguments) if isinstance(arguments, str) else None
    except orjson.JSONDecodeError:
        tool_input = None
    if not isinstance(tool_input, dict):
        raise _invalid(f"'{param}.function.arguments' must be a JSON object.", param)
    call_id = call.get("id")
    if not isinstance(call_id, str) or not call_id:
        raise _invalid(f"'{param}.id' must be a non-empty string.", param)
    return {"type": "tool_use", "id": call_id, "name": function["name"], "input": tool_input}


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


def _turns(messages: Any) -> tuple[list[str], list[dict[str, Any]]]:
    """System texts, and the conversation as alternating user/assistant turns."""
    if not isinstance(messages, list):
        raise _invalid("'messages' must be an array of message objects.", "messages")
    system: list[str] = []
    turns: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        param = f"messages[{index}]"
        if not isinstance(message, dict):
            raise _invalid(f"'{param}' must be an object.", param)
        role = message.get("role")
        content = message.get("content")
        if role in ("system", "developer"):
            text = _system_text(content, f"{param}.content")
            if text:
                system.append(text)
            continue
        if role == "user":
            blocks = _content_blocks(content, f"{param}.content")
        elif role == "assistant":
            blocks = _content_blocks(content, f"{param}.content")
            calls = message.get("tool_calls") or []
            if not isinstance(calls, list):
                raise _invalid(f"'{param}.tool_calls' must be an array.", f"{param}.tool_calls")
            blocks += [
                _tool_use_block(call, f"{param}.tool_calls[{i}]") for i, call in enumerate(calls)
            ]
        elif role == "tool":
            role, blocks = "user", [_tool_result_block(message, param)]
        else:
            raise _invalid(
                f"Role {role!r} is not supported for this model; use 'tool' messages.",
                f"{param}.role",
            )
        if not blocks:
            continue  # an empty turn says nothing, and Anthropic rejects it
        if turns and turns[-1]["role"] == role:
            # Anthropic wants strictly alternating turns: parallel tool results and a
            # following user message become one user turn.
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    return system, turns


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


def to_messages_request(body: dict[str, Any], model: str) -> dict[str, Any]:
    """The Anthropic Messages body for an OpenAI chat body; ``stream`` is left to the caller.

    Dropped (no equivalent): seed, penalties, logit_bias, logprobs, response_format,
    service_tier, store, OpenAI ``metadata`` and the like.
    """
    n = body.get("n")
    if n is not None and n != 1:
        raise _invalid("This model supports only n=1.", "n")
    system, turns = _turns(body.get("messages"))
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
    user = body.get("user")
    if isinstance(user, str) and user:
        request["metadata"] = {"user_id": user}
    return request


# ---------------------------------------------------------------- responses


def finish_reason(stop_reason: Any) -> str:
    """OpenAI's ``finish_reason`` for an Anthropic ``stop_reason``."""
    return FINISH_REASONS.get(stop_reason, "stop") if isinstance(stop_reason, str) else "stop"


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _usage(usage: Any) -> dict[str, Any]:
    """OpenAI usage; Anthropic counts cached prompt tokens apart from ``input_tokens``.
    Cache writes (billed above the input price) stay visible as ``cache_creation_tokens``
    in ``prompt_tokens_details`` so their cost can be right (``origin/providers/pricing.py``)."""
    usage = usage if isinstance(usage, dict) else {}
    cache_read = _int(usage.get("cache_read_input_tokens"))
    cache_write = _int(usage.get("cache_creation_input_tokens"))
    prompt = _int(usage.get("input_tokens")) + cache_write + cache_read
    completion = _int(usage.get("output_tokens"))
    result: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if cache_read or cache_write:
        result["prompt_tokens_details"] = {"cached_tokens": cache_read}
        if cache_write:
            result["prompt_tokens_details"]["cache_creation_tokens"] = cache_write
    return result


def tool_call_of(block: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic ``tool_use`` block as an OpenAI tool call."""
    arguments = orjson.dumps(block.get("input") or {}).decode()
    return {
        "id": block.get("id"),
        "type": "function",
        "function": {"name": block.get("name"), "arguments": arguments},
    }


def to_chat_completion(
    message: dict[str, Any], model: str, *, created: int | None = None
) -> dict[str, Any]:
    """The OpenAI ``chat.completion`` for an Anthropic ``message``, reported as ``model``."""
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in message.get("content") or ():
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_use":
            calls.append(tool_call_of(block))
        # thinking, redacted_thinking and server-tool blocks have no OpenAI form
    text = "".join(texts)
    reply: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        reply["tool_calls"] = calls
    return {
        "id": str(message.get("id") or ""),
        "object": "chat.completion",
        "created": int(time.time()) if created is None else created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": reply,
                "finish_reason": finish_reason(message.get("stop_reason")),
            }
        ],
        "usage": _usage(message.get("usage")),
    }


# ---------------------------------------------------------------- streams


class StreamTranslator:
    """Anthropic stream events in, OpenAI ``chat.completion.chunk`` dicts out.

    The finish chunk and the usage chunk (``choices: []``) are emitted together at
    ``message_stop``, the only event that proves the answer is complete. ``done``
    turns true there; anything after it is ignored.
    """

    def __init__(
        self, model: str, *, created: int | None = None, provider: str = "anthropic"
    ) -> None:
        self._model = model
        self._provider = provider  # named in error messages
        self._created = int(time.time()) if created is None else created
        self._id: str | None = None
        self._usage: dict[str, Any] = {}
        self._stop_reason: Any = None
        # Anthropic block index → OpenAI tool-call index (None for a text block);
        # blocks we do not translate (thinking…) are absent and their deltas skipped.
        self._blocks: dict[int, int | None] = {}
        self._ignored: set[int] = set()
        self._with_arguments: set[int] = set()  # tool calls that got an arguments fragment
        self._tool_count = 0
        self._done = False

    @property
    def done(self) -> bool:
        return self._done

    def _malformed(self, what: str) -> UpstreamError:
        return UpstreamError(
            f"Provider '{self._provider}' sent a malformed stream: {what}.",
            code="upstream_malformed",
        )

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": self._id,
            "object": "chat.completion.chunk",
            "created": self._created,
            "model": self._model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    def feed(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        kind = event.get("type")
        if self._done:
            return []
        if kind == "error":
            error = event.get("error")
            error = error if isinstance(error, dict) else {}
            detail = str(error.get("message") or "stream error")[:500]
            if error.get("type") == "overloaded_error":
                raise UpstreamUnavailableError(
                    f"Provider '{self._provider}' is overloaded: {detail}"
                )
            raise UpstreamError(
                f"Provider '{self._provider}' stream failed: {detail}", code="upstream_stream_error"
            )
        if kind == "ping":
            return []
        if kind == "message_start":
            message = event.get("message")
            if not isinstance(message, dict) or self._id is not None:
                raise self._malformed("bad or repeated message_start")
            self._id = str(message.get("id") or "")
            self._usage = dict(message.get("usage") or {})
            return [self._chunk({"role": "assistant", "content": ""})]
        if kind not in (
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop",
        ):
            return []  # Anthropic may add event types; unknown ones carry nothing we serve
        if self._id is None:
            raise self._malformed(f"{kind} before message_start")
        if kind == "content_block_start":
            return self._block_start(event)
        if kind == "content_block_delta":
            return self._block_delta(event)
        if kind == "content_block_stop":
            return self._block_stop(event)
        if kind == "message_delta":
            delta = event.get("delta")
            if isinstance(delta, dict) and delta.get("stop_reason") is not None:
                self._stop_reason = delta["stop_reason"]
            usage = event.get("usage")
            if isinstance(usage, dict):
                # Counts in message_delta are cumulative: they replace, not add.
                self._usage.update({k: v for k, v in usage.items() if v is not None})
            return []
        if kind == "message_stop":
            self._done = True
            usage_chunk = {**self._chunk({}), "choices": [], "usage": _usage(self._usage)}
            return [self._chunk({}, finish_reason(self._stop_reason)), usage_chunk]
        return []

    def _index(self, event: dict[str, Any]) -> int:
        index = event.get("index")
        if not isinstance(index, int):
            raise self._malformed(f"{event.get('type')} without an index")
        return index

    def _block_start(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        index = self._index(event)
        block = event.get("content_block")
        kind = block.get("type") if isinstance(block, dict) else None
        if index in self._blocks or index in self._ignored:
            raise self._malformed(f"content block {index} started twice")
        if kind == "text":
            assert isinstance(block, dict)
            self._blocks[index] = None
            text = block.get("text")
            return [self._chunk({"content": text})] if isinstance(text, str) and text else []
        if kind == "tool_use":
            assert isinstance(block, dict)
            position = self._blocks[index] = self._tool_count
            self._tool_count += 1
            call = {
                "index": position,
                "id": block.get("id"),
                "type": "function",
                "function": {"name": block.get("name"), "arguments": ""},
            }
            return [self._chunk({"tool_calls": [call]})]
        self._ignored.add(index)
        return []

    def _block_delta(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        index = self._index(event)
        if index in self._ignored:
            return []
        if index not in self._blocks:
            raise self._malformed(f"delta for content block {index} that never started")
        delta = event.get("delta")
        delta = delta if isinstance(delta, dict) else {}
        position = self._blocks[index]
        kind = delta.get("type")
        if kind == "text_delta" and position is None:
            text = delta.get("text")
            return [self._chunk({"content": text})] if isinstance(text, str) and text else []
        if kind == "input_json_delta" and position is not None:
            fragment = delta.get("partial_json")
            if not isinstance(fragment, str) or not fragment:
                return []  # Anthropic opens a tool's input with an empty fragment
            self._with_arguments.add(position)
            call = {"index": position, "function": {"arguments": fragment}}
            return [self._chunk({"tool_calls": [call]})]
        return []  # citations and other annotations have no chunk form

    def _block_stop(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        position = self._blocks.get(self._index(event))
        if position is None or position in self._with_arguments:
            return []
        # A tool without parameters may stream no input at all; the non-stream answer
        # says "{}", and both must assemble to the same completion.
        self._with_arguments.add(position)
        call = {"index": position, "function": {"arguments": "{}"}}
        return [self._chunk({"tool_calls": [call]})]
