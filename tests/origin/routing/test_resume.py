"""A chat stream that breaks mid-answer, continued by the route's next target: through a
real origin, a real Redis and the provider stand-in on real HTTP, which continues its own
known answer, so the spliced text can be checked against the whole answer exactly."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from deploy.local.provider import ProviderServer
from origin.routing.stall_watch import FLOOR
from tests.fixtures.origin import OriginFactory, RunningOrigin
from tests.polling import wait_for

_questions = itertools.count()
_RESUMPTIONS = "prism_provider_stream_resumptions_total"


def question() -> list[dict[str, str]]:
    """A new question each time, so no answer comes from the cache."""
    return [{"role": "user", "content": f"resume {next(_questions)}"}]


def providers_file(
    url: str, second: str = 'kind = "anthropic"', route: str = "", first: str = ""
) -> str:
    """``first``, the stand-in's OpenAI API; ``second``, the same stand-in as ``second``
    says; ``whole``, that second target alone (the answer a continuation must add up to)."""
    base = url if "anthropic" in second else url + "/v1"
    return f"""
[providers.first]
base_url = "{url}/v1"
api_key = "provider-test-key"
label = "first provider"
{first}
[providers.second]
base_url = "{base}"
api_key = "provider-test-key"
label = "second provider"
{second}
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
    def start(env: dict[str, str] | None = None, **parts: str) -> RunningOrigin:
        path = tmp_path / "providers.toml"
        path.write_text(providers_file(provider.url, **parts))
        return origin_factory(env, PRISM_PROVIDERS_FILE=str(path))

    return start


def post(
    origin: RunningOrigin, api_key: str, data: dict[str, Any], request_id: str | None = None
) -> httpx.Response:
    headers = {"authorization": f"Bearer {api_key}"}
    if request_id is not None:
        headers["x-request-id"] = request_id
    return httpx.post(origin.url + "/v1/chat/completions", json=data, headers=headers, timeout=30)


def events(text: str) -> list[Any]:
    """Each event's data: the parsed JSON, or "[DONE]"."""
    blocks = [block.removeprefix("data: ") for block in text.split("\n\n") if block]
    return [block if block == "[DONE]" else json.loads(block) for block in blocks]


def content(chunks: list[Any]) -> str:
    return "".join(
        choice["delta"].get("content") or ""
        for chunk in chunks
        if isinstance(chunk, dict)
        for choice in chunk.get("choices", [])
    )


def whole(origin: RunningOrigin, api_key: str, messages: list[dict[str, str]]) -> str:
    """The second target's whole answer to ``messages``, asked of it directly."""
    answer = post(origin, api_key, {"model": "whole", "messages": messages})
    assert answer.status_code == 200, answer.text
    text: str = answer.json()["choices"][0]["message"]["content"]
    return text


def resumed(origin: RunningOrigin, outcome: str, provider: str = "first") -> float:
    return origin.metric(_RESUMPTIONS, provider=provider, outcome=outcome)


@pytest.mark.parametrize(
    ("mode", "params"),
    [
        ("truncated_stream", {"after_chunks": 3}),  # a clean close before the end
        ("truncated_stream", {"after_chunks": 3, "abort": 1}),  # the connection dropped
        ("malformed_json", {}),  # an event that is not JSON (only the role chunk before it)
    ],
)
def test_a_broken_stream_is_finished_by_the_next_target_as_one_answer(
    start_origin: Callable[..., RunningOrigin],
    provider: ProviderServer,
    api_key: str,
    mode: str,
    params: dict[str, Any],
) -> None:
    origin = start_origin()
    messages = question()
    provider.control.set_fault(mode, **params)
    response = post(origin, api_key, {"model": "demo", "messages": messages, "stream": True})
    assert response.status_code == 200
    assert response.headers["x-prism-provider"] == "first provider"  # sent before the break
    *chunks, done = events(response.text)
    assert done == "[DONE]"
    assert not any("error" in chunk for chunk in chunks)
    text = content(chunks)
    assert text == whole(origin, api_key, messages)  # nothing repeated, nothing missing
    # One answer: one id, one created, one model, one role chunk.
    assert len({(c["id"], c["created"], c["model"]) for c in chunks}) == 1
    assert sum(1 for c in chunks for ch in c["choices"] if "role" in ch["delta"]) == 1
    assert chunks[-1]["prism"] == {
        "providers": ["first provider", "second provider"],
        "resumed": True,
    }
    assert all("prism" not in chunk for chunk in chunks[:-1])
    assert resumed(origin, "resumed") == 1
    paths = [request["path"] for request in provider.control.requests()]
    assert paths[-3:] == ["/v1/chat/completions", "/v1/messages", "/v1/messages"]


