"""The semantic model in a process of its own (origin.store.semantic.embed_process): the
same vectors as in the origin's own process, and a child that dies is replaced without
losing the batch it had."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import httpx
import pytest
import redis

from origin.store.semantic.embedder import Embedder
from tests.fixtures.origin import OriginFactory
from tests.fixtures.semantic import CHAT, LAYER, QUESTION, ask, opt_in
from tests.polling import wait_for

np = pytest.importorskip("numpy", reason="the semantic extra is not installed")


async def test_the_child_gives_the_threads_vectors_and_survives_being_killed() -> None:
    remote, local = Embedder(None, in_process=False), Embedder(None, in_process=True)
    try:
        text = "what is the capital of france"
        far, near = await remote.embed(text), await local.embed(text)
        assert far is not None and near is not None
        assert float(np.dot(far, near)) == pytest.approx(1.0, abs=1e-5)
        assert remote.engine == local.engine and remote.space == local.space
        assert await remote.embed("word " * 400) is None  # too long: never compared, as here
        child = remote._process._child  # type: ignore[union-attr]
        assert child is not None and child.pid != os.getpid()
        os.kill(child.pid, signal.SIGKILL)
        await asyncio.to_thread(child.wait)
        again = await remote.embed(text)  # sent again to a new child, not failed
        assert again is not None and float(np.dot(again, near)) == pytest.approx(1.0, abs=1e-5)
        assert remote._process._child is not child  # type: ignore[union-attr]
        assert remote.failed is None
    finally:
        remote.close()
        local.close()


async def test_a_model_the_child_cannot_load_fails_every_embedding_at_once(tmp_path: Path) -> None:
    from origin.store.semantic.embedder import EmbedderUnavailable

    broken = Embedder(tmp_path, in_process=False)  # a directory with no model in it
    try:
        with pytest.raises(EmbedderUnavailable):
            await broken.embed("anything")
        assert broken.failed is not None and "unavailable" in broken.failed
        with pytest.raises(EmbedderUnavailable):
            await broken.embed("anything else")
    finally:
        broken.close()


def test_an_origin_answers_a_paraphrase_with_the_model_in_its_own_process(
    origin_factory: OriginFactory, admin: redis.Redis, api_key: str
) -> None:
    origin = origin_factory(PRISM_SEMANTIC_PROCESS="on")
    opt_in(admin)
    with httpx.Client(
        base_url=origin.url, headers={"authorization": f"Bearer {api_key}"}, timeout=30
    ) as client:
        assert client.post(CHAT, json=ask(QUESTION)).headers[LAYER] == "miss"
        # The first question starts the model's process: its load takes seconds.
        wait_for(lambda: origin.gateway.background_tasks == 0, timeout=60, interval=0.02)
        answered = client.post(CHAT, json=ask("what is the capital of france"))
    assert answered.status_code == 200 and answered.headers[LAYER] == "semantic"
    embedder = origin.gateway.semantic.embedder  # type: ignore[union-attr]
    assert embedder._model is None and embedder._process is not None  # not in this process
