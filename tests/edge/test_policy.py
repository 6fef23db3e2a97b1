"""Model policy at the PoP, in the real local Workers runtime with the real origin behind it:
once a project's policy has reached KV, a denied model is refused at the edge (zero origin
requests) and a cached entry is never served for it; the origin refuses it at once."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator

import httpx
import pytest
from typer.testing import CliRunner

from deploy.cli import app
from edge.policy_cache import PolicyCache
from prism import Policy, encode_envelope, entry_key, fingerprint, parse_chat_request, policy_key
from tests.fixtures.edge import EdgeStack
from tests.polling import wait_for

CHAT = "/v1/chat/completions"
PROJECT = "edge-policy"  # its own project: the stack is shared with the other edge tests


@pytest.fixture
def project_key(edge: EdgeStack) -> Iterator[str]:
    runner = CliRunner()
    yield edge.key_ring.mint(PROJECT)
    cleared = runner.invoke(app, ["policy", "clear", "--project", PROJECT], env=edge.cli_env())
    assert cleared.exit_code == 0, cleared.output


def body(model: str, **extra: object) -> dict[str, object]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": secrets.token_hex(6)}],
        **extra,
    }


def post(url: str, key: str, payload: dict[str, object]) -> httpx.Response:
    return httpx.post(
        url + CHAT, json=payload, headers={"authorization": f"Bearer {key}"}, timeout=30
    )


def test_a_denied_model_costs_the_origin_nothing_once_the_policy_has_propagated(
    edge: EdgeStack, project_key: str
) -> None:
    # An entry already at the PoP for the model about to be denied.
    cached = body("o1-mini")
    completion = {
        "id": "chatcmpl-policy",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "o1-mini",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
        ],
    }
    fp = fingerprint(PROJECT, CHAT, parse_chat_request(json.dumps(cached)))
    entry = encode_envelope(json.dumps(completion).encode(), model="o1-mini", ttl=3600)
    edge.kv.bulk_put([{"key": entry_key(fp), "value": entry.decode(), "expiration_ttl": 3600}])
    served = post(edge.url, project_key, cached)
    assert served.status_code == 200 and served.headers["x-prism-edge-cache-layer"] == "kv"

    # With a rate limit too: the edge reads a record that carries one (and leaves it to
    # the origin).
    result = CliRunner().invoke(
        app,
        ["policy", "set", "--project", PROJECT, "--deny", "o1*", "--key-rpm", "1000"],
        env=edge.cli_env(),
    )
    assert result.exit_code == 0, result.output
    # The origin refuses at once (a direct call with the key, as a client may make).
    at_origin = post(edge.origin.url, project_key, body("o1-mini"))
    assert at_origin.status_code == 403
    assert at_origin.json()["error"]["code"] == "model_not_allowed"
    # The edge once its memo (0.5 s in this stack, 60 s by default) has expired.
    wait_for(lambda: post(edge.url, project_key, cached).status_code == 403, timeout=30)

    before = edge.origin_requests()
    for payload in [cached, {**cached, "stream": True}, *[body(f"o1-{i}") for i in range(20)]]:
        refused = post(edge.url, project_key, payload)
        assert refused.status_code == 403
        assert refused.json()["error"] == {
            "message": f"Model '{payload['model']}' is not allowed for this project.",
            "type": "permission_error",
            "param": "model",
            "code": "model_not_allowed",
        }
        assert refused.headers["x-prism-edge-cache-layer"] == "bypass"
    assert edge.origin_requests() == before  # decided at the PoP
    allowed = post(edge.url, project_key, body("demo"))
    assert allowed.status_code == 200, allowed.text
    # The origin counted it against the key's limit; its headers come through the edge.
    assert allowed.headers["x-ratelimit-limit-requests"] == "1000"


def test_an_unreadable_policy_record_at_the_edge_leaves_the_decision_to_the_origin(
    edge: EdgeStack, project_key: str
) -> None:
    edge.kv.bulk_put([{"key": policy_key(PROJECT), "value": "{not json"}])
    try:

        def told() -> httpx.Response | None:
            response = post(edge.url, project_key, body("demo"))
            return response if "policy-error" in response.headers["server-timing"] else None

        response = wait_for(told, timeout=30)
        assert response.status_code == 200  # the origin (no policy in Redis) served it
    finally:
        edge.kv.bulk_delete([policy_key(PROJECT)])


async def test_the_cache_reads_kv_once_per_ttl_and_keeps_the_last_policy_on_failure() -> None:
    records: dict[str, str] = {policy_key("acme"): Policy(deny=("o1*",)).encode().decode()}
    reads: list[str] = []
    failing = False

    async def kv_get(key: str) -> str | None:
        reads.append(key)
        if failing:
            raise TimeoutError
        return records.get(key)

    cache = PolicyCache(ttl=60)
    first = await cache.get("acme", 0.0, kv_get)
    assert first is not None and not first.allows("o1-mini")
    assert await cache.get("acme", 59.0, kv_get) is first
    assert await cache.get("globex", 1.0, kv_get) is None
    assert reads == [policy_key("acme"), policy_key("globex")]
    failing = True
    with pytest.raises(TimeoutError):
        await cache.get("acme", 60.0, kv_get)
    assert cache.last("acme") is first
    assert await cache.get("acme", 61.0, kv_get) is first  # not retried for a ttl
    failing = False
    del records[policy_key("acme")]
    assert await cache.get("acme", 120.0, kv_get) is None  # cleared


INEXACT = ["gpt-4o ", " gpt-4o", "gpt-4o\u200b", "\ufeffgpt-4o", "gpt-4o\u0000", "gpt-4o\n"]
APIS: dict[str, dict[str, object]] = {
    CHAT: {"messages": [{"role": "user", "content": "hi"}]},
    "/v1/embeddings": {"input": "hi"},
    "/v1/messages": {"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
}


def refused_as_inexact(response: httpx.Response, path: str) -> bool:
    error = response.json()["error"]
    if path == "/v1/messages":  # Anthropic's error shape: no param, the message names it
        message: str = error["message"]
        return response.json()["type"] == "error" and message.startswith("'model'")
    return (error["type"], error["param"], error["code"]) == (
        "invalid_request_error",
        "model",
        "invalid_model_name",
    )


def test_an_inexact_model_name_is_a_400_at_the_edge_and_the_origin_and_case_is_no_way_past_a_deny(
    edge: EdgeStack, project_key: str
) -> None:
    result = CliRunner().invoke(
        app, ["policy", "set", "--project", PROJECT, "--deny", "gpt-4o"], env=edge.cli_env()
    )
    assert result.exit_code == 0, result.output
    headers = {"authorization": f"Bearer {project_key}"}

    def denied_at_the_edge() -> bool:  # not the origin's 403: it knows the policy at once
        response = post(edge.url, project_key, body("GPT-4O"))
        return response.status_code == 403 and "origin" not in response.headers["server-timing"]

    wait_for(denied_at_the_edge, timeout=30)

    before = edge.origin_requests()
    degraded = 0  # edge requests whose KV read failed (``*-error`` in Server-Timing)

    def check(url: str, response: httpx.Response) -> None:
        nonlocal degraded
        if url == edge.url and "-error" in response.headers.get("server-timing", ""):
            degraded += 1  # a KV read too slow on a loaded machine: the origin decides

    for path, rest in APIS.items():
        for model in INEXACT:
            for url in (edge.url, edge.origin.url):
                response = httpx.post(
                    url + path, json={"model": model, **rest}, headers=headers, timeout=30
                )
                assert response.status_code == 400, (url, path, model, response.text)
                assert refused_as_inexact(response, path), response.text
                check(url, response)
        # Any case of a denied name is denied, at the PoP and at the origin.
        for url in (edge.url, edge.origin.url):
            response = httpx.post(
                url + path, json={"model": "Gpt-4O", **rest}, headers=headers, timeout=30
            )
            assert response.status_code == 403, (url, path, response.text)
            check(url, response)
    # The origin was asked only by the direct calls (and by an edge request whose KV read
    # failed, which falls through as designed): the edge refused every other one itself.
    assert degraded <= 2
    assert edge.origin_requests() == before + 3 * (len(INEXACT) + 1) + degraded
