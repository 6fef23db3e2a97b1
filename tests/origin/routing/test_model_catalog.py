"""``/v1/models`` from the model catalog, over real HTTP against the provider stand-in: a
wildcard route lists what its providers list (OpenAI's one page, Anthropic's pages), a
pattern route only what it would serve, refreshed in the background, kept when a refresh
fails, republished to Workers KV when it changes."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest

from deploy.local.provider import ProviderServer
from deploy.local.provider_models import ANTHROPIC_MODELS, OPENAI_MODELS
from origin.settings import Settings, SettingsError
from prism.routes import MODELS_KEY
from tests.fixtures.origin import FORWARD_SECRET, KEY_SECRET, OriginFactory, RunningOrigin
from tests.fixtures.workers import KVApi
from tests.polling import wait_for

FAST = "0.2"  # PRISM_MODELS_REFRESH_INTERVAL for the tests that watch a refresh


def listed(origin: RunningOrigin, key: str) -> list[dict[str, object]]:
    response = httpx.get(origin.url + "/v1/models", headers={"authorization": f"Bearer {key}"})
    assert response.status_code == 200
    data: list[dict[str, object]] = response.json()["data"]
    return data


def ids(origin: RunningOrigin, key: str) -> list[str]:
    return [str(model["id"]) for model in listed(origin, key)]


def test_the_default_wildcard_route_lists_the_providers_own_models(
    origin_factory: OriginFactory, api_key: str, provider: ProviderServer
) -> None:
    origin = origin_factory()  # OPENAI_API_KEY only: the "*" route to the stand-in
    wait_for(lambda: ids(origin, api_key) == sorted(OPENAI_MODELS))
    sdk = openai.OpenAI(base_url=origin.url + "/v1", api_key=api_key, max_retries=0)
    with sdk:
        models = {model.id: model for model in sdk.models.list()}
    assert set(models) == set(OPENAI_MODELS)
    for name, (created, owned_by) in OPENAI_MODELS.items():
        assert models[name].object == "model"
        assert (models[name].created, models[name].owned_by) == (created, owned_by)
    # Asked with the gateway's key for the provider, in OpenAI's way.
    assert provider.control.stats()["model_lists"] == {"openai": 1}
    assert origin.metric("prism_model_list_fetches_total", provider="openai", outcome="ok") == 1
    assert origin.metric("prism_models_listed") == len(OPENAI_MODELS)


def test_pattern_routes_list_only_what_they_would_serve_and_anthropic_is_read_page_by_page(
    origin_factory: OriginFactory, api_key: str, provider: ProviderServer, tmp_path: Path
) -> None:
    config = tmp_path / "providers.toml"
    config.write_text(
        f"""
[providers.oa]
base_url = "{provider.url}/v1"
api_key = "provider-test-key"

[providers.an]
kind = "anthropic"
base_url = "{provider.url}"
api_key = "provider-test-key"

