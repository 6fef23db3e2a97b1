import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st

from prism import SSEDecoder, StreamAssembler, replay

TEXT_COMPLETION: dict[str, Any] = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1700000000,
    "model": "gpt-4o-mini",
    "system_fingerprint": "fp_1",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hello, wörld! 🌍"},
            "finish_reason": "stop",
        },
        {
            "index": 1,
            "message": {"role": "assistant", "content": "Second"},
            "finish_reason": "length",
        },
    ],
    "usage": {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9},
}
TOOL_COMPLETION: dict[str, Any] = {
    "id": "chatcmpl-2",
    "object": "chat.completion",
    "created": 1700000001,
    "model": "gpt-4o-mini",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_a",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Pune"}'},
                    },
                    {
                        "id": "call_b",
                        "type": "function",
                        "function": {"name": "get_time", "arguments": "{}"},
                    },
                ],
            },
            "finish_reason": "tool_calls",
        }
    ],
    "usage": {"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14},
}


@pytest.fixture(scope="module")
def replay_server() -> Iterator[str]:
    """A real HTTP server that answers every POST with the replay of the stored completion."""
    stored = {"text": TEXT_COMPLETION, "tool": TOOL_COMPLETION}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            name = body["messages"][0]["content"]
            payload = replay(
                stored[name],
                include_usage=bool((body.get("stream_options") or {}).get("include_usage")),
            )
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


def test_openai_sdk_reassembles_replayed_text(replay_server: str) -> None:
    client = openai.OpenAI(base_url=replay_server, api_key="unused", max_retries=0)
    stream = client.chat.completions.create(
        model="gpt-4o-mini",
        messages=[{"role": "user", "content": "text"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    content: dict[int, str] = {}
    finish: dict[int, str | None] = {}
    roles: dict[int, str | None] = {}
    usage = None
    for chunk in stream:
        assert chunk.id == "chatcmpl-1" and chunk.model == "gpt-4o-mini"
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            content[choice.index] = content.get(choice.index, "") + (choice.delta.content or "")
            roles.setdefault(choice.index, choice.delta.role)
            if choice.finish_reason:
                finish[choice.index] = choice.finish_reason
    assert content == {0: "Hello, wörld! 🌍", 1: "Second"}
    assert roles == {0: "assistant", 1: "assistant"}
    assert finish == {0: "stop", 1: "length"}
    assert usage is not None and usage.total_tokens == 9


def test_openai_sdk_reassembles_replayed_tool_calls(replay_server: str) -> None:
    client = openai.OpenAI(base_url=replay_server, api_key="unused", max_retries=0)
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "tool"}], stream=True
    ):
        assert chunk.usage is None  # not asked for
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for call in choice.delta.tool_calls or ():
                slot = calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
                slot["id"] += call.id or ""
                if call.function:
                    slot["name"] += call.function.name or ""
                    slot["arguments"] += call.function.arguments or ""
    assert finish == "tool_calls"
    assert calls == {
        0: {"id": "call_a", "name": "get_weather", "arguments": '{"city":"Pune"}'},
        1: {"id": "call_b", "name": "get_time", "arguments": "{}"},
    }


def assemble(
    stream: bytes, chunk_size: int, assembler: StreamAssembler | None = None
) -> StreamAssembler:
    decoder, assembler = SSEDecoder(), assembler or StreamAssembler()
    for start in range(0, len(stream), chunk_size):
        for data in decoder.feed(stream[start : start + chunk_size]):
            if data == b"[DONE]":
                assembler.finish()
            else:
                assembler.add(json.loads(data))
    return assembler


@given(chunk_size=st.integers(1, 64))
def test_assembly_inverts_replay_at_any_chunking(chunk_size: int) -> None:
    for completion in (TEXT_COMPLETION, TOOL_COMPLETION):
        assembler = assemble(replay(completion, include_usage=True), chunk_size)
        assert assembler.complete
        rebuilt = assembler.completion()
        assert rebuilt["choices"] == completion["choices"]
        assert rebuilt["usage"] == completion["usage"]
        assert rebuilt["id"] == completion["id"]


