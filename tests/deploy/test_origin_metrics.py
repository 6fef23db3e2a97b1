"""`prism top`'s reading of an origin: /metrics text as the real registry renders it,
rates between scrapes (a restart included), /healthz in detail, and spend."""

from __future__ import annotations

import pytest

from deploy.origin_metrics import frame_of, parse_health, parse_metrics, parse_spend
from origin.dashboard import rates_between
from origin.governance.usage import UsageRecorder
from origin.metrics import Metrics
from origin.providers.token_counts import Tokens

HEALTH = {
    "status": "ok",
    "version": "r42",
    "uptime_seconds": 61.5,
    "redis": {"ok": True},
    "providers": {
        "openai": {"state": "healthy", "reason": None, "recent_calls": 12, "error_rate": 0.0,
                   "ttfb_p50_ms": 80.0, "ttfb_p95_ms": 150.0, "latency_p50_ms": 300.0,
                   "latency_p95_ms": 900.0},
        "groq": {"state": "demoted", "reason": "3 failures in a row", "recent_calls": 5,
                 "error_rate": 0.6, "ttfb_p50_ms": None, "ttfb_p95_ms": None,
                 "latency_p50_ms": 40.0, "latency_p95_ms": 55.0},
    },
    "kv_writer": {"enabled": True, "queued": 7},
}  # fmt: skip


def metrics_text(redis_hits: int, misses: int, sent: int) -> str:
    """/metrics as a real origin's registry renders it."""
    metrics = Metrics()
    usage = UsageRecorder(redis=None)  # type: ignore[arg-type]  # never flushed here
    metrics.registry.register(usage)
    for _ in range(redis_hits):
        metrics.record_request("chat", 200, "redis", 0.002)
    for _ in range(misses):
        metrics.record_request("chat", 200, "miss", 0.3)
    metrics.record_request("chat", 502, "bypass", 0.1)
    metrics.record_request("embeddings", 200, "semantic", 0.01)
    metrics.record_edge_request("chat", 200, "kv", 0.003)  # told by the edge's records
    metrics.kv_sent.inc(sent)
    metrics.kv_queue.set(3)
    metrics.kv_dropped.labels("queue_full").inc(2)
    metrics.provider_attempts.labels("openai", "ok").inc(misses)
    metrics.provider_attempts.labels("openai", "timeout").inc(1)
    metrics.provider_state.labels("groq").set(2)
    metrics.loop_lag.set(1.25)
    metrics.loop_lag_refused.inc(3)
    usage.record("acme", "k1", "gpt-4o-mini", "miss", Tokens(10, 0, 0, 5), cost=1_500_000)
    return metrics.render().decode()


def test_metrics_text_reads_as_totals_by_layer() -> None:
    totals = parse_metrics(metrics_text(redis_hits=6, misses=2, sent=4), at=100.0)
    assert totals.requests == {"miss": 2, "kv": 1, "redis": 6, "semantic": 1, "bypass": 1}
    assert totals.server_errors == 1
    assert totals.hit_ratio == pytest.approx(8 / 10)  # (kv + redis + semantic) / (those + miss)
    assert totals.provider_calls == {"openai": 3}
    assert totals.provider_failures == {"openai": 1}
    assert totals.provider_state == {"groq": "demoted"}
    assert (totals.kv_queued, totals.kv_sent, totals.kv_dropped) == (3, 4, 2)
    assert totals.cost_usd == {"acme": 1.5}
    assert (totals.loop_lag, totals.loop_lag_refused) == (1.25, 3)  # the event loop's lag


def test_rates_come_from_two_scrapes_and_survive_a_restart() -> None:
    before = parse_metrics(metrics_text(redis_hits=6, misses=2, sent=4), at=100.0)
    after = parse_metrics(metrics_text(redis_hits=26, misses=7, sent=14), at=110.0)
    rates = rates_between(before, after)
    assert rates is not None
    assert rates.requests["redis"] == 2.0 and rates.requests["miss"] == 0.5
    assert rates.requests["bypass"] == 0.0
    assert rates.hit_ratio == pytest.approx(20 / 25)
    assert rates.kv_sent == 1.0
    assert rates_between(after, after) is None  # no time passed
    restarted = parse_metrics(metrics_text(redis_hits=3, misses=1, sent=0), at=120.0)
    again = rates_between(after, restarted)
    assert again is not None and again.requests["redis"] == 0.3  # counted from zero again


def test_the_admin_health_reads_providers_and_a_public_one_is_refused() -> None:
    report = parse_health(HEALTH)
    assert report.version == "r42" and report.redis_ok and report.kv_queued == 7
    assert report.providers["openai"].p50_ms == 80.0  # time to first byte when streamed
    groq = report.providers["groq"]
    assert groq.state == "demoted" and groq.p50_ms == 40.0  # else the whole answer's
    assert groq.reason == "3 failures in a row"
    with pytest.raises(ValueError, match="admin listener"):
        parse_health({"status": "ok", "version": "r42"})
    with pytest.raises(ValueError):
        parse_metrics("this is { not prometheus", at=0)


def test_spend_is_today_with_the_admin_key_and_this_process_without() -> None:
    totals = parse_metrics(metrics_text(1, 1, 0), at=5.0)
    health = parse_health(HEALTH)
    without = frame_of("http://x", None, totals, health, None, ("no key",))
    assert without.spend_scope == "process" and without.spend["acme"].cost_usd == 1.5
    assert without.rates is None
    assert without.as_dict()["requests"]["kv"] == {"total": 1.0, "per_second": None}
    latest = {
        "projects": {
            "acme": {"requests": {"redis": 9, "semantic": 4, "miss": 2, "bypass": 1,
                                  "coalesced": 0},
                     "cost_usd": 0.25, "saved_usd": 0.5},
        }
    }  # fmt: skip
    today = parse_spend(latest)
    assert today is not None and today["acme"].hits == 13 and today["acme"].calls == 3
    frame = frame_of("http://x", totals, parse_metrics(metrics_text(3, 1, 0), 7.0), health, today)
    assert frame.spend_scope == "today"
    as_json = frame.as_dict()
    assert as_json["spend"]["projects"]["acme"]["cost_usd"] == 0.25
    assert as_json["requests"]["redis"]["per_second"] == 1.0
    assert as_json["providers"]["groq"]["state"] == "demoted"
    assert parse_spend({"projects": None}) is None  # Redis could not be read