[models]
"fast" = ["oa:gpt-4o-mini"]
"gpt-4o" = ["oa"]
"gpt-*" = ["oa"]
"claude-*" = ["an", "oa"]
"*" = ["oa:gpt-4o-mini"]
"""
    )
    origin = origin_factory(PRISM_PROVIDERS_FILE=str(config))
    claude = sorted(ANTHROPIC_MODELS)
    gpt = sorted(m for m in OPENAI_MODELS if m.startswith("gpt-") and m != "gpt-4o")
    expected = sorted(["fast", "gpt-4o", *gpt, *claude])
    wait_for(lambda: ids(origin, api_key) == expected)
    by_id = {model["id"]: model for model in listed(origin, api_key)}
    # Named routes are Prism's names; the rest say whose they are, as the provider said.
    assert by_id["fast"]["owned_by"] == by_id["gpt-4o"]["owned_by"] == "prism"
    assert by_id["gpt-3.5-turbo"]["owned_by"] == "openai"
    assert by_id["gpt-4o-mini"]["owned_by"] == "system"
    assert by_id["claude-3-7-sonnet-20250219"] == {
        "id": "claude-3-7-sonnet-20250219",
        "object": "model",
        "created": 1739923200,  # 2025-02-19T00:00:00Z
        "owned_by": "an",  # Anthropic names no owner: the provider's name in the config
    }
    # Not listed: o1-mini, text-embedding-3-small, prism-local-echo (only "*" would take
    # them, and it sends every name to one fixed model).
    # Anthropic's five models came in two pages of at most three (the stand-in's page).
    assert provider.control.stats()["model_lists"] == {"openai": 1, "anthropic": 2}


def test_the_list_refreshes_and_a_failed_refresh_keeps_the_last(
    origin_factory: OriginFactory, api_key: str, provider: ProviderServer
) -> None:
    # The provider's list fails from the start: the origin starts anyway, lists nothing.
    provider.control.set_fault("status", count=-1, status=503, endpoint="models")
    origin = origin_factory(PRISM_MODELS_REFRESH_INTERVAL=FAST)

    def failed() -> float:
        return origin.metric("prism_model_list_fetches_total", provider="openai", outcome="failed")

    wait_for(lambda: failed() >= 1)
    assert ids(origin, api_key) == []
    chat = {"model": "gpt-4o", "messages": [{"role": "user", "content": "catalog"}]}
    headers = {"authorization": f"Bearer {api_key}"}
    served = httpx.post(origin.url + "/v1/chat/completions", json=chat, headers=headers)
    assert served.status_code == 200  # a list's failure is never a request's

    provider.control.clear()  # the provider recovers: the next refresh lists its models
    wait_for(lambda: ids(origin, api_key) == sorted(OPENAI_MODELS))

    provider.control.set_fault("status", count=-1, status=500, endpoint="models")
    before = failed()
    wait_for(lambda: failed() >= before + 2)  # two failed refreshes later
    assert ids(origin, api_key) == sorted(OPENAI_MODELS)  # the last list, kept
    provider.control.clear()
    provider.control.set_fault("malformed_json", count=-1, endpoint="models")
    before = failed()
    wait_for(lambda: failed() >= before + 1)
    assert ids(origin, api_key) == sorted(OPENAI_MODELS)
    provider.control.clear()


def test_the_list_is_republished_to_kv_when_it_changes(
    origin_factory: OriginFactory, api_key: str, provider: ProviderServer, kv_api_reset: KVApi
) -> None:
    kv = kv_api_reset
    kv.bulk_delete([MODELS_KEY])
    provider.control.set_fault("status", count=-1, status=503, endpoint="models")
    origin = origin_factory(
        **kv.settings(), PRISM_KV_FLUSH_INTERVAL="0.05", PRISM_MODELS_REFRESH_INTERVAL=FAST
    )

    def published() -> list[str] | None:
        text = kv.get_text(MODELS_KEY)
        return None if text is None else [m["id"] for m in json.loads(text)["data"]]

    # Published once its first refresh was done (failed: the named routes, here none).
    wait_for(lambda: published() == [])
    provider.control.clear()
    wait_for(lambda: published() == sorted(OPENAI_MODELS))
    assert json.loads(kv.get_text(MODELS_KEY) or "") == {
        "object": "list",
        "data": listed(origin, api_key),
    }


@pytest.mark.parametrize("value", ["0", "-1", "86401", "soon"])
def test_the_refresh_interval_is_checked(value: str) -> None:
    env = {
        "PRISM_KEY_SECRET": KEY_SECRET,
        "PRISM_FORWARD_SECRET": FORWARD_SECRET,
        "PRISM_MODELS_REFRESH_INTERVAL": value,
    }
    with pytest.raises(SettingsError, match="PRISM_MODELS_REFRESH_INTERVAL"):
        Settings.from_env(env)
    assert (
        Settings.from_env({**env, "PRISM_MODELS_REFRESH_INTERVAL": "60"}).models_refresh_interval
        == 60
    )
