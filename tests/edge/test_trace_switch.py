"""The edge's span is opt-in (PRISM_TRACE): off, a forward carries the client's
traceparent as it came and nothing else of tracing; on, the edge's own span. The handler
runs in-process here with the runtime's side stood in (tests/fixtures/edge.py)."""

from __future__ import annotations

import asyncio

import pytest

from edge.handler import EdgeHandler
from edge.origins import Location
from edge.platform import EdgeRequest
from edge.settings import EdgeSettings
from prism.trace_context import EDGE_SPAN, TRACEPARENT, parse_traceparent
from tests.fixtures.edge import OriginReply, StubPlatform
from tests.fixtures.origin import FORWARD_SECRET, KEY_SECRET

MISS = {"x-prism-edge-cache-layer": "miss"}
CLIENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def forwarded(api_key: str, trace: str | None, client: str | None) -> dict[str, str]:
    env = {
        "PRISM_KEY_SECRET": KEY_SECRET,
        "PRISM_FORWARD_SECRET": FORWARD_SECRET,
        "ORIGIN_URL": "https://origin.example",
    }
    if trace is not None:
        env["PRISM_TRACE"] = trace
    handler = EdgeHandler(EdgeSettings.from_env(env.get))
    platform = StubPlatform(
        lambda: OriginReply(headers=MISS, body="{}"), Location("EU", "DE", "FRA")
    )
    headers = {"authorization": f"Bearer {api_key}"}
    if client is not None:
        headers[TRACEPARENT] = client
    asyncio.run(handler.handle(EdgeRequest("POST", "/v1/chat/completions", "", headers), platform))
    [(_, sent, _)] = platform.sent
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
