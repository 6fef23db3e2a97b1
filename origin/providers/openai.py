"""Any OpenAI-compatible API (OpenAI, Groq, Together, vLLM, Ollama…): pure data + this."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson

from prism import PrismError, UpstreamError, UpstreamTimeoutError

from ._http import build_client, raise_for_upstream, transport_error
from .base import ProviderSpec, UpstreamCompletion, UpstreamStream

__all__ = ["OpenAICompatibleProvider"]


class OpenAICompatibleProvider:
    def __init__(
        self, spec: ProviderSpec, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        self.spec = spec
        self._client = build_client(spec, transport)
        self._headers = {"content-type": "application/json"}
        if spec.api_key:
            self._headers["authorization"] = f"Bearer {spec.api_key}"
        self._stream_headers = {**self._headers, "accept-encoding": "identity"}

    def _payload(self, body: dict[str, Any], model: str, stream: bool) -> bytes:
        payload = body if body.get("model") == model else {**body, "model": model}
        if payload.get("stream") != stream:
            payload = {**payload, "stream": stream}
        return orjson.dumps(payload)

    async def complete(self, body: dict[str, Any], model: str) -> UpstreamCompletion:
        try:
            async with asyncio.timeout(self.spec.total_timeout):
                response = await self._client.post(
                    "/chat/completions",
                    content=self._payload(body, model, stream=False),
                    headers=self._headers,
                )
        except TimeoutError:
            raise UpstreamTimeoutError(f"Provider '{self.spec.name}' took too long.") from None
        except httpx.HTTPError as error:
            raise transport_error(self.spec, error) from None
        raise_for_upstream(self.spec, response.status_code, response.content, response.headers)
        try:
            completion = orjson.loads(response.content)
        except orjson.JSONDecodeError:
            raise UpstreamError(
                f"Provider '{self.spec.name}' sent malformed JSON.", code="upstream_malformed"
            ) from None
        if not isinstance(completion, dict) or not isinstance(completion.get("choices"), list):
            raise UpstreamError(
                f"Provider '{self.spec.name}' sent an unexpected body.", code="upstream_malformed"
            )
        return UpstreamCompletion(body=response.content, completion=completion)

    async def stream(self, body: dict[str, Any], model: str) -> UpstreamStream:
        request = self._client.build_request(
            "POST",
            "/chat/completions",
            content=self._payload(body, model, stream=True),
            headers=self._stream_headers,
        )
        try:
            response = await self._client.send(request, stream=True)
        except httpx.HTTPError as error:
            raise transport_error(self.spec, error) from None
        if response.status_code != 200:
            try:
                content = await response.aread()
            except httpx.HTTPError:
                content = b""
            finally:
                await response.aclose()
            raise_for_upstream(self.spec, response.status_code, content, response.headers)
        return UpstreamStream(events=self._events(response), close=response.aclose)

    async def _events(self, response: httpx.Response) -> AsyncIterator[bytes]:
        deadline = asyncio.get_running_loop().time() + self.spec.total_timeout
        try:
            async for chunk in response.aiter_raw():
                if asyncio.get_running_loop().time() > deadline:
                    raise UpstreamTimeoutError(f"Provider '{self.spec.name}' stream took too long.")
                if chunk:
                    yield chunk
        except PrismError:
            raise
        except httpx.HTTPError as error:
            raise transport_error(self.spec, error) from None
        finally:
            await response.aclose()

    async def aclose(self) -> None:
        await self._client.aclose()
