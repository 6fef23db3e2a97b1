"""``POST /v1/embeddings`` through the origin: the official openai SDK, the cache, the
coalescing, the errors, against the real provider stand-in and real Redis."""

from __future__ import annotations

import asyncio
import base64
import secrets
import struct
from pathlib import Path

import httpx
import httpx2
import openai
import pytest

from deploy.local.provider import ProviderServer
from prism import KeyRing
from tests.fixtures.origin import OriginFactory, RunningOrigin
from tests.fixtures.provider import claude_and_local
from tests.polling import async_wait_for

PATH = "/v1/embeddings"


def sdk(origin: RunningOrigin, api_key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=origin.url + "/v1", api_key=api_key, max_retries=0)


def layer(response: httpx.Response | httpx2.Response) -> str:
    return response.headers["x-prism-edge-cache-layer"]


def calls(provider: ProviderServer) -> int:
    paths: dict[str, int] = provider.control.stats()["paths"]
    return paths.get(PATH, 0)


def unique(text: str = "embed") -> str:
    return f"{text} {secrets.token_hex(6)}"


def test_the_sdk_misses_then_hits_redis_with_the_same_vectors(
    origin: RunningOrigin, api_key: str, provider: ProviderServer
) -> None:
    client = sdk(origin, api_key)
    text = unique()
    first = client.embeddings.with_raw_response.create(model="text-embedding-3-small", input=text)
    origin.wait_stored()
    second = client.embeddings.with_raw_response.create(model="text-embedding-3-small", input=text)
    assert (layer(first.http_response), layer(second.http_response)) == ("miss", "redis")
    assert first.http_response.content == second.http_response.content  # byte for byte
    a, b = first.parse(), second.parse()
    assert len(a.data) == 1 and len(a.data[0].embedding) == 8
    assert a.data[0].embedding == b.data[0].embedding
    assert abs(sum(v * v for v in a.data[0].embedding) - 1.0) < 1e-5  # a unit vector
    assert calls(provider) == 1
    # the SDK asks for base64 unless told otherwise; float is another entry, same vector
    floats = client.embeddings.with_raw_response.create(
        model="text-embedding-3-small", input=text, encoding_format="float"
    )
    assert layer(floats.http_response) == "miss"
    assert floats.parse().data[0].embedding == a.data[0].embedding
    assert (
        floats.http_response.headers["x-prism-cache-key"]
        != first.http_response.headers["x-prism-cache-key"]
    )


def test_a_batch_is_one_entry_in_order_and_token_arrays_work(
    origin: RunningOrigin, api_key: str, provider: ProviderServer
) -> None:
    client = sdk(origin, api_key)
    texts = [unique("one"), unique("two"), unique("three")]
    batch = client.embeddings.create(model="m", input=texts, encoding_format="float")
    assert [d.index for d in batch.data] == [0, 1, 2]
    singles = [
        client.embeddings.create(model="m", input=t, encoding_format="float").data[0].embedding
        for t in texts
    ]
    assert [d.embedding for d in batch.data] == singles  # the provider's vectors, in order
    origin.wait_stored()
    again = client.embeddings.with_raw_response.create(
        model="m", input=texts, encoding_format="float"
    )
    assert layer(again.http_response) == "redis"
    assert calls(provider) == 4
    tokens = client.embeddings.create(model="m", input=[[1, 2, 3], [4, 5]], dimensions=4)
    assert [len(d.embedding) for d in tokens.data] == [4, 4]


def test_base64_answers_decode_to_the_float_answer(client: httpx.Client) -> None:
    text = unique()
    as_float = client.post(PATH, json={"model": "m", "input": text}).json()
    as_b64 = client.post(PATH, json={"model": "m", "input": text, "encoding_format": "base64"})
    raw = base64.b64decode(as_b64.json()["data"][0]["embedding"])
    assert list(struct.unpack(f"<{len(raw) // 4}f", raw)) == as_float["data"][0]["embedding"]


