"""A connection lost in the middle of the origin's answer, in the real local Workers runtime
with a real origin behind a proxy that cuts it: a JSON answer is read whole before the
client gets its head, so the loss is asked again on a fresh connection and the client
gets the whole answer, never a connection closed without one."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from deploy.edge_bundle import build_edge
from deploy.local.delay_proxy import DelayProxy
from deploy.local.ports import free_port
from deploy.local.provider import ProviderServer, ProviderSettings
from deploy.local.redis import RedisServer
from deploy.local.workers import ExtraWorker, LocalWorkersRuntime
from origin import Settings
from tests.fixtures.origin import FORWARD_SECRET, KEY_SECRET, origin_env, serve_origin
from tests.fixtures.workers import KVApi, WorkersRuntimeFactory

CHAT = "/v1/chat/completions"


@dataclass
class CutStack:
    runtime: LocalWorkersRuntime
    proxy: DelayProxy
    provider: ProviderServer

    @property
    def url(self) -> str:
        return self.runtime.extra_urls["cut"]


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory,
    workers_runtime_factory: WorkersRuntimeFactory,
    module_redis: RedisServer,
) -> Iterator[CutStack]:
    bundle = build_edge("local", tmp_path_factory.mktemp("cut") / "bundle")
    provider = ProviderServer(ProviderSettings()).start()
    port = free_port()
    proxy = DelayProxy("127.0.0.1", port, 0.0).start()
    runtime = workers_runtime_factory(
        None,
        api_token="kv-api-test-token",
        extra_workers=[
            ExtraWorker(
                "cut",
                bundle.root,
                vars={
                    "PRISM_KEY_SECRET": KEY_SECRET,
                    "PRISM_FORWARD_SECRET": FORWARD_SECRET,
                    "ORIGIN_URL": proxy.url,
                },
                kv_binding="PRISM_KV",
            )
        ],
    )
    kv = KVApi(runtime)
    origin = serve_origin(
        Settings.from_env(origin_env(module_redis.url, provider.url, **kv.settings())), port
    )
    try:
        yield CutStack(runtime, proxy, provider)
    finally:
        origin.server.stop()
        proxy.stop()
        kv.close()
        provider.stop()


def _chat(stack: CutStack, api_key: str, **extra: object) -> httpx.Response:
    body = {"model": "demo", "messages": [{"role": "user", "content": secrets.token_hex(8)}]}
    return httpx.post(
        stack.url + CHAT,
        json={**body, **extra},
        headers={"authorization": f"Bearer {api_key}"},
        timeout=60,
    )


def test_a_json_answer_cut_in_its_body_is_asked_again_and_arrives_whole(
    stack: CutStack, api_key: str
) -> None:
    assert _chat(stack, api_key).status_code == 200  # the edge's pool to the origin is warm
    stack.proxy.cut_in_body(1)
    response = _chat(stack, api_key)
    assert stack.proxy.cuts_left == 0  # the cut happened
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"]  # whole, parseable


def test_a_stream_is_still_passed_through_as_it_comes(stack: CutStack, api_key: str) -> None:
    with httpx.stream(
        "POST",
        stack.url + CHAT,
        json={
            "model": "demo",
            "stream": True,
            "messages": [{"role": "user", "content": secrets.token_hex(8)}],
        },
        headers={"authorization": f"Bearer {api_key}"},
        timeout=60,
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        text = "".join(response.iter_text())
    assert text.rstrip().endswith("data: [DONE]")
