"""Model names are exact (``prism.request.model_name``), on every API, and policy patterns
match them whatever their case."""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prism import InvalidRequestError, Policy, error_body
from prism.embeddings_request import parse_embeddings_request
from prism.messages_request import parse_messages_request
from prism.request import MAX_MODEL_CHARS, model_name, parse_chat_request

# Default_Ignorable_Code_Point outside Cc/Cf/Cn (Unicode's DerivedCoreProperties.txt).
_IGNORABLE = {0x034F, 0x115F, 0x1160, 0x17B4, 0x17B5, 0x180F, 0x3164, 0xFFA0}
_IGNORABLE |= {*range(0x180B, 0x180E), *range(0xFE00, 0xFE10), *range(0xE0100, 0xE01F0)}
_REFUSED_CATEGORIES = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}


def exact(value: str) -> bool:
    """The rule, written out from the Unicode database rather than ``str`` methods."""
    if not 0 < len(value) <= MAX_MODEL_CHARS or value[0] == " " or value[-1] == " ":
        return False
    for char in value:
        category = unicodedata.category(char)
        if category in _REFUSED_CATEGORIES or ord(char) in _IGNORABLE:
            return False
        if category == "Zs" and char != " ":
            return False
    return True


@pytest.mark.parametrize(
    "name",
    [
        "gpt-4o",
        "gpt-4o-mini-2024-07-18",
        "claude-sonnet-4-20250514",
        "anthropic.claude-3-5-sonnet-20240620-v1:0",
        "models/gemini-1.5-pro",
        "accounts/fireworks/models/llama-v3p1-8b-instruct",
        "Qwen/Qwen2.5-7B-Instruct",
        "ft:gpt-4o-mini:acme::abc123",
        "my deployment",  # an inner space is a visible character
        "modèle-été",
        "模型-1",
        "x" * MAX_MODEL_CHARS,
    ],
)
def test_exact_names_pass_unchanged(name: str) -> None:
    assert model_name(name) is name


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("gpt-4o ", "a space at its start or end"),
        (" gpt-4o", "a space at its start or end"),
        ("gpt-4o\t", "U+0009"),
        ("gpt-4o\n", "U+000A"),
        ("gpt\x004o", "U+0000"),
        ("gpt-4o\x7f", "U+007F"),
        ("gpt-4o\u200b", "U+200B (ZERO WIDTH SPACE) at position 6"),
        ("\ufeffgpt-4o", "U+FEFF (ZERO WIDTH NO-BREAK SPACE) at position 0"),
        ("gpt\u20604o", "U+2060 (WORD JOINER)"),
        ("gpt\u202e4o", "U+202E (RIGHT-TO-LEFT OVERRIDE)"),
        ("gpt-4o\u00a0", "U+00A0 (NO-BREAK SPACE)"),
        ("gpt-4o\u3000", "U+3000 (IDEOGRAPHIC SPACE)"),
        ("gpt\u20284o", "U+2028 (LINE SEPARATOR)"),
        ("gpt\u034f-4o", "U+034F (COMBINING GRAPHEME JOINER)"),
        ("gpt-4o\ufe0f", "U+FE0F (VARIATION SELECTOR-16)"),
        ("gpt-4o\u3164", "U+3164 (HANGUL FILLER)"),
        ("gpt-4o\ue000", "U+E000"),  # private use
    ],
)
def test_inexact_names_are_a_400_naming_the_model_and_the_character(value: str, named: str) -> None:
    with pytest.raises(InvalidRequestError) as raised:
        model_name(value)
    error = raised.value
    assert (error.status, error.param, error.code) == (400, "model", "invalid_model_name")
    assert named in error.message
    assert error_body(error)["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("value", [None, 5, "", "x" * (MAX_MODEL_CHARS + 1), ["gpt-4o"]])
def test_a_missing_empty_or_overlong_model_is_a_400_naming_the_model(value: Any) -> None:
    with pytest.raises(InvalidRequestError) as raised:
        model_name(value)
    assert raised.value.param == "model" and raised.value.status == 400


@settings(max_examples=2000)
@given(st.text(max_size=12) | st.text(st.characters(max_codepoint=0x7F), max_size=12))
def test_the_rule_is_exactly_the_unicode_one(value: str) -> None:
    if exact(value):
        assert model_name(value) is value
    else:
        with pytest.raises(InvalidRequestError):
            model_name(value)


_REFUSED = st.characters(
    categories=["Cc", "Cf", "Co", "Zl", "Zp", "Zs"], exclude_characters=" "
) | st.sampled_from([chr(c) for c in sorted(_IGNORABLE)][:40])


@settings(max_examples=500)
@given(
    st.sampled_from(["gpt-4o", "claude-sonnet-4", "demo"]),
    _REFUSED,
    st.integers(min_value=0, max_value=20),
)
def test_a_refused_character_anywhere_in_a_good_name_is_refused(
    name: str, char: str, where: int
) -> None:
    where = min(where, len(name))
    with pytest.raises(InvalidRequestError) as raised:
        model_name(name[:where] + char + name[where:])
    assert f"U+{ord(char):04X}" in raised.value.message


PARSERS: dict[str, tuple[Callable[[str], Any], dict[str, Any]]] = {
    "chat": (parse_chat_request, {"messages": [{"role": "user", "content": "hi"}]}),
    "embeddings": (parse_embeddings_request, {"input": "hi"}),
    "messages": (
        parse_messages_request,
        {"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
    ),
}


@pytest.mark.parametrize("api", sorted(PARSERS))
@pytest.mark.parametrize("model", ["gpt-4o ", "gpt-4o\u200b", "\ufeffgpt-4o", "gpt-4o\x00"])
def test_every_api_parser_refuses_an_inexact_model(api: str, model: str) -> None:
    parse, rest = PARSERS[api]
    assert parse(json.dumps({"model": "gpt-4o", **rest})).model == "gpt-4o"
    with pytest.raises(InvalidRequestError) as raised:
        parse(json.dumps({"model": model, **rest}))
    assert raised.value.param == "model" and raised.value.code == "invalid_model_name"


def test_patterns_match_whatever_the_case() -> None:
    policy = Policy(allow=("gpt-4o*", "claude-*"), deny=("gpt-4o",))
    for denied in ["gpt-4o", "GPT-4O", "Gpt-4o"]:
        assert not policy.allows(denied)
    for allowed in ["gpt-4o-mini", "GPT-4O-MINI", "Claude-Sonnet-4"]:
        assert policy.allows(allowed)
    assert not policy.allows("o1-mini")
    assert not Policy(deny=("o[13]*",)).allows("O3-MINI")
