"""Parse a ``/v1/chat/completions`` body, within limits, into a ``ChatRequest``.

Every way a body can be bad ends in an ``InvalidRequestError`` (400) or a
``RequestTooLargeError`` (413) naming the offending parameter; no other
exception escapes. Unknown fields are kept and forwarded: providers add
parameters faster than gateways do.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import InvalidRequestError, RequestTooLargeError

__all__ = [
    "MAX_MODEL_CHARS",
    "ChatRequest",
    "Limits",
    "decode_body",
    "model_name",
    "parse_chat_request",
]

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


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


class _Unencodable(ValueError):
    """A value JSON can carry but no provider API can: caught in ``parse_chat_request``."""


def _parse_int(text: str) -> int:
    value = int(text)
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise _Unencodable
    return value


def _is_unencodable(value: Any) -> bool:
    if isinstance(value, int) and not isinstance(value, bool):
        return not _INT64_MIN <= value <= _INT64_MAX
    if isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError:  # a lone surrogate, e.g. "\ud800"
            return True
    return False


def _find_unencodable(value: Any, path: str = "") -> str | None:
    """Where in the body the first integer beyond 64 bits or lone surrogate is (error path
    only: iterative, so no recursion on hostile input)."""
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        node, where = stack.pop()
        if isinstance(node, dict):
            for key, child in node.items():
                if _is_unencodable(key):
                    return where  # the object holding it: the key itself cannot be echoed
                stack.append((child, f"{where}.{key}" if where else key))
        elif isinstance(node, list):
            stack.extend((child, f"{where}[{i}]") for i, child in enumerate(node))
        elif _is_unencodable(node):
            return where
    return None


def _locate_unencodable(text: str) -> str | None:
    try:
        return _find_unencodable(_PLAIN_DECODER.decode(text))
    except (ValueError, RecursionError):
        return None


def _unencodable_error(param: str | None) -> InvalidRequestError:
    where = f"'{param}'" if param else "The request body"
    return InvalidRequestError(
        f"{where} holds an integer beyond 64 bits or an unpaired surrogate escape "
        "(e.g. \\ud800); providers cannot accept either.",
        param=param or None,
        code="invalid_value",
    )


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


def _number(low: float, high: float) -> Callable[[str, Any], None]:
    def check(name: str, value: Any) -> None:
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not low <= value <= high
        ):
            raise InvalidRequestError(
                f"'{name}' must be a number from {low} to {high}.", param=name
            )

    return check


def _integer(low: int, high: int | None = None) -> Callable[[str, Any], None]:
    def check(name: str, value: Any) -> None:
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or value < low
            or (high is not None and value > high)
        ):
            span = f"from {low} to {high}" if high is not None else f">= {low}"
            raise InvalidRequestError(f"'{name}' must be an integer {span}.", param=name)

    return check


def _kind(kind: type | tuple[type, ...], what: str) -> Callable[[str, Any], None]:
    def check(name: str, value: Any) -> None:
        if not isinstance(value, kind):
            raise InvalidRequestError(f"'{name}' must be {what}.", param=name)

    return check


def _stop(name: str, value: Any) -> None:
    if isinstance(value, str):
        return
    if not (isinstance(value, list) and len(value) <= 4 and all(isinstance(s, str) for s in value)):
        raise InvalidRequestError("'stop' must be a string or up to 4 strings.", param=name)


# Checked only when present (and not null): a request pays for the fields it sends.
_PARAMETER_CHECKS: dict[str, Callable[[str, Any], None]] = {
    "stream": _kind(bool, "a boolean"),
    "stream_options": _kind(dict, "an object"),
    "temperature": _number(0, 2),
    "top_p": _number(0, 1),
    "presence_penalty": _number(-2, 2),
    "frequency_penalty": _number(-2, 2),
    "max_tokens": _integer(1),
    "max_completion_tokens": _integer(1),
    "seed": _integer(-(2**63)),
    "n": _integer(1, 128),
    "stop": _stop,
    "tools": _kind(list, "an array of tools"),
    "tool_choice": _kind((str, dict), "a string or an object"),
    "response_format": _kind(dict, "an object"),
    "logit_bias": _kind(dict, "an object"),
    "user": _kind(str, "a string"),
    "metadata": _kind(dict, "an object"),
}
_CHECKED = frozenset(_PARAMETER_CHECKS)


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


# Built once: json.loads(..., parse_float=...) would build a new decoder per call.
_DECODER = json.JSONDecoder(
    parse_constant=_reject_constant, parse_float=_parse_float, parse_int=_parse_int
)
_PLAIN_DECODER = json.JSONDecoder()  # to find what ``_DECODER`` refused (error path only)


def decode_body(raw: bytes | str, limits: Limits = DEFAULT_LIMITS) -> dict[str, Any]:
    """``raw`` as a JSON object within ``limits`` (size, depth, string length, encodable
    values), or the matching ``PrismError``: the part every API's parser shares."""
    if len(raw) > limits.max_body_bytes:
        raise RequestTooLargeError(
            f"Request body is {len(raw)} bytes; the limit is {limits.max_body_bytes}."
        )
    try:
        text = raw.decode() if isinstance(raw, bytes) else raw
        body = _DECODER.decode(text)
    except InvalidRequestError:
        raise
    except _Unencodable:
        raise _unencodable_error(_locate_unencodable(text)) from None
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
    # Walk the tree only when the raw text could break a limit: a body shorter than the
    # string limit holds no longer string, and one with fewer brackets than the depth
    # limit cannot nest deeper. Typical requests skip the walk entirely.
    if isinstance(raw, bytes):
        opens = raw.count(b"[") + raw.count(b"{")
    else:
        opens = raw.count("[") + raw.count("{")
    if opens > limits.max_depth or len(raw) > limits.max_string_chars:
        _check_shape(body, limits)
    # A lone surrogate can only arrive as a \uD8xx-\uDFxx escape: look only then.
    if isinstance(raw, bytes):
        escaped = b"\\ud" in raw or b"\\uD" in raw
    else:
        escaped = "\\ud" in raw or "\\uD" in raw
    if escaped:
        where = _find_unencodable(body)
        if where is not None:
            raise _unencodable_error(where)
    return body


