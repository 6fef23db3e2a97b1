"""Auth (keys, edge forwards, revocation) and bad input at the origin, over real HTTP."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from deploy.local.provider import ProviderServer
from prism import REVOKED_KEY, KeyRing, canonical_document, parse_chat_request, sign_forward
from prism import fingerprint as prism_fingerprint
from tests.fixtures.origin import FORWARD_SECRET, OriginFactory, RunningOrigin

CHAT = "/v1/chat/completions"
BODY = {"model": "demo", "messages": [{"role": "user", "content": "auth test"}]}


def chat(
    origin: RunningOrigin, headers: dict[str, str], content: bytes | None = None
) -> httpx.Response:
    return httpx.post(
        origin.url + "/v1/chat/completions",
        content=json.dumps(BODY).encode() if content is None else content,
        headers={"content-type": "application/json", **headers},
        timeout=30,
    )


@pytest.mark.parametrize(
    "authorization",
    [
        "",
        "Bearer",
        "Bearer sk-random",
        "Basic abc",
        "Bearer sk-prism-v1.acme.0123456789abcdef." + "A" * 43,
    ],
)
def test_bad_keys_get_401_and_no_provider_call(
    origin: RunningOrigin, provider: ProviderServer, authorization: str
) -> None:
    response = chat(origin, {"authorization": authorization} if authorization else {})
    assert response.status_code == 401
    assert response.json()["error"]["type"] == "authentication_error"
    assert provider.control.stats()["chat_requests"] == 0


def test_revoked_key_is_refused(origin: RunningOrigin, key_ring: KeyRing, redis_url: str) -> None:
    key = key_ring.mint("acme")
    assert chat(origin, {"authorization": f"Bearer {key}"}).status_code == 200
    client = redis.Redis.from_url(redis_url)
    client.sadd(REVOKED_KEY, key_ring.verify(key).key_id)
    client.close()
    response = chat(origin, {"authorization": f"Bearer {key}"})
    assert response.status_code == 401 and response.json()["error"]["code"] == "key_revoked"


def test_signed_edge_forward_is_trusted_and_its_fingerprint_used(
    origin: RunningOrigin, provider: ProviderServer
) -> None:
    fingerprint = prism_fingerprint("acme", CHAT, parse_chat_request(json.dumps(BODY)))
    header = sign_forward(
        FORWARD_SECRET.encode(),
        method="POST",
        path=CHAT,
        project="acme",
        key_id="edgekey01",
        fingerprint=fingerprint,
        now=time.time(),
    )
    first = chat(origin, {"x-prism-forward": header})
    assert first.status_code == 200
    assert first.headers["x-prism-cache-key"] == fingerprint[:16]
    origin.wait_stored()
    second = chat(origin, {"x-prism-forward": header})
    assert second.headers["x-prism-edge-cache-layer"] == "redis"
    assert provider.control.stats()["chat_requests"] == 1


@pytest.mark.parametrize("kind", ["forged", "expired", "garbage"])
def test_bad_edge_forwards_are_refused(
    origin: RunningOrigin, provider: ProviderServer, kind: str
) -> None:
    secret = b"not-the-forward-secret-000" if kind == "forged" else FORWARD_SECRET.encode()
    now = time.time() - 3600 if kind == "expired" else time.time()
    header = sign_forward(
        secret,
        method="POST",
        path=CHAT,
        project="acme",
        key_id="edgekey01",
        fingerprint="a" * 64,
        now=now,
    )
    if kind == "garbage":
        header = "v1.not.a.real.header"
    response = chat(origin, {"x-prism-forward": header})
    assert response.status_code == 401
    assert response.json()["error"]["code"] in ("invalid_forward", "forward_expired")
    assert provider.control.stats()["chat_requests"] == 0


@pytest.mark.parametrize(
    ("content", "status", "param"),
    [
        (b"{not json", 400, None),
        (b"[]", 400, None),
        (b'{"model":"demo"}', 400, "messages"),
        (
            b'{"model":"demo","messages":[{"role":"user","content":"x"}],"temperature":"hot"}',
            400,
            "temperature",
        ),
        (
            b'{"model":"demo","messages":[{"role":"user","content":"x"}],"x":'
            + b"[" * 5000
            + b"]" * 5000
            + b"}",
            400,
            None,
        ),
        (
            b'{"model":"demo","messages":[{"role":"user","content":"'
            + b"x" * (5 * 1024 * 1024)
            + b'"}]}',
            413,
            None,
        ),
    ],
)
def test_bad_bodies_get_openai_errors(
    client: httpx.Client, provider: ProviderServer, content: bytes, status: int, param: str | None
) -> None:
    response = client.post(
        "/v1/chat/completions", content=content, headers={"content-type": "application/json"}
    )
    assert response.status_code == status
    error = response.json()["error"]
    assert error["param"] == param and error["message"]
    assert provider.control.stats()["chat_requests"] == 0
    assert client.get("/healthz").json()["status"] == "ok"  # still serving


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("fragment", "param"),
    [
        (b'"seed":123456789012345678901234567890', "seed"),
        (b'"metadata":{"n":-99999999999999999999}', "metadata.n"),
        (b'"user":"\\ud800"', "user"),
    ],
)
def test_values_no_provider_accepts_get_a_400_not_a_hang(
    client: httpx.Client, provider: ProviderServer, fragment: bytes, param: str, stream: bool
) -> None:
    flag = b"true" if stream else b"false"
    content = (
        b'{"model":"demo","messages":[{"role":"user","content":"x"}],"stream":'
        + flag
        + b","
        + fragment
        + b"}"
    )
    response = client.post(
        "/v1/chat/completions",
        content=content,
        headers={"content-type": "application/json"},
        timeout=10,
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == param
    assert provider.control.stats()["chat_requests"] == 0


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("model", ["demo ", " demo", "demo\u200b", "\ufeffdemo", "de\u0000mo"])
def test_an_inexact_model_name_is_a_400_naming_the_model_not_a_provider_call(
    client: httpx.Client, provider: ProviderServer, model: str, stream: bool
) -> None:
    response = client.post(
        "/v1/chat/completions",
        json={**BODY, "model": model, "stream": stream},
        timeout=10,
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["type"], error["param"], error["code"]) == (
        "invalid_request_error",
        "model",
        "invalid_model_name",
    )
    assert "exact model name" in error["message"]
    assert provider.control.stats()["chat_requests"] == 0
    assert client.post("/v1/chat/completions", json=BODY).status_code == 200


def test_chunked_upload_over_the_limit_is_413(origin_factory: OriginFactory, api_key: str) -> None:
    origin = origin_factory(PRISM_MAX_BODY_BYTES="1000")

    def body() -> Iterator[bytes]:
        for _ in range(20):
            yield b"x" * 100

    response = httpx.post(
        origin.url + "/v1/chat/completions",
        content=body(),
        headers={"authorization": f"Bearer {api_key}"},
    )
    assert response.status_code == 413


def test_unknown_model_is_404(
    origin_factory: OriginFactory, api_key: str, provider: ProviderServer, tmp_path: Path
) -> None:
    config = tmp_path / "p.toml"
    config.write_text(f'[providers.p]\nbase_url = "{provider.url}/v1"\n[models]\n"demo" = ["p"]\n')
    origin = origin_factory(PRISM_PROVIDERS_FILE=str(config))
    response = chat(
        origin,
        {"authorization": f"Bearer {api_key}"},
        json.dumps({**BODY, "model": "gpt-9"}).encode(),
    )
    assert response.status_code == 404 and response.json()["error"]["code"] == "model_not_found"
    models = httpx.get(
        origin.url + "/v1/models", headers={"authorization": f"Bearer {api_key}"}
    ).json()
    assert [m["id"] for m in models["data"]] == ["demo"]


def test_cache_control_no_store_and_no_cache(
    client: httpx.Client, provider: ProviderServer
) -> None:
    body = {"model": "demo", "messages": [{"role": "user", "content": "cache-control"}]}
    first = client.post("/v1/chat/completions", json=body, headers={"cache-control": "no-store"})
    assert first.headers["x-prism-edge-cache-layer"] == "miss"
    assert (
        client.post("/v1/chat/completions", json=body).headers["x-prism-edge-cache-layer"] == "miss"
    )
    deadline = time.monotonic() + 5
    while (
        client.post("/v1/chat/completions", json=body).headers["x-prism-edge-cache-layer"]
        != "redis"
    ):
        assert time.monotonic() < deadline
    fresh = client.post("/v1/chat/completions", json=body, headers={"cache-control": "no-cache"})
    assert fresh.headers["x-prism-edge-cache-layer"] == "miss"
    bypass = client.post(
        "/v1/chat/completions", json=body, headers={"cache-control": "no-cache, no-store"}
    )
    assert bypass.headers["x-prism-edge-cache-layer"] == "bypass"


def test_metrics_count_and_time_requests_by_layer(
    client: httpx.Client, origin: RunningOrigin
) -> None:
    body = {"model": "demo", "messages": [{"role": "user", "content": "metrics"}]}
    client.post("/v1/chat/completions", json=body)
    deadline = time.monotonic() + 5
    while (
        client.post("/v1/chat/completions", json=body).headers["x-prism-edge-cache-layer"]
        != "redis"
    ):
        assert time.monotonic() < deadline
    text = httpx.get(origin.admin_url + "/metrics").text
    assert 'prism_origin_requests_total{layer="miss",route="chat",status="200"} 1.0' in text
    assert 'layer="redis",route="chat",status="200"' in text
    assert "prism_provider_latency_seconds_bucket" in text
    # Every request counted is also timed (to its response head).
    assert 'prism_origin_request_duration_seconds_count{layer="miss",route="chat"} 1.0' in text
    hits = origin.metric("prism_origin_requests_total", route="chat", status="200", layer="redis")
    timed = origin.metric(
        "prism_origin_request_duration_seconds_count", route="chat", layer="redis"
    )
    assert hits >= 1 and timed == hits


def test_fingerprint_matches_the_shared_core(client: httpx.Client) -> None:
    from prism import fingerprint

    body = {"model": "demo", "messages": [{"role": "user", "content": "fp"}], "temperature": 0.0}
    response = client.post("/v1/chat/completions", json=body)
    expected = fingerprint(
        "acme", "/v1/chat/completions", parse_chat_request(json.dumps(body).encode())
    )
    assert response.headers["x-prism-cache-key"] == expected[:16]
    assert (
        canonical_document("acme", "/v1/chat/completions", parse_chat_request(json.dumps(body)))[
            "project"
        ]
        == "acme"
    )
