"""The semantic cache over real HTTP: a real origin, a real Redis, the provider stand-in and
the real model (all-MiniLM-L6-v2, from its PyPI package). A paraphrase is answered from
the entry of the question it paraphrases; nothing else ever is."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import redis
from typer.testing import CliRunner

from deploy.cli import app
from deploy.local.provider import ProviderServer
from origin.store.semantic.index import INDEX_KEY_PREFIX
from prism import Policy, entry_key, policy_key
from tests.fixtures.origin import OriginFactory, RunningOrigin
from tests.fixtures.semantic import CHAT, LAYER, QUESTION, ask, calls, first, opt_in
from tests.polling import wait_for
from tests.redis_replies import reply_as, stream_fields

pytest.importorskip("numpy", reason="the semantic extra is not installed")

KEY, SCORE = "x-prism-cache-key", "x-prism-semantic-score"
PARAPHRASE = "what is the capital of france"
OTHER = "What is the capital of Germany?"


def test_a_paraphrase_is_answered_from_the_semantic_layer(
    client: httpx.Client, origin: RunningOrigin, admin: redis.Redis, provider: ProviderServer
) -> None:
    opt_in(admin)
    stored = first(client, origin, ask(QUESTION))
    assert admin.exists(entry_key_of(admin, stored.headers[KEY]))
    answered = client.post(CHAT, json=ask(PARAPHRASE))
    assert answered.status_code == 200
    assert answered.headers[LAYER] == "semantic"
    assert answered.headers[KEY] == stored.headers[KEY]  # the matched entry's key
    assert float(answered.headers[SCORE]) >= 0.94
    assert answered.content == stored.content  # the stored answer, byte for byte
    assert calls(provider) == 1
    assert origin.metric("prism_semantic_lookups_total", outcome="hit") == 1


def test_a_different_question_is_not_answered_semantically(
    client: httpx.Client, origin: RunningOrigin, admin: redis.Redis, provider: ProviderServer
) -> None:
    opt_in(admin)
    first(client, origin, ask(QUESTION))
    for text in (OTHER, "Convert 5 km to miles."):
        response = client.post(CHAT, json=ask(text))
        assert response.headers[LAYER] == "miss" and SCORE not in response.headers
    origin.wait_stored()
    # A near miss the score alone would take (0.99): the guard refuses it.
    first(client, origin, ask("Convert 5 miles to km."))
    assert calls(provider) == 4


def test_never_across_projects(
    client: httpx.Client,
    origin: RunningOrigin,
    admin: redis.Redis,
    provider: ProviderServer,
    key_ring: Any,
) -> None:
    opt_in(admin)
    opt_in(admin, "globex")
    first(client, origin, ask(QUESTION))
    other = httpx.post(
        origin.url + CHAT,
        json=ask(QUESTION),  # the very same text
        headers={"authorization": f"Bearer {key_ring.mint('globex')}"},
        timeout=30,
    )
    assert other.status_code == 200 and other.headers[LAYER] == "miss"
    assert calls(provider) == 2


@pytest.mark.parametrize(
    "change",
    [
        {"model": "gpt-4o-mini"},
        {"temperature": 0.2},
        {"max_tokens": 50},
        {"response_format": {"type": "json_object"}},
        {"messages": [{"role": "system", "content": "Answer in French."}]},
    ],
    ids=["model", "temperature", "max_tokens", "response_format", "system_prompt"],
)
def test_never_across_partitions(
    client: httpx.Client,
    origin: RunningOrigin,
    admin: redis.Redis,
    provider: ProviderServer,
    change: dict[str, Any],
) -> None:
    opt_in(admin)
    first(client, origin, ask(QUESTION))
    payload = {**ask(PARAPHRASE), **change}
    if "messages" in change:
        payload["messages"] = [*change["messages"], *ask(PARAPHRASE)["messages"]]
    response = client.post(CHAT, json=payload)
    assert response.status_code == 200 and response.headers[LAYER] == "miss"
    assert calls(provider) == 2


def test_a_project_without_the_opt_in_never_gets_semantic_hits(
    client: httpx.Client, origin: RunningOrigin, admin: redis.Redis, provider: ProviderServer
) -> None:
    first(client, origin, ask(QUESTION))  # no policy at all
    assert client.post(CHAT, json=ask(PARAPHRASE)).headers[LAYER] == "miss"
    admin.set(policy_key("acme"), Policy(deny=("o1*",)).encode())  # a policy, no cache field
    origin.wait_stored()
    first(client, origin, ask("What is the capital of France"))
    assert not admin.keys(INDEX_KEY_PREFIX + "*")  # nothing embedded, nothing indexed
    assert origin.gateway.semantic is not None and not origin.gateway.semantic.embedder.loaded
    opt_in(admin, semantic=False)
    first(client, origin, ask("what's the capital of France"))
    assert calls(provider) == 4
    assert not origin.gateway.semantic.embedder.loaded and not admin.keys(INDEX_KEY_PREFIX + "*")


def indexed(admin: redis.Redis, key: bytes | str) -> dict[str, int]:
    """The partition's live records as its stream says: fingerprint -> expiry."""
    live: dict[str, int] = {}
    for fields in stream_fields(bytes, admin.xrange(key)):
        fingerprint, expires = fields[b"f"].decode(), int(fields[b"e"])
        if expires:
            live[fingerprint] = expires
        else:
            live.pop(fingerprint, None)
    return live


