"""The stream pieces of the APIs whose streams are typed events (``event: <type>`` then its
JSON: Anthropic's Messages API, OpenAI's Responses API), shared by their operations.

- ``EventStreamBuilder``: a provider's events relayed as they came, each also fed to the
  API's assembler, which rebuilds the answer that is cached.
- ``TranslatedStream``: an OpenAI chat stream's SSE bytes in, the API's event frames out,
  through the API's chunk translator; it ends with the translator's closing events only
  once ``[DONE]`` came after a finish reason (a cut chat stream ends without them, and is
  never cached).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import orjson

from prism import SSEDecoder, UpstreamError

from ..providers.base import UpstreamCompletion

__all__ = ["Assembler", "ChunkTranslator", "EventStreamBuilder", "TranslatedStream"]


class Assembler(Protocol):
    """Rebuilds an answer from its API's events (``prism.messages_sse``, ``.responses_sse``)."""

    @property
    def done(self) -> bool: ...

    def add(self, event: dict[str, Any]) -> None: ...


class ChunkTranslator(Protocol):
    """Chat chunks in, the API's events out (``providers.*_translate.ChunkTranslator``)."""

    @property
    def finished(self) -> bool: ...

    def feed(self, chunk: dict[str, Any]) -> list[dict[str, Any]]: ...

    def finish(self) -> list[dict[str, Any]]: ...


class EventStreamBuilder:
    """Relays each event as its API frames it, and assembles the answer (``answer``: the
    assembler's whole answer, None until its end event came)."""

    __slots__ = ("_answer", "_assembler", "_provider")

    usage = False  # the answer's usage is in its own events, which every client gets

    def __init__(
        self, provider: str, assembler: Assembler, answer: Callable[[], dict[str, Any] | None]
    ) -> None:
        self._provider = provider
        self._assembler = assembler
        self._answer = answer

    @property
    def done(self) -> bool:
        return self._assembler.done

    def add(self, data: bytes) -> bytes:
        try:
            event = orjson.loads(data)
        except orjson.JSONDecodeError:
            event = None
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            raise UpstreamError(
                f"Provider '{self._provider}' sent a malformed stream event.",
                code="upstream_malformed",
            )
        self._assembler.add(event)
        kind: str = event["type"]
        return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"

    def result(self) -> UpstreamCompletion | None:
        answer = self._answer()
        return None if answer is None else UpstreamCompletion(orjson.dumps(answer), answer)


class TranslatedStream:
    """An OpenAI chat stream's SSE bytes in, the API's event frames (``frame``) out."""

    __slots__ = ("_decoder", "_ended", "_events", "_frame", "_provider", "_translator")

    def __init__(
        self,
        events: AsyncIterator[bytes],
        translator: ChunkTranslator,
        frame: Callable[[dict[str, Any]], bytes],
        provider: str,
    ) -> None:
        self._events = events
        self._translator = translator
        self._frame = frame
        self._decoder = SSEDecoder()
        self._provider = provider
        self._ended = False

    def __aiter__(self) -> TranslatedStream:
        return self

    async def __anext__(self) -> bytes:
        while not self._ended:
            raw = await anext(self._events)
            out: list[dict[str, Any]] = []
            for data in self._decoder.feed(raw):
                if data == b"[DONE]":
                    if self._translator.finished:
                        out += self._translator.finish()
                    self._ended = True
                    break
                try:
                    chunk = orjson.loads(data)
                except orjson.JSONDecodeError:
                    chunk = None
                if not isinstance(chunk, dict) or chunk.get("error"):
                    raise UpstreamError(
                        f"Provider '{self._provider}' sent a malformed or error stream event.",
                        code="upstream_stream_error",
                    )
                out += self._translator.feed(chunk)
            if out:
                return b"".join(self._frame(event) for event in out)
        raise StopAsyncIteration

    async def aclose(self) -> None:
        aclose = getattr(self._events, "aclose", None)
        if aclose is not None:
            await aclose()