MAX_MODEL_CHARS = 256

# Invisible characters ``str.isprintable`` lets through: the Default_Ignorable_Code_Points
# outside categories Cc/Cf/Cn (combining grapheme joiner, Hangul fillers, Khmer inherent
# vowels, Mongolian and other variation selectors).
_INVISIBLE = re.compile(
    "[\u034f\u115f\u1160\u17b4\u17b5\u180b-\u180d\u180f\u3164\ufe00-\ufe0f\uffa0"
    "\U000e0100-\U000e01ef]"
)


def _bad_character(value: str) -> str:
    """What is wrong with ``value``'s first refused character (error path only)."""
    import unicodedata  # only here: a good name never needs the Unicode database

    for index, char in enumerate(value):
        if not char.isprintable() or _INVISIBLE.match(char):
            name = unicodedata.name(char, unicodedata.category(char))
            return f"U+{ord(char):04X} ({name}) at position {index}"
    return "a space at its start or end"


def model_name(value: Any) -> str:
    """``value`` if it is an exact model name, else a 400 with ``param: "model"``.

    Exact: a string of 1 to ``MAX_MODEL_CHARS`` characters with no space at either end
    and no control, format, separator (other than an inner space), unassigned or other
    invisible character. A name a provider would read differently from the policy (an
    ``"gpt-4o\u200b"`` that passes ``--deny gpt-4o``) is refused before policy or routing.
    """
    if not isinstance(value, str) or not 0 < len(value) <= MAX_MODEL_CHARS:
        raise InvalidRequestError(
            f"'model' must be a non-empty string of at most {MAX_MODEL_CHARS} characters.",
            param="model",
        )
    # isprintable() refuses every Cc, Cf, Cs, Co, Cn, Zl, Zp and Zs but the ASCII space,
    # so what is left to look at is the ends and, past ASCII, the invisible letters/marks.
    if (
        value.isprintable()
        and value[0] != " "
        and value[-1] != " "
        and (value.isascii() or _INVISIBLE.search(value) is None)
    ):
        return value
    raise InvalidRequestError(
        f"'model' must be an exact model name; {value[:80]!r} has {_bad_character(value)}.",
        param="model",
        code="invalid_model_name",
    )


def parse_chat_request(raw: bytes | str, limits: Limits = DEFAULT_LIMITS) -> ChatRequest:
    """Validate ``raw`` as a chat-completions body, or raise the matching ``PrismError``."""
    body = decode_body(raw, limits)
    model = model_name(body.get("model"))
    _check_messages(body.get("messages"), limits)

    for name in _CHECKED.intersection(body):
        value = body[name]
        if value is not None:
            _PARAMETER_CHECKS[name](name, value)
    stream = body.get("stream")
    stream_options = body.get("stream_options")
    n = body.get("n")

    return ChatRequest(
        body=body,
        model=model,
        stream=bool(stream),
        include_usage=bool(stream_options and stream_options.get("include_usage")),
        n=n if n is not None else 1,
    )
