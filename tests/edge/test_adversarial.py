"""The edge and the origin probed as an attacker would, through the real Workers runtime and
the real origin: replayed forwards, path tricks, odd keys, odd encodings, slow clients and
clients that go away. Smoke-sized: each probe is one or a few requests."""

from __future__ import annotations

import json
import secrets
import socket
import struct
import time
from collections.abc import Iterable
from urllib.parse import urlsplit

import httpx
import pytest
import redis

from prism import encode_envelope, entry_key, fingerprint, parse_chat_request, sign_forward
from tests.fixtures.edge import EdgeStack
from tests.fixtures.origin import FORWARD_SECRET
from tests.polling import wait_for

CHAT = "/v1/chat/completions"


def unique_body(**extra: object) -> dict[str, object]:
    return {
        "model": "demo",
        "messages": [{"role": "user", "content": f"adversarial {secrets.token_hex(6)}"}],
        **extra,
    }


def chat_fingerprint(body: dict[str, object], project: str = "acme") -> str:
    return fingerprint(project, CHAT, parse_chat_request(json.dumps(body)))


def forward_header(
    fp: str, *, method: str = "POST", path: str = CHAT, now: float | None = None
) -> str:
    """What the edge signs for one request: a captured copy is what an attacker holds."""
    return sign_forward(
        FORWARD_SECRET.encode(),
        method=method,
        path=path,
        project="acme",
        key_id="edgekey01",
        fingerprint=fp,
        now=time.time() if now is None else now,
    )


def rejected(edge: EdgeStack, reason: str) -> float:
    return edge.origin.metric("prism_origin_forward_rejected_total", reason=reason)


def raw_exchange(
    url: str,
    head: bytes,
    parts: Iterable[bytes] = (),
    timeout: float = 10,
    half_close: bool = False,
) -> bytes:
    """Send ``head`` and then ``parts`` on one socket, exactly as given (no client library
    to fix the request up), and read the answer until the server closes or goes quiet.
    ``half_close``: then end the sending side, as a client that sent all it will."""
    where = urlsplit(url)
    with socket.create_connection((where.hostname, where.port), timeout=timeout) as conn:
        conn.sendall(head)
        try:
            for part in parts:
                conn.sendall(part)
            if half_close:
                conn.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the server may answer and close before taking everything: that is the point
        received = b""
        try:
            while chunk := conn.recv(65536):
                received += chunk
                if b"\r\n\r\n" in received and _complete(received):
                    break
        except TimeoutError:
            pass
        except ConnectionResetError:
            pass
    return received


def _complete(received: bytes) -> bool:
    head, _, body = received.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value.strip())
    return body.endswith(b"0\r\n\r\n")


def status_of(received: bytes) -> int:
    assert received.startswith(b"HTTP/1.1 "), received[:200]
    return int(received.split(b" ", 2)[1])


def json_of(received: bytes) -> dict[str, object]:
    body = received.partition(b"\r\n\r\n")[2]
    if b"transfer-encoding: chunked" in received.partition(b"\r\n\r\n")[0].lower():
        decoded, rest = b"", body
        while rest:
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line, 16)
            if size == 0:
                break
            decoded, rest = decoded + rest[:size], rest[size + 2 :]
        body = decoded
    value: dict[str, object] = json.loads(body)
    return value


def chat_head(url: str, key: str, extra: bytes = b"", *, close: bool = True) -> bytes:
    """A chat request's head; ``extra`` is more header lines, as raw bytes."""
    host = urlsplit(url).netloc
    return (
        (
            f"POST {CHAT} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: application/json\r\n{'Connection: close' + chr(13) + chr(10) if close else ''}"
        ).encode()
        + extra
        + b"\r\n"
    )


# --------------------------------------------------------------------- forward replays


