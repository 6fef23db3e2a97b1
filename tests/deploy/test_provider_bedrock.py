"""The local provider's Bedrock, checked with AWS's own client: boto3's ``bedrock-runtime``
signs its requests (the stand-in recomputes each signature), parses its JSON answers and
its binary event streams, and raises Bedrock's own exceptions from its errors."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing
from typing import TYPE_CHECKING, Any

import boto3
import orjson
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError, EventStreamError

from deploy.local.provider import ProviderServer
from deploy.local.provider_bedrock import (
    TEST_ACCESS_KEY_ID,
    TEST_SECRET_ACCESS_KEY,
    TEST_SESSION_TOKEN,
)

if TYPE_CHECKING:
    from mypy_boto3_bedrock_runtime import BedrockRuntimeClient
    from mypy_boto3_bedrock_runtime.type_defs import MessageTypeDef, ToolConfigurationTypeDef

MODEL = "anthropic.claude-3-5-haiku-20241022-v1:0"
QUESTION: list[MessageTypeDef] = [{"role": "user", "content": [{"text": "Name a prime number."}]}]
WEATHER: ToolConfigurationTypeDef = {
    "tools": [
        {
            "toolSpec": {
                "name": "get_weather",
                "description": "Weather for a city",
                "inputSchema": {
                    "json": {"type": "object", "properties": {"city": {"type": "string"}}}
                },
            }
        }
    ],
    "toolChoice": {"any": {}},
}


def client_of(
    provider: ProviderServer, secret: str = TEST_SECRET_ACCESS_KEY, token: str | None = None
) -> BedrockRuntimeClient:
    return boto3.client(
        "bedrock-runtime",
        endpoint_url=provider.url,
        region_name="eu-west-1",
        aws_access_key_id=TEST_ACCESS_KEY_ID,
        aws_secret_access_key=secret,
        aws_session_token=token,
        config=Config(retries={"total_max_attempts": 1}),  # each fault seen, not retried
    )


@pytest.fixture
def bedrock(provider: ProviderServer) -> Iterator[BedrockRuntimeClient]:
    client = client_of(provider)
    yield client
    client.close()


def test_converse_answers_are_parsed_by_boto3(
    bedrock: BedrockRuntimeClient, provider: ProviderServer
) -> None:
    answer = bedrock.converse(
        modelId=MODEL,
        messages=QUESTION,
        system=[{"text": "Be brief."}],
        inferenceConfig={"maxTokens": 64, "temperature": 0.5, "stopSequences": ["END"]},
    )
    assert answer["ResponseMetadata"]["HTTPStatusCode"] == 200
    block = answer["output"]["message"]["content"][0]
    assert block["text"].startswith("Echo: Name a prime number.")
    assert answer["stopReason"] == "end_turn"
    usage = answer["usage"]
    assert usage["inputTokens"] > 0 and usage["outputTokens"] > 0
    assert usage["totalTokens"] == usage["inputTokens"] + usage["outputTokens"]
    (sent,) = provider.control.requests()
    assert sent["path"] == f"/model/{MODEL}/converse"  # boto3 sent the ':' as %3A
    assert sent["body"]["inferenceConfig"]["maxTokens"] == 64


def test_converse_stream_is_decoded_by_boto3_event_by_event(
    bedrock: BedrockRuntimeClient,
) -> None:
    plain = bedrock.converse(modelId=MODEL, messages=QUESTION)
    streamed = bedrock.converse_stream(modelId=MODEL, messages=QUESTION)
    events: list[Any] = list(streamed["stream"])
    kinds = [next(iter(event)) for event in events]
    assert kinds[0] == "messageStart" and kinds[-3:] == [
        "contentBlockStop",
        "messageStop",
        "metadata",
    ]
    assert kinds.count("contentBlockDelta") > 1
    text = "".join(
        e["contentBlockDelta"]["delta"]["text"] for e in events if "contentBlockDelta" in e
    )
    assert text == plain["output"]["message"]["content"][0]["text"]
    assert events[-2]["messageStop"]["stopReason"] == "end_turn"
    assert events[-1]["metadata"]["usage"] == plain["usage"]


def test_a_tool_call_plain_and_streamed(bedrock: BedrockRuntimeClient) -> None:
    answer = bedrock.converse(modelId=MODEL, messages=QUESTION, toolConfig=WEATHER)
    assert answer["stopReason"] == "tool_use"
    tool = answer["output"]["message"]["content"][0]["toolUse"]
    assert tool["name"] == "get_weather" and set(tool["input"]) == {"city"}
    events: list[Any] = list(
        bedrock.converse_stream(modelId=MODEL, messages=QUESTION, toolConfig=WEATHER)["stream"]
    )
    start = next(
        e["contentBlockStart"]["start"]["toolUse"] for e in events if "contentBlockStart" in e
    )
    assert (start["toolUseId"], start["name"]) == (tool["toolUseId"], "get_weather")
    arguments = "".join(
        e["contentBlockDelta"]["delta"]["toolUse"]["input"]
        for e in events
        if "contentBlockDelta" in e
    )
    assert orjson.loads(arguments) == tool["input"]
    # The result goes back as a toolResult turn, which needs the tool configuration.
    turns: list[MessageTypeDef] = [
        *QUESTION,
        {"role": "assistant", "content": [{"toolUse": tool}]},
        {"role": "user", "content": [{"toolResult": {"toolUseId": tool["toolUseId"],
                                                      "content": [{"json": {"temp": 31}}]}}]},
    ]  # fmt: skip
    done = bedrock.converse(modelId=MODEL, messages=turns, toolConfig={"tools": WEATHER["tools"]})
    assert done["stopReason"] == "end_turn"
    with pytest.raises(bedrock.exceptions.ValidationException, match="toolConfig"):
        bedrock.converse(modelId=MODEL, messages=turns)


@pytest.mark.parametrize(
    ("fault", "exception", "message"),
    [
        ({"mode": "rate_limit"}, "ThrottlingException", "Too many requests"),
        ({"mode": "status", "status": 400, "message": "maxTokens is too big"},
         "ValidationException", "maxTokens is too big"),
        ({"mode": "status", "status": 503, "message": "Try later"},
         "ServiceUnavailableException", "Try later"),
        ({"mode": "status", "status": 500, "message": "Oops"}, "InternalServerException", "Oops"),
    ],
    ids=["throttling", "validation", "unavailable", "internal"],
)  # fmt: skip
@pytest.mark.parametrize("streaming", [False, True], ids=["converse", "converse_stream"])
def test_errors_are_bedrock_s_own_exceptions_in_boto3(
    bedrock: BedrockRuntimeClient,
    provider: ProviderServer,
    fault: dict[str, Any],
    exception: str,
    message: str,
    streaming: bool,
) -> None:
    provider.control.set_fault(**fault)
    with pytest.raises(getattr(bedrock.exceptions, exception), match=message) as caught:
        if streaming:
            bedrock.converse_stream(modelId=MODEL, messages=QUESTION)
        else:
            bedrock.converse(modelId=MODEL, messages=QUESTION)
    assert caught.value.response["Error"]["Code"] == exception


def test_an_exception_event_inside_the_stream_is_raised_by_boto3(
    bedrock: BedrockRuntimeClient, provider: ProviderServer
) -> None:
    provider.control.set_fault("error_event", message="Model is overloaded")
    streamed = bedrock.converse_stream(modelId=MODEL, messages=QUESTION)
    with pytest.raises(EventStreamError) as caught:
        list(streamed["stream"])
    error = caught.value.response["Error"]
    assert (error["Code"], error["Message"]) == (
        "serviceUnavailableException",
        "Model is overloaded",
    )


def test_signatures_are_checked_as_aws_checks_them(provider: ProviderServer) -> None:
    with closing(client_of(provider, token=TEST_SESSION_TOKEN)) as signed_with_token:
        assert (
            signed_with_token.converse(modelId=MODEL, messages=QUESTION)["stopReason"] == "end_turn"
        )
    cases = [
        (client_of(provider, secret="wrong-secret"), "InvalidSignatureException"),
        (client_of(provider, token="someone-elses-token"), "UnrecognizedClientException"),
    ]
    for client, code in cases:
        with closing(client), pytest.raises(ClientError) as caught:
            client.converse(modelId=MODEL, messages=QUESTION)
        assert caught.value.response["Error"]["Code"] == code
        assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    assert provider.control.stats()["chat_requests"] == 3  # refused ones are counted too


def test_conversations_bedrock_refuses_are_validation_errors(
    bedrock: BedrockRuntimeClient,
) -> None:
    refused: list[list[MessageTypeDef]] = [
        [{"role": "assistant", "content": [{"text": "I start"}]}],
        [*QUESTION, *QUESTION],  # two user turns in a row
        [{"role": "user", "content": [{"text": "  "}]}],
    ]
    for messages in refused:
        with pytest.raises(bedrock.exceptions.ValidationException):
            bedrock.converse(modelId=MODEL, messages=messages)


def test_titan_embeddings_through_invoke_model(
    bedrock: BedrockRuntimeClient, provider: ProviderServer
) -> None:
    answer = bedrock.invoke_model(
        modelId="amazon.titan-embed-text-v2:0",
        body=orjson.dumps({"inputText": "a prism splits light", "dimensions": 512}),
        contentType="application/json",
        accept="application/json",
    )
    parsed = orjson.loads(answer["body"].read())
    assert len(parsed["embedding"]) == 512 and parsed["inputTextTokenCount"] == 4
    again = bedrock.invoke_model(
        modelId="amazon.titan-embed-text-v2:0",
        body=orjson.dumps({"inputText": "a prism splits light", "dimensions": 512}),
    )
    assert orjson.loads(again["body"].read())["embedding"] == parsed["embedding"]
    with pytest.raises(bedrock.exceptions.ValidationException, match="inputText"):
        bedrock.invoke_model(modelId="amazon.titan-embed-text-v2:0", body=b'{"text": "x"}')
