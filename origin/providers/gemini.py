"""Google's Gemini API (the Generative Language API) behind the OpenAI chat-completions
and embeddings interfaces.

``POST /{api_version}/models/{model}:generateContent``, ``:streamGenerateContent?alt=sse``
and ``:batchEmbedContents`` with the key in ``x-goog-api-key``. The wire work is
``UpstreamHTTP``'s, as for every kind; the shapes are translated by ``gemini_request``,
``gemini_answer``, ``gemini_stream`` and ``gemini_embeddings``,
and Gemini's errors (``{"error": {code, message, status, details}}``) keep their meaning
here (``raise_for_gemini``). A stream is re-encoded event by event as OpenAI chunks, and
``data: [DONE]`` is sent only after the event with a ``finishReason``: a cut stream ends
in ``UpstreamError`` instead, so the origin never stores a partial answer.
"""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Any
from urllib.parse import quote

import aiohttp
import orjson

from prism import InvalidRequestError, UpstreamError
from prism.sse import DONE

from .base import ProviderSpec, UpstreamCompletion, UpstreamStream
from .gemini_answer import to_chat_completion
from .gemini_embeddings import embedding_texts, to_batch_request, to_embeddings
from .gemini_request import to_gemini_request
from .gemini_stream import StreamTranslator
from .translated_stream import finish_body, json_events, sse_chunk, truncated
from .upstream_http import (
    CONTEXT_LENGTH_EXCEEDED,
    UpstreamHTTP,
    malformed,
    parse_body,
    raise_for_upstream,
    redact,
)

__all__ = ["API_VERSIONS", "GeminiProvider", "raise_for_gemini"]

API_VERSIONS = ("v1beta", "v1")
_OPTIONS = frozenset({"api_version", "safety_settings"})
# Gemini says a prompt is too long in its own words (and with no code).
_TOO_LONG = re.compile(r"input token count.*exceeds the maximum", re.IGNORECASE | re.DOTALL)
_RETRY_DELAY = re.compile(r"(\d+(?:\.\d+)?)s")


def _options(spec: ProviderSpec) -> tuple[str, list[dict[str, Any]]]:
    """The kind's own keys of a providers-file table: ``api_version`` and ``safety_settings``."""
    unknown = set(spec.options) - _OPTIONS
    if unknown:
        raise ValueError(f"provider '{spec.name}': unknown keys {', '.join(sorted(unknown))}")
    version = spec.options.get("api_version", API_VERSIONS[0])
    if version not in API_VERSIONS:
        raise ValueError(f"provider '{spec.name}': api_version must be one of {API_VERSIONS}")
    safety = spec.options.get("safety_settings", [])
    if not isinstance(safety, list) or not all(
        isinstance(s, dict)
        and isinstance(s.get("category"), str)
        and isinstance(s.get("threshold"), str)
        for s in safety
    ):
        raise ValueError(
            f"provider '{spec.name}': safety_settings must be a list of "
            "{ category = ..., threshold = ... } tables"
        )
    return version, [dict(s) for s in safety]


def _error_of(body: bytes) -> dict[str, Any]:
    """Google's ``{"error": {...}}`` (sometimes sent as a one-element list), or ``{}``."""
    try:
        data: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        return {}
    if isinstance(data, list) and len(data) == 1:
        data = data[0]
    error = data.get("error") if isinstance(data, dict) else None
    return error if isinstance(error, dict) else {}


def _details(error: dict[str, Any]) -> list[dict[str, Any]]:
    details = error.get("details")
    return [d for d in details if isinstance(d, dict)] if isinstance(details, list) else []


def raise_for_gemini(
    spec: ProviderSpec, status: int, body: bytes, headers: Mapping[str, str]
) -> None:
    """Map a Gemini error answer to the gateway's error (an ``ErrorMapper``).

    Gemini says a bad key with a 400 (``API_KEY_INVALID``) and an account it will not
    serve (no billing, a region without free tier) with FAILED_PRECONDITION or 402: those
    are the gateway's, not the caller's, and another target may serve. A 429's
    ``RetryInfo.retryDelay`` becomes its Retry-After. The rest is the common mapping
    (INVALID_ARGUMENT 400 with its message, NOT_FOUND 404, INTERNAL 500 retried,
    UNAVAILABLE 503, DEADLINE_EXCEEDED 504).
    """
    error = _error_of(body)
    details = _details(error)
    message = redact(spec, str(error.get("message") or ""))
    suffix = f": {message}" if message else "."
    reasons = {d.get("reason") for d in details}
    if "API_KEY_INVALID" in reasons or status in (401, 403):
        raise UpstreamError(
            f"Provider '{spec.name}' rejected the gateway's credentials.",
            code="upstream_auth_failed",
        )
    if status == 402 or error.get("status") == "FAILED_PRECONDITION":
        raise UpstreamError(
            f"Provider '{spec.name}' refused the gateway's account{suffix}",
            code="upstream_auth_failed",
        )
    if status == 400 and _TOO_LONG.search(message):
        raise InvalidRequestError(
            f"Provider '{spec.name}' rejected the request{suffix}", code=CONTEXT_LENGTH_EXCEEDED
        )
    if status == 429 and "retry-after" not in headers:
        for detail in details:
            delay = _RETRY_DELAY.fullmatch(str(detail.get("retryDelay", "")))
            if delay is not None:
                headers = {"retry-after": f"{float(delay[1]):g}"}
    raise_for_upstream(spec, status, body, headers)


