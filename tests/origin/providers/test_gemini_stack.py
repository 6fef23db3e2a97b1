"""A Gemini target through the real origin (real HTTP, real Redis) with the official SDKs:
the openai SDK's chat (plain, streamed, tools and the call loop), the anthropic SDK's
Messages, repeats answered from the cache, and Gemini's faults routed to the next target."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import openai
import orjson
import pytest
from anthropic.types import Message
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from deploy.local.asgi_thread import ThreadedServer
from deploy.local.provider import ProviderServer, ProviderSettings
from tests.fixtures.origin import OriginFactory, RunningOrigin

MODEL = "gemini-3-flash"  # Gemini 3: a replayed call must carry a thought signature
WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def providers_file(folder: Path, gemini: ProviderServer, backup: ProviderServer) -> Path:
    """``gemini-*`` to ``gemini`` (kind gemini), then to ``backup`` (OpenAI-compatible)."""
    path = folder / "providers.toml"
    path.write_text(
        f"""
[providers.gemini]
kind = "gemini"
base_url = "{gemini.url}"
api_key = "gemini-test-key"
label = "gemini"
first_byte_timeout = 1.0
hedge = false

[providers.backup]
base_url = "{backup.url}/v1"
api_key = "provider-test-key"
label = "backup"

[models]
"gemini-*" = ["gemini", "backup"]
"""
    )
    return path


@pytest.fixture
def backup(provider_factory: Callable[[ProviderSettings], ProviderServer]) -> ProviderServer:
    return provider_factory(ProviderSettings())


@pytest.fixture
def origin(
    origin_factory: OriginFactory, provider: ProviderServer, backup: ProviderServer, tmp_path: Path
) -> RunningOrigin:
    return origin_factory(PRISM_PROVIDERS_FILE=str(providers_file(tmp_path, provider, backup)))


def chat(origin: RunningOrigin, api_key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=origin.url + "/v1", api_key=api_key, max_retries=0)


def question(text: str = "tell me about prisms") -> list[Any]:
    return [{"role": "user", "content": f"{text} {secrets.token_hex(4)}"}]


def generate_calls(provider: ProviderServer) -> int:
    paths: dict[str, int] = provider.control.stats()["paths"]
    return sum(n for path, n in paths.items() if path.startswith("/v1beta/models/"))


def test_chat_misses_then_hits_plain_and_streamed(
    origin: RunningOrigin, api_key: str, provider: ProviderServer
) -> None:
    client = chat(origin, api_key)
    messages = question()
    first = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, temperature=0
    )
    answer = first.parse()
    assert first.headers["x-prism-edge-cache-layer"] == "miss"
    assert first.headers["x-prism-provider"] == "gemini"
    text = answer.choices[0].message.content
    assert text is not None and text.startswith("Echo: tell me about prisms")
    assert answer.choices[0].finish_reason == "stop"
    assert answer.usage is not None and answer.usage.prompt_tokens > 0
    origin.wait_stored()
    again = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, temperature=0
    )
    assert again.headers["x-prism-edge-cache-layer"] == "redis"
    assert again.parse().choices[0].message.content == text
    # streamed: a new question misses, its pieces make the same answer, then it hits
    streamed = question("stream it")
    with client.chat.completions.with_streaming_response.create(
        model=MODEL, messages=streamed, temperature=0, stream=True,
        stream_options={"include_usage": True},
    ) as response:  # fmt: skip
        assert response.headers["x-prism-edge-cache-layer"] == "miss"
        chunks = list(response.parse())
    pieces = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert pieces.startswith("Echo: stream it")
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    origin.wait_stored()
    hit = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=streamed, temperature=0
    )
    assert hit.headers["x-prism-edge-cache-layer"] == "redis"
    assert hit.parse().choices[0].message.content == pieces
    assert generate_calls(provider) == 2


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_a_tool_call_and_its_result_make_a_round_trip(
    origin: RunningOrigin, api_key: str, provider: ProviderServer, stream: bool
) -> None:
    client = chat(origin, api_key)
    messages = question("weather in Pune")
    if stream:
        chunks = list(
            client.chat.completions.create(
                model=MODEL, messages=messages, tools=[WEATHER], tool_choice="required",
                stream=True,
            )
        )  # fmt: skip
        calls = [
            c for chunk in chunks if chunk.choices for c in chunk.choices[0].delta.tool_calls or []
        ]
        assert calls and calls[0].function is not None and calls[0].id is not None
        call_id, name = calls[0].id, calls[0].function.name
        arguments = "".join(c.function.arguments or "" for c in calls if c.function)
        assert chunks[-1].choices[0].finish_reason == "tool_calls"
    else:
        answer = client.chat.completions.create(
            model=MODEL, messages=messages, tools=[WEATHER], tool_choice="required"
        )
        assert answer.choices[0].finish_reason == "tool_calls"
        (call,) = answer.choices[0].message.tool_calls or []
        assert call.type == "function"
        call_id, name, arguments = call.id, call.function.name, call.function.arguments
    assert name == "get_weather" and '"city"' in arguments
    follow_up = [
        *messages,
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        ]},
        {"role": "tool", "tool_call_id": call_id, "content": "31C and sunny"},
    ]  # fmt: skip
    final = client.chat.completions.create(model=MODEL, messages=follow_up, tools=[WEATHER])
    assert final.choices[0].finish_reason == "stop"
    assert final.choices[0].message.content is not None
    contents = provider.control.requests()[-1]["body"]["contents"]
    assert [c["role"] for c in contents] == ["user", "model", "user"]
    assert contents[2]["parts"][0]["functionResponse"] == {
        "name": "get_weather",
        "response": {"output": "31C and sunny"},
    }


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_the_anthropic_sdk_gets_messages_from_gemini(
    origin: RunningOrigin, api_key: str, provider: ProviderServer, stream: bool
) -> None:
    client = anthropic.Anthropic(base_url=origin.url, api_key=api_key, max_retries=0)
    messages = question("messages to gemini")
    final: Message
    if stream:
        with client.messages.stream(model=MODEL, max_tokens=64, messages=messages) as events:
            assert events.response.headers["x-prism-provider"] == "gemini"
            text = "".join(events.text_stream)
            final = events.get_final_message()
    else:
        raw = client.messages.with_raw_response.create(
            model=MODEL, max_tokens=64, messages=messages, system="Be brief."
        )
        assert raw.headers["x-prism-provider"] == "gemini"
        final = raw.parse()
        block = final.content[0]
        assert block.type == "text"
        text = block.text
    assert text.startswith("Echo: messages to gemini")
    assert final.stop_reason == "end_turn" and final.usage.output_tokens > 0
    sent = provider.control.requests()[-1]
    assert sent["path"].startswith(f"/v1beta/models/{MODEL}:")
    assert sent["body"]["generationConfig"]["maxOutputTokens"] == 64


@pytest.mark.parametrize(
    ("fault", "stream"),
    [
        ({"mode": "rate_limit", "retry_after": 30}, False),
        ({"mode": "status", "status": 503, "count": 2}, False),
        ({"mode": "status", "status": 500, "count": 2}, True),
        # a server error (a cut or an error event too) is tried once more on its provider
        ({"mode": "truncated_stream", "after_chunks": 0, "abort": 1, "count": 2}, True),
        ({"mode": "error_event", "count": 2}, True),
        ({"mode": "stall_before_first_byte", "seconds": 5}, True),
    ],
    ids=["429", "503", "500-stream", "cut-stream", "error-event", "stall"],
)
def test_gemini_faults_are_routed_to_the_next_target(
    origin: RunningOrigin,
    api_key: str,
    provider: ProviderServer,
    backup: ProviderServer,
    fault: dict[str, Any],
    stream: bool,
) -> None:
    provider.control.set_fault(**fault)
    client = chat(origin, api_key)
    messages = question("fault")
    if stream:
        with client.chat.completions.with_streaming_response.create(
            model=MODEL, messages=messages, stream=True
        ) as response:
            assert response.headers["x-prism-provider"] == "backup"
            text = "".join(c.choices[0].delta.content or "" for c in response.parse() if c.choices)
    else:
        raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=messages)
        assert raw.headers["x-prism-provider"] == "backup"
        text = raw.parse().choices[0].message.content or ""
    assert text.startswith("Echo: fault")
    assert backup.control.stats()["chat_requests"] == 1
    provider.control.release()


def test_a_blocked_prompt_is_a_content_policy_error_and_not_stored(
    origin_factory: OriginFactory, api_key: str, tmp_path: Path
) -> None:
    blocked = orjson.dumps({"promptFeedback": {"blockReason": "PROHIBITED_CONTENT"}})

    async def answer(request: Request) -> Response:
        return Response(blocked, 200, media_type="application/json")

    app = Starlette(routes=[Route("/v1beta/models/{target}", answer, methods=["POST"])])
    with ThreadedServer(app, lifespan="off") as server:
        path = tmp_path / "providers.toml"
        path.write_text(
            f'[providers.g]\nkind = "gemini"\nbase_url = "{server.url}"\napi_key = "k"\n'
            '[models]\n"gemini-*" = ["g"]\n'
        )
        origin = origin_factory(PRISM_PROVIDERS_FILE=str(path))
        client, messages = chat(origin, api_key), question("blocked")
        for _ in range(2):  # asked again: not served from the cache
            with pytest.raises(openai.BadRequestError) as caught:
                client.chat.completions.create(model=MODEL, messages=messages, temperature=0)
            origin.wait_stored()
            assert caught.value.code == "content_policy_violation"
            assert "PROHIBITED_CONTENT" in caught.value.message


def test_embeddings_from_gemini_then_from_the_cache(
    origin: RunningOrigin, api_key: str, provider: ProviderServer
) -> None:
    client = chat(origin, api_key)
    texts = [f"embed me {secrets.token_hex(4)}", "and me"]
    first = client.embeddings.with_raw_response.create(
        model="gemini-embedding-001", input=texts, dimensions=8
    )
    assert first.headers["x-prism-edge-cache-layer"] == "miss"
    vectors = [d.embedding for d in first.parse().data]
    assert len(vectors) == 2 and all(len(v) == 8 for v in vectors)
    origin.wait_stored()
    again = client.embeddings.with_raw_response.create(
        model="gemini-embedding-001", input=texts, dimensions=8
    )
    assert again.headers["x-prism-edge-cache-layer"] == "redis"
    assert [d.embedding for d in again.parse().data] == vectors
    paths: dict[str, int] = provider.control.stats()["paths"]
    assert paths == {"/v1beta/models/gemini-embedding-001:batchEmbedContents": 1}
