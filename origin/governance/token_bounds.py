"""Upper bounds of a request's tokens, known before any provider is called.

Budgets reserve money and token rate limits admit requests on these bounds; both settle
to the provider's reported usage afterwards, so a loose bound costs headroom for the
length of one request, never money.

- Prompt: every byte-level BPE token (OpenAI's, Anthropic's, Llama's) stands for at
  least one byte of text, so the UTF-8 size of the messages (plus tools and a small
  per-message overhead for the chat template) bounds the text's tokens. An image costs
  a fixed allowance per part, which is an estimate, not a bound: say so where it shows.
- Completion: ``max_completion_tokens`` or ``max_tokens`` when the caller set one, else
  the configured cap; times ``n`` (each choice is billed).

The other APIs the same way: an Anthropic Messages request bounds its prompt by the size
of its messages, ``system`` and ``tools`` and its completion by ``max_tokens`` (required
there, and including any thinking budget); a Responses request by the size of its
``input``, ``instructions``, ``tools`` and ``text`` format and its completion by
``max_output_tokens`` (else the cap); an embeddings request by the size of its
inputs (a token array is its own count) and has no completion.
"""

from __future__ import annotations

from typing import Any

from prism.embeddings_request import EmbeddingsRequest
from prism.messages_request import MessagesRequest
from prism.request import ChatRequest
from prism.responses_request import ResponsesRequest

__all__ = [
    "DEFAULT_OUTPUT_CAP",
    "IMAGE_TOKENS",
    "completion_token_bound",
    "embeddings_token_bound",
    "messages_completion_bound",
    "messages_prompt_bound",
    "no_completion",
    "prompt_token_bound",
    "responses_completion_bound",
    "responses_prompt_bound",
]

DEFAULT_OUTPUT_CAP = 4096  # reserved for a request that sets no max_tokens
IMAGE_TOKENS = 1536  # per image part: OpenAI's high-detail ceiling for a 2048 px image
_PER_MESSAGE = 8  # role and template tokens around each message


def _size(value: Any) -> int:
    """UTF-8 bytes of the text in ``value`` (strings in nested lists and objects)."""
    if isinstance(value, str):
        return len(value) if value.isascii() else len(value.encode("utf-8", "surrogatepass"))
    if isinstance(value, dict):
        if value.get("type") in ("image_url", "input_image", "image"):
            return IMAGE_TOKENS
        return sum(_size(key) + _size(item) for key, item in value.items())
    if isinstance(value, list):
        return sum(_size(item) for item in value)
    return 0 if value is None else 8  # numbers and booleans: a few tokens at most


def _turns_bound(body: dict[str, Any], messages: list[Any], fields: tuple[str, ...]) -> int:
    """The size of ``messages`` with their template overhead, plus the ``fields`` of
    ``body`` that reach the prompt."""
    total = _PER_MESSAGE * len(messages) + _size(messages)
    for field in fields:
        if field in body:
            total += _size(body[field])
    return total


def prompt_token_bound(request: ChatRequest) -> int:
    """At least as many tokens as the provider will count for the prompt (images aside)."""
    body = request.body
    return _turns_bound(body, body.get("messages") or [], ("tools", "functions", "response_format"))


def completion_token_bound(request: ChatRequest, cap: int = DEFAULT_OUTPUT_CAP) -> int:
    """The most completion tokens the request can be billed for."""
    body = request.body
    limit = body.get("max_completion_tokens")
    if limit is None:
        limit = body.get("max_tokens")
    return (cap if limit is None else int(limit)) * max(1, request.n)


def messages_prompt_bound(request: MessagesRequest) -> int:
    """The prompt bound of an Anthropic Messages request (its turns, system and tools)."""
    body = request.body
    return _turns_bound(body, body["messages"], ("system", "tools", "tool_choice"))


def messages_completion_bound(request: MessagesRequest, cap: int = DEFAULT_OUTPUT_CAP) -> int:
    """``max_tokens``: required by the Messages API, the most it bills."""
    limit: int = request.body["max_tokens"]
    return limit


def responses_prompt_bound(request: ResponsesRequest) -> int:
    """The prompt bound of a Responses request (its input items, instructions and tools)."""
    body = request.body
    value = body["input"]
    items = [value] if isinstance(value, str) else value
    return _turns_bound(body, items, ("instructions", "tools", "tool_choice", "text"))


def responses_completion_bound(request: ResponsesRequest, cap: int = DEFAULT_OUTPUT_CAP) -> int:
    """``max_output_tokens`` when set, else the cap."""
    limit = request.body.get("max_output_tokens")
    return cap if limit is None else int(limit)


def embeddings_token_bound(request: EmbeddingsRequest) -> int:
    """The input tokens of an embeddings batch: its strings' UTF-8 size, a token array's
    length."""
    value = request.body["input"]
    if isinstance(value, str):
        return _size(value)
    if value and isinstance(value[0], int):  # one token array (the parser checked it)
        return len(value)
    return sum(_size(item) if isinstance(item, str) else len(item) for item in value)


def no_completion(request: object, cap: int = DEFAULT_OUTPUT_CAP) -> int:
    """An API that generates no tokens (embeddings)."""
    return 0
