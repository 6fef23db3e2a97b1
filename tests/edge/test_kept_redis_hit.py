"""A Redis hit the origin sends is also written to KV by the edge: with the answer's token
usage, as the origin's own entries have it, so a later KV hit on it counts what it saved
(its record's tokens; usage's saved_micros). The handler runs in-process here with the
runtime's side stood in (tests/fixtures/edge.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Coroutine
from typing import Any

from edge.handler import EdgeHandler
from edge.origins import Location
from edge.platform import EdgeRequest
from edge.settings import EdgeSettings
from prism import decode_envelope
from prism import headers as h
from tests.fixtures.edge import OriginReply, StubPlatform
from tests.fixtures.origin import FORWARD_SECRET, KEY_SECRET

ENV = {
    "PRISM_KEY_SECRET": KEY_SECRET,
    "PRISM_FORWARD_SECRET": FORWARD_SECRET,
    "ORIGIN_URL": "https://origin.example",
}
USAGE = {"prompt_tokens": 9, "completion_tokens": 11, "total_tokens": 20}


class KeepingPlatform(StubPlatform):
    """The stand-in, with what is put in KV kept and the after-response work run."""

    def __init__(self, body: str) -> None:
        expires = str(1_800_000_000 + 3600)
        headers = {h.CACHE_LAYER: "redis", h.ENTRY_EXPIRES: expires}
        super().__init__(
            lambda: OriginReply(headers=headers, body=body), Location("EU", "DE", "FRA")
        )
        self.later: list[Coroutine[Any, Any, Any]] = []
        self.put: dict[str, str] = {}

    def wait_until(self, work: Coroutine[Any, Any, Any]) -> None:
        self.later.append(work)

    async def kv_put(self, key: str, value: str, ttl: int) -> None:
        self.put[key] = value


def kept(api_key: str, body: str) -> dict[str, Any] | None:
    """The usage in the entry the edge put in KV for a Redis hit answering ``body``."""
    handler = EdgeHandler(EdgeSettings.from_env({**ENV, "PRISM_REQUEST_LOG": "off"}.get))
    platform = KeepingPlatform(body)
    request = EdgeRequest(
        "POST", "/v1/chat/completions", "", {"authorization": f"Bearer {api_key}"}
    )

    async def serve() -> None:
        response = await handler.handle(request, platform)
        assert response.status == 200 and response.headers[h.CACHE_LAYER] == "redis"
        for work in platform.later:
            await work

    asyncio.run(serve())
    [value] = platform.put.values()
    envelope = decode_envelope(value, 1_800_000_000)
    assert envelope is not None and envelope.body == body.encode()
    return envelope.usage


def test_the_entry_kept_from_a_redis_hit_has_the_answers_usage(api_key: str) -> None:
    answer = {"id": "chatcmpl-1", "object": "chat.completion", "choices": [], "usage": USAGE}
    assert kept(api_key, json.dumps(answer)) == USAGE


def test_an_answer_without_usage_is_kept_without(api_key: str) -> None:
    assert kept(api_key, json.dumps({"id": "chatcmpl-2", "choices": []})) is None
    assert kept(api_key, '["not", "an", "answer"]') is None
