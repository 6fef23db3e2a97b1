"""The fault benchmark's client: unique chat (or Anthropic Messages, or Responses) requests
at a fixed concurrency, each recorded.

Half the requests stream. Each body carries a counter, so every request is a cache
miss that reaches a provider. Requests run closed-loop (a worker starts the next one
when its last finishes), optionally paced to a rate so a timed scenario (an outage and
its recovery) is spread over its whole length.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

import httpx
import orjson

from .fault_metrics import RequestRecord

__all__ = [
    "BENCH_MODEL",
    "LoadPlan",
    "chat_body",
    "incomplete",
    "messages_body",
    "open_client",
    "responses_body",
    "run_requests",
]

BENCH_MODEL = "bench-model"
CHAT_PATH = "/v1/chat/completions"
MESSAGES_PATH = "/v1/messages"
RESPONSES_PATH = "/v1/responses"
# How each API's whole stream ends: its last event's data begins so.
_STREAM_ENDS = {
    "chat": (b"data: [DONE]", "stream without [DONE]"),
    "messages": (b'data: {"type":"message_stop"', "stream without message_stop"),
    "responses": (b'data: {"type":"response.completed"', "stream without response.completed"),
}
_ECHO_CHARS = 80  # how much of the question the stand-in echoes (its default)

Progress = Callable[[int], None]


@dataclass(frozen=True, slots=True)
class LoadPlan:
    url: str  # the origin's base URL
    headers: Mapping[str, str]
    requests: int
    concurrency: int
    label: str  # part of every message, so no two runs share a request
    rate: float | None = None  # requests started per second at most (None: as fast as possible)
    timeout: float = 30.0  # per request, end to end
    api: str = "chat"  # or "messages" (Anthropic's Messages API), or "responses"


def question_of(label: str, index: int) -> str:
    return f"fault bench {label} request {index}"


def chat_body(label: str, index: int) -> tuple[bytes, bool]:
    """The ``index``-th request of a run: unique content; every other one streamed."""
    stream = index % 2 == 1
    body = {
        "model": BENCH_MODEL,
        "messages": [{"role": "user", "content": question_of(label, index)}],
        "stream": stream,
    }
    return orjson.dumps(body), stream


def messages_body(label: str, index: int) -> tuple[bytes, bool]:
    """As ``chat_body``, to the Messages API."""
    stream = index % 2 == 1
    body = {
        "model": BENCH_MODEL,
        "max_tokens": 1024,
        "messages": [{"role": "user", "content": question_of(label, index)}],
        "stream": stream,
    }
    return orjson.dumps(body), stream


def responses_body(label: str, index: int) -> tuple[bytes, bool]:
    """As ``chat_body``, to the Responses API."""
    stream = index % 2 == 1
    body = {"model": BENCH_MODEL, "input": question_of(label, index), "stream": stream}
    return orjson.dumps(body), stream


_APIS = {
    "chat": (CHAT_PATH, chat_body),
    "messages": (MESSAGES_PATH, messages_body),
    "responses": (RESPONSES_PATH, responses_body),
}


def streamed(body: bytes) -> tuple[str, bool]:
    """A stream's text (its deltas joined, chat's, Messages' or Responses') and whether
    another provider finished it."""
    parts: list[str] = []
    resumed = False
    for line in body.split(b"\n"):
        if not line.startswith(b"data: {"):
            continue
        chunk = orjson.loads(line[6:])
        extension = chunk.get("prism")
        resumed = resumed or (isinstance(extension, dict) and extension.get("resumed") is True)
        kind = chunk.get("type")
        if kind == "content_block_delta":
            parts.append((chunk.get("delta") or {}).get("text") or "")
        elif kind == "response.output_text.delta":
            parts.append(chunk.get("delta") or "")
        for choice in chunk.get("choices") or ():
            parts.append((choice.get("delta") or {}).get("content") or "")
    return "".join(parts), resumed


def _known_answer(question: str) -> re.Pattern[str]:
    """The stand-in's answer to ``question`` (its echo, then its tag): a splice that lost or
    repeated any of it does not match."""
    echo = " ".join(question.split())[:_ECHO_CHARS]
    return re.compile(re.escape(f"Echo: {echo} [") + r"[0-9a-f.]+\]")


def incomplete(
    body: bytes, *, stream: bool, question: str | None = None, api: str = "chat"
) -> str | None:
    """Why a 200 body is not a complete answer, or None when it is; with ``question``, a
    stream's text must be the stand-in's whole answer to it."""
    if stream:
        end, missing = _STREAM_ENDS[api]
        if not body.rstrip().rsplit(b"\n", 1)[-1].startswith(end):
            return missing
        if question is not None:
            try:
                text, _ = streamed(body)
            except (orjson.JSONDecodeError, AttributeError):
                return "unparsable stream"
            if not _known_answer(question).fullmatch(text):
                return "stream text lost or repeated"
        return None
    try:
        data = orjson.loads(body)
        if api == "messages":
            done = data["stop_reason"]
        elif api == "responses":
            done = data["status"] == "completed"
        else:
            done = data["choices"][0]["finish_reason"]
        if done:
            return None
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
        return "unparsable body"
    return "unfinished choice"


async def _one(
    client: httpx.AsyncClient, plan: LoadPlan, index: int, began: float
) -> RequestRecord:
    path, make_body = _APIS[plan.api]
    payload, stream = make_body(plan.label, index)
    start = time.monotonic()
    first: float | None = None
    status, provider, error = 0, None, None
    chunks: list[bytes] = []
    try:
        async with asyncio.timeout(plan.timeout):
            async with client.stream("POST", path, content=payload) as response:
                status = response.status_code
                provider = response.headers.get("x-prism-provider")
                async for chunk in response.aiter_raw():
                    if first is None:
                        first = time.monotonic()
                    chunks.append(chunk)
    except TimeoutError:
        error = "timeout"
    except httpx.RemoteProtocolError:
        error = "connection cut"
    except httpx.HTTPError as exc:
        error = type(exc).__name__
    end = time.monotonic()
    body = b"".join(chunks)
    if error is None:
        question = question_of(plan.label, index)
        error = (
            f"status {status}"
            if status != 200
            else incomplete(body, stream=stream, question=question, api=plan.api)
        )
    resumed = stream and error is None and streamed(body)[1]
    return RequestRecord(
        start=start - began,
        ttfb=None if first is None else first - start,
        total=end - start,
        status=status,
        provider=provider,
        stream=stream,
        ok=error is None,
        error=error,
        resumed=resumed,
    )


async def run_requests(
    plan: LoadPlan,
    *,
    began: float | None = None,
    on_done: Progress | None = None,
    client: httpx.AsyncClient | None = None,
) -> list[RequestRecord]:
    """Send every request of ``plan``; records in request order. ``began``: time zero."""
    began = time.monotonic() if began is None else began
    records: list[RequestRecord | None] = [None] * plan.requests
    next_index = 0
    done = 0

    async def worker(http: httpx.AsyncClient) -> None:
        nonlocal next_index, done
        while next_index < plan.requests:
            index, next_index = next_index, next_index + 1
            if plan.rate:
                wait = began + index / plan.rate - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
            records[index] = await _one(http, plan, index, began)
            done += 1
            if on_done is not None:
                on_done(done)

    async def with_client(http: httpx.AsyncClient) -> None:
        workers: list[Awaitable[None]] = [worker(http) for _ in range(plan.concurrency)]
        await asyncio.gather(*workers)

    if client is not None:
        await with_client(client)
    else:
        async with open_client(plan) as http:
            await with_client(http)
    return [r for r in records if r is not None]


def open_client(plan: LoadPlan) -> httpx.AsyncClient:
    """One pooled client for a run: a connection per worker, no proxy, no retries."""
    size = plan.concurrency
    limits = httpx.Limits(max_connections=size, max_keepalive_connections=size)
    return httpx.AsyncClient(
        base_url=plan.url,
        headers={"content-type": "application/json", **plan.headers},
        timeout=httpx.Timeout(plan.timeout),
        limits=limits,
        trust_env=False,
    )