def test_the_anthropic_continuation_is_its_native_prefill_without_trailing_space(
    start_origin: Callable[..., RunningOrigin], provider: ProviderServer, api_key: str
) -> None:
    origin = start_origin()
    messages = question()
    provider.control.set_fault("truncated_stream", after_chunks=3)
    response = post(origin, api_key, {"model": "demo", "messages": messages, "stream": True})
    first_part = content(events(response.text)[:3])
    assert first_part.endswith(" ")  # the cut fell after a word and its space
    sent = provider.control.requests()[-1]["body"]
    assert len(sent["messages"]) == len(messages) + 1
    assert sent["messages"][-1] == {
        "role": "assistant",
        "content": [{"type": "text", "text": first_part.rstrip()}],
    }


def test_a_stream_stalled_past_its_idle_limit_is_continued(
    start_origin: Callable[..., RunningOrigin], provider: ProviderServer, api_key: str
) -> None:
    origin = start_origin(first="first_byte_timeout = 0.5")
    messages = question()
    provider.control.set_fault("stall_mid_stream", after_chunks=3, seconds=10)
    try:
        sdk = openai.OpenAI(base_url=origin.url + "/v1", api_key=api_key, max_retries=0)
        stream = sdk.chat.completions.create(
            model="demo",
            messages=[{"role": "user", "content": messages[0]["content"]}],
            stream=True,
        )
        chunks = list(stream)
    finally:
        provider.control.release()
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole(origin, api_key, messages)
    assert chunks[-1].model_extra is not None
    assert chunks[-1].model_extra["prism"]["resumed"] is True
    assert resumed(origin, "resumed") == 1


