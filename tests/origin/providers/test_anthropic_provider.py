"""The Anthropic adapter: translation in-process, the wire against the local provider."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from typing import Any, Protocol, TypedDict, Unpack

import aiohttp
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from deploy.local.asgi_thread import ThreadedServer
from deploy.local.provider import ProviderServer, ProviderSettings
from deploy.local.provider_models import ANTHROPIC_MODELS
from origin.providers.anthropic import AnthropicProvider
from origin.providers.anthropic_answer import to_chat_completion
from origin.providers.anthropic_request import to_messages_request
from origin.providers.anthropic_stream import StreamTranslator
from origin.providers.base import ProviderSpec
from origin.providers.upstream_http import UpstreamHTTP
from prism import (
    InvalidRequestError,
    NotFoundError,
    PrismError,
    RateLimitError,
    RequestTooLargeError,
    SSEDecoder,
    StreamAssembler,
    UpstreamError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
)
from tests.polling import wait_for

MODEL = "claude-sonnet-4-5"
CREATED = 1_700_000_000
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TIME_TOOL = {"type": "function", "function": {"name": "get_time"}}


# ---------------------------------------------------------------- requests


def test_system_and_developer_messages_become_the_system_prompt() -> None:
    body = {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "developer", "content": [{"type": "text", "text": "Answer in French."}]},
            {"role": "user", "content": "Hi"},
        ]
    }
    request = to_messages_request(body, MODEL)
    assert request["system"] == "Be brief.\n\nAnswer in French."
    assert request["messages"] == [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]
    assert request["model"] == MODEL


def test_image_parts_become_base64_and_url_sources() -> None:
    body = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Compare these"},
                    {
                        "type": "image_url",
                        "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="},
                    },
                    {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}},
                ],
            }
        ]
    }
    assert to_messages_request(body, MODEL)["messages"][0]["content"] == [
        {"type": "text", "text": "Compare these"},
        {
            "type": "image",
            "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
        },
        {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}},
    ]


def test_tool_calls_and_results_become_alternating_anthropic_turns() -> None:
    body = {
        "messages": [
            {"role": "system", "content": "You may call tools."},
            {"role": "user", "content": "Weather in Pune, and the time?"},
            {
                "role": "assistant",
                "content": "Checking.",
                "tool_calls": [
                    {
                        "id": "toolu_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Pune"}'},
                    },
                    {
                        "id": "toolu_2",
                        "type": "function",
                        "function": {"name": "get_time", "arguments": ""},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "toolu_1", "content": "31C, sunny"},
            {
                "role": "tool",
                "tool_call_id": "toolu_2",
                "content": [{"type": "text", "text": "14:05"}],
            },
            {"role": "user", "content": "Thanks. Summarise."},
        ],
        "tools": [WEATHER_TOOL, TIME_TOOL],
        "tool_choice": "auto",
    }
    request = to_messages_request(body, MODEL)
    assert request == {
        "model": MODEL,
        "max_tokens": 4096,
        "system": "You may call tools.",
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "Weather in Pune, and the time?"}],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Checking."},
                    {
                        "type": "tool_use",
                        "id": "toolu_1",
                        "name": "get_weather",
                        "input": {"city": "Pune"},
                    },
                    {"type": "tool_use", "id": "toolu_2", "name": "get_time", "input": {}},
                ],
            },
            {
                # Both tool results and the next user message: one user turn, results first.
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "31C, sunny"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_2",
                        "content": [{"type": "text", "text": "14:05"}],
                    },
                    {"type": "text", "text": "Thanks. Summarise."},
                ],
            },
        ],
        "tools": [
            {
                "name": "get_weather",
                "description": "Weather for a city",
                "input_schema": WEATHER_TOOL["function"]["parameters"],
            },
            {"name": "get_time", "input_schema": {"type": "object", "properties": {}}},
        ],
        "tool_choice": {"type": "auto"},
    }


def test_sampling_parameters_map_and_unsupported_ones_are_dropped() -> None:
    body = {
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 50,
        "max_completion_tokens": 70,
        "temperature": 0.2,
        "top_p": 0.9,
        "stop": "END",
        "user": "user-42",
        "seed": 7,
        "frequency_penalty": 0.5,
        "logit_bias": {"50256": -100},
        "stream_options": {"include_usage": True},
        "n": 1,
    }
    request = to_messages_request(body, MODEL)
    assert {k: v for k, v in request.items() if k != "messages"} == {
        "model": MODEL,
        "max_tokens": 70,  # max_completion_tokens wins, as in OpenAI
        "temperature": 0.2,
        "top_p": 0.9,
        "stop_sequences": ["END"],
        "metadata": {"user_id": "user-42"},
    }
    body.pop("max_completion_tokens")
    body["stop"] = ["a", "b"]
    request = to_messages_request(body, MODEL)
    assert (request["max_tokens"], request["stop_sequences"]) == (50, ["a", "b"])


@pytest.mark.parametrize(
    ("choice", "parallel", "expected"),
    [
        ("auto", None, {"type": "auto"}),
        ("required", None, {"type": "any"}),
        ("none", None, {"type": "none"}),
        (
            {"type": "function", "function": {"name": "get_time"}},
            None,
            {"type": "tool", "name": "get_time"},
        ),
        ("required", False, {"type": "any", "disable_parallel_tool_use": True}),
        (None, False, {"type": "auto", "disable_parallel_tool_use": True}),
        (None, None, None),
    ],
)
def test_tool_choice_maps_to_anthropic(choice: Any, parallel: Any, expected: Any) -> None:
    body: dict[str, Any] = {"messages": [{"role": "user", "content": "Hi"}], "tools": [TIME_TOOL]}
    if choice is not None:
        body["tool_choice"] = choice
    if parallel is not None:
        body["parallel_tool_calls"] = parallel
    assert to_messages_request(body, MODEL).get("tool_choice") == expected


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"n": 2}, "n"),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}
                ]
            },
            "messages[0].content[0]",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "image_url", "image_url": {"url": "data:image/png,raw"}}
                        ],
                    }
                ]
            },
            "messages[0].content[0].image_url",
        ),
        ({"messages": [{"role": "function", "name": "f", "content": "x"}]}, "messages[0].role"),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {"id": "t", "function": {"name": "f", "arguments": "{not json"}}
                        ],
                    }
                ]
            },
            "messages[0].tool_calls[0]",
        ),
        ({"tools": [{"type": "code_interpreter"}]}, "tools[0]"),
    ],
)
def test_requests_anthropic_cannot_express_are_rejected(change: dict[str, Any], param: str) -> None:
    body = {"messages": [{"role": "user", "content": "Hi"}], **change}
    with pytest.raises(InvalidRequestError) as caught:
        to_messages_request(body, MODEL)
    assert caught.value.status == 400
    assert caught.value.param == param


# ---------------------------------------------------------------- responses

TOOL_MESSAGE: dict[str, Any] = {
    "id": "msg_01",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-5-20250929",
    "content": [
        {"type": "thinking", "thinking": "The user wants weather.", "signature": "sig"},
        {"type": "text", "text": "Let me check."},
        {"type": "tool_use", "id": "toolu_a", "name": "get_weather", "input": {"city": "Pune"}},
        {"type": "tool_use", "id": "toolu_b", "name": "get_time", "input": {}},
    ],
    "stop_reason": "tool_use",
    "stop_sequence": None,
    "usage": {
        "input_tokens": 20,
        "cache_creation_input_tokens": 5,
        "cache_read_input_tokens": 100,
        "output_tokens": 30,
    },
}


def test_text_message_becomes_a_chat_completion() -> None:
    message = {
        "id": "msg_02",
        "type": "message",
        "role": "assistant",
        "model": MODEL,
        "content": [{"type": "text", "text": "Hello "}, {"type": "text", "text": "there."}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 9, "output_tokens": 3},
    }
    assert to_chat_completion(message, "claude", created=CREATED) == {
        "id": "msg_02",
        "object": "chat.completion",
        "created": CREATED,
        "model": "claude",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello there."},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12},
    }


def test_tool_use_message_becomes_tool_calls_with_json_arguments() -> None:
    completion = to_chat_completion(TOOL_MESSAGE, MODEL, created=CREATED)
    choice = completion["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "Let me check."  # thinking is not content
    assert choice["message"]["tool_calls"] == [
        {
            "id": "toolu_a",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city":"Pune"}'},
        },
        {"id": "toolu_b", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
    ]
    # Cached prompt tokens still count as prompt tokens, as in OpenAI; cache writes are
    # kept apart too (billed above the input price).
    assert completion["usage"] == {
        "prompt_tokens": 125,
        "completion_tokens": 30,
        "total_tokens": 155,
        "prompt_tokens_details": {"cached_tokens": 100, "cache_creation_tokens": 5},
    }


@pytest.mark.parametrize(
    ("stop_reason", "finish"),
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("max_tokens", "length"),
        ("tool_use", "tool_calls"),
        ("refusal", "content_filter"),
    ],
)
def test_stop_reasons_map_to_finish_reasons(stop_reason: str, finish: str) -> None:
    message = {**TOOL_MESSAGE, "stop_reason": stop_reason}
    assert to_chat_completion(message, MODEL)["choices"][0]["finish_reason"] == finish


# ---------------------------------------------------------------- streams


def _delta(index: int, **delta: Any) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": delta}


# The shape Anthropic streams for TOOL_MESSAGE (extended thinking, text, two tools).
TOOL_EVENTS: list[dict[str, Any]] = [
    {
        "type": "message_start",
        "message": {
            **TOOL_MESSAGE,
            "content": [],
            "stop_reason": None,
            "usage": {**TOOL_MESSAGE["usage"], "output_tokens": 1},
        },
    },
    {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "thinking", "thinking": ""},
    },
    _delta(0, type="thinking_delta", thinking="The user wants weather."),
    _delta(0, type="signature_delta", signature="sig"),
    {"type": "content_block_stop", "index": 0},
    {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
    {"type": "ping"},
    _delta(1, type="text_delta", text="Let me"),
    _delta(1, type="text_delta", text=" check."),
    {"type": "content_block_stop", "index": 1},
    {
        "type": "content_block_start",
        "index": 2,
        "content_block": {"type": "tool_use", "id": "toolu_a", "name": "get_weather", "input": {}},
    },
    _delta(2, type="input_json_delta", partial_json=""),
    _delta(2, type="input_json_delta", partial_json='{"city": "P'),
    _delta(2, type="input_json_delta", partial_json='une"}'),
    {"type": "content_block_stop", "index": 2},
    {
        "type": "content_block_start",
        "index": 3,
        "content_block": {"type": "tool_use", "id": "toolu_b", "name": "get_time", "input": {}},
    },
    {"type": "content_block_stop", "index": 3},  # no parameters: no input deltas at all
    {
        "type": "message_delta",
        "delta": {"stop_reason": "tool_use", "stop_sequence": None},
        "usage": {"output_tokens": 30},
    },
    {"type": "message_stop"},
]


def _parsed_arguments(completion: dict[str, Any]) -> dict[str, Any]:
    """The completion with tool arguments parsed: Anthropic's partial_json spacing is its own."""
    result = copy.deepcopy(completion)
    for choice in result["choices"]:
        for call in choice["message"].get("tool_calls") or ():
            call["function"]["arguments"] = orjson.loads(call["function"]["arguments"])
    return result


