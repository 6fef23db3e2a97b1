import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from prism import canonical_document, fingerprint, parse_chat_request

PATH = "/v1/chat/completions"

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=False, allow_infinity=False, width=64),
    st.text(max_size=20),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "user", "assistant"]), "content": st.text(max_size=40)}
    ),
    min_size=1,
    max_size=4,
)
bodies = st.fixed_dictionaries(
    {
        "model": st.sampled_from(["gpt-4o-mini", "claude-3-5-haiku", "llama-3.1-8b"]),
        "messages": messages,
    },
    optional={
        "temperature": st.floats(0, 2),
        "top_p": st.floats(0, 1),
        "max_tokens": st.integers(1, 4096),
        "seed": st.integers(0, 2**31),
        "stop": st.lists(st.text(max_size=5), max_size=4),
        "tool_choice": st.sampled_from(["auto", "none", "required"]),
        "x_vendor_field": json_values,
    },
)


def fp(body: Any, project: str = "acme", raw: str | None = None) -> str:
    text = raw if raw is not None else json.dumps(body)
    return fingerprint(project, PATH, parse_chat_request(text))


def _shuffled(value: Any, rnd: Any) -> Any:
    if isinstance(value, dict):
        items = list(value.items())
        rnd.shuffle(items)
        return {k: _shuffled(v, rnd) for k, v in items}
    if isinstance(value, list):
        return [_shuffled(v, rnd) for v in value]
    return value


@settings(max_examples=200)
@given(body=bodies, rnd=st.randoms(use_true_random=False))
def test_key_order_whitespace_and_escaping_do_not_change_fingerprint(body: Any, rnd: Any) -> None:
    reference = fp(body)
    assert fp(None, raw=json.dumps(_shuffled(body, rnd))) == reference
    assert fp(None, raw=json.dumps(body, indent=3, separators=(" ,  ", " :\n"))) == reference
    assert fp(None, raw=json.dumps(body, ensure_ascii=True)) == reference
    assert fp(None, raw=json.dumps(body, ensure_ascii=False)) == reference


@given(body=bodies, stream=st.booleans(), user=st.text(max_size=10))
def test_stream_user_and_metadata_do_not_change_fingerprint(
    body: Any, stream: bool, user: str
) -> None:
    extra = {
        **body,
        "stream": stream,
        "user": user,
        "metadata": {"trace": user},
        "stream_options": {"include_usage": True},
    }
    assert fp(extra) == fp(body)


@given(
    body=bodies, a=st.sampled_from(["acme", "globex"]), b=st.sampled_from(["initech", "umbrella"])
)
def test_projects_never_share_a_fingerprint(body: Any, a: str, b: str) -> None:
    assert fp(body, a) != fp(body, b)


def test_number_spellings_agree() -> None:
    spellings = {
        "0": ["0", "0.0", "0e0", "-0", "0.000", "0E+5"],
        "1": ["1", "1.0", "1e0", "10e-1", "1.00"],
    }
    for variants in spellings.values():
        prints = {
            fp(
                None,
                raw='{"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":'
                + v
                + "}",
            )
            for v in variants
        }
        assert len(prints) == 1, variants
    assert fp(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0}
    ) != fp({"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 1})


OUTPUT_CHANGES = [
    ("model", "gpt-4o"),
    ("messages", [{"role": "user", "content": "something else"}]),
    ("temperature", 0.5),
    ("top_p", 0.5),
    ("max_tokens", 7),
    ("max_completion_tokens", 7),
    ("stop", ["\n"]),
    ("seed", 42),
    ("tools", [{"type": "function", "function": {"name": "f", "parameters": {}}}]),
    ("tool_choice", "none"),
    ("response_format", {"type": "json_object"}),
    ("n", 2),
    ("presence_penalty", 1),
    ("frequency_penalty", 1),
    ("logit_bias", {"50256": -100}),
    ("reasoning_effort", "high"),
    ("some_future_parameter", True),
]


@given(body=bodies)
def test_every_output_affecting_field_changes_fingerprint(body: Any) -> None:
    reference = fp(body)
    for field, value in OUTPUT_CHANGES:
        if body.get(field) == value:
            continue
        assert fp({**body, field: value}) != reference, field


def test_path_changes_fingerprint() -> None:
    request = parse_chat_request(b'{"model":"m","messages":[{"role":"user","content":"x"}]}')
    assert fingerprint("p", "/v1/chat/completions", request) != fingerprint(
        "p", "/v1/other", request
    )


def test_canonical_document_explains_what_went_in() -> None:
    request = parse_chat_request(
        b'{"model":"m","messages":[{"role":"user","content":"x"}],"stream":true,"user":"u","temperature":1.0}'
    )
    doc = canonical_document("acme", PATH, request)
    assert doc["project"] == "acme"
    assert doc["request"] == {
        "model": "m",
        "messages": [{"role": "user", "content": "x"}],
        "temperature": 1,
    }
