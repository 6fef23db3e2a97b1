"""Token bounds: never below what a byte-level tokenizer could count, settled later."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from origin.tokens import (
    DEFAULT_OUTPUT_CAP,
    IMAGE_TOKENS,
    completion_token_bound,
    prompt_token_bound,
)
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
