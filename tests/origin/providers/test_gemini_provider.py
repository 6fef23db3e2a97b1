"""The Gemini adapter over real HTTP against the local provider's Gemini API: the wire,
streams, faults and errors with their meaning."""

from __future__ import annotations

import asyncio
import base64
import struct
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import aiohttp
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from deploy.local.asgi_thread import ThreadedServer
from deploy.local.provider import ProviderServer, ProviderSettings
from origin.providers.base import ProviderSpec
from origin.providers.gemini import GeminiProvider
from origin.providers.upstream_http import UpstreamHTTP
from prism import (
    InvalidRequestError,
    NotFoundError,
    PrismError,
    RateLimitError,
    SSEDecoder,
    StreamAssembler,
    UpstreamError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
)
from tests.polling import wait_for

MODEL = "gemini-2.5-flash"
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
CHAT = {
    "model": "gem",
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Name a prime number."},
    ],
}
TOOL_CHAT = {
    "model": "gem",
    "messages": [{"role": "user", "content": "Weather in Pune?"}],
    "tools": [WEATHER_TOOL],
    "tool_choice": "required",
}


class ProviderFactory(Protocol):
    def __call__(
        self, base_url: str, api_key: str = ..., *, options: dict[str, Any] | None = None,
        first_byte_timeout: float = ...,
    ) -> GeminiProvider: ...  # fmt: skip


@pytest.fixture
async def make_provider() -> AsyncIterator[ProviderFactory]:
    made: list[GeminiProvider] = []

    def make(
        base_url: str,
        api_key: str = "gemini-key",
        *,
        options: dict[str, Any] | None = None,
        first_byte_timeout: float = 60.0,
    ) -> GeminiProvider:
        spec = ProviderSpec(
            name="gemini", kind="gemini", base_url=base_url, api_key=api_key,
            first_byte_timeout=first_byte_timeout, options=options or {},
        )  # fmt: skip
        made.append(GeminiProvider(spec))
        return made[-1]

    yield make
    for provider in made:
        await provider.aclose()


@pytest.fixture
def gemini(provider: ProviderServer, make_provider: ProviderFactory) -> GeminiProvider:
    # Short silences are failures here, so stall faults resolve in a fraction of a second.
    return make_provider(provider.url, first_byte_timeout=0.3)


async def _drain(events: AsyncIterator[bytes]) -> tuple[list[bytes], PrismError | None]:
    received: list[bytes] = []
    try:
        async for chunk in events:
            received.append(chunk)
    except PrismError as error:
        return received, error
    return received, None


def _assemble(raw: list[bytes]) -> StreamAssembler:
    decoder, assembler = SSEDecoder(), StreamAssembler()
    for data in decoder.feed(b"".join(raw)):
        if data == b"[DONE]":
            assembler.finish()
        else:
            assembler.add(orjson.loads(data))
    return assembler


@pytest.mark.parametrize("body", [CHAT, TOOL_CHAT], ids=["text", "tool_call"])
async def test_stream_and_non_stream_give_the_same_completion(
    gemini: GeminiProvider, provider: ProviderServer, body: dict[str, Any]
) -> None:
    result = await gemini.complete(body, MODEL)
    stream = await gemini.stream(body, MODEL)
    raw, error = await _drain(stream.events)
    assert error is None and raw[-1] == b"data: [DONE]\n\n"
    assembler = _assemble(raw)
    assert assembler.complete
    streamed = assembler.completion()
    assert orjson.loads(result.body) == result.completion
    assert streamed["choices"] == result.completion["choices"]
    assert streamed["usage"] == result.completion["usage"]
    assert streamed["model"] == result.completion["model"] == MODEL
    message = result.completion["choices"][0]["message"]
    if "tools" in body:
        assert message["tool_calls"][0]["function"]["name"] == "get_weather"
        assert result.completion["choices"][0]["finish_reason"] == "tool_calls"
    else:
        assert message["content"].startswith("Echo: Name a prime number.")


