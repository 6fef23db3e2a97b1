"""The origin's surface over real sockets: what the public and the admin listener serve,
the contract headers on errors, and how slow or malformed requests are ended."""

from __future__ import annotations

import gc
import json
import socket
import time
import weakref

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http import httptools_impl

from deploy.local.asgi_thread import ThreadedServer
from origin import Settings
from origin.http.server import YOUNG_GENERATION, NameCheckMemo, freeze_heap, server_options
from tests.fixtures.origin import FORWARD_SECRET, KEY_SECRET, OriginFactory, RunningOrigin

CHAT = {"model": "demo", "messages": [{"role": "user", "content": "surface"}]}


def test_public_listener_serves_only_a_bare_liveness_answer(origin: RunningOrigin) -> None:
    health = httpx.get(origin.url + "/healthz")
    assert health.status_code == 200 and health.json() == {"status": "ok", "version": "dev"}
    metrics = httpx.get(origin.url + "/metrics")
    assert metrics.status_code == 404
    assert metrics.json()["error"]["type"] == "not_found_error"
    assert "prism_" not in metrics.text


def test_admin_listener_serves_details_and_metrics_and_no_api(
    origin: RunningOrigin, api_key: str
) -> None:
    health = httpx.get(origin.admin_url + "/healthz").json()
    assert health["status"] == "ok" and health["redis"]["ok"] is True
    assert "openai" in health["providers"]
    metrics = httpx.get(origin.admin_url + "/metrics")
    assert metrics.status_code == 200 and "prism_origin_requests_total" in metrics.text
    chat = httpx.post(
        origin.admin_url + "/v1/chat/completions",
        json=CHAT,
        headers={"authorization": f"Bearer {api_key}"},
    )
    assert chat.status_code == 404


@pytest.mark.parametrize(
    ("method", "path", "headers", "content", "status", "stages"),
    [
        ("POST", "/v1/chat/completions", {}, json.dumps(CHAT).encode(), 401, ""),
        ("POST", "/v1/chat/completions", None, b"{not json", 400, "auth;dur="),
        ("GET", "/v1/chat/completions", None, b"", 405, ""),
        ("GET", "/v1/nothing", None, b"", 404, ""),
        ("GET", "/v1/models", {}, b"", 401, ""),
    ],
)
def test_errors_carry_the_contract_headers(
    origin: RunningOrigin,
    api_key: str,
    method: str,
    path: str,
    headers: dict[str, str] | None,
    content: bytes,
    status: int,
    stages: str,
) -> None:
    sent = {"authorization": f"Bearer {api_key}"} if headers is None else headers
    response = httpx.request(method, origin.url + path, content=content, headers=sent)
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert response.headers["x-request-id"]
    assert response.headers["x-prism-edge-cache-layer"] == "bypass"
    if stages:
        assert response.headers["server-timing"].startswith(stages)
    else:
        assert "server-timing" not in response.headers
    if status == 405:
        assert response.headers["allow"] == "POST"


def test_request_id_is_propagated_on_errors_and_successes(
    origin: RunningOrigin, api_key: str
) -> None:
    auth = {"authorization": f"Bearer {api_key}", "x-request-id": "req-surface-1"}
    assert httpx.get(origin.url + "/v1/nothing", headers=auth).headers["x-request-id"] == (
        "req-surface-1"
    )
    models = httpx.get(origin.url + "/v1/models", headers=auth)
    assert models.status_code == 200 and models.headers["x-request-id"] == "req-surface-1"
    assert models.headers["x-prism-edge-cache-layer"] == "bypass"


def _exchange(origin: RunningOrigin, sent: bytes, within: float) -> bytes:
    """Send ``sent`` and read until the server closes, which must happen ``within`` s."""
    port = int(origin.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=within) as sock:
        if sent:
            sock.sendall(sent)
        received = b""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            chunk = sock.recv(65536)  # the socket timeout bounds each wait
            if not chunk:
                return received
            received += chunk
    raise AssertionError(f"the server kept the connection open past {within} s: {received!r}")


def _body(raw: bytes) -> dict[str, object]:
    head, _, body = raw.partition(b"\r\n\r\n")
    assert b"content-type: application/json" in head.lower()
    found: dict[str, object] = json.loads(body)
    return found


