"""The edge's request records at a real origin (real Redis, real HTTP): only a batch the
edge signed is taken; its KV hits count in usage and in the edge's request metric."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import httpx
import orjson
import redis

from edge.request_log import FIELDS
from origin.requestlog.redis_window import entry_records
from prism import body_digest, sign_forward
from prism import headers as h
from prism.routes import REQUEST_LOG_PATH
from tests.fixtures.origin import FORWARD_SECRET, RunningOrigin
from tests.polling import wait_for
from tests.redis_replies import stream_fields

KV_HIT: dict[str, Any] = {
    "ts": time.time(),
    "id": "edge-1",
    "source": "edge",
    "method": "POST",
    "path": "/v1/chat/completions",
    "api": "chat",
    "status": 200,
    "layer": "kv",
    "project": "acme",
    "key": "k1",
    "model": "gpt-4o-mini",
    "stream": False,
    "usage": {"prompt_tokens": 1000, "completion_tokens": 500, "total_tokens": 1500},
    "stages": "auth;dur=0.10, kv;dur=3.00",
}
REFUSED: dict[str, Any] = {"ts": time.time(), "id": "edge-2", "method": "POST", "path": "/v1/chat/completions",
           "api": "chat", "status": 401, "layer": "refused", "error": "invalid_api_key",
           "stages": ""}  # fmt: skip


def send(
    origin: RunningOrigin,
    records: list[dict[str, Any]],
    *,
    dropped: int = 0,
    secret: str = FORWARD_SECRET,
    tamper: bool = False,
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    fields = list(FIELDS)
    rows = [
        [int(record["ts"] * 1000) if name == "ts_ms" else record.get(name, "") for name in fields]
        for record in records
    ]
    body = orjson.dumps({"fields": fields, "records": rows, "pop": "FRA", "dropped": dropped})
    signed = sign_forward(
        secret.encode(), method="POST", path=REQUEST_LOG_PATH, project="edge", key_id="-",
        fingerprint=body_digest(body), now=time.time(),
    )  # fmt: skip
    sent = body.replace(b"acme", b"evil") if tamper else body
    return httpx.post(
        origin.url + REQUEST_LOG_PATH,
        content=sent,
        headers={h.FORWARD: signed, "content-type": "application/json"}
        if headers is None
        else headers,
        timeout=10,
    )


def test_a_signed_batch_counts_its_kv_hits_in_usage_and_every_record_in_the_metric(
    origin: RunningOrigin, admin: redis.Redis
) -> None:
    answer = send(origin, [KV_HIT, REFUSED], dropped=3)
    assert answer.status_code == 204, answer.text
    assert origin.metric("prism_edge_requests_total", route="chat", status="200", layer="kv") == 1
    assert (
        origin.metric("prism_edge_requests_total", route="chat", status="401", layer="refused") == 1
    )
    assert origin.metric("prism_edge_request_records_total", outcome="received") == 2
    assert origin.metric("prism_edge_request_records_total", outcome="dropped") == 3
    # What the origin answered itself is another family: the records are not its requests.
    assert origin.metric("prism_origin_requests_total", route="chat", status="200", layer="kv") == 0
    day = datetime.fromtimestamp(KV_HIT["ts"], UTC).strftime("%Y-%m-%d")

    def counted() -> dict[bytes, bytes] | None:
        found: dict[bytes, bytes] = admin.hgetall(f"prism:usage:acme:{day}")  # type: ignore[assignment]
        return found if b"requests.kv|k1|gpt-4o-mini" in found else None

    usage = wait_for(counted, 10)
    assert usage[b"requests.kv|k1|gpt-4o-mini"] == b"1"
    # Saved what the entry's tokens cost at the model's price: nothing was spent.
    assert int(usage[b"saved_micros|k1|gpt-4o-mini"]) > 0
    assert (
        b"cost_micros|k1|gpt-4o-mini" not in usage or usage[b"cost_micros|k1|gpt-4o-mini"] == b"0"
    )


def test_only_the_edge_can_send_records(origin: RunningOrigin, api_key: str) -> None:
    # No forward header: an API key opens nothing here.
    by_key = send(origin, [KV_HIT], headers={"authorization": f"Bearer {api_key}"})
    assert by_key.status_code == 401 and by_key.json()["error"]["code"] == "edge_only"
    forged = send(origin, [KV_HIT], secret="not-the-forward-secret-0123456789")
    assert forged.status_code == 401 and forged.json()["error"]["code"] == "invalid_forward"
    # Signed, then changed on the way (another project's usage): refused, nothing counted.
    tampered = send(origin, [KV_HIT], tamper=True)
    assert tampered.status_code == 401
    assert tampered.headers[h.FORWARD_REJECTED] == "body"
    assert origin.metric("prism_edge_request_records_total", outcome="received") == 0


def test_a_batch_that_is_not_records_is_a_clear_400(origin: RunningOrigin) -> None:
    for body in (b"[1, 2]", b"not json", b'{"fields": ["ts"], "records": [[1, 2]]}'):
        signed = sign_forward(
            FORWARD_SECRET.encode(), method="POST", path=REQUEST_LOG_PATH, project="edge",
            key_id="-", fingerprint=body_digest(body), now=time.time(),
        )  # fmt: skip
        answer = httpx.post(
            origin.url + REQUEST_LOG_PATH, content=body, headers={h.FORWARD: signed}, timeout=10
        )
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["type"] == "invalid_request_error"


def test_the_records_reach_the_log_and_their_delivery_does_not(
    origin: RunningOrigin, admin: redis.Redis
) -> None:
    def window() -> list[dict[str, Any]]:
        entries = stream_fields(bytes, admin.xrange("prism:log:-"))
        return [record for fields in entries for record in entry_records(fields)]

    assert send(origin, [REFUSED]).status_code == 204
    assert send(origin, [{**REFUSED, "id": "edge-3"}]).status_code == 204
    # The window is written in order: once the second batch's record is there, so is
    # anything made before it, the first delivery's own record had it been made one.
    wait_for(lambda: any(r["id"] == "edge-3" for r in window()), 10)
    found = window()
    assert [(r["id"], r["source"]) for r in found] == [("edge-2", "edge"), ("edge-3", "edge")]