def test_stream_events_assemble_to_the_non_stream_translation() -> None:
    translator = StreamTranslator(MODEL, created=CREATED)
    assembler = StreamAssembler()
    chunks: list[dict[str, Any]] = []
    for event in TOOL_EVENTS:
        assert not translator.done
        chunks += translator.feed(event)
    assert translator.done
    for chunk in chunks:
        assembler.add(chunk)
    assembler.finish()
    assert assembler.complete
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 30
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    tool_starts = [
        call
        for chunk in chunks
        for choice in chunk["choices"]
        for call in choice["delta"].get("tool_calls", ())
        if "id" in call
    ]
    assert [(c["index"], c["id"], c["function"]["name"]) for c in tool_starts] == [
        (0, "toolu_a", "get_weather"),
        (1, "toolu_b", "get_time"),
    ]
    expected = to_chat_completion(TOOL_MESSAGE, MODEL, created=CREATED)
    assert _parsed_arguments(assembler.completion()) == _parsed_arguments(expected)


def test_usage_chunk_is_emitted_only_at_message_stop() -> None:
    translator = StreamTranslator(MODEL, created=CREATED)
    emitted = [chunk for event in TOOL_EVENTS[:-1] for chunk in translator.feed(event)]
    assert not translator.done
    assert all(chunk["choices"] for chunk in emitted)
    assert all(c["finish_reason"] is None for chunk in emitted for c in chunk["choices"])