def _status_of(error: dict[str, Any]) -> int:
    code = error.get("code")
    return code if isinstance(code, int) and 400 <= code <= 599 else 500


class GeminiProvider:
    def __init__(self, spec: ProviderSpec, http: UpstreamHTTP | None = None) -> None:
        """``http``: the connection pool to call it through (``build_provider`` makes it).
        Raises ValueError for a bad ``api_version`` or ``safety_settings``."""
        self.spec = spec
        self._version, self._safety = _options(spec)
        self._http = http or UpstreamHTTP(spec)
        self._headers = {"content-type": "application/json"}
        if spec.api_key:
            self._headers["x-goog-api-key"] = spec.api_key
        # Identity encoding so each event is parsed the moment it arrives.
        self._stream_headers = {
            **self._headers,
            "accept": "text/event-stream",
            "accept-encoding": "identity",
        }

    def _path(self, model: str, method: str) -> str:
        name = quote(model.removeprefix("models/"), safe="-._~")
        return f"/{self._version}/models/{name}:{method}"

    def _payload(self, body: dict[str, Any], model: str) -> bytes:
        # Translated first: a request Gemini cannot express fails before any I/O.
        return orjson.dumps(to_gemini_request(body, model, self._safety))

    async def complete(self, body: dict[str, Any], model: str) -> UpstreamCompletion:
        payload = self._payload(body, model)
        path = self._path(model, "generateContent")
        content = await self._http.post(path, payload, self._headers, errors=raise_for_gemini)
        answer = parse_body(self.spec, content)
        if not isinstance(answer.get("candidates", []), list):
            raise malformed(self.spec, "an unexpected body")
        completion = to_chat_completion(answer, model, provider=self.spec.name)
        return UpstreamCompletion(body=orjson.dumps(completion), completion=completion)

    async def stream(self, body: dict[str, Any], model: str) -> UpstreamStream:
        payload = self._payload(body, model)
        path = self._path(model, "streamGenerateContent") + "?alt=sse"
        response = await self._http.open_stream(
            path, payload, self._stream_headers, errors=raise_for_gemini
        )
        events = self._events(response, model)
        # Gemini blocks a prompt (or an answer) in the stream's first events, after the
        # 200. Waiting for the first chunk turns a block into the content-policy error
        # here, before the client is committed to a 200.
        try:
            first = await anext(events)
        except BaseException:
            await events.aclose()
            raise

        async def close() -> None:
            await events.aclose()  # started: its finally releases the response

        return UpstreamStream(events=_then(first, events), close=close)

    async def _events(
        self, response: aiohttp.ClientResponse, model: str
    ) -> AsyncGenerator[bytes, None]:
        translator = StreamTranslator(model, provider=self.spec.name)
        body = self._http.chunks(response)
        events = json_events(self.spec, body)
        try:
            async for data, event in events:
                if "error" in event:
                    error = event["error"] if isinstance(event["error"], dict) else {}
                    raise_for_gemini(self.spec, _status_of(error), data, {})
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

    async def embed(self, body: dict[str, Any], model: str) -> UpstreamCompletion:
        """An OpenAI embeddings body as one ``batchEmbedContents`` call; the answer in
        OpenAI's list form (``gemini_embeddings``)."""
        texts = embedding_texts(body.get("input"))
        payload = orjson.dumps(to_batch_request(body, model, texts))
        path = self._path(model, "batchEmbedContents")
        content = await self._http.post(path, payload, self._headers, errors=raise_for_gemini)
        answer = to_embeddings(parse_body(self.spec, content), body, model, texts)
        if answer is None:
            raise malformed(self.spec, "an unexpected body")
        return UpstreamCompletion(body=orjson.dumps(answer), completion=answer)

    async def aclose(self) -> None:
        await self._http.aclose()


async def _then(first: bytes, events: AsyncIterator[bytes]) -> AsyncGenerator[bytes, None]:
    yield first
    async for event in events:
        yield event