@pytest.mark.parametrize(
    "sent",
    [
        b"",  # connected, never said a word
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Le",  # half the headers
        (  # the headers, then half the body it announced
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer KEY\r\n"
            b'Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"model":'
        ),
    ],
    ids=["silent", "half-headers", "half-body"],
)
def test_a_stalled_request_gets_408_within_the_read_timeout(
    origin_factory: OriginFactory, api_key: str, sent: bytes
) -> None:
    origin = origin_factory(PRISM_READ_TIMEOUT="0.5")
    started = time.monotonic()
    raw = _exchange(origin, sent.replace(b"KEY", api_key.encode()), within=10)
    assert time.monotonic() - started >= 0.2  # never before half the read timeout
    assert raw.startswith(b"HTTP/1.1 408 ")
    error = _body(raw)["error"]
    assert isinstance(error, dict) and error["code"] == "request_timeout"
    # The connection is free again for others: the origin still answers.
    assert httpx.get(origin.url + "/healthz").status_code == 200


def test_a_request_that_keeps_arriving_in_time_is_served(
    origin_factory: OriginFactory, api_key: str
) -> None:
    origin = origin_factory(PRISM_READ_TIMEOUT="5")
    body = json.dumps(CHAT).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {api_key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    port = int(origin.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head + body[:10])
        sock.sendall(body[10:])
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    assert raw.startswith(b"HTTP/1.1 200 ")


@pytest.mark.parametrize(
    "framing",
    [
        b"Content-Length: -1\r\n",
        b"Content-Length: abc\r\n",
        b"Transfer-Encoding: chunked\r\n\r\nzz\r\n",
    ],
    ids=["negative-length", "non-numeric-length", "bad-chunk-size"],
)
def test_malformed_framing_gets_an_openai_400(origin: RunningOrigin, framing: bytes) -> None:
    request = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + framing
    if not framing.endswith(b"\r\n\r\nzz\r\n"):
        request += b"\r\n"
    raw = _exchange(origin, request, within=10)
    assert raw.startswith(b"HTTP/1.1 400 ")
    error = _body(raw)["error"]
    assert isinstance(error, dict) and error["type"] == "invalid_request_error"
    assert error["code"] == "bad_framing"


def test_a_later_request_on_a_kept_alive_connection_has_its_own_deadline(
    origin_factory: OriginFactory,
) -> None:
    origin = origin_factory(PRISM_READ_TIMEOUT="0.5")
    port = int(origin.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        first = b""
        while not first.endswith(b'"version":"dev"}'):
            first += sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 200 ")
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Le")
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    assert raw.startswith(b"HTTP/1.1 408 ")


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def test_freeze_heap_exempts_what_lives_and_frees_what_does_not() -> None:
    kept = _Node()
    garbage = _Node()
    garbage.other = garbage  # a cycle only the collector can free
    gone = weakref.ref(garbage)
    del garbage
    thresholds = gc.get_threshold()
    try:
        freeze_heap()
        assert gc.get_threshold() == (YOUNG_GENERATION, *thresholds[1:])
        assert gone() is None  # collected before the freeze, not made permanent
        assert gc.get_freeze_count() > 0
        # Full collections no longer walk what start-up left alive.
        assert not any(found is kept for found in gc.get_objects())
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)
    assert any(found is kept for found in gc.get_objects())


@given(st.lists(st.binary(max_size=12) | st.sampled_from([b"x-prism-cache", b"bad name"])))
def test_the_header_name_memo_answers_as_uvicorns_check(names: list[bytes]) -> None:
    pattern = httptools_impl.HEADER_RE
    pattern = pattern.pattern if isinstance(pattern, NameCheckMemo) else pattern
    memo = NameCheckMemo(pattern)
    for name in names + names:  # each asked twice: the second from the memo when it passed
        assert (memo.search(name) is None) == (pattern.search(name) is None)


async def _bad_header_app(scope: Scope, receive: Receive, send: Send) -> None:
    assert scope["type"] == "http"
    name = b"bad name" if scope["path"] == "/bad" else b"x-good"
    await send({"type": "http.response.start", "status": 200, "headers": [(name, b"1")]})
    await send({"type": "http.response.body", "body": b"ok"})


def test_served_with_the_origins_options_a_bad_header_name_is_still_refused() -> None:
    """The memo is in front of uvicorn's check once the origin's options are used; a
    valid name passes, an invalid one fails the response every time (uvicorn then
    closes the connection without an answer, its own way of refusing)."""
    env = {"PRISM_KEY_SECRET": KEY_SECRET, "PRISM_FORWARD_SECRET": FORWARD_SECRET}
    options = server_options(Settings.from_env(env))
    assert isinstance(httptools_impl.HEADER_RE, NameCheckMemo)
    with ThreadedServer(_bad_header_app, lifespan="off", **options) as server:
        for _ in range(2):
            good = httpx.get(server.url + "/good")
            assert good.status_code == 200 and good.headers["x-good"] == "1"
            with pytest.raises(httpx.RemoteProtocolError):
                httpx.get(server.url + "/bad")
