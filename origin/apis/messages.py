"""``POST /v1/messages``: Anthropic's Messages API, served by any provider.

Towards an Anthropic provider the body passes through as sent (but for the upstream
model name) and the answer comes back as the provider sent it. Towards an
OpenAI-compatible one the request becomes a chat completion and the answer (or its
stream, chunk by chunk) a Messages answer (``providers.messages_translate``). Either way
the cache holds the ``message``: a plain hit replays its bytes, a streamed one
Anthropic's event sequence (``prism.messages_sse``). Errors are in Anthropic's format,
budget and rate-limit refusals too. Budgets and token limits count the prompt's bound
and ``max_tokens`` (required here); usage is read from the message's own ``usage``. A
stream broken mid-answer is carried on by another target (``apis.messages_resume``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from prism import Envelope, PrismError
from prism.messages_request import MessagesRequest, parse_messages_request
from prism.messages_sse import MessageAssembler, anthropic_error_json, event_frame, replay_message
from prism.routes import MESSAGES_PATH

from ..governance.token_bounds import messages_completion_bound, messages_prompt_bound
from ..providers.anthropic import AnthropicProvider
from ..providers.base import ChatProvider, UpstreamCompletion, UpstreamStream
from ..providers.messages_translate import ChunkTranslator, to_chat_request, to_message
from .event_streams import EventStreamBuilder, TranslatedStream
from .messages_resume import MessagesContinuation
from .pipeline import Api

__all__ = ["MESSAGES", "MessagesOperation"]


class MessagesOperation:
    name = "messages"
    done_frame = b""  # ``message_stop`` ends the stream, among its frames

    def __init__(self) -> None:
        self.continuation = MessagesContinuation(self._translated)  # a stream broken midway

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
        return await self._translated(provider, to_chat_request(body, stream=True), model)

    async def _translated(
        self, provider: ChatProvider, chat: dict[str, Any], model: str
    ) -> UpstreamStream:
        """A chat request's stream, as Messages events."""
        upstream = await provider.stream(chat, model)
        translator = ChunkTranslator(model)
        events = TranslatedStream(upstream.events, translator, event_frame, provider.spec.name)
        return UpstreamStream(events=events, close=upstream.close)

    def builder(
        self, provider: str, body: dict[str, Any], redact: Callable[[str], str]
    ) -> EventStreamBuilder:
        assembler = MessageAssembler(provider)
        return EventStreamBuilder(provider, assembler, assembler.message)

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
