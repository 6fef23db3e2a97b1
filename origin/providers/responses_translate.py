"""OpenAI Responses ⇄ OpenAI chat completions, as pure functions (no I/O): the way a
``/v1/responses`` request reaches any provider (every kind speaks chat completions) and
its answer returns.

- ``to_chat_request``: a Responses body → a chat-completions body.
- ``to_response``: a ``chat.completion`` → a ``response`` object, from the parts a
  translated stream builds its response of too (``responses_stream``).

What chat completions cannot carry is refused with a 400 naming the parameter: hosted
tools, files and audio, references to stored items and the stateful parameters
(``previous_response_id``, ``conversation``, ``background``), since Prism stores no
responses. Reasoning items are dropped (chat completions takes no reasoning back).
The response echoes the request's parameters but for ``metadata`` and ``user``: those
are not in the fingerprint, so a stored answer must not carry one caller's.
"""

from __future__ import annotations

import secrets
from typing import Any

from prism import InvalidRequestError

from .token_counts import token_count

__all__ = [
    "base_id",
    "call_item",
    "message_item",
    "response_shell",
    "to_chat_request",
    "to_response",
    "usage_of",
]

_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
# finish_reason -> the reason a response is incomplete (None: it is complete)
_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


def _unsupported(what: str, param: str) -> InvalidRequestError:
    return InvalidRequestError(
        f"'{param}': {what} is not supported by Prism's Responses API for this model.",
        param=param,
        code="unsupported_parameter",
    )


# ---------------------------------------------------------------- requests


def _content(content: Any, param: str, role: str) -> Any:
    """A message's content as chat content: a string, or parts (text and images)."""
    if isinstance(content, str):
        return content
    parts: list[dict[str, Any]] = []
    for index, part in enumerate(content):
        kind = part.get("type")
        where = f"{param}[{index}]"
        if kind in ("input_text", "output_text"):
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "refusal":
            parts.append({"type": "text", "text": part["refusal"]})
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            image: dict[str, Any] = {"url": part["image_url"]}
            if isinstance(part.get("detail"), str):
                image["detail"] = part["detail"]
            parts.append({"type": "image_url", "image_url": image})
        else:
            what = "an image by file_id" if kind == "input_image" else f"a {kind} part"
            raise _unsupported(what, f"{where}.type")
    if role != "user" or all(part["type"] == "text" for part in parts):
        # Only a user turn takes images; every other role takes text.
        return "".join(part.get("text", "") for part in parts)
    return parts


def _output(output: Any, param: str) -> str:
    if isinstance(output, str):
        return output
    return str(_content(output, param, "tool"))


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions:
        messages.append({"role": "system", "content": instructions})
    value = body["input"]
    if isinstance(value, str):
        messages.append({"role": "user", "content": value})
        return messages
    for index, item in enumerate(value):
        where = f"input[{index}]"
        kind = item.get("type", "message")
        if kind == "message":
            role = _ROLES[item["role"]]
            content = _content(item["content"], f"{where}.content", role)
            messages.append({"role": role, "content": content})
        elif kind == "function_call":
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]},
            }
            last = messages[-1] if messages else None
            # Calls made in one turn are one assistant message with several tool calls.
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)
            elif (
                last is not None
                and last["role"] == "assistant"
                and isinstance(last.get("content"), str)
            ):
                last["tool_calls"] = [call]
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = _output(item["output"], f"{where}.output")
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": output})
        elif kind == "reasoning":
            continue  # the model's own reasoning: chat completions takes none back
        else:
            raise _unsupported("a stored item (Prism stores none)", f"{where}.type")
    return messages


def _tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for index, tool in enumerate(tools):
        if tool["type"] != "function":
            raise _unsupported(f"the hosted tool {tool['type']!r}", f"tools[{index}].type")
        function: dict[str, Any] = {
            "name": tool["name"],
            "parameters": tool.get("parameters") or {"type": "object", "properties": {}},
        }
        for name in ("description", "strict"):
            if tool.get(name) is not None:
                function[name] = tool[name]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, str):
        return choice
    if choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice["name"]}}
    raise _unsupported(f"a tool_choice of type {choice.get('type')!r}", "tool_choice.type")


def _response_format(text: Any) -> dict[str, Any] | None:
    form = text.get("format") if isinstance(text, dict) else None
    if not isinstance(form, dict) or form.get("type") == "text":
        return None
    if form["type"] == "json_object":
        return {"type": "json_object"}
    schema = {"name": form["name"], "schema": form["schema"]}
    for name in ("description", "strict"):
        if form.get(name) is not None:
            schema[name] = form[name]
    return {"type": "json_schema", "json_schema": schema}


def _refuse_state(body: dict[str, Any]) -> None:
    for name in ("previous_response_id", "conversation"):
        if body.get(name) is not None:
            raise _unsupported(
                f"'{name}' (Prism stores no responses: send the whole conversation as input)",
                name,
            )
    if body.get("background") is True:
        raise _unsupported("background mode", "background")


