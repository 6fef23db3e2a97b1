"""The usage recorder against a real Redis: one command per flush, a hash per project and
UTC day, a failed flush sent again and counted once (Redis stopped, an answer lost after
the write landed), and /metrics totals that include what is not flushed yet."""

from __future__ import annotations

import asyncio
import secrets
from datetime import UTC, datetime
from pathlib import Path

import httpx
import redis

from deploy.local.delay_proxy import DelayProxy
from deploy.local.redis import RedisServer
from origin.connection.redis_pipe import RedisPipe
from origin.governance.usage import UsageRecorder
from origin.providers.token_counts import Tokens
from tests.fixtures.origin import OriginFactory
from tests.polling import async_wait_for, wait_for
from tests.redis_replies import reply_as

DAY = 86_400
MONDAY = 20_000 * DAY + 3600.0  # 2024-10-04 01:00 UTC


def today() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d")


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
        k
        for k in admin.keys("prism:usage:acme:*")
        if not reply_as(str, k).endswith(("2024-10-04", "2024-10-05"))  # not MONDAY's days
    ]
    assert admin.hgetall(today) == {
        "requests.miss|k1|m": "1", "tokens_in|k1|m": "100", "tokens_out|k1|m": "20",
        "cost_micros|k1|m": "27", "requests.bypass|k2|x": "1", "tokens_in|k2|x": "5",
        "tokens_out|k2|x": "5", "unpriced|k2|x": "1", "requests.coalesced|k2|x": "1",
    }  # fmt: skip
    assert 0 < admin.ttl(today) <= 400 * DAY
    assert recorder.dropped == 0


def test_an_unavailable_redis_keeps_the_counts_until_it_is_back(redis_url: str) -> None:
    async def run() -> None:
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


def test_counts_made_while_redis_is_down_are_written_once_it_is_back(tmp_path: Path) -> None:
    server = RedisServer(workdir=tmp_path).start()
    admin = redis.Redis.from_url(server.url, decode_responses=True)

    async def run() -> UsageRecorder:
        client = RedisPipe(server.url, timeout=0.5)
        recorder = UsageRecorder(client)
        await client.execute("PING")
        server.stop()  # and nothing kept: what Redis holds afterwards came after its return
        for second in range(1, 41):  # 40 hits while Redis is down, a flush after each ten
            recorder.hit("acme", "k1", "m", 1, MONDAY + second)
            if second % 10 == 0:
                assert not await recorder.flush()  # kept, not dropped
        server.start()
        await async_wait_for(recorder.flush, within=10, interval=0.05)
        assert await recorder.flush()  # nothing left: nothing written again
        await client.close()
        return recorder

    try:
        recorder = asyncio.run(run())
        assert admin.hgetall("prism:usage:acme:2024-10-04") == {
            "requests.redis|k1|m": "40",
            "saved_micros|k1|m": "40",
        }
        assert recorder.dropped == 0 and recorder.retried == 1
        markers = admin.keys("prism:usage-batch:*")  # the retried batch's and the next one's
        assert len(markers) == 2 and all(0 < admin.ttl(m) <= 3600 for m in markers)
    finally:
        admin.close()
        server.stop()


def test_a_batch_whose_reply_was_lost_after_it_landed_is_counted_once(redis_url: str) -> None:
    """The write reaches Redis, its answer comes too late for the client: the retry finds
    the batch's marker and adds nothing."""
    admin = redis.Redis.from_url(redis_url, decode_responses=True)
    where = admin.connection_pool.connection_kwargs

    async def run(proxy: DelayProxy) -> UsageRecorder:
        client = RedisPipe(f"redis://{proxy.host}:{proxy.port}/0", timeout=0.5)
        recorder = UsageRecorder(client)
        await client.execute("PING")  # connected before the path slows down
        recorder.record("acme", "k1", "m", "miss", Tokens(100, 0, 0, 20), cost=27)
        # 0.4 s each way: the script arrives within the timeout, its answer after it.
        proxy.delay = 0.4
        assert not await recorder.flush()
        await async_wait_for(
            lambda: admin.hget(f"prism:usage:acme:{today()}", "requests.miss|k1|m")
        )
        proxy.delay = 0.0
        assert await recorder.flush()  # the same batch again: already applied
        assert await recorder.flush()
        await client.close()
        return recorder

    try:
        with DelayProxy(where["host"], where["port"], 0.0) as proxy:
            recorder = asyncio.run(run(proxy))
        assert admin.hgetall(f"prism:usage:acme:{today()}") == {
            "requests.miss|k1|m": "1",
            "tokens_in|k1|m": "100",
            "tokens_out|k1|m": "20",
            "cost_micros|k1|m": "27",
        }
        assert recorder.retried == 1 and recorder.dropped == 0
    finally:
        admin.close()


