"""Azure OpenAI through the real origin: the openai SDK (chat, streamed and not, tools,
embeddings) and the anthropic SDK (Messages) against the local provider's Azure; repeats
are cache hits; the content filter's refusals are errors never stored; a 429, a 5xx, a
stream cut and a stall are routed to the other Azure target."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from anthropic.types import TextBlock
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam

from deploy.local.provider import ProviderServer
from deploy.local.provider_azure import FILTER_ANSWER, FILTER_PROMPT
from tests.fixtures.origin import OriginFactory, RunningOrigin

MODEL = "azure-mini"
WEATHER: ChatCompletionToolParam = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def azure_providers(primary: ProviderServer, backup: ProviderServer, folder: Path) -> Path:
    """``azure-mini`` to a deployment on ``primary`` (the deployments form, its api-key; no
    retries), then on ``backup`` (the v1 form, an Entra ID token); ``azure-embed`` to an embedding
    deployment."""
    config = folder / "providers.toml"
    config.write_text(
        f"""
[providers.azure]
kind = "azure"
base_url = "{primary.url}"
api_key = "provider-test-key"
label = "azure primary"
first_byte_timeout = 1.0
retries = 0  # every failure goes to the backup at once
deployments = {{ "gpt-4o-mini" = "gpt-4o-mini", "embed" = "text-embedding-3-small" }}

[providers.backup]
kind = "azure"
base_url = "{backup.url}"
api_key = "entra-id-test-token"
label = "azure backup"
api_version = "v1"
auth = "entra-id"

