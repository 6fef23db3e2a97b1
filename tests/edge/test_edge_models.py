"""``GET /v1/models`` at the PoP: the list the origin publishes to Workers KV, filtered by
the project's model policy; forwarded to the origin while KV has none."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

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
