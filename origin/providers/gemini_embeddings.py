"""OpenAI embeddings ↔ Gemini ``batchEmbedContents``, as pure functions (no I/O).

One OpenAI batch is one ``batchEmbedContents`` call (a request per input, in order);
``dimensions`` is Gemini's ``outputDimensionality`` and ``encoding_format: base64`` is
made here from the floats (little-endian float32, as OpenAI sends it). Gemini counts no
tokens for embeddings, so the usage is estimated: a token per 4 bytes of UTF-8 text.
"""

from __future__ import annotations

import base64
import struct
from typing import Any

from prism import InvalidRequestError

from .token_counts import estimated_tokens

__all__ = ["embedding_texts", "to_batch_request", "to_embeddings"]


def embedding_texts(value: Any) -> list[str]:
    """The texts of an OpenAI ``input``; token arrays have no Gemini form (a 400)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(item, str) for item in value):
        return list(value)
    raise InvalidRequestError(
        "This model embeds text only: 'input' must be a string or an array of strings.",
        param="input",
    )


def to_batch_request(body: dict[str, Any], model: str, texts: list[str]) -> dict[str, Any]:
    name = f"models/{model.removeprefix('models/')}"
    dimensions = body.get("dimensions")
    requests = []
    for text in texts:
        request: dict[str, Any] = {"model": name, "content": {"parts": [{"text": text}]}}
        if dimensions is not None:
            request["outputDimensionality"] = dimensions
        requests.append(request)
    return {"requests": requests}


def to_embeddings(
    answer: dict[str, Any], body: dict[str, Any], model: str, texts: list[str]
) -> dict[str, Any] | None:
    """OpenAI's embeddings list for a ``batchEmbedContents`` answer; None when it does not
    hold one vector of numbers per input."""
    embeddings = answer.get("embeddings")
    if not isinstance(embeddings, list) or len(embeddings) != len(texts):
        return None
    base64_wanted = body.get("encoding_format") == "base64"
    data = []
    for index, embedding in enumerate(embeddings):
        values = embedding.get("values") if isinstance(embedding, dict) else None
        if not isinstance(values, list) or not all(isinstance(v, int | float) for v in values):
            return None
        vector: Any = values
        if base64_wanted:
            vector = base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode()
        data.append({"object": "embedding", "index": index, "embedding": vector})
    tokens = sum(max(1, estimated_tokens(text)) for text in texts)
    return {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
