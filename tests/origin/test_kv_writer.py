"""The KV writer against the Workers KV REST stand-in: batching, 429s, outages."""

from __future__ import annotations

import asyncio
import secrets
import time

import httpx

from origin.kv_writer import KVWriter
from origin.metrics import Metrics
from origin.settings import KVSettings
from prism import decode_envelope, encode_envelope
from tests.fixtures.origin import OriginFactory
from tests.fixtures.workers import KVApi
from tests.polling import wait_for


def sample(metrics: Metrics, name: str) -> float:
    return metrics.registry.get_sample_value(name) or 0.0


def settings_for(kv: KVApi, **overrides: float) -> KVSettings:
    return KVSettings(
        api_url=kv.url,
        account_id=kv.account_id,
        namespace_id=kv.namespace_id,
        api_token=kv.api_token,
        **overrides,  # type: ignore[arg-type]
    )


def test_five_thousand_entries_land_in_one_bulk_call(kv_api_reset: KVApi) -> None:
    kv = kv_api_reset
    prefix = f"bulk-{secrets.token_hex(4)}:"
    value = encode_envelope(b'{"id":"x","choices":[]}', model="demo", ttl=3600)
    metrics = Metrics()

    async def run() -> None:
        async with httpx.AsyncClient(timeout=120) as client:
            writer = KVWriter(settings_for(kv, flush_interval=0.2), client, metrics)
            for i in range(5000):
                assert writer.submit(f"{prefix}{i:05d}", value, 3600)
            writer.start()  # everything is queued before the first flush
            await writer.stop(drain_timeout=120)

    asyncio.run(run())
    assert kv.stats()["bulk_put_calls"] == 1
    assert sample(metrics, "prism_kv_writer_calls_total") == 1
    assert sample(metrics, "prism_kv_writer_sent_total") == 5000
    keys = kv.list_keys(prefix)
    assert len(keys) == 5000
    stored = kv.get(f"{prefix}04999")
    assert stored is not None and decode_envelope(stored) is not None


def test_a_partial_batch_is_flushed_by_the_interval(kv_api_reset: KVApi) -> None:
    kv = kv_api_reset
    prefix = f"flush-{secrets.token_hex(4)}:"
    metrics = Metrics()

    async def run() -> None:
        async with httpx.AsyncClient(timeout=60) as client:
            writer = KVWriter(settings_for(kv, flush_interval=0.1), client, metrics)
            writer.start()
            for wave in range(3):
                for i in range(50):  # far below max_batch: only the interval can flush it
                    writer.submit(f"{prefix}{wave}-{i}", b"{}", 60)
                landed = 50 * (wave + 1)
                await asyncio.to_thread(wait_for, lambda n=landed: len(kv.list_keys(prefix)) == n)
            await writer.stop()

    asyncio.run(run())
    assert kv.stats()["bulk_put_calls"] == 3  # one call per flush, never one per entry
    assert sample(metrics, "prism_kv_writer_sent_total") == 150


def test_429_with_retry_after_then_200_lands_everything(kv_api_reset: KVApi) -> None:
    kv = kv_api_reset
    prefix = f"retry-{secrets.token_hex(4)}:"
    kv.fail_next(429, count=2, retry_after=1, endpoints=["bulk_put"])
    metrics = Metrics()

    async def run() -> float:
        async with httpx.AsyncClient(timeout=60) as client:
            writer = KVWriter(settings_for(kv, flush_interval=0.05), client, metrics)
            writer.start()
            started = time.monotonic()
            for i in range(100):
                writer.submit(f"{prefix}{i}", b"{}", 120)
            await writer.stop(drain_timeout=30)
            return time.monotonic() - started

    elapsed = asyncio.run(run())
    assert len(kv.list_keys(prefix)) == 100
    assert sample(metrics, "prism_kv_writer_retries_total") == 2
    assert sample(metrics, "prism_kv_writer_sent_total") == 100
    assert elapsed >= 2.0  # Retry-After: 1 was honoured twice


def test_kv_down_never_slows_clients_and_drops_are_counted(
    origin_factory: OriginFactory, api_key: str, kv_api_reset: KVApi
) -> None:
    kv = kv_api_reset
    # Every bulk call hangs for 3 s, then fails: the writer is stuck retrying.
    kv.fail_next(503, count=50, endpoints=["bulk_put"], delay_ms=3000)
    origin = origin_factory(
        PRISM_KV_API_URL=kv.url,
        PRISM_KV_ACCOUNT_ID=kv.account_id,
        PRISM_KV_NAMESPACE_ID=kv.namespace_id,
        CLOUDFLARE_API_TOKEN=kv.api_token,
        PRISM_KV_FLUSH_INTERVAL="0.01",
        PRISM_KV_MAX_ATTEMPTS="1",
        PRISM_KV_MAX_QUEUE="5",
    )
    headers = {"authorization": f"Bearer {api_key}"}
    slowest = 0.0
    with httpx.Client(base_url=origin.url, headers=headers, timeout=30) as client:
        for i in range(20):
            started = time.monotonic()
            response = client.post(
                "/v1/chat/completions",
                json={"model": "demo", "messages": [{"role": "user", "content": f"kv down {i}"}]},
            )
            slowest = max(slowest, time.monotonic() - started)
            assert (
                response.status_code == 200
                and response.headers["x-prism-edge-cache-layer"] == "miss"
            )
        assert slowest < 1.0  # a bulk call takes 3 s: nobody waited for one
        wait_for(lambda: origin.metric("prism_kv_writer_dropped_total", reason="queue_full") > 0)
        text = httpx.get(origin.admin_url + "/metrics").text
    assert 'prism_kv_writer_dropped_total{reason="queue_full"}' in text
    kv.clear_faults()


def test_unreachable_kv_api_counts_exhausted_retries(
    origin_factory: OriginFactory, api_key: str
) -> None:
    from deploy.local.provider import closed_port

    origin = origin_factory(
        PRISM_KV_API_URL=f"http://127.0.0.1:{closed_port()}/client/v4",
        PRISM_KV_ACCOUNT_ID="acct",
        PRISM_KV_NAMESPACE_ID="ns",
        PRISM_KV_FLUSH_INTERVAL="0.01",
        PRISM_KV_MAX_ATTEMPTS="2",
    )
    response = httpx.post(
        origin.url + "/v1/chat/completions",
        json={"model": "demo", "messages": [{"role": "user", "content": "kv unreachable"}]},
        headers={"authorization": f"Bearer {api_key}"},
    )
    assert response.status_code == 200
    wait_for(
        lambda: origin.metric("prism_kv_writer_dropped_total", reason="retries_exhausted") == 1
    )
    assert origin.metric("prism_kv_writer_retries_total") == 1