def without_done(stream: bytes) -> bytes:
    assert stream.endswith(b"data: [DONE]\n\n")
    return stream.removesuffix(b"data: [DONE]\n\n")


def test_a_stream_that_ends_without_done_is_complete_once_every_choice_finished() -> None:
    # Some providers close the body after the last finish_reason and never send [DONE].
    assembler = assemble(without_done(replay(TEXT_COMPLETION)), 7, StreamAssembler(choices=2))
    assert assembler.complete and not assembler.done
    assert assembler.completion()["choices"] == TEXT_COMPLETION["choices"]


def test_a_stream_without_done_or_finish_is_incomplete() -> None:
    stream = replay(TEXT_COMPLETION)
    cut = stream[: stream.index(b'"finish_reason":"length"')]
    cut = cut[: cut.rindex(b"\n\n") + 2]
    assert not assemble(cut, 7).complete  # choice 1 never finished
    assert not assemble(cut + b"data: [DONE]\n\n", 7).complete  # [DONE] does not finish it


def test_without_done_every_choice_asked_for_must_have_come() -> None:
    only_first = {**TEXT_COMPLETION, "choices": TEXT_COMPLETION["choices"][:1]}
    stream = without_done(replay(only_first))
    assert assemble(stream, 7, StreamAssembler(choices=1)).complete
    assert not assemble(stream, 7, StreamAssembler(choices=2)).complete
    # [DONE] does not make up for a missing choice: a wrong answer is worse than a miss
    assert not assemble(replay(only_first), 7, StreamAssembler(choices=2)).complete


def test_without_done_a_promised_usage_chunk_must_have_come() -> None:
    with_usage = replay(TEXT_COMPLETION, include_usage=True)
    before_usage = with_usage[: with_usage.index(b'"usage":{')]
    before_usage = before_usage[: before_usage.rindex(b"\n\n") + 2]
    asked = StreamAssembler(choices=2, usage=True)
    assert not assemble(before_usage, 7, asked).complete
    # nor for a promised usage chunk that never came
    done_early = before_usage + b"data: [DONE]\n\n"
    assert not assemble(done_early, 7, StreamAssembler(choices=2, usage=True)).complete
    assert assemble(without_done(with_usage), 7, StreamAssembler(choices=2, usage=True)).complete
    # Not asked by the request, but announced by the provider (OpenAI's "usage": null on
    # every chunk when a usage chunk will follow): still awaited.
    announced = before_usage.replace(
        b'"finish_reason":"length"}]', b'"finish_reason":"length"}],"usage":null'
    )
    assert b'"usage":null' in announced
    assert not assemble(announced, 7, StreamAssembler(choices=2)).complete
    # Neither asked nor announced: whole once every choice finished.
    assert assemble(without_done(replay(TEXT_COMPLETION)), 7, StreamAssembler(choices=2)).complete


def test_decoder_handles_crlf_multiline_and_comments() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b": keepalive\r\n\r\nevent: x\r\ndata: a\r\ndata: b\r\n\r\ndata:c\n") == [
        b"a\nb"
    ]
    assert decoder.feed(b"\n") == [b"c"]


def events_of(stream: bytes) -> list[dict[str, Any]]:
    return [json.loads(part[6:]) for part in stream.split(b"\n\n") if part.startswith(b"data: {")]


def test_replay_asked_for_usage_ends_with_the_usage_chunk_even_when_none_was_stored() -> None:
    """An entry stored from a stream whose first client did not ask for usage has none; a
    hit asked for usage still ends the way OpenAI's streams do."""
    stored = {k: v for k, v in TEXT_COMPLETION.items() if k != "usage"}
    events = events_of(replay(stored, include_usage=True))
    assert events[-1]["choices"] == [] and events[-1]["usage"] is None
    assert all("usage" in event and event["usage"] is None for event in events[:-1])
    with_usage = events_of(replay(TEXT_COMPLETION, include_usage=True))
    assert with_usage[-1] == {**with_usage[-1], "choices": [], "usage": TEXT_COMPLETION["usage"]}
    assert all("usage" not in event for event in events_of(replay(TEXT_COMPLETION)))
