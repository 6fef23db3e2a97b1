"""The official openai SDK through the origin: misses, hits, streams, over real HTTP."""

from __future__ import annotations

import asyncio
import collections
import dataclasses

import httpx
import httpx2
import openai
from openai.types.chat import ChatCompletionMessageParam

from deploy.local.asgi_thread import ThreadedServer
from deploy.local.provider import ProviderServer
from origin import Settings, create_app
from prism import KeyRing
from tests.fixtures.origin import RunningOrigin, origin_env
from tests.polling import async_wait_for, wait_for

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Tell me about prisms."}]


def sdk(origin: RunningOrigin, api_key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=origin.url + "/v1", api_key=api_key, max_retries=0)


def layer(response: httpx2.Response) -> str:
    return response.headers["x-prism-edge-cache-layer"]


def test_miss_then_redis_hit_with_the_sync_sdk(
    origin: RunningOrigin, api_key: str, provider: ProviderServer
) -> None:
    client = sdk(origin, api_key)
    first = client.chat.completions.with_raw_response.create(model="demo", messages=MESSAGES)
    origin.wait_stored()
    second = client.chat.completions.with_raw_response.create(model="demo", messages=MESSAGES)
    assert layer(first.http_response) == "miss"
    assert layer(second.http_response) == "redis"
    a, b = first.parse(), second.parse()
    assert (
        a.choices[0].message.content
        and a.choices[0].message.content == b.choices[0].message.content
    )
    assert a.id == b.id
    assert provider.control.stats()["chat_requests"] == 1
    assert (
        first.http_response.headers["x-prism-cache-key"]
        == second.http_response.headers["x-prism-cache-key"]
    )
    timing = second.http_response.headers["server-timing"]
    assert "redis;dur=" in timing and "auth;dur=" in timing


def test_streamed_miss_then_stream_and_json_hits(
    origin: RunningOrigin, api_key: str, provider: ProviderServer
) -> None:
    client = sdk(origin, api_key)
    plain = client.chat.completions.create(
        model="demo", messages=[{"role": "user", "content": "x"}]
    )
    expected = plain.choices[0].message.content
    provider.control.reset()

    body: list[ChatCompletionMessageParam] = [{"role": "user", "content": "stream me"}]
    with client.chat.completions.with_streaming_response.create(
        model="demo", messages=body, stream=True, stream_options={"include_usage": True}
    ) as response:
        assert layer(response.http_response) == "miss"
        chunks = list(response.parse())
    origin.wait_stored()
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and chunks[-1].usage is not None

    # the stored entry serves both a stream hit and a JSON hit
    with client.chat.completions.with_streaming_response.create(
        model="demo", messages=body, stream=True
    ) as response:
        assert layer(response.http_response) == "redis"
        replayed = list(response.parse())
    assert "".join(c.choices[0].delta.content or "" for c in replayed if c.choices) == text
    assert all(c.usage is None for c in replayed)  # not asked for
    as_json = client.chat.completions.with_raw_response.create(model="demo", messages=body)
    assert layer(as_json.http_response) == "redis"
    assert as_json.parse().choices[0].message.content == text
    assert provider.control.stats()["chat_requests"] == 1
    assert expected  # the provider answers non-empty content


async def test_async_sdk_miss_and_hit(origin: RunningOrigin, api_key: str) -> None:
    client = openai.AsyncOpenAI(base_url=origin.url + "/v1", api_key=api_key, max_retries=0)
    body: list[ChatCompletionMessageParam] = [{"role": "user", "content": "async please"}]
    first = await client.chat.completions.with_raw_response.create(model="demo", messages=body)
    origin.wait_stored()
    second = await client.chat.completions.with_raw_response.create(model="demo", messages=body)
    assert (layer(first.http_response), layer(second.http_response)) == ("miss", "redis")
    stream = await client.chat.completions.create(model="demo", messages=body, stream=True)
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == first.parse().choices[0].message.content
    await client.close()


def test_two_projects_never_share_an_entry(
    origin: RunningOrigin,
    key_ring: KeyRing,
    provider: ProviderServer,
) -> None:
    acme, globex = key_ring.mint("acme"), key_ring.mint("globex")
    body: list[ChatCompletionMessageParam] = [{"role": "user", "content": "shared question"}]
    a1 = sdk(origin, acme).chat.completions.with_raw_response.create(model="demo", messages=body)
    g1 = sdk(origin, globex).chat.completions.with_raw_response.create(model="demo", messages=body)
    origin.wait_stored()
    g2 = sdk(origin, globex).chat.completions.with_raw_response.create(model="demo", messages=body)
    assert layer(a1.http_response) == "miss"
    assert layer(g1.http_response) == "miss"
    assert layer(g2.http_response) == "redis"
    assert (
        a1.http_response.headers["x-prism-cache-key"]
        != g1.http_response.headers["x-prism-cache-key"]
    )
    assert provider.control.stats()["chat_requests"] == 2


