"""The local provider's Azure OpenAI, checked with the official ``openai`` package's
``AzureOpenAI`` client (and its plain client on the v1 form): what that client sends is
accepted, what the stand-in answers parses, its errors are Azure's."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from deploy.local.provider import ProviderServer, ProviderSettings
from deploy.local.provider_azure import FILTER_ANSWER, FILTER_PROMPT

KEY = "azure-resource-key"
VERSION = "2024-10-21"
HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello there"}]


@pytest.fixture
def resource(provider_factory: Callable[[ProviderSettings], ProviderServer]) -> ProviderServer:
    return provider_factory(ProviderSettings(api_key=KEY))


@pytest.fixture
def client(resource: ProviderServer) -> Iterator[openai.AzureOpenAI]:
    with openai.AzureOpenAI(
        azure_endpoint=resource.url, api_key=KEY, api_version=VERSION, max_retries=0
    ) as azure:
        yield azure


def test_chat_answers_with_the_content_filters_results(
    client: openai.AzureOpenAI, resource: ProviderServer
) -> None:
    answer = client.chat.completions.create(model="gpt-4o-mini", messages=HELLO)
    assert answer.model == "gpt-4o-mini"
    choice = answer.choices[0]
    assert choice.message.content and choice.message.content.startswith("Echo: hello there")
    assert choice.finish_reason == "stop"
    extra = answer.model_extra or {}
    assert extra["prompt_filter_results"][0]["content_filter_results"]["hate"]["filtered"] is False
    assert (choice.model_extra or {})["content_filter_results"]["violence"]["severity"] == "safe"
    (sent,) = resource.control.requests()
    assert sent["path"] == "/openai/deployments/gpt-4o-mini/chat/completions"
    assert sent["headers"]["api-key"] == KEY


def test_a_stream_opens_with_the_prompts_results_and_ends_with_usage(
    client: openai.AzureOpenAI,
) -> None:
    chunks = list(
        client.chat.completions.create(
            model="gpt-4o", messages=HELLO, stream=True, stream_options={"include_usage": True}
        )
    )
    first, last = chunks[0], chunks[-1]
    assert first.choices == [] and first.id == "" and first.model == ""
    assert "prompt_filter_results" in (first.model_extra or {})
    text = "".join(
        c.choices[0].delta.content or "" for c in chunks if c.choices and c.choices[0].delta
    )
    assert text.startswith("Echo: hello there")
    # Asynchronous filtering's annotations of text already sent: a choice with no delta.
    alone = [c for c in chunks if c.choices and c.choices[0].delta is None]
    assert len(alone) == 1 and alone[0].id == ""
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.id][-1] == "stop"
    assert last.choices == [] and last.usage is not None and last.usage.total_tokens > 0


def test_tool_calls_as_openai_sends_them(client: openai.AzureOpenAI) -> None:
    answer = client.chat.completions.create(
        model="gpt-4o",
        messages=[{"role": "user", "content": "Weather in Pune?"}],
        tools=[
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
                },
            }
        ],
        tool_choice="required",
    )
    calls = answer.choices[0].message.tool_calls
    assert calls is not None and calls[0].type == "function"
    assert calls[0].function.name == "get_weather"
    assert answer.choices[0].finish_reason == "tool_calls"


def test_embeddings_of_an_embedding_deployment(client: openai.AzureOpenAI) -> None:
    vectors = client.embeddings.create(model="text-embedding-3-small", input=["a", "b"])
    assert [item.index for item in vectors.data] == [0, 1]
    assert (
        len(vectors.data[0].embedding) == 8
        and vectors.data[0].embedding != vectors.data[1].embedding
    )
    assert vectors.usage.prompt_tokens == 2


def test_the_v1_form_with_the_plain_client_and_an_entra_id_token(
    resource: ProviderServer,
) -> None:
    with openai.OpenAI(base_url=resource.url + "/openai/v1/", api_key=KEY, max_retries=0) as v1:
        answer = v1.chat.completions.create(model="gpt-4o", messages=HELLO)
    assert answer.choices[0].message.content
    assert resource.control.requests()[-1]["path"] == "/openai/v1/chat/completions"
    with openai.AzureOpenAI(
        azure_endpoint=resource.url, azure_ad_token=KEY, api_version=VERSION, max_retries=0
    ) as entra:
        entra.chat.completions.create(model="gpt-4o", messages=HELLO)
    assert resource.control.requests()[-1]["headers"]["authorization"] == f"Bearer {KEY}"


def test_errors_are_azures(client: openai.AzureOpenAI, resource: ProviderServer) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="gpt-5-nowhere", messages=HELLO)
    assert missing.value.code == "DeploymentNotFound"
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": f"x {FILTER_PROMPT}"}]
        )
    assert refused.value.code == "content_filter" and refused.value.param == "prompt"
    body = refused.value.body
    assert isinstance(body, dict) and body["innererror"]["code"] == "ResponsibleAIPolicyViolation"
    with (
        openai.AzureOpenAI(
            azure_endpoint=resource.url, api_key="wrong", api_version=VERSION, max_retries=0
        ) as stranger,
        pytest.raises(openai.AuthenticationError) as denied,
    ):
        stranger.chat.completions.create(model="gpt-4o", messages=HELLO)
    assert denied.value.code == "401"
    resource.control.set_fault("rate_limit", retry_after=1.5)
    with pytest.raises(openai.RateLimitError) as limited:
        client.chat.completions.create(model="gpt-4o", messages=HELLO)
    headers = limited.value.response.headers
    assert limited.value.code == "429"
    assert (headers["retry-after"], headers["retry-after-ms"]) == ("1.5", "1500")


def test_a_filtered_answer_ends_with_content_filter(client: openai.AzureOpenAI) -> None:
    cut: list[ChatCompletionMessageParam] = [{"role": "user", "content": f"Say {FILTER_ANSWER}"}]
    answer = client.chat.completions.create(model="gpt-4o", messages=cut)
    choice = answer.choices[0]
    assert choice.finish_reason == "content_filter" and choice.message.content is None
    results = (choice.model_extra or {})["content_filter_results"]
    assert results["violence"] == {"filtered": True, "severity": "medium"}
    chunks = list(client.chat.completions.create(model="gpt-4o", messages=cut, stream=True))
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].delta]
    assert finishes[-1] == "content_filter"


def test_a_deployment_url_needs_a_dated_api_version(resource: ProviderServer) -> None:
    url = resource.url + "/openai/deployments/gpt-4o/chat/completions"
    body = {"messages": HELLO}
    missing = httpx.post(url, json=body, headers={"api-key": KEY})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "404"
    undated = httpx.post(url + "?api-version=latest", json=body, headers={"api-key": KEY})
    assert undated.status_code == 404
    # The deployment names the model: the body needs none.
    dated = httpx.post(url + f"?api-version={VERSION}", json=body, headers={"api-key": KEY})
    assert dated.status_code == 200 and dated.json()["model"] == "gpt-4o"
    keyless = httpx.post(url + f"?api-version={VERSION}", json=body)
    assert keyless.status_code == 401
