"""The semantic cache behind the edge, in the real local Workers runtime: a paraphrase is
answered by the origin's semantic layer through the PoP with its headers, and the PoP
never stores that answer in Workers KV under the paraphrase's own fingerprint."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import httpx
import pytest
from typer.testing import CliRunner

from deploy.cli import app
from prism import entry_key, fingerprint, parse_chat_request
from prism.routes import CHAT_PATH
from tests.fixtures.edge import EdgeStack

pytest.importorskip("numpy", reason="the semantic extra is not installed")

PROJECT = "edge-semantic"  # its own project: the stack is shared with the other edge tests


@pytest.fixture
def project_key(edge: EdgeStack) -> Iterator[str]:
    env = edge.cli_env()
    runner = CliRunner()
    done = runner.invoke(app, ["policy", "set", "--project", PROJECT, "--semantic"], env=env)
    assert done.exit_code == 0, done.output
    yield edge.key_ring.mint(PROJECT)
    cleared = runner.invoke(app, ["policy", "clear", "--project", PROJECT], env=env)
    assert cleared.exit_code == 0, cleared.output


def test_a_paraphrase_is_answered_semantically_through_the_edge_and_never_stored_at_the_pop(
    edge: EdgeStack, project_key: str
) -> None:
    # Words of its own, so no other run's entry can match: one partition per test run.
    topic = secrets.token_hex(3)
    system = {"role": "system", "content": f"Session {topic}."}

    def ask(text: str) -> dict[str, object]:
        return {"model": "demo", "messages": [system, {"role": "user", "content": text}]}

    headers = {"authorization": f"Bearer {project_key}"}
    with httpx.Client(base_url=edge.url, headers=headers, timeout=30) as client:
        stored = client.post("/v1/chat/completions", json=ask("What's the capital of France?"))
        assert stored.status_code == 200 and stored.headers["x-prism-edge-cache-layer"] == "miss"
        edge.origin.wait_stored()
        paraphrase = ask("what is the capital of france")
        for _ in range(2):  # the second time too: the PoP did not keep the answer as its own
            answered = client.post("/v1/chat/completions", json=paraphrase)
            assert answered.status_code == 200
            assert answered.headers["x-prism-edge-cache-layer"] == "semantic"
            assert answered.headers["x-prism-cache-key"] == stored.headers["x-prism-cache-key"]
            assert float(answered.headers["x-prism-semantic-score"]) >= 0.94
            assert answered.content == stored.content
    own = fingerprint(
        PROJECT, CHAT_PATH, parse_chat_request(httpx.Request("POST", "/", json=paraphrase).content)
    )
    assert edge.kv.get(entry_key(own)) is None
