"""Partitions hold whatever the threshold: at threshold 0 (any question scores above it)
a project, a model or a system prompt never gets another one's answer, through the real
origin, a real Redis and the real model."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import redis

from deploy.local.provider import ProviderServer
from tests.fixtures.origin import RunningOrigin
from tests.fixtures.semantic import CHAT, LAYER, QUESTION, ask, calls, first, opt_in

pytest.importorskip("numpy", reason="the semantic extra is not installed")

UNRELATED = "How do I bake sourdough bread at home?"


def test_at_threshold_0_nothing_crosses_a_partition(
    client: httpx.Client,
    origin: RunningOrigin,
    admin: redis.Redis,
    provider: ProviderServer,
    key_ring: Any,
) -> None:
    opt_in(admin, threshold=0)
    opt_in(admin, "globex", threshold=0)
    first(client, origin, ask(QUESTION))
    globex = httpx.Client(
        base_url=origin.url,
        headers={"authorization": f"Bearer {key_ring.mint('globex')}"},
        timeout=30,
    )
    with globex:
        first(globex, origin, ask(QUESTION))  # the very same question
    for other in (
        ask(QUESTION, model="gpt-4o-mini"),
        {
            "model": "demo",
            "messages": [
                {"role": "system", "content": "Answer in French."},
                {"role": "user", "content": QUESTION},
            ],
        },
    ):
        first(client, origin, other)
    assert calls(provider) == 4
    # Within the partition, threshold 0 really is 0: an unrelated question is a hit.
    response = client.post(CHAT, json=ask(UNRELATED))
    assert response.headers[LAYER] == "semantic"
    assert calls(provider) == 4
