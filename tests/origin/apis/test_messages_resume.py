"""An Anthropic Messages stream that breaks mid-answer, continued by the route's next target:
through a real origin, a real Redis and the provider stand-in on real HTTP (which continues
its own known answer), read with the anthropic SDK's stream helpers and as raw events."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from deploy.local.provider import ProviderServer
from tests.fixtures.origin import OriginFactory, RunningOrigin

PATH = "/v1/messages"
_RESUMPTIONS = "prism_provider_stream_resumptions_total"
_questions = itertools.count()
OPENAI, ANTHROPIC = "", 'kind = "anthropic"'


def question() -> list[dict[str, str]]:
    """A new question each time, so no answer comes from the cache."""
    return [{"role": "user", "content": f"resume messages {next(_questions)}"}]


def providers_file(url: str, first: str, second: str, route: str = "") -> str:
    """``demo``: ``first`` then ``second``, each the stand-in as its kind says (OpenAI's
    API unless ``kind = "anthropic"``); ``whole``: the second alone (the answer a spliced
    one must equal)."""

    def provider(name: str, lines: str) -> str:
        base = url if "anthropic" in lines else url + "/v1"
        return (
            f'[providers.{name}]\nbase_url = "{base}"\napi_key = "provider-test-key"\n'
            f'label = "{name} provider"\n{lines}\n'
        )

    return f"""
{provider("first", first)}
{provider("second", second)}
[models]
"whole" = ["second:stand-model"]
[models.demo]
targets = ["first:stand-model", "second:stand-model"]
{route}
"""


@pytest.fixture
def start_origin(
    origin_factory: OriginFactory, tmp_path: Path, provider: ProviderServer
) -> Callable[..., RunningOrigin]:
    def start(first: str = OPENAI, second: str = ANTHROPIC, route: str = "") -> RunningOrigin:
        path = tmp_path / "providers.toml"
        path.write_text(providers_file(provider.url, first, second, route))
        return origin_factory(PRISM_PROVIDERS_FILE=str(path))

    return start


def post(origin: RunningOrigin, api_key: str, messages: list[dict[str, str]]) -> httpx.Response:
    body = {"model": "demo", "max_tokens": 256, "messages": messages, "stream": True}
    return httpx.post(origin.url + PATH, json=body, headers={"x-api-key": api_key}, timeout=30)


def events(text: str) -> list[dict[str, Any]]:
    """Each event's data, checked against its ``event:`` line."""
    out = []
    for block in text.split("\n\n"):
        if block:
            kind, data = block.split("\n", 1)
            event = json.loads(data.removeprefix("data: "))
            assert kind == f"event: {event['type']}"
            out.append(event)
    return out


def text_of(sequence: list[dict[str, Any]]) -> str:
    return "".join(
        e["delta"].get("text", "") for e in sequence if e["type"] == "content_block_delta"
    )


def whole(origin: RunningOrigin, api_key: str, messages: list[dict[str, str]]) -> str:
    """The second target's whole answer to ``messages``, asked of it directly."""
    client = anthropic.Anthropic(base_url=origin.url, api_key=api_key, max_retries=0)
    answer = client.messages.create(model="whole", max_tokens=256, messages=messages)  # type: ignore[arg-type]
    block = answer.content[0]
    assert isinstance(block, anthropic.types.TextBlock)
    return block.text


def resumed(origin: RunningOrigin, outcome: str) -> float:
    return origin.metric(_RESUMPTIONS, provider="first", outcome=outcome)


def assert_one_message(sequence: list[dict[str, Any]]) -> None:
    """One well-formed event sequence: one start, one text block 0, one delta, one stop."""
    kinds = [e["type"] for e in sequence if e["type"] != "ping"]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds.count("message_start") == kinds.count("message_delta") == 1
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 1
    assert {e["index"] for e in sequence if "index" in e} == {0}
    assert kinds.index("content_block_stop") == len(kinds) - 3


