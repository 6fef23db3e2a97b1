"""The delay proxy puts a fixed one-way time between two local parts (distance, locally)."""

from __future__ import annotations

import time

import pytest
import redis

from deploy.local.delay_proxy import DelayProxy
from deploy.local.provider import closed_port
from deploy.local.redis import RedisServer


def test_every_round_trip_costs_twice_the_delay_and_bytes_arrive_whole(
    redis_server: RedisServer,
) -> None:
    with DelayProxy(redis_server.host, redis_server.port, 0.05) as proxy:
        client = redis.Redis(host=proxy.host, port=proxy.port, socket_timeout=5)
        try:
            client.ping()  # the connection's own round trips, before timing
            value = bytes(range(256)) * 1024  # 256 KiB: several chunks each way
            started = time.monotonic()
            client.set("delay-proxy", value)
            assert client.get("delay-proxy") == value
            took = time.monotonic() - started
        finally:
            client.close()
    assert 0.2 <= took < 1.0  # two round trips of 0.1 s, and no more than a few
    assert proxy.connections == 1


def test_a_target_that_is_down_closes_the_connection() -> None:
    with DelayProxy("127.0.0.1", closed_port(), 0.01) as proxy:
        client = redis.Redis(host=proxy.host, port=proxy.port, socket_timeout=5)
        with pytest.raises(redis.ConnectionError):
            client.ping()
        client.close()