def test_error_event_raises_upstream_error() -> None:
    translator = StreamTranslator(MODEL)
    translator.feed(TOOL_EVENTS[0])
    with pytest.raises(UpstreamError) as caught:
        translator.feed({"type": "error", "error": {"type": "api_error", "message": "boom"}})
    assert caught.value.status == 502 and "boom" in caught.value.message
    with pytest.raises(UpstreamUnavailableError):
        StreamTranslator(MODEL).feed(
            {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
        )


def test_delta_for_a_block_that_never_started_is_malformed() -> None:
    translator = StreamTranslator(MODEL)
    translator.feed(TOOL_EVENTS[0])
    with pytest.raises(UpstreamError) as caught:
        translator.feed(_delta(4, type="text_delta", text="x"))
    assert caught.value.code == "upstream_malformed"
    with pytest.raises(UpstreamError):
        StreamTranslator(MODEL).feed(_delta(0, type="text_delta", text="x"))


# ---------------------------------------------------------------- over real HTTP


class Timeouts(TypedDict, total=False):
    """The timeouts of a ``ProviderSpec`` a test may shorten."""

    connect_timeout: float
    first_byte_timeout: float
    total_timeout: float
    first_token_timeout: float | None


class ProviderFactory(Protocol):
    def __call__(
        self, base_url: str, api_key: str = ..., **timeouts: Unpack[Timeouts]
    ) -> AnthropicProvider: ...


@pytest.fixture
async def make_provider() -> AsyncIterator[ProviderFactory]:
    made: list[AnthropicProvider] = []

    def make(
        base_url: str, api_key: str = "test-key", **timeouts: Unpack[Timeouts]
    ) -> AnthropicProvider:
        spec = ProviderSpec(
            name="anthropic", kind="anthropic", base_url=base_url, api_key=api_key, **timeouts
        )
        made.append(AnthropicProvider(spec))
        return made[-1]

    yield make
    for provider in made:
        await provider.aclose()


@pytest.fixture
def anthropic(provider: ProviderServer, make_provider: ProviderFactory) -> AnthropicProvider:
    # Short silences are failures here, so stall faults resolve in a fraction of a second.
    return make_provider(provider.url, first_byte_timeout=0.3)


CHAT = {
    "model": "claude",
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Name a prime number."},
    ],
}
TOOL_CHAT = {
    "model": "claude",
    "messages": [{"role": "user", "content": "Weather in Pune?"}],
    "tools": [WEATHER_TOOL],
    "tool_choice": "required",
}


