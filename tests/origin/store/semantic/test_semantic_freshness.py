"""The semantic cache under load, over real HTTP (real origins, a real Redis, the provider
stand-in, the real model): a lookup that would wait out its timeout is shed at once and
its question still indexed; a stored question is findable at once by the origin that
stored it, and pushed to another origin sharing the Redis without a question asked there."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
import redis
from prometheus_client import CollectorRegistry

from deploy.local.provider import ProviderServer
from origin.connection.redis_pipe import RedisPipe
from origin.store.semantic.cache import SemanticCache
from origin.store.semantic.embedder import Embedder
from origin.store.semantic.index import INDEX_KEY_PREFIX, RedisStreamIndex
from origin.store.semantic.notify import IndexNotifier
from origin.store.semantic.partition import Question
from tests.fixtures.origin import OriginFactory, RunningOrigin
from tests.fixtures.semantic import CHAT, LAYER, QUESTION, ask, first, opt_in
from tests.polling import async_wait_for, wait_for
from tests.redis_replies import stream_fields

np = pytest.importorskip("numpy", reason="the semantic extra is not installed")

PARAPHRASE = "what is the capital of france"


def records(admin: redis.Redis) -> int:
    return sum(
        1
        for key in admin.keys(INDEX_KEY_PREFIX + "*")
        for fields in stream_fields(bytes, admin.xrange(key))
        if int(fields[b"e"])
    )


def test_a_lookup_beyond_the_timeout_is_shed_and_its_question_still_indexed(
    origin_factory: OriginFactory, api_key: str, admin: redis.Redis
) -> None:
    opt_in(admin)
    # Any embedding takes longer than this: once one is measured, every lookup is shed.
    origin = origin_factory(PRISM_SEMANTIC_TIMEOUT="0.000001")
    with httpx.Client(
        base_url=origin.url, headers={"authorization": f"Bearer {api_key}"}, timeout=30
    ) as http:
        first(http, origin, ask(QUESTION))  # loads the model and measures it
        for text in ("How tall is the Eiffel tower?", PARAPHRASE):
            response = http.post(CHAT, json=ask(text))
            assert response.status_code == 200 and response.headers[LAYER] == "miss"
        origin.wait_stored()
    assert origin.metric("prism_semantic_lookups_total", outcome="shed") == 2
    assert records(admin) == 3  # shed lookups' questions are indexed all the same


async def test_a_lookup_joins_a_queue_within_the_max_wait_and_is_shed_behind_a_longer_one(
    redis_url: str,
) -> None:
    pipe = RedisPipe(redis_url, 1.0)
    embedder = Embedder(None)
    later: set[asyncio.Future[None]] = set()
    registry = CollectorRegistry()
    cache = SemanticCache(
        RedisStreamIndex(pipe), embedder, pipe, registry,
        lambda work: later.add(asyncio.ensure_future(work)), timeout=60.0, max_wait=0.001,
    )  # fmt: skip

    def shed() -> float:
        return registry.get_sample_value("prism_semantic_lookups_total", {"outcome": "shed"}) or 0

    try:
        await embedder.embed("warm up the model")  # loaded, its cost measured (> 1 ms)
        assert embedder.cost is not None and embedder.cost > 0.001
        partition = "f" * 64
        # Nothing ahead: looked up, however long its own embedding takes.
        await cache.lookup(Question(partition, "How tall is the Eiffel tower?"), 0.9)
        assert shed() == 0
        # Three lookups' texts queued ahead (the drainer has not run: no await since).
        ahead = [embedder.embed(f"queued question {n}") for n in range(3)]
        _, pending = await cache.lookup(Question(partition, "How old is the Eiffel tower?"), 0.9)
        assert shed() == 1
        assert pending is not None and await pending.vector is not None  # still embedded
        await asyncio.gather(*ahead)
    finally:
        await asyncio.gather(*later)
        cache.close()
        await pipe.close()


def test_the_storing_origin_finds_a_paraphrase_as_soon_as_its_entry_is_stored(
    client: httpx.Client, origin: RunningOrigin, admin: redis.Redis, provider: ProviderServer
) -> None:
    opt_in(admin)
    first(client, origin, ask("How tall is the Eiffel tower?"))  # the model loaded
    semantic = origin.gateway.semantic
    assert semantic is not None
    response = client.post(CHAT, json=ask(QUESTION))
    assert response.headers[LAYER] == "miss"
    # As soon as the exact entry is in Redis, before the index's own write is awaited.
    wait_for(lambda: admin.keys("prism:v1:*") and len(admin.keys("prism:v1:*")) == 2, 15, 0.001)
    answered = client.post(CHAT, json=ask(PARAPHRASE))
    assert answered.headers[LAYER] == "semantic"


def test_another_origin_learns_a_new_record_without_a_question_asked(
    origin_factory: OriginFactory, api_key: str, admin: redis.Redis
) -> None:
    opt_in(admin)
    writer, reader = origin_factory(), origin_factory()  # two origins, one Redis
    headers = {"authorization": f"Bearer {api_key}"}
    with (
        httpx.Client(base_url=writer.url, headers=headers, timeout=30) as to_writer,
        httpx.Client(base_url=reader.url, headers=headers, timeout=30) as to_reader,
    ):
        # The reader has read the partition once (a question of its own in it).
        first(to_reader, reader, ask("How tall is the Eiffel tower?"))
        semantic = reader.gateway.semantic
        assert semantic is not None and semantic.notifier is not None
        index = semantic.index
        assert isinstance(index, RedisStreamIndex)
        (partition,) = list(index._mirrors)
        mirror = index.mirror(partition)
        assert mirror is not None and mirror.live == 1
        wait_for(lambda: semantic.notifier is not None and semantic.notifier.subscribed.is_set())
        first(to_writer, writer, ask(QUESTION))
        wait_for(lambda: mirror.live == 2, 15, 0.001)  # pushed: nothing asked of the reader
        answered = to_reader.post(CHAT, json=ask(PARAPHRASE))
        assert answered.headers[LAYER] == "semantic"


async def test_a_notification_catches_up_a_partition_only_where_it_is_mirrored(
    redis_url: str,
) -> None:
    pipe = RedisPipe(redis_url, 1.0)
    writer, reader, stranger = (RedisStreamIndex(pipe) for _ in range(3))
    notifiers = [
        IndexNotifier(redis_url, index.notified, index.notified_all) for index in (reader, stranger)
    ]
    try:
        for notifier in notifiers:
            notifier.start()
        assert await reader.refresh("p") == 0  # the reader mirrors "p"; the stranger does not
        await async_wait_for(lambda: all(n.subscribed.is_set() for n in notifiers))
        vector = np.full(384, 1 / np.sqrt(384), dtype=np.float32)
        await writer.add("p", "fp", vector.tobytes(), "q", int(time.time()) + 60)
        assert [c.fingerprint for c in writer.nearest("p", vector, 0.9, 3)] == ["fp"]  # at once
        mirror = reader.mirror("p")
        assert mirror is not None
        await async_wait_for(lambda: mirror.live == 1, 15, 0.001)
        await async_wait_for(lambda: notifiers[1].received == 1)
        assert stranger.mirror("p") is None  # never asked there: not read for a notification
    finally:
        for notifier in notifiers:
            notifier.stop()
        await pipe.close()