@pytest.mark.parametrize(
    ("body", "param", "status"),
    [
        ({"input": "x"}, "model", 400),
        ({"model": "m"}, "input", 400),
        ({"model": "m", "input": ""}, "input", 400),
        ({"model": "m", "input": []}, "input", 400),
        ({"model": "m", "input": ["a", ""]}, "input[1]", 400),
        ({"model": "m", "input": ["a", [1, 2]]}, "input[1]", 400),
        ({"model": "m", "input": [[1], "a"]}, "input[1]", 400),
        ({"model": "m", "input": [1, -2]}, "input", 400),
        ({"model": "m", "input": [True]}, "input[0]", 400),
        ({"model": "m", "input": {"text": "x"}}, "input", 400),
        ({"model": "m", "input": "x", "encoding_format": "int8"}, "encoding_format", 400),
        ({"model": "m", "input": "x", "dimensions": 0}, "dimensions", 400),
        ({"model": "m", "input": "x", "user": 7}, "user", 400),
        ({"model": "m", "input": ["x"] * 2049}, "input", 413),
    ],
)
def test_bad_bodies_get_clear_openai_errors(
    client: httpx.Client, provider: ProviderServer, body: dict[str, object], param: str, status: int
) -> None:
    response = client.post(PATH, json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert calls(provider) == 0


def test_bad_json_and_bad_keys_and_methods(client: httpx.Client, origin: RunningOrigin) -> None:
    assert client.post(PATH, content=b"{nope").json()["error"]["code"] == "invalid_json"
    anonymous = httpx.post(origin.url + PATH, json={"model": "m", "input": "x"})
    assert anonymous.status_code == 401 and anonymous.json()["error"]["type"] == (
        "authentication_error"
    )
    assert client.get(PATH).status_code == 405


def test_identical_concurrent_batches_make_one_provider_call(
    origin: RunningOrigin, api_key: str, provider: ProviderServer
) -> None:
    slow = provider
    # The one call is held until all twenty have joined it (the minute is a backstop).
    slow.control.set_fault("stall_before_first_byte", seconds=60)
    body = {"model": "m", "input": [unique(), unique()]}

    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(
            base_url=origin.url, headers={"authorization": f"Bearer {api_key}"}, timeout=90
        ) as http:
            requests = asyncio.gather(*[http.post(PATH, json=body) for _ in range(20)])
            await async_wait_for(
                lambda: (
                    calls(slow) == 1
                    and origin.metric("prism_origin_coalesced_requests_total") == 19
                ),
                within=60,
            )
            slow.control.release()
            return await requests

    responses = asyncio.run(run())
    assert [r.status_code for r in responses] == [200] * 20
    assert len({r.content for r in responses}) == 1
    assert calls(slow) == 1
    assert origin.metric("prism_origin_coalesced_requests_total") == 19


def test_provider_faults_keep_their_meaning_and_are_never_cached(
    client: httpx.Client, origin: RunningOrigin, provider: ProviderServer
) -> None:
    body = {"model": "m", "input": unique()}
    provider.control.set_fault("malformed_json")
    broken = client.post(PATH, json=body)
    assert broken.status_code == 502 and broken.json()["error"]["code"] == "upstream_malformed"
    provider.control.set_fault("status", status=400, message="input too long")
    refused = client.post(PATH, json=body)
    assert refused.status_code == 400 and "input too long" in refused.json()["error"]["message"]
    provider.control.set_fault("rate_limit", retry_after=0.01)  # waited out, then answered
    answered = client.post(PATH, json=body)
    assert answered.status_code == 200 and layer(answered) == "miss"
    assert calls(provider) == 4


def test_two_projects_never_share_an_entry(
    origin: RunningOrigin,
    key_ring: KeyRing,
    provider: ProviderServer,
) -> None:
    body = {"model": "m", "input": unique()}
    acme, globex = key_ring.mint("acme"), key_ring.mint("globex")
    first = httpx.post(origin.url + PATH, json=body, headers={"authorization": f"Bearer {acme}"})
    origin.wait_stored()
    other = httpx.post(origin.url + PATH, json=body, headers={"authorization": f"Bearer {globex}"})
    assert (layer(first), layer(other)) == ("miss", "miss")
    assert calls(provider) == 2


def test_a_route_to_an_anthropic_provider_is_refused_with_a_400(
    origin_factory: OriginFactory, api_key: str, provider: ProviderServer, tmp_path: Path
) -> None:
    config = claude_and_local(provider, tmp_path)
    origin = origin_factory(PRISM_PROVIDERS_FILE=str(config))
    client = sdk(origin, api_key)
    with pytest.raises(openai.BadRequestError) as refused:
        client.embeddings.create(model="claude-sonnet-4-5", input="x")
    assert refused.value.status_code == 400
    assert "no embeddings API" in str(refused.value)
    assert calls(provider) == 0
    assert client.embeddings.create(model="text-embedding-3-small", input="x").data


def test_a_denied_model_is_a_403(
    client: httpx.Client, provider: ProviderServer, redis_url: str
) -> None:
    import redis

    from prism import Policy, policy_key

    admin = redis.Redis.from_url(redis_url)
    admin.set(policy_key("acme"), Policy.parse('{"allow": ["text-embedding-*"]}').encode())
    admin.close()
    refused = client.post(PATH, json={"model": "other", "input": "x"})
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "model_not_allowed"
    allowed = client.post(PATH, json={"model": "text-embedding-3-small", "input": unique()})
    assert allowed.status_code == 200
    assert calls(provider) == 1
