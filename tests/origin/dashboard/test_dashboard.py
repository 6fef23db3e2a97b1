"""The dashboard on the admin listener: the admin key guards the page and its data, the
history shows the traffic sent, and a real headless Chromium draws it."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path
from typing import Any

import httpx
import pytest

from deploy.local.provider import ProviderServer
from origin import Settings, SettingsError
from origin.dashboard import AdminAccess
from tests.fixtures.browser import ROOT, run_browser_script
from tests.fixtures.origin import FORWARD_SECRET, KEY_SECRET, OriginFactory, RunningOrigin
from tests.polling import wait_for

ADMIN_KEY = "admin-key-for-the-tests-0123456789"
BROWSER_SCRIPT = Path(__file__).with_name("dashboard_browser.mjs")
DASHBOARD_ENV = {
    "PRISM_ADMIN_KEY": ADMIN_KEY,
    "PRISM_DASHBOARD_INTERVAL": "0.5",
    "PRISM_USAGE_FLUSH_INTERVAL": "0.1",
}
BEARER = {"authorization": f"Bearer {ADMIN_KEY}"}


def send_traffic(origin: RunningOrigin, api_key: str, text: str, repeats: int = 3) -> None:
    """One miss, then ``repeats`` Redis hits of it, for project acme."""
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": text}]}
    with httpx.Client(
        base_url=origin.url, headers={"authorization": f"Bearer {api_key}"}, timeout=30
    ) as client:
        first = client.post("/v1/chat/completions", json=body)
        assert first.headers["x-prism-edge-cache-layer"] == "miss"
        origin.wait_stored()
        for _ in range(repeats):
            hit = client.post("/v1/chat/completions", json=body)
            assert hit.headers["x-prism-edge-cache-layer"] == "redis"


def data(origin: RunningOrigin) -> dict[str, Any]:
    response = httpx.get(origin.admin_url + "/dashboard/data", headers=BEARER, timeout=10)
    assert response.status_code == 200
    result: dict[str, Any] = response.json()
    return result


def shows_traffic(origin: RunningOrigin, hits: int = 3) -> dict[str, Any] | None:
    """The history once its last snapshot has all of ``send_traffic``'s requests, in the
    process's counts and in acme's usage today (a snapshot taken while they were under way,
    or before the usage was flushed to Redis, has only some), with a Redis hit rate above 0."""
    found = data(origin)
    rates = [rate for rate in found["requests"]["redis"] if rate]
    latest = found["latest"] or {}
    acme = (latest.get("projects") or {}).get("acme")
    counted = (latest.get("requests") or {}).get("redis") == hits
    whole = acme is not None and acme["requests"]["redis"] == hits and acme["cost_usd"] > 0
    return found if rates and counted and whole else None


def test_the_dashboard_is_off_without_an_admin_key(origin: RunningOrigin) -> None:
    response = httpx.get(origin.admin_url + "/dashboard", timeout=10)
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "dashboard_off"
    assert origin.server.app.dashboard is None  # nothing samples: no dashboard was built
    for path in ("/dashboard/data", "/dashboard/requests", "/dashboard/requests/r1"):
        assert httpx.get(origin.admin_url + path, timeout=10).status_code == 404


def test_an_admin_key_must_be_long_enough() -> None:
    env = {"PRISM_KEY_SECRET": KEY_SECRET, "PRISM_FORWARD_SECRET": FORWARD_SECRET}
    with pytest.raises(SettingsError, match="PRISM_ADMIN_KEY"):
        Settings.from_env({**env, "PRISM_ADMIN_KEY": "short"})
    with pytest.raises(SettingsError, match="PRISM_DASHBOARD_INTERVAL"):
        Settings.from_env({**env, "PRISM_ADMIN_KEY": ADMIN_KEY, "PRISM_DASHBOARD_INTERVAL": "0"})
    assert "admin" not in repr(Settings.from_env({**env, "PRISM_ADMIN_KEY": ADMIN_KEY}))


def test_page_and_data_refuse_a_missing_or_wrong_key(origin_factory: OriginFactory) -> None:
    origin = origin_factory(DASHBOARD_ENV)
    admin = origin.admin_url
    wrong = {"authorization": "Bearer admin-key-for-the-tests-0123456780"}
    forged = {"cookie": "prism_admin=99999999999.deadbeef"}
    for headers in ({}, wrong, forged, {"authorization": ADMIN_KEY}):  # (no "Bearer ")
        page = httpx.get(admin + "/dashboard", headers=headers, timeout=10)
        assert page.status_code == 401
        assert 'name="key"' in page.text  # the sign-in form, never the page
        for path in ("/dashboard/data", "/dashboard/requests", "/dashboard/requests/r1"):
            refused = httpx.get(admin + path, headers=headers, timeout=10)
            assert refused.status_code == 401
            assert refused.json()["error"]["code"] == "admin_key_required"
    page = httpx.get(admin + "/dashboard", headers=BEARER, timeout=10)
    assert page.status_code == 200
    assert "chart-requests" in page.text
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert data(origin)["interval"] == 0.5
    # Never on the public listener.
    for path in ("/dashboard", "/dashboard/requests", "/dashboard/requests/r1"):
        assert httpx.get(origin.url + path, headers=BEARER, timeout=10).status_code == 404


def test_the_sign_in_form_opens_an_http_only_session(origin_factory: OriginFactory) -> None:
    origin = origin_factory(DASHBOARD_ENV)
    with httpx.Client(base_url=origin.admin_url, timeout=10) as browser:
        wrong = browser.post("/dashboard/login", data={"key": "nope"})
        assert wrong.status_code == 401
        assert "not the admin key" in wrong.text
        assert "set-cookie" not in wrong.headers
        right = browser.post("/dashboard/login", data={"key": ADMIN_KEY})
        assert right.status_code == 303
        assert right.headers["location"] == "/dashboard"
        cookie = right.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/dashboard" in cookie
        assert ADMIN_KEY not in cookie  # a signed session, not the key
        assert browser.get("/dashboard/data").status_code == 200  # the client sends it back
        token = browser.cookies["prism_admin"]
    expiry, _, signature = token.partition(".")
    tampered = f"{int(expiry) + 1}.{signature}"
    refused = httpx.get(
        origin.admin_url + "/dashboard/data", cookies={"prism_admin": tampered}, timeout=10
    )
    assert refused.status_code == 401


def test_a_session_ends_after_twelve_hours() -> None:
    now = [1_000_000.0]
    access = AdminAccess(ADMIN_KEY, clock=lambda: now[0])
    token = access.session_cookie().split(";")[0].split("=", 1)[1]
    assert access.allows({"cookie": f"other=1; prism_admin={token}"})
    now[0] += 12 * 3600 - 1
    assert access.allows({"cookie": f"prism_admin={token}"})
    now[0] += 2
    assert not access.allows({"cookie": f"prism_admin={token}"})
    assert not AdminAccess(ADMIN_KEY + "x").allows({"cookie": f"prism_admin={token}"})


def test_the_history_shows_rates_by_layer_providers_and_spend(
    origin_factory: OriginFactory, api_key: str
) -> None:
    origin = origin_factory(DASHBOARD_ENV)
    send_traffic(origin, api_key, "dashboard history")
    found = wait_for(lambda: shows_traffic(origin), timeout=15, interval=0.2)
    assert found["layers"] == ["miss", "kv", "redis", "semantic", "bypass"]
    assert len(found["t"]) >= 2 and found["t"] == sorted(found["t"])
    assert found["requests"]["redis"][0] is None  # nothing to compare the first point with
    assert max(r or 0 for r in found["requests"]["miss"]) > 0
    assert any(ratio and ratio > 0.5 for ratio in found["hit_ratio"])
    latest = found["latest"]
    assert latest["requests"]["redis"] == 3 and latest["requests"]["miss"] == 1
    assert latest["providers"]["openai"]["state"] == "healthy"
    assert found["providers"]["openai"]["state"][-1] == 0
    acme = latest["projects"]["acme"]
    assert acme["requests"] == {
        "redis": 3,
        "semantic": 0,
        "miss": 1,
        "bypass": 0,
        "coalesced": 0,
        "kv": 0,
    }
    assert acme["cost_usd"] > 0 and acme["saved_usd"] > 0
    assert max(v or 0 for v in found["projects"]["acme"]["spend_usd"]) == acme["cost_usd"]
    assert latest["kv"]["queued"] == 0


def test_the_vendored_chart_library_is_the_pinned_one(origin_factory: OriginFactory) -> None:
    pinned = json.loads((ROOT / "package.json").read_text())["devDependencies"]["uplot"]
    origin = origin_factory(DASHBOARD_ENV)
    served = httpx.get(origin.admin_url + "/dashboard/static/uPlot.iife.min.js", timeout=10)
    assert served.status_code == 200
    assert served.headers["content-type"].startswith("text/javascript")
    assert served.content.startswith(
        f"/*! https://github.com/leeoniya/uPlot (v{pinned}) */".encode()
    )
    installed = ROOT / "node_modules" / "uplot" / "dist" / "uPlot.iife.min.js"
    if installed.exists():  # after `make setup`: the file shipped is the file npm pins
        assert served.content == installed.read_bytes()


def png_facts(path: Path) -> tuple[int, int, int]:
    """(width, height, distinct byte values in the image data) of a PNG."""
    raw = path.read_bytes()
    assert raw[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", raw[16:24])
    at, idat = 8, b""
    while at < len(raw):
        (length,) = struct.unpack(">I", raw[at : at + 4])
        kind = raw[at + 4 : at + 8]
        if kind == b"IDAT":
            idat += raw[at + 8 : at + 8 + length]
        at += 12 + length
    return width, height, len(set(zlib.decompress(idat)))


def test_a_real_browser_signs_in_and_sees_the_charts_fill(
    origin_factory: OriginFactory, api_key: str, tmp_path: Path
) -> None:
    origin = origin_factory(DASHBOARD_ENV)
    send_traffic(origin, api_key, "dashboard in a browser")
    wait_for(lambda: shows_traffic(origin), timeout=15, interval=0.2)
    shot = tmp_path / "dashboard.png"
    seen = run_browser_script(BROWSER_SCRIPT, origin.admin_url, ADMIN_KEY, str(shot))
    assert seen["signIn"] == {"status": 401, "form": True}
    assert seen["wrong"]["status"] == 401 and "not the admin key" in seen["wrong"]["message"]
    assert seen["right"]["status"] == 200 and seen["right"]["url"].endswith("/dashboard")
    assert seen["problems"] == []  # no console errors once signed in
    [cookie] = seen["cookies"]
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    charts = seen["charts"]
    requests = charts["chart-requests"]
    assert requests["series"] == ["miss", "kv", "redis", "semantic", "bypass"]
    assert requests["points"] >= 2 and requests["numbers"][2] > 0  # redis rate above 0
    assert charts["chart-health"]["series"] == ["openai"]
    assert charts["chart-spend"]["series"] == ["acme"] and charts["chart-spend"]["numbers"][0] > 0
    for chart in charts.values():
        assert chart["painted"] > 1000, chart  # axes and lines drawn, not a blank canvas
    assert any("healthy" in row for row in seen["tables"]["providers"])
    assert any(row.startswith("acme") for row in seen["tables"]["projects"])
    width, height, shades = png_facts(shot)
    assert (width, height) == (1280, 900)
    assert shot.stat().st_size > 20_000 and shades > 50  # a picture, not one colour


def test_a_demoted_provider_is_in_the_health_history(
    origin_factory: OriginFactory, api_key: str, provider: ProviderServer
) -> None:
    origin = origin_factory(DASHBOARD_ENV)
    wait_for(lambda: data(origin)["t"], timeout=10)  # a healthy sample first
    provider.control.set_fault("status", status=500, count=-1)
    with httpx.Client(
        base_url=origin.url, headers={"authorization": f"Bearer {api_key}"}, timeout=30
    ) as client:
        for n in range(2):  # two calls each (a retry): four failures in a row
            body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": f"down {n}"}]}
            assert client.post("/v1/chat/completions", json=body).status_code == 502

    def demoted() -> dict[str, Any] | None:
        found = data(origin)
        return found if found["events"] else None

    found = wait_for(demoted, timeout=10, interval=0.2)
    [event] = found["events"]
    assert (event["provider"], event["from"], event["to"]) == ("openai", "healthy", "demoted")
    assert "failures in a row" in event["reason"]
    assert (
        found["providers"]["openai"]["state"][0] == 0
        and found["providers"]["openai"]["state"][-1] == 2
    )
    assert max(rate or 0 for rate in found["server_errors"]) > 0
    assert found["latest"]["providers"]["openai"]["state"] == "demoted"