[models]
"{MODEL}" = {{ targets = ["azure:gpt-4o-mini", "backup:gpt-4o-mini"], hedge = false }}
"azure-embed" = ["azure:embed"]
"""
    )
    return config


@pytest.fixture
def origin(
    origin_factory: OriginFactory,
    provider: ProviderServer,
    secondary_provider: ProviderServer,
    tmp_path: Path,
) -> RunningOrigin:
    config = azure_providers(provider, secondary_provider, tmp_path)
    return origin_factory(PRISM_PROVIDERS_FILE=str(config))


@pytest.fixture
def client(origin: RunningOrigin, api_key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=origin.url + "/v1", api_key=api_key, max_retries=0)


def question(text: str = "tell me about prisms") -> list[ChatCompletionMessageParam]:
    return [{"role": "user", "content": f"{text} {secrets.token_hex(4)}"}]


def chat_requests(provider: ProviderServer) -> int:
    count: int = provider.control.stats()["chat_requests"]
    return count


def test_a_miss_then_a_redis_hit_of_openais_answer(
    client: openai.OpenAI, origin: RunningOrigin, provider: ProviderServer
) -> None:
    messages = question()
    first = client.chat.completions.with_raw_response.create(model=MODEL, messages=messages)
    origin.wait_stored()
    second = client.chat.completions.with_raw_response.create(model=MODEL, messages=messages)
    assert first.headers["x-prism-edge-cache-layer"] == "miss"
    assert first.headers["x-prism-provider"] == "azure primary"
    assert second.headers["x-prism-edge-cache-layer"] == "redis"
    answer = first.parse()
    assert answer.choices[0].message.content == second.parse().choices[0].message.content
    assert (answer.choices[0].message.content or "").startswith("Echo: tell me about prisms")
    assert "prompt_filter_results" not in (answer.model_extra or {})
    assert "content_filter_results" not in (answer.choices[0].model_extra or {})
    (sent,) = provider.control.requests()
    assert sent["path"] == "/openai/deployments/gpt-4o-mini/chat/completions"
    assert sent["headers"]["api-key"] == "provider-test-key"
    assert chat_requests(provider) == 1


def test_a_streamed_miss_then_stream_and_json_hits(
    client: openai.OpenAI, origin: RunningOrigin, provider: ProviderServer
) -> None:
    messages = question("stream me")
    with client.chat.completions.with_streaming_response.create(
        model=MODEL, messages=messages, stream=True
    ) as response:
        assert response.headers["x-prism-edge-cache-layer"] == "miss"
        chunks = list(response.parse())
    # Azure's first chunk (the prompt's results, empty id) and its annotations never reach here.
    assert all(chunk.id and chunk.choices for chunk in chunks)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks)
    assert text.startswith("Echo: stream me")
    origin.wait_stored()
    with client.chat.completions.with_streaming_response.create(
        model=MODEL, messages=messages, stream=True
    ) as response:
        assert response.headers["x-prism-edge-cache-layer"] == "redis"
        replayed = "".join(c.choices[0].delta.content or "" for c in response.parse() if c.choices)
    plain = client.chat.completions.with_raw_response.create(model=MODEL, messages=messages)
    assert plain.headers["x-prism-edge-cache-layer"] == "redis"
    assert replayed == plain.parse().choices[0].message.content == text
    assert plain.parse().id == chunks[0].id
    assert chat_requests(provider) == 1


@pytest.mark.parametrize("stream", [False, True])
def test_tool_calls_plain_and_streamed(client: openai.OpenAI, stream: bool) -> None:
    messages = question("weather in Pune")
    if stream:
        chunks = list(
            client.chat.completions.create(
                model=MODEL, messages=messages, tools=[WEATHER], tool_choice="required", stream=True
            )
        )
        calls = [c.choices[0].delta.tool_calls for c in chunks if c.choices]
        named = [call[0].function for call in calls if call and call[0].function]
        assert named[0].name == "get_weather"
        arguments = "".join(f.arguments or "" for f in named)
        assert arguments.startswith('{"city":')
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    else:
        answer = client.chat.completions.create(
            model=MODEL, messages=messages, tools=[WEATHER], tool_choice="required"
        )
        tool_calls = answer.choices[0].message.tool_calls
        assert tool_calls and tool_calls[0].type == "function"
        assert tool_calls[0].function.name == "get_weather"
        assert answer.choices[0].finish_reason == "tool_calls"


def test_anthropic_messages_translated_then_a_hit(
    origin: RunningOrigin, api_key: str, provider: ProviderServer
) -> None:
    sdk = anthropic.Anthropic(base_url=origin.url, api_key=api_key, max_retries=0)
    messages: Any = question("messages to azure")
    first = sdk.messages.with_raw_response.create(model=MODEL, max_tokens=32, messages=messages)
    message = first.parse()
    block = message.content[0]
    assert isinstance(block, TextBlock) and block.text.startswith("Echo: messages to azure")
    assert message.stop_reason == "end_turn" and message.usage.output_tokens > 0
    origin.wait_stored()
    with sdk.messages.stream(model=MODEL, max_tokens=32, messages=messages) as stream:
        assert stream.response.headers["x-prism-edge-cache-layer"] == "redis"
        assert "".join(stream.text_stream) == block.text
    assert provider.control.requests()[0]["path"].startswith("/openai/deployments/gpt-4o-mini/")
    assert chat_requests(provider) == 1


def test_embeddings_then_a_hit(
    client: openai.OpenAI, origin: RunningOrigin, provider: ProviderServer
) -> None:
    inputs = [f"prism {secrets.token_hex(4)}", "light"]
    first = client.embeddings.with_raw_response.create(model="azure-embed", input=inputs)
    origin.wait_stored()
    second = client.embeddings.with_raw_response.create(model="azure-embed", input=inputs)
    assert first.headers["x-prism-edge-cache-layer"] == "miss"
    assert second.headers["x-prism-edge-cache-layer"] == "redis"
    vectors = first.parse()
    assert [item.index for item in vectors.data] == [0, 1]
    assert vectors.model == "text-embedding-3-small"
    assert second.parse().data[0].embedding == vectors.data[0].embedding
    assert provider.control.stats()["paths"] == {
        "/openai/deployments/text-embedding-3-small/embeddings": 1
    }


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("marker", [FILTER_PROMPT, FILTER_ANSWER])
def test_the_content_filters_refusals_are_400s_never_stored_nor_failed_over(
    client: openai.OpenAI,
    provider: ProviderServer,
    secondary_provider: ProviderServer,
    marker: str,
    stream: bool,
) -> None:
    messages = question(f"say {marker}")
    for attempt in (1, 2):
        if stream:
            try:
                with client.chat.completions.with_streaming_response.create(
                    model=MODEL, messages=messages, stream=True
                ) as response:
                    raw = response.read().decode()
            except openai.BadRequestError as error:
                assert error.code == "content_filter"
            else:
                # Cut after the answer began: an error event instead of [DONE].
                assert '"code":"content_filter"' in raw and "[DONE]" not in raw
        else:
            with pytest.raises(openai.BadRequestError) as caught:
                client.chat.completions.create(model=MODEL, messages=messages)
            assert caught.value.code == "content_filter"
            assert "content management policy" in caught.value.message
        # Not stored: the repeat asks Azure again; not another target's to answer.
        assert chat_requests(provider) == attempt
    assert chat_requests(secondary_provider) == 0


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    "fault",
    [
        {"mode": "rate_limit", "retry_after": 7},
        {"mode": "status", "status": 500},
        {"mode": "status", "status": 503},
        {"mode": "truncated_stream", "after_chunks": 0, "abort": 1},
        {"mode": "stall_before_first_byte", "seconds": 5},
    ],
    ids=["429", "500", "503", "cut", "stall"],
)
def test_faults_are_routed_to_the_other_azure_target(
    client: openai.OpenAI,
    provider: ProviderServer,
    secondary_provider: ProviderServer,
    fault: dict[str, Any],
    stream: bool,
) -> None:
    provider.control.set_fault(**fault)
    messages = question("fail over")
    if stream:
        with client.chat.completions.with_streaming_response.create(
            model=MODEL, messages=messages, stream=True
        ) as response:
            served_by = response.headers["x-prism-provider"]
            text = "".join(c.choices[0].delta.content or "" for c in response.parse() if c.choices)
    else:
        raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=messages)
        served_by = raw.headers["x-prism-provider"]
        text = raw.parse().choices[0].message.content or ""
    provider.control.release()
    assert served_by == "azure backup" and text.startswith("Echo: fail over")
    (sent,) = secondary_provider.control.requests()
    assert sent["path"] == "/openai/v1/chat/completions"
    assert sent["headers"]["authorization"] == "Bearer entra-id-test-token"


def test_a_429_alone_is_passed_on_with_azures_wait(
    origin_factory: OriginFactory, provider: ProviderServer, tmp_path: Path, api_key: str
) -> None:
    config = tmp_path / "providers.toml"
    config.write_text(
        f"""
[providers.azure]
kind = "azure"
base_url = "{provider.url}"
api_key = "provider-test-key"
max_retry_after = 0.1
[models]
"{MODEL}" = ["azure:gpt-4o-mini"]
"""
    )
    origin = origin_factory(PRISM_PROVIDERS_FILE=str(config))
    provider.control.set_fault("rate_limit", retry_after=7)
    response = httpx.post(
        origin.url + "/v1/chat/completions",
        json={"model": MODEL, "messages": question()},
        headers={"authorization": f"Bearer {api_key}"},
        timeout=30,
    )
    assert response.status_code == 429
    assert response.json()["error"]["code"] == "upstream_rate_limited"
    assert (response.headers["retry-after"], response.headers["retry-after-ms"]) == ("7", "7000")
