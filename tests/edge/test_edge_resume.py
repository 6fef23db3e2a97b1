"""Through the edge in the real local Workers runtime: a chat, Messages or Responses stream
the first provider cuts mid-answer is finished by the route's next target at the origin, and
the PoP relays it as one answer (chat's ending in [DONE], Messages' in one message_stop,
Responses' in one response.completed; its own edge and origin, routing ``demo`` to the
stand-in's OpenAI API, then to it as Anthropic's kind)."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest

from deploy.local.provider import ProviderServer
from deploy.local.redis import RedisServer
from prism import KeyRing
from tests.fixtures.edge import EdgeStack, edge_with_providers
from tests.fixtures.workers import WorkersRuntimeFactory
from tests.origin.routing.test_resume import content, events, providers_file, question

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def resume_edge(
    tmp_path_factory: pytest.TempPathFactory,
    workers_runtime_factory: WorkersRuntimeFactory,
    edge_redis: RedisServer,
    provider_server: ProviderServer,
    key_ring: KeyRing,
) -> Iterator[EdgeStack]:
    folder = tmp_path_factory.mktemp("resume-edge")
    config = folder / "providers.toml"
    config.write_text(providers_file(provider_server.url))
    with edge_with_providers(
        folder, workers_runtime_factory, edge_redis, provider_server, key_ring, config
    ) as stack:
        yield stack


def test_a_stream_cut_mid_answer_reaches_the_client_through_the_edge_whole(
    resume_edge: EdgeStack, api_key: str
) -> None:
    headers = {"authorization": f"Bearer {api_key}"}
    messages = question()

    def ask(model: str, stream: bool) -> httpx.Response:
        body = {"model": model, "messages": messages, "stream": stream}
        return httpx.post(
            resume_edge.url + "/v1/chat/completions", json=body, headers=headers, timeout=60
        )

    resume_edge.provider.control.set_fault("truncated_stream", after_chunks=3, abort=1)
    answer = ask("demo", stream=True)
    assert answer.status_code == 200
    *chunks, done = events(answer.text)
    assert done == "[DONE]"
    assert chunks[-1]["prism"]["resumed"] is True
    whole = ask("whole", stream=False).json()["choices"][0]["message"]["content"]
    assert content(chunks) == whole  # no word lost or repeated at the splice


def test_a_messages_stream_cut_mid_answer_reaches_the_sdk_through_the_edge_whole(
    resume_edge: EdgeStack, api_key: str
) -> None:
    client = anthropic.Anthropic(base_url=resume_edge.url, api_key=api_key, max_retries=0)
    messages = [{"role": "user", "content": question()[0]["content"]}]
    resume_edge.provider.control.set_fault("truncated_stream", after_chunks=3, abort=1)
    with client.messages.stream(model="demo", max_tokens=256, messages=messages) as stream:  # type: ignore[arg-type]
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    whole = client.messages.create(model="whole", max_tokens=256, messages=messages)  # type: ignore[arg-type]
    block = whole.content[0]
    assert isinstance(block, anthropic.types.TextBlock)
    assert text == block.text  # no word lost or repeated at the splice
    assert len(final.content) == 1 and final.stop_reason == "end_turn"


def test_a_responses_stream_cut_mid_answer_reaches_the_sdk_through_the_edge_whole(
    resume_edge: EdgeStack, api_key: str
) -> None:
    client = openai.OpenAI(base_url=resume_edge.url + "/v1", api_key=api_key, max_retries=0)
    text = question()[0]["content"]
    resume_edge.provider.control.set_fault("truncated_stream", after_chunks=3, abort=1)
    with client.responses.stream(model="demo", input=text) as stream:
        streamed = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()
    whole = client.responses.create(model="whole", input=text).output_text
    assert streamed == final.output_text == whole  # no word lost or repeated at the splice
