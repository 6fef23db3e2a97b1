"""The dashboard's Requests page: the request log's window over HTTP behind the admin key
(filters, pages through the cursor, one request by id) and in a real headless Chromium.

One origin for the module, on a Redis of its own, with real traffic through
/v1/chat/completions: misses and Redis hits for acme, a miss and a hit with their bodies
logged for beta (its policy says so), and a refused key."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from deploy.local.provider import ProviderServer
from deploy.local.redis import RedisServer
from deploy.policy_store import PolicyStore
from origin import Settings
from prism import KeyRing, LogRules
from tests.fixtures.browser import run_browser_script
from tests.fixtures.origin import RunningOrigin, origin_env, serve_origin
from tests.origin.dashboard.test_dashboard import (
    ADMIN_KEY,
    BEARER,
    DASHBOARD_ENV,
    png_facts,
)
from tests.polling import wait_for

BROWSER_SCRIPT = Path(__file__).with_name("requests_browser.mjs")
CHAT = "/v1/chat/completions"
PROMPTS = 3  # acme's misses, each asked twice more (Redis hits)
ACME = {f"rp-miss-{n}" for n in range(PROMPTS)} | {
    f"rp-hit-{n}-{m}" for n in range(PROMPTS) for m in range(2)
}
BETA = {"rp-beta-miss", "rp-beta-hit"}
REFUSED = "rp-refused"
EVERY = ACME | BETA | {REFUSED}
# beta's prompt, logged: markup in it must reach the page as text, never as elements
BETA_TEXT = 'beta\'s question <b id="injected">bold</b>'


def post(client: httpx.Client, key: str, request_id: str, text: str) -> httpx.Response:
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": text}]}
    headers = {"authorization": f"Bearer {key}", "x-request-id": request_id}
    return client.post(CHAT, json=body, headers=headers)


def requests_page(origin: RunningOrigin, **params: str | int) -> httpx.Response:
    return httpx.get(
        origin.admin_url + "/dashboard/requests", params=params, headers=BEARER, timeout=10
    )


def ids(response: httpx.Response) -> list[str]:
    assert response.status_code == 200, response.text
    return [record["id"] for record in response.json()["records"]]


@pytest.fixture(scope="module")
def origin(
    module_redis: RedisServer, provider_server: ProviderServer, key_ring: KeyRing
) -> Iterator[RunningOrigin]:
    provider_server.control.reset()
    admin = redis.Redis.from_url(module_redis.url, decode_responses=True)
    PolicyStore(admin).set("beta", log=LogRules(bodies=True), updated_by="test")
    admin.close()
    env = origin_env(module_redis.url, provider_server.url, **DASHBOARD_ENV)
    running = serve_origin(Settings.from_env(env))
    try:
        with httpx.Client(base_url=running.url, timeout=30) as client:
            acme, beta = key_ring.mint("acme"), key_ring.mint("beta")
            for n in range(PROMPTS):
                assert post(client, acme, f"rp-miss-{n}", f"requests page {n}").status_code == 200
                running.wait_stored()
            for n in range(PROMPTS):
                for m in range(2):
                    hit = post(client, acme, f"rp-hit-{n}-{m}", f"requests page {n}")
                    assert hit.headers["x-prism-edge-cache-layer"] == "redis"
            assert post(client, beta, "rp-beta-miss", BETA_TEXT).status_code == 200
            running.wait_stored()
            assert post(client, beta, "rp-beta-hit", BETA_TEXT).status_code == 200
            assert post(client, "sk-prism-v1.nope", REFUSED, "who am I").status_code == 401

        def all_there() -> bool:
            return set(ids(requests_page(running, limit=200))) == EVERY

        wait_for(all_there, timeout=30, interval=0.1)  # the window is written every second
        yield running
    finally:
        running.server.stop()


def test_every_request_is_listed_once_newest_first(origin: RunningOrigin) -> None:
    page = requests_page(origin).json()
    listed = [record["id"] for record in page["records"]]
    assert sorted(listed) == sorted(EVERY)  # each once, from every project's window
    assert page["next"] is None
    assert listed[0] == REFUSED and listed[-1] == "rp-miss-0"  # newest first
    times = [record["ts"] for record in page["records"]]
    assert times == sorted(times, reverse=True)
    [refused] = [r for r in page["records"] if r["id"] == REFUSED]
    assert (refused["status"], refused["layer"], refused["error"]) == (
        401,
        "refused",
        "invalid_api_key",
    )
    assert "project" not in refused and "key" not in refused


def test_filters_by_project_layer_status_model_key_and_time(
    origin: RunningOrigin, key_ring: KeyRing
) -> None:
    assert set(ids(requests_page(origin, project="acme"))) == ACME
    assert set(ids(requests_page(origin, project="acme", layer="miss"))) == {
        f"rp-miss-{n}" for n in range(PROMPTS)
    }
    assert set(ids(requests_page(origin, layer="redis"))) == (ACME | BETA) - {
        f"rp-miss-{n}" for n in range(PROMPTS)
    } - {"rp-beta-miss"}
    assert ids(requests_page(origin, status="4xx")) == [REFUSED]
    assert ids(requests_page(origin, status="error")) == [REFUSED]
    assert set(ids(requests_page(origin, status="200"))) == ACME | BETA
    assert ids(requests_page(origin, model="no-such-model")) == []
    acme_key = requests_page(origin, project="acme").json()["records"][0]["key"]
    assert set(ids(requests_page(origin, key=acme_key))) == ACME
    assert set(ids(requests_page(origin, since="10m"))) == EVERY
    assert ids(requests_page(origin, until="10m")) == []
    assert ids(requests_page(origin, since="2000-01-01T00:00", until="2000-01-02")) == []
    blank = requests_page(origin, project="", layer="", status="")  # a form's empty fields
    assert set(ids(blank)) == EVERY


def test_pages_through_the_cursor_without_gaps_or_repeats(origin: RunningOrigin) -> None:
    whole = ids(requests_page(origin, limit=200))
    seen: list[str] = []
    before: str | None = None
    pages = 0
    while True:
        params: dict[str, str | int] = {"limit": 4}
        if before is not None:
            params["before"] = before
        page = requests_page(origin, **params).json()
        assert len(page["records"]) <= 4
        seen += [record["id"] for record in page["records"]]
        pages += 1
        before = page["next"]
        if before is None:
            break
    assert pages == 3  # 12 records, 4 a page: the last page knows it is the last
    assert seen == whole
    # A filter holds across pages: acme's Redis hits, 4 then 2.
    first = requests_page(origin, project="acme", layer="redis", limit=4).json()
    second = requests_page(
        origin, project="acme", layer="redis", limit=4, before=first["next"]
    ).json()
    assert len(first["records"]) == 4 and len(second["records"]) == 2
    assert second["next"] is None
    assert {r["id"] for r in first["records"] + second["records"]} == {
        f"rp-hit-{n}-{m}" for n in range(PROMPTS) for m in range(2)
    }


def test_one_request_by_id_with_its_stages_and_its_body_when_logged(
    origin: RunningOrigin,
) -> None:
    def one(request_id: str) -> httpx.Response:
        return httpx.get(
            origin.admin_url + f"/dashboard/requests/{request_id}", headers=BEARER, timeout=10
        )

    miss = one("rp-miss-1").json()["record"]
    assert miss["layer"] == "miss" and miss["project"] == "acme"
    assert miss["stages"]["upstream"] > 0 and miss["attempts"][0]["provider"] == "openai"
    assert miss["tokens_in"] > 0 and miss["cost_usd"] > 0
    assert "body" not in miss  # acme's policy logs no bodies
    hit = one("rp-beta-hit").json()["record"]
    assert hit["layer"] == "redis" and hit["saved_usd"] > 0
    assert hit["body"]["request"]["messages"][0]["content"] == BETA_TEXT
    assert hit["body"]["response"]
    missing = one("rp-never-sent")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "record_not_found"


def test_without_the_admin_key_a_401(origin: RunningOrigin) -> None:
    for path in ("/dashboard/requests", "/dashboard/requests/rp-miss-0"):
        refused = httpx.get(origin.admin_url + path, timeout=10)
        assert refused.status_code == 401
        assert refused.json()["error"]["code"] == "admin_key_required"
        wrong = httpx.get(origin.admin_url + path, headers={"authorization": "Bearer x"})
        assert wrong.status_code == 401
    # (Nor on the public listener: test_dashboard.py, as a 404 there is in this window.)


@pytest.mark.parametrize(
    ("params", "param"),
    [
        ({"status": "5x"}, "status"),
        ({"status": "ok"}, "status"),
        ({"since": "yesterday"}, "since"),
        ({"until": "10 minutes"}, "until"),
        ({"limit": "0"}, "limit"),
        ({"limit": "201"}, "limit"),
        ({"limit": "ten"}, "limit"),
        ({"before": "not-a-cursor"}, "before"),
    ],
)
def test_a_bad_filter_is_a_400_naming_it(
    origin: RunningOrigin, params: dict[str, str], param: str
) -> None:
    refused = requests_page(origin, **params)
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert param in error["message"]


def seen_misses(seen: dict[str, Any]) -> set[str]:
    return set(seen["misses"])


def test_a_real_browser_filters_pages_and_opens_a_request(
    origin: RunningOrigin, tmp_path: Path
) -> None:
    shot = tmp_path / "requests.png"
    seen = run_browser_script(BROWSER_SCRIPT, origin.admin_url, ADMIN_KEY, str(shot))
    assert seen["problems"] == []  # no console errors once signed in
    assert set(seen["all"]) == EVERY  # the first page: every request sent
    assert seen["all"][0] == REFUSED
    assert set(seen["misses"]) == {f"rp-miss-{n}" for n in range(PROMPTS)} | {"rp-beta-miss"}
    first, second = seen["pages"]  # Redis hits, 5 a page: acme's six and beta's one
    assert len(first) == 5 and len(second) == 2 and not set(first) & set(second)
    assert set(first + second) == (ACME | BETA) - seen_misses(seen)
    assert seen["previous"] == first  # Previous goes back to the first page
    assert seen["nextDisabled"] is True  # the last page has no Next
    detail = seen["detail"]
    assert detail["id"] == "rp-beta-miss"
    assert "upstream" in detail["stages"] and all(w > 0 for w in detail["stageWidths"])
    assert any("openai" in row for row in detail["attempts"])
    assert json.dumps(BETA_TEXT) in detail["request"] and detail["response"]
    assert seen["errors"] == []
    assert seen["byId"] == "rp-miss-2"  # the request id field opens that request
    assert seen["injected"] is False  # record text stays text
    width, height, shades = png_facts(shot)
    assert (width, height) == (1280, 900) and shades > 50
