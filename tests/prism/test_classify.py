import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prism import MIN_TTL, CachePolicy, ChatRequest, classify, parse_chat_request


def request(**fields: Any) -> ChatRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], **fields}
    return parse_chat_request(json.dumps(body).encode())


def test_stream_and_sampling_are_cacheable_by_default() -> None:
    decision = classify(request(stream=True, temperature=0.9, n=3))
    assert decision.read and decision.write and decision.ttl == CachePolicy().default_ttl


def test_cache_control_directives() -> None:
    assert not classify(request(), "no-cache").read
    assert classify(request(), "no-cache").write
    assert not classify(request(), "no-store").write
    assert classify(request(), "no-store").read
    assert classify(request(), "no-cache, no-store").bypass
    assert classify(request(), "max-age=3600").ttl == 3600
    assert classify(request(), "max-age=5").ttl == MIN_TTL
    assert classify(request(), 'Max-Age="120"').ttl == 120
    assert classify(request(), "max-age=99999999999").ttl == CachePolicy().max_ttl
    assert classify(request(), "max-age=banana").ttl == CachePolicy().default_ttl


def test_project_can_refuse_sampled_answers() -> None:
    strict = CachePolicy(cache_sampled=False)
    assert classify(request(temperature=0.7), policy=strict).bypass
    assert not classify(request(temperature=0), policy=strict).bypass
    assert not classify(request(temperature=0.7, seed=1), policy=strict).bypass
    assert classify(request(), policy=CachePolicy(enabled=False)).bypass


ODD_DIGITS = "\u00b9\u00b2\u0661\u06f1\uff11\u0967\U0001d7cf"
# Digits of any script, or any text at all.
MAX_AGE_TEXT = st.text(st.sampled_from("0123456789" + ODD_DIGITS), max_size=6) | st.text(max_size=8)


@pytest.mark.parametrize(
    "value", ["\u00b9\u00b2\u00b3", "\u0661\u0662\u0660", "\uff11\uff12\uff10"]
)
def test_max_age_takes_ascii_digits_only(value: str) -> None:
    assert classify(request(), f"max-age={value}").ttl == CachePolicy().default_ttl


def test_a_max_age_of_thousands_of_digits_is_the_longest_ttl() -> None:
    assert classify(request(), "max-age=" + "9" * 5000).ttl == CachePolicy().max_ttl


@given(
    st.one_of(
        MAX_AGE_TEXT.map(lambda value: f"max-age={value}"),
        st.text(max_size=80),
        st.binary(max_size=40).map(lambda raw: raw.decode("latin-1")),
    )
)
def test_any_cache_control_is_a_decision_never_an_error(cache_control: str) -> None:
    decision = classify(request(), cache_control)
    assert MIN_TTL <= decision.ttl <= CachePolicy().max_ttl


# Header bytes: digits of any script in UTF-8, mixed with any other bytes.
HEADER_BYTES = st.lists(
    st.sampled_from([c.encode() for c in "0123456789" + ODD_DIGITS]) | st.binary(max_size=3),
    max_size=6,
).map(b"".join)


@given(HEADER_BYTES, st.sampled_from(["max-age=", "no-cache, max-age=", ""]))
def test_the_edge_and_the_origin_agree_on_any_cache_control_bytes(raw: bytes, head: str) -> None:
    """The origin reads header bytes as latin-1; a runtime may hand the edge UTF-8 text."""
    value = head.encode() + raw
    as_origin = classify(request(), value.decode("latin-1"))
    as_edge = classify(request(), value.decode("utf-8", "replace"))
    assert (as_origin.read, as_origin.write, as_origin.ttl) == (
        as_edge.read,
        as_edge.write,
        as_edge.ttl,
    )
