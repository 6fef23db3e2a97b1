"""RedisCache's own logic against a small in-memory fake of the RedisClient interface (no
server): lookup decoding, the script reload, the breaker, store, and the revoked set kept
in memory for when Redis is unavailable."""

from __future__ import annotations

from typing import Any

import pytest

from origin.connection.redis_client import (
    Arg,
    NoScriptError,
    PreparedCommand,
    RedisClientError,
    RedisConnectionError,
    RedisReplyError,
)
from origin.metrics import Metrics
from origin.store.redis_cache import UNAVAILABLE, Lookup, RedisCache
from prism import REVOKED_KEY, AuthenticationError, entry_key
from tests.polling import async_wait_for

FP = "e" * 64


class FakeRedis:
    """Strings, the revoked set and loaded scripts in memory; ``failure`` fails every
    command; ``calls`` records what was asked, in order."""

    def __init__(self) -> None:
        self.strings: dict[str, bytes] = {}
        self.revoked: set[str] = set()
        self.scripts: set[str] = set()
        self.failure: RedisClientError | None = None
        self.calls: list[tuple[Any, ...]] = []
        self.resets = 0

    async def execute(self, *args: Arg) -> Any:
        self.calls.append(args)
        if self.failure is not None:
            raise self.failure
        match args:
            case ("SISMEMBER", set_key, member):
                assert set_key == REVOKED_KEY
                return int(member in self.revoked)
            case ("SMEMBERS", set_key):
                assert set_key == REVOKED_KEY
                return [member.encode() for member in self.revoked]
            case ("SCRIPT", "LOAD", _):
                self.scripts.add("sha1")
                return b"sha1"
            case ("SET", key, bytes(value), "EX", int()):
                self.strings[str(key)] = value
                return b"OK"
            case ("PING",):
                return b"PONG"
        raise AssertionError(f"unexpected command {args}")

    async def run(self, command: PreparedCommand, *args: Arg) -> Any:
        self.calls.append((*command.leading, *args))
        if self.failure is not None:
            raise self.failure
        match (*command.leading, *args):
            case ("EVALSHA", sha, 3, set_key, key, policy, key_id, _counted):
                assert set_key == REVOKED_KEY
                if (sha.decode() if isinstance(sha, bytes) else sha) not in self.scripts:
                    raise NoScriptError("NOSCRIPT No matching script.")
                if key_id in self.revoked:
                    return [1]
                return [0, self.strings.get(str(key)), self.strings.get(str(policy))]
        raise AssertionError(f"unexpected command {command.leading} {args}")

    def reset(self) -> None:
        self.resets += 1

    async def drain(self) -> None:
        self.calls.append(("drain",))

    async def close(self) -> None:
        pass


@pytest.fixture
def fake() -> FakeRedis:
    return FakeRedis()


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()


def errors(metrics: Metrics, op: str) -> float:
    return metrics.registry.get_sample_value("prism_redis_errors_total", {"op": op}) or 0.0


async def test_lookup_decodes_a_miss_a_hit_and_a_revoked_key(fake: FakeRedis) -> None:
    cache = RedisCache(fake, Metrics())
    assert await cache.lookup("key1", FP) == Lookup(True, False, None)
    fake.strings[entry_key(FP)] = b"entry"
    assert await cache.lookup("key1", FP) == Lookup(True, False, b"entry")
    fake.revoked.add("key1")
    assert await cache.lookup("key1", FP) == Lookup(True, True, None)  # no entry for it
    assert await cache.lookup("key1", None) == Lookup(True, True, None)
    assert await cache.lookup("key2", None) == Lookup(True, False, None)
    assert fake.calls[-1] == ("SISMEMBER", REVOKED_KEY, "key2")  # no entry read


async def test_the_script_is_loaded_once_and_again_when_redis_lost_it(fake: FakeRedis) -> None:
    cache = RedisCache(fake, Metrics())
    fake.strings[entry_key(FP)] = b"entry"
    for _ in range(3):
        assert (await cache.lookup("key1", FP)).entry == b"entry"
    assert [c for c in fake.calls if c[0] == "SCRIPT"] == [("SCRIPT", "LOAD", fake.calls[0][2])]
    fake.scripts.clear()  # Redis restarted
    assert (await cache.lookup("key1", FP)).entry == b"entry"
    assert len([c for c in fake.calls if c[0] == "SCRIPT"]) == 2