async def test_requests_go_out_in_gemini_format(
    gemini: GeminiProvider, provider: ProviderServer
) -> None:
    await gemini.complete({**CHAT, "user": "u-1", "temperature": 0}, f"models/{MODEL}")
    stream = await gemini.stream(CHAT, MODEL)
    await _drain(stream.events)
    sent, streamed = provider.control.requests()
    assert sent["path"] == f"/v1beta/models/{MODEL}:generateContent"
    assert (streamed["path"], streamed["query"]) == (
        f"/v1beta/models/{MODEL}:streamGenerateContent", "alt=sse"
    )  # fmt: skip
    assert sent["headers"]["x-goog-api-key"] == "gemini-key"
    assert "authorization" not in sent["headers"]
    assert sent["body"] == {
        "systemInstruction": {"parts": [{"text": "Be brief."}]},
        "contents": [{"role": "user", "parts": [{"text": "Name a prime number."}]}],
        "generationConfig": {"temperature": 0},
    }


async def test_options_choose_the_version_and_add_safety_settings(
    provider: ProviderServer, make_provider: ProviderFactory
) -> None:
    safety = [{"category": "HARM_CATEGORY_HARASSMENT", "threshold": "BLOCK_ONLY_HIGH"}]
    gemini = make_provider(provider.url, options={"api_version": "v1", "safety_settings": safety})
    await gemini.complete(CHAT, MODEL)
    (sent,) = provider.control.requests()
    assert sent["path"] == f"/v1/models/{MODEL}:generateContent"
    assert sent["body"]["safetySettings"] == safety


@pytest.mark.parametrize(
    "options",
    [{"api_version": "v2"}, {"safety_settings": "none"}, {"deployment": "x"}],
    ids=["version", "safety", "unknown"],
)
def test_bad_options_fail_when_the_adapter_is_built(options: dict[str, Any]) -> None:
    spec = ProviderSpec(name="g", kind="gemini", base_url="http://x", options=options)
    with pytest.raises(ValueError, match="provider 'g'"):
        GeminiProvider(spec)


async def test_unsupported_request_fails_before_any_upstream_call(
    gemini: GeminiProvider, provider: ProviderServer
) -> None:
    for attempt in (gemini.complete, gemini.stream):
        with pytest.raises(InvalidRequestError):
            await attempt({**CHAT, "n": 3}, MODEL)
    assert provider.control.stats()["chat_requests"] == 0


@pytest.mark.parametrize(
    ("fault", "error_type", "status", "code"),
    [
        ({"mode": "status", "status": 500}, UpstreamError, 502, "bad_gateway"),
        ({"mode": "status", "status": 503}, UpstreamUnavailableError, 503, "upstream_unavailable"),
        ({"mode": "status", "status": 504}, UpstreamTimeoutError, 504, "upstream_timeout"),
        ({"mode": "status", "status": 400}, InvalidRequestError, 400, "invalid_request"),
        ({"mode": "status", "status": 404}, NotFoundError, 404, "not_found"),
        ({"mode": "status", "status": 402}, UpstreamError, 502, "upstream_auth_failed"),
        ({"mode": "rate_limit", "retry_after": 7}, RateLimitError, 429, "upstream_rate_limited"),
        (
            {"mode": "stall_before_first_byte", "seconds": 1.0},
            UpstreamTimeoutError,
            504,
            "upstream_timeout",
        ),
        ({"mode": "malformed_json"}, UpstreamError, 502, "upstream_malformed"),
    ],
    ids=["500", "503", "504", "400", "404", "402", "429", "stall", "malformed"],
)
@pytest.mark.parametrize("streaming", [False, True], ids=["complete", "stream"])
async def test_upstream_faults_become_the_matching_prism_error(
    gemini: GeminiProvider,
    provider: ProviderServer,
    fault: dict[str, Any],
    error_type: type[PrismError],
    status: int,
    code: str,
    streaming: bool,
) -> None:
    provider.control.set_fault(**fault)
    received: list[bytes] = []
    with pytest.raises(error_type) as caught:
        if streaming:
            stream = await gemini.stream(CHAT, MODEL)
            received, error = await _drain(stream.events)
            if error is not None:
                raise error
        else:
            await gemini.complete(CHAT, MODEL)
    assert (caught.value.status, caught.value.code) == (status, code)
    assert b"data: [DONE]\n\n" not in received
    if fault["mode"] == "rate_limit":
        # Gemini says when in its RetryInfo, not in a header.
        assert caught.value.headers == {"retry-after": "7"}