@pytest.mark.parametrize(
    ("continuation", "sent"),
    [
        ("prefix", lambda text: {"role": "assistant", "content": text, "prefix": True}),
        ("continue_final_message", lambda text: {"role": "assistant", "content": text}),
    ],
)
def test_an_openai_compatible_target_continues_as_its_table_says(
    start_origin: Callable[..., RunningOrigin],
    provider: ProviderServer,
    api_key: str,
    continuation: str,
    sent: Callable[[str], dict[str, Any]],
) -> None:
    origin = start_origin(second=f'continuation = "{continuation}"')
    messages = question()
    provider.control.set_fault("truncated_stream", after_chunks=3)
    data = {
        "model": "demo",
        "messages": messages,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    response = post(origin, api_key, data)
    *chunks, done = events(response.text)
    assert done == "[DONE]"
    first_part = content(chunks[:3])
    assert content(chunks) == whole(origin, api_key, messages)
    body = [r for r in provider.control.requests() if r["path"] == "/v1/chat/completions"][-2]
    assert body["body"]["messages"][-1] == sent(first_part)
    if continuation == "continue_final_message":
        assert body["body"]["continue_final_message"] is True
        assert body["body"]["add_generation_prompt"] is False
    # Asked for usage: the usage chunk is the last, and carries the extension; the usage is
    # the continuation's (its prompt holds the first part).
    usage = chunks[-1]
    assert usage["choices"] == [] and usage["prism"]["resumed"] is True
    assert usage["usage"]["completion_tokens"] == len(content(chunks[3:]).split())
    assert chunks[-2]["prism"]["providers"] == ["first provider", "second provider"]


def test_with_no_target_that_can_continue_the_stream_ends_in_its_error(
    start_origin: Callable[..., RunningOrigin], provider: ProviderServer, api_key: str
) -> None:
    origin = start_origin(second="")  # an OpenAI-compatible target that cannot continue
    provider.control.set_fault("truncated_stream", after_chunks=3)
    response = post(origin, api_key, {"model": "demo", "messages": question(), "stream": True})
    *chunks, last = events(response.text)
    assert "[DONE]" not in chunks and chunks
    assert last["error"]["code"] == "upstream_truncated"
    assert resumed(origin, "unavailable") == 1
    assert resumed(origin, "resumed") == 0


def test_a_route_with_resume_off_ends_in_the_error(
    start_origin: Callable[..., RunningOrigin], provider: ProviderServer, api_key: str
) -> None:
    origin = start_origin(route="resume = false")
    provider.control.set_fault("truncated_stream", after_chunks=3)
    response = post(origin, api_key, {"model": "demo", "messages": question(), "stream": True})
    last = events(response.text)[-1]
    assert last["error"]["code"] == "upstream_truncated"
    assert [r["path"] for r in provider.control.requests()] == ["/v1/chat/completions"]
    assert resumed(origin, "unavailable") == resumed(origin, "resumed") == 0


def test_a_continuation_that_fails_too_leaves_the_first_error(
    start_origin: Callable[..., RunningOrigin], provider: ProviderServer, api_key: str
) -> None:
    origin = start_origin()
    provider.control.set_fault("truncated_stream", after_chunks=3)
    provider.control.set_fault("status", status=503, count=5)  # the continuation and its retry
    response = post(origin, api_key, {"model": "demo", "messages": question(), "stream": True})
    last = events(response.text)[-1]
    assert last["error"]["code"] == "upstream_truncated"
    assert resumed(origin, "failed") == 1


@pytest.mark.parametrize("store", [False, True])
def test_a_spliced_answer_is_stored_only_when_the_route_says(
    start_origin: Callable[..., RunningOrigin],
    provider: ProviderServer,
    api_key: str,
    store: bool,
) -> None:
    origin = start_origin(route=f"resume_store = {str(store).lower()}")
    data = {"model": "demo", "messages": question(), "stream": True}
    provider.control.set_fault("truncated_stream", after_chunks=3)
    spliced = post(origin, api_key, data)
    assert events(spliced.text)[-1] == "[DONE]"
    origin.wait_stored()
    again = post(origin, api_key, data)
    assert events(again.text)[-1] == "[DONE]"
    layer = again.headers["x-prism-edge-cache-layer"]
    if store:
        assert layer != "miss"
        assert content(events(again.text)) == content(events(spliced.text))
    else:
        assert layer == "miss"


def test_bad_continuation_and_resume_options_are_refused(tmp_path: Path) -> None:
    from origin.providers.config import load_provider_config

    path = tmp_path / "providers.toml"
    for text, message in [
        (providers_file("http://x", second='continuation = "echo"'), "continuation must be"),
        (
            providers_file("http://x", second='kind = "anthropic"\ncontinuation = "prefix"'),
            "continuation is for",
        ),
        (providers_file("http://x", route='resume = "yes"'), "resume must be"),
        (providers_file("http://x", route="resume_store = 1"), "resume_store must be"),
    ]:
        path.write_text(text)
        with pytest.raises(ValueError, match=message):
            load_provider_config(path, {})
    path.write_text(providers_file("http://x", second='continuation = "prefix"'))
    config = load_provider_config(path, {})
    assert config.providers["second"].continuation == "prefix"
    assert config.routes["demo"].resume and not config.routes["demo"].resume_store


def test_a_partial_tool_call_is_not_resumed(
    start_origin: Callable[..., RunningOrigin], provider: ProviderServer, api_key: str
) -> None:
    origin = start_origin()
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
    data = {
        "model": "demo",
        "messages": question(),
        "stream": True,
        "tools": [tool],
        "tool_choice": "required",
    }
    provider.control.set_fault("truncated_stream", after_chunks=3)
    last = events(post(origin, api_key, data).text)[-1]
    assert last["error"]["code"] == "upstream_truncated"
    assert [r["path"] for r in provider.control.requests()] == ["/v1/chat/completions"]


def test_the_splice_drops_what_the_prefill_left_off_across_chunks() -> None:
    from origin.routing.resume import Splice

    meta = {"id": "chatcmpl-first", "created": 1, "model": "m"}
    splice = Splice(meta, "  ", ["a", "b"])

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return json.dumps({"id": "x", "created": 2, "model": "n", "choices": [choice]}).encode()

    out = splice.feed(chunk({"role": "assistant", "content": ""}))  # role only: dropped
    out += splice.feed(chunk({"content": " "}))  # all overlap: dropped
    out += splice.feed(chunk({"content": " next"}))
    out += splice.feed(chunk({"content": " words"}))
    out += splice.feed(chunk({}, "stop"))
    out += splice.feed(b"[DONE]")
    assert out[-1] == b"[DONE]"
    relayed = [json.loads(data) for data in out[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in relayed) == "next words"
    assert all({k: c[k] for k in meta} == meta for c in relayed)
    assert [("prism" in c) for c in relayed] == [False, False, True]


def test_a_partial_answer_is_text_of_one_unfinished_choice() -> None:
    from origin.routing.resume import partial_answer

    def frame(delta: dict[str, Any], index: int = 0, finish: str | None = None) -> bytes:
        choice = {"index": index, "delta": delta, "finish_reason": finish}
        chunk = {"id": "c", "created": 3, "model": "m", "choices": [choice]}
        return b"data: " + json.dumps(chunk).encode() + b"\n\n"

    role, text = frame({"role": "assistant", "content": ""}), frame({"content": "Hi "})
    partial = partial_answer([role, text], set())
    assert partial is not None
    assert partial.text == "Hi " and partial.meta == {"id": "c", "created": 3, "model": "m"}
    assert partial_answer([role, frame({}, finish="stop")], set()) is None
    assert partial_answer([role, frame({"content": "x"}, index=1)], set()) is None
    assert partial_answer([role, frame({"tool_calls": [{"index": 0}]})], set()) is None


def test_every_client_of_a_shared_call_gets_the_one_spliced_answer(
    start_origin: Callable[..., RunningOrigin], provider: ProviderServer, api_key: str
) -> None:
    origin = start_origin(first="first_byte_timeout = 2")
    messages = question()
    data = {"model": "demo", "messages": messages, "stream": True}
    provider.control.set_fault("stall_mid_stream", after_chunks=3, seconds=30)
    answers: list[httpx.Response] = []
    try:
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(post, origin, api_key, data)
            # Stalled mid-answer: the second identical request joins the same call.
            wait_for(lambda: provider.control.stats()["open_streams"] == 1)
            wait_for(lambda: len(origin.gateway.flights) == 1)
            answers.append(post(origin, api_key, data))
            answers.append(first.result(timeout=30))
    finally:
        provider.control.release()
    assert origin.metric("prism_origin_coalesced_requests_total") == 1
    texts = set()
    for answer in answers:
        *chunks, done = events(answer.text)
        assert done == "[DONE]"
        texts.add(content(chunks))
    assert texts == {whole(origin, api_key, messages)}
    assert resumed(origin, "resumed") == 1


def test_a_continuation_that_breaks_too_ends_in_its_own_error(
    start_origin: Callable[..., RunningOrigin], provider: ProviderServer, api_key: str
) -> None:
    origin = start_origin()
    messages = question()
    provider.control.set_fault("truncated_stream", after_chunks=3)
    provider.control.set_fault("truncated_stream", after_chunks=5)  # two words of the rest
    response = post(origin, api_key, {"model": "demo", "messages": messages, "stream": True})
    *chunks, last = events(response.text)
    assert "[DONE]" not in chunks
    assert last["error"]["code"] == "upstream_truncated"
    assert "'second'" in last["error"]["message"]
    assert whole(origin, api_key, messages).startswith(content(chunks))
    assert len(content(chunks)) > len(content(chunks[:3]))  # part of the rest reached it
    assert resumed(origin, "failed") == 1


def stream(origin: RunningOrigin, api_key: str, messages: list[dict[str, str]]) -> httpx.Response:
    return post(origin, api_key, {"model": "demo", "messages": messages, "stream": True})


@pytest.mark.parametrize("continued", [True, False], ids=["continued", "no_other_target"])
def test_a_stall_is_caught_by_the_streams_pace_not_the_providers_minute(
    start_origin: Callable[..., RunningOrigin],
    provider: ProviderServer,
    api_key: str,
    continued: bool,
) -> None:
    """The first provider's limit is 60 s; its streams have been quick, so a stream of it
    silent for the floor (2 s) is stalled: continued by the next target (one answer, whole),
    or, with none that can continue, ended with the timeout as its error event."""
    origin = start_origin(
        second="" if not continued else 'kind = "anthropic"', first="first_byte_timeout = 60"
    )
    for _ in range(3):  # whole, quick streams: the first target learns its pace
        assert events(stream(origin, api_key, question()).text)[-1] == "[DONE]"
    messages = question()
    provider.control.set_fault("stall_mid_stream", after_chunks=3, seconds=50)
    started = time.monotonic()
    try:
        answer = stream(origin, api_key, messages)
    finally:
        provider.control.release()
    took = time.monotonic() - started
    assert took < FLOOR + 3  # the stall was told in seconds (the provider allowed 60)
    *chunks, last = events(answer.text)
    if continued:
        assert last == "[DONE]" and content(chunks) == whole(origin, api_key, messages)
        assert resumed(origin, "resumed") == 1
    else:
        assert last["error"]["code"] == "upstream_timeout"
        assert "stalled" in last["error"]["message"]
