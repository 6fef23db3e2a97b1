"""A resumed stream's bill: each provider pays for its part at its own price, for chat,
Anthropic Messages and the Responses API. Through a real origin, a real Redis and the
provider stand-in on real HTTP (which continues its own known answer and counts a token
per word), with a budget, so both the day's usage record and the settled spend are read
from Redis."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from deploy.local.provider import ProviderServer
from origin.apis.messages_resume import partial_message
from origin.governance.resumed_bill import Resumption, broken_part_tokens
from origin.providers.pricing import Price, cost_micros
from origin.providers.token_counts import Tokens, estimated_tokens
from origin.routing.resume import partial_answer
from prism import Budget, Policy, policy_key
from tests.fixtures.origin import AccessLines, OriginFactory, RunningOrigin, settled_budget
from tests.origin.apis.test_messages_resume import ANTHROPIC, OPENAI, providers_file
from tests.origin.apis.test_messages_resume import events as messages_events
from tests.origin.routing.test_resume import content
from tests.origin.routing.test_resume import events as chat_events
from tests.polling import wait_for
from tests.redis_replies import reply_as

_questions = itertools.count()
FIRST, SECOND = Price(10, 30, 10, 10), Price(1, 2, 1, 1)  # USD per million tokens
PREFIX = 'continuation = "prefix"'  # the continuation is given the relayed text exactly


def priced(name: str, kind: str, price: Price) -> str:
    """A provider's lines with its own price for the stand-in's model."""
    table = f'"stand-model" = {{ input = {price.input:g}, output = {price.output:g} }}'
    return f"{kind}\n[providers.{name}.prices]\n{table}\n"


@pytest.fixture
def start_origin(
    origin_factory: OriginFactory, tmp_path: Path, provider: ProviderServer, admin: redis.Redis
) -> Callable[..., RunningOrigin]:
    """An origin routing ``demo`` to ``first`` then ``second``, each at its own price, for
    a project with a budget."""

    def start(first: str, second: str, second_priced: bool = True) -> RunningOrigin:
        if second_priced:  # a budget refuses a route with a target it cannot price
            admin.set(policy_key("acme"), Policy(budget=Budget(5, "day")).encode())
        second = priced("second", second, SECOND) if second_priced else second
        path = tmp_path / "providers.toml"
        lines = providers_file(provider.url, priced("first", first, FIRST), second)
        path.write_text(lines)
        return origin_factory({"PRISM_ACCESS_LOG": "on"}, PRISM_PROVIDERS_FILE=str(path))

    return start


def post(origin: RunningOrigin, api_key: str, path: str, body: dict[str, Any]) -> httpx.Response:
    headers = {
        "authorization": f"Bearer {api_key}",
        "x-request-id": f"bill-{path.rsplit('/', 1)[-1]}",
    }
    response = httpx.post(origin.url + path, json=body, headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    return response


def day_usage(admin: redis.Redis) -> dict[str, int]:
    """The ``demo`` model's usage today, once its miss is counted."""
    day = datetime.now(UTC).strftime("%Y-%m-%d")

    def rows() -> dict[str, int]:
        found = {}
        for field, value in admin.hgetall(f"prism:usage:acme:{day}").items():
            counter, _, model = reply_as(bytes, field).decode().split("|")
            if model == "demo":
                found[counter] = int(value)
        return found

    return wait_for(lambda: (r := rows()).get("requests.miss") == 1 and r, 10)


def given_text(provider: ProviderServer) -> str:
    """The relayed text the continuation was asked to carry on from (its last turn)."""
    asked = [r for r in provider.control.requests() if r["path"] == "/v1/chat/completions"]
    text: str = asked[-1]["body"]["messages"][-1]["content"]
    assert text  # the stream broke mid-answer
    return text


def assert_billed_in_parts(
    admin: redis.Redis, access_lines: AccessLines, path: str, first: Tokens, then: Tokens
) -> None:
    """The day's usage and the budget's spend are the first part at the first provider's
    price plus the continuation at the second's; the access line shows both parts."""
    costs = cost_micros(FIRST, first), cost_micros(SECOND, then)
    assert day_usage(admin)["cost_micros"] == sum(costs)
    assert settled_budget(admin)["spent"] == sum(costs)
    line = access_lines.line(f"bill-{path.rsplit('/', 1)[-1]}")
    assert (line["provider"], line["upstream_model"]) == ("second", "stand-model")
    assert line["cost_usd"] == pytest.approx(sum(costs) / 1e6)
    assert line["parts"] == [
        {
            "provider": name,
            "answered_model": "stand-model",
            "tokens_in": tokens.prompt,
            "tokens_out": tokens.completion,
            "cost_usd": pytest.approx(cost / 1e6),
        }
        for name, tokens, cost in zip(("first", "second"), (first, then), costs, strict=True)
    ]