@pytest.mark.parametrize("gone", ["deleted", "expired"])
def test_an_expired_or_deleted_entry_is_never_served_semantically(
    client: httpx.Client,
    origin: RunningOrigin,
    admin: redis.Redis,
    provider: ProviderServer,
    gone: str,
) -> None:
    opt_in(admin)
    stored = first(client, origin, ask(QUESTION))
    (index,) = admin.keys(INDEX_KEY_PREFIX + "*")
    assert admin.ttl(index) > 0  # the partition expires with its last entry
    entry = entry_key_of(admin, stored.headers[KEY])
    if gone == "deleted":
        admin.delete(entry)
    else:  # Redis expires it (evicted or cut short): the index record still looks alive
        admin.pexpire(entry, 1)
        wait_for(lambda: not admin.exists(entry), 5)
    response = client.post(CHAT, json=ask(PARAPHRASE))
    assert response.headers[LAYER] == "miss"
    assert calls(provider) == 2
    # The stale record was dropped from the index, and the new answer indexed in its place.
    origin.wait_stored()
    wait_for(lambda: len(indexed(admin, index)) == 1, 5)
    assert all(admin.exists(entry_key(fp)) for fp in indexed(admin, index))


def test_a_short_lived_entry_expires_from_the_index_with_its_twin(
    client: httpx.Client, origin: RunningOrigin, admin: redis.Redis, provider: ProviderServer
) -> None:
    opt_in(admin)
    first(client, origin, ask(QUESTION, stream=False) | {"user": "u"})
    (index,) = admin.keys(INDEX_KEY_PREFIX + "*")
    ((fingerprint, expires),) = indexed(admin, index).items()
    entry_ttl = admin.ttl(entry_key(fingerprint))
    assert 0 < admin.ttl(index) <= entry_ttl + 1  # the index record carries the same expiry
    assert abs(expires - (admin.time()[0] + entry_ttl)) <= 2


def test_an_incomplete_answer_is_never_indexed(
    client: httpx.Client, origin: RunningOrigin, admin: redis.Redis, provider: ProviderServer
) -> None:
    opt_in(admin)
    provider.control.set_fault("truncated_stream")
    with client.stream("POST", CHAT, json=ask(QUESTION, stream=True)) as response:
        body = response.read()
    assert b"[DONE]" not in body  # the client saw the failure
    origin.wait_stored()
    assert not admin.keys(INDEX_KEY_PREFIX + "*")
    assert not admin.keys("prism:v1:*")
    response = client.post(CHAT, json=ask(PARAPHRASE))
    assert response.headers[LAYER] == "miss"