async def _drain(events: AsyncIterator[bytes]) -> tuple[list[bytes], PrismError | None]:
    """Every SSE payload until the stream ends or fails, and the failure."""
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
        if data in (b"[DONE]", "[DONE]"):  # SSEDecoder yields bytes (str before)
            assembler.finish()
        else:
            assembler.add(orjson.loads(data))
    return assembler


@pytest.mark.parametrize("body", [CHAT, TOOL_CHAT], ids=["text", "tool_call"])
async def test_stream_and_non_stream_give_the_same_completion(
    anthropic: AnthropicProvider, provider: ProviderServer, body: dict[str, Any]
) -> None:
    result = await anthropic.complete(body, MODEL)
    stream = await anthropic.stream(body, MODEL)
    raw, error = await _drain(stream.events)
    assert error is None
    assert raw[-1] == b"data: [DONE]\n\n"
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


async def test_requests_go_out_in_anthropic_format(
    anthropic: AnthropicProvider, provider: ProviderServer
) -> None:
    await anthropic.complete({**CHAT, "user": "u-1", "seed": 3}, MODEL)
    (sent,) = provider.control.requests()
    assert sent["path"] == "/v1/messages"
    assert sent["headers"]["x-api-key"] == "test-key"
    assert sent["headers"]["anthropic-version"] == "2023-06-01"
    assert "authorization" not in sent["headers"]
    assert sent["body"] == {
        "model": MODEL,
        "max_tokens": 4096,
        "system": "Be brief.",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Name a prime number."}]}
        ],
        "metadata": {"user_id": "u-1"},
    }


async def test_unsupported_request_fails_before_any_upstream_call(
    anthropic: AnthropicProvider, provider: ProviderServer
) -> None:
    with pytest.raises(InvalidRequestError):
        await anthropic.complete({**CHAT, "n": 3}, MODEL)
    with pytest.raises(InvalidRequestError):
        await anthropic.stream({**CHAT, "n": 3}, MODEL)
    assert provider.control.stats()["chat_requests"] == 0


