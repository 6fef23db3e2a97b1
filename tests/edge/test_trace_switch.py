"""The edge's span is opt-in (PRISM_TRACE): off, a forward carries the client's
traceparent as it came and nothing else of tracing; on, the edge's own span. The handler
runs in-process here with the runtime's side (KV, fetch) recorded."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Coroutine, Mapping
from typing import Any

import pytest

from edge.handler import EdgeHandler
from edge.origins import Location
from edge.platform import EdgeRequest
from edge.settings import EdgeSettings
from prism.trace_context import EDGE_SPAN, TRACEPARENT, parse_traceparent
from tests.fixtures.origin import FORWARD_SECRET, KEY_SECRET

CLIENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


class _Reply:
    status = 200

    def header(self, name: str) -> str | None:
        return "miss" if name == "x-prism-edge-cache-layer" else None

    def headers(self) -> dict[str, str]:
        return {"content-type": "application/json", "x-prism-edge-cache-layer": "miss"}

    async def text(self) -> str:
        return "{}"


class _Recorded:
    """The runtime: KV empty, every origin answering; the forwarded headers kept."""

    def __init__(self) -> None:
        self.forwarded: list[dict[str, str]] = []

    async def read_body(self, limit: int, length: int | None) -> bytes:
        return json.dumps(
            {"model": "demo", "messages": [{"role": "user", "content": "x"}]}
        ).encode()

    async def kv_get(self, key: str) -> str | None:
        return None

    async def kv_put(self, key: str, value: str, ttl: int) -> None:
        return None

    async def fetch_origin(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes | None
    ) -> _Reply:
        self.forwarded.append(dict(headers))
        return _Reply()

    def wait_until(self, work: Coroutine[Any, Any, Any]) -> None:
        work.close()

    def now(self) -> float:
        return 1_800_000_000.0

    def location(self) -> Location:
        return Location("EU", "DE", "FRA")

    def log_error(self, message: str) -> None:
        pass


def forwarded(api_key: str, trace: str | None, client: str | None) -> dict[str, str]:
    env = {
        "PRISM_KEY_SECRET": KEY_SECRET,
        "PRISM_FORWARD_SECRET": FORWARD_SECRET,
        "ORIGIN_URL": "https://origin.example",
    }
    if trace is not None:
        env["PRISM_TRACE"] = trace
    handler = EdgeHandler(EdgeSettings.from_env(env.get))
    platform = _Recorded()
    headers = {"authorization": f"Bearer {api_key}"}
    if client is not None:
        headers[TRACEPARENT] = client
    asyncio.run(handler.handle(EdgeRequest("POST", "/v1/chat/completions", "", headers), platform))
    [sent] = platform.forwarded
    return sent


def test_off_by_default_a_client_traceparent_passes_as_it_came(api_key: str) -> None:
    sent = forwarded(api_key, None, CLIENT)
    assert sent[TRACEPARENT] == CLIENT
    assert EDGE_SPAN not in sent
    assert TRACEPARENT not in forwarded(api_key, "off", None)  # none made up


def test_on_the_edge_starts_its_own_span_in_the_clients_trace(api_key: str) -> None:
    sent = forwarded(api_key, "on", CLIENT)
    ours, theirs = parse_traceparent(sent[TRACEPARENT]), parse_traceparent(CLIENT)
    assert ours is not None and theirs is not None
    assert ours.trace_id == theirs.trace_id and ours.span_id != theirs.span_id
    assert f"parent={theirs.span_id}" in sent[EDGE_SPAN]


def test_a_bad_switch_is_refused() -> None:
    env = {"PRISM_KEY_SECRET": KEY_SECRET, "PRISM_FORWARD_SECRET": FORWARD_SECRET}
    with pytest.raises(ValueError, match="PRISM_TRACE"):
        EdgeSettings.from_env({**env, "ORIGIN_URL": "https://o.example", "PRISM_TRACE": "yes"}.get)
