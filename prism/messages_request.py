"""Parse an Anthropic Messages API body (``/v1/messages``), within limits, into a
``MessagesRequest``.

What the API requires is checked here (``model``, ``max_tokens``, ``messages`` with
``user``/``assistant`` turns whose content is a string or an array of typed blocks) and
the common parameters' types and ranges; unknown fields are kept and forwarded (and so
are in the fingerprint). Errors are ``PrismError``s: the route renders them in
Anthropic's error format (``prism.messages_sse.anthropic_error_json``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import InvalidRequestError, RequestTooLargeError
from .request import DEFAULT_LIMITS, Limits, _integer, _kind, _number, decode_body, model_name

__all__ = ["MessagesRequest", "parse_messages_request"]

_ROLES = frozenset({"user", "assistant"})


@dataclass(frozen=True, slots=True)
class MessagesRequest:
    """A validated Messages API request. ``body`` is the JSON object as sent."""

    body: dict[str, Any]
    model: str
    stream: bool


def _stop_sequences(name: str, value: Any) -> None:
    if not (isinstance(value, list) and all(isinstance(s, str) for s in value)):
        raise InvalidRequestError(f"{name}: must be an array of strings.", param=name)


def _system(name: str, value: Any) -> None:
    if isinstance(value, str):
        return
    if not isinstance(value, list) or not all(
        isinstance(block, dict) and block.get("type") == "text" for block in value
    ):
        raise InvalidRequestError(
            f"{name}: must be a string or an array of text blocks.", param=name
        )


_PARAMETER_CHECKS: dict[str, Callable[[str, Any], None]] = {
    "stream": _kind(bool, "a boolean"),
    "system": _system,
    "temperature": _number(0, 1),
    "top_p": _number(0, 1),
    "top_k": _integer(0),
    "stop_sequences": _stop_sequences,
    "tools": _kind(list, "an array of tools"),
    "tool_choice": _kind(dict, "an object"),
    "metadata": _kind(dict, "an object"),
    "thinking": _kind(dict, "an object"),
}
_CHECKED = frozenset(_PARAMETER_CHECKS)


def _check_messages(messages: Any, limits: Limits) -> None:
    if not isinstance(messages, list) or not messages:
        raise InvalidRequestError(
            "messages: must be a non-empty array of message objects.", param="messages"
        )
    if len(messages) > limits.max_messages:
        raise RequestTooLargeError(
            f"messages: {len(messages)} items; the limit is {limits.max_messages}.",
            param="messages",
        )
    for index, message in enumerate(messages):
        param = f"messages.{index}"
        if not isinstance(message, dict):
            raise InvalidRequestError(f"{param}: must be an object.", param=param)
        if message.get("role") not in _ROLES:
            raise InvalidRequestError(
                f"{param}.role: must be 'user' or 'assistant'.", param=f"{param}.role"
            )
        content = message.get("content")
        if isinstance(content, str):
            continue
        if not isinstance(content, list) or not all(
            isinstance(block, dict) and isinstance(block.get("type"), str) for block in content
        ):
            raise InvalidRequestError(
                f"{param}.content: must be a string or an array of content blocks, each "
                "an object with a 'type'.",
                param=f"{param}.content",
            )


def parse_messages_request(raw: bytes | str, limits: Limits = DEFAULT_LIMITS) -> MessagesRequest:
    """Validate ``raw`` as a Messages API body, or raise the matching ``PrismError``."""
    body = decode_body(raw, limits)
    model = model_name(body.get("model"))
    max_tokens = body.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise InvalidRequestError(
            "max_tokens: is required, an integer of at least 1.", param="max_tokens"
        )
    _check_messages(body.get("messages"), limits)
    for name in _CHECKED.intersection(body):
        value = body[name]
        if value is not None:
            _PARAMETER_CHECKS[name](name, value)
    return MessagesRequest(body=body, model=model, stream=body.get("stream") is True)
