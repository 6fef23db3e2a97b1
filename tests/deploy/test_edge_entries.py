"""Both entries the bundle builder writes, in the pinned local runtime with the real origin.

The edge suite (tests/edge) runs the production entry (`class Default(WorkerEntrypoint)`
with the real `workers` SDK from PyPI vendored in); these are the smoke set that runs the
same requests through each entry, so the local one (`prism dev`'s) is covered too.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis

from deploy.edge_bundle import PRODUCTION_ENTRY_DRIVER, build_edge
from deploy.local.ports import free_port
from deploy.local.provider import ProviderServer
from deploy.local.redis import RedisServer
from deploy.local.workers import LocalWorkersRuntime
from prism import encode_envelope, entry_key, fingerprint, parse_chat_request
from tests.fixtures.edge import EdgeStack, serve_replicating_origin
from tests.fixtures.origin import FORWARD_SECRET, KEY_SECRET
from tests.fixtures.workers import KVApi, WorkersRuntimeFactory
from tests.polling import wait_for

CHAT = "/v1/chat/completions"


@dataclass
class RunningEdge:
    runtime: LocalWorkersRuntime
    kv: KVApi
    redis_url: str

    @property
    def url(self) -> str:
        assert self.runtime.edge_url is not None
        return self.runtime.edge_url


@pytest.fixture(scope="session")
def local_entry_edge(
    tmp_path_factory: pytest.TempPathFactory,
    workers_runtime_factory: WorkersRuntimeFactory,
    edge_redis: RedisServer,
    provider_server: ProviderServer,
) -> Iterator[RunningEdge]:
    bundle = build_edge("local", tmp_path_factory.mktemp("local-entry") / "bundle")
    origin_port = free_port()
    runtime = workers_runtime_factory(
        bundle.root,
        {
            "PRISM_KEY_SECRET": KEY_SECRET,
            "PRISM_FORWARD_SECRET": FORWARD_SECRET,
            "ORIGIN_URL": f"http://127.0.0.1:{origin_port}",
        },
        api_token="kv-api-local-entry",
    )
    kv = KVApi(runtime)
    origin = serve_replicating_origin(kv, edge_redis.url, provider_server.url, origin_port)
    try:
        yield RunningEdge(runtime, kv, edge_redis.url)
    finally:
        origin.server.stop()
        kv.close()


@pytest.fixture(params=["production", "local"])
def any_edge(request: pytest.FixtureRequest) -> RunningEdge:
    """The edge stack's production entry, or the local entry."""
    if request.param == "local":
        edge: RunningEdge = request.getfixturevalue("local_entry_edge")
        return edge
    stack: EdgeStack = request.getfixturevalue("edge")
    return RunningEdge(stack.runtime, stack.kv, stack.redis_url)


def test_the_edge_stack_runs_the_production_entry(edge: EdgeStack) -> None:
    # what the runtime was started with: the driver of the `cloudflare` bundle's entry.py
    assert edge.runtime.edge_entry == PRODUCTION_ENTRY_DRIVER
    entry = (edge.runtime.edge_root or Path()) / "entry.py"
    assert "class Default(WorkerEntrypoint):" in entry.read_text()


def test_the_entry_refuses_a_bad_key_with_an_openai_error(
    any_edge: RunningEdge,
) -> None:
    response = httpx.post(
        any_edge.url + CHAT,
        json={"model": "demo", "messages": [{"role": "user", "content": "hi"}]},
        headers={"authorization": "Bearer not-a-prism-key"},
        timeout=60,
    )

    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"


def test_the_entry_forwards_writes_kv_and_serves_from_it(
    any_edge: RunningEdge, api_key: str
) -> None:
    # Through the entry's env (on the production entry, the SDK's wrapper): the secrets,
    # ORIGIN_URL and the KV binding (get and put, the latter in the background via
    # ctx.waitUntil).
    body = {"model": "demo", "messages": [{"role": "user", "content": secrets.token_hex(6)}]}
    fp = fingerprint("acme", CHAT, parse_chat_request(json.dumps(body)))
    completion = {
        "id": "chatcmpl-entry",
        "object": "chat.completion",
        "created": 1,
        "model": "demo",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "via the entry"},
                "finish_reason": "stop",
            }
        ],
    }
    store = redis.Redis.from_url(any_edge.redis_url)
    store.set(
        entry_key(fp),
        encode_envelope(json.dumps(completion).encode(), model="demo", ttl=3600),
        ex=3600,
    )
    store.close()
    http = httpx.Client(
        base_url=any_edge.url, headers={"authorization": f"Bearer {api_key}"}, timeout=60
    )

    first = http.post(CHAT, json=body)

    assert first.status_code == 200, first.text
    assert first.headers["x-prism-edge-cache-layer"] == "redis"
    assert first.json()["choices"][0]["message"]["content"] == "via the entry"
    wait_for(lambda: any_edge.kv.get(entry_key(fp)) is not None)
    second = http.post(CHAT, json=body)
    assert second.headers["x-prism-edge-cache-layer"] == "kv" and second.json() == first.json()
