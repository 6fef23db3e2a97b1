"""A Gemini target behind the edge Worker in the real local Workers runtime: the openai SDK
gets its answers from Gemini's wire format (plain, streamed, a tool call) and a repeat is
a KV hit at the PoP; the anthropic SDK's Messages too. (The edge stack routes
``gemini-*`` to the local provider as ``kind = "gemini"``: tests/fixtures/edge.py.)"""

from __future__ import annotations

import secrets
from typing import Any

import anthropic
import openai
import pytest

from tests.fixtures.edge import EdgeStack
from tests.polling import wait_for

MODEL = "gemini-2.5-flash"
WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def question(text: str) -> list[Any]:
    return [{"role": "user", "content": f"{text} {secrets.token_hex(4)}"}]


def gemini_calls(edge: EdgeStack) -> int:
    paths: dict[str, int] = edge.provider.control.stats()["paths"]
    return sum(n for path, n in paths.items() if path.startswith("/v1beta/models/"))


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_a_gemini_miss_is_then_a_kv_hit(edge: EdgeStack, api_key: str, stream: bool) -> None:
    client = openai.OpenAI(base_url=edge.url + "/v1", api_key=api_key, max_retries=0)
    messages = question("edge gemini")
    if stream:
        with client.chat.completions.with_streaming_response.create(
            model=MODEL, messages=messages, temperature=0, stream=True
        ) as response:
            assert response.headers["x-prism-edge-cache-layer"] == "miss"
            chunks = list(response.parse())
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert chunks[-1].choices[0].finish_reason == "stop"
    else:
        first = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=messages, temperature=0
        )
        assert first.headers["x-prism-edge-cache-layer"] == "miss"
        text = first.parse().choices[0].message.content or ""
    assert text.startswith("Echo: edge gemini")

    def from_kv() -> bool:
        again = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=messages, temperature=0
        )
        return again.headers["x-prism-edge-cache-layer"] == "kv"

    wait_for(from_kv)  # the origin's KV writer replicated the answer
    before = edge.origin_requests()
    hit = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, temperature=0
    )
    assert hit.headers["x-prism-edge-cache-layer"] == "kv"
    assert hit.parse().choices[0].message.content == text
    assert edge.origin_requests() == before
    assert gemini_calls(edge) == 1


def test_a_tool_call_and_messages_through_the_edge(edge: EdgeStack, api_key: str) -> None:
    client = openai.OpenAI(base_url=edge.url + "/v1", api_key=api_key, max_retries=0)
    answer = client.chat.completions.create(
        model=MODEL, messages=question("weather"), tools=[WEATHER], tool_choice="required"
    )
    assert answer.choices[0].finish_reason == "tool_calls"
    (call,) = answer.choices[0].message.tool_calls or []
    assert call.type == "function" and call.function.name == "get_weather"
    messages = anthropic.Anthropic(base_url=edge.url, api_key=api_key, max_retries=0)
    with messages.messages.stream(
        model=MODEL, max_tokens=32, messages=question("edge messages")
    ) as stream:
        text = "".join(stream.text_stream)
    assert text.startswith("Echo: edge messages")
    assert gemini_calls(edge) == 2
