"""A forward carries the request id the client is told, made at the edge or given, so the
origin's record of a miss is found by the id on the response (`prism logs --id`). The
handler runs in-process here with the runtime's side stood in (tests/fixtures/edge.py)."""

from __future__ import annotations

import asyncio

from edge.handler import EdgeHandler
from edge.origins import Location
from edge.platform import EdgeRequest
from edge.settings import EdgeSettings
from prism import headers as h
from tests.fixtures.edge import OriginReply, StubPlatform
from tests.fixtures.origin import FORWARD_SECRET, KEY_SECRET

ENV = {
    "PRISM_KEY_SECRET": KEY_SECRET,
    "PRISM_FORWARD_SECRET": FORWARD_SECRET,
    "ORIGIN_URL": "https://origin.example",
}


def forward(api_key: str, **given: str) -> tuple[str, str]:
    """(the id the origin was sent, the id the client was told) for one miss."""
    handler = EdgeHandler(EdgeSettings.from_env(ENV.get))
    platform = StubPlatform(
        lambda: OriginReply(headers={h.CACHE_LAYER: "miss"}, body="{}"), Location("EU", "DE", "FRA")
    )
    headers = {"authorization": f"Bearer {api_key}", **given}
    response = asyncio.run(
        handler.handle(EdgeRequest("POST", "/v1/chat/completions", "", headers), platform)
    )
    [(_, sent, _)] = platform.sent
    return sent[h.REQUEST_ID], response.headers[h.REQUEST_ID]


def test_the_origin_is_sent_the_id_the_edge_made_for_the_client(api_key: str) -> None:
    sent, told = forward(api_key)
    assert sent == told and told


def test_a_given_id_goes_to_the_origin_as_given(api_key: str) -> None:
    assert forward(api_key, **{h.REQUEST_ID: "walk-7"}) == ("walk-7", "walk-7")