def test_a_replayed_forward_with_another_body_is_refused_and_counted(
    edge: EdgeStack, api_key: str
) -> None:
    """The poisoning attempt: a header signed for body A, sent with body B, would store B's
    answer under A's fingerprint for that tenant."""
    signed_for, sent = unique_body(), unique_body()
    header = forward_header(chat_fingerprint(signed_for))
    before = rejected(edge, "body")
    response = httpx.post(
        edge.origin.url + CHAT, json=sent, headers={"x-prism-forward": header}, timeout=30
    )
    assert response.status_code == 401, response.text
    assert response.json()["error"] == {
        "message": "Edge forward header does not match the request body.",
        "type": "authentication_error",
        "param": None,
        "code": "invalid_forward",
    }
    assert rejected(edge, "body") == before + 1
    assert edge.provider.control.stats()["chat_requests"] == 0
    # the body it was signed for still goes through (a retry of the same request)
    again = httpx.post(
        edge.origin.url + CHAT, json=signed_for, headers={"x-prism-forward": header}, timeout=30
    )
    assert again.status_code == 200
    assert again.headers["x-prism-cache-key"] == chat_fingerprint(signed_for)[:16]


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [("GET", "/v1/models", 401), ("GET", CHAT, 405), ("POST", "/v1/models", 405)],
)
def test_a_chat_forward_is_no_credential_for_another_route_or_method(
    edge: EdgeStack, method: str, path: str, status: int
) -> None:
    header = forward_header(chat_fingerprint(unique_body()))
    response = httpx.request(
        method, edge.origin.url + path, headers={"x-prism-forward": header}, timeout=30
    )
    assert response.status_code == status, response.text
    if status == 401:
        assert response.json()["error"]["code"] == "invalid_forward"
    models = httpx.get(
        edge.origin.url + "/v1/models",
        headers={"x-prism-forward": forward_header("", method="GET", path="/v1/models")},
        timeout=30,
    )
    assert models.status_code == 200  # signed for that route, it is accepted


def test_a_forward_is_worth_seconds_not_half_a_minute(edge: EdgeStack) -> None:
    body = unique_body()
    before = rejected(edge, "expired")
    header = forward_header(chat_fingerprint(body), now=time.time() - 10)
    response = httpx.post(
        edge.origin.url + CHAT, json=body, headers={"x-prism-forward": header}, timeout=30
    )
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "forward_expired"
    assert rejected(edge, "expired") == before + 1


# --------------------------------------------------------------------- routes


def _get(url: str, target: str, key: str) -> bytes:
    host = urlsplit(url).netloc
    return raw_exchange(
        url,
        f"GET {target} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {key}\r\n"
        "Connection: close\r\n\r\n".encode(),
    )


@pytest.mark.parametrize("target", ["/v1/%2e%2e/healthz", "/v1/%2E%2E/metrics"])
def test_internal_endpoints_are_not_reachable_through_the_edge(
    edge: EdgeStack, api_key: str, target: str
) -> None:
    received = _get(edge.url, target, api_key)
    assert status_of(received) == 404, received[:300]
    assert b"redis" not in received and b"prism_origin" not in received


@pytest.mark.parametrize(
    "target",
    [
        "/v1/%2e%2e/healthz",
        "/v1/../metrics",
        "/v1/./../healthz",
        "/v1/%2e%2e%2fmetrics",
        "/v1/models/../../metrics",
        "/v1/completions",
        "/v1/chat/completions/x",
        "/V1/models",
        "/v1/models%00",
    ],
)
def test_only_known_routes_leave_the_edge(edge: EdgeStack, api_key: str, target: str) -> None:
    # ``no_origin`` has nobody at its origin URL: anything it forwarded would be a 502.
    received = _get(edge.extra("no_origin"), target, api_key)
    assert status_of(received) == 404, received[:300]
    error = json_of(received)["error"]
    assert isinstance(error, dict) and error["type"] == "not_found_error"


def test_a_known_route_in_another_spelling_is_served_at_its_own_path(
    edge: EdgeStack, api_key: str
) -> None:
    received = _get(edge.url, "/v1//x/../models", api_key)
    assert status_of(received) == 200
    assert json_of(received)["object"] == "list"


# --------------------------------------------------------------------- odd keys

ODD_DIGITS = {
    "superscript": "\u00b9",  # isdigit() but int() raises: was a 500
    "arabic_indic": "\u0661",  # int() == 1: was another spelling of a valid v1 key
    "fullwidth": "\uff11",
    "devanagari": "\u0967",
}


@pytest.mark.parametrize("kind", sorted(ODD_DIGITS))
def test_a_key_with_odd_digits_is_a_401_at_the_edge_and_at_the_origin(
    edge: EdgeStack, api_key: str, kind: str
) -> None:
    odd = api_key.replace("sk-prism-v1.", f"sk-prism-v{ODD_DIGITS[kind]}.", 1)
    header = {b"authorization": b"Bearer " + odd.encode()}
    before = edge.origin_requests()
    for url in (edge.url, edge.origin.url):
        response = httpx.post(url + CHAT, json=unique_body(), headers=header, timeout=30)
        assert response.status_code == 401, (url, response.text)
        assert response.json()["error"]["type"] == "authentication_error"
    assert edge.origin_requests() == before + 1  # the direct call only


