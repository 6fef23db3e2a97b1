"""``POST /v1/embeddings``: passed to a provider with an embeddings API, cached exactly.

A batch of inputs is one request to the provider and one cache entry (its fingerprint
covers the whole body, ``input`` as sent): the answer is replayed byte for byte, and
identical concurrent batches share one provider call. Budgets and token limits count
the batch's input bound (``origin.governance.token_bounds``); an embedding generates no tokens, so
its
cost is its input tokens at the model's input price. An adapter with an ``embed`` method
serves them (OpenAI-compatible and Azure: as is; Gemini: translated); Anthropic has no embeddings
API: a route whose target is an Anthropic provider is refused with a 400 before any call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prism import Envelope, InvalidRequestError, PrismError, UpstreamError
from prism.embeddings_request import EmbeddingsRequest, parse_embeddings_request
from prism.routes import EMBEDDINGS_PATH

from ..governance.token_bounds import embeddings_token_bound, no_completion
from ..providers.base import ChatProvider, UpstreamCompletion, UpstreamStream
from ..routing.operation import StreamBuilder
from .pipeline import Api

__all__ = ["EMBEDDINGS", "EmbeddingsOperation"]


def _no_embeddings(provider: ChatProvider) -> InvalidRequestError:
    return InvalidRequestError(
        f"Provider '{provider.spec.name}' ({provider.spec.kind}) has no embeddings API; "
        "route this model to a provider that has one.",
        param="model",
        code="embeddings_not_supported",
    )


class EmbeddingsOperation:
    name = "embeddings"
    done_frame = b""
    continuation = None  # a broken stream ends in its error event

    async def complete(
        self, provider: ChatProvider, body: dict[str, Any], model: str
    ) -> UpstreamCompletion:
        embed = getattr(provider, "embed", None)
        if embed is None:
            raise _no_embeddings(provider)
        result: UpstreamCompletion = await embed(body, model)
        return result

    async def stream(
        self, provider: ChatProvider, body: dict[str, Any], model: str
    ) -> UpstreamStream:
        raise UpstreamError("Embeddings are never streamed.")  # the parser never asks

    def builder(
        self, provider: str, body: dict[str, Any], redact: Callable[[str], str]
    ) -> StreamBuilder:
        raise UpstreamError("Embeddings are never streamed.")

    def replay(self, result: UpstreamCompletion, include_usage: bool) -> bytes:
        return result.body

    def error_frame(self, error: PrismError) -> bytes:
        return b""


def _never_streamed(envelope: Envelope, request: EmbeddingsRequest) -> bytes:
    raise UpstreamError("Embeddings are never streamed.")  # the parser never asks


EMBEDDINGS: Api[EmbeddingsRequest] = Api(
    EMBEDDINGS_PATH,
    parse_embeddings_request,
    EmbeddingsOperation(),
    embeddings_token_bound,
    no_completion,
    _never_streamed,
)
