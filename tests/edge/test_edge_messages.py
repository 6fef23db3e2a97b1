"""``POST /v1/messages`` through the edge Worker in the real local Workers runtime, with
the official anthropic SDK: KV hits at the PoP, plain and streamed, Anthropic's errors."""

from __future__ import annotations

import secrets

import anthropic
import httpx
import httpx2
import pytest
from anthropic.types import Message, MessageParam, TextBlock

from tests.fixtures.edge import EdgeStack
from tests.polling import wait_for

PATH = "/v1/messages"
MODEL = "gpt-4o-mini"


def layer(response: httpx2.Response) -> str:
    return response.headers["x-prism-edge-cache-layer"]


def question(text: str) -> list[MessageParam]:
    return [{"role": "user", "content": f"{text} {secrets.token_hex(4)}"}]


def text_of(message: Message) -> str:
    """The text of the message's first block (a ``TextBlock``)."""
    block = message.content[0]
    assert isinstance(block, TextBlock), block
    return block.text


def test_the_sdk_misses_then_hits_kv_plain_and_streamed(edge: EdgeStack, api_key: str) -> None:
    client = anthropic.Anthropic(base_url=edge.url, api_key=api_key, max_retries=0)
    messages = question("edge messages")
    with client.messages.stream(model=MODEL, max_tokens=32, messages=messages) as stream:
        assert layer(stream.response) == "miss"
        text = "".join(stream.text_stream)
    assert text.startswith("Echo: edge messages")

    def from_kv() -> bool:
        plain = client.messages.with_raw_response.create(
            model=MODEL, max_tokens=32, messages=messages
        )
        return layer(plain.http_response) == "kv"

    wait_for(from_kv)  # the origin's KV writer replicated the streamed answer
    before = edge.origin_requests()
    with client.messages.stream(model=MODEL, max_tokens=32, messages=messages) as stream:
        assert layer(stream.response) == "kv"
        assert "".join(stream.text_stream) == text
        final = stream.get_final_message()
    assert final.stop_reason == "end_turn" and final.usage.output_tokens > 0
    bearer = anthropic.Anthropic(base_url=edge.url, auth_token=api_key, max_retries=0)
    hit = bearer.messages.with_raw_response.create(model=MODEL, max_tokens=32, messages=messages)
    assert layer(hit.http_response) == "kv" and text_of(hit.parse()) == text
    assert edge.origin_requests() == before
    assert edge.provider.control.stats()["chat_requests"] == 1


@pytest.mark.parametrize(
    ("headers", "body", "status", "kind"),
    [
        ({}, {"model": MODEL, "max_tokens": 8, "messages": []}, 401, "authentication_error"),
        (
            {"x-api-key": "sk-nope"},
            {"model": MODEL, "max_tokens": 8, "messages": []},
            401,
            "authentication_error",
        ),
        (None, {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}, 400, None),
        (None, {"model": MODEL, "max_tokens": 8, "messages": []}, 400, None),
    ],
)
def test_bad_keys_and_bodies_get_anthropic_errors_at_the_edge(
    edge: EdgeStack,
    api_key: str,
    headers: dict[str, str] | None,
    body: dict[str, object],
    status: int,
    kind: str | None,
) -> None:
    before = edge.origin_requests()
    sent = {"x-api-key": api_key} if headers is None else headers
    response = httpx.post(edge.url + PATH, json=body, headers=sent, timeout=30)
    assert response.status_code == status
    error = response.json()
    assert error["type"] == "error"
    assert error["error"]["type"] == (kind or "invalid_request_error")
    assert edge.origin_requests() == before
