"""The usage recorder against a real Redis: one command per flush, a hash per project and
UTC day, nothing counted twice, and /metrics totals that include what is not flushed yet."""

from __future__ import annotations

import asyncio

import redis

from deploy.local.ports import free_port
from origin.connection.redis_pipe import RedisPipe
from origin.governance.usage import UsageRecorder
from origin.providers.token_counts import Tokens
from tests.redis_replies import reply_as

DAY = 86_400
MONDAY = 20_000 * DAY + 3600.0  # 2024-10-04 01:00 UTC


def test_a_flush_writes_each_day_once_and_counts_nothing_twice(redis_url: str) -> None:
    admin = redis.Redis.from_url(redis_url, decode_responses=True)

    async def run() -> UsageRecorder:
        recorder = UsageRecorder(RedisPipe(redis_url))
        recorder.hit("acme", "k1", "m", 40, MONDAY)
        recorder.hit("acme", "k1", "m", 40, MONDAY + 10)
        recorder.hit("acme", "k1", "m", 40, MONDAY + DAY)  # the next UTC day
        recorder.hit("beta", "k9", "m", 0, MONDAY)
        recorder.hit("beta", "k9", "m", 0, MONDAY, layer="semantic")
        recorder.record("acme", "k1", "m", "miss", Tokens(100, 0, 0, 20), cost=27)
        recorder.record("acme", "k2", "x", "bypass", Tokens(5, 0, 0, 5), cost=None)
        recorder.record("acme", "k2", "x", "coalesced")
        before = admin.info("commandstats").get("cmdstat_eval", {}).get("calls", 0)
        assert await recorder.flush()
        assert admin.info("commandstats")["cmdstat_eval"]["calls"] == before + 1  # one command
        assert await recorder.flush()  # nothing new: nothing written again
        return recorder

    recorder = asyncio.run(run())
    monday = admin.hgetall("prism:usage:acme:2024-10-04")
    assert monday == {"requests.redis|k1|m": "2", "saved_micros|k1|m": "80"}
    assert admin.hgetall("prism:usage:acme:2024-10-05") == {
        "requests.redis|k1|m": "1",
        "saved_micros|k1|m": "40",
    }
    assert admin.hgetall("prism:usage:beta:2024-10-04") == {
        "requests.redis|k9|m": "1",
        "requests.semantic|k9|m": "1",
    }
    [today] = [
        k for k in admin.keys("prism:usage:acme:*") if not reply_as(str, k).endswith(("04", "05"))
    ]
    assert admin.hgetall(today) == {
        "requests.miss|k1|m": "1", "tokens_in|k1|m": "100", "tokens_out|k1|m": "20",
        "cost_micros|k1|m": "27", "requests.bypass|k2|x": "1", "tokens_in|k2|x": "5",
        "tokens_out|k2|x": "5", "unpriced|k2|x": "1", "requests.coalesced|k2|x": "1",
    }  # fmt: skip
    assert 0 < admin.ttl(today) <= 400 * DAY
    assert recorder.dropped == 0


def test_a_failed_flush_is_dropped_and_an_unavailable_redis_keeps_the_counts(
    redis_url: str,
) -> None:
    async def run() -> None:
        dead = UsageRecorder(RedisPipe(f"redis://127.0.0.1:{free_port()}", timeout=0.5))
        dead.hit("acme", "k1", "m", 5, MONDAY)
        assert not await dead.flush()
        assert dead.dropped == 1 and await dead.flush()  # dropped, not retried

        available = False
        waiting = UsageRecorder(RedisPipe(redis_url), lambda: available)
        waiting.hit("acme", "k1", "m", 5, MONDAY)
        assert not await waiting.flush()  # Redis unavailable: the counts wait
        available = True
        waiting.hit("acme", "k1", "m", 5, MONDAY)
        assert await waiting.flush()

    asyncio.run(run())
    admin = redis.Redis.from_url(redis_url, decode_responses=True)
    assert admin.hgetall("prism:usage:acme:2024-10-04") == {
        "requests.redis|k1|m": "2",
        "saved_micros|k1|m": "10",
    }


def test_metrics_totals_count_flushed_and_pending_alike(redis_url: str) -> None:
    async def run() -> None:
        recorder = UsageRecorder(RedisPipe(redis_url))
        recorder.record("acme", "k1", "m", "miss", Tokens(100, 0, 0, 20), cost=2_000_000)
        assert await recorder.flush()
        recorder.record("acme", "k2", "m", "miss", Tokens(1, 0, 0, 2), cost=500_000)
        recorder.hit("acme", "k1", "m", 250_000, MONDAY)
        samples = {
            (s.name, s.labels.get("direction", "")): s.value
            for family in recorder.collect()
            for s in family.samples
        }
        assert samples[("prism_usage_cost_usd_total", "")] == 2.5
        assert samples[("prism_usage_saved_usd_total", "")] == 0.25
        assert samples[("prism_usage_tokens_total", "in")] == 101
        assert samples[("prism_usage_tokens_total", "out")] == 22

    asyncio.run(run())
