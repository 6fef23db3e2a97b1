"""The Bedrock adapter on the wire, against the local provider (which recomputes each SigV4
signature from the test credentials): answers, streams, faults, credentials, options."""

from __future__ import annotations

import asyncio
import base64
import struct
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from deploy.local.asgi_thread import ThreadedServer
from deploy.local.provider import ProviderServer
from deploy.local.provider_bedrock import (
    EVENT_STREAM,
    TEST_ACCESS_KEY_ID,
    TEST_API_KEY,
    TEST_SECRET_ACCESS_KEY,
    credentials_env,
    encode_message,
)
from origin.providers.base import ProviderSpec
from origin.providers.bedrock import BedrockProvider
from origin.providers.config import load_provider_config
from origin.providers.registry import build_provider
from origin.providers.upstream_http import UpstreamHTTP
from prism import (
    InvalidRequestError,
    PrismError,
    RateLimitError,
    SSEDecoder,
    StreamAssembler,
    UpstreamError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
)
from tests.polling import wait_for

MODEL = "anthropic.claude-3-5-haiku-20241022-v1:0"
PROFILE_ARN = "arn:aws:bedrock:us-west-2:123456789012:inference-profile/us.anthropic.claude-3-5-haiku-20241022-v1:0"
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
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
_AWS_ELSEWHERE = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE",
                  "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI")  # fmt: skip


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """botocore's standard chain finds the stand-in's test credentials, and nothing else."""
    for name in _AWS_ELSEWHERE:
        monkeypatch.delenv(name, raising=False)
    for name, value in credentials_env().items():
        monkeypatch.setenv(name, value)
    yield monkeypatch


ProviderFactory = Callable[..., BedrockProvider]


@pytest.fixture
async def make_provider(aws_env: pytest.MonkeyPatch) -> AsyncIterator[ProviderFactory]:
    made: list[BedrockProvider] = []

    def make(base_url: str, **fields: Any) -> BedrockProvider:
        options = fields.pop("options", {"region": "us-west-2"})
        spec = ProviderSpec(name="bedrock", kind="bedrock", base_url=base_url, options=options,
                            **fields)  # fmt: skip
        made.append(BedrockProvider(spec))
        return made[-1]

    yield make
    for provider in made:
        await provider.aclose()


@pytest.fixture
def bedrock(provider: ProviderServer, make_provider: ProviderFactory) -> BedrockProvider:
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
    bedrock: BedrockProvider, provider: ProviderServer, body: dict[str, Any]
) -> None:
    result = await bedrock.complete(body, MODEL)
    stream = await bedrock.stream(body, MODEL)
    raw, error = await _drain(stream.events)
    assert error is None
    assert raw[-1].endswith(b"data: [DONE]\n\n")
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
        assert result.completion["usage"]["prompt_tokens"] > 0
    paths = provider.control.stats()["paths"]
    assert paths == {f"/model/{MODEL}/converse": 1, f"/model/{MODEL}/converse-stream": 1}


async def test_requests_go_out_in_converse_format_signed_with_sigv4(
    bedrock: BedrockProvider, provider: ProviderServer
) -> None:
    await bedrock.complete({**CHAT, "max_tokens": 50, "temperature": 0, "seed": 3}, MODEL)
    (sent,) = provider.control.requests()
    assert sent["path"] == f"/model/{MODEL}/converse"
    credential = f"AWS4-HMAC-SHA256 Credential={TEST_ACCESS_KEY_ID}/"
    assert sent["headers"]["authorization"].startswith(credential)
    assert "/us-west-2/bedrock/aws4_request" in sent["headers"]["authorization"]
    assert sent["headers"]["x-amz-security-token"] == credentials_env()["AWS_SESSION_TOKEN"]
    assert sent["body"] == {
        "messages": [{"role": "user", "content": [{"text": "Name a prime number."}]}],
        "system": [{"text": "Be brief."}],
        "inferenceConfig": {"maxTokens": 50, "temperature": 0},
    }


async def test_an_inference_profile_arn_is_one_signed_path_segment(
    bedrock: BedrockProvider, provider: ProviderServer
) -> None:
    result = await bedrock.complete(CHAT, PROFILE_ARN)
    stream = await bedrock.stream(CHAT, PROFILE_ARN)
    raw, error = await _drain(stream.events)
    assert error is None and _assemble(raw).complete
    assert result.completion["model"] == PROFILE_ARN
    assert provider.control.requests()[0]["path"] == f"/model/{PROFILE_ARN}/converse"


