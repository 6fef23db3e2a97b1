"""Through the edge in the real local Workers runtime: what the PoP answers itself (a KV hit,
a refused key) reaches the origin as records after the response, so usage and the origin's
figures count the KV hit; what the origin answered is not told twice."""

from __future__ import annotations

import json
import secrets
from datetime import UTC, datetime

import httpx
import redis
from typer.testing import CliRunner

from deploy.cli import app
from origin.dashboard.figures import totals_of
from tests.fixtures.edge import EdgeStack
from tests.polling import wait_for

CHAT = "/v1/chat/completions"


def edge_metric(edge: EdgeStack, name: str, **labels: str) -> float:
    value = edge.origin.gateway.metrics.registry.get_sample_value(name, labels)
    return value or 0.0


def test_a_kv_hit_and_a_refused_key_reach_the_origin_as_records(
    edge: EdgeStack, api_key: str
) -> None:
    key_id = edge.key_ring.verify(api_key).key_id
    body = {"model": "demo", "messages": [{"role": "user", "content": secrets.token_hex(6)}]}
    auth = {"authorization": f"Bearer {api_key}"}
    with httpx.Client(base_url=edge.url, headers=auth, timeout=30) as http:
        assert http.post(CHAT, json=body).headers["x-prism-edge-cache-layer"] == "miss"
        kv_before = edge_metric(
            edge, "prism_edge_requests_total", route="chat", status="200", layer="kv"
        )
        # The origin's KV writer puts the entry in KV; from then on the PoP answers.
        wait_for(lambda: http.post(CHAT, json=body).headers["x-prism-edge-cache-layer"] == "kv")
        refused_before = edge_metric(
            edge, "prism_edge_requests_total", route="chat", status="401", layer="refused"
        )
        bad = http.post(CHAT, json=body, headers={"authorization": "Bearer sk-not-a-key"})
        assert bad.status_code == 401
    # Sent after the responses (waitUntil): polled for, not waited on.
    wait_for(
        lambda: (
            edge_metric(edge, "prism_edge_requests_total", route="chat", status="200", layer="kv")
            > kv_before
        ),
        timeout=10,
    )
    wait_for(
        lambda: (
            edge_metric(
                edge, "prism_edge_requests_total", route="chat", status="401", layer="refused"
            )
            == refused_before + 1
        ),
        timeout=10,
    )
    # The KV hit counts in the project's usage and in the figures prism top and the
    # dashboard read (kv among the hit layers).
    day = datetime.now(UTC).strftime("%Y-%m-%d")
    with redis.Redis.from_url(edge.redis_url) as admin:
        field = f"requests.kv|{key_id}|demo".encode()
        wait_for(lambda: int(admin.hget(f"prism:usage:acme:{day}", field) or 0) >= 1, timeout=10)
    totals = totals_of(edge.origin.gateway.metrics.registry.collect(), 0.0)
    assert totals.requests["kv"] >= 1 and totals.hit_ratio is not None
    # Both records reach the request log, as the edge's: prism logs finds them by project.
    shown = CliRunner().invoke(
        app,
        ["logs", "--json", "--project", "acme", "--layer", "kv"],
        env={"REDIS_URL": edge.redis_url},
    )
    kv_hits = [json.loads(line) for line in shown.stdout.splitlines() if line.strip()]
    assert any(
        r["source"] == "edge" and r["key"] == key_id and r["status"] == 200 and "kv" in r["stages"]
        for r in kv_hits
    ), shown.stdout
    # Only the PoP's own answers are told: the miss the origin answered is its record.
    assert (
        edge_metric(edge, "prism_edge_requests_total", route="chat", status="200", layer="miss")
        == 0
    )


def test_kv_hits_one_after_another_reach_the_origin_in_few_batches(
    edge: EdgeStack, api_key: str
) -> None:
    """A batch waits ``GATHER`` (0.5 s) for what the isolate answers next: back-to-back KV hits
    cost the origin one POST between them, not one each (which slowed every hit)."""
    body = {"model": "demo", "messages": [{"role": "user", "content": secrets.token_hex(6)}]}
    auth = {"authorization": f"Bearer {api_key}"}
    with httpx.Client(base_url=edge.url, headers=auth, timeout=30) as http:
        assert http.post(CHAT, json=body).headers["x-prism-edge-cache-layer"] == "miss"
        wait_for(lambda: http.post(CHAT, json=body).headers["x-prism-edge-cache-layer"] == "kv")
        batches = edge_metric(edge, "prism_edge_request_record_batches_total")
        received = edge_metric(edge, "prism_edge_request_records_total", outcome="received")
        for _ in range(20):
            assert http.post(CHAT, json=body).headers["x-prism-edge-cache-layer"] == "kv"
    wait_for(
        lambda: (
            edge_metric(edge, "prism_edge_request_records_total", outcome="received")
            >= received + 20
        ),
        timeout=10,
    )
    # One batch, two if the gathering straddled them, three with the polling's records.
    assert edge_metric(edge, "prism_edge_request_record_batches_total") - batches <= 3
