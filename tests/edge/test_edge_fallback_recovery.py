"""Through the edge in the real local Workers runtime: a fallback's answer is never kept at
the PoP, so once the route's primary is back the edge serves the primary's answer too (its
own edge and origin, a flapping primary stand-in in front of the session's provider)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from deploy.local.provider import ProviderServer
from deploy.local.redis import RedisServer
from prism import KeyRing
from tests.fixtures.edge import EdgeStack, edge_with_providers
from tests.fixtures.workers import WorkersRuntimeFactory
from tests.origin.routing import test_fallback_recovery as flapping
from tests.origin.routing.test_fallback_recovery import flapping_config, from_primary, recover

pytestmark = pytest.mark.timeout(180)


primary = flapping.primary  # the same flapping primary as the origin's test


@pytest.fixture
def flapping_edge(
    tmp_path: Path,
    workers_runtime_factory: WorkersRuntimeFactory,
    edge_redis: RedisServer,
    provider_server: ProviderServer,
    primary: ProviderServer,
    key_ring: KeyRing,
) -> Iterator[EdgeStack]:
    config = flapping_config(tmp_path, primary, provider_server)
    with edge_with_providers(
        tmp_path, workers_runtime_factory, edge_redis, provider_server, key_ring, config
    ) as stack:
        yield stack


def test_the_edge_serves_the_primary_once_it_is_back_never_a_kept_fallback(
    flapping_edge: EdgeStack, primary: ProviderServer, api_key: str
) -> None:
    layers: list[str] = []

    def ask(content: str) -> httpx.Response:
        body = {"model": "demo", "messages": [{"role": "user", "content": content}]}
        answer = httpx.post(
            flapping_edge.url + "/v1/chat/completions",
            json=body,
            headers={"authorization": f"Bearer {api_key}"},
            timeout=30,
        )
        assert answer.status_code == 200, answer.text
        return answer

    primary.stop()
    for index in range(4):  # demoted: its failures in a row
        ask(f"edge, while it is down {index} {time.monotonic()}")
    question = f"the flapping question at the edge {time.monotonic()}"
    first = ask(question)
    assert first.headers["x-prism-provider"] == "backup"
    for _ in range(3):  # the fallback's answer: from Redis, never from the PoP's KV
        again = ask(question)
        layers.append(again.headers["x-prism-edge-cache-layer"])
        assert again.content == first.content
    assert "kv" not in layers

    answer, took = recover(primary, ask, question)
    assert took <= 15 and answer.headers["x-prism-edge-cache-layer"] == "miss"
    assert from_primary(answer)
