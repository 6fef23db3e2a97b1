"""Two regions on one source of truth: a Redis primary and a real replica
(``redis-server --replicaof``). The second origin reads its lookups from the replica
(``PRISM_REDIS_READ_URL``) and writes to the primary."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pytest
import redis
from typer.testing import CliRunner

from deploy.cli import app
from deploy.local.delay_proxy import DelayProxy
from deploy.local.provider import ProviderServer
from deploy.local.redis import RedisServer
from deploy.policy_store import PolicyStore
from origin import Settings
from origin.connection.redis_pipe import RedisPipe
from origin.metrics import Metrics
from origin.settings import RedisClientKind
from origin.store.redis_cache import Lookup, RedisCache
from prism import REVOKED_KEY, KeyRing, RateLimits, policy_key
from tests.fixtures.origin import (
    KEY_SECRET,
    OriginFactory,
    RunningOrigin,
    make_redis_client,
    origin_env,
)
from tests.polling import async_wait_for, wait_for


@pytest.fixture(scope="module")
def primary(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with RedisServer(workdir=tmp_path_factory.mktemp("primary")) as server:
        yield server


@pytest.fixture
def replica(
    primary: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RedisServer]:
    """A fresh replica of a flushed primary, synced before the test starts."""
    admin = redis.Redis.from_url(primary.url)
    admin.flushall()
    server = RedisServer(workdir=tmp_path_factory.mktemp("replica"), replica_of=primary).start()
    reader = redis.Redis.from_url(server.url)
    wait_for(lambda: reader.info("replication").get("master_link_status") == "up", 10)
    try:
        yield server
    finally:
        reader.close()
        admin.close()
        server.stop()


def replicated(primary: RedisServer, replica: RedisServer, timeout: float = 30) -> None:
    """Until the replica holds every entry the primary does: how fast Redis replicates
    (a loaded machine: seconds) is not what these tests are about."""
    writer, reader = redis.Redis.from_url(primary.url), redis.Redis.from_url(replica.url)
    try:
        entries = set(writer.keys("prism:v*"))
        assert entries, "nothing was stored"
        wait_for(lambda: entries <= set(reader.keys("prism:v*")), timeout)
    finally:
        writer.close()
        reader.close()


def commands(server: RedisServer, name: str) -> int:
    client = redis.Redis.from_url(server.url)
    try:
        stats = client.info("commandstats").get(f"cmdstat_{name}", {})
        return int(stats.get("calls", 0))
    finally:
        client.close()


def test_the_read_url_is_a_setting() -> None:
    env = origin_env("redis://primary:6379/0", "http://provider")
    assert Settings.from_env(env).redis_read_url is None
    env["PRISM_REDIS_READ_URL"] = "redis://replica:6379/0"
    settings = Settings.from_env(env)
    assert (settings.redis_url, settings.redis_read_url) == (
        "redis://primary:6379/0",
        "redis://replica:6379/0",
    )
    assert "replica" not in repr(settings)  # a URL may carry a password


def test_an_entry_written_through_one_origin_is_a_redis_hit_at_the_other_from_the_replica(
    origin_factory: OriginFactory,
    provider: ProviderServer,
    primary: RedisServer,
    replica: RedisServer,
    api_key: str,
) -> None:
    # The request log's window is appended by a script on the primary too, on its own
    # timer; off here, so every EVALSHA counted below is a lookup.
    quiet = {"PRISM_REQUEST_LOG": "off"}
    near = origin_factory(origin_env(primary.url, provider.url, **quiet))
    far = origin_factory(
        origin_env(primary.url, provider.url, PRISM_REDIS_READ_URL=replica.url, **quiet)
    )
    body = {"model": "demo", "messages": [{"role": "user", "content": "two regions"}]}
    headers = {"authorization": f"Bearer {api_key}"}
    first = httpx.post(f"{near.url}/v1/chat/completions", json=body, headers=headers)
    assert first.status_code == 200, first.text
    assert first.headers["x-prism-edge-cache-layer"] == "miss"
    near.wait_stored()
    replicated(primary, replica)
    lookups_on_primary = commands(primary, "evalsha")

    def served_from_redis() -> httpx.Response | None:
        response = httpx.post(f"{far.url}/v1/chat/completions", json=body, headers=headers)
        assert response.status_code == 200, response.text
        hit = response.headers["x-prism-edge-cache-layer"] == "redis"
        return response if hit else None

    second = wait_for(served_from_redis, timeout=5)  # replication takes a moment
    assert second.json() == first.json()
    assert provider.control.stats()["chat_requests"] == 1
    assert commands(replica, "evalsha") >= 1
    assert commands(primary, "evalsha") == lookups_on_primary  # the far one read the replica


async def test_a_replica_cut_from_its_primary_never_hides_a_revocation_for_long(
    redis_client_kind: RedisClientKind, primary: RedisServer, replica: RedisServer
) -> None:
    writer = make_redis_client(redis_client_kind, primary.url)
    reader = make_redis_client(redis_client_kind, replica.url)
    cache = RedisCache(writer, Metrics(), revoked_refresh=0.05, reader=reader)
    admin = redis.Redis.from_url(primary.url)
    cut = redis.Redis.from_url(replica.url)
    try:
        cache.start()
        assert not (await cache.lookup("key1", "a" * 64)).revoked
        cut.replicaof("NO", "ONE")  # still serving its copy, which no longer changes
        admin.sadd(REVOKED_KEY, "key1")
        assert not cut.sismember(REVOKED_KEY, "key1")

        async def refused() -> bool:
            return (await cache.lookup("key1", "a" * 64)).revoked

        await async_wait_for(refused, within=2)
        assert (await cache.lookup("key1", None)).revoked
        assert not (await cache.lookup("key2", "a" * 64)).revoked
    finally:
        await cache.close()
        await writer.close()
        await reader.close()
        admin.close()
        cut.close()


async def test_a_dead_replica_sends_the_lookups_to_the_primary(
    redis_client_kind: RedisClientKind, primary: RedisServer, replica: RedisServer
) -> None:
    writer = make_redis_client(redis_client_kind, primary.url, timeout=0.3)
    reader = make_redis_client(redis_client_kind, replica.url, timeout=0.3)
    metrics = Metrics()
    cache = RedisCache(writer, metrics, retry_after=60, reader=reader)
    try:
        assert await cache.store("b" * 64, b"entry-b", 60)
        replica.stop()
        # The request that finds it dead is a bypass, never an error; the next ones read
        # the primary, and the cache as a whole stays available for writes.
        assert not (await cache.lookup("key1", "b" * 64)).available
        assert (
            metrics.registry.get_sample_value("prism_redis_errors_total", {"op": "lookup_replica"})
            == 1
        )
        assert await cache.lookup("key1", "b" * 64) == Lookup(True, False, b"entry-b")
        assert cache.available and await cache.store("c" * 64, b"entry-c", 60)
    finally:
        await writer.close()
        await reader.close()


def test_only_the_origin_that_stored_an_entry_replicates_it_to_workers_kv(
    origin_factory: OriginFactory,
    provider: ProviderServer,
    primary: RedisServer,
    replica: RedisServer,
    api_key: str,
    key_ring: KeyRing,
) -> None:
    kv = {
        "PRISM_KV_ACCOUNT_ID": "acct",
        "PRISM_KV_NAMESPACE_ID": "ns",
        "PRISM_KV_API_URL": "http://127.0.0.1:9/client/v4",  # never reached in this test
        "PRISM_KV_FLUSH_INTERVAL": "3600",
    }
    near = origin_factory(origin_env(primary.url, provider.url, **kv))
    far = origin_factory(
        origin_env(primary.url, provider.url, PRISM_REDIS_READ_URL=replica.url, **kv)
    )
    body = {"model": "demo", "messages": [{"role": "user", "content": "replicated once"}]}
    headers = {"authorization": f"Bearer {api_key}"}
    assert httpx.post(f"{near.url}/v1/chat/completions", json=body, headers=headers).is_success
    near.wait_stored()
    replicated(primary, replica)

    def hit() -> bool:
        response = httpx.post(f"{far.url}/v1/chat/completions", json=body, headers=headers)
        return response.headers["x-prism-edge-cache-layer"] == "redis"

    wait_for(hit, timeout=5)
    submitted = "prism_kv_writer_submitted_total"
    assert (near.metric(submitted), far.metric(submitted)) == (1, 0)


def replica_health(origin: RunningOrigin) -> dict[str, object] | None:
    health = httpx.get(origin.admin_url + "/healthz").json()
    replica: dict[str, object] | None = health["redis"]["replica"]
    return replica


def test_the_replica_lag_is_on_the_admin_healthz_and_comes_back_to_nothing(
    origin_factory: OriginFactory,
    provider: ProviderServer,
    primary: RedisServer,
    replica: RedisServer,
    api_key: str,
) -> None:
    near = origin_factory(origin_env(primary.url, provider.url))
    far = origin_factory(origin_env(primary.url, provider.url, PRISM_REDIS_READ_URL=replica.url))
    assert replica_health(near) is None  # no replica, nothing to say
    headers = {"authorization": f"Bearer {api_key}"}
    for number in range(5):
        body = {"model": "demo", "messages": [{"role": "user", "content": f"lag {number}"}]}
        assert httpx.post(f"{near.url}/v1/chat/completions", json=body, headers=headers).is_success
    near.wait_stored()

    # Bounded: the replica applies everything the primary sent, within a deadline.
    def settled() -> dict[str, object] | None:
        health = replica_health(far)
        return health if health is not None and health["lag_bytes"] == 0 else None

    health: dict[str, object] | None = wait_for(settled, 5)
    assert health is not None
    assert health["ok"] is True and health["link"] == "up"
    assert 0 <= int(str(health["last_io_seconds_ago"])) <= 10

    cut = redis.Redis.from_url(replica.url)
    try:
        cut.replicaof("NO", "ONE")
        health = replica_health(far)
        assert health is not None and health["ok"] is False
        assert health["link"] == "not a replica"
        assert httpx.get(far.admin_url + "/healthz").json()["redis"]["ok"] is True
    finally:
        cut.close()


def test_a_key_revoked_with_the_cli_on_the_primary_is_refused_by_the_far_origin_in_time(
    origin_factory: OriginFactory,
    provider: ProviderServer,
    primary: RedisServer,
    replica: RedisServer,
    key_ring: KeyRing,
) -> None:
    """The documented bound: the replication lag, 10 s (the revoked set's reload) at worst."""
    far = origin_factory(origin_env(primary.url, provider.url, PRISM_REDIS_READ_URL=replica.url))
    cli = {"REDIS_URL": primary.url, "PRISM_KEY_SECRET": KEY_SECRET}
    created = CliRunner().invoke(app, ["keys", "create", "--project", "regions", "--json"], env=cli)
    assert created.exit_code == 0, created.output
    made = json.loads(created.output.splitlines()[0])  # then a note on stderr
    headers = {"authorization": f"Bearer {made['key']}"}
    body = {"model": "demo", "messages": [{"role": "user", "content": "revoked far away"}]}
    assert httpx.post(f"{far.url}/v1/chat/completions", json=body, headers=headers).is_success

    result = CliRunner().invoke(
        app,
        ["keys", "revoke", made["key_id"], "--project", "regions", "--no-kv"],
        env=cli,
    )
    assert result.exit_code == 0, result.output
    revoked_at = time.monotonic()

    def refused() -> bool:
        response = httpx.post(f"{far.url}/v1/chat/completions", json=body, headers=headers)
        return response.status_code == 401 and "revoked" in response.text

    wait_for(refused, timeout=10)
    assert time.monotonic() - revoked_at < 10


async def test_a_request_its_lease_admits_never_waits_for_the_far_primary(
    primary: RedisServer, replica: RedisServer
) -> None:
    """Lookups from a replica, the primary 1 s away (a round trip): a request whose permit
    comes from its key's lease, and which asks ahead for the next lease, is answered from
    the replica at once; the next lease arrives from the primary afterwards."""
    store = PolicyStore.from_url(primary.url)
    store.set("acme", rate_limits=RateLimits.from_dict({"project": {"rpm": 1_000_000}}))
    store.close()
    mirror = redis.Redis.from_url(replica.url)
    wait_for(lambda: mirror.exists("prism:limits:acme") and mirror.exists(policy_key("acme")), 10)
    mirror.close()
    with DelayProxy(primary.host, primary.port, 0.5) as far:
        writer = RedisPipe(f"redis://{far.host}:{far.port}/0", 10.0)
        reader = RedisPipe(replica.url, 10.0)
        cache = RedisCache(writer, Metrics(), reader=reader)
        try:
            # The first request and the first ask wait for the primary: a lease of 2 then,
            # one permit of it left.
            for _ in range(2):
                assert (found := await cache.lookup("key1", None, "acme", count=True)).rate
                assert found.rate[0] == 1
            keyed = cache.leases.by_project["acme"].by_key["key1"]
            assert keyed.current is not None and keyed.current.left == 1 and keyed.next is None
            # Its last permit, with the ask for the next lease (a quarter or less left).
            started = time.monotonic()
            found = await cache.lookup("key1", None, "acme", count=True)
            took = time.monotonic() - started
            assert found.rate is not None and found.rate[0] == 1
            assert took < 0.5, f"{took:.3f} s: it waited for the primary"
            assert keyed.asking
            await async_wait_for(lambda: not keyed.asking, within=10)
            # The lease asked for is held (this one being spent, it is the current one).
            lease = keyed.next or keyed.current
            assert lease is not None and lease.left >= 2
            started = time.monotonic()
            assert (found := await cache.lookup("key1", None, "acme", count=True)).rate
            assert found.rate[0] == 1 and time.monotonic() - started < 0.5
        finally:
            await cache.close()
            await writer.close()
            await reader.close()
