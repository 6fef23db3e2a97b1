"""OpenAI chat-completion chunks → Responses stream events, as a pure translator (no I/O):
how a ``/v1/responses`` stream from a provider that speaks chat completions returns.

The response it ends with is made of the same parts as ``responses_translate.to_response``
makes of a whole completion, so a streamed and a plain answer to one request agree.
"""

from __future__ import annotations

from typing import Any

from .responses_translate import base_id, call_item, message_item, response_shell, usage_of

__all__ = ["ChunkTranslator"]


class ChunkTranslator:
    """OpenAI ``chat.completion.chunk`` dicts in, Responses stream events out (numbered).

    Text opens a message item with one ``output_text`` part, each tool call a
    ``function_call`` item (one open at a time, as the Responses API streams them).
    ``finish`` (at ``[DONE]``) closes the open item and ends the response with the usage
    the last chunks gave, ``response.completed`` (or ``response.incomplete``) carrying it
    whole, as ``prism.responses_sse.replay_response`` would have replayed it.
    """

    def __init__(self, body: dict[str, Any], model: str) -> None:
        self._body = body
        self._model = model
        self._response: dict[str, Any] | None = None
        self._base = ""
        self._output: list[dict[str, Any]] = []
        self._open: str | None = None  # "text", or "tool:<chat tool index>"
        self._finish: Any = None
        self._usage: Any = None
        self._sequence = 0

    def _event(self, event: dict[str, Any]) -> dict[str, Any]:
        event["sequence_number"] = self._sequence
        self._sequence += 1
        return event

    def _start(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        self._base = base_id(chunk.get("id"))
        self._response = response_shell(
            self._body, self._model, self._base, chunk.get("created"), None
        )
        start = {**self._response, "status": "in_progress"}
        return [
            self._event({"type": "response.created", "response": start}),
            self._event({"type": "response.in_progress", "response": start}),
        ]

    def _close(self) -> list[dict[str, Any]]:
        if self._open is None:
            return []
        self._open = None
        index = len(self._output) - 1
        item = self._output[index]
        where = {"item_id": item["id"], "output_index": index}
        events: list[dict[str, Any]] = []
        if item["type"] == "message":
            part = item["content"][0]
            at = {**where, "content_index": 0}
            events.append(
                {"type": "response.output_text.done", **at, "text": part["text"], "logprobs": []}
            )
            events.append({"type": "response.content_part.done", **at, "part": dict(part)})
        else:
            events.append(
                {
                    "type": "response.function_call_arguments.done",
                    **where,
                    "arguments": item["arguments"],
                }
            )
        item["status"] = "completed"
        events.append({"type": "response.output_item.done", "output_index": index, "item": item})
        return [self._event(event) for event in events]

    def _open_item(self, name: str, item: dict[str, Any]) -> list[dict[str, Any]]:
        events = self._close()
        self._open = name
        self._output.append(item)
        index = len(self._output) - 1
        start = {**item, "content": []} if item["type"] == "message" else dict(item)
        events.append(
            self._event(
                {"type": "response.output_item.added", "output_index": index, "item": start}
            )
        )
        if item["type"] == "message":
            part = dict(item["content"][0])
            events.append(
                self._event(
                    {
                        "type": "response.content_part.added",
                        "item_id": item["id"],
                        "output_index": index,
                        "content_index": 0,
                        "part": part,
                    }
                )
            )
        return events

    def _text(self, text: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if self._open != "text":
            item = message_item(self._base, None, None)
            item["status"] = "in_progress"
            # Each message item needs its own id: a message after a tool call gets a suffix.
            if any(o["type"] == "message" for o in self._output):
                item["id"] = f"{item['id']}_{len(self._output)}"
            item["content"] = [
                {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            ]
            events += self._open_item("text", item)
        index = len(self._output) - 1
        item = self._output[index]
        item["content"][0]["text"] += text
        events.append(
            self._event(
                {
                    "type": "response.output_text.delta",
                    "item_id": item["id"],
                    "output_index": index,
                    "content_index": 0,
                    "delta": text,
                    "logprobs": [],
                }
            )
        )
        return events

    def _call(self, call: dict[str, Any]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        name = f"tool:{call.get('index', 0)}"
        function = call.get("function")
        function = function if isinstance(function, dict) else {}
        if self._open != name:
            item = call_item(call.get("id"), function.get("name"), "")
            item["status"] = "in_progress"
            events += self._open_item(name, item)
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            index = len(self._output) - 1
            item = self._output[index]
            item["arguments"] += arguments
            events.append(
                self._event(
                    {
                        "type": "response.function_call_arguments.delta",
                        "item_id": item["id"],
                        "output_index": index,
                        "delta": arguments,
                    }
                )
            )
        return events

    def feed(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        events = [] if self._response is not None else self._start(chunk)
        if isinstance(chunk.get("usage"), dict):
            self._usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue  # a response has one answer
            delta = choice.get("delta")
            delta = delta if isinstance(delta, dict) else {}
            text = delta.get("content") or delta.get("refusal")
            if isinstance(text, str) and text:
                events += self._text(text)
            for call in delta.get("tool_calls") or ():
                if isinstance(call, dict):
                    events += self._call(call)
            if choice.get("finish_reason"):
                self._finish = choice["finish_reason"]
        return events

    def finish(self) -> list[dict[str, Any]]:
        """The closing events, once the chat stream has ended whole (``[DONE]``)."""
        events = [] if self._response is not None else self._start({})
        events += self._close()
        assert self._response is not None
        final = response_shell(
            self._body, self._model, self._base, self._response["created_at"], self._finish
        )
        final["output"] = self._output
        final["usage"] = usage_of(self._usage)
        kind = "response.completed" if final["status"] == "completed" else "response.incomplete"
        events.append(self._event({"type": kind, "response": final}))
        return events

    @property
    def finished(self) -> bool:
        """A finish_reason came: ``[DONE]`` may end the response."""
        return self._finish is not None
