import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prism import (
    InvalidRequestError,
    Limits,
    PrismError,
    RequestTooLargeError,
    error_body,
    parse_chat_request,
)

GOOD: dict[str, Any] = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}


def with_(**fields: Any) -> bytes:
    return json.dumps({**GOOD, **fields}).encode()


def test_a_good_body_parses() -> None:
    request = parse_chat_request(with_(stream=True, stream_options={"include_usage": True}, n=2))
    assert request.model == "gpt-4o-mini"
    assert request.stream and request.include_usage and request.n == 2


@pytest.mark.parametrize(
    ("raw", "param", "status"),
    [
        (b"not json", None, 400),
        (b"", None, 400),
        (b"\xff\xfe\x00", None, 400),
        (b"[1,2]", None, 400),
        (b'{"model":"m","messages":[{"role":"user","content":"x"}],"temperature":NaN}', None, 400),
        (
            b'{"model":"m","messages":[{"role":"user","content":"x"}],"temperature":1e999}',
            None,
            400,
        ),
        (json.dumps({"messages": GOOD["messages"]}).encode(), "model", 400),
        (json.dumps({"model": 5, "messages": GOOD["messages"]}).encode(), "model", 400),
        (json.dumps({"model": "m"}).encode(), "messages", 400),
        (json.dumps({"model": "m", "messages": []}).encode(), "messages", 400),
        (json.dumps({"model": "m", "messages": "hi"}).encode(), "messages", 400),
        (json.dumps({"model": "m", "messages": [5]}).encode(), "messages[0]", 400),
        (
            json.dumps({"model": "m", "messages": [{"role": "boss"}]}).encode(),
            "messages[0].role",
            400,
        ),
        (with_(messages=[{"role": "user", "content": 7}]), "messages[0].content", 400),
        (with_(temperature="hot"), "temperature", 400),
        (with_(temperature=3), "temperature", 400),
        (with_(temperature=True), "temperature", 400),
        (with_(top_p=2), "top_p", 400),
        (with_(n=0), "n", 400),
        (with_(n=1.5), "n", 400),
        (with_(max_tokens=-1), "max_tokens", 400),
        (with_(stream="yes"), "stream", 400),
        (with_(stop=[1, 2]), "stop", 400),
        (with_(stop=["a", "b", "c", "d", "e"]), "stop", 400),
        (with_(tools={"a": 1}), "tools", 400),
        (with_(stream_options=[]), "stream_options", 400),
        (
            b'{"model":"m","messages":[{"role":"user","content":"x"}],"seed":' + b"9" * 5000 + b"}",
            None,
            400,
        ),
    ],
)
def test_bad_bodies_give_the_right_error(raw: bytes, param: str | None, status: int) -> None:
    with pytest.raises(PrismError) as caught:
        parse_chat_request(raw)
    assert caught.value.status == status
    assert caught.value.param == param
    body = error_body(caught.value)["error"]
    assert set(body) == {"message", "type", "param", "code"} and body["message"]


def test_oversized_body_is_413() -> None:
    with pytest.raises(RequestTooLargeError) as caught:
        parse_chat_request(b" " * 101, Limits(max_body_bytes=100))
    assert caught.value.status == 413


def test_too_many_messages_is_413() -> None:
    with pytest.raises(RequestTooLargeError):
        parse_chat_request(
            with_(messages=[{"role": "user", "content": "x"}] * 11), Limits(max_messages=10)
        )


def test_huge_string_is_413() -> None:
    with pytest.raises(RequestTooLargeError):
        parse_chat_request(
            with_(messages=[{"role": "user", "content": "x" * 101}]), Limits(max_string_chars=100)
        )


@pytest.mark.parametrize("depth", [33, 1000, 100_000])
def test_deep_nesting_is_rejected_not_crashed(depth: int) -> None:
    nested = "[" * depth + "]" * depth
    raw = b'{"model":"m","messages":[{"role":"user","content":"x"}],"x":' + nested.encode() + b"}"
    with pytest.raises(InvalidRequestError) as caught:
        parse_chat_request(raw)
    assert caught.value.code == "too_deep"


@settings(max_examples=300)
@given(raw=st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_arbitrary_bytes_only_ever_raise_prism_errors(raw: bytes) -> None:
    try:
        parse_chat_request(raw)
    except PrismError as error:
        assert error.status in (400, 413)


@settings(max_examples=300)
@given(
    body=st.dictionaries(
        st.sampled_from(["model", "messages", "temperature", "n", "stop", "stream", "tools", "x"]),
        st.recursive(
            st.none()
            | st.booleans()
            | st.integers()
            | st.floats(allow_nan=False)
            | st.text(max_size=5),
            lambda inner: (
                st.lists(inner, max_size=3)
                | st.dictionaries(st.text(max_size=5), inner, max_size=3)
            ),
            max_leaves=8,
        ),
    )
)
def test_arbitrary_json_only_ever_raises_prism_errors(body: dict[str, Any]) -> None:
    try:
        parse_chat_request(json.dumps(body).encode())
    except PrismError as error:
        assert error.status in (400, 413)


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        (with_(seed=2**63), "seed"),
        (with_(seed=-(2**63) - 1), "seed"),
        (with_(max_tokens=2**64 + 1), "max_tokens"),
        (with_(extra={"deep": [1, 2, 10**30]}), "extra.deep[2]"),
        (b'{"model":"m","messages":[{"role":"user","content":"\\ud800"}]}', "messages[0].content"),
        (
            b'{"model":"m","messages":[{"role":"user","content":"a\\uDFFFb"}]}',
            "messages[0].content",
        ),
        (b'{"model":"m","messages":[{"role":"user","content":"x"}],"t":{"\\ud800":1}}', "t"),
    ],
)
def test_values_no_provider_can_take_are_refused_by_name(raw: bytes, param: str) -> None:
    # Integers beyond 64 bits and lone surrogates parse as JSON but cannot be re-encoded
    # for a provider: they must be a 400 here, not a failure inside the provider call.
    with pytest.raises(InvalidRequestError) as caught:
        parse_chat_request(raw)
    assert caught.value.param == param and caught.value.code == "invalid_value"
    assert caught.value.status == 400


def test_paired_surrogates_and_64_bit_extremes_are_fine() -> None:
    raw = b'{"model":"m","messages":[{"role":"user","content":"\\ud83d\\ude00"}],"seed":'
    request = parse_chat_request(raw + str(-(2**63)).encode() + b"}")
    assert request.body["messages"][0]["content"] == "\U0001f600"
    assert request.body["seed"] == -(2**63)
