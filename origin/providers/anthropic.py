"""Anthropic's Messages API behind the OpenAI chat-completions interface.

The wire work mirrors ``OpenAICompatibleProvider`` (same client, timeouts and
error mapping); the shapes are translated by ``anthropic_request``, ``anthropic_answer``
and ``anthropic_stream``. A stream is re-encoded event by event as OpenAI chunks, and
``data: [DONE]`` is sent only after Anthropic's ``message_stop``: a cut stream ends in
``UpstreamError`` instead, so the origin never stores a partial answer.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from datetime import datetime
from typing import Any

import aiohttp
import orjson

from prism import UpstreamError, UpstreamUnavailableError
from prism.sse import DONE, SSEDecoder

from .anthropic_answer import to_chat_completion
from .anthropic_request import structured_schema, to_messages_request
from .anthropic_stream import StreamTranslator
from .base import ListedModel, ProviderSpec, UpstreamCompletion, UpstreamStream
from .translated_stream import finish_body, json_events, sse_chunk, truncated
from .upstream_http import UpstreamHTTP, malformed, parse_body, redact

__all__ = ["ANTHROPIC_VERSION", "AnthropicProvider"]

ANTHROPIC_VERSION = "2023-06-01"
_PATH = "/v1/messages"
_MODELS_PATH = "/v1/models"
_MODELS_PAGE = "1000"  # the most one page of the list holds (its default is 20)
_MODELS_PAGES = 50  # a list that never says has_more: false is cut there


class AnthropicProvider:
    def __init__(self, spec: ProviderSpec, http: UpstreamHTTP | None = None) -> None:
        """``http``: the connection pool to call it through (``build_provider`` makes it)."""
        self.spec = spec
        self._http = http or UpstreamHTTP(spec)
        self._headers = {"content-type": "application/json", "anthropic-version": ANTHROPIC_VERSION}
        if spec.api_key:
            self._headers["x-api-key"] = spec.api_key
        # Identity encoding so each event is parsed the moment it arrives.
        self._stream_headers = {
            **self._headers,
            "accept": "text/event-stream",
            "accept-encoding": "identity",
        }

    async def complete(self, body: dict[str, Any], model: str) -> UpstreamCompletion:
        # Translate first: a request Anthropic cannot express fails before any I/O.
        payload = orjson.dumps(to_messages_request(body, model))
        message = parse_body(self.spec, await self._http.post(_PATH, payload, self._headers))
        if not isinstance(message.get("content"), list):
            raise malformed(self.spec, "an unexpected body")
        completion = to_chat_completion(
            message, model, structured=structured_schema(body) is not None
        )
        return UpstreamCompletion(body=orjson.dumps(completion), completion=completion)

    async def stream(self, body: dict[str, Any], model: str) -> UpstreamStream:
        payload = orjson.dumps({**to_messages_request(body, model), "stream": True})
        response = await self._http.open_stream(_PATH, payload, self._stream_headers)
        events = self._events(response, model, structured_schema(body) is not None)
        # Anthropic reports overload and similar failures as an ``error`` event right
        # after the 200. Waiting for message_start turns those into errors raised here,
        # before the client is committed to a 200, so the router can still fail over.
        try:
            first = await anext(events)
        except BaseException:
            await events.aclose()
            raise
        return UpstreamStream(events=_Primed(first, events))

    async def messages(self, body: dict[str, Any], model: str) -> UpstreamCompletion:
        """A Messages API body passed through as it is (but for the upstream model); the
        answer is the provider's own bytes."""
        payload = orjson.dumps({**body, "model": model, "stream": False})
        content = await self._http.post(_PATH, payload, self._headers)
        message = parse_body(self.spec, content)
        if not isinstance(message.get("content"), list):
            raise malformed(self.spec, "an unexpected body")
        return UpstreamCompletion(body=content, completion=message)

    async def messages_stream(self, body: dict[str, Any], model: str) -> UpstreamStream:
        """A Messages API stream passed through: the provider's event bytes as they come."""
        payload = orjson.dumps({**body, "model": model, "stream": True})
        response = await self._http.open_stream(_PATH, payload, self._stream_headers)

        async def close() -> None:
            response.close()

        chunks = self._http.chunks(response)
        # Anthropic reports an overload as an ``error`` event right after the 200: raised
        # here, before the client is committed to a 200, the router can still fail over.
        try:
            first = await anext(chunks)
            self._raise_error_event(first)
        except BaseException:
            await chunks.aclose()
            response.close()
            raise
        return UpstreamStream(events=_Primed(first, chunks), close=close)

    def _raise_error_event(self, first: bytes) -> None:
        """Raise what an ``error`` event at the very start of a stream reports."""
        if not first.startswith(b"event: error"):
            return
        for data in SSEDecoder().feed(first):
            try:
                event = orjson.loads(data)
            except orjson.JSONDecodeError:
                event = None
            error = event.get("error") if isinstance(event, dict) else None
            error = error if isinstance(error, dict) else {}
            text = redact(self.spec, str(error.get("message") or "stream error"))
            if error.get("type") == "overloaded_error":
                raise UpstreamUnavailableError(f"Provider '{self.spec.name}' is overloaded: {text}")
            raise UpstreamError(
                f"Provider '{self.spec.name}' stream failed: {text}", code="upstream_stream_error"
            )

    async def _events(
        self, response: aiohttp.ClientResponse, model: str, structured: bool
    ) -> AsyncGenerator[bytes, None]:
        translator = StreamTranslator(model, provider=self.spec.name, structured=structured)
        body = self._http.chunks(response)
        events = json_events(self.spec, body)
        try:
            async for _, event in events:
                for chunk in translator.feed(event):
                    yield sse_chunk(chunk)
                if translator.done:
                    yield DONE
                    await finish_body(body)
                    return
            raise truncated(self.spec)
        finally:
            await events.aclose()
            await body.aclose()  # releases the response (a no-op once it is read)

    async def models(self) -> list[ListedModel]:
        """``GET /v1/models``, page after page (``has_more``, then ``after_id=last_id``)."""
        headers = {k: v for k, v in self._headers.items() if k != "content-type"}
        listed: list[ListedModel] = []
        params = {"limit": _MODELS_PAGE}
        for _ in range(_MODELS_PAGES):
            page = parse_body(self.spec, await self._http.get(_MODELS_PATH, headers, params))
            data = page.get("data")
            if not isinstance(data, list):
                raise malformed(self.spec, "an unexpected model list")
            listed.extend(model for model in map(_listed_model, data) if model is not None)
            last = page.get("last_id")
            if page.get("has_more") is not True:
                break
            if not isinstance(last, str) or not last:
                raise malformed(self.spec, "a model list page with more but no last_id")
            params = {"limit": _MODELS_PAGE, "after_id": last}
        return listed

    async def aclose(self) -> None:
        await self._http.aclose()


def _listed_model(entry: object) -> ListedModel | None:
    """Anthropic's ``{type: "model", id, display_name, created_at}``; it names no owner."""
    if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
        return None
    created, stamp = 0, entry.get("created_at")  # RFC 3339, e.g. 2025-02-19T00:00:00Z
    if isinstance(stamp, str):
        with contextlib.suppress(ValueError):
            created = int(datetime.fromisoformat(stamp).timestamp())
    return ListedModel(id=entry["id"], created=created)


class _Primed:
    """``first``, then the rest of ``events``.

    A class, not an async generator: a generator that was never iterated skips its
    ``finally`` on ``aclose``, and the upstream response would stay open.
    """

    def __init__(self, first: bytes, events: AsyncGenerator[bytes, None]) -> None:
        self._first: bytes | None = first
        self._events = events

    def __aiter__(self) -> _Primed:
        return self

    async def __anext__(self) -> bytes:
        if self._first is not None:
            first, self._first = self._first, None
            return first
        return await anext(self._events)

    async def aclose(self) -> None:
        self._first = None
        await self._events.aclose()