async def test_a_failure_opens_the_breaker_and_a_ping_closes_it(
    fake: FakeRedis, metrics: Metrics
) -> None:
    cache = RedisCache(fake, metrics, retry_after=3600)
    fake.failure = RedisConnectionError("refused")
    assert await cache.lookup("key1", FP) == UNAVAILABLE
    assert errors(metrics, "lookup") == 1 and not cache.available
    asked = len(fake.calls)
    fake.failure = None
    assert await cache.lookup("key1", FP) == UNAVAILABLE  # not even asked while open
    assert not await cache.store(FP, b"entry", 60)
    assert len(fake.calls) == asked
    assert await cache.ping()  # /healthz found Redis back
    assert cache.available and (await cache.lookup("key1", FP)).available


async def test_the_breaker_closes_by_itself_after_retry_after(fake: FakeRedis) -> None:
    cache = RedisCache(fake, Metrics(), retry_after=0.01)
    fake.failure = RedisConnectionError("refused")
    assert not (await cache.lookup("key1", FP)).available
    fake.failure = None

    async def answered() -> bool:
        return (await cache.lookup("key1", FP)).available

    await async_wait_for(answered, within=5)


@pytest.mark.parametrize(
    ("message", "resets"),
    [
        ("READONLY You can't write against a read only replica.", 1),
        ("MASTERDOWN Link with MASTER is down", 1),
        ("ERR something else", 0),
    ],
)
async def test_a_failed_over_primary_is_reconnected(
    fake: FakeRedis, message: str, resets: int
) -> None:
    cache = RedisCache(fake, Metrics())
    fake.failure = RedisReplyError(message)
    assert not await cache.store(FP, b"entry", 60)
    assert fake.resets == resets


async def test_store_sets_the_entry_with_its_ttl_after_draining(
    fake: FakeRedis, metrics: Metrics
) -> None:
    cache = RedisCache(fake, metrics)
    assert await cache.store(FP, b"entry", 120)
    assert fake.calls == [("drain",), ("SET", entry_key(FP), b"entry", "EX", 120)]
    fake.failure = RedisConnectionError("lost")
    assert not await cache.store(FP, b"entry", 120)
    assert errors(metrics, "store") == 1 and not cache.available


async def test_while_redis_is_unavailable_the_last_known_revoked_keys_are_refused(
    fake: FakeRedis, metrics: Metrics
) -> None:
    cache = RedisCache(fake, metrics, retry_after=3600)
    fake.revoked = {"loaded1", "loaded2"}
    assert await cache.reload_revoked()
    fake.revoked.add("seen")
    assert (await cache.lookup("seen", FP)).revoked  # a lookup that says so is remembered
    fake.failure = RedisConnectionError("refused")
    assert await cache.lookup("loaded1", FP) == Lookup(False, True)  # the failing call
    for key_id in ("loaded2", "seen"):  # the breaker is open now: Redis is not asked
        assert await cache.lookup(key_id, FP) == Lookup(False, True)
        with pytest.raises(AuthenticationError) as refused:
            await cache.refuse_if_revoked(key_id)
        assert refused.value.code == "key_revoked"
    assert await cache.lookup("valid", FP) == UNAVAILABLE
    await cache.refuse_if_revoked("valid")  # unknown while down: let through, as bypass


async def test_reload_replaces_the_set_and_is_skipped_while_redis_is_unavailable(
    fake: FakeRedis, metrics: Metrics
) -> None:
    cache = RedisCache(fake, metrics, retry_after=3600)
    assert cache.revoked_loaded_at is None
    fake.revoked = {"a"}
    assert await cache.reload_revoked() and cache.revoked_loaded_at is not None
    fake.failure = RedisConnectionError("refused")
    assert not await cache.reload_revoked()
    assert errors(metrics, "revoked") == 1
    asked = len(fake.calls)
    assert not await cache.reload_revoked()  # the breaker is open: not asked
    assert len(fake.calls) == asked
    assert (await cache.lookup("a", FP)).revoked


async def test_start_reloads_in_the_background_until_closed(fake: FakeRedis) -> None:
    cache = RedisCache(fake, Metrics(), retry_after=0.01, revoked_refresh=0.01)
    fake.failure = RedisConnectionError("refused")  # down at start: retried, not given up
    cache.start()
    try:
        await async_wait_for(lambda: len(fake.calls) >= 2, within=5)
        assert cache.revoked_loaded_at is None
        fake.failure = None
        fake.revoked = {"late"}
        await async_wait_for(lambda: cache.revoked_loaded_at is not None, within=5)
        fake.failure = RedisConnectionError("refused")
        assert (await cache.lookup("late", FP)).revoked
    finally:
        await cache.close()
    asked = len(fake.calls)
    await cache.close()  # twice is fine
    assert len(fake.calls) == asked