async def test_unsupported_request_fails_before_any_upstream_call(
    bedrock: BedrockProvider, provider: ProviderServer
) -> None:
    for attempt in (bedrock.complete, bedrock.stream):
        with pytest.raises(InvalidRequestError):
            await attempt({**CHAT, "n": 3}, MODEL)
    assert provider.control.stats()["chat_requests"] == 0


@pytest.mark.parametrize(
    ("fault", "error_type", "status", "code"),
    [
        ({"mode": "status", "status": 500}, UpstreamError, 502, "bad_gateway"),
        ({"mode": "status", "status": 503}, UpstreamUnavailableError, 503, "upstream_unavailable"),
        ({"mode": "status", "status": 400, "message": "maxTokens exceeds the model's limit"},
         InvalidRequestError, 400, "invalid_request"),
        ({"mode": "rate_limit"}, RateLimitError, 429, "upstream_rate_limited"),
        ({"mode": "stall_before_first_byte", "seconds": 1.0}, UpstreamTimeoutError, 504,
         "upstream_timeout"),
        ({"mode": "malformed_json"}, UpstreamError, 502, "upstream_malformed"),
    ],
    ids=["500", "503", "400", "429", "stall", "malformed"],
)  # fmt: skip
@pytest.mark.parametrize("streaming", [False, True], ids=["complete", "stream"])
async def test_upstream_faults_become_the_matching_prism_error(
    bedrock: BedrockProvider,
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
            stream = await bedrock.stream(CHAT, MODEL)
            received, error = await _drain(stream.events)
            if error is not None:
                raise error
        else:
            await bedrock.complete(CHAT, MODEL)
    assert (caught.value.status, caught.value.code) == (status, code)
    assert all(b"[DONE]" not in chunk for chunk in received)
    if "message" in fault:
        assert fault["message"] in caught.value.message


async def test_an_exception_event_right_after_the_200_fails_the_stream_start(
    bedrock: BedrockProvider, provider: ProviderServer
) -> None:
    provider.control.set_fault("error_event", message="Model is overloaded")
    with pytest.raises(UpstreamUnavailableError) as caught:
        await bedrock.stream(CHAT, MODEL)  # raised here: the router may still fail over
    assert "Model is overloaded" in caught.value.message


@pytest.mark.parametrize(
    "fault", [{"mode": "truncated_stream", "after_chunks": 3},
              {"mode": "truncated_stream", "after_chunks": 3, "abort": 1}, {"mode": "no_done"}],
    ids=["cut", "dropped", "no-metadata"],
)  # fmt: skip
async def test_a_stream_cut_short_raises_and_never_sends_done(
    bedrock: BedrockProvider, provider: ProviderServer, fault: dict[str, Any]
) -> None:
    provider.control.set_fault(**fault)
    stream = await bedrock.stream(CHAT, MODEL)
    raw, error = await _drain(stream.events)
    assert isinstance(error, UpstreamError) and error.status == 502
    assert raw, "the chunks before the cut are passed on"
    assert all(b"[DONE]" not in chunk for chunk in raw)
    if fault["mode"] == "no_done":  # finished, but without the usage it must report
        assert error.code == "upstream_truncated"
    else:
        assert not _assemble(raw).complete


async def test_stall_mid_stream_times_out_without_done(
    bedrock: BedrockProvider, provider: ProviderServer
) -> None:
    provider.control.set_fault("stall_mid_stream", after_chunks=3, seconds=1.0)
    stream = await bedrock.stream(CHAT, MODEL)
    raw, error = await _drain(stream.events)
    assert isinstance(error, UpstreamTimeoutError) and error.status == 504
    assert all(b"[DONE]" not in chunk for chunk in raw)


class _CountingConnector(aiohttp.TCPConnector):
    def __init__(self) -> None:
        super().__init__()
        self.connections = 0

    async def _create_connection(self, *args: Any, **kwargs: Any) -> Any:
        self.connections += 1
        return await super()._create_connection(*args, **kwargs)


async def test_finished_streams_leave_the_connection_for_reuse(
    provider: ProviderServer, aws_env: pytest.MonkeyPatch
) -> None:
    counter = _CountingConnector()
    spec = ProviderSpec(name="bedrock", kind="bedrock", base_url=provider.url,
                        options={"region": "us-east-1"})  # fmt: skip
    bedrock = BedrockProvider(spec, UpstreamHTTP(spec, lambda _spec: counter))
    try:
        for _ in range(3):
            stream = await bedrock.stream(CHAT, MODEL)
            raw, error = await _drain(stream.events)
            assert error is None and raw[-1].endswith(b"data: [DONE]\n\n")
        await bedrock.complete(CHAT, MODEL)
    finally:
        await bedrock.aclose()
    assert counter.connections == 1


async def test_closing_an_unread_stream_releases_the_upstream_response(
    bedrock: BedrockProvider, provider: ProviderServer
) -> None:
    provider.control.set_fault("stall_mid_stream", after_chunks=2, seconds=10)
    stream = await bedrock.stream(CHAT, MODEL)
    assert provider.control.stats()["open_streams"] == 1
    await stream.aclose()  # e.g. the hedged request that lost, before reading on
    await asyncio.to_thread(wait_for, lambda: provider.control.stats()["open_streams"] == 0, 5.0)


# ---------------------------------------------------------------- credentials


async def test_a_wrong_secret_is_an_upstream_auth_failure_not_the_clients(
    provider: ProviderServer, make_provider: ProviderFactory, aws_env: pytest.MonkeyPatch
) -> None:
    aws_env.setenv("AWS_SECRET_ACCESS_KEY", "not-" + TEST_SECRET_ACCESS_KEY)
    with pytest.raises(UpstreamError) as caught:
        await make_provider(provider.url).complete(CHAT, MODEL)
    error = caught.value
    assert (error.status, error.code) == (502, "upstream_auth_failed")
    assert (
        "InvalidSignatureException" in error.message and TEST_SECRET_ACCESS_KEY not in error.message
    )


async def test_no_credentials_anywhere_is_a_clear_error_before_any_call(
    provider: ProviderServer, make_provider: ProviderFactory, aws_env: pytest.MonkeyPatch
) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        aws_env.delenv(name)
    with pytest.raises(UpstreamError) as caught:
        await make_provider(provider.url).complete(CHAT, MODEL)
    assert caught.value.code == "upstream_auth_failed"
    assert "no usable AWS credentials" in caught.value.message
    assert provider.control.stats()["chat_requests"] == 0


async def test_credentials_are_resolved_once_not_per_request(
    provider: ProviderServer, make_provider: ProviderFactory, aws_env: pytest.MonkeyPatch
) -> None:
    bedrock = make_provider(provider.url)
    await bedrock.complete(CHAT, MODEL)
    aws_env.setenv("AWS_SECRET_ACCESS_KEY", "rotated-away")  # read again, this would fail
    await bedrock.complete(CHAT, MODEL)
    assert provider.control.stats()["outcomes"] == {"ok": 2}


async def test_a_role_s_temporary_credentials_are_fetched_once_and_refreshed_near_expiry(
    provider: ProviderServer, make_provider: ProviderFactory, aws_env: pytest.MonkeyPatch
) -> None:
    # A container credentials endpoint (as ECS serves a task role; EC2's instance role is
    # the same refreshable kind): botocore's chain fetches, keeps and renews them.
    fetched: list[str] = []
    lifetime = {"minutes": 60}

    async def credentials(request: Request) -> Response:
        expiry = datetime.now(UTC) + timedelta(**lifetime)
        fetched.append(expiry.isoformat())
        return Response(orjson.dumps({
            "AccessKeyId": TEST_ACCESS_KEY_ID, "SecretAccessKey": TEST_SECRET_ACCESS_KEY,
            "Token": credentials_env()["AWS_SESSION_TOKEN"],
            "Expiration": expiry.strftime("%Y-%m-%dT%H:%M:%SZ"),
        }), media_type="application/json")  # fmt: skip

    app = Starlette(routes=[Route("/role", credentials)])
    with ThreadedServer(app, lifespan="off") as server:
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
            aws_env.delenv(name)
        aws_env.setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", server.url + "/role")
        bedrock = make_provider(provider.url)
        for _ in range(3):
            await bedrock.complete(CHAT, MODEL)
        assert len(fetched) == 1
        lifetime["minutes"] = 5  # now within botocore's refresh window at every use
        bedrock = make_provider(provider.url)
        await bedrock.complete(CHAT, MODEL)
        await bedrock.complete(CHAT, MODEL)
        assert len(fetched) == 4  # its first fetch, then a refresh before each signature
    assert provider.control.stats()["outcomes"] == {"ok": 5}


async def test_a_bedrock_api_key_is_sent_as_a_bearer_token_instead(
    provider: ProviderServer, make_provider: ProviderFactory
) -> None:
    result = await make_provider(provider.url, api_key=TEST_API_KEY).complete(CHAT, MODEL)
    assert result.completion["choices"][0]["finish_reason"] == "stop"
    (sent,) = provider.control.requests()
    assert sent["headers"]["authorization"] == f"Bearer {TEST_API_KEY}"
    assert "x-amz-date" not in sent["headers"]
    with pytest.raises(UpstreamError) as caught:
        await make_provider(provider.url, api_key="wrong").complete(CHAT, MODEL)
    assert caught.value.code == "upstream_auth_failed"


async def test_model_not_ready_is_retryable_unavailable(make_provider: ProviderFactory) -> None:
    # The local provider answers no ModelNotReadyException (a 429 that is no rate limit);
    # a tiny real server does, and an exception event inside a 200 stream.
    async def converse(request: Request) -> Response:
        if request.url.path.endswith("-stream"):
            start = {":event-type": "messageStart", ":message-type": "event",
                     ":content-type": "application/json"}  # fmt: skip
            failure = {":exception-type": "modelStreamErrorException",
                       ":message-type": "exception", ":content-type": "application/json"}  # fmt: skip
            body = encode_message(start, b'{"role": "assistant"}')
            body += encode_message(failure, b'{"message": "The model stopped"}')
            return Response(body, 200, media_type=EVENT_STREAM)
        headers = {"x-amzn-ErrorType": "ModelNotReadyException:http://internal.amazon.com/"}
        return Response(b'{"message": "Model is not ready for inference"}', 429, headers)

    app = Starlette(routes=[Route("/model/{model_id:path}/{action}", converse, methods=["POST"])])
    with ThreadedServer(app, lifespan="off") as server:
        bedrock = make_provider(server.url)
        with pytest.raises(UpstreamUnavailableError) as caught:
            await bedrock.complete(CHAT, MODEL)
        assert caught.value.status == 503 and "not ready" in caught.value.message
        with pytest.raises(UpstreamError) as failed:  # before the stream is handed on
            await bedrock.stream(CHAT, MODEL)
        assert failed.value.status == 502 and "The model stopped" in failed.value.message


# ---------------------------------------------------------------- the providers file


def test_the_region_gives_the_endpoint_and_bad_options_fail_at_load(tmp_path: Path) -> None:
    config = tmp_path / "providers.toml"
    config.write_text('[providers.aws]\nkind = "bedrock"\nregion = "eu-central-1"\n')
    spec = load_provider_config(config, {}).providers["aws"]
    assert spec.base_url == "https://bedrock-runtime.eu-central-1.amazonaws.com"
    assert isinstance(build_provider(spec), BedrockProvider)
    for table, wrong in [
        ('kind = "bedrock"\n', "base_url"),  # no region, no base_url
        ('kind = "bedrock"\nbase_url = "http://127.0.0.1:1"\n', "region"),
        ('kind = "bedrock"\nregion = "moon-1"\n', "region"),
        ('kind = "bedrock"\nregion = "us-east-1"\nregoin = "us-west-2"\n', "regoin"),
    ]:
        config.write_text(f"[providers.aws]\n{table}")
        with pytest.raises(ValueError, match=wrong):
            build_provider(load_provider_config(config, {}).providers["aws"])


# ---------------------------------------------------------------- embeddings

TITAN = "amazon.titan-embed-text-v2:0"


async def test_titan_embeddings_one_call_per_input_in_openai_s_list(
    bedrock: BedrockProvider, provider: ProviderServer
) -> None:
    body = {"model": "e", "input": ["first text", "second text here"], "dimensions": 256}
    result = await bedrock.embed(body, TITAN)
    data = result.completion["data"]
    assert [d["index"] for d in data] == [0, 1] and all(len(d["embedding"]) == 256 for d in data)
    assert data[0]["embedding"] != data[1]["embedding"]
    assert result.completion["usage"] == {"prompt_tokens": 5, "total_tokens": 5}
    assert orjson.loads(result.body) == result.completion
    sent = sorted(r["body"]["inputText"] for r in provider.control.requests())
    assert sent == ["first text", "second text here"]
    assert provider.control.stats()["paths"] == {f"/model/{TITAN}/invoke": 2}
    encoded = await bedrock.embed({**body, "encoding_format": "base64"}, TITAN)
    packed = base64.b64decode(encoded.completion["data"][1]["embedding"])
    assert list(struct.unpack("<256f", packed)) == data[1]["embedding"]


async def test_titan_refuses_token_arrays_before_any_call_and_keeps_bedrock_errors(
    bedrock: BedrockProvider, provider: ProviderServer
) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        await bedrock.embed({"model": "e", "input": [[1, 2, 3]]}, TITAN)
    assert caught.value.param == "input"
    assert provider.control.stats()["paths"] == {}
    provider.control.set_fault("rate_limit")
    with pytest.raises(RateLimitError):
        await bedrock.embed({"model": "e", "input": "x"}, TITAN)
    with pytest.raises(InvalidRequestError) as refused:
        await bedrock.embed({"model": "e", "input": "x", "dimensions": 8}, TITAN)
    assert "dimensions" in refused.value.message
