"""Parse a ``/v1/embeddings`` body, within limits, into an ``EmbeddingsRequest``.

``input`` is a string, an array of strings, an array of token ids, or an array of
token-id arrays, as OpenAI takes it; ``encoding_format`` is ``float`` or ``base64``.
Every way a body can be bad ends in an ``InvalidRequestError`` (400) or a
``RequestTooLargeError`` (413) naming the parameter. Unknown fields are kept and
forwarded (and so are in the fingerprint), as for chat.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import InvalidRequestError, RequestTooLargeError
from .request import DEFAULT_LIMITS, Limits, _integer, _kind, decode_body, model_name

__all__ = ["MAX_INPUTS", "EmbeddingsRequest", "parse_embeddings_request"]

MAX_INPUTS = 2048  # OpenAI's own limit on inputs per request
_MAX_TOKEN_ID = 2**31 - 1


@dataclass(frozen=True, slots=True)
class EmbeddingsRequest:
    """A validated embeddings request. ``body`` is the JSON object as sent."""

    body: dict[str, Any]
    model: str
    inputs: int  # how many inputs the batch holds
    stream: bool = False  # embeddings are never streamed; here so the cache code reads alike


def _token_ids(value: list[Any], param: str) -> None:
    if not value:
        raise InvalidRequestError(f"'{param}' must not be an empty token array.", param=param)
    for token in value:
        if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token <= _MAX_TOKEN_ID:
            raise InvalidRequestError(
                f"'{param}' must hold token ids (integers from 0 to {_MAX_TOKEN_ID}).",
                param=param,
            )


def _count_inputs(value: Any) -> int:
    """How many inputs ``value`` holds, or the error that names what is wrong with it."""
    if isinstance(value, str):
        if not value:
            raise InvalidRequestError("'input' must not be an empty string.", param="input")
        return 1
    if not isinstance(value, list) or not value:
        raise InvalidRequestError(
            "'input' must be a string, an array of strings, an array of token ids or an "
            "array of token-id arrays, and not empty.",
            param="input",
        )
    if len(value) > MAX_INPUTS:
        raise RequestTooLargeError(
            f"'input' has {len(value)} items; the limit is {MAX_INPUTS}.", param="input"
        )
    first = value[0]
    if isinstance(first, int) and not isinstance(first, bool):
        _token_ids(value, "input")
        return 1
    for index, item in enumerate(value):
        param = f"input[{index}]"
        if isinstance(item, str):
            if not item:
                raise InvalidRequestError(f"'{param}' must not be an empty string.", param=param)
            if not isinstance(first, str):
                raise InvalidRequestError(
                    "'input' must not mix strings and token arrays.", param=param
                )
        elif isinstance(item, list) and not isinstance(first, str):
            _token_ids(item, param)
        else:
            raise InvalidRequestError(
                f"'{param}' must be a string (or, in a token batch, an array of token ids).",
                param=param,
            )
    return len(value)


def _encoding_format(name: str, value: Any) -> None:
    if value not in ("float", "base64"):
        raise InvalidRequestError(f"'{name}' must be 'float' or 'base64'.", param=name)


_PARAMETER_CHECKS: dict[str, Callable[[str, Any], None]] = {
    "encoding_format": _encoding_format,
    "dimensions": _integer(1, 65_536),
    "user": _kind(str, "a string"),
}
_CHECKED = frozenset(_PARAMETER_CHECKS)


def parse_embeddings_request(
    raw: bytes | str, limits: Limits = DEFAULT_LIMITS
) -> EmbeddingsRequest:
    """Validate ``raw`` as an embeddings body, or raise the matching ``PrismError``."""
    body = decode_body(raw, limits)
    model = model_name(body.get("model"))
    if "input" not in body:
        raise InvalidRequestError("'input' is required.", param="input")
    inputs = _count_inputs(body["input"])
    for name in _CHECKED.intersection(body):
        value = body[name]
        if value is not None:
            _PARAMETER_CHECKS[name](name, value)
    return EmbeddingsRequest(body=body, model=model, inputs=inputs)
