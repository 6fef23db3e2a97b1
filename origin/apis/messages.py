"""``POST /v1/messages``: Anthropic's Messages API, served by any provider.

Towards an Anthropic provider the body passes through as sent (but for the upstream
model name) and the answer comes back as the provider sent it. Towards an
OpenAI-compatible one the request becomes a chat completion and the answer (or its
stream, chunk by chunk) a Messages answer (``providers.messages_translate``). Either way
the cache holds the ``message``: a plain hit replays its bytes, a streamed one
Anthropic's event sequence (``prism.messages_sse``). Errors are in Anthropic's format,
budget and rate-limit refusals too. Budgets and token limits count the prompt's bound
and ``max_tokens`` (required here); usage is read from the message's own ``usage``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from prism import Envelope, PrismError, SSEDecoder, UpstreamError
from prism.messages_request import MessagesRequest, parse_messages_request
from prism.messages_sse import MessageAssembler, anthropic_error_json, event_frame, replay_message
from prism.routes import MESSAGES_PATH

from ..governance.token_bounds import messages_completion_bound, messages_prompt_bound
from ..providers.anthropic import AnthropicProvider
from ..providers.base import ChatProvider, UpstreamCompletion, UpstreamStream
from ..providers.messages_translate import ChunkTranslator, to_chat_request, to_message
from .pipeline import Api

__all__ = ["MESSAGES", "MessagesOperation"]


class _MessagesStreamBuilder:
    """Relays each Messages event as Anthropic frames it, and assembles the message."""

    __slots__ = ("_assembler", "_provider")

    usage = False  # a message's usage is in its own events, which every client gets

    def __init__(self, provider: str) -> None:
        self._provider = provider
        self._assembler = MessageAssembler(provider)

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
        message = self._assembler.message()
        return None if message is None else UpstreamCompletion(orjson.dumps(message), message)


class _Translated:
    """An OpenAI chat stream's SSE bytes in, Messages event frames out. Ends after
    ``message_stop``, sent only once ``[DONE]`` came after a finish reason: a cut chat
    stream ends without it, and is never cached."""

    __slots__ = ("_decoder", "_ended", "_events", "_provider", "_translator")

    def __init__(self, events: Any, model: str, provider: str) -> None:
        self._events = events
        self._translator = ChunkTranslator(model)
        self._decoder = SSEDecoder()
        self._provider = provider
        self._ended = False

    def __aiter__(self) -> _Translated:
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
                return b"".join(event_frame(event) for event in out)
        raise StopAsyncIteration

    async def aclose(self) -> None:
        aclose = getattr(self._events, "aclose", None)
        if aclose is not None:
            await aclose()


class MessagesOperation:
    name = "messages"
    done_frame = b""  # ``message_stop`` ends the stream, among its frames

    async def complete(
        self, provider: ChatProvider, body: dict[str, Any], model: str
    ) -> UpstreamCompletion:
        if isinstance(provider, AnthropicProvider):
            return await provider.messages(body, model)
        answer = await provider.complete(to_chat_request(body), model)
        message = to_message(answer.completion, str(answer.completion.get("model") or model))
        return UpstreamCompletion(orjson.dumps(message), message)

    async def stream(
        self, provider: ChatProvider, body: dict[str, Any], model: str
    ) -> UpstreamStream:
        if isinstance(provider, AnthropicProvider):
            return await provider.messages_stream(body, model)
        upstream = await provider.stream(to_chat_request(body, stream=True), model)
        events = _Translated(upstream.events, model, provider.spec.name)
        return UpstreamStream(events=events, close=upstream.close)

    def builder(
        self, provider: str, body: dict[str, Any], redact: Callable[[str], str]
    ) -> _MessagesStreamBuilder:
        return _MessagesStreamBuilder(provider)

    def replay(self, result: UpstreamCompletion, include_usage: bool) -> bytes:
        return replay_message(result.completion)

    def error_frame(self, error: PrismError) -> bytes:
        return b"event: error\ndata: " + anthropic_error_json(error) + b"\n\n"


def _stream_hit(envelope: Envelope, request: MessagesRequest) -> bytes:
    return replay_message(envelope.completion())


MESSAGES: Api[MessagesRequest] = Api(
    MESSAGES_PATH,
    parse_messages_request,
    MessagesOperation(),
    messages_prompt_bound,
    messages_completion_bound,
    _stream_hit,
    key_header="x-api-key",
    error_body=anthropic_error_json,
)
