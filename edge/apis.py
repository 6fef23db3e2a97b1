"""The cached APIs the edge serves, as data: one ``EdgeApi`` each, for the one pipeline
(``edge.pipeline``) every one of them goes through.

What differs between chat completions, embeddings, Anthropic messages and OpenAI
responses is only what is written here: the path, the body's parser, whether a request
may be cached, how a stored answer is replayed as the API's stream, the header that may
carry the key instead of a bearer token, how its errors look, and how many parsed bodies
and decoded entries an isolate remembers for it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from prism import (
    CacheDecision,
    ChatRequest,
    Envelope,
    Limits,
    PrismError,
    UpstreamError,
    classify,
    error_json,
    parse_chat_request,
    replay,
)
from prism.embeddings_request import EmbeddingsRequest, parse_embeddings_request
from prism.messages_request import MessagesRequest, parse_messages_request
from prism.messages_sse import anthropic_error_json, replay_message
from prism.parsers import ParsedRequest
from prism.responses_request import ResponsesRequest, classify_responses, parse_responses_request
from prism.responses_sse import replay_response
from prism.routes import CHAT_PATH, EMBEDDINGS_PATH, MESSAGES_PATH, RESPONSES_PATH

__all__ = ["CACHED_APIS", "CHAT", "EMBEDDINGS", "MESSAGES", "RESPONSES", "EdgeApi"]

R = TypeVar("R", bound=ParsedRequest)


@dataclass(frozen=True, slots=True)
class EdgeApi(Generic[R]):
    """One API's part of the edge's pipeline: everything else is shared."""

    path: str
    parse: Callable[[bytes, Limits], R]
    stream_hit: Callable[[Envelope, R], bytes]  # a stored answer as this API's event stream
    key_header: str | None = None  # a header that may carry the key instead of a bearer token
    error_body: Callable[[PrismError], bytes] = error_json  # how this API's errors look
    # Per isolate: parsed bodies (and their fingerprints) and decoded entries remembered.
    recent_bodies: int = 64
    recent_entries: int = 16
    # Whether the request may be read from and written to KV (the origin decides the same).
    cache_decision: Callable[[R, str | None], CacheDecision] = classify


def _chat_stream(envelope: Envelope, chat: ChatRequest) -> bytes:
    return replay(envelope.completion(), chat.include_usage)


def _never_streamed(envelope: Envelope, request: EmbeddingsRequest) -> bytes:
    raise UpstreamError("Embeddings are never streamed.")  # the parser never asks


def _message_stream(envelope: Envelope, request: MessagesRequest) -> bytes:
    return replay_message(envelope.completion())


def _response_stream(envelope: Envelope, request: ResponsesRequest) -> bytes:
    return replay_response(envelope.completion())


CHAT: EdgeApi[ChatRequest] = EdgeApi(
    CHAT_PATH, parse_chat_request, _chat_stream, recent_bodies=256, recent_entries=64
)
EMBEDDINGS: EdgeApi[EmbeddingsRequest] = EdgeApi(
    EMBEDDINGS_PATH, parse_embeddings_request, _never_streamed
)
MESSAGES: EdgeApi[MessagesRequest] = EdgeApi(
    MESSAGES_PATH,
    parse_messages_request,
    _message_stream,
    key_header="x-api-key",  # Anthropic's clients send the key so
    error_body=anthropic_error_json,
)

RESPONSES: EdgeApi[ResponsesRequest] = EdgeApi(
    RESPONSES_PATH,
    parse_responses_request,
    _response_stream,
    cache_decision=classify_responses,  # a stateful request is forwarded, never served from KV
)

# Every cached route the edge serves, each through the same pipeline.
CACHED_APIS: tuple[EdgeApi[Any], ...] = (CHAT, EMBEDDINGS, MESSAGES, RESPONSES)
