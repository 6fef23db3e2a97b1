"""Parse a ``/v1/chat/completions`` body, within limits, into a ``ChatRequest``.

Every way a body can be bad ends in an ``InvalidRequestError`` (400) or a
``RequestTooLargeError`` (413) naming the offending parameter; no other
exception escapes. Unknown fields are kept and forwarded: providers add
parameters faster than gateways do.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .errors import InvalidRequestError, RequestTooLargeError

__all__ = ["ChatRequest", "Limits", "parse_chat_request"]

_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


@dataclass(frozen=True, slots=True)
class Limits:
    max_body_bytes: int = 4 * 1024 * 1024
    max_messages: int = 2048
    max_depth: int = 32
    max_string_chars: int = 2 * 1024 * 1024


DEFAULT_LIMITS = Limits()


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """A validated chat-completions request. ``body`` is the JSON object as sent."""

    body: dict[str, Any]
    model: str
    stream: bool
    include_usage: bool
    n: int


def _reject_constant(name: str) -> Any:
    raise InvalidRequestError(f"Invalid JSON: {name} is not a JSON number.", code="invalid_json")


_EXACT_INT_LIMIT = 2.0**53


def _parse_float(text: str) -> int | float:
    """Normalize number spelling at parse time, so ``0``, ``0.0`` and ``0e0`` are one value.

    Done inside the C JSON scanner (only numbers with a fraction or exponent reach
    here), so the fingerprint needs no second walk over the body.
    """
    value = float(text)
    if value.is_integer() and -_EXACT_INT_LIMIT < value < _EXACT_INT_LIMIT:
        return int(value)
    if value != value or value in (float("inf"), float("-inf")):
        raise InvalidRequestError(
            f"Invalid JSON: number {text[:40]} is out of range.", code="invalid_json"
        )
    return value


def _check_shape(value: Any, limits: Limits) -> None:
    """Depth and string-size limits, iteratively (no recursion on hostile input)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    max_depth, max_chars = limits.max_depth, limits.max_string_chars
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            if depth > max_depth:
                raise InvalidRequestError(
                    f"Request body is nested deeper than {max_depth} levels.", code="too_deep"
                )
            for key, child in node.items():
                if len(key) > max_chars:
                    raise RequestTooLargeError("A key in the request body is too long.")
                if isinstance(child, (dict, list)):
                    stack.append((child, depth + 1))
                elif isinstance(child, str) and len(child) > max_chars:
                    raise RequestTooLargeError(
                        f"A string in the request body exceeds {max_chars} characters.", param=key
                    )
        elif isinstance(node, list):
            if depth > max_depth:
                raise InvalidRequestError(
                    f"Request body is nested deeper than {max_depth} levels.", code="too_deep"
                )
            for child in node:
                if isinstance(child, (dict, list)):
                    stack.append((child, depth + 1))
                elif isinstance(child, str) and len(child) > max_chars:
                    raise RequestTooLargeError(
                        f"A string in the request body exceeds {max_chars} characters."
                    )


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number_in(body: dict[str, Any], name: str, low: float, high: float) -> None:
    value = body.get(name)
    if value is None:
        return
    if not _is_number(value) or not low <= value <= high:
        raise InvalidRequestError(f"'{name}' must be a number from {low} to {high}.", param=name)


def _int_at_least(body: dict[str, Any], name: str, low: int) -> None:
    value = body.get(name)
    if value is not None and (not _is_int(value) or value < low):
        raise InvalidRequestError(f"'{name}' must be an integer >= {low}.", param=name)


def _optional(body: dict[str, Any], name: str, kind: type | tuple[type, ...], what: str) -> None:
    value = body.get(name)
    if value is not None and not isinstance(value, kind):
        raise InvalidRequestError(f"'{name}' must be {what}.", param=name)


def _check_messages(messages: Any, limits: Limits) -> None:
    if not isinstance(messages, list) or not messages:
        raise InvalidRequestError(
            "'messages' must be a non-empty array of message objects.", param="messages"
        )
    if len(messages) > limits.max_messages:
        raise RequestTooLargeError(
            f"'messages' has {len(messages)} items; the limit is {limits.max_messages}.",
            param="messages",
        )
    for index, message in enumerate(messages):
        param = f"messages[{index}]"
        if not isinstance(message, dict):
            raise InvalidRequestError(f"'{param}' must be an object.", param=param)
        role = message.get("role")
        if role not in _ROLES:
            raise InvalidRequestError(
                f"'{param}.role' must be one of {', '.join(sorted(_ROLES))}.",
                param=f"{param}.role",
            )
        content = message.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise InvalidRequestError(
                f"'{param}.content' must be a string or an array of content parts.",
                param=f"{param}.content",
            )


def parse_chat_request(raw: bytes | str, limits: Limits = DEFAULT_LIMITS) -> ChatRequest:
    """Validate ``raw`` as a chat-completions body, or raise the matching ``PrismError``."""
    if len(raw) > limits.max_body_bytes:
        raise RequestTooLargeError(
            f"Request body is {len(raw)} bytes; the limit is {limits.max_body_bytes}."
        )
    try:
        body = json.loads(raw, parse_constant=_reject_constant, parse_float=_parse_float)
    except InvalidRequestError:
        raise
    except RecursionError:
        raise InvalidRequestError(
            f"Request body is nested deeper than {limits.max_depth} levels.", code="too_deep"
        ) from None
    except (ValueError, TypeError) as exc:  # JSONDecodeError, bad UTF-8, huge ints
        raise InvalidRequestError(
            f"Request body is not valid JSON: {str(exc)[:200]}", code="invalid_json"
        ) from None
    if not isinstance(body, dict):
        raise InvalidRequestError("Request body must be a JSON object.", code="invalid_json")
    _check_shape(body, limits)

    model = body.get("model")
    if not isinstance(model, str) or not 0 < len(model) <= 256:
        raise InvalidRequestError("'model' must be a non-empty string.", param="model")
    _check_messages(body.get("messages"), limits)

    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise InvalidRequestError("'stream' must be a boolean.", param="stream")
    stream_options = body.get("stream_options")
    if stream_options is not None and not isinstance(stream_options, dict):
        raise InvalidRequestError("'stream_options' must be an object.", param="stream_options")

    _number_in(body, "temperature", 0, 2)
    _number_in(body, "top_p", 0, 1)
    _number_in(body, "presence_penalty", -2, 2)
    _number_in(body, "frequency_penalty", -2, 2)
    _int_at_least(body, "max_tokens", 1)
    _int_at_least(body, "max_completion_tokens", 1)
    _int_at_least(body, "seed", -(2**63))
    n = body.get("n")
    if n is not None and (not _is_int(n) or not 1 <= n <= 128):
        raise InvalidRequestError("'n' must be an integer from 1 to 128.", param="n")
    stop = body.get("stop")
    if stop is not None and not (
        isinstance(stop, str)
        or (isinstance(stop, list) and len(stop) <= 4 and all(isinstance(s, str) for s in stop))
    ):
        raise InvalidRequestError("'stop' must be a string or up to 4 strings.", param="stop")
    _optional(body, "tools", list, "an array of tools")
    _optional(body, "tool_choice", (str, dict), "a string or an object")
    _optional(body, "response_format", dict, "an object")
    _optional(body, "logit_bias", dict, "an object")
    _optional(body, "user", str, "a string")
    _optional(body, "metadata", dict, "an object")

    return ChatRequest(
        body=body,
        model=model,
        stream=bool(stream),
        include_usage=bool(stream_options and stream_options.get("include_usage")),
        n=n if n is not None else 1,
    )
