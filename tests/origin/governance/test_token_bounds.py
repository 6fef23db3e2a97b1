"""Token bounds: never below what a byte-level tokenizer could count, settled later."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from origin.governance.token_bounds import (
    DEFAULT_OUTPUT_CAP,
    IMAGE_TOKENS,
    completion_token_bound,
    embeddings_token_bound,
    messages_completion_bound,
    messages_prompt_bound,
    no_completion,
    prompt_token_bound,
)
from prism.embeddings_request import parse_embeddings_request
from prism.messages_request import parse_messages_request
from prism.request import parse_chat_request


def test_completion_bound_uses_the_callers_limit_times_n() -> None:
    request = parse_chat_request(
        b'{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":50,"n":3}'
    )
    assert completion_token_bound(request) == 150
    request = parse_chat_request(
        b'{"model":"m","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":7}'
    )
    assert completion_token_bound(request) == 7


def test_completion_bound_falls_back_to_the_cap() -> None:
    request = parse_chat_request(b'{"model":"m","messages":[{"role":"user","content":"hi"}]}')
    assert completion_token_bound(request) == DEFAULT_OUTPUT_CAP
    assert completion_token_bound(request, cap=100) == 100


def test_images_get_their_allowance() -> None:
    body = (
        b'{"model":"m","messages":[{"role":"user","content":[{"type":"image_url",'
        b'"image_url":{"url":"https://x/y.png"}}]}]}'
    )
    assert prompt_token_bound(parse_chat_request(body)) >= IMAGE_TOKENS


@given(st.lists(st.text(max_size=200), max_size=5))
def test_prompt_bound_is_at_least_the_texts_utf8_bytes(texts: list[str]) -> None:
    import json

    messages = [{"role": "user", "content": text} for text in texts]
    raw = json.dumps({"model": "m", "messages": messages}).encode()
    try:
        request = parse_chat_request(raw)
    except Exception:
        return  # lone surrogates are refused before any bound is needed
    bound = prompt_token_bound(request)
    assert bound >= sum(len(t.encode("utf-8")) for t in texts)


@given(st.lists(st.text(min_size=1, max_size=200), min_size=1, max_size=5))
def test_embeddings_bound_is_at_least_the_inputs_utf8_bytes(texts: list[str]) -> None:
    import json

    try:
        request = parse_embeddings_request(json.dumps({"model": "m", "input": texts}))
    except Exception:
        return  # lone surrogates are refused before any bound is needed
    assert embeddings_token_bound(request) >= sum(len(t.encode("utf-8")) for t in texts)


def test_embeddings_token_arrays_count_their_ids() -> None:
    one = parse_embeddings_request(b'{"model":"m","input":[1,2,3]}')
    assert embeddings_token_bound(one) == 3
    batch = parse_embeddings_request(b'{"model":"m","input":[[1,2],[3,4,5]]}')
    assert embeddings_token_bound(batch) == 5
    assert no_completion(batch) == 0


def test_messages_bounds_count_system_tools_and_max_tokens() -> None:
    body = {
        "model": "m",
        "max_tokens": 321,
        "system": "s" * 400,
        "tools": [{"name": "t", "description": "d" * 300, "input_schema": {}}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "é" * 100}]}],
    }
    import json

    request = parse_messages_request(json.dumps(body))
    assert messages_prompt_bound(request) >= 400 + 300 + 200
    assert messages_completion_bound(request) == 321
    image = {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}
    body["messages"] = [{"role": "user", "content": [image]}]
    assert messages_prompt_bound(parse_messages_request(json.dumps(body))) >= IMAGE_TOKENS
