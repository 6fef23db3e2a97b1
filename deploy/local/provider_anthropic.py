"""Anthropic's wire format in the local provider: a Messages ``message`` and its event
stream.

Apart from OpenAI's (``provider_openai``): the same ``ScriptedReply`` (``provider_replies``) as
one content block, text or ``tool_use``, streamed as Anthropic's named events and ended
by ``message_stop``.
"""

from __future__ import annotations

from typing import Any

from deploy.local.provider_replies import ScriptedReply
from deploy.local.provider_settings import ProviderSettings
from deploy.local.provider_sse import StreamPlan, fragments, sse_event, word_pieces

__all__ = ["anthropic_message", "anthropic_stream"]


def _anthropic_block(reply: ScriptedReply) -> dict[str, Any]:
    if reply.tool_call is None:
        return {"type": "text", "text": reply.texts[0]}
    call = reply.tool_call
    return {"type": "tool_use", "id": f"toolu_{reply.tag}", "name": call.name, "input": call.input}


def anthropic_message(reply: ScriptedReply) -> dict[str, Any]:
    return {
        "id": f"msg_{reply.tag}",
        "type": "message",
        "role": "assistant",
        "model": reply.model,
        "content": [_anthropic_block(reply)],
        "stop_reason": "end_turn" if reply.tool_call is None else "tool_use",
        "stop_sequence": None,
        "usage": {"input_tokens": reply.prompt_tokens, "output_tokens": reply.completion_tokens},
    }


def anthropic_stream(settings: ProviderSettings, reply: ScriptedReply) -> StreamPlan:
    start = {**anthropic_message(reply), "content": [], "stop_reason": None}
    start["usage"] = {"input_tokens": reply.prompt_tokens, "output_tokens": 1}
    # The block starts empty; its text or input arrives in the deltas.
    block = _anthropic_block(reply)
    deltas: list[tuple[dict[str, Any], int]]
    if reply.tool_call is None:
        block["text"] = ""
        pieces = word_pieces(reply.texts[0], settings.chunk_count)
        deltas = [({"type": "text_delta", "text": p}, w) for p, w in pieces]
    else:
        block["input"] = {}
        parts = ["", *fragments(reply.tool_call.arguments)]
        deltas = [({"type": "input_json_delta", "partial_json": p}, 1) for p in parts]
    events = [
        (sse_event({"type": "message_start", "message": start}), 0),
        (sse_event({"type": "content_block_start", "index": 0, "content_block": block}), 0),
        (sse_event({"type": "ping"}), 0),
    ]
    events += [
        (sse_event({"type": "content_block_delta", "index": 0, "delta": d}), w) for d, w in deltas
    ]
    terminal = len(events)
    message_delta = {
        "type": "message_delta",
        "delta": {"stop_reason": anthropic_message(reply)["stop_reason"], "stop_sequence": None},
        "usage": {"output_tokens": reply.completion_tokens},
    }
    events += [
        (sse_event({"type": "content_block_stop", "index": 0}), 0),
        (sse_event(message_delta), 0),
        (sse_event({"type": "message_stop"}), 0),
    ]
    return StreamPlan(events, terminal)
