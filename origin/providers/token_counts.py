"""The token counts an answer reports, read from any usage form a provider sends
(OpenAI's ``prompt_tokens``/``completion_tokens``, Anthropic's ``input_tokens``/
``output_tokens`` with its prompt-cache counts, or the Responses API's ``input_tokens``
with its ``input_tokens_details``): what prices, limits, usage and logs count; and the
estimate of a text's tokens where no provider counted them."""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["Tokens", "estimated_tokens", "token_count", "tokens_of"]


class Tokens(NamedTuple):
    prompt: int  # every prompt token, cached or not
    cached: int  # read from the provider's prompt cache
    cache_write: int  # written to it
    completion: int


def token_count(value: Any) -> int:
    """A reported token count: a positive int, else 0 (absent, null, a bool, garbage)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def tokens_of(usage: Any) -> Tokens | None:
    """The token counts of a reported usage (OpenAI's form or Anthropic's); None if none."""
    if not isinstance(usage, dict):
        return None
    if "prompt_tokens" in usage or "completion_tokens" in usage:
        details = usage.get("prompt_tokens_details")
        details = details if isinstance(details, dict) else {}
        return Tokens(
            token_count(usage.get("prompt_tokens")),
            token_count(details.get("cached_tokens")),
            token_count(details.get("cache_creation_tokens")),
            token_count(usage.get("completion_tokens")),
        )
    details = usage.get("input_tokens_details")
    if isinstance(details, dict):  # the Responses API's: input_tokens counts the cached ones
        return Tokens(
            token_count(usage.get("input_tokens")),
            token_count(details.get("cached_tokens")),
            token_count(details.get("cache_write_tokens")),
            token_count(usage.get("output_tokens")),
        )
    if "input_tokens" in usage or "output_tokens" in usage:  # Anthropic's own form
        read = token_count(usage.get("cache_read_input_tokens"))
        write = token_count(usage.get("cache_creation_input_tokens"))
        prompt = token_count(usage.get("input_tokens")) + read + write
        return Tokens(prompt, read, write, token_count(usage.get("output_tokens")))
    return None


def estimated_tokens(text: str) -> int:
    """The tokens of ``text`` where no provider counted them: one per 4 bytes of UTF-8
    (about what byte-level BPE tokenizers average on English), rounded up."""
    return -(-len(text.encode("utf-8", "surrogatepass")) // 4)
