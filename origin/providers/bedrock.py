"""AWS Bedrock's Converse and ConverseStream APIs behind the OpenAI chat-completions
interface.

``POST {base_url}/model/{modelId}/converse`` (JSON) and ``…/converse-stream`` (the AWS
binary event stream) on ``bedrock-runtime.{region}.amazonaws.com``, each request signed
with SigV4 (``bedrock_auth``) over the exact bytes sent through the provider's pool, or
with a Bedrock API key as a bearer token when the provider has one. The shapes are
translated by ``bedrock_request``, ``bedrock_answer`` and ``bedrock_stream``, the errors
by ``bedrock_errors``; Titan embeddings (InvokeModel) by ``bedrock_embeddings``.
``data: [DONE]`` is sent only after the stream's ``metadata`` event:
a cut stream ends in ``UpstreamError`` instead, so the origin never stores a partial answer.

Options (the provider table's own keys): ``region`` (required: the signature's and the
default endpoint's) and ``profile`` (a named AWS profile; default: the standard chain).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any
from urllib.parse import quote

import orjson
import yarl

from prism.sse import DONE

from .base import ProviderSpec, UpstreamCompletion, UpstreamStream
from .bedrock_answer import to_chat_completion
from .bedrock_auth import SigV4Signer
from .bedrock_embeddings import titan_requests, to_embeddings_list
from .bedrock_errors import raise_for_bedrock
from .bedrock_request import to_converse_request
from .bedrock_stream import EventDecoder, StreamTranslator
from .translated_stream import finish_body, sse_chunk, truncated
from .upstream_http import UpstreamHTTP, malformed, parse_body

__all__ = ["BedrockProvider", "bedrock_options"]

_OPTIONS = frozenset({"region", "profile"})
_REGION = re.compile(r"[a-z]{2}(?:-[a-z]+)+-\d+")
_JSON = {"content-type": "application/json", "accept": "application/json"}
# Identity encoding so each event is decoded the moment it arrives.
_EVENTS = {
    "content-type": "application/json",
    "accept": "application/vnd.amazon.eventstream",
    "accept-encoding": "identity",
}


def bedrock_options(spec: ProviderSpec) -> tuple[str, str | None]:
    """The provider's ``region`` and ``profile``; a ValueError names what is wrong, so a
    bad providers file fails when it loads."""
    unknown = set(spec.options) - _OPTIONS
    if unknown:
        raise ValueError(f"provider '{spec.name}': unknown keys {', '.join(sorted(unknown))}")
    region = spec.options.get("region")
    if not isinstance(region, str) or not _REGION.fullmatch(region):
        raise ValueError(
            f"provider '{spec.name}': kind 'bedrock' needs region = \"<AWS region>\" "
            '(e.g. "us-east-1")'
        )
    profile = spec.options.get("profile")
    if profile is not None and (not isinstance(profile, str) or not profile):
        raise ValueError(f"provider '{spec.name}': profile must be an AWS profile's name")
    return region, profile


class BedrockProvider:
    def __init__(self, spec: ProviderSpec, http: UpstreamHTTP | None = None) -> None:
        """``http``: the connection pool to call it through (``build_provider`` makes it)."""
        region, profile = bedrock_options(spec)
        self.spec = spec
        self._http = http or UpstreamHTTP(spec)
        self._base = spec.base_url.rstrip("/")
        # A Bedrock API key (bearer) when the provider has one, else SigV4.
        self._signer = None if spec.api_key else SigV4Signer(spec.name, region, profile)

    async def _headers(self, path: str, payload: bytes, headers: dict[str, str]) -> dict[str, str]:
        if self._signer is None:
            return {**headers, "authorization": f"Bearer {self.spec.api_key}"}
        # Signed as aiohttp will send it: its URL (yarl) normalises the path's quoting.
        return await self._signer.sign(str(yarl.URL(self._base + path)), payload, headers)

    async def complete(self, body: dict[str, Any], model: str) -> UpstreamCompletion:
        # Translate first: a request Converse cannot express fails before any I/O.
        payload = orjson.dumps(to_converse_request(body))
        path = _path(model, "converse")
        headers = await self._headers(path, payload, _JSON)
        content = await self._http.post(path, payload, headers, raise_for_bedrock)
        response = parse_body(self.spec, content)
        if not isinstance(response.get("output"), dict):
            raise malformed(self.spec, "an unexpected body")
        completion = to_chat_completion(response, model)
        return UpstreamCompletion(body=orjson.dumps(completion), completion=completion)

    async def stream(self, body: dict[str, Any], model: str) -> UpstreamStream:
        payload = orjson.dumps(to_converse_request(body))
        path = _path(model, "converse-stream")
        headers = await self._headers(path, payload, _EVENTS)
        response = await self._http.open_stream(path, payload, headers, raise_for_bedrock)
        chunks = self._http.chunks(response)
        decoder = EventDecoder(self.spec)
        translator = StreamTranslator(self.spec, model)
        # Bedrock may report a throttle or an outage as an exception event right after
        # the 200: reading up to messageStart raises it here, before the client is
        # committed to a 200, so the router can still fail over.
        try:
            first = await _first(chunks, decoder, translator, self.spec)
        except BaseException:
            await chunks.aclose()
            response.close()
            raise

        async def close() -> None:
            response.close()

        events = _events(first, chunks, decoder, translator, self.spec)
        return UpstreamStream(events=events, close=close)

    async def embed(self, body: dict[str, Any], model: str) -> UpstreamCompletion:
        """Titan text embeddings through InvokeModel: one call per input, made at once."""
        requests = titan_requests(body)
        answers = await asyncio.gather(*(self._invoke(model, r) for r in requests))
        if not all(isinstance(a.get("embedding"), list) for a in answers):
            raise malformed(self.spec, "an unexpected body")
        answer = to_embeddings_list(answers, model, body.get("encoding_format") or "float")
        return UpstreamCompletion(body=orjson.dumps(answer), completion=answer)

    async def _invoke(self, model: str, request: dict[str, Any]) -> dict[str, Any]:
        payload = orjson.dumps(request)
        path = _path(model, "invoke")
        headers = await self._headers(path, payload, _JSON)
        content = await self._http.post(path, payload, headers, raise_for_bedrock)
        return parse_body(self.spec, content)

    async def aclose(self) -> None:
        await self._http.aclose()


def _path(model: str, action: str) -> str:
    # A model id holds ':' and an inference profile's ARN '/': one path segment.
    return f"/model/{quote(model, safe='')}/{action}"


async def _first(
    chunks: AsyncIterator[bytes],
    decoder: EventDecoder,
    translator: StreamTranslator,
    spec: ProviderSpec,
) -> bytes:
    """The SSE bytes of the stream's first events (up to its first chunk)."""
    async for raw in chunks:
        out = [chunk for kind, event in decoder.feed(raw) for chunk in translator.feed(kind, event)]
        if out:
            return b"".join(sse_chunk(chunk) for chunk in out) + (DONE if translator.done else b"")
    raise truncated(spec)


async def _events(
    first: bytes,
    chunks: AsyncGenerator[bytes, None],
    decoder: EventDecoder,
    translator: StreamTranslator,
    spec: ProviderSpec,
) -> AsyncGenerator[bytes, None]:
    try:
        yield first
        if translator.done:
            return
        async for raw in chunks:
            out = b""
            for kind, event in decoder.feed(raw):
                out += b"".join(sse_chunk(chunk) for chunk in translator.feed(kind, event))
            if translator.done:
                yield out + DONE
                await finish_body(chunks)
                return
            if out:
                yield out
        raise truncated(spec)
    finally:
        await chunks.aclose()  # releases the response (a no-op once it is read)
