"""Any OpenAI-compatible API (OpenAI, Groq, Together, vLLM, Ollama…): pure data + this.

Its one option: ``responses_api = true`` says the provider serves OpenAI's Responses API
(``POST /responses``) itself, so ``/v1/responses`` passes through to it rather than being
translated to a chat completion (``origin.apis.responses``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from .base import ListedModel, ProviderSpec, UpstreamCompletion, UpstreamStream
from .upstream_http import UpstreamHTTP, malformed, parse_body

__all__ = ["OpenAICompatibleProvider"]


def _listed_model(entry: object) -> ListedModel | None:
    """An OpenAI model object (``{id, object, created, owned_by}``) as a ``ListedModel``;
    None for an entry without a string ``id``."""
    if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
        return None
    created, owned_by = entry.get("created"), entry.get("owned_by")
    return ListedModel(
        id=entry["id"],
        created=created if isinstance(created, int) and not isinstance(created, bool) else 0,
        owned_by=owned_by if isinstance(owned_by, str) and owned_by else None,
    )


class OpenAICompatibleProvider:
    def __init__(self, spec: ProviderSpec, http: UpstreamHTTP | None = None) -> None:
        """``http``: the connection pool to call it through (``build_provider`` makes it)."""
        native = spec.options.get("responses_api", False)
        if not isinstance(native, bool):
            raise ValueError(f"provider '{spec.name}': responses_api must be true or false")
        self.responses_api = native  # serves POST /responses itself
        self.spec = spec
        self._http = http or UpstreamHTTP(spec)
        self._headers = {"content-type": "application/json"}
        if spec.api_key:
            self._headers["authorization"] = f"Bearer {spec.api_key}"
        self._stream_headers = {**self._headers, "accept-encoding": "identity"}
        self._list_headers = {k: v for k, v in self._headers.items() if k != "content-type"}

    def _payload(self, body: dict[str, Any], model: str, stream: bool) -> bytes:
        payload = body if body.get("model") == model else {**body, "model": model}
        if payload.get("stream") != stream:
            payload = {**payload, "stream": stream}
        return orjson.dumps(payload)

    async def complete(self, body: dict[str, Any], model: str) -> UpstreamCompletion:
        payload = self._payload(body, model, stream=False)
        content = await self._http.post("/chat/completions", payload, self._headers)
        completion = parse_body(self.spec, content)
        if not isinstance(completion.get("choices"), list):
            raise malformed(self.spec, "an unexpected body")
        # Served and stored as the provider sent it: no re-encoding on the hot path.
        return UpstreamCompletion(body=content, completion=completion)

    async def stream(self, body: dict[str, Any], model: str) -> UpstreamStream:
        payload = self._payload(body, model, stream=True)
        response = await self._http.open_stream("/chat/completions", payload, self._stream_headers)

        async def close() -> None:
            response.close()

        # Passed on chunk by chunk as the provider flushed them: no re-chunking.
        return UpstreamStream(events=self._http.chunks(response), close=close)

    async def responses(self, body: dict[str, Any], model: str) -> UpstreamCompletion:
        """``POST /responses``: a Responses API body passed through as it is (but for the
        upstream model); the answer is the provider's own bytes."""
        content = await self._http.post(
            "/responses", self._payload(body, model, stream=False), self._headers
        )
        response = parse_body(self.spec, content)
        if response.get("object") != "response" or not isinstance(response.get("output"), list):
            raise malformed(self.spec, "an unexpected body")
        return UpstreamCompletion(body=content, completion=response)

    async def responses_stream(self, body: dict[str, Any], model: str) -> UpstreamStream:
        """A Responses API stream passed through: the provider's event bytes as they come."""
        payload = self._payload(body, model, stream=True)
        response = await self._http.open_stream("/responses", payload, self._stream_headers)

        async def close() -> None:
            response.close()

        return UpstreamStream(events=self._http.chunks(response), close=close)

    async def stored_response(
        self, method: str, path: str, params: Mapping[str, str] | None = None
    ) -> bytes:
        """``GET``/``DELETE /responses/{id}`` (or a path under it): a response this provider
        was asked to keep, as it sends it."""
        return await self._http.get("/responses/" + path, self._list_headers, params, method)

    async def embed(self, body: dict[str, Any], model: str) -> UpstreamCompletion:
        """``POST /embeddings``: the provider's list of vectors, as it sent it."""
        payload = orjson.dumps(body if body.get("model") == model else {**body, "model": model})
        content = await self._http.post("/embeddings", payload, self._headers)
        answer = parse_body(self.spec, content)
        if not isinstance(answer.get("data"), list):
            raise malformed(self.spec, "an unexpected body")
        return UpstreamCompletion(body=content, completion=answer)

    async def models(self) -> list[ListedModel]:
        """``GET /models``: OpenAI's ``{"object": "list", "data": [...]}``, one page."""
        content = await self._http.get("/models", self._list_headers)
        data = parse_body(self.spec, content).get("data")
        if not isinstance(data, list):
            raise malformed(self.spec, "an unexpected model list")
        return [model for model in map(_listed_model, data) if model is not None]

    async def aclose(self) -> None:
        await self._http.aclose()
