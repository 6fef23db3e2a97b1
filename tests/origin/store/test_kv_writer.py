"""The KV writer: its logic (batching, retries, Retry-After, drops) against a fake bulk
endpoint, and end to end against the Workers KV REST stand-in (a big batch, outages)."""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from typing import TypedDict, Unpack

import httpx

from origin.metrics import Metrics
from origin.settings import KVSettings
from origin.store.kv_writer import KVWriter
from prism import decode_envelope, encode_envelope
from tests.fixtures.origin import OriginFactory
from tests.fixtures.workers import KVApi
from tests.polling import async_wait_for, wait_for


def sample(metrics: Metrics, name: str) -> float:
    return metrics.registry.get_sample_value(name) or 0.0


class Tuning(TypedDict, total=False):
    """The writer's settings a test may change."""

    flush_interval: float
    max_batch: int
    max_queue: int
    max_attempts: int


def settings_for(kv: KVApi, **overrides: Unpack[Tuning]) -> KVSettings:
    return KVSettings(
        api_url=kv.url,
        account_id=kv.account_id,
        namespace_id=kv.namespace_id,
        api_token=kv.api_token,
        **overrides,
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


class FakeKV:
    """The bulk endpoint as an ``httpx.MockTransport``: records each call's pairs and answers
    from ``replies`` in turn (then 200). For the writer's own logic; the stand-in tests
    above and below cover the real API's behaviour."""

    def __init__(self, *replies: httpx.Response) -> None:
        self.replies = list(replies)
        self.calls: list[list[dict[str, object]]] = []
        self.headers: list[httpx.Headers] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        pairs = json.loads(request.content)
        self.calls.append(pairs)
        self.headers.append(request.headers)
        if self.replies:
            return self.replies.pop(0)
        return httpx.Response(
            200, json={"success": True, "result": {"successful_key_count": len(pairs)}}
        )

    def writer(
        self, metrics: Metrics, **settings: Unpack[Tuning]
    ) -> tuple[KVWriter, httpx.AsyncClient]:
        client = httpx.AsyncClient(transport=httpx.MockTransport(self.handle))
        kv = KVSettings(api_url="https://kv.test/client/v4", account_id="a", namespace_id="n",
                        api_token="token", **settings)  # fmt: skip
        return KVWriter(kv, client, metrics), client


async def test_a_partial_batch_is_flushed_by_the_interval() -> None:
    fake, metrics = FakeKV(), Metrics()
    writer, client = fake.writer(metrics, flush_interval=0.05)
    writer.start()
    for wave in range(3):
        for i in range(50):  # far below max_batch: only the interval can flush it
            writer.submit(f"k{wave}-{i}", b"{}", 60)

        def flushed(n: int = wave + 1) -> bool:
            return len(fake.calls) == n

        await async_wait_for(flushed)
    await writer.stop()
    await client.aclose()
    assert [len(call) for call in fake.calls] == [50, 50, 50]  # one call per flush
    assert sample(metrics, "prism_kv_writer_sent_total") == 150


async def test_batches_are_cut_at_max_batch_and_pairs_are_well_formed() -> None:
    fake, metrics = FakeKV(), Metrics()
    writer, client = fake.writer(metrics, flush_interval=0.05, max_batch=10)
    for i in range(25):
        writer.submit(f"k{i}", b"value", 5)  # below KV's minimum TTL: raised to 60
    writer.start()
    await writer.stop()
    await client.aclose()
    assert [len(call) for call in fake.calls] == [10, 10, 5]
    assert fake.calls[0][0] == {"key": "k0", "value": "value", "expiration_ttl": 60}
    assert fake.headers[0]["authorization"] == "Bearer token"


async def test_429_with_retry_after_then_200_lands_everything() -> None:
    busy = httpx.Response(429, headers={"retry-after": "1"})
    fake, metrics = FakeKV(busy, busy), Metrics()
    writer, client = fake.writer(metrics, flush_interval=0.05)
    started = time.monotonic()
    for i in range(100):
        writer.submit(f"k{i}", b"{}", 120)
    writer.start()
    await writer.stop(drain_timeout=30)
    elapsed = time.monotonic() - started
    await client.aclose()
    assert len(fake.calls) == 3 and fake.calls[0] == fake.calls[2]  # the same batch, resent
    assert sample(metrics, "prism_kv_writer_retries_total") == 2
    assert sample(metrics, "prism_kv_writer_sent_total") == 100
    assert elapsed >= 1.9  # Retry-After: 1 was honoured twice


async def test_retries_stop_at_max_attempts_and_the_batch_is_counted_dropped() -> None:
    down = httpx.Response(503)
    fake, metrics = FakeKV(down, down, down), Metrics()
    writer, client = fake.writer(metrics, flush_interval=0.01, max_attempts=2)
    writer.submit("k", b"{}", 60)
    writer.start()
    await writer.stop()
    await client.aclose()
    assert len(fake.calls) == 2
    assert (
        metrics.registry.get_sample_value(
            "prism_kv_writer_dropped_total", {"reason": "retries_exhausted"}
        )
        == 1
    )


async def test_a_rejected_batch_is_not_retried_and_failed_keys_are_counted() -> None:
    rejected = httpx.Response(400, json={"success": False})
    partial = httpx.Response(
        200, json={"success": True, "result": {"unsuccessful_keys": ["k1", "k2"]}}
    )
    fake, metrics = FakeKV(rejected, partial), Metrics()
    writer, client = fake.writer(metrics, flush_interval=0.01)
    writer.start()
    writer.submit("k0", b"{}", 60)
    await async_wait_for(lambda: len(fake.calls) == 1)
    for i in range(3):
        writer.submit(f"k{i}", b"{}", 60)
    await writer.stop()
    await client.aclose()
    assert len(fake.calls) == 2  # the 400 was not retried
    dropped = {
        reason: metrics.registry.get_sample_value(
            "prism_kv_writer_dropped_total", {"reason": reason}
        )
        for reason in ("rejected", "unsuccessful")
    }
    assert dropped == {"rejected": 1, "unsuccessful": 2}
    assert sample(metrics, "prism_kv_writer_sent_total") == 1


async def test_a_full_queue_drops_instead_of_waiting() -> None:
    fake, metrics = FakeKV(), Metrics()
    writer, client = fake.writer(metrics, max_queue=5)
    accepted = [writer.submit(f"k{i}", b"{}", 60) for i in range(7)]
    await client.aclose()
    assert accepted == [True] * 5 + [False] * 2
    assert (
        metrics.registry.get_sample_value("prism_kv_writer_dropped_total", {"reason": "queue_full"})
        == 2
    )


def test_kv_down_never_slows_clients_and_drops_are_counted(
    origin_factory: OriginFactory, api_key: str, kv_api_reset: KVApi
) -> None:
    kv = kv_api_reset
    # Every bulk call hangs for 3 s, then fails: the writer is stuck retrying.
    kv.fail_next(503, count=50, endpoints=["bulk_put"], delay_ms=3000)
    origin = origin_factory(
        **kv.settings(),
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
    # The model list published at start and the new entry: both dropped, after one retry per
    # bulk call (they go in one call or two).
    wait_for(
        lambda: origin.metric("prism_kv_writer_dropped_total", reason="retries_exhausted") == 2
    )
    assert origin.metric("prism_kv_writer_retries_total") in (1, 2)
