"""Anthropic Messages stream events → OpenAI ``chat.completion.chunk`` dicts (no I/O).

``StreamTranslator`` emits exactly the chunks ``prism.sse.StreamAssembler`` rebuilds into
what ``anthropic_answer.to_chat_completion`` makes of the same answer, whose stop reason
and usage forms it shares. Apart from the answer because it is a state machine over
events (blocks started, deltas, the one ``message_stop`` that proves the answer complete),
not a function of one body.
"""

from __future__ import annotations

import time
from typing import Any

from prism import UpstreamError, UpstreamUnavailableError

from .anthropic_answer import STRUCTURED_TOOL, chat_usage, finish_reason

__all__ = ["StreamTranslator"]


class StreamTranslator:
    """Anthropic stream events in, OpenAI ``chat.completion.chunk`` dicts out.

    The finish chunk and the usage chunk (``choices: []``) are emitted together at
    ``message_stop``, the only event that proves the answer is complete. ``done``
    turns true there; anything after it is ignored.
    """

    def __init__(
        self,
        model: str,
        *,
        created: int | None = None,
        provider: str = "anthropic",
        structured: bool = False,
    ) -> None:
        self._model = model
        # The request asked for JSON: ``STRUCTURED_TOOL``'s input streams as the content.
        self._structured = structured
        self._json_block: int | None = None
        self._provider = provider  # named in error messages
        self._created = int(time.time()) if created is None else created
        self._id: str | None = None
        self._usage: dict[str, Any] = {}
        self._stop_reason: Any = None
        # Anthropic block index → OpenAI tool-call index (None for a text block);
        # blocks we do not translate (thinking…) are absent and their deltas skipped.
        self._blocks: dict[int, int | None] = {}
        self._ignored: set[int] = set()
        self._with_arguments: set[int] = set()  # tool calls that got an arguments fragment
        self._tool_count = 0
        self._done = False

    @property
    def done(self) -> bool:
        return self._done

    def _malformed(self, what: str) -> UpstreamError:
        return UpstreamError(
            f"Provider '{self._provider}' sent a malformed stream: {what}.",
            code="upstream_malformed",
        )

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": self._id,
            "object": "chat.completion.chunk",
            "created": self._created,
            "model": self._model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    def feed(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        kind = event.get("type")
        if self._done:
            return []
        if kind == "error":
            error = event.get("error")
            error = error if isinstance(error, dict) else {}
            detail = str(error.get("message") or "stream error")[:500]
            if error.get("type") == "overloaded_error":
                raise UpstreamUnavailableError(
                    f"Provider '{self._provider}' is overloaded: {detail}"
                )
            raise UpstreamError(
                f"Provider '{self._provider}' stream failed: {detail}", code="upstream_stream_error"
            )
        if kind == "ping":
            return []
        if kind == "message_start":
            message = event.get("message")
            if not isinstance(message, dict) or self._id is not None:
                raise self._malformed("bad or repeated message_start")
            self._id = str(message.get("id") or "")
            self._usage = dict(message.get("usage") or {})
            return [self._chunk({"role": "assistant", "content": ""})]
        if kind not in (
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop",
        ):
            return []  # Anthropic may add event types; unknown ones carry nothing we serve
        if self._id is None:
            raise self._malformed(f"{kind} before message_start")
        if kind == "content_block_start":
            return self._block_start(event)
        if kind == "content_block_delta":
            return self._block_delta(event)
        if kind == "content_block_stop":
            return self._block_stop(event)
        if kind == "message_delta":
            delta = event.get("delta")
            if isinstance(delta, dict) and delta.get("stop_reason") is not None:
                self._stop_reason = delta["stop_reason"]
            usage = event.get("usage")
            if isinstance(usage, dict):
                # Counts in message_delta are cumulative: they replace, not add.
                self._usage.update({k: v for k, v in usage.items() if v is not None})
            return []
        if kind == "message_stop":
            self._done = True
            if self._json_block is not None and self._stop_reason == "tool_use":
                self._stop_reason = "end_turn"  # the JSON is the answer, not a call to make
            usage_chunk = {**self._chunk({}), "choices": [], "usage": chat_usage(self._usage)}
            return [self._chunk({}, finish_reason(self._stop_reason)), usage_chunk]
        return []

    def _index(self, event: dict[str, Any]) -> int:
        index = event.get("index")
        if not isinstance(index, int):
            raise self._malformed(f"{event.get('type')} without an index")
        return index

    def _block_start(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        index = self._index(event)
        block = event.get("content_block")
        kind = block.get("type") if isinstance(block, dict) else None
        if index in self._blocks or index in self._ignored:
            raise self._malformed(f"content block {index} started twice")
        if kind == "text":
            assert isinstance(block, dict)
            self._blocks[index] = None
            text = block.get("text")
            return [self._chunk({"content": text})] if isinstance(text, str) and text else []
        if kind == "tool_use":
            assert isinstance(block, dict)
            if self._structured and block.get("name") == STRUCTURED_TOOL:
                self._blocks[index] = None  # its input streams as text
                self._json_block = index
                return []
            position = self._blocks[index] = self._tool_count
            self._tool_count += 1
            call = {
                "index": position,
                "id": block.get("id"),
                "type": "function",
                "function": {"name": block.get("name"), "arguments": ""},
            }
            return [self._chunk({"tool_calls": [call]})]
        self._ignored.add(index)
        return []

    def _block_delta(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        index = self._index(event)
        if index in self._ignored:
            return []
        if index not in self._blocks:
            raise self._malformed(f"delta for content block {index} that never started")
        delta = event.get("delta")
        delta = delta if isinstance(delta, dict) else {}
        position = self._blocks[index]
        kind = delta.get("type")
        if kind == "input_json_delta" and index == self._json_block:
            fragment = delta.get("partial_json")
            return (
                [self._chunk({"content": fragment})]
                if isinstance(fragment, str) and fragment
                else []
            )
        if kind == "text_delta" and position is None:
            text = delta.get("text")
            return [self._chunk({"content": text})] if isinstance(text, str) and text else []
        if kind == "input_json_delta" and position is not None:
            fragment = delta.get("partial_json")
            if not isinstance(fragment, str) or not fragment:
                return []  # Anthropic opens a tool's input with an empty fragment
            self._with_arguments.add(position)
            call = {"index": position, "function": {"arguments": fragment}}
            return [self._chunk({"tool_calls": [call]})]
        return []  # citations and other annotations have no chunk form

    def _block_stop(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        position = self._blocks.get(self._index(event))
        if position is None or position in self._with_arguments:
            return []
        # A tool without parameters may stream no input at all; the non-stream answer
        # says "{}", and both must assemble to the same completion.
        self._with_arguments.add(position)
        call = {"index": position, "function": {"arguments": "{}"}}
        return [self._chunk({"tool_calls": [call]})]
