"""The Azure OpenAI adapter: its options and the content filter's annotations in-process,
the wire (URLs, keys, streams, embeddings, errors) against the local provider."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import orjson
import pytest

from deploy.local.provider import ProviderServer, ProviderSettings
from deploy.local.provider_azure import FILTER_ANSWER, FILTER_PROMPT
from origin.providers.azure import AzureProvider, azure_options
from origin.providers.azure_content import answer_of, chunk_of
from origin.providers.base import ModelLister, ProviderSpec
from origin.providers.registry import ADAPTERS
from origin.providers.upstream_http import raise_for_upstream
from origin.routing.retry import retry_after
from prism import (
    InvalidRequestError,
    NotFoundError,
    PrismError,
    RateLimitError,
    SSEDecoder,
    StreamAssembler,
    UpstreamError,
    UpstreamUnavailableError,
)

SAFE = {"hate": {"filtered": False, "severity": "safe"}}
FLAGGED = {"hate": {"filtered": False, "severity": "safe"}, "violence": {"filtered": True}}
CHAT = {"model": "mini", "messages": [{"role": "user", "content": "Name a prime number."}]}
TOOL_CHAT = {
    "model": "mini",
    "messages": [{"role": "user", "content": "Weather in Pune?"}],
    "tools": [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ],
    "tool_choice": "required",
}


def spec(base_url: str = "https://res.openai.azure.com", **options: Any) -> ProviderSpec:
    return ProviderSpec(
        name="azure", kind="azure", base_url=base_url, api_key="az-key", options=options
    )


# ---------------------------------------------------------------- options


def test_the_kind_is_registered() -> None:
    assert ADAPTERS["azure"] is AzureProvider


@pytest.mark.parametrize(
    ("options", "base_url", "complaint"),
    [
        ({"api_versoin": "2024-10-21"}, "https://r.openai.azure.com", "unknown keys api_versoin"),
        ({"api_version": "2024-10"}, "https://r.openai.azure.com", "api_version"),
        ({"api_version": 20241021}, "https://r.openai.azure.com", "api_version"),
        ({"auth": "bearer"}, "https://r.openai.azure.com", "auth must be one of"),
        ({"deployments": ["a"]}, "https://r.openai.azure.com", "deployments"),
        ({"deployments": {"gpt-4o": 3}}, "https://r.openai.azure.com", "deployments"),
        ({}, "https://r.openai.azure.com/openai", "without /openai"),
        ({}, "https://r.openai.azure.com/openai/v1/", "without /openai"),
    ],
)
def test_bad_options_fail_when_the_adapter_is_built(
    options: dict[str, Any], base_url: str, complaint: str
) -> None:
    with pytest.raises(ValueError, match=complaint):
        AzureProvider(spec(base_url, **options))


def test_options_default_to_the_ga_version_api_key_and_model_named_deployments() -> None:
    options = azure_options(spec())
    assert (options.api_version, options.auth, options.deployments) == ("2024-10-21", "api-key", {})
    preview = azure_options(spec(api_version="2025-04-01-preview", auth="entra-id"))
    assert (preview.api_version, preview.auth) == ("2025-04-01-preview", "entra-id")
    # A gateway in front (API Management) may put the resource under a path of its own.
    assert azure_options(spec("https://apim.example.com/aoai")).api_version == "2024-10-21"


# ---------------------------------------------------------------- answers and chunks


def test_an_answer_loses_the_filters_results_and_nothing_else() -> None:
    completion = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "gpt-4o-mini-2024-07-18",
        "prompt_filter_results": [{"prompt_index": 0, "content_filter_results": SAFE}],
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": "7"},
                "content_filter_results": SAFE,
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }
    assert answer_of(completion, "azure") == {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "gpt-4o-mini-2024-07-18",
        "choices": [
            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "7"}}
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }


@pytest.mark.parametrize(
    "choice",
    [
        {"finish_reason": "content_filter", "message": {"content": None}},
        {"finish_reason": "stop", "message": {"content": "x"}, "content_filter_results": FLAGGED},
    ],
    ids=["finish", "flagged"],
)
def test_a_filtered_answer_is_a_content_policy_error(choice: dict[str, Any]) -> None:
    completion = {"choices": [{"index": 0, "message": {"content": "fine"}}, {"index": 1, **choice}]}
    with pytest.raises(InvalidRequestError) as caught:
        answer_of(completion, "azure")
    assert (caught.value.status, caught.value.code) == (400, "content_filter")
    assert "Provider 'azure' filtered the answer" in caught.value.message


def test_chunks_of_annotations_alone_are_dropped_and_the_rest_made_plain() -> None:
    prompt_results = {
        "choices": [],
        "created": 0,
        "id": "",
        "model": "",
        "object": "",
        "prompt_filter_results": [{"prompt_index": 0, "content_filter_results": SAFE}],
    }
    annotations = {
        "id": "",
        "choices": [
            {
                "index": 0,
                "finish_reason": None,
                "content_filter_results": SAFE,
                "content_filter_offsets": {"check_offset": 4, "start_offset": 4, "end_offset": 9},
            }
        ],
    }
    text = {
        "id": "chatcmpl-1",
        "choices": [{"index": 0, "delta": {"content": "Hi"}, "content_filter_results": SAFE}],
    }
    usage = {"id": "chatcmpl-1", "choices": [], "usage": {"total_tokens": 3}}
    error = {"error": {"code": "500", "message": "boom"}}
    assert chunk_of(prompt_results, "azure") is None
    assert chunk_of(annotations, "azure") is None
    assert chunk_of(text, "azure") == {
        "id": "chatcmpl-1",
        "choices": [{"index": 0, "delta": {"content": "Hi"}}],
    }
    assert chunk_of(usage, "azure") == usage
    assert chunk_of(error, "azure") == error  # the stream's reader reports it


def test_a_chunk_the_filter_cut_is_a_content_policy_error() -> None:
    cut = {"choices": [{"index": 0, "delta": {}, "finish_reason": "content_filter"}]}
    with pytest.raises(InvalidRequestError, match="content management policy"):
        chunk_of(cut, "azure")


def test_a_429s_milliseconds_are_its_wait_and_both_headers_go_on() -> None:
    with pytest.raises(RateLimitError) as caught:
        raise_for_upstream(spec(), 429, b"{}", {"retry-after-ms": "1500"})
    assert caught.value.headers == {"retry-after-ms": "1500", "retry-after": "2"}
    assert retry_after(caught.value) == 1.5
    with pytest.raises(RateLimitError) as both:
        raise_for_upstream(spec(), 429, b"{}", {"retry-after": "3", "retry-after-ms": "2500"})
    assert retry_after(both.value) == 2.5 and both.value.headers["retry-after"] == "3"
    with pytest.raises(RateLimitError) as seconds:
        raise_for_upstream(spec(), 429, b"{}", {"retry-after": "4"})
    assert seconds.value.headers == {"retry-after": "4"} and retry_after(seconds.value) == 4.0


# ---------------------------------------------------------------- the wire


class Make(Protocol):
    def __call__(self, base_url: str, api_key: str = ..., **options: Any) -> AzureProvider: ...


@pytest.fixture
async def make() -> AsyncIterator[Make]:
    made: list[AzureProvider] = []

    def build(base_url: str, api_key: str = "az-key", **options: Any) -> AzureProvider:
        made.append(
            AzureProvider(
                ProviderSpec(
                    name="azure",
                    kind="azure",
                    base_url=base_url,
                    api_key=api_key,
                    first_byte_timeout=2.0,
                    options=options,
                )
            )
        )
        return made[-1]

    yield build
    for adapter in made:
        await adapter.aclose()


@pytest.fixture
def keyed(provider_factory: Callable[[ProviderSettings], ProviderServer]) -> ProviderServer:
    """A stand-in resource that knows only the key ``az-key``."""
    return provider_factory(ProviderSettings(api_key="az-key"))


async def drain(events: AsyncIterator[bytes]) -> tuple[list[bytes], PrismError | None]:
    """Every SSE payload until the stream ends or fails, and the failure."""
    received: list[bytes] = []
    decoder = SSEDecoder()
    try:
        async for raw in events:
            received += decoder.feed(raw)
    except PrismError as error:
        return received, error
    return received, None


def assembled(payloads: list[bytes]) -> StreamAssembler:
    assembler = StreamAssembler(usage=True)
    for data in payloads:
        if data == b"[DONE]":
            assembler.finish()
        else:
            assembler.add(orjson.loads(data))
    return assembler


async def test_a_deployment_is_called_at_its_url_with_the_api_key(
    keyed: ProviderServer, make: Make
) -> None:
    azure = make(keyed.url, deployments={"mini": "gpt-4o-mini"})
    answer = await azure.complete(CHAT, "mini")
    (sent,) = keyed.control.requests()
    assert sent["path"] == "/openai/deployments/gpt-4o-mini/chat/completions"
    assert sent["headers"]["api-key"] == "az-key" and "authorization" not in sent["headers"]
    assert sent["body"]["model"] == "gpt-4o-mini" and sent["body"]["stream"] is False
    choice = answer.completion["choices"][0]
    assert choice["message"]["content"].startswith("Echo: Name a prime number.")
    assert "prompt_filter_results" not in answer.completion
    assert "content_filter_results" not in choice
    assert orjson.loads(answer.body) == answer.completion
    # Unmapped, a model is its own deployment's name.
    await azure.complete(CHAT, "gpt-4o")
    assert keyed.control.requests()[-1]["path"] == "/openai/deployments/gpt-4o/chat/completions"


async def test_the_v1_form_names_the_deployment_in_the_body_and_entra_id_is_a_bearer(
    keyed: ProviderServer, make: Make
) -> None:
    azure = make(keyed.url, api_version="v1", auth="entra-id", deployments={"mini": "gpt-4o"})
    await azure.complete(CHAT, "mini")
    (sent,) = keyed.control.requests()
    assert sent["path"] == "/openai/v1/chat/completions"
    assert sent["headers"]["authorization"] == "Bearer az-key" and "api-key" not in sent["headers"]
    assert sent["body"]["model"] == "gpt-4o"


@pytest.mark.parametrize("body", [CHAT, TOOL_CHAT], ids=["text", "tools"])
@pytest.mark.parametrize("api_version", ["2024-10-21", "v1"])
async def test_a_stream_is_openais_and_assembles_to_the_json_answer(
    provider: ProviderServer, make: Make, body: dict[str, Any], api_version: str
) -> None:
    azure = make(provider.url, api_version=api_version, deployments={"mini": "gpt-4o-mini"})
    answer = await azure.complete(body, "mini")
    stream = await azure.stream({**body, "stream_options": {"include_usage": True}}, "mini")
    payloads, error = await drain(stream.events)
    assert error is None and payloads[-1] == b"[DONE]"
    chunks = [orjson.loads(p) for p in payloads[:-1]]
    # No prompt results, no chunk of annotations alone, no annotation on any choice.
    assert all(c["id"] and c["model"] == "gpt-4o-mini" for c in chunks)
    assert not any("prompt_filter_results" in c for c in chunks)
    assert not any("content_filter_results" in ch for c in chunks for ch in c["choices"])
    assert all("delta" in ch for c in chunks for ch in c["choices"])
    streamed = assembled(payloads)
    assert streamed.complete
    (choice,) = streamed.completion()["choices"]
    (expected,) = answer.completion["choices"]
    assert choice["finish_reason"] == expected["finish_reason"]
    assert choice["message"]["content"] == expected["message"]["content"]
    assert choice["message"].get("tool_calls") == expected["message"].get("tool_calls")
    assert streamed.completion()["usage"] == answer.completion["usage"]
    if body is TOOL_CHAT:
        call = answer.completion["choices"][0]["message"]["tool_calls"][0]
        assert call["function"]["name"] == "get_weather"


async def test_embeddings_go_to_the_deployments_embeddings_url(
    keyed: ProviderServer, make: Make
) -> None:
    azure = make(keyed.url, deployments={"embed": "text-embedding-3-small"})
    answer = await azure.embed({"model": "embed", "input": ["a", "b"]}, "embed")
    assert [item["index"] for item in answer.completion["data"]] == [0, 1]
    assert answer.completion["model"] == "text-embedding-3-small"
    assert keyed.control.requests()[-1]["path"] == (
        "/openai/deployments/text-embedding-3-small/embeddings"
    )
    v1 = make(keyed.url, api_version="v1")
    await v1.embed({"model": "x", "input": "a"}, "text-embedding-3-large")
    assert keyed.control.requests()[-1]["path"] == "/openai/v1/embeddings"
    assert keyed.control.requests()[-1]["body"]["model"] == "text-embedding-3-large"


async def test_the_prompt_filters_400_and_a_filtered_answer_are_content_policy_errors(
    provider: ProviderServer, make: Make
) -> None:
    azure = make(provider.url)
    refused = {"messages": [{"role": "user", "content": f"Say {FILTER_PROMPT}"}]}
    for call in (azure.complete, azure.stream):
        with pytest.raises(InvalidRequestError) as caught:
            await call(refused, "gpt-4o")
        assert (caught.value.code, caught.value.param) == ("content_filter", "prompt")
        assert "content management policy" in caught.value.message
    cut = {"messages": [{"role": "user", "content": f"Say {FILTER_ANSWER} now"}]}
    with pytest.raises(InvalidRequestError) as filtered:
        await azure.complete(cut, "gpt-4o")
    assert filtered.value.code == "content_filter" and "(violence)" in filtered.value.message
    # A stream: wherever the cut comes (first read or later), it is the same error, no [DONE].
    payloads: list[bytes] = []
    failure: PrismError | None
    try:
        stream = await azure.stream(cut, "gpt-4o")
    except InvalidRequestError as error:
        failure = error
    else:
        payloads, failure = await drain(stream.events)
    assert isinstance(failure, InvalidRequestError) and failure.code == "content_filter"
    assert b"[DONE]" not in payloads


@pytest.mark.parametrize("streaming", [False, True], ids=["complete", "stream"])
@pytest.mark.parametrize(
    ("fault", "error_type", "code"),
    [
        ({"mode": "status", "status": 500}, UpstreamError, "bad_gateway"),
        ({"mode": "status", "status": 503}, UpstreamUnavailableError, "upstream_unavailable"),
        ({"mode": "rate_limit", "retry_after": 0.25}, RateLimitError, "upstream_rate_limited"),
        ({"mode": "malformed_json"}, UpstreamError, "upstream_malformed"),
    ],
    ids=["500", "503", "429", "malformed"],
)
async def test_faults_keep_their_meaning(
    provider: ProviderServer,
    make: Make,
    fault: dict[str, Any],
    error_type: type[PrismError],
    code: str,
    streaming: bool,
) -> None:
    azure = make(provider.url)
    provider.control.set_fault(**fault)
    with pytest.raises(error_type) as caught:
        if streaming:
            stream = await azure.stream(CHAT, "gpt-4o")
            payloads, error = await drain(stream.events)
            assert b"[DONE]" not in payloads
            if error is not None:
                raise error
        else:
            await azure.complete(CHAT, "gpt-4o")
    assert caught.value.code == code
    if fault["mode"] == "rate_limit":
        assert caught.value.headers == {"retry-after": "0.25", "retry-after-ms": "250"}
        assert retry_after(caught.value) == 0.25


async def test_wrong_keys_and_unknown_deployments_say_so(keyed: ProviderServer, make: Make) -> None:
    with pytest.raises(UpstreamError) as denied:
        await make(keyed.url, api_key="wrong").complete(CHAT, "gpt-4o")
    assert denied.value.code == "upstream_auth_failed"
    with pytest.raises(UpstreamError) as token:
        await make(keyed.url, api_key="wrong", auth="entra-id").complete(CHAT, "gpt-4o")
    assert token.value.code == "upstream_auth_failed"
    with pytest.raises(NotFoundError) as missing:
        await make(keyed.url).complete(CHAT, "no-such-deployment")
    assert missing.value.code == "DeploymentNotFound"
    assert "deployment for this resource does not exist" in missing.value.message


async def test_its_model_list_is_the_deployments_table(make: Make) -> None:
    azure = make("http://127.0.0.1:9", deployments={"gpt-4o-mini": "prod-mini", "o1": "o1"})
    assert isinstance(azure, ModelLister)
    assert [(m.id, m.owned_by) for m in await azure.models()] == [
        ("gpt-4o-mini", "azure"),
        ("o1", "azure"),
    ]
    assert await make("http://127.0.0.1:9").models() == []
