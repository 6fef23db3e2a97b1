"""The origin enforces each project's model policy on every request, over real HTTP with a
real Redis: from the same round trip as the entry lookup, before any entry is served or
any provider is called, and in `/v1/models`."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import httpx
import pytest
import redis

from deploy.local.provider import ProviderServer
from origin.governance.project_policies import ProjectPolicies
from origin.store.redis_cache import Lookup
from prism import KeyRing, PermissionDeniedError, Policy, policy_key
from tests.fixtures.origin import OriginFactory, RunningOrigin

CHAT = "/v1/chat/completions"
MODELS = ("demo", "gpt-4o", "gpt-4o-mini", "o1-mini")


@pytest.fixture
def origin(
    origin_factory: OriginFactory, provider: ProviderServer, tmp_path: Path
) -> RunningOrigin:
    config = tmp_path / "providers.toml"
    routes = "\n".join(f'"{m}" = ["p"]' for m in MODELS)
    config.write_text(f'[providers.p]\nbase_url = "{provider.url}/v1"\n[models]\n{routes}\n')
    return origin_factory(PRISM_PROVIDERS_FILE=str(config))


def set_policy(admin: redis.Redis, project: str = "acme", **fields: object) -> None:
    admin.set(policy_key(project), Policy.parse(json.dumps(fields)).encode())


def body(model: str, **extra: object) -> dict[str, object]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": secrets.token_hex(6)}],
        **extra,
    }


def post(origin: RunningOrigin, key: str, payload: dict[str, object]) -> httpx.Response:
    return httpx.post(
        origin.url + CHAT, json=payload, headers={"authorization": f"Bearer {key}"}, timeout=30
    )


def test_a_denied_model_is_refused_at_once_even_with_an_entry_in_redis(
    origin: RunningOrigin, api_key: str, admin: redis.Redis, provider: ProviderServer
) -> None:
    cached = body("gpt-4o")
    assert post(origin, api_key, cached).headers["x-prism-edge-cache-layer"] == "miss"
    origin.wait_stored()
    assert post(origin, api_key, cached).headers["x-prism-edge-cache-layer"] == "redis"
    calls = provider.control.stats()["chat_requests"]

    set_policy(admin, deny=["gpt-4o*"])
    for payload in (cached, {**cached, "stream": True}, body("gpt-4o-mini")):
        refused = post(origin, api_key, payload)  # at once: no propagation delay here
        assert refused.status_code == 403
        assert refused.json()["error"] == {
            "message": f"Model '{payload['model']}' is not allowed for this project.",
            "type": "permission_error",
            "param": "model",
            "code": "model_not_allowed",
        }
        assert refused.headers["x-prism-edge-cache-layer"] == "bypass"
    assert provider.control.stats()["chat_requests"] == calls  # no provider call
    assert post(origin, api_key, body("demo")).status_code == 200  # not denied: served

    admin.delete(policy_key("acme"))
    assert post(origin, api_key, cached).headers["x-prism-edge-cache-layer"] == "redis"


def test_an_allow_list_refuses_everything_else_and_deny_wins(
    origin: RunningOrigin, api_key: str, admin: redis.Redis
) -> None:
    set_policy(admin, allow=["gpt-4o*", "demo"], deny=["gpt-4o-mini"])
    statuses = {model: post(origin, api_key, body(model)).status_code for model in MODELS}
    assert statuses == {"demo": 200, "gpt-4o": 200, "gpt-4o-mini": 403, "o1-mini": 403}


def test_a_policy_is_per_project(
    origin: RunningOrigin, api_key: str, admin: redis.Redis, key_ring: KeyRing
) -> None:
    set_policy(admin, "globex", deny=["*"])
    assert post(origin, api_key, body("demo")).status_code == 200  # acme: no policy
    assert post(origin, key_ring.mint("globex"), body("demo")).status_code == 403


def test_models_lists_only_what_the_project_may_use(
    origin: RunningOrigin, api_key: str, admin: redis.Redis
) -> None:
    def listed() -> list[str]:
        response = httpx.get(
            origin.url + "/v1/models", headers={"authorization": f"Bearer {api_key}"}
        )
        assert response.status_code == 200
        return [m["id"] for m in response.json()["data"]]

    assert listed() == sorted(MODELS)
    set_policy(admin, deny=["o1*", "gpt-4o-mini"])
    assert listed() == ["demo", "gpt-4o"]
    set_policy(admin, allow=["gpt-*"], revision=2)
    assert listed() == ["gpt-4o", "gpt-4o-mini"]
    admin.delete(policy_key("acme"))
    assert listed() == sorted(MODELS)


def test_a_hand_broken_policy_fails_closed(
    origin: RunningOrigin, api_key: str, admin: redis.Redis
) -> None:
    admin.set(policy_key("acme"), b'{"deny": "not a list"}')
    refused = post(origin, api_key, body("demo"))
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "policy_invalid"


def _commands(admin: redis.Redis) -> dict[str, int]:
    stats = admin.info("commandstats")
    return {name: int(value["calls"]) for name, value in stats.items()}


# Sent on timers, not per request: the admin's INFO, the revoked-set reload, the usage
# flush (one EVAL a second running HINCRBY and EXPIRE), and the request log's batches (a
# second's records: XADD, XTRIM, EXPIRE and SADD, then SET of their id keys).
_BACKGROUND = (
    "cmdstat_info",
    "cmdstat_smembers",
    "cmdstat_eval",
    "cmdstat_hincrby",
    "cmdstat_expire",
    "cmdstat_xadd",
    "cmdstat_xtrim",
    "cmdstat_sadd",
    "cmdstat_set",
)


def test_a_redis_hit_with_a_policy_is_still_one_command(
    origin: RunningOrigin, api_key: str, admin: redis.Redis
) -> None:
    set_policy(admin, deny=["o1*"])
    cached = body("gpt-4o")
    post(origin, api_key, cached)
    origin.wait_stored()
    assert post(origin, api_key, cached).headers["x-prism-edge-cache-layer"] == "redis"
    before = _commands(admin)
    for _ in range(5):
        assert post(origin, api_key, cached).headers["x-prism-edge-cache-layer"] == "redis"
    after = _commands(admin)
    asked = {
        name: after[name] - before.get(name, 0)
        for name in after
        if after[name] != before.get(name, 0) and name not in _BACKGROUND
    }
    # Redis counts the commands a script runs too: per request, the one EVALSHA and inside
    # it SISMEMBER and two GETs (entry, policy); any command sent besides would add to these.
    assert asked == {"cmdstat_evalsha": 5, "cmdstat_sismember": 5, "cmdstat_get": 10}


def test_the_policy_is_parsed_once_and_outlives_a_redis_outage() -> None:
    policies = ProjectPolicies()
    raw = Policy(deny=("o1*",)).encode()
    first = policies.resolve("acme", Lookup(True, False, None, raw))
    assert first is not None
    assert policies.resolve("acme", Lookup(True, False, None, bytes(raw))) is first
    assert policies.resolve("acme", Lookup(False)) is first  # Redis down: the last one seen
    assert policies.resolve("globex", Lookup(False)) is None
    assert policies.resolve("acme", Lookup(True, False, None, None)) is None  # cleared
    assert policies.resolve("acme", Lookup(False)) is None
    with pytest.raises(PermissionDeniedError) as caught:
        policies.resolve("acme", Lookup(True, False, None, b"[]"))
    assert caught.value.code == "policy_invalid"