def test_a_resumed_chat_stream_bills_each_provider_its_part(
    start_origin: Callable[..., RunningOrigin],
    provider: ProviderServer,
    api_key: str,
    admin: redis.Redis,
    access_lines: AccessLines,
) -> None:
    origin = start_origin(OPENAI, PREFIX)
    provider.control.set_fault("truncated_stream", after_chunks=3)
    body = {
        "model": "demo",
        "messages": [{"role": "user", "content": f"bill chat {next(_questions)}"}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    chunks = chat_events(post(origin, api_key, "/v1/chat/completions", body).text)[:-1]
    relayed = given_text(provider)
    assert relayed == content(chunks[:3])
    # The usage the client sees is the continuation's (its prompt holds the relayed text).
    usage = chunks[-1]["usage"]
    then = Tokens(usage["prompt_tokens"], 0, 0, usage["completion_tokens"])
    # The first part reported no usage: its prompt is the continuation's less the relayed
    # text, its completion the relayed text's estimate.
    text = estimated_tokens(relayed)
    first = Tokens(then.prompt - text, 0, 0, text)
    assert_billed_in_parts(admin, access_lines, "/v1/chat/completions", first, then)


def test_a_resumed_messages_stream_bills_each_provider_its_part(
    start_origin: Callable[..., RunningOrigin],
    provider: ProviderServer,
    api_key: str,
    admin: redis.Redis,
    access_lines: AccessLines,
) -> None:
    origin = start_origin(ANTHROPIC, PREFIX)
    provider.control.set_fault("truncated_stream", after_chunks=5)
    messages = [{"role": "user", "content": f"bill messages {next(_questions)}"}]
    body = {"model": "demo", "max_tokens": 256, "messages": messages, "stream": True}
    sequence = messages_events(post(origin, api_key, "/v1/messages", body).text)
    relayed = given_text(provider)
    start = sequence[0]["message"]["usage"]
    delta = next(e for e in sequence if e["type"] == "message_delta")["usage"]
    # The first part's prompt is what its message_start reported; the continuation read
    # that prompt and the relayed words (the stand-in's count: a token per word).
    prompt = start["input_tokens"]
    assert prompt == len(messages[0]["content"].split())
    then = Tokens(
        prompt + len(relayed.split()), 0, 0, delta["output_tokens"] - start["output_tokens"]
    )
    first = Tokens(prompt, 0, 0, estimated_tokens(relayed))
    assert_billed_in_parts(admin, access_lines, "/v1/messages", first, then)


def test_a_resumed_responses_stream_bills_each_provider_its_part(
    start_origin: Callable[..., RunningOrigin],
    provider: ProviderServer,
    api_key: str,
    admin: redis.Redis,
    access_lines: AccessLines,
) -> None:
    origin = start_origin(OPENAI, PREFIX)
    provider.control.set_fault("truncated_stream", after_chunks=3)
    body = {"model": "demo", "input": f"bill responses {next(_questions)}", "stream": True}
    sequence = messages_events(post(origin, api_key, "/v1/responses", body).text)
    relayed = given_text(provider)
    usage = sequence[-1]["response"]["usage"]  # the continuation's: the first part had none
    then = Tokens(usage["input_tokens"], 0, 0, usage["output_tokens"])
    text = estimated_tokens(relayed)
    first = Tokens(then.prompt - text, 0, 0, text)
    assert_billed_in_parts(admin, access_lines, "/v1/responses", first, then)


def test_a_part_without_a_price_leaves_the_resumed_answer_unpriced(
    start_origin: Callable[..., RunningOrigin],
    provider: ProviderServer,
    api_key: str,
    admin: redis.Redis,
    access_lines: AccessLines,
) -> None:
    origin = start_origin(OPENAI, PREFIX, second_priced=False)
    provider.control.set_fault("truncated_stream", after_chunks=3)
    question = [{"role": "user", "content": f"bill unpriced {next(_questions)}"}]
    body = {"model": "demo", "messages": question, "stream": True}
    post(origin, api_key, "/v1/chat/completions", body)
    usage = day_usage(admin)
    assert usage["unpriced"] == 1 and "cost_micros" not in usage
    line = access_lines.line("bill-completions")
    assert "cost_usd" not in line
    first, then = line["parts"]
    assert first["cost_usd"] == pytest.approx(
        cost_micros(FIRST, Tokens(first["tokens_in"], 0, 0, first["tokens_out"])) / 1e6
    )
    assert "cost_usd" not in then and then["tokens_out"] > 0


def test_the_broken_part_s_reported_usage_wins_over_the_estimate() -> None:
    then = Tokens(40, 30, 0, 12)
    reported = Tokens(25, 5, 0, 9)
    assert broken_part_tokens(Resumption("a", "m", reported, 7, then)) == reported
    # Messages' message_start reports the prompt but no output yet: the estimate is it.
    assert broken_part_tokens(Resumption("a", "m", reported._replace(completion=0), 7, then)) == (
        reported._replace(completion=7)
    )
    # Nothing reported: the continuation's prompt less the relayed text, none of it cached.
    assert broken_part_tokens(Resumption("a", "m", None, 7, then)) == Tokens(33, 0, 0, 7)
    assert broken_part_tokens(Resumption("a", "m", None, 7, None)) is None


def test_the_first_part_s_reported_usage_is_read_from_its_frames() -> None:
    chunk = (
        b'data: {"id":"c","created":3,"model":"m","choices":[{"index":0,"delta":{"content":"Hi"}}]}'
    )
    usage = b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":1}}'
    chat = partial_answer([chunk, usage], {1})
    assert chat is not None and chat.usage == Tokens(12, 0, 0, 1)
    unreported = partial_answer([chunk], set())
    assert unreported is not None and unreported.usage is None
    start = {"type": "message_start", "message": {"usage": {"input_tokens": 9, "output_tokens": 1}}}
    text = {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "text", "text": "Hi"},
    }
    frames = [f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in (start, text)]
    messages = partial_message(frames)
    # The prompt as message_start reported it; its output count is not the part's.
    assert messages is not None and messages.usage == Tokens(9, 0, 0, 0)
