"""Any OpenAI-compatible API (OpenAI, Groq, Together, vLLM, Ollama…): pure data + this."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson

from prism import PrismError, UpstreamTimeoutError

from ._http import ConnectorFactory, UpstreamHTTP, malformed, parse_body, transport_error
from .base import ProviderSpec, UpstreamCompletion, UpstreamStream

__all__ = ["OpenAICompatibleProvider"]


class OpenAICompatibleProvider:
    def __init__(self, spec: ProviderSpec, connector: ConnectorFactory | None = None) -> None:
        self.spec = spec
        self._http = UpstreamHTTP(spec, connector)
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

        return UpstreamStream(events=self._events(response), close=close)

    async def _events(self, response: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
        deadline = asyncio.get_running_loop().time() + self.spec.total_timeout
        try:
            # As the provider flushed them: passed on chunk by chunk, no re-chunking.
            async for chunk in response.content.iter_any():
                if asyncio.get_running_loop().time() > deadline:
                    raise UpstreamTimeoutError(f"Provider '{self.spec.name}' stream took too long.")
                yield chunk
        except PrismError:
            raise
        except (aiohttp.ClientError, TimeoutError) as error:
            raise transport_error(self.spec, error) from None
        finally:
            response.release()  # back to the pool when fully read, else closed

    async def aclose(self) -> None:
        await self._http.aclose()