@pytest.mark.parametrize(
    "value",
    [
        b"max-age=\xc2\xb9\xc2\xb2\xc2\xb3",
        b"max-age=\xd9\xa1\xd9\xa2\xd9\xa0",
        b"max-age=" + b"9" * 5000,
    ],
)
def test_odd_max_age_digits_are_no_ttl_and_no_error(
    edge: EdgeStack, api_key: str, value: bytes
) -> None:
    for url in (edge.url, edge.origin.url):
        response = httpx.post(
            url + CHAT,
            json=unique_body(),
            headers={b"authorization": f"Bearer {api_key}".encode(), b"cache-control": value},
            timeout=30,
        )
        assert response.status_code == 200, (url, response.text)


# --------------------------------------------------------------------- bodies


def test_the_body_limit_counts_bytes_and_stops_reading_there(edge: EdgeStack, api_key: str) -> None:
    """``no_origin`` allows 64 KiB: 40 Ki two-byte characters are 80 KiB. A 413 from it
    is the edge's own (a forwarded request there is a 502), and it comes while the client
    is still sending: the rest of the (unterminated) chunked body is never waited for."""
    url = edge.extra("no_origin")
    content = b'{"model":"demo","messages":[{"role":"user","content":"' + "é".encode() * 40_960
    chunks = [b"%x\r\n%s\r\n" % (len(content), content)]  # and never the terminating chunk
    received = raw_exchange(
        url, chat_head(url, api_key, b"Transfer-Encoding: chunked\r\n"), chunks, timeout=8
    )
    assert status_of(received) == 413, received[:300]
    error = json_of(received)["error"]
    assert isinstance(error, dict) and error["code"] == "request_too_large"


def test_a_body_over_the_limit_in_bytes_but_not_in_characters_is_refused_at_the_edge(
    edge: EdgeStack, api_key: str
) -> None:
    url = edge.extra("no_origin")
    text = "é" * 40_000  # 40,000 characters, 80,000 bytes
    body = json.dumps(
        {"model": "demo", "messages": [{"role": "user", "content": text}]}, ensure_ascii=False
    )
    chunks = [body.encode()[i : i + 16384] for i in range(0, len(body.encode()), 16384)]
    response = httpx.post(
        url + CHAT,
        content=iter(chunks),  # chunked: no Content-Length to go by
        headers={"authorization": f"Bearer {api_key}"},
        timeout=30,
    )
    assert response.status_code == 413, response.text


def test_invalid_utf8_is_the_same_400_at_the_edge_and_at_the_origin(
    edge: EdgeStack, api_key: str
) -> None:
    content = b'{"model":"demo","messages":[{"role":"user","content":"bad \xff\xfe bytes"}]}'
    before = edge.origin_requests()
    answers = []
    for url in (edge.url, edge.origin.url):
        response = httpx.post(
            url + CHAT, content=content, headers={"authorization": f"Bearer {api_key}"}, timeout=30
        )
        answers.append((response.status_code, response.json()["error"]["code"]))
    assert answers == [(400, "invalid_json"), (400, "invalid_json")]
    assert edge.origin_requests() == before + 1  # the direct call only


# workerd itself refuses some malformed lengths (``1e3``, ``0x10``, ``5, 5``, non-ASCII
# digits) with its own plain 500 before any Worker code runs; these reach the Worker.
@pytest.mark.parametrize("length", [b"-1", b"+16", b"9" * 40])
def test_a_malformed_content_length_is_a_400(edge: EdgeStack, api_key: str, length: bytes) -> None:
    url = edge.extra("no_origin")
    received = raw_exchange(
        url,
        chat_head(url, api_key, b"Content-Length: " + length + b"\r\n"),
        [b'{"model":"demo"}'],
        timeout=8,
    )
    assert status_of(received) == 400, received[:300]
    error = json_of(received)["error"]
    assert isinstance(error, dict) and error["code"] == "invalid_content_length"


def test_a_body_shorter_than_its_content_length_is_a_400_not_a_500(
    edge: EdgeStack, api_key: str
) -> None:
    """The client sends part of the body it declared and half-closes: its framing, its 400."""
    url = edge.extra("no_origin")
    received = raw_exchange(
        url,
        chat_head(url, api_key, b"Content-Length: 100\r\n"),
        [b'{"model":'],
        timeout=15,
        half_close=True,
    )
    assert status_of(received) == 400, received[:300]
    error = json_of(received)["error"]
    assert isinstance(error, dict) and error["code"] == "incomplete_body"


