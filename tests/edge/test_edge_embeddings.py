"""``POST /v1/embeddings`` through the edge Worker in the real local Workers runtime."""

from __future__ import annotations

import json
import secrets

import httpx
import httpx2
import openai
import pytest

from prism import encode_envelope, entry_key, fingerprint
from prism.embeddings_request import parse_embeddings_request
from tests.fixtures.edge import EdgeStack
from tests.polling import wait_for

PATH = "/v1/embeddings"


def layer(response: httpx.Response | httpx2.Response) -> str:
    return response.headers["x-prism-edge-cache-layer"]


@pytest.fixture
def http(edge: EdgeStack, api_key: str) -> httpx.Client:
    return httpx.Client(
        base_url=edge.url, headers={"authorization": f"Bearer {api_key}"}, timeout=30
    )


def test_the_sdk_misses_then_is_served_from_kv_byte_for_byte(edge: EdgeStack, api_key: str) -> None:
    client = openai.OpenAI(base_url=edge.url + "/v1", api_key=api_key, max_retries=0)
    inputs = [f"edge embed {secrets.token_hex(6)}", "second"]
    first = client.embeddings.with_raw_response.create(model="m", input=inputs)
    assert layer(first.http_response) == "miss"
    assert len(first.parse().data) == 2

    def from_kv() -> bool:
        again = client.embeddings.with_raw_response.create(model="m", input=inputs)
        return layer(again.http_response) == "kv"

    wait_for(from_kv)  # via the origin's KV writer
    before = edge.origin_requests()
    hit = client.embeddings.with_raw_response.create(model="m", input=inputs)
    assert layer(hit.http_response) == "kv"
    assert hit.http_response.content == first.http_response.content
    assert [d.embedding for d in hit.parse().data] == [d.embedding for d in first.parse().data]
    assert edge.origin_requests() == before
    assert edge.provider.control.stats()["paths"][PATH] == 1


def test_a_kv_entry_is_served_at_the_edge(edge: EdgeStack, http: httpx.Client) -> None:
    body = {"model": "m", "input": f"kv {secrets.token_hex(6)}"}
    fp = fingerprint("acme", PATH, parse_embeddings_request(json.dumps(body)))
    answer = {"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": [1.0]}]}
    entry = encode_envelope(json.dumps(answer).encode(), model="m", ttl=3600)
    edge.kv.bulk_put([{"key": entry_key(fp), "value": entry.decode(), "expiration_ttl": 3600}])
    before = edge.origin_requests()
    response = http.post(PATH, json=body)
    assert layer(response) == "kv" and response.json() == answer
    assert response.headers["x-prism-cache-key"] == fp[:16]
    assert edge.origin_requests() == before


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m", "input": ""}, "input"),
        ({"model": "m", "input": "x", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "x"}, "model"),
    ],
)
def test_bad_bodies_are_refused_at_the_edge(
    edge: EdgeStack, http: httpx.Client, body: dict[str, object], param: str
) -> None:
    before = edge.origin_requests()
    response = http.post(PATH, json=body)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == param
    assert edge.origin_requests() == before
