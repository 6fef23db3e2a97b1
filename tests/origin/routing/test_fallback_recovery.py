"""A fallback's stored answer steps aside once the route's primary is back: a flapping
primary (a local provider stand-in stopped, then served again on its port) in front of a
healthy fallback, through a real origin and Redis."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import redis

from deploy.local.provider import ProviderServer
from deploy.local.provider_settings import ProviderSettings
from tests.fixtures.origin import OriginFactory
from tests.polling import wait_for
from tests.redis_replies import reply_as

pytestmark = pytest.mark.timeout(120)

PRIMARY_WORDS = 30  # the primary pads its answers to this many words: its answers tell


def flapping_config(folder: Path, primary: ProviderServer, fallback: ProviderServer) -> Path:
    path = folder / "providers.toml"
    path.write_text(
        f"""
[providers.primary]
base_url = "{primary.url}/v1"
api_key = "provider-test-key"
label = "primary"
[providers.backup]
base_url = "{fallback.url}/v1"
api_key = "provider-test-key"
label = "backup"
[models]
"demo" = {{ targets = ["primary", "backup"], hedge = false }}
"""
    )
    return path


@pytest.fixture
def primary(provider_factory: Callable[[ProviderSettings], ProviderServer]) -> ProviderServer:
    """The flapping primary: its own stand-in, stopped and served again by the test."""
    return provider_factory(ProviderSettings(reply_words=PRIMARY_WORDS))


def from_primary(answer: httpx.Response) -> bool:
    text = answer.json()["choices"][0]["message"]["content"]
    return len(text.split()) >= PRIMARY_WORDS


def recover(
    primary: ProviderServer, ask: Callable[[str], httpx.Response], question: str
) -> tuple[httpx.Response, float]:
    """Serve the primary again; other questions keep arriving (they probe it back to
    health); until ``question`` is answered by the primary: that answer and how long."""
    primary.start()
    back = time.monotonic()
    seen: list[httpx.Response] = []

    def answered_by_primary() -> bool:
        ask(f"other traffic {time.monotonic()}")
        seen.append(ask(question))
        return from_primary(seen[-1])

    wait_for(answered_by_primary, timeout=40, interval=0.2)
    return seen[-1], time.monotonic() - back


def test_a_fallbacks_answer_is_kept_briefly_and_steps_aside_once_the_primary_is_back(
    origin_factory: OriginFactory,
    api_key: str,
    provider: ProviderServer,
    primary: ProviderServer,
    admin: redis.Redis,
    tmp_path: Path,
) -> None:
    origin = origin_factory(PRISM_PROVIDERS_FILE=str(flapping_config(tmp_path, primary, provider)))

    def ask(content: str) -> httpx.Response:
        body = {"model": "demo", "messages": [{"role": "user", "content": content}]}
        answer = httpx.post(
            origin.url + "/v1/chat/completions",
            json=body,
            headers={"authorization": f"Bearer {api_key}"},
            timeout=30,
        )
        assert answer.status_code == 200, answer.text
        return answer

    primary.stop()  # down: its port refuses connections
    for index in range(4):  # enough failures in a row to demote it
        assert ask(f"while it is down {index}").headers["x-prism-provider"] == "backup"
    health = httpx.get(origin.admin_url + "/healthz").json()["providers"]
    assert health["primary"]["state"] == "demoted"

    question = "the flapping question"
    first = ask(question)
    assert first.headers["x-prism-provider"] == "backup" and not from_primary(first)
    origin.wait_stored()

    def entry(key: bytes) -> bytes:
        return reply_as(bytes, admin.get(key))

    (key,) = [k for k in admin.scan_iter("prism:v1:*") if entry(k).endswith(first.content)]
    assert 0 < admin.ttl(key) <= 30  # PRISM_FALLBACK_TTL's default
    assert b'"fallback":true' in entry(key).partition(b"\n")[0]
    again = ask(question)  # the primary still down: the fallback's answer is served
    assert again.headers["x-prism-edge-cache-layer"] == "redis" and again.content == first.content

    answer, took = recover(primary, ask, question)
    # Within the 35 s by its TTL alone; well before it expired, by stepping aside.
    assert took <= 15
    assert answer.headers["x-prism-edge-cache-layer"] == "miss"
    assert answer.headers["x-prism-provider"] == "primary"
    origin.wait_stored()
    # The primary's answer replaced the fallback's, unflagged.
    assert b'"fallback"' not in entry(key).partition(b"\n")[0]
    hit = ask(question)
    assert hit.headers["x-prism-edge-cache-layer"] == "redis" and from_primary(hit)