@pytest.mark.parametrize(
    ("mode", "error_type", "code"),
    [
        ("no_done", UpstreamError, "upstream_truncated"),
        ("truncated_stream", UpstreamError, "upstream_truncated"),
        ("error_event", UpstreamUnavailableError, "upstream_unavailable"),
    ],
)
async def test_broken_streams_raise_and_never_send_done(
    gemini: GeminiProvider,
    provider: ProviderServer,
    mode: str,
    error_type: type[PrismError],
    code: str,
) -> None:
    provider.control.set_fault(mode, after_chunks=3)
    raw: list[bytes] = []
    with pytest.raises(error_type) as caught:
        stream = await gemini.stream(CHAT, MODEL)
        raw, error = await _drain(stream.events)
        if error is not None:
            raise error
    assert caught.value.code == code
    assert all(b"[DONE]" not in chunk for chunk in raw)
    assert not _assemble(raw).complete


async def test_stall_mid_stream_times_out_without_done(
    gemini: GeminiProvider, provider: ProviderServer
) -> None:
    provider.control.set_fault("stall_mid_stream", after_chunks=2, seconds=1.0)
    stream = await gemini.stream(CHAT, MODEL)
    raw, error = await _drain(stream.events)
    assert isinstance(error, UpstreamTimeoutError)
    assert raw and all(b"[DONE]" not in chunk for chunk in raw)


class _CountingConnector(aiohttp.TCPConnector):
    def __init__(self) -> None:
        super().__init__()
        self.connections = 0

    async def _create_connection(self, *args: Any, **kwargs: Any) -> Any:
        self.connections += 1
        return await super()._create_connection(*args, **kwargs)


async def test_finished_streams_leave_the_connection_for_reuse(provider: ProviderServer) -> None:
    counter = _CountingConnector()
    spec = ProviderSpec(name="gemini", kind="gemini", base_url=provider.url, api_key="k")
    gemini = GeminiProvider(spec, UpstreamHTTP(spec, lambda _spec: counter))
    try:
        for _ in range(3):
            stream = await gemini.stream(CHAT, MODEL)
            raw, error = await _drain(stream.events)
            assert error is None and raw[-1] == b"data: [DONE]\n\n"
        await gemini.complete(CHAT, MODEL)
    finally:
        await gemini.aclose()
    assert counter.connections == 1


async def test_closing_an_unread_stream_releases_the_upstream_response(
    gemini: GeminiProvider, provider: ProviderServer
) -> None:
    provider.control.set_fault("stall_mid_stream", after_chunks=2, seconds=10)
    stream = await gemini.stream(CHAT, MODEL)
    assert provider.control.stats()["open_streams"] == 1
    await stream.aclose()  # e.g. the hedged request that lost, before reading on
    await asyncio.to_thread(wait_for, lambda: provider.control.stats()["open_streams"] == 0, 5.0)


async def test_closed_port_is_upstream_unreachable(
    make_provider: ProviderFactory, closed_provider_url: str
) -> None:
    gemini = make_provider(closed_provider_url)
    for attempt in (gemini.complete, gemini.stream):
        with pytest.raises(UpstreamError) as caught:
            await attempt(CHAT, MODEL)
        assert (caught.value.status, caught.value.code) == (502, "upstream_unreachable")


