"""Provider calls (misses) through the origin's ASGI app in-process: a load-independent
measure of a miss.

Like ``hit_driver``: this drives ``count`` misses (``concurrency`` at a time) through
``create_app``'s app with no sockets but Redis's and the provider's, so
``valgrind --tool=callgrind`` counts what one miss costs the origin: run it twice with
different counts and divide the difference of the totals by the difference of the
counts (start-up cancels out). Every request carries its own nonce, so each is a miss
that calls the provider (nothing is coalesced, nothing served from Redis).

The provider stand-in (``deploy.local.provider``) must run in another process, so that
valgrind counts only the origin (valgrind does not follow children unless asked; with
no ``--provider-url`` the driver starts one itself, as a child)::

    python -m deploy.local.provider --port 9111 --reply-words 150 &
    valgrind --tool=callgrind python -m deploy.bench.miss_driver \\
        redis://127.0.0.1:6390/0 200 --provider-url http://127.0.0.1:9111 --stream

It checks every answer is a 200 miss (and a stream ends with ``[DONE]``). ``--api messages``
sends the same request to Anthropic's Messages API (translated to the provider's chat API;
a stream ends with ``message_stop``).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import sys
import time
import uuid
from collections.abc import Iterator, MutableMapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import uvloop

from deploy.local.ports import free_port
from deploy.local.processes import ChildProcess
from origin import Settings, create_app
from prism import headers as h
from prism import parse_key_secrets
from prism.routes import CHAT_PATH, MESSAGES_PATH

from .loadgen import UNIQUE
from .workload import chat_body, chat_scope, messages_body, serving

__all__ = ["APIS", "drive_misses", "main"]

_KEY_SECRET = "bench-miss-driver-key-secret-0123456"
_PROJECT = "bench"
_WARM = 64  # misses before counting: modules loaded, connections pooled, memos filled
_REPLY_WORDS = 150  # about a 1 KB answer, as the throughput bench's provider gives
# Per API: its path, its body, and how its whole stream ends.
APIS = {
    "chat": (CHAT_PATH, chat_body, b"data: [DONE]\n\n"),
    "messages": (MESSAGES_PATH, messages_body, b'{"type":"message_stop"}\n\n'),
}


def drive_misses(
    redis_url: str,
    provider_url: str,
    count: int,
    concurrency: int = 32,
    stream: bool = False,
    pause: bool = False,
    api: str = "chat",
) -> float:
    """Send ``count`` misses after a warm-up; the wall time per miss in seconds (the
    instruction count is what to trust)."""
    env = {
        "PRISM_KEY_SECRET": _KEY_SECRET,
        "PRISM_FORWARD_SECRET": _KEY_SECRET,
        "REDIS_URL": redis_url,
        "OPENAI_BASE_URL": provider_url.rstrip("/") + "/v1",
        "OPENAI_API_KEY": "unused",
        # PRISM_FLIGHT_LEASE=0 in the environment measures a miss without shared flights.
        "PRISM_FLIGHT_LEASE": os.environ.get("PRISM_FLIGHT_LEASE", "3"),
    }
    # Under valgrind a turn of the loop is 50 x slower: no Redis timeout may fire.
    settings = dataclasses.replace(Settings.from_env(env), redis_timeout=60.0)
    path, make_body, stream_end = APIS[api]
    template = make_body(UNIQUE, stream=stream)
    nonce = uuid.uuid4().hex[:12]
    # Built before the count starts, one distinct body per request: every one a miss.
    bodies = iter([template.replace(UNIQUE, f"{nonce}-{i}").encode() for i in range(_WARM + count)])
    key = parse_key_secrets(_KEY_SECRET).mint(_PROJECT)
    app = create_app(settings)
    auth = f"Bearer {key}".encode()
    layer_header = h.CACHE_LAYER.encode()

    async def one() -> None:
        body = next(bodies)
        scope = chat_scope(auth, len(body), path)
        sent = False
        finished = asyncio.Event()
        head: dict[str, Any] = {}
        chunks: list[bytes] = []

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await finished.wait()  # a real server says disconnect only once the client goes
            return {"type": "http.disconnect"}

        async def send(event: MutableMapping[str, Any]) -> None:
            if event["type"] == "http.response.start":
                head.update(event)
            elif event["type"] == "http.response.body":
                chunks.append(event.get("body", b""))

        try:
            await app(scope, receive, send)
        finally:
            finished.set()
        layer = dict(head.get("headers", ())).get(layer_header)
        if head.get("status") != 200 or layer != b"miss":
            raise RuntimeError(f"not a miss: {head.get('status')} {layer!r} {b''.join(chunks)!r}")
        if stream and not b"".join(chunks).endswith(stream_end):
            raise RuntimeError(f"the stream did not end whole: {b''.join(chunks)[-200:]!r}")

    async def batches(n: int) -> None:
        done = 0
        while done < n:
            batch = min(concurrency, n - done)
            await asyncio.gather(*(one() for _ in range(batch)))
            done += batch

    async def run() -> float:
        async with serving(app):
            await batches(_WARM)
            if pause:  # the caller turns counting on now (``callgrind_control -i on``)
                print("warm", flush=True)
                sys.stdin.readline()
            begun = time.perf_counter()
            await batches(count)
            return (time.perf_counter() - begun) / max(count, 1)

    return uvloop.run(run())


@contextmanager
def provider_process(reply_words: int = _REPLY_WORDS) -> Iterator[str]:
    """The local provider in a child process on a free port, until the block ends; its
    answers padded to ``reply_words`` words (0: the bare echo, a short fixed answer)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = ["--port", str(port), "--reply-words", str(reply_words)]
    # Its output goes where the driver's does: no log file to find or clean up after.
    provider = ChildProcess(
        "the local provider",
        [sys.executable, "-m", "deploy.local.provider", *args],
        Path("/dev/stderr"),
        {**os.environ, "PYTHONUNBUFFERED": "1"},  # nothing it printed is lost when stopped
    )
    try:
        provider.wait_http(url + "/v1/models")
        yield url
    finally:
        provider.stop()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("redis_url")
    parser.add_argument("count", type=int)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--stream", action="store_true", help="streamed requests (SSE)")
    parser.add_argument("--provider-url", help="a running local provider (else one is started)")
    parser.add_argument("--api", choices=sorted(APIS), default="chat", help="the API asked")
    parser.add_argument(
        "--pause",
        action="store_true",
        help="after the warm-up, print 'warm' and wait for a line on stdin (to start counting"
        " then: valgrind --instr-atstart=no, then callgrind_control -i on)",
    )
    args = parser.parse_args(argv)
    kind = ("streamed " if args.stream else "JSON ") + args.api

    def drive(url: str) -> float:
        return drive_misses(
            args.redis_url, url, args.count, args.concurrency, args.stream, args.pause, args.api
        )

    if args.provider_url:
        per_miss = drive(args.provider_url)
    else:
        with provider_process() as url:
            per_miss = drive(url)
    print(
        f"{args.count} {kind} misses, {args.concurrency} at a time: {per_miss * 1e6:.1f} µs each"
        " (wall time: the instruction count is what to trust)"
    )


if __name__ == "__main__":
    main()
