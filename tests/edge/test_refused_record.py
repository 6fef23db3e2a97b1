"""A key the edge refuses is told to the origin as a record with its one stage (auth) and
without the key: the batch the isolate sends after the response is read here as the origin
would. The handler runs in-process with the runtime's side stood in (tests/fixtures/edge.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Coroutine
from typing import Any

from edge.handler import EdgeHandler
from edge.origins import Location
from edge.platform import EdgeRequest
from edge.request_log import FIELDS
from edge.settings import EdgeSettings
from prism import parse_key_secrets
from prism.routes import REQUEST_LOG_PATH
from tests.fixtures.edge import OriginReply, StubPlatform
from tests.fixtures.origin import FORWARD_SECRET, KEY_SECRET

ENV = {
    "PRISM_KEY_SECRET": KEY_SECRET,
    "PRISM_FORWARD_SECRET": FORWARD_SECRET,
    "ORIGIN_URL": "https://origin.example",
}


class SendingPlatform(StubPlatform):
    """The stand-in, with the after-response work run and the origin taking batches."""

    def __init__(self) -> None:
        super().__init__(lambda: OriginReply(status=204), Location("EU", "DE", "FRA"))
        self.later: list[Coroutine[Any, Any, Any]] = []

    def wait_until(self, work: Coroutine[Any, Any, Any]) -> None:
        self.later.append(work)


def test_a_refused_key_is_a_record_with_its_auth_stage_and_without_the_key() -> None:
    forged = parse_key_secrets("another-secret-0123456789abcdef01").mint("acme")
    handler = EdgeHandler(EdgeSettings.from_env(ENV.get))
    platform = SendingPlatform()
    request = EdgeRequest("POST", "/v1/chat/completions", "", {"authorization": f"Bearer {forged}"})

    async def serve() -> int:
        response = await handler.handle(request, platform)
        for work in platform.later:
            await work
        return response.status

    assert asyncio.run(serve()) == 401
    [(url, _, body)] = platform.sent
    assert url.endswith(REQUEST_LOG_PATH) and body is not None
    [row] = json.loads(body)["records"]
    record = dict(zip(FIELDS, row, strict=True))
    assert (record["status"], record["layer"], record["error"]) == (
        401,
        "refused",
        "invalid_api_key",
    )
    assert record["stages"].startswith("auth;dur=")
    assert forged.rsplit(".", 1)[-1] not in body.decode()
