"""The semantic index: a Redis stream per partition, mirrored in each origin process (a
real Redis; two index objects stand for two origin processes)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
import redis

from origin.connection.redis_pipe import RedisPipe
from origin.store.semantic.index import RedisStreamIndex, index_key

np = pytest.importorskip("numpy", reason="the semantic extra is not installed")

from origin.store.semantic.mirror import EXACT_UP_TO, Mirror  # noqa: E402  (needs numpy)


def unit(seed: int, dimensions: int = 384) -> object:
    vector = np.random.default_rng(seed).standard_normal(dimensions).astype(np.float32)
    return vector / np.linalg.norm(vector)


def near(vector: object, cosine: float, seed: int) -> object:
    """A unit vector at ``cosine`` from ``vector``."""
    base = np.asarray(vector)
    other = np.asarray(unit(seed, len(base)))
    other = other - (other @ base) * base
    other /= np.linalg.norm(other)
    out = cosine * base + np.sqrt(1 - cosine**2) * other
    return out.astype(np.float32)


@pytest.fixture
async def pipe(redis_url: str) -> AsyncIterator[RedisPipe]:
    client = RedisPipe(redis_url, 1.0)
    yield client
    await client.close()


async def test_what_one_process_indexes_another_finds_and_a_removal_reaches_both(
    pipe: RedisPipe, redis_url: str
) -> None:
    writer, reader = RedisStreamIndex(pipe), RedisStreamIndex(pipe)
    admin = redis.Redis.from_url(redis_url)
    now = int(time.time())
    question = np.asarray(unit(1))
    assert await reader.refresh("p") == 0  # nothing yet: a miss without the model

    await writer.add("p", "fp-a", question.tobytes(), "capital of France?", now + 100)
    await writer.add("p", "fp-old", np.asarray(unit(2)).tobytes(), "expired", now - 1)
    assert await reader.refresh("p") == 2
    found = reader.nearest("p", question, 0.9, 3)
    assert [c.fingerprint for c in found] == ["fp-a"]
    assert found[0].text == "capital of France?" and found[0].score > 0.999  # float16: ~1e-3
    assert [c.fingerprint for c in reader.nearest("p", np.asarray(unit(2)), -1.0, 3)] == ["fp-a"]
    assert reader.nearest("other", question, 0.0, 3) == []  # another partition: nothing
    assert now + 99 <= admin.expiretime(index_key("p")) <= now + 100  # with its last record

    await writer.remove("p", "fp-a")
    assert await reader.refresh("p") == 0  # removed, and the expired one compacted away
    assert reader.nearest("p", question, 0.5, 3) == []
    admin.close()


async def test_a_catch_up_reads_only_what_is_new_and_a_new_process_reads_it_all(
    pipe: RedisPipe, redis_url: str
) -> None:
    index = RedisStreamIndex(pipe)
    now = int(time.time())
    for i in range(5):
        await index.add("p", f"fp{i}", np.asarray(unit(i)).tobytes(), f"q{i}", now + 60)
    assert await index.refresh("p") == 5
    mirror = index.mirror("p")
    assert mirror is not None and mirror.size == 5
    await index.add("p", "fp5", np.asarray(unit(5)).tobytes(), "q5", now + 60)
    assert await index.refresh("p") == 6 and mirror.size == 6  # one row more, not 5 again
    assert await index.refresh("p") == 6 and mirror.size == 6
    redis.Redis.from_url(redis_url).script_flush()  # the add script is loaded again
    await index.add("p", "fp6", np.asarray(unit(6)).tobytes(), "q6", now + 60)
    fresh = RedisStreamIndex(pipe)  # a restarted process
    assert await fresh.refresh("p") == 7


async def test_the_first_record_sets_the_width_and_another_width_is_ignored(
    pipe: RedisPipe,
) -> None:
    index = RedisStreamIndex(pipe)
    now = int(time.time())
    await index.add("p", "ok", np.asarray(unit(1)).tobytes(), "y", now + 60)
    await index.add("p", "small", np.ones(8, dtype=np.float32).tobytes(), "x", now + 60)
    assert await index.refresh("p") == 1
    assert [c.fingerprint for c in index.nearest("p", np.asarray(unit(1)), 0.5, 3)] == ["ok"]
    await index.add("q", "eight", np.ones(8, dtype=np.float32).tobytes(), "x", now + 60)
    assert await index.refresh("q") == 1  # another model's partition: its own width
    assert index.nearest("q", np.ones(8, dtype=np.float32) / np.sqrt(8), 0.9, 3)[0].text == "x"


def test_past_the_exact_scan_the_shortlist_still_finds_close_neighbours() -> None:
    count = EXACT_UP_TO * 3
    rng = np.random.default_rng(7)
    matrix = rng.standard_normal((count, 384)).astype(np.float32)
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    mirror = Mirror(384)
    fps = [f"fp{i}" for i in range(count)]
    mirror.append(fps, [2_000_000_000] * count, matrix.astype("<f2").tobytes(), fps)
    misses = 0
    for seed in range(50):
        target = int(rng.integers(count))
        query = np.asarray(near(matrix[target], 0.9, seed))
        found = mirror.nearest(query, 0.85, 3, time.time())
        misses += not found or found[0].fingerprint != f"fp{target}"
    assert misses == 0


def test_compaction_drops_dead_and_expired_rows_and_keeps_the_live_ones() -> None:
    mirror = Mirror(384)
    now = time.time()
    vectors = [np.asarray(unit(i)) for i in range(4)]
    mirror.append(
        ["a", "b", "c", "d"],
        [int(now) + 60, int(now) - 1, int(now) + 60, int(now) + 60],
        np.stack(vectors).astype("<f2").tobytes(),
        ["ta", "tb", "tc", "td"],
    )
    mirror.remove("c")
    mirror.compact(now)
    assert mirror.size == 2 and mirror.dead == 0
    assert [c.fingerprint for c in mirror.nearest(vectors[3], 0.9, 3, now)] == ["d"]
    assert [c.text for c in mirror.nearest(vectors[0], 0.9, 3, now)] == ["ta"]
    mirror.append(["a"], [int(now) + 90], vectors[1].astype("<f2").tobytes(), ["new a"])
    assert mirror.nearest(vectors[0], 0.9, 3, now) == []  # replaced by a newer record
    assert [c.text for c in mirror.nearest(vectors[1], 0.9, 3, now)] == ["new a"]
