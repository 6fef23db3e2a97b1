"""``POST /v1/responses``: OpenAI's Responses API, served by any provider.

Towards an OpenAI-compatible provider that serves the Responses API itself
(``responses_api = true`` in its table) the body passes through as sent (but for the
upstream model name, and ``store: false`` when the client did not ask for storage) and the
answer comes back as the provider sent it. Every other provider kind speaks chat
completions (Anthropic's, Azure's, Bedrock's and Gemini's adapters translate from them), so
there the request becomes a chat completion and the answer (or its stream, chunk by chunk)
a ``response`` (``providers.responses_translate``).
The cache holds the ``response``: a plain hit replays its bytes, a streamed one the
Responses event sequence (``prism.responses_sse``). A stateful request (``store: true``,
``previous_response_id``, …) is never cached (``prism.responses_request``). Errors are
OpenAI's, as for chat. Budgets and token limits count the prompt's bound and
``max_output_tokens``; usage is read from the response's own ``usage``. A stream broken
mid-answer is carried on by another target through its chat API (``apis.responses_resume``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import orjson

from prism import Envelope, PrismError
from prism.responses_request import ResponsesRequest, classify_responses, parse_responses_request
from prism.responses_sse import ResponseAssembler, error_event, event_frame, replay_response
from prism.routes import RESPONSES_PATH

from ..connection.redis_client import RedisClientError
from ..gateway import Gateway
from ..governance.token_bounds import responses_completion_bound, responses_prompt_bound
from ..providers.base import ChatProvider, UpstreamCompletion, UpstreamStream
from ..providers.openai import OpenAICompatibleProvider
from ..providers.responses_stream import ChunkTranslator
from ..providers.responses_translate import to_chat_request, to_response
from .event_streams import EventStreamBuilder, TranslatedStream
from .pipeline import Api
from .responses_resume import ResponsesContinuation

__all__ = ["RESPONSES", "ResponsesOperation", "stored_owner_key"]

log = logging.getLogger("prism.origin")

# How long Prism remembers who asked a provider to keep a response: OpenAI keeps one 30 days.
_OWNER_TTL = 30 * 86_400


def stored_owner_key(response_id: str) -> str:
    """Where the project and provider of a response kept with ``store: true`` are noted, so
    ``GET``/``DELETE /v1/responses/{id}`` reach that provider for that project only."""
    return f"prism:response:{response_id}"


def _native(provider: ChatProvider) -> OpenAICompatibleProvider | None:
    """The provider when it serves the Responses API itself, else None."""
    if isinstance(provider, OpenAICompatibleProvider) and provider.responses_api:
        return provider
    return None


def _passed(body: dict[str, Any]) -> dict[str, Any]:
    # OpenAI stores a response unless told not to; Prism treats a request without ``store``
    # as stateless (it may be served from the cache), so the provider is told the same.
    return body if body.get("store") is not None else {**body, "store": False}


class ResponsesOperation:
    name = "responses"
    done_frame = b""  # ``response.completed`` ends the stream, among its frames

    def __init__(self) -> None:
        self.continuation = ResponsesContinuation(self._translated)  # a stream broken midway

    async def complete(
        self, provider: ChatProvider, body: dict[str, Any], model: str
    ) -> UpstreamCompletion:
        native = _native(provider)
        if native is not None:
            return await native.responses(_passed(body), model)
        answer = await provider.complete(to_chat_request(body), model)
        model_name = str(answer.completion.get("model") or model)
        response = to_response(answer.completion, body, model_name)
        return UpstreamCompletion(orjson.dumps(response), response)

    async def stream(
        self, provider: ChatProvider, body: dict[str, Any], model: str
    ) -> UpstreamStream:
        native = _native(provider)
        if native is not None:
            return await native.responses_stream(_passed(body), model)
        return await self._translated(provider, body, to_chat_request(body, stream=True), model)

    async def _translated(
        self, provider: ChatProvider, body: dict[str, Any], chat: dict[str, Any], model: str
    ) -> UpstreamStream:
        """``body``'s chat request ``chat``, its stream as Responses events."""
        upstream = await provider.stream(chat, model)
        translator = ChunkTranslator(body, model)
        events = TranslatedStream(upstream.events, translator, event_frame, provider.spec.name)
        return UpstreamStream(events=events, close=upstream.close)

    def builder(
        self, provider: str, body: dict[str, Any], redact: Callable[[str], str]
    ) -> EventStreamBuilder:
        assembler = ResponseAssembler(provider)
        return EventStreamBuilder(provider, assembler, assembler.response)

    def replay(self, result: UpstreamCompletion, include_usage: bool) -> bytes:
        return replay_response(result.completion)

    def error_frame(self, error: PrismError) -> bytes:
        return error_event(error)


def _note_owner(
    gateway: Gateway,
    project: str,
    request: ResponsesRequest,
    answer: UpstreamCompletion,
    provider: str,
) -> None:
    """A response a provider of the Responses API was asked to keep: note whose it is."""
    if request.body.get("store") is not True or _native(gateway.providers[provider]) is None:
        return
    ident = answer.completion.get("id")
    if isinstance(ident, str) and 0 < len(ident) <= 200:
        gateway.spawn(_keep_owner(gateway, ident, orjson.dumps([project, provider])))


async def _keep_owner(gateway: Gateway, ident: str, owner: bytes) -> None:
    try:
        await gateway.redis.execute("SET", stored_owner_key(ident), owner, "EX", _OWNER_TTL)
    except RedisClientError as error:  # its GET and DELETE will be a 404: said in the log
        log.warning("the owner of stored response %s could not be noted: %s", ident, error)


def _stream_hit(envelope: Envelope, request: ResponsesRequest) -> bytes:
    return replay_response(envelope.completion())


RESPONSES: Api[ResponsesRequest] = Api(
    RESPONSES_PATH,
    parse_responses_request,
    ResponsesOperation(),
    responses_prompt_bound,
    responses_completion_bound,
    _stream_hit,
    cache_decision=classify_responses,
    on_answer=_note_owner,
)
