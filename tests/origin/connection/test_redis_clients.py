"""Both Redis clients the origin can run on (``PRISM_REDIS_CLIENT=pipe|redis-py``), against
a real Redis: the same raw replies, the same errors, the cache on top of each, and the
origin over real HTTP, including revocation while Redis is down."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import httpx
import pytest
import redis

from deploy.local.ports import free_port
from deploy.local.redis import RedisServer
from origin.connection.redis_client import (
    NoScriptError,
    RedisConnectionError,
    RedisPyClient,
    RedisReplyError,
    RedisTimeoutError,
)
from origin.connection.redis_pipe import RedisPipe
from origin.metrics import Metrics
from origin.settings import RedisClientKind, Settings, SettingsError
from origin.store.redis_cache import Lookup, RedisCache
from prism import REVOKED_KEY, KeyRing
from tests.fixtures.origin import OriginFactory, make_redis_client, origin_env
from tests.polling import async_wait_for, wait_for

BODY = {"model": "demo", "messages": [{"role": "user", "content": "either client"}]}


async def test_replies_are_raw_and_each_reaches_its_caller(
    redis_client_kind: RedisClientKind, redis_url: str
) -> None:
    client = make_redis_client(redis_client_kind, redis_url)
    try:
        values = [os.urandom(64) for _ in range(200)]
        sets = await asyncio.gather(
            *(client.execute("SET", f"k{i}", v) for i, v in enumerate(values))
        )
        assert sets == [b"OK"] * 200
        assert await asyncio.gather(*(client.execute("GET", f"k{i}") for i in range(200))) == values
        assert await client.execute("GET", "missing") is None
        assert await client.execute("SADD", "set", "a", "b") == 2
        assert await client.execute("SISMEMBER", "set", "a") == 1
        assert sorted(await client.execute("SMEMBERS", "set")) == [b"a", b"b"]
        assert await client.execute("PING") == b"PONG"
        sha = await client.execute("SCRIPT", "LOAD", "return 1")
        assert isinstance(sha, bytes) and len(sha) == 40
    finally:
        await client.close()


async def test_error_replies_are_ours_with_redis_message(
    redis_client_kind: RedisClientKind, redis_url: str
) -> None:
    client = make_redis_client(redis_client_kind, redis_url)
    try:
        with pytest.raises(NoScriptError, match=r"^NOSCRIPT"):
            await client.execute("EVALSHA", "0" * 40, 0)
        with pytest.raises(RedisReplyError, match=r"^ERR wrong number of arguments"):
            await client.execute("GET")
        await client.execute("SET", "text", b"x")
        with pytest.raises(RedisReplyError, match=r"^WRONGTYPE"):
            await client.execute("SISMEMBER", "text", "a")
        assert await client.execute("PING") == b"PONG"  # the connection goes on
    finally:
        await client.close()


async def test_an_unreachable_redis_is_a_connection_error(
    redis_client_kind: RedisClientKind,
) -> None:
    client = make_redis_client(redis_client_kind, f"redis://127.0.0.1:{free_port()}/0", 0.3)
    try:
        with pytest.raises(RedisConnectionError):
            await client.execute("PING")
    finally:
        await client.close()
    with pytest.raises(RedisConnectionError, match="closed"):
        await client.execute("PING")


async def test_a_stalled_redis_is_a_timeout_and_trips_the_breaker_until_it_answers(
    redis_client_kind: RedisClientKind, tmp_path_factory: pytest.TempPathFactory
) -> None:
    server = RedisServer(workdir=tmp_path_factory.mktemp("stalled-redis")).start()
    client = make_redis_client(redis_client_kind, server.url, timeout=0.2)
    cache = RedisCache(client, Metrics(), retry_after=0.2)
    pid = server.pid
    assert pid is not None
    try:
        assert (await cache.lookup("key1", "f" * 64)).available
        os.kill(pid, signal.SIGSTOP)  # accepts bytes, answers nothing
        started = time.monotonic()
        with pytest.raises(RedisTimeoutError):
            await client.execute("GET", "anything")
        assert not (await cache.lookup("key1", "f" * 64)).available
        assert time.monotonic() - started < 2.0
        os.kill(pid, signal.SIGCONT)

        async def answered() -> bool:
            return (await cache.lookup("key1", "f" * 64)).available

        await async_wait_for(answered, within=5)
        assert await cache.store("f" * 64, b"entry", 60)
    finally:
        os.kill(pid, signal.SIGCONT)
        await client.close()
        server.stop()


async def test_the_cache_reads_entries_and_revocation_and_reloads_a_flushed_script(
    redis_client_kind: RedisClientKind, redis_url: str
) -> None:
    client = make_redis_client(redis_client_kind, redis_url)
    cache = RedisCache(client, Metrics())
    admin = redis.Redis.from_url(redis_url)
    try:
        assert await cache.lookup("key1", "a" * 64) == Lookup(True, False)
        assert await cache.store("a" * 64, b"entry-a", 60)
        assert await cache.lookup("key1", "a" * 64) == Lookup(True, False, b"entry-a")
        admin.script_flush()  # as after a Redis restart: the cached EVALSHA is unknown
        assert await cache.lookup("key1", "a" * 64) == Lookup(True, False, b"entry-a")
        admin.sadd(REVOKED_KEY, "key1")
        assert (await cache.lookup("key1", "a" * 64)).revoked
        assert (await cache.lookup("key1", None)).revoked
        assert not (await cache.lookup("key2", None)).revoked
        admin.sadd(REVOKED_KEY, "key3")
        assert await cache.reload_revoked()
        assert cache.revoked_loaded_at is not None
    finally:
        admin.close()
        await client.close()


def test_the_origin_serves_redis_hits_on_each_client(
    origin_factory: OriginFactory, redis_client_kind: RedisClientKind, api_key: str
) -> None:
    origin = origin_factory(PRISM_REDIS_CLIENT=redis_client_kind)
    with httpx.Client(
        base_url=origin.url, headers={"authorization": f"Bearer {api_key}"}, timeout=30
    ) as http:
        first = http.post("/v1/chat/completions", json=BODY)
        assert first.status_code == 200 and first.headers["x-prism-edge-cache-layer"] == "miss"
        origin.wait_stored()
        second = http.post("/v1/chat/completions", json=BODY)
        assert second.headers["x-prism-edge-cache-layer"] == "redis"
        assert second.json() == first.json()
        assert httpx.get(origin.admin_url + "/healthz").json()["redis"]["ok"] is True
    expected = RedisPyClient if redis_client_kind == "redis-py" else RedisPipe
    assert isinstance(origin.gateway.redis, expected)


def test_the_client_is_chosen_once_from_the_environment() -> None:
    env = origin_env("redis://127.0.0.1:1/0", "http://127.0.0.1:1")
    assert Settings.from_env(env).redis_client == "pipe"
    assert Settings.from_env({**env, "PRISM_REDIS_CLIENT": "redis-py"}).redis_client == "redis-py"
    with pytest.raises(SettingsError, match="PRISM_REDIS_CLIENT must be pipe or redis-py"):
        Settings.from_env({**env, "PRISM_REDIS_CLIENT": "hiredis"})


async def test_after_a_reset_the_next_command_reconnects(
    redis_client_kind: RedisClientKind, redis_url: str
) -> None:
    client = make_redis_client(redis_client_kind, redis_url)
    admin = redis.Redis.from_url(redis_url)
    try:
        await client.execute("CLIENT", "SETNAME", "before-reset")
        client.reset()

        def names() -> list[str]:
            return [c["name"] for c in admin.client_list()]

        await async_wait_for(lambda: "before-reset" not in names(), within=5)  # it is gone
        assert await client.execute("PING") == b"PONG"
    finally:
        admin.close()
        await client.close()


def test_revoked_keys_stay_refused_while_redis_is_down(
    origin_factory: OriginFactory,
    redis_client_kind: RedisClientKind,
    key_ring: KeyRing,
    tmp_path: Path,
) -> None:
    server = RedisServer(workdir=tmp_path).start()
    before, after, valid = (key_ring.mint("acme") for _ in range(3))
    admin = redis.Redis.from_url(server.url)
    admin.sadd(REVOKED_KEY, key_ring.verify(before).key_id)  # known from the start-up reload
    try:
        origin = origin_factory(REDIS_URL=server.url, PRISM_REDIS_CLIENT=redis_client_kind)
        wait_for(lambda: origin.gateway.cache.revoked_loaded_at is not None)

        def chat(key: str) -> httpx.Response:
            headers = {"authorization": f"Bearer {key}"}
            return httpx.post(origin.url + "/v1/chat/completions", json=BODY, headers=headers)

        def models(key: str) -> httpx.Response:
            headers = {"authorization": f"Bearer {key}"}
            return httpx.get(origin.url + "/v1/models", headers=headers)

        assert chat(after).status_code == 200
        admin.sadd(REVOKED_KEY, key_ring.verify(after).key_id)  # learnt from a lookup
        assert models(after).status_code == 401
        server.stop()
        for key in (before, after):
            for response in (chat(key), models(key)):
                assert response.status_code == 401
                assert response.json()["error"]["code"] == "key_revoked"
        down = chat(valid)
        assert down.status_code == 200 and down.headers["x-prism-edge-cache-layer"] == "bypass"
        assert models(valid).status_code == 200
    finally:
        admin.close()
        server.stop()


def test_models_refuses_a_revoked_key(
    origin_factory: OriginFactory, key_ring: KeyRing, redis_url: str
) -> None:
    origin = origin_factory()
    key = key_ring.mint("acme")
    headers = {"authorization": f"Bearer {key}"}
    assert httpx.get(origin.url + "/v1/models", headers=headers).status_code == 200
    admin = redis.Redis.from_url(redis_url)
    admin.sadd(REVOKED_KEY, key_ring.verify(key).key_id)
    admin.close()
    refused = httpx.get(origin.url + "/v1/models", headers=headers)
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "key_revoked"