@pytest.mark.parametrize(
    ("fault", "error_type", "status", "code"),
    [
        ({"mode": "status", "status": 500}, UpstreamError, 502, "bad_gateway"),
        ({"mode": "status", "status": 529}, UpstreamUnavailableError, 503, "upstream_unavailable"),
        ({"mode": "status", "status": 400}, InvalidRequestError, 400, "invalid_request"),
        ({"mode": "rate_limit", "retry_after": 7}, RateLimitError, 429, "upstream_rate_limited"),
        (
            {"mode": "stall_before_first_byte", "seconds": 1.0},
            UpstreamTimeoutError,
            504,
            "upstream_timeout",
        ),
        ({"mode": "malformed_json"}, UpstreamError, 502, "upstream_malformed"),
    ],
    ids=["500", "529", "400", "429", "stall", "malformed"],
)
@pytest.mark.parametrize("streaming", [False, True], ids=["complete", "stream"])
async def test_upstream_faults_become_the_matching_prism_error(
    anthropic: AnthropicProvider,
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
            # Any failure may surface at the start or mid-stream; either way no [DONE].
            stream = await anthropic.stream(CHAT, MODEL)
            received, error = await _drain(stream.events)
            if error is not None:
                raise error
        else:
            await anthropic.complete(CHAT, MODEL)
    assert (caught.value.status, caught.value.code) == (status, code)
    assert b"data: [DONE]\n\n" not in received
    if fault["mode"] == "rate_limit":
        assert caught.value.headers == {"retry-after": "7", "retry-after-ms": "7000"}


class _CountingConnector(aiohttp.TCPConnector):
    """A real connector that counts the TCP connections it opens."""

    def __init__(self) -> None:
        super().__init__()
        self.connections = 0

    async def _create_connection(self, *args: Any, **kwargs: Any) -> Any:
        self.connections += 1
        return await super()._create_connection(*args, **kwargs)


async def test_finished_streams_leave_the_connection_for_reuse(provider: ProviderServer) -> None:
    counter = _CountingConnector()
    spec = ProviderSpec(name="anthropic", kind="anthropic", base_url=provider.url, api_key="k")
    anthropic = AnthropicProvider(spec, UpstreamHTTP(spec, lambda _spec: counter))
    try:
        for _ in range(3):
            stream = await anthropic.stream(CHAT, MODEL)
            raw, error = await _drain(stream.events)
            assert error is None and raw[-1] == b"data: [DONE]\n\n"
        await anthropic.complete(CHAT, MODEL)
    finally:
        await anthropic.aclose()
    assert counter.connections == 1


async def test_truncated_stream_raises_and_never_sends_done(
    anthropic: AnthropicProvider, provider: ProviderServer
) -> None:
    provider.control.set_fault("truncated_stream", after_chunks=4)
    stream = await anthropic.stream(CHAT, MODEL)
    raw, error = await _drain(stream.events)
    assert isinstance(error, UpstreamError)
    assert (error.status, error.code) == (502, "upstream_truncated")
    assert raw, "the chunks before the cut are passed on"
    assert all(b"[DONE]" not in chunk for chunk in raw)
    assert not _assemble(raw).complete


async def test_truncated_json_body_is_a_bad_gateway(
    anthropic: AnthropicProvider, provider: ProviderServer
) -> None:
    provider.control.set_fault("truncated_stream")
    with pytest.raises(UpstreamError) as caught:
        await anthropic.complete(CHAT, MODEL)
    assert (caught.value.status, caught.value.code) == (502, "upstream_malformed")


async def test_stall_mid_stream_times_out_without_done(
    anthropic: AnthropicProvider, provider: ProviderServer
) -> None:
    provider.control.set_fault("stall_mid_stream", after_chunks=4, seconds=1.0)
    stream = await anthropic.stream(CHAT, MODEL)
    raw, error = await _drain(stream.events)
    assert isinstance(error, UpstreamTimeoutError)
    assert error.status == 504
    assert len(raw) == 2  # the role chunk and the first text delta
    assert all(b"[DONE]" not in chunk for chunk in raw)


async def test_closed_port_is_upstream_unreachable(
    make_provider: ProviderFactory, closed_provider_url: str
) -> None:
    anthropic = make_provider(closed_provider_url)
    for attempt in (anthropic.complete, anthropic.stream):
        with pytest.raises(UpstreamError) as caught:
            await attempt(CHAT, MODEL)
        assert (caught.value.status, caught.value.code) == (502, "upstream_unreachable")


async def test_wrong_gateway_key_is_an_upstream_auth_failure(
    make_provider: ProviderFactory, provider_factory: Callable[[ProviderSettings], ProviderServer]
) -> None:
    server = provider_factory(ProviderSettings(api_key="sk-ant-right"))
    with pytest.raises(UpstreamError) as caught:
        await make_provider(server.url, api_key="sk-ant-wrong").complete(CHAT, MODEL)
    assert (caught.value.status, caught.value.code) == (502, "upstream_auth_failed")
    assert "sk-ant" not in caught.value.message
    result = await make_provider(server.url, api_key="sk-ant-right").complete(CHAT, MODEL)
    assert result.completion["choices"][0]["finish_reason"] == "stop"


async def test_error_event_right_after_200_fails_the_stream_start() -> None:
    # The local provider cannot inject an in-stream error event; a tiny real server can.
    overloaded = (
        b"event: error\n"
        b'data: {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}\n\n'
    )

    async def messages(request: Request) -> Response:
        return Response(overloaded, 200, media_type="text/event-stream")

    app = Starlette(routes=[Route("/v1/messages", messages, methods=["POST"])])
    with ThreadedServer(app, lifespan="off") as server:
        spec = ProviderSpec(name="anthropic", kind="anthropic", base_url=server.url, api_key="k")
        anthropic = AnthropicProvider(spec)
        try:
            with pytest.raises(UpstreamUnavailableError) as caught:
                await anthropic.stream(CHAT, MODEL)
            assert caught.value.status == 503
        finally:
            await anthropic.aclose()


async def test_closing_an_unread_stream_releases_the_upstream_response(
    anthropic: AnthropicProvider, provider: ProviderServer
) -> None:
    provider.control.set_fault("stall_mid_stream", after_chunks=2, seconds=10)
    stream = await anthropic.stream(CHAT, MODEL)
    assert provider.control.stats()["open_streams"] == 1
    await stream.aclose()  # e.g. the hedged request that lost, before reading on
    await asyncio.to_thread(wait_for, lambda: provider.control.stats()["open_streams"] == 0, 5.0)


@pytest.mark.parametrize(
    ("status", "message", "error_type", "kind", "code"),
    [
        (
            400,
            "prompt is too long: 210000 tokens > 200000 maximum",
            InvalidRequestError,
            "invalid_request_error",
            "context_length_exceeded",
        ),
        (
            400,
            "max_tokens: must be positive",
            InvalidRequestError,
            "invalid_request_error",
            "invalid_request",
        ),
        (404, "model: claude-9", NotFoundError, "not_found_error", "not_found"),
        (
            413,
            "Request exceeds the maximum size",
            RequestTooLargeError,
            "invalid_request_error",
            "request_too_large",
        ),
    ],
    ids=["context", "400", "404", "413"],
)
async def test_anthropic_errors_keep_their_meaning_in_openai_terms(
    anthropic: AnthropicProvider,
    provider: ProviderServer,
    status: int,
    message: str,
    error_type: type[PrismError],
    kind: str,
    code: str,
) -> None:
    provider.control.set_fault("status", status=status, message=message)
    with pytest.raises(error_type) as caught:
        await anthropic.complete(CHAT, MODEL)
    error = caught.value
    assert (error.status, error.type, error.code) == (status, kind, code)
    assert message in error.message and "test-key" not in error.message


# ---------------------------------------------------------------- the model list


async def test_models_reads_every_page_and_a_failure_is_its_prism_error(
    anthropic: AnthropicProvider, provider: ProviderServer
) -> None:
    models = await anthropic.models()
    assert [m.id for m in models] == list(ANTHROPIC_MODELS)
    for model, (_, created_at) in zip(models, ANTHROPIC_MODELS.values(), strict=True):
        assert model.created == int(datetime.fromisoformat(created_at).timestamp())
        assert model.owned_by is None  # Anthropic names no owner
    # Five models in pages of at most three, asked with limit=1000, then after_id.
    assert provider.control.stats()["model_lists"] == {"anthropic": 2}
    provider.control.set_fault("status", status=529, endpoint="models")
    with pytest.raises(UpstreamUnavailableError):
        await anthropic.models()
    provider.control.set_fault("malformed_json", endpoint="models")
    with pytest.raises(UpstreamError) as raised:
        await anthropic.models()
    assert raised.value.code == "upstream_malformed"


WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "celsius": {"type": "integer"}},
    "required": ["city", "celsius"],
}
STRUCTURED_CHAT: dict[str, Any] = {
    "messages": [{"role": "user", "content": "Weather in Lima as JSON"}],
    "response_format": {
        "type": "json_schema",
        "json_schema": {"name": "Weather", "schema": WEATHER_SCHEMA, "strict": True},
    },
}


