"""Parse an OpenAI Responses API body (``POST /v1/responses``), within limits, into a
``ResponsesRequest``, and say whether it may be cached.

What the API requires is checked here: ``model``; ``input`` as a string or an array of
items (messages with a role and content as a string or typed parts, function calls and
their outputs, reasoning, item references), ``tools``, ``tool_choice``, ``text.format``
and the common parameters' types and ranges. Unknown fields are kept and forwarded (and
so are in the fingerprint). Errors are ``PrismError``s naming the offending parameter as
OpenAI does (``input[2].type``), rendered in OpenAI's error format.

A request is *stateful* when it asks OpenAI to keep or reuse server-side state: ``store``
set to true, a ``previous_response_id``, a ``conversation``, ``background`` mode. Prism
stores no responses, so such a request is never answered from (or written to) the cache
(``classify_responses``); one without ``store`` is treated as stateless.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .classify import DEFAULT_POLICY, CacheDecision, CachePolicy, classify
from .errors import InvalidRequestError, RequestTooLargeError
from .request import DEFAULT_LIMITS, Limits, _integer, _kind, _number, decode_body, model_name

__all__ = [
    "INPUT_ITEM_TYPES",
    "ResponsesRequest",
    "classify_responses",
    "parse_responses_request",
]

_ROLES = frozenset({"user", "assistant", "system", "developer"})
# The input item types of OpenAI's API that carry a conversation (the hosted tools'
# call items need the hosted tools, which no chat provider has).
INPUT_ITEM_TYPES = frozenset(
    {"message", "function_call", "function_call_output", "reasoning", "item_reference"}
)
_PART_TYPES = frozenset(
    {"input_text", "input_image", "input_file", "input_audio", "output_text", "refusal"}
)
_TEXT_FIELD = {"input_text": "text", "output_text": "text", "refusal": "refusal"}
_TOOL_CHOICES = frozenset({"auto", "none", "required"})
_FORMATS = frozenset({"text", "json_schema", "json_object"})


@dataclass(frozen=True, slots=True)
class ResponsesRequest:
    """A validated Responses API request. ``body`` is the JSON object as sent."""

    body: dict[str, Any]
    model: str
    stream: bool
    stateful: bool  # asks for state Prism does not keep: never cached


def _invalid(message: str, param: str) -> InvalidRequestError:
    return InvalidRequestError(f"'{param}' {message}", param=param)


def _string(item: dict[str, Any], name: str, where: str, *, empty: bool = True) -> None:
    value = item.get(name)
    if not isinstance(value, str) or (not empty and not value):
        what = "a string" if empty else "a non-empty string"
        raise _invalid(f"must be {what}.", f"{where}.{name}")


def _parts(content: Any, where: str) -> None:
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise _invalid("must be a string or an array of content parts.", where)
    for index, part in enumerate(content):
        at = f"{where}[{index}]"
        if not isinstance(part, dict):
            raise _invalid("must be an object.", at)
        kind = part.get("type")
        if kind not in _PART_TYPES:
            raise _invalid(
                f"must be one of {', '.join(sorted(_PART_TYPES))}; got {str(kind)[:40]!r}.",
                f"{at}.type",
            )
        field = _TEXT_FIELD.get(kind)
        if field is not None:
            _string(part, field, at)
        elif kind == "input_image" and not (
            isinstance(part.get("image_url"), str) or isinstance(part.get("file_id"), str)
        ):
            raise _invalid("must be a string (or give a file_id).", f"{at}.image_url")


def _item(item: Any, where: str) -> None:
    if not isinstance(item, dict):
        raise _invalid("must be an object.", where)
    kind = item.get("type", "message" if "role" in item else None)
    if kind not in INPUT_ITEM_TYPES:
        raise _invalid(
            f"must be one of {', '.join(sorted(INPUT_ITEM_TYPES))}; got {str(kind)[:40]!r}.",
            f"{where}.type",
        )
    if kind == "message":
        if item.get("role") not in _ROLES:
            raise _invalid(f"must be one of {', '.join(sorted(_ROLES))}.", f"{where}.role")
        _parts(item.get("content"), f"{where}.content")
    elif kind == "function_call":
        _string(item, "call_id", where, empty=False)
        _string(item, "name", where, empty=False)
        _string(item, "arguments", where)
    elif kind == "function_call_output":
        _string(item, "call_id", where, empty=False)
        output = item.get("output")
        if not isinstance(output, str):
            _parts(output, f"{where}.output")
    elif kind == "item_reference":
        _string(item, "id", where, empty=False)


def _check_input(value: Any, limits: Limits) -> None:
    if isinstance(value, str):
        return
    if not isinstance(value, list) or not value:
        raise _invalid("must be a string or a non-empty array of input items.", "input")
    if len(value) > limits.max_messages:
        raise RequestTooLargeError(
            f"'input' has {len(value)} items; the limit is {limits.max_messages}.", param="input"
        )
    for index, item in enumerate(value):
        _item(item, f"input[{index}]")


def _tools(name: str, value: Any) -> None:
    if not isinstance(value, list):
        raise _invalid("must be an array of tools.", name)
    for index, tool in enumerate(value):
        at = f"{name}[{index}]"
        if not isinstance(tool, dict) or not isinstance(tool.get("type"), str):
            raise _invalid("must be an object with a 'type'.", at)
        if tool["type"] != "function":
            continue  # a hosted tool: its parameters are OpenAI's to check
        _string(tool, "name", at, empty=False)
        if tool.get("parameters") is not None and not isinstance(tool["parameters"], dict):
            raise _invalid("must be a JSON schema object.", f"{at}.parameters")
        if tool.get("strict") is not None and not isinstance(tool["strict"], bool):
            raise _invalid("must be a boolean.", f"{at}.strict")
        if tool.get("description") is not None and not isinstance(tool["description"], str):
            raise _invalid("must be a string.", f"{at}.description")


def _tool_choice(name: str, value: Any) -> None:
    if isinstance(value, str):
        if value not in _TOOL_CHOICES:
            raise _invalid(f"must be one of {', '.join(sorted(_TOOL_CHOICES))}.", name)
        return
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise _invalid("must be a string or an object with a 'type'.", name)
    if value["type"] == "function":
        _string(value, "name", name, empty=False)


def _text(name: str, value: Any) -> None:
    if not isinstance(value, dict):
        raise _invalid("must be an object.", name)
    form = value.get("format")
    if form is None:
        return
    where = f"{name}.format"
    if not isinstance(form, dict) or form.get("type") not in _FORMATS:
        raise _invalid(f"must be one of {', '.join(sorted(_FORMATS))}.", f"{where}.type")
    if form["type"] == "json_schema":
        _string(form, "name", where, empty=False)
        if not isinstance(form.get("schema"), dict):
            raise _invalid("must be a JSON schema object.", f"{where}.schema")
        if form.get("strict") is not None and not isinstance(form["strict"], bool):
            raise _invalid("must be a boolean.", f"{where}.strict")


def _instructions(name: str, value: Any) -> None:
    if not isinstance(value, str):
        raise _invalid("must be a string.", name)


_PARAMETER_CHECKS: dict[str, Callable[[str, Any], None]] = {
    "instructions": _instructions,
    "stream": _kind(bool, "a boolean"),
    "store": _kind(bool, "a boolean"),
    "background": _kind(bool, "a boolean"),
    "parallel_tool_calls": _kind(bool, "a boolean"),
    "temperature": _number(0, 2),
    "top_p": _number(0, 1),
    "max_output_tokens": _integer(1),
    "tools": _tools,
    "tool_choice": _tool_choice,
    "text": _text,
    "metadata": _kind(dict, "an object"),
    "user": _kind(str, "a string"),
    "previous_response_id": _kind(str, "a string"),
}
_CHECKED = frozenset(_PARAMETER_CHECKS)


def _stateful(body: dict[str, Any]) -> bool:
    return (
        body.get("store") is True
        or body.get("previous_response_id") is not None
        or body.get("conversation") is not None
        or body.get("background") is True
    )


def parse_responses_request(raw: bytes | str, limits: Limits = DEFAULT_LIMITS) -> ResponsesRequest:
    """Validate ``raw`` as a Responses API body, or raise the matching ``PrismError``."""
    body = decode_body(raw, limits)
    model = model_name(body.get("model"))
    _check_input(body.get("input"), limits)
    for name in _CHECKED.intersection(body):
        value = body[name]
        if value is not None:
            _PARAMETER_CHECKS[name](name, value)
    return ResponsesRequest(
        body=body, model=model, stream=body.get("stream") is True, stateful=_stateful(body)
    )


_STATEFUL = "stateful request (store, previous_response_id, conversation or background)"


def classify_responses(
    request: ResponsesRequest,
    cache_control: str | None = None,
    policy: CachePolicy = DEFAULT_POLICY,
) -> CacheDecision:
    """``classify``, but a stateful request is a bypass: neither read nor written."""
    decision = classify(request, cache_control, policy)
    if request.stateful:
        return CacheDecision(False, False, decision.ttl, _STATEFUL)
    return decision
