"""Odd text at the semantic layer: it never crashes the normalizer, the guard or the
embedder, and never matches a question it only looks like to the model."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from origin.store.semantic.guard import agree, words
from origin.store.semantic.partition import normalized, question
from prism import parse_chat_request
from prism.routes import CHAT_PATH

np = pytest.importorskip("numpy", reason="the semantic extra is not installed")

ETHIOPIC = "\u1200 \u1208 \u1210"  # a script the vocabulary lacks
ODD = [
    "",
    "   \t\n ",
    "\u200b\u200c\u200d",  # zero-width characters only
    "\u202ehello\u202c",  # right-to-left override around a word
    "what is a\u0000b",  # NUL (valid in a JSON string)
    "e\u0301te\u0301",  # combining accents
    "😀",
    "😀😀😀",
    "🍕 or 🍔?",
    ETHIOPIC,
    "?!?",
    "x" * 5000,
    "word " * 400,
]
# Pairs the model cannot tell apart (it sees the same tokens) but that ask different things.
LOOKALIKES = [
    ("what does 😀 mean", "what does 😢 mean"),
    ("what is 2+2", "what is 2*2"),
    ("price in $", "price in €"),
    ("\u1200 means what", "\u1208 means what"),
]


def asked(text: str) -> object:
    body = {"model": "m", "messages": [{"role": "user", "content": text}]}
    return question("acme", CHAT_PATH, parse_chat_request(json.dumps(body).encode()))


@pytest.mark.parametrize("text", ["", "   ", "\u200b", "😀😀", "?!?", "...", "\u0000"])
def test_a_text_without_a_word_is_no_question(text: str) -> None:
    assert asked(text) is None


@pytest.mark.parametrize(("a", "b"), LOOKALIKES)
def test_texts_alike_only_to_the_model_do_not_agree(a: str, b: str) -> None:
    if "\u1200" not in a:  # those two the embedder refuses instead (unknown characters)
        assert not agree(a, b) and not agree(b, a)


text_strategy = st.text(
    alphabet=st.characters(blacklist_categories=["Cs"]),  # JSON has no lone surrogates
    max_size=200,
)


@settings(max_examples=300, deadline=None)
@given(text_strategy)
def test_normalizing_never_fails_and_is_stable(text: str) -> None:
    once = normalized(text)
    assert normalized(once) == once
    assert once == once.strip()


@settings(max_examples=300, deadline=None)
@given(text_strategy, text_strategy)
@example("\u00b9'Aa", "")  # a name the words split otherwise: it disagreed with itself
def test_the_guard_never_fails_and_a_text_agrees_with_itself(a: str, b: str) -> None:
    assert agree(a, a)
    assert agree(a, b) in (True, False)
    words(a)


@settings(max_examples=200, deadline=None)
@given(
    text_strategy,
    st.lists(st.sampled_from("+*/=<>%^&|~$€£@😀😢🍕🔥"), min_size=2, max_size=2, unique=True),
)
def test_another_symbol_is_never_the_same_question(text: str, symbols: list[str]) -> None:
    first, second = symbols
    assert not agree(f"{text} {first}", f"{text} {second}")


@settings(max_examples=200, deadline=None)
@given(text_strategy)
def test_a_qualifying_question_has_a_word(text: str) -> None:
    if asked(text) is not None:
        assert words(text)


async def test_odd_text_never_breaks_the_embedder_and_unseen_characters_are_refused() -> None:
    from origin.store.semantic.embedder import Embedder

    embedder = Embedder(None)
    try:
        vectors = await asyncio.gather(*[embedder.embed(normalized(t)) for t in ODD])
        assert embedder.failed is None
        by_text = dict(zip(ODD, vectors, strict=True))
        for text in ("😀", "🍕 or 🍔?", ETHIOPIC, "word " * 400):
            assert by_text[text] is None, text  # never compared
        for vector in by_text.values():
            if vector is not None:
                assert np.isfinite(vector).all() and abs(float(np.linalg.norm(vector)) - 1) < 1e-4
        # Characters the model's own normalizer drops (zero-width) change nothing.
        cap = await embedder.embed("cap\u200bital of france")
        plain = await embedder.embed("capital of france")
        assert cap is not None and plain is not None and float(cap @ plain) > 0.999
    finally:
        embedder.close()