def test_a_streamed_paraphrase_replays_the_entry_as_sse(
    client: httpx.Client, origin: RunningOrigin, admin: redis.Redis, provider: ProviderServer
) -> None:
    opt_in(admin)
    stored = first(client, origin, ask(QUESTION))
    content = stored.json()["choices"][0]["message"]["content"]
    with client.stream(
        "POST",
        CHAT,
        json=ask(PARAPHRASE, stream=True, stream_options={"include_usage": True}),
    ) as response:
        assert response.headers[LAYER] == "semantic"
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == content
    assert any(c.get("usage") for c in chunks)
    assert calls(provider) == 1


def test_a_conversation_that_is_not_a_question_never_qualifies(
    client: httpx.Client, origin: RunningOrigin, admin: redis.Redis, provider: ProviderServer
) -> None:
    opt_in(admin)
    tool_turn = [
        {"role": "user", "content": QUESTION},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "Paris"},
        {"role": "user", "content": PARAPHRASE},
    ]
    for payload in (
        {"model": "demo", "messages": tool_turn},
        ask(QUESTION, n=2),
        ask(QUESTION, temperature=1.5),
    ):
        assert client.post(CHAT, json=payload).status_code == 200
    origin.wait_stored()
    assert not admin.keys(INDEX_KEY_PREFIX + "*")


def entry_key_of(admin: redis.Redis, prefix: str) -> str:
    """The entry whose fingerprint starts with the x-prism-cache-key ``prefix``."""
    (key,) = admin.keys(entry_key(prefix) + "*")
    return reply_as(bytes, key).decode()


def test_without_a_model_an_opted_in_project_is_served_as_before(
    origin_factory: OriginFactory,
    api_key: str,
    admin: redis.Redis,
    provider: ProviderServer,
    tmp_path: Any,
) -> None:
    opt_in(admin)
    origin = origin_factory(PRISM_SEMANTIC_MODEL=str(tmp_path / "no-model-here"))
    with httpx.Client(
        base_url=origin.url, headers={"authorization": f"Bearer {api_key}"}, timeout=30
    ) as http:
        for text in (QUESTION, PARAPHRASE, QUESTION):
            response = http.post(CHAT, json=ask(text))
            assert response.status_code == 200
            origin.wait_stored()
        assert response.headers[LAYER] == "redis"  # the exact cache works as ever
    health = httpx.get(origin.admin_url + "/healthz").json()["semantic"]
    assert health["enabled"] and not health["loaded"]
    assert "semantic cache model unavailable" in health["error"]
    assert calls(provider) == 2 and not admin.keys(INDEX_KEY_PREFIX + "*")


def test_the_semantic_layer_can_be_turned_off_for_the_whole_origin(
    origin_factory: OriginFactory, api_key: str, admin: redis.Redis
) -> None:
    opt_in(admin)
    origin = origin_factory(PRISM_SEMANTIC_MODEL="off")
    assert origin.gateway.semantic is None
    with httpx.Client(
        base_url=origin.url, headers={"authorization": f"Bearer {api_key}"}, timeout=30
    ) as http:
        first(http, origin, ask(QUESTION))
        assert http.post(CHAT, json=ask(PARAPHRASE)).headers[LAYER] == "miss"
    assert httpx.get(origin.admin_url + "/healthz").json()["semantic"] == {"enabled": False}


def _commands(admin: redis.Redis) -> dict[str, int]:
    return {name: int(stats["calls"]) for name, stats in admin.info("commandstats").items()}