@pytest.mark.parametrize(
    ("first", "second", "fault"),
    [
        # A Messages request translated to chat, cut; finished by an Anthropic prefill.
        (OPENAI, ANTHROPIC, {"after_chunks": 3}),
        (OPENAI, ANTHROPIC, {"after_chunks": 3, "abort": 1}),
        # ... or by an OpenAI-compatible target that continues, its chunks translated back.
        (OPENAI, 'continuation = "prefix"', {"after_chunks": 3}),
        (OPENAI, 'continuation = "continue_final_message"', {"after_chunks": 3}),
        # Anthropic's own stream cut after two text deltas, finished by an OpenAI target.
        (ANTHROPIC, 'continuation = "continue_final_message"', {"after_chunks": 5}),
    ],
    ids=["to-anthropic", "to-anthropic-dropped", "to-prefix", "to-vllm", "from-anthropic"],
)
def test_a_broken_messages_stream_is_finished_by_the_next_target_as_one_message(
    start_origin: Callable[..., RunningOrigin],
    provider: ProviderServer,
    api_key: str,
    first: str,
    second: str,
    fault: dict[str, Any],
) -> None:
    origin = start_origin(first, second)
    messages = question()
    provider.control.set_fault("truncated_stream", **fault)
    response = post(origin, api_key, messages)
    assert response.status_code == 200
    assert response.headers["x-prism-provider"] == "first provider"  # sent before the break
    sequence = events(response.text)
    assert_one_message(sequence)
    answer = whole(origin, api_key, messages)
    assert text_of(sequence) == answer  # nothing repeated, nothing missing
    delta = next(e for e in sequence if e["type"] == "message_delta")
    assert delta["prism"] == {"providers": ["first provider", "second provider"], "resumed": True}
    assert delta["delta"]["stop_reason"] == "end_turn"
    # The first part's own usage where it reported any (Anthropic's message_start), the
    # continuation's otherwise; the continuation's prompt holds the first part's words.
    start = sequence[0]["message"]
    cut_words = len(provider.control.requests()[-2]["body"]["messages"][-1]["content"].split())
    prompt = len(messages[0]["content"].split())
    if first == ANTHROPIC:
        assert delta["usage"]["input_tokens"] == start["usage"]["input_tokens"] == prompt
        assert delta["usage"]["output_tokens"] == 1 + len(answer.split()) - cut_words
    else:
        assert delta["usage"]["input_tokens"] == prompt + cut_words
        assert delta["usage"]["output_tokens"] == len(answer.split()) - cut_words
    assert resumed(origin, "resumed") == 1


def test_the_sdk_stream_helpers_assemble_the_spliced_message(
    start_origin: Callable[..., RunningOrigin], provider: ProviderServer, api_key: str
) -> None:
    origin = start_origin()
    messages = question()
    provider.control.set_fault("truncated_stream", after_chunks=3, abort=1)
    client = anthropic.Anthropic(base_url=origin.url, api_key=api_key, max_retries=0)
    with client.messages.stream(model="demo", max_tokens=256, messages=messages) as stream:  # type: ignore[arg-type]
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    answer = whole(origin, api_key, messages)
    assert text == answer
    assert len(final.content) == 1 and isinstance(final.content[0], anthropic.types.TextBlock)
    assert final.content[0].text == answer and final.stop_reason == "end_turn"
    assert final.usage.output_tokens > 0


def test_a_stalled_messages_stream_is_continued(
    start_origin: Callable[..., RunningOrigin], provider: ProviderServer, api_key: str
) -> None:
    origin = start_origin(first="first_byte_timeout = 0.5")
    messages = question()
    provider.control.set_fault("stall_mid_stream", after_chunks=3, seconds=10)
    client = anthropic.Anthropic(base_url=origin.url, api_key=api_key, max_retries=0)
    try:
        with client.messages.stream(model="demo", max_tokens=256, messages=messages) as stream:  # type: ignore[arg-type]
            text = "".join(stream.text_stream)
    finally:
        provider.control.release()
    assert text == whole(origin, api_key, messages)
    assert resumed(origin, "resumed") == 1