def to_chat_request(body: dict[str, Any], stream: bool = False) -> dict[str, Any]:
    """The chat-completions body for a (validated) Responses body."""
    _refuse_state(body)
    messages = _messages(body)
    if not messages:
        raise InvalidRequestError(
            "'input' holds nothing a model can answer (reasoning items only).", param="input"
        )
    request: dict[str, Any] = {"model": body["model"], "messages": messages}
    if body.get("max_output_tokens") is not None:
        request["max_tokens"] = body["max_output_tokens"]
    for name in ("temperature", "top_p", "parallel_tool_calls", "user"):
        if body.get(name) is not None:
            request[name] = body[name]
    tools = body.get("tools")
    if tools:
        request["tools"] = _tools(tools)
        if body.get("tool_choice") is not None:
            request["tool_choice"] = _tool_choice(body["tool_choice"])
    response_format = _response_format(body.get("text"))
    if response_format is not None:
        request["response_format"] = response_format
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and isinstance(reasoning.get("effort"), str):
        request["reasoning_effort"] = reasoning["effort"]
    if stream:
        # The usage chunk is the only place an OpenAI stream states its token counts.
        request["stream"] = True
        request["stream_options"] = {"include_usage": True}
    return request


# ---------------------------------------------------------------- responses


def usage_of(usage: Any) -> dict[str, Any]:
    """A chat completion's ``usage`` in the Responses API's form."""
    usage = usage if isinstance(usage, dict) else {}
    prompt, completion = (
        token_count(usage.get("prompt_tokens")),
        token_count(usage.get("completion_tokens")),
    )
    prompt_details = usage.get("prompt_tokens_details")
    prompt_details = prompt_details if isinstance(prompt_details, dict) else {}
    completion_details = usage.get("completion_tokens_details")
    completion_details = completion_details if isinstance(completion_details, dict) else {}
    return {
        "input_tokens": prompt,
        "input_tokens_details": {
            "cached_tokens": token_count(prompt_details.get("cached_tokens")),
            "cache_write_tokens": token_count(prompt_details.get("cache_creation_tokens")),
        },
        "output_tokens": completion,
        "output_tokens_details": {
            "reasoning_tokens": token_count(completion_details.get("reasoning_tokens"))
        },
        "total_tokens": prompt + completion,
    }


def base_id(chat_id: Any) -> str:
    """What a response's ids are made of: the chat completion's id without its prefix."""
    text = chat_id if isinstance(chat_id, str) and chat_id else secrets.token_hex(12)
    return text.removeprefix("chatcmpl-")


def response_shell(
    body: dict[str, Any], model: str, base: str, created: Any, finish: Any
) -> dict[str, Any]:
    """The response object around an answer's output, echoing the request."""
    reason = _INCOMPLETE.get(finish) if isinstance(finish, str) else None
    text = body.get("text")
    return {
        "id": f"resp_{base}",
        "object": "response",
        "created_at": created if isinstance(created, int) else 0,
        "status": "completed" if reason is None else "incomplete",
        "error": None,
        "incomplete_details": None if reason is None else {"reason": reason},
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "model": model,
        "output": [],
        "parallel_tool_calls": body.get("parallel_tool_calls") is not False,
        "previous_response_id": None,
        "temperature": body.get("temperature"),
        "text": text if isinstance(text, dict) else {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice") or "auto",
        "tools": body.get("tools") or [],
        "top_p": body.get("top_p"),
        "truncation": "disabled",
        "metadata": {},
        "usage": None,
    }


def message_item(base: str, text: str | None, refusal: str | None) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if text:
        content.append({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
    if refusal:
        content.append({"type": "refusal", "refusal": refusal})
    return {
        "id": f"msg_{base}",
        "type": "message",
        "status": "completed",
        "role": "assistant",
        "content": content,
    }


def call_item(call_id: Any, name: Any, arguments: Any) -> dict[str, Any]:
    call = str(call_id or secrets.token_hex(8))
    return {
        "id": f"fc_{call}",
        "type": "function_call",
        "status": "completed",
        "call_id": call,
        "name": str(name or ""),
        "arguments": arguments if isinstance(arguments, str) else "",
    }


def to_response(completion: dict[str, Any], body: dict[str, Any], model: str) -> dict[str, Any]:
    """The ``response`` for a ``chat.completion`` (its first choice)."""
    choices = completion.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    reply = choice.get("message") if isinstance(choice.get("message"), dict) else {}
    assert isinstance(reply, dict)
    base = base_id(completion.get("id"))
    response = response_shell(
        body, model, base, completion.get("created"), choice.get("finish_reason")
    )
    output: list[dict[str, Any]] = []
    text, refusal = reply.get("content"), reply.get("refusal")
    if (isinstance(text, str) and text) or (isinstance(refusal, str) and refusal):
        output.append(
            message_item(
                base,
                text if isinstance(text, str) else None,
                refusal if isinstance(refusal, str) else None,
            )
        )
    for call in reply.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            output.append(
                call_item(call.get("id"), function.get("name"), function.get("arguments"))
            )
    response["output"] = output
    response["usage"] = usage_of(completion.get("usage"))
    return response
