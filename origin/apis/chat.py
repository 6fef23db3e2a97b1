"""``POST /v1/chat/completions``: the chat API's part of the governed path.

Everything a request goes through (auth, one Redis round trip, policy, rate limits, the
budget, coalescing, usage) is ``origin.apis.pipeline``'s, shared with every other API; what
is chat's is here: its parser, its token bounds, its stream replay (with the usage chunk
only when asked for), its semantic layer, and its ``Operation``: a provider's own chat
call, a stream that always asks for usage (so every streamed call can be costed), and
the rebuilding of that stream into the ``chat.completion`` that is cached.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

import orjson

from prism import (
    ChatRequest,
    Envelope,
    PrismError,
    StreamAssembler,
    UpstreamError,
    error_json,
    parse_chat_request,
    replay,
)
from prism.routes import CHAT_PATH
from prism.sse import DONE

from ..governance.token_bounds import completion_token_bound, prompt_token_bound
from ..providers.base import ChatProvider, UpstreamCompletion, UpstreamStream
from ..routing.resume import ChatContinuation
from ..store.semantic import question
from .pipeline import CLIENT_GONE, JSON, SSE, Api

__all__ = ["CHAT", "CLIENT_GONE", "JSON", "SSE", "ChatOperation"]


def _asked_usage(body: dict[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


class _ChatStreamBuilder:
    """Relays each chat chunk as it came and assembles the ``chat.completion``. ``[DONE]``
    is not relayed: ``ChatOperation.done_frame`` ends every whole stream, one that closed
    cleanly without it too."""

    __slots__ = ("_assembler", "_provider", "_redact", "done", "usage")

    def __init__(self, provider: str, body: dict[str, Any], redact: Callable[[str], str]) -> None:
        n = body.get("n")
        # ``usage``: a chunk the client asked for must arrive for the answer to be whole.
        self._assembler = StreamAssembler(
            choices=n if isinstance(n, int) and n > 1 else 1, usage=_asked_usage(body)
        )
        self._provider = provider
        self._redact = redact
        self.done = False  # plain attributes, not properties: read once per event
        self.usage = False

    def add(self, data: bytes) -> bytes:
        if data == b"[DONE]":
            self._assembler.finish()
            self.done = True
            return b""
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise UpstreamError(
                f"Provider '{self._provider}' sent a malformed stream event.",
                code="upstream_malformed",
            ) from None
        if not isinstance(chunk, dict) or chunk.get("error"):
            raise self._stream_error(chunk)
        self._assembler.add(chunk)
        self.usage = not chunk.get("choices") and "usage" in chunk
        return b"data: " + data + b"\n\n"

    def result(self) -> UpstreamCompletion | None:
        assembler = self._assembler
        if not assembler.complete:
            return None
        completion = assembler.completion()
        return UpstreamCompletion(orjson.dumps(completion), completion)

    def _stream_error(self, chunk: Any) -> UpstreamError:
        """The provider's own mid-stream error, with its message (redacted) when it gave one."""
        error = chunk.get("error") if isinstance(chunk, dict) else None
        message = error.get("message") if isinstance(error, dict) else error
        detail = f": {self._redact(message)}" if isinstance(message, str) and message else "."
        return UpstreamError(
            f"Provider '{self._provider}' reported an error mid-stream{detail}",
            code="upstream_stream_error",
        )


class ChatOperation:
    """Chat completions, as every provider adapter speaks them."""

    name = "chat"
    done_frame = DONE

    def __init__(self) -> None:
        self.continuation = ChatContinuation(self.stream)  # a stream broken mid-answer

    def complete(
        self, provider: ChatProvider, body: dict[str, Any], model: str
    ) -> Coroutine[Any, Any, UpstreamCompletion]:
        return provider.complete(body, model)  # the provider's own coroutine: no frame more

    def stream(
        self, provider: ChatProvider, body: dict[str, Any], model: str
    ) -> Coroutine[Any, Any, UpstreamStream]:
        if not _asked_usage(body):
            # Usage is always asked for, so every streamed call can be costed; a client
            # that did not ask never sees the usage chunk (``ClientStream``).
            options = body.get("stream_options")
            body = {**body, "stream_options": {**(options or {}), "include_usage": True}}
        return provider.stream(body, model)

    def builder(
        self, provider: str, body: dict[str, Any], redact: Callable[[str], str]
    ) -> _ChatStreamBuilder:
        return _ChatStreamBuilder(provider, body, redact)

    def replay(self, result: UpstreamCompletion, include_usage: bool) -> bytes:
        return replay(result.completion, include_usage)

    def error_frame(self, error: PrismError) -> bytes:
        return b"data: " + error_json(error) + b"\n\n"


def _stream_hit(envelope: Envelope, chat: ChatRequest) -> bytes:
    return replay(envelope.completion(), chat.include_usage)


def _include_usage(chat: ChatRequest) -> bool:
    return chat.include_usage


CHAT: Api[ChatRequest] = Api(
    CHAT_PATH,
    parse_chat_request,
    ChatOperation(),
    prompt_token_bound,
    completion_token_bound,
    _stream_hit,
    _include_usage,
    question,
    audit_path=False,
)
