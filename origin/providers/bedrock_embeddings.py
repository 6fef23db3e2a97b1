"""OpenAI embeddings ↔ Bedrock's Titan text embeddings (InvokeModel), as pure functions.

Titan (``amazon.titan-embed-text-v2:0`` and the like) embeds one text a call:
``{"inputText", "dimensions"?}`` → ``{"embedding": [...], "inputTextTokenCount"}``. An
OpenAI batch is one such call per input (the adapter makes them concurrently), answered as
one OpenAI list in input order.
"""

from __future__ import annotations

import base64
import struct
from typing import Any

from prism import InvalidRequestError

__all__ = ["titan_inputs", "titan_requests", "to_embeddings_list"]


def titan_inputs(body: dict[str, Any]) -> list[str]:
    """The texts of an OpenAI ``input`` (Titan takes text, not token ids)."""
    value = body.get("input")
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) and t for t in texts):
        raise InvalidRequestError(
            "'input' must be a non-empty string or a list of them for this model "
            "(token arrays are not supported).",
            param="input",
        )
    return texts


def titan_requests(body: dict[str, Any]) -> list[dict[str, Any]]:
    """One Titan body per input; ``dimensions`` passed on (Titan v2: 256, 512 or 1024)."""
    encoding = body.get("encoding_format") or "float"
    if encoding not in ("float", "base64"):
        raise InvalidRequestError(
            "'encoding_format' must be float or base64.", param="encoding_format"
        )
    dimensions = body.get("dimensions")
    extra = {} if dimensions is None else {"dimensions": dimensions}
    return [{"inputText": text, **extra} for text in titan_inputs(body)]


def to_embeddings_list(
    answers: list[dict[str, Any]], model: str, encoding: str = "float"
) -> dict[str, Any]:
    """OpenAI's embeddings list for Titan's answers, in input order."""
    data = []
    tokens = 0
    for index, answer in enumerate(answers):
        vector = answer["embedding"]
        embedding: Any = vector
        if encoding == "base64":  # OpenAI's: little-endian float32, base64
            embedding = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
        data.append({"object": "embedding", "index": index, "embedding": embedding})
        count = answer.get("inputTextTokenCount")
        tokens += count if isinstance(count, int) else 0
    return {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