async def test_a_wrong_gateway_key_is_an_upstream_auth_failure(
    make_provider: ProviderFactory, provider_factory: Callable[[ProviderSettings], ProviderServer]
) -> None:
    # Gemini answers a bad key with a 400 (API_KEY_INVALID): not the caller's fault.
    server = provider_factory(ProviderSettings(api_key="AIza-right"))
    with pytest.raises(UpstreamError) as caught:
        await make_provider(server.url, api_key="AIza-wrong").complete(CHAT, MODEL)
    assert (caught.value.status, caught.value.code) == (502, "upstream_auth_failed")
    assert "AIza" not in caught.value.message
    result = await make_provider(server.url, api_key="AIza-right").complete(CHAT, MODEL)
    assert result.completion["choices"][0]["finish_reason"] == "stop"


async def test_a_too_long_prompt_is_context_length_exceeded(
    gemini: GeminiProvider, provider: ProviderServer
) -> None:
    message = (
        "The input token count (1200000) exceeds the maximum number of tokens allowed (1048576)."
    )
    provider.control.set_fault("status", status=400, message=message)
    with pytest.raises(InvalidRequestError) as caught:
        await gemini.complete(CHAT, MODEL)
    assert (caught.value.status, caught.value.code) == (400, "context_length_exceeded")
    assert message in caught.value.message


def _serving(*events: dict[str, Any]) -> Starlette:
    """A tiny server whose stream is ``events``: what the local provider cannot send."""
    body = b"".join(b"data: " + orjson.dumps(e) + b"\r\n\r\n" for e in events)

    async def answer(request: Request) -> Response:
        if "alt=sse" in str(request.url):
            return Response(body, 200, media_type="text/event-stream")
        return Response(orjson.dumps(events[-1]), 200, media_type="application/json")

    return Starlette(routes=[Route("/v1beta/models/{target}", answer, methods=["POST"])])


@pytest.mark.parametrize(
    "event",
    [
        {"promptFeedback": {"blockReason": "SAFETY"}},
        {"candidates": [{"content": {"role": "model", "parts": []}, "finishReason": "SAFETY"}]},
    ],
    ids=["prompt", "answer"],
)
async def test_a_blocked_answer_is_a_content_policy_error_json_and_stream(
    make_provider: ProviderFactory, event: dict[str, Any]
) -> None:
    with ThreadedServer(_serving(event), lifespan="off") as server:
        gemini = make_provider(server.url)
        for attempt in (gemini.complete, gemini.stream):
            with pytest.raises(InvalidRequestError) as caught:
                await attempt(CHAT, MODEL)  # the stream fails at its start: nothing sent yet
            assert (caught.value.status, caught.value.code) == (400, "content_policy_violation")


async def test_embeddings_are_one_batch_call_in_openai_form(
    gemini: GeminiProvider, provider: ProviderServer
) -> None:
    body = {"model": "emb", "input": ["alpha", "beta gamma"], "dimensions": 4}
    result = await gemini.embed(body, "gemini-embedding-001")
    (sent,) = provider.control.requests()
    assert sent["path"] == "/v1beta/models/gemini-embedding-001:batchEmbedContents"
    assert sent["body"] == {
        "requests": [
            {
                "model": "models/gemini-embedding-001",
                "content": {"parts": [{"text": text}]},
                "outputDimensionality": 4,
            }
            for text in ("alpha", "beta gamma")
        ]
    }
    answer = result.completion
    assert orjson.loads(result.body) == answer
    assert [d["index"] for d in answer["data"]] == [0, 1]
    vectors = [d["embedding"] for d in answer["data"]]
    assert all(len(v) == 4 for v in vectors) and vectors[0] != vectors[1]
    assert answer["usage"] == {"prompt_tokens": 2 + 3, "total_tokens": 5}  # 4 bytes a token
    encoded = await gemini.embed({**body, "encoding_format": "base64"}, "gemini-embedding-001")
    packed = base64.b64decode(encoded.completion["data"][0]["embedding"])
    assert list(struct.unpack("<4f", packed)) == pytest.approx(vectors[0])
    with pytest.raises(InvalidRequestError) as caught:
        await gemini.embed({"model": "emb", "input": [1, 2, 3]}, "gemini-embedding-001")
    assert caught.value.param == "input"