def test_a_batch_redis_refuses_is_dropped_and_counted(redis_url: str) -> None:
    admin = redis.Redis.from_url(redis_url, decode_responses=True)
    admin.set(f"prism:usage:acme:{today()}", "not a hash")  # HINCRBY fails: WRONGTYPE

    async def run() -> UsageRecorder:
        recorder = UsageRecorder(RedisPipe(redis_url))
        recorder.record("acme", "k1", "m", "miss")
        recorder.record("acme", "k2", "m", "miss")
        assert not await recorder.flush()  # an error reply: sending it again cannot help
        assert await recorder.flush()
        return recorder

    recorder = asyncio.run(run())
    assert recorder.dropped == 2 and recorder.retried == 0
    samples = {s.name: s.value for family in recorder.collect() for s in family.samples}
    assert samples["prism_usage_dropped_rows_total"] == 2
    admin.close()


def test_a_batch_a_replica_refuses_during_a_failover_is_kept_for_the_new_primary(
    tmp_path: Path,
) -> None:
    """READONLY (the recorder reached a replica) passes once it is promoted: kept, not
    dropped like a batch Redis can never take."""
    (tmp_path / "primary").mkdir()
    (tmp_path / "replica").mkdir()
    with (
        RedisServer(workdir=tmp_path / "primary") as primary,
        RedisServer(workdir=tmp_path / "replica", replica_of=primary) as replica,
    ):
        admin = redis.Redis.from_url(replica.url, decode_responses=True)

        async def run() -> UsageRecorder:
            client = RedisPipe(replica.url)
            recorder = UsageRecorder(client)
            recorder.hit("acme", "k1", "m", 3, MONDAY)
            assert not await recorder.flush()  # READONLY (or MASTERDOWN while it syncs)
            assert recorder.failures == 1 and recorder.dropped == 0
            admin.replicaof("NO", "ONE")  # the failover: the replica is the primary now
            assert await recorder.flush()
            await client.close()
            return recorder

        recorder = asyncio.run(run())
        assert admin.hgetall("prism:usage:acme:2024-10-04") == {
            "requests.redis|k1|m": "1",
            "saved_micros|k1|m": "3",
        }
        assert recorder.retried == 1
        admin.close()


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


def test_requests_an_origin_serves_while_redis_is_down_are_counted_once_it_is_back(
    tmp_path: Path, origin_factory: OriginFactory, api_key: str
) -> None:
    """A Redis outage under traffic: every answered request is in the day's usage once
    Redis is back, none twice (the brief outage used to lose a third of them)."""
    server = RedisServer(workdir=tmp_path).start()
    admin = redis.Redis.from_url(server.url, decode_responses=True)
    # The breaker closes again at once: flushes meet the dead Redis, not only wait for it.
    origin = origin_factory(
        settings={"redis_retry_after": 0.05}, REDIS_URL=server.url, PRISM_USAGE_FLUSH_INTERVAL="0.1"
    )
    usage = origin.gateway.usage
    run = secrets.token_hex(4)

    def requests() -> int:  # by any layer (without Redis: "bypass", the cache skipped)
        day = admin.hgetall(f"prism:usage:acme:{today()}").items()
        return sum(int(v) for k, v in day if reply_as(str, k).startswith("requests."))

    def ask(client: httpx.Client, n: int) -> None:
        content = f"outage {run} {n}"
        reply = client.post(
            "/v1/chat/completions",
            json={"model": "gpt-4o-mini", "messages": [{"role": "user", "content": content}]},
        )
        assert reply.status_code == 200, reply.text

    try:
        with httpx.Client(
            base_url=origin.url, headers={"authorization": f"Bearer {api_key}"}, timeout=30
        ) as client:
            server.stop()
            for n in range(40):  # answered by the provider, Redis away the whole time
                ask(client, n)
            wait_for(lambda: usage.failures >= 1)  # a flush was sent, and failed
            server.start()
            wait_for(lambda: requests() >= 40, timeout=15)
            ask(client, 40)  # flushed after every earlier batch, retries included
            wait_for(lambda: requests() >= 41, timeout=15)
        assert requests() == 41
        assert usage.retried >= 1 and origin.metric("prism_usage_dropped_rows_total") == 0
    finally:
        admin.close()
        server.stop()
