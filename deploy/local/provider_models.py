"""The local provider's model lists: OpenAI's one page and Anthropic's pages.

OpenAI's ``GET /v1/models``: ``{"object": "list", "data": [{id, object: "model", created,
owned_by}]}``, every model on one page. Anthropic's (told apart by its
``anthropic-version`` header): ``{"data": [{type: "model", id, display_name,
created_at}], "has_more", "first_id", "last_id"}``, newest first, ``limit`` a page
(1 to 1,000, default 20) and ``after_id`` the cursor. The stand-in's pages hold at most
``ProviderSettings.models_page_size`` models whatever the limit, so its short list still
comes in more than one page and a client's paging is exercised.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

__all__ = [
    "ANTHROPIC_MODELS",
    "OPENAI_MODELS",
    "anthropic_model_page",
    "openai_model_list",
]

# id -> (created, owned_by), as OpenAI lists them (its own models are "system" or "openai").
OPENAI_MODELS: Mapping[str, tuple[int, str]] = {
    "gpt-4o": (1715367049, "system"),
    "gpt-4o-mini": (1721172741, "system"),
    "gpt-4.1-mini": (1744318173, "system"),
    "o1-mini": (1725649008, "system"),
    "text-embedding-3-small": (1705948997, "system"),
    "gpt-3.5-turbo": (1677610602, "openai"),
    "prism-local-echo": (1700000000, "prism-local"),
}
# id -> (display_name, created_at), newest first as Anthropic lists them.
ANTHROPIC_MODELS: Mapping[str, tuple[str, str]] = {
    "claude-sonnet-4-5-20250929": ("Claude Sonnet 4.5", "2025-09-29T00:00:00Z"),
    "claude-opus-4-1-20250805": ("Claude Opus 4.1", "2025-08-05T00:00:00Z"),
    "claude-sonnet-4-20250514": ("Claude Sonnet 4", "2025-05-14T00:00:00Z"),
    "claude-3-7-sonnet-20250219": ("Claude Sonnet 3.7", "2025-02-19T00:00:00Z"),
    "claude-3-5-haiku-20241022": ("Claude Haiku 3.5", "2024-10-22T00:00:00Z"),
}
_LOCAL = (1700000000, "prism-local")  # a configured model the table does not know


def openai_model_list(models: Sequence[str]) -> dict[str, Any]:
    data = []
    for model in models:
        created, owned_by = OPENAI_MODELS.get(model, _LOCAL)
        data.append({"id": model, "object": "model", "created": created, "owned_by": owned_by})
    return {"object": "list", "data": data}


def _anthropic_model(model: str) -> dict[str, Any]:
    name, created_at = ANTHROPIC_MODELS.get(model, (model, _stamp(_LOCAL[0])))
    return {"type": "model", "id": model, "display_name": name, "created_at": created_at}


def _stamp(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def anthropic_model_page(
    models: Sequence[str], query: Mapping[str, str], page_size: int
) -> dict[str, Any]:
    """One page of Anthropic's list; ``ValueError`` (a 400) for a bad ``limit`` or an
    unknown ``after_id``/``before_id``."""
    raw = query.get("limit", "20")
    if not raw.isdigit() or not 1 <= int(raw) <= 1000:
        raise ValueError("limit: must be an integer from 1 to 1000")
    size = min(int(raw), page_size)
    start, end = 0, len(models)
    for cursor in ("after_id", "before_id"):
        if cursor in query and query[cursor] not in models:
            raise ValueError(f"{cursor}: no model {query[cursor]!r}")
    if "after_id" in query:
        start = models.index(query["after_id"]) + 1
        end = start + size
    elif "before_id" in query:
        end = models.index(query["before_id"])
        start = max(0, end - size)
    else:
        end = size
    page = list(models[start:end])
    more = end < len(models) if "before_id" not in query else start > 0
    return {
        "data": [_anthropic_model(model) for model in page],
        "has_more": more,
        "first_id": page[0] if page else None,
        "last_id": page[-1] if page else None,
    }