def test_a_project_without_the_opt_in_pays_no_redis_command_for_it(
    client: httpx.Client, origin: RunningOrigin, admin: redis.Redis
) -> None:
    admin.set(policy_key("acme"), Policy(deny=("o1*",)).encode())
    first(client, origin, ask(QUESTION))  # scripts loaded, warm
    before = _commands(admin)
    first(client, origin, ask(PARAPHRASE))
    after = _commands(admin)
    for command in ("cmdstat_hgetall", "cmdstat_mget", "cmdstat_hset"):
        assert after.get(command, 0) == before.get(command, 0)
    # The lookup (the shared flight's lease taken in it), and the flight's stream written at
    # its end: nothing semantic.
    assert after["cmdstat_evalsha"] - before["cmdstat_evalsha"] == 2


def test_a_semantic_hit_spends_nothing_from_a_budget_and_counts_as_a_request(
    origin_factory: OriginFactory,
    api_key: str,
    admin: redis.Redis,
    redis_url: str,
    provider: ProviderServer,
    tmp_path: Any,
) -> None:
    from datetime import UTC, datetime

    from deploy.policy_store import PolicyStore
    from origin.governance.budgets import budget_keys, period_of
    from prism import Budget, CacheRules, RateLimits

    config = tmp_path / "providers.toml"
    config.write_text(
        f'[providers.p]\nbase_url = "{provider.url}/v1"\n[models]\n"gpt-4o-mini" = ["p"]\n'
    )
    origin = origin_factory(PRISM_PROVIDERS_FILE=str(config))
    store = PolicyStore.from_url(redis_url)
    limits = RateLimits.from_dict({"project": {"rpm": 100}})
    store.set("acme", budget=Budget(5, "day"), cache=CacheRules(semantic=True), rate_limits=limits)
    store.close()
    budget, _ = budget_keys("acme", period_of("day", datetime.now(UTC))[0])

    def post(text: str) -> httpx.Response:
        return httpx.post(
            origin.url + CHAT,
            json={**ask(text), "model": "gpt-4o-mini", "max_tokens": 100},
            headers={"authorization": f"Bearer {api_key}"},
            timeout=30,
        )

    assert post(QUESTION).headers[LAYER] == "miss"
    origin.wait_stored()
    spent = admin.hgetall(budget)
    assert int(spent[b"spent"]) > 0
    answered = post(PARAPHRASE)
    assert answered.status_code == 200 and answered.headers[LAYER] == "semantic"
    # Counted against the request limit like any request, with OpenAI's headers.
    assert answered.headers["x-ratelimit-limit-requests"] == "100"
    assert answered.headers["x-ratelimit-remaining-requests"] == "98"
    origin.wait_stored()
    assert admin.hgetall(budget) == spent  # nothing reserved, nothing spent
    assert calls(provider) == 1


def test_usage_counts_a_semantic_hit_apart_from_a_redis_hit(
    client: httpx.Client, origin: RunningOrigin, admin: redis.Redis, redis_url: str
) -> None:
    opt_in(admin)
    first(client, origin, ask(QUESTION))
    assert client.post(CHAT, json=ask(PARAPHRASE)).headers[LAYER] == "semantic"
    assert client.post(CHAT, json=ask(QUESTION)).headers[LAYER] == "redis"

    def shown() -> dict[str, Any] | None:
        """``prism usage --json``'s one row once all three requests are flushed."""
        result = CliRunner().invoke(
            app, ["usage", "--project", "acme", "--json", "--redis-url", redis_url]
        )
        assert result.exit_code == 0, result.output
        rows: list[dict[str, Any]] = json.loads(result.stdout)["rows"]
        return rows[0] if rows and sum(rows[0]["requests"].values()) == 3 else None

    row = wait_for(shown, 10, interval=0.1)
    assert row["model"] == "demo"
    assert row["requests"] == {
        "redis": 1,
        "semantic": 1,
        "miss": 1,
        "bypass": 0,
        "coalesced": 0,
        "kv": 0,
    }