def test_a_json_schema_response_format_becomes_the_one_tool_anthropic_must_call() -> None:
    request = to_messages_request(STRUCTURED_CHAT, MODEL)
    (tool,) = request["tools"]
    assert tool["name"] == "prism_structured_output" and tool["input_schema"] == WEATHER_SCHEMA
    assert request["tool_choice"] == {"type": "tool", "name": "prism_structured_output"}
    any_json = {**STRUCTURED_CHAT, "response_format": {"type": "json_object"}}
    assert to_messages_request(any_json, MODEL)["tools"][0]["input_schema"] == {"type": "object"}
    # Beside the caller's own tools it cannot be asked: dropped, as before.
    with_tools = {**STRUCTURED_CHAT, "tools": [TIME_TOOL]}
    assert [t["name"] for t in to_messages_request(with_tools, MODEL)["tools"]] == ["get_time"]
    assert "tools" not in to_messages_request({**STRUCTURED_CHAT, "response_format": None}, MODEL)


def test_the_structured_tools_input_is_the_answers_json_text_streamed_or_not() -> None:
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "toolu_1", "name": "prism_structured_output",
                     "input": {"city": "Lima", "celsius": 19}}],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 5, "output_tokens": 9},
    }  # fmt: skip
    completion = to_chat_completion(message, MODEL, created=CREATED, structured=True)
    choice = completion["choices"][0]
    assert orjson.loads(choice["message"]["content"]) == {"city": "Lima", "celsius": 19}
    assert "tool_calls" not in choice["message"] and choice["finish_reason"] == "stop"
    # Not asked for JSON: the same block stays a tool call.
    plain = to_chat_completion(message, MODEL, created=CREATED)
    assert plain["choices"][0]["finish_reason"] == "tool_calls"
    events: list[dict[str, Any]] = [
        {"type": "message_start", "message": {**message, "content": [], "stop_reason": None}},
        {"type": "content_block_start", "index": 0,
         "content_block": {"type": "tool_use", "id": "toolu_1", "name": "prism_structured_output",
                           "input": {}}},
        _delta(0, type="input_json_delta", partial_json=""),
        _delta(0, type="input_json_delta", partial_json='{"city": "Lima", '),
        _delta(0, type="input_json_delta", partial_json='"celsius": 19}'),
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "tool_use"},
         "usage": {"output_tokens": 9}},
        {"type": "message_stop"},
    ]  # fmt: skip
    translator = StreamTranslator(MODEL, created=CREATED, structured=True)
    assembler = StreamAssembler()
    for event in events:
        for chunk in translator.feed(event):
            assembler.add(chunk)
    assembler.finish()
    streamed = assembler.completion()["choices"][0]
    assert orjson.loads(streamed["message"]["content"]) == {"city": "Lima", "celsius": 19}
    assert streamed["finish_reason"] == "stop" and not streamed["message"].get("tool_calls")


async def test_a_structured_answer_from_the_stand_in_fits_its_schema_streamed_or_not(
    anthropic: AnthropicProvider, provider: ProviderServer
) -> None:
    result = await anthropic.complete(STRUCTURED_CHAT, MODEL)
    answer = orjson.loads(result.completion["choices"][0]["message"]["content"])
    assert set(answer) == {"city", "celsius"} and isinstance(answer["celsius"], int)
    sent = provider.control.requests()[-1]["body"]
    assert sent["tool_choice"] == {"type": "tool", "name": "prism_structured_output"}
    stream = await anthropic.stream(STRUCTURED_CHAT, MODEL)
    raw, error = await _drain(stream.events)
    assert error is None
    assert _assemble(raw).completion()["choices"] == result.completion["choices"]