@pytest.mark.parametrize(
    ("second", "route", "outcome"),
    [(OPENAI, "", "unavailable"), (ANTHROPIC, "resume = false", None)],
    ids=["no-target-can-continue", "resume-off"],
)
def test_without_a_continuation_the_stream_ends_in_its_error_event(
    start_origin: Callable[..., RunningOrigin],
    provider: ProviderServer,
    api_key: str,
    second: str,
    route: str,
    outcome: str | None,
) -> None:
    origin = start_origin(second=second, route=route)
    provider.control.set_fault("truncated_stream", after_chunks=3)
    response = post(origin, api_key, question())
    sequence = events(response.text)
    assert sequence[0]["type"] == "message_start" and sequence[-1]["type"] == "error"
    assert "message_stop" not in response.text
    assert [r["path"] for r in provider.control.requests()] == ["/v1/chat/completions"]
    assert resumed(origin, "resumed") == 0
    if outcome is not None:
        assert resumed(origin, outcome) == 1


@pytest.mark.parametrize("store", [False, True])
def test_a_spliced_message_is_stored_only_when_the_route_says(
    start_origin: Callable[..., RunningOrigin],
    provider: ProviderServer,
    api_key: str,
    store: bool,
) -> None:
    origin = start_origin(route=f"resume_store = {str(store).lower()}")
    messages = question()
    provider.control.set_fault("truncated_stream", after_chunks=3)
    spliced = post(origin, api_key, messages)
    assert events(spliced.text)[-1]["type"] == "message_stop"
    origin.wait_stored()
    again = post(origin, api_key, messages)
    layer = again.headers["x-prism-edge-cache-layer"]
    if store:
        assert layer != "miss"
        assert text_of(events(again.text)) == text_of(events(spliced.text))
    else:
        assert layer == "miss"


def test_later_blocks_are_numbered_after_the_first_parts() -> None:
    from origin.apis.messages_resume import MessagesSplice, partial_message
    from prism.messages_sse import MessageAssembler, event_frame

    first: list[dict[str, Any]] = [
        {"type": "message_start", "message": {"id": "msg_a", "usage": {"input_tokens": 7}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "A "}},
    ]
    partial = partial_message([event_frame(event) for event in first])
    assert partial is not None and partial.text == "A "
    splice = MessagesSplice(partial.meta, " ", ["a", "b"])
    rest: list[dict[str, Any]] = [
        {"type": "message_start", "message": {"id": "msg_b", "usage": {"input_tokens": 8}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": " "}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "b"}},
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use"}},
        {"type": "content_block_stop", "index": 1},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "tool_use"},
            "usage": {"output_tokens": 3},
        },
        {"type": "message_stop"},
    ]
    out = [json.loads(data) for event in rest for data in splice.feed(json.dumps(event).encode())]
    assembler = MessageAssembler("test")
    for event in [*first, *out]:
        assembler.add(event)
    message = assembler.message()
    assert message is not None and message["id"] == "msg_a"
    assert [b["type"] for b in message["content"]] == ["text", "tool_use"]
    assert message["content"][0]["text"] == "A b"
    assert message["usage"] == {"input_tokens": 7, "output_tokens": 3}
    assert out[-2]["prism"] == {"providers": ["a", "b"], "resumed": True}


def test_a_partial_message_is_text_blocks_only() -> None:
    from origin.apis.messages_resume import partial_message
    from prism.messages_sse import event_frame

    start = event_frame({"type": "message_start", "message": {"usage": {}}})
    tool = {"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use"}}
    ended = {"type": "message_delta", "delta": {"stop_reason": "end_turn"}}
    assert partial_message([start, event_frame(tool)]) is None
    assert partial_message([start, event_frame(ended)]) is None
    assert partial_message([event_frame({"type": "ping"})]) is None
    nothing_yet = partial_message([start])
    assert nothing_yet is not None and nothing_yet.text == ""
