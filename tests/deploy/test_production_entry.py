"""The entry Cloudflare runs (`class Default(WorkerEntrypoint)`, with the real `workers` SDK
from PyPI vendored in) in the pinned local runtime, with the real origin behind it."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis

from deploy.edge_bundle import build_edge, vendor_workers_sdk
from deploy.local.ports import free_port
from deploy.local.provider import ProviderServer
from deploy.local.redis import RedisServer
from deploy.local.workers import LocalWorkersRuntime
from prism import encode_envelope, entry_key, fingerprint, parse_chat_request
from tests.fixtures.edge import serve_replicating_origin
from tests.fixtures.origin import FORWARD_SECRET, KEY_SECRET
from tests.fixtures.workers import KVApi, WorkersRuntimeFactory
from tests.polling import wait_for

# The SDK the current runtime would vendor (pywrangler pins it the same way).
SDK = "workers-runtime-sdk==1.9.5"
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="session")
def sdk_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("workers-sdk")
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    done = subprocess.run(
        [*command, "--dest", str(folder), SDK],
        capture_output=True,
        text=True,
        timeout=300,
    )
    wheels = list(folder.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        pytest.skip(f"cannot download {SDK} from the package index: {done.stderr[-300:]}")
    return wheels[0]


@dataclass
class ProductionEdge:
    runtime: LocalWorkersRuntime
    kv: KVApi
    redis_url: str

    @property
    def url(self) -> str:
        assert self.runtime.edge_url is not None
        return self.runtime.edge_url


@pytest.fixture(scope="session")
def production_edge(
    tmp_path_factory: pytest.TempPathFactory,
    workers_runtime_factory: WorkersRuntimeFactory,
    redis_server: RedisServer,
    provider_server: ProviderServer,
    sdk_wheel: Path,
) -> Iterator[ProductionEdge]:
    bundle = build_edge("cloudflare", tmp_path_factory.mktemp("production") / "bundle")
    entry = vendor_workers_sdk(bundle, sdk_wheel)
    origin_port = free_port()
    runtime = workers_runtime_factory(
        bundle.root,
        {
            "PRISM_KEY_SECRET": KEY_SECRET,
            "PRISM_FORWARD_SECRET": FORWARD_SECRET,
            "ORIGIN_URL": f"http://127.0.0.1:{origin_port}",
        },
        edge_entry=entry,
        api_token="kv-api-production-entry",
    )
    kv = KVApi(runtime)
    origin = serve_replicating_origin(kv, redis_server.url, provider_server.url, origin_port)
    try:
        yield ProductionEdge(runtime, kv, redis_server.url)
    finally:
        origin.server.stop()
        kv.close()


def test_the_production_entry_refuses_a_bad_key_with_an_openai_error(
    production_edge: ProductionEdge,
) -> None:
    response = httpx.post(
        production_edge.url + CHAT,
        json={"model": "demo", "messages": [{"role": "user", "content": "hi"}]},
        headers={"authorization": "Bearer not-a-prism-key"},
        timeout=60,
    )

    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"


def test_the_production_entry_forwards_writes_kv_and_serves_from_it(
    production_edge: ProductionEdge, api_key: str
) -> None:
    # Through the SDK's env wrapper: the secrets, ORIGIN_URL and the KV binding (get and
    # put, the latter in the background via ctx.waitUntil).
    body = {"model": "demo", "messages": [{"role": "user", "content": secrets.token_hex(6)}]}
    fp = fingerprint("acme", CHAT, parse_chat_request(json.dumps(body)))
    completion = {
        "id": "chatcmpl-prod",
        "object": "chat.completion",
        "created": 1,
        "model": "demo",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "via Default.fetch"},
                "finish_reason": "stop",
            }
        ],
    }
    store = redis.Redis.from_url(production_edge.redis_url)
    store.set(
        entry_key(fp),
        encode_envelope(json.dumps(completion).encode(), model="demo", ttl=3600),
        ex=3600,
    )
    store.close()
    http = httpx.Client(
        base_url=production_edge.url, headers={"authorization": f"Bearer {api_key}"}, timeout=60
    )

    first = http.post(CHAT, json=body)

    assert first.status_code == 200, first.text
    assert first.headers["x-prism-edge-cache-layer"] == "redis"
    assert first.json()["choices"][0]["message"]["content"] == "via Default.fetch"
    wait_for(lambda: production_edge.kv.get(entry_key(fp)) is not None)
    second = http.post(CHAT, json=body)
    assert second.headers["x-prism-edge-cache-layer"] == "kv" and second.json() == first.json()