def test_a_stalled_body_is_a_408_after_the_body_timeout(edge: EdgeStack, api_key: str) -> None:
    url = edge.extra("no_origin")  # PRISM_BODY_TIMEOUT_MS=1000
    started = time.monotonic()
    received = raw_exchange(
        url, chat_head(url, api_key, b"Content-Length: 100\r\n"), [b'{"model":'], timeout=15
    )
    elapsed = time.monotonic() - started
    assert status_of(received) == 408, received[:300]
    error = json_of(received)["error"]
    assert isinstance(error, dict)
    assert (error["type"], error["code"]) == ("invalid_request_error", "request_timeout")
    assert elapsed < 5  # after the binding's 1 s (the default is 10 s), not the client's timeout


# --------------------------------------------------------------------- what leaves the edge


def _store_in_redis(edge: EdgeStack, fp: str, completion: dict[str, object]) -> None:
    store = redis.Redis.from_url(edge.redis_url)
    store.set(
        entry_key(fp),
        encode_envelope(json.dumps(completion).encode(), model="demo", ttl=3600),
        ex=3600,
    )
    store.close()


COMPLETION: dict[str, object] = {
    "id": "chatcmpl-adv",
    "object": "chat.completion",
    "created": 1700000000,
    "model": "demo",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "stored"}, "finish_reason": "stop"}
    ],
}


@pytest.mark.parametrize(
    ("extra", "headers"),
    [({"stream": True}, {}), ({}, {"cache-control": "no-store"})],
    ids=["stream", "no-store"],
)
def test_the_entry_expiry_header_never_reaches_a_client(
    edge: EdgeStack, api_key: str, extra: dict[str, object], headers: dict[str, str]
) -> None:
    body = unique_body(**extra)
    _store_in_redis(edge, chat_fingerprint(body), COMPLETION)
    response = httpx.post(
        edge.url + CHAT,
        json=body,
        headers={"authorization": f"Bearer {api_key}", **headers},
        timeout=30,
    )
    assert response.status_code == 200
    assert response.headers["x-prism-edge-cache-layer"] == "redis"
    assert "x-prism-entry-expires" not in response.headers


@pytest.mark.parametrize("where", ["kv", "redis"])
def test_a_hit_asked_for_usage_ends_with_the_usage_chunk(
    edge: EdgeStack, api_key: str, where: str
) -> None:
    """An entry stored from a stream whose first client did not ask for usage has none."""
    body = unique_body()
    fp = chat_fingerprint(body)
    if where == "kv":
        entry = encode_envelope(json.dumps(COMPLETION).encode(), model="demo", ttl=3600)
        edge.kv.bulk_put([{"key": entry_key(fp), "value": entry.decode(), "expiration_ttl": 3600}])
    else:
        _store_in_redis(edge, fp, COMPLETION)
    response = httpx.post(
        edge.url + CHAT,
        json={**body, "stream": True, "stream_options": {"include_usage": True}},
        headers={"authorization": f"Bearer {api_key}", "cache-control": "no-store"},
        timeout=30,
    )
    assert response.headers["x-prism-edge-cache-layer"] == where
    events = [
        json.loads(line[6:]) for line in response.text.split("\n\n") if line.startswith("data: {")
    ]
    assert response.text.endswith("data: [DONE]\n\n")
    assert events[-1]["choices"] == [] and "usage" in events[-1]
    assert all("usage" in event for event in events)


# --------------------------------------------------------------------- clients that go away


def test_a_client_that_goes_away_cancels_the_provider_stream(edge: EdgeStack, api_key: str) -> None:
    """The runtime already propagates it (measured: the provider's stream is aborted about
    10 ms after the client's reset, against the 30 s stall it would otherwise finish after).
    The client reads the first chunk and resets the connection (what a client that drops a
    stream with unread bytes does) while the provider is stalled mid-stream. An orderly
    close (FIN) on an idle stream is only noticed by the runtime at its next write."""
    edge.provider.control.set_fault("stall_mid_stream", seconds=30, after_chunks=2)
    content = json.dumps(unique_body(stream=True)).encode()
    where = urlsplit(edge.url)
    with socket.create_connection((where.hostname, where.port)) as conn:
        length = b"Content-Length: %d\r\n" % len(content)
        conn.sendall(chat_head(edge.url, api_key, length, close=False) + content)
        conn.settimeout(10)
        first = conn.recv(65536)
        assert first.startswith(b"HTTP/1.1 200"), first[:300]
        wait_for(lambda: edge.provider.control.stats()["open_streams"] == 1)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        hung_up = time.monotonic()
    wait_for(lambda: edge.provider.control.stats()["streams_aborted"] == 1, timeout=15)
    assert time.monotonic() - hung_up < 15  # well before the stall would have ended
    assert edge.provider.control.stats()["streams_completed"] == 0
