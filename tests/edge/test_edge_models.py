"""``GET /v1/models`` at the PoP: the list the origin publishes to Workers KV (its named
routes and its wildcard routes' providers' own models), filtered by the project's model
policy; forwarded to the origin while KV has none."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import openai
import pytest
from typer.testing import CliRunner

from deploy.cli import app
from deploy.local.provider_models import OPENAI_MODELS
from prism import Policy, policy_key
from prism.routes import MODELS_KEY
from tests.fixtures.edge import EdgeStack
from tests.polling import wait_for

PROJECT = "edge-models"  # its own project: the stack is shared with the other edge tests
LISTED = {
    "object": "list",
    "data": [
        {"id": name, "object": "model", "created": 1, "owned_by": "prism"}
        for name in ("claude-opus", "gpt-4o", "gpt-4o-mini")
    ],
}


def layer(response: httpx.Response) -> str:
    return response.headers["x-prism-edge-cache-layer"]


@pytest.fixture
def published(edge: EdgeStack) -> Iterator[str]:
    """The list the origin published, swapped for ``LISTED``; put back afterwards."""
    wait_for(lambda: edge.kv.get(MODELS_KEY) is not None)
    original = edge.kv.get_text(MODELS_KEY)
    assert original is not None
    edge.kv.bulk_put([{"key": MODELS_KEY, "value": json.dumps(LISTED)}])
    yield original
    edge.kv.bulk_put([{"key": MODELS_KEY, "value": original}])
    edge.kv.bulk_delete([policy_key(PROJECT)])


def test_the_origin_publishes_its_list_as_it_answers_it(edge: EdgeStack, api_key: str) -> None:
    wait_for(lambda: edge.kv.get(MODELS_KEY) is not None)
    served = httpx.get(
        edge.origin.url + "/v1/models", headers={"authorization": f"Bearer {api_key}"}
    )
    assert json.loads(edge.kv.get_text(MODELS_KEY) or "") == served.json()


def test_the_list_is_filtered_by_the_policy_at_the_pop(edge: EdgeStack, published: str) -> None:
    key = edge.key_ring.mint(PROJECT)
    headers = {"authorization": f"Bearer {key}"}
    names = ["claude-opus", "gpt-4o", "gpt-4o-mini"]

    def listed() -> list[str]:
        response = httpx.get(edge.url + "/v1/models", headers=headers, timeout=30)
        assert response.status_code == 200 and layer(response) == "kv"
        return [m["id"] for m in response.json()["data"]]

    wait_for(lambda: listed() == names)
    policy = Policy.parse(json.dumps({"deny": ["gpt-4o*"]}))
    edge.kv.bulk_put([{"key": policy_key(PROJECT), "value": policy.encode().decode()}])
    before = edge.origin_requests()
    wait_for(lambda: listed() == ["claude-opus"])
    assert edge.origin_requests() == before


def test_without_a_published_list_the_origin_answers(
    edge: EdgeStack, api_key: str, published: str
) -> None:
    edge.kv.bulk_delete([MODELS_KEY])
    headers = {"authorization": f"Bearer {api_key}"}
    wait_for(lambda: layer(httpx.get(edge.url + "/v1/models", headers=headers, timeout=30)) != "kv")
    before = edge.origin_requests()
    forwarded = httpx.get(edge.url + "/v1/models", headers=headers, timeout=30)
    assert forwarded.status_code == 200 and forwarded.json()["object"] == "list"
    assert edge.origin_requests() == before + 1


def test_no_cache_asks_the_origin_itself(edge: EdgeStack, api_key: str) -> None:
    headers = {"authorization": f"Bearer {api_key}"}
    wait_for(lambda: layer(httpx.get(edge.url + "/v1/models", headers=headers)) == "kv")
    before = edge.origin_requests()
    fresh = httpx.get(edge.url + "/v1/models", headers={**headers, "cache-control": "no-cache"})
    assert fresh.status_code == 200 and layer(fresh) != "kv"
    assert edge.origin_requests() == before + 1


def test_the_openai_sdk_lists_the_providers_models_minus_the_denied(edge: EdgeStack) -> None:
    # The stack's origin has OPENAI_API_KEY's default configuration: one "*" route to the
    # provider stand-in, no named route; its list is the stand-in's own.
    assert list(edge.origin.gateway.settings.providers.routes) == ["*"]
    project = "edge-models-sdk"
    runner = CliRunner()
    denied = runner.invoke(
        app, ["policy", "set", "--project", project, "--deny", "gpt-4o"], env=edge.cli_env()
    )
    assert denied.exit_code == 0, denied.output
    try:
        key = edge.key_ring.mint(project)
        sdk = openai.OpenAI(base_url=edge.url + "/v1", api_key=key, max_retries=0)
        expected = sorted(set(OPENAI_MODELS) - {"gpt-4o"})
        with sdk:
            wait_for(lambda: [m.id for m in sdk.models.list()] == expected, timeout=30)
            before = edge.origin_requests()
            raw = sdk.models.with_raw_response.list()
            assert raw.headers["x-prism-edge-cache-layer"] == "kv"  # from the PoP
            models = list(raw.parse())
            assert edge.origin_requests() == before
        assert [m.id for m in models] == expected
        for model in models:
            created, owned_by = OPENAI_MODELS[model.id]
            assert (model.object, model.created, model.owned_by) == ("model", created, owned_by)
        # The origin itself says the same for this key.
        at_origin = httpx.get(
            edge.origin.url + "/v1/models", headers={"authorization": f"Bearer {key}"}
        )
        assert [m["id"] for m in at_origin.json()["data"]] == expected
    finally:
        cleared = runner.invoke(app, ["policy", "clear", "--project", project], env=edge.cli_env())
        assert cleared.exit_code == 0, cleared.output
