"""The edge tells what went wrong: a failure it survives is logged and named in
Server-Timing; one it does not survive is an OpenAI-shaped 500, never a runtime page."""

from __future__ import annotations

import asyncio
import json
import secrets
import time

import httpx

from edge.handler import EdgeHandler
from edge.origins import NOWHERE
from edge.platform import EdgeRequest
from edge.settings import EdgeSettings
from prism import REVOKED_KEY
from tests.fixtures.edge import EdgeStack, StubPlatform
from tests.fixtures.origin import FORWARD_SECRET, KEY_SECRET
from tests.polling import wait_for

CHAT = "/v1/chat/completions"


def body() -> dict[str, object]:
    return {"model": "demo", "messages": [{"role": "user", "content": secrets.token_hex(8)}]}


def test_a_kv_read_that_fails_is_logged_and_named_in_server_timing(
    edge: EdgeStack, api_key: str
) -> None:
    response = httpx.post(
        edge.extra("slow_kv") + CHAT,
        json=body(),
        headers={"authorization": f"Bearer {api_key}", "x-request-id": "told-kv-1"},
        timeout=30,
    )
    assert response.status_code == 200
    assert "kv-error" in response.headers["server-timing"]
    wait_for(lambda: "request told-kv-1: kv timed out" in edge.runtime.stderr_tail(400), 10)


def test_an_unreadable_revocation_record_is_logged_and_the_request_still_served(
    edge: EdgeStack, api_key: str
) -> None:
    edge.kv.bulk_put([{"key": REVOKED_KEY, "value": "{not a list"}])
    try:
        # The edge re-reads the record at most every 0.5 s here: poll until one request has.
        def told() -> httpx.Response | None:
            response = httpx.post(
                edge.url + CHAT,
                json=body(),
                headers={"authorization": f"Bearer {api_key}"},
                timeout=30,
            )
            assert response.status_code == 200
            return response if "revocation-error" in response.headers["server-timing"] else None

        response = wait_for(told, 15, interval=0.2)
        request_id = response.headers["x-request-id"]
        wait_for(
            lambda: f"request {request_id}: revocation failed" in edge.runtime.stderr_tail(400), 10
        )
    finally:
        edge.kv.bulk_put([{"key": REVOKED_KEY, "value": json.dumps([])}])


def test_an_origin_that_never_answers_is_a_504_in_bounded_time(
    edge: EdgeStack, api_key: str
) -> None:
    started = time.monotonic()
    response = httpx.post(
        edge.extra("silent_origin") + CHAT,
        json=body(),
        headers={"authorization": f"Bearer {api_key}"},
        timeout=30,
    )
    assert response.status_code == 504
    assert response.json()["error"]["code"] == "origin_timeout"
    assert response.headers["x-prism-edge-cache-layer"] == "bypass"
    assert time.monotonic() - started < 20  # its 0.5 s limit, not the client's 30 s


class _BrokenOrigin:
    status = 200

    def header(self, name: str) -> str | None:
        return None

    def headers(self) -> dict[str, str]:
        raise RuntimeError("a bug in the adapter")

    async def text(self) -> str:
        return ""

    async def settle(self) -> None:
        pass


def test_an_unexpected_error_is_an_openai_500_and_is_logged(api_key: str) -> None:
    settings = EdgeSettings.from_env(
        {
            "PRISM_KEY_SECRET": KEY_SECRET,
            "PRISM_FORWARD_SECRET": FORWARD_SECRET,
            "ORIGIN_URL": "http://origin.invalid",
        }.get
    )
    platform = StubPlatform(_BrokenOrigin, NOWHERE)  # an origin adapter with a bug
    request = EdgeRequest(
        "POST", CHAT, "", {"authorization": f"Bearer {api_key}", "x-request-id": "bug-1"}
    )
    response = asyncio.run(EdgeHandler(settings).handle(request, platform))
    assert response.status == 500
    assert response.headers["content-type"] == "application/json"
    assert json.loads(response.body or b"")["error"]["code"] == "internal_error"
    assert response.headers["x-request-id"] == "bug-1"
    assert platform.logged == [
        "prism edge: request bug-1 failed: RuntimeError('a bug in the adapter')"
    ]
