"""OpenAI's Responses API in the local provider (``POST /v1/responses``): a reply as a
``response`` object, and as its event stream, each event numbered.

The same ``ScriptedReply`` (``provider_replies``) the chat formats carry: a message with
one ``output_text`` part, or a ``function_call`` item; written here by hand from OpenAI's
documented shapes (not with Prism's own replay), so a pass-through is checked against an
independent stream.
"""

from __future__ import annotations

from typing import Any

from deploy.local.provider_replies import ScriptedReply
from deploy.local.provider_settings import ProviderSettings
from deploy.local.provider_sse import StreamPlan, fragments, sse_event, word_pieces

__all__ = ["responses_object", "responses_stream"]


def _usage(reply: ScriptedReply) -> dict[str, Any]:
    return {
        "input_tokens": reply.prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": reply.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": reply.prompt_tokens + reply.completion_tokens,
    }


def _item(reply: ScriptedReply) -> dict[str, Any]:
    if reply.tool_call is not None:
        return {
            "id": f"fc_{reply.tag}",
            "type": "function_call",
            "status": "completed",
            "call_id": f"call_{reply.tag}",
            "name": reply.tool_call.name,
            "arguments": reply.tool_call.arguments,
        }
    text = {"type": "output_text", "text": reply.texts[0], "annotations": [], "logprobs": []}
    return {
        "id": f"msg_{reply.tag}",
        "type": "message",
        "status": "completed",
        "role": "assistant",
        "content": [text],
    }


def responses_object(reply: ScriptedReply, body: dict[str, Any], created: int) -> dict[str, Any]:
    """The ``response`` for ``reply``, echoing the request as OpenAI does."""
    return {
        "id": f"resp_{reply.tag}",
        "object": "response",
        "created_at": created,
        "status": "completed",
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "model": reply.model,
        "output": [_item(reply)],
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"),
        "store": body.get("store", True),
        "temperature": body.get("temperature", 1.0),
        "text": body.get("text") or {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "top_p": body.get("top_p", 1.0),
        "truncation": "disabled",
        "metadata": body.get("metadata") or {},
        "usage": _usage(reply),
    }


def responses_stream(
    settings: ProviderSettings, reply: ScriptedReply, body: dict[str, Any], created: int
) -> StreamPlan:
    final = responses_object(reply, body, created)
    start = {**final, "status": "in_progress", "output": [], "usage": None}
    item = final["output"][0]
    where = {"item_id": item["id"], "output_index": 0}
    events: list[tuple[dict[str, Any], int]] = [
        ({"type": "response.created", "response": start}, 0),
        ({"type": "response.in_progress", "response": start}, 0),
    ]
    if item["type"] == "function_call":
        added = {**item, "status": "in_progress", "arguments": ""}
        events.append(({"type": "response.output_item.added", "output_index": 0, "item": added}, 0))
        events += [
            ({"type": "response.function_call_arguments.delta", **where, "delta": piece}, 1)
            for piece in fragments(item["arguments"])
        ]
        done = {"type": "response.function_call_arguments.done", **where}
        events.append(({**done, "arguments": item["arguments"]}, 0))
    else:
        added = {**item, "status": "in_progress", "content": []}
        events.append(({"type": "response.output_item.added", "output_index": 0, "item": added}, 0))
        part = item["content"][0]
        at = {**where, "content_index": 0}
        empty = {**part, "text": ""}
        events.append(({"type": "response.content_part.added", **at, "part": empty}, 0))
        events += [
            ({"type": "response.output_text.delta", **at, "delta": p, "logprobs": []}, w)
            for p, w in word_pieces(part["text"], settings.chunk_count)
        ]
        done = {"type": "response.output_text.done", **at, "logprobs": []}
        events.append(({**done, "text": part["text"]}, 0))
        events.append(({"type": "response.content_part.done", **at, "part": part}, 0))
    events.append(({"type": "response.output_item.done", "output_index": 0, "item": item}, 0))
    terminal = len(events)
    events.append(({"type": "response.completed", "response": final}, 0))
    numbered = [
        (sse_event({**event, "sequence_number": number}), weight)
        for number, (event, weight) in enumerate(events)
    ]
    return StreamPlan(numbered, terminal)