def test_fifty_concurrent_identical_misses_make_one_provider_call(
    origin: RunningOrigin, api_key: str, provider: ProviderServer
) -> None:
    slow = provider
    # The one call is held until all fifty have joined it (the minute is a backstop).
    slow.control.set_fault("stall_before_first_byte", seconds=60)

    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(
            base_url=origin.url,
            headers={"authorization": f"Bearer {api_key}"},
            timeout=90,
            limits=httpx.Limits(max_connections=100),
        ) as http:
            body = {"model": "demo", "messages": [{"role": "user", "content": "coalesce"}]}
            stream_body = {**body, "stream": True}
            requests = asyncio.gather(
                *[
                    http.post("/v1/chat/completions", json=stream_body if i % 5 == 0 else body)
                    for i in range(50)
                ]
            )
            await async_wait_for(
                lambda: (
                    slow.control.stats()["chat_requests"] == 1
                    and origin.metric("prism_origin_coalesced_requests_total") == 49
                ),
                within=60,
            )
            slow.control.release()
            return await requests

    responses = asyncio.run(run())
    assert [r.status_code for r in responses] == [200] * 50
    contents = {
        r.json()["choices"][0]["message"]["content"]
        for r in responses
        if "json" in r.headers["content-type"]
    }
    assert len(contents) == 1
    streams = [r.text for r in responses if "event-stream" in r.headers["content-type"]]
    assert len(streams) == 10 and all(s.endswith("data: [DONE]\n\n") for s in streams)
    assert slow.control.stats()["chat_requests"] == 1
    assert origin.metric("prism_origin_coalesced_requests_total") == 49


def test_two_hundred_concurrent_identical_misses_make_exactly_one_provider_call(
    redis_url: str, api_key: str, provider: ProviderServer
) -> None:
    # A Redis timeout well above this busy test process's event-loop stalls: a lookup
    # that timed out would be a bypass, and this test is about coalescing, not Redis.
    settings = Settings.from_env(origin_env(redis_url, provider.url))
    app = create_app(dataclasses.replace(settings, redis_timeout=10.0))

    # No added latency: the burst outlasts the call, so requests also arrive while the
    # answer is being written to Redis (they missed it, and must not call again).
    async def burst(http: httpx.AsyncClient, content: str) -> list[httpx.Response]:
        body = {"model": "demo", "messages": [{"role": "user", "content": content}]}
        stream_body = {**body, "stream": True}
        return await asyncio.gather(
            *[
                http.post("/v1/chat/completions", json=stream_body if i % 4 == 0 else body)
                for i in range(200)
            ]
        )

    async def run(url: str) -> None:
        for round in range(4):
            # New connections each round: a kept-alive one idle past uvicorn's keep-alive
            # timeout (a slow round on a busy machine) may be closed as it is reused.
            async with httpx.AsyncClient(
                base_url=url,
                headers={"authorization": f"Bearer {api_key}"},
                timeout=60,
                limits=httpx.Limits(max_connections=200),
            ) as http:
                before = provider.control.stats()["chat_requests"]
                responses = await burst(http, f"exactly once, round {round}")
                assert [r.status_code for r in responses] == [200] * 200
                calls = provider.control.stats()["chat_requests"] - before
                layers = collections.Counter(
                    r.headers["x-prism-edge-cache-layer"] for r in responses
                )
                assert calls == 1, f"round {round}: {calls} provider calls; {layers}"
                contents = {
                    r.json()["choices"][0]["message"]["content"]
                    for r in responses
                    if "json" in r.headers["content-type"]
                }
                assert len(contents) == 1
                streams = [r.text for r in responses if "event-stream" in r.headers["content-type"]]
                assert len(streams) == 50 and all(s.endswith("data: [DONE]\n\n") for s in streams)

    with ThreadedServer(app) as server:
        asyncio.run(run(server.url))
        gateway = app.gateway
        wait_for(lambda: gateway.background_tasks == 0)
        assert len(gateway.flights) == 0


def test_model_listing_and_unknown_routes(client: httpx.Client) -> None:
    assert client.get("/v1/models").json()["object"] == "list"
    missing = client.get("/v1/nope")
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
    wrong = client.get("/v1/chat/completions")
    assert wrong.status_code == 405 and wrong.json()["error"]["code"] == "method_not_allowed"
