"""Azure OpenAI's content-filter annotations out of its answers, as pure functions (no I/O).

Azure answers in OpenAI's shapes plus its content filter's results: ``prompt_filter_results``
on the answer (and alone, in a first stream chunk with ``choices: []`` and empty ``id``
and ``model``), ``content_filter_results`` on each choice, and, with asynchronous
filtering, chunks of annotations alone (a choice without a ``delta``). Those are removed,
so a client and the cache see OpenAI's answer; the stream assembler would otherwise take
the empty first chunk's ``id`` and ``model`` for the answer's. An answer the filter cut
(``finish_reason: "content_filter"``, or a result marked ``filtered``) is a
content-policy error, like Azure's own 400 ``content_filter`` for a prompt: never stored,
never retried elsewhere (the caller's answer).
"""

from __future__ import annotations

from typing import Any

from prism import InvalidRequestError

__all__ = ["CONTENT_FILTER", "answer_of", "chunk_of", "content_filtered"]

CONTENT_FILTER = "content_filter"  # Azure's code and finish reason, kept as our code
# Fields of Azure's content filter: on the answer or chunk, and on each choice.
_ANSWER_FIELDS = ("prompt_filter_results", "prompt_annotations")
_CHOICE_FIELDS = ("content_filter_results", "content_filter_offsets", "content_filter_raw")


def _flagged(results: Any) -> list[str]:
    """The categories a ``content_filter_results`` object says were filtered."""
    if not isinstance(results, dict):
        return []
    return sorted(
        name
        for name, result in results.items()
        if isinstance(result, dict) and result.get("filtered") is True
    )


def content_filtered(provider: str, choice: dict[str, Any]) -> InvalidRequestError | None:
    """The content-policy error for a choice the filter cut, else None."""
    categories = _flagged(choice.get("content_filter_results"))
    if choice.get("finish_reason") != CONTENT_FILTER and not categories:
        return None
    which = f" ({', '.join(categories)})" if categories else ""
    return InvalidRequestError(
        f"Provider '{provider}' filtered the answer under its content management policy{which}.",
        code=CONTENT_FILTER,
    )


def _plain_choice(choice: dict[str, Any]) -> dict[str, Any]:
    if not any(field in choice for field in _CHOICE_FIELDS):
        return choice
    return {k: v for k, v in choice.items() if k not in _CHOICE_FIELDS}


def answer_of(completion: dict[str, Any], provider: str) -> dict[str, Any]:
    """Azure's ``chat.completion`` as OpenAI's; raises the content-policy error for an
    answer the filter cut (any of its choices)."""
    choices = []
    for choice in completion["choices"]:
        if isinstance(choice, dict):
            error = content_filtered(provider, choice)
            if error is not None:
                raise error
            choice = _plain_choice(choice)
        choices.append(choice)
    plain = {k: v for k, v in completion.items() if k not in _ANSWER_FIELDS}
    plain["choices"] = choices
    return plain


def chunk_of(chunk: dict[str, Any], provider: str) -> dict[str, Any] | None:
    """Azure's ``chat.completion.chunk`` as OpenAI's, or None for a chunk of annotations
    alone (dropped); raises the content-policy error where the filter cut the answer."""
    choices = chunk.get("choices")
    if not isinstance(choices, list):
        return chunk  # an error event or something new: the stream's reader judges it
    kept = []
    for choice in choices:
        if not isinstance(choice, dict):
            kept.append(choice)
            continue
        error = content_filtered(provider, choice)
        if error is not None:
            raise error
        if "delta" not in choice and choice.get("finish_reason") is None:
            continue  # annotations of text already sent (asynchronous filtering)
        kept.append(_plain_choice(choice))
    if not kept and chunk.get("usage") is None:
        return None  # the prompt's results before the answer, or annotations alone
    plain = {k: v for k, v in chunk.items() if k not in _ANSWER_FIELDS}
    plain["choices"] = kept
    return plain
