"""What the benchmark sends, and the cache entries it plants before measuring.

Requests are realistic in size (about 2 KB of chat body; the demo provider
pads its answers to about 1 KB) and always cacheable (``temperature: 0``). A
"miss" body carries the ``UNIQUE`` token, which the load generator replaces per
request, so no request of a miss run is answered from a cache or coalesced.

A hit is planted, not earned: the provider's real answer to the hit body is
wrapped in an envelope and written to Redis (for the origin) and through the
Workers KV REST stand-in (for the edge), under the fingerprint the edge and
the origin will compute. The runner then checks the response header says
``kv`` / ``redis`` before it trusts any number.
"""

from __future__ import annotations

import asyncio
import gc
import json
import time
from collections.abc import AsyncIterator, MutableMapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import redis

from prism import encode_envelope, entry_key, fingerprint, parse_chat_request
from prism.routes import CHAT_PATH

from .loadgen import UNIQUE

__all__ = [
    "CHAT_PATH",
    "MODEL",
    "PlantedEntry",
    "chat_body",
    "chat_scope",
    "messages_body",
    "plant_entry",
    "serving",
    "wait_for_hit",
]

MODEL = "gpt-4o-mini"
_TTL = 86_400
# About 2 KB of prompt: a system message and a user turn, as a small app would send.
_SYSTEM = (
    "You are a careful assistant for an online bookshop. Answer in two short paragraphs, "
    "cite the catalogue entry you used, and never invent prices or stock levels. "
) * 4
_USER = (
    "A customer asks which edition of the book would suit a reader who prefers large print "
    "and an index, and whether the hardback ships in one or two days. "
) * 7


def chat_body(tag: str, *, stream: bool = False) -> str:
    """A ~2 KB cacheable chat body whose answer depends on ``tag`` (use ``UNIQUE`` for misses)."""
    body = {
        "model": MODEL,
        "temperature": 0,
        "stream": stream,
        "messages": [
            {"role": "system", "content": _SYSTEM},
            {"role": "user", "content": f"[{tag}] {_USER}"},
        ],
    }
    text = json.dumps(body, separators=(",", ":"))
    assert tag != UNIQUE or UNIQUE in text
    return text


def messages_body(tag: str, *, stream: bool = False) -> str:
    """The same request as ``chat_body``'s, to Anthropic's Messages API."""
    body = {
        "model": MODEL,
        "max_tokens": 512,
        "temperature": 0,
        "stream": stream,
        "system": _SYSTEM,
        "messages": [{"role": "user", "content": f"[{tag}] {_USER}"}],
    }
    text = json.dumps(body, separators=(",", ":"))
    assert tag != UNIQUE or UNIQUE in text
    return text


@dataclass(frozen=True, slots=True)
class PlantedEntry:
    body: str  # the request body that hits
    fingerprint: str
    key: str  # the Redis / KV key
    envelope: bytes


@asynccontextmanager
async def serving(app: Any) -> AsyncIterator[None]:
    """The in-process drivers' origin: ``app`` started through its ASGI lifespan, the heap
    frozen as ``prism origin serve`` freezes it (so a request is counted as a running
    server pays for it), and shut down on the way out."""
    lifespan: asyncio.Queue[MutableMapping[str, Any]] = asyncio.Queue()
    replies: asyncio.Queue[MutableMapping[str, Any]] = asyncio.Queue()
    await lifespan.put({"type": "lifespan.startup"})
    served = asyncio.ensure_future(app({"type": "lifespan"}, lifespan.get, replies.put))
    started = await replies.get()
    if started["type"] != "lifespan.startup.complete":
        raise RuntimeError(f"the origin did not start: {started}")
    try:
        from origin.http.server import freeze_heap
    except ImportError:  # an older origin, measured for comparison
        gc.collect()
        gc.freeze()
    else:
        freeze_heap()
    try:
        yield
    finally:
        await lifespan.put({"type": "lifespan.shutdown"})
        await replies.get()
        await served


def chat_scope(authorization: bytes, length: int, path: str = CHAT_PATH) -> dict[str, Any]:
    """The ASGI scope of a chat request (or one to ``path``: ``MESSAGES_PATH``) with a body
    of ``length`` bytes, as uvicorn makes it (the in-process drivers call the app with it,
    no sockets)."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"127.0.0.1"),
            (b"authorization", authorization),
            (b"content-type", b"application/json"),
            (b"content-length", str(length).encode()),
        ],
        "server": ("127.0.0.1", 8080),
        "client": ("127.0.0.1", 50000),
    }


def plant_entry(
    *,
    project: str,
    provider_url: str,
    redis_url: str,
    kv_bulk_url: str,
    kv_token: str,
) -> PlantedEntry:
    """Ask the provider once, then store its answer in Redis and KV for the hit body."""
    body = chat_body("planted-hit")
    answer = httpx.post(
        provider_url + CHAT_PATH,
        content=body,
        headers={"content-type": "application/json", "authorization": "Bearer demo"},
        timeout=30,
    )
    answer.raise_for_status()
    usage = answer.json().get("usage")
    envelope = encode_envelope(answer.content, model=MODEL, ttl=_TTL, usage=usage)
    fp = fingerprint(project, CHAT_PATH, parse_chat_request(body))
    key = entry_key(fp)
    client = redis.Redis.from_url(redis_url)
    try:
        client.set(key, envelope, ex=_TTL)
    finally:
        client.close()
    stored = httpx.put(
        kv_bulk_url,
        json=[{"key": key, "value": envelope.decode(), "expiration_ttl": _TTL}],
        headers={"authorization": f"Bearer {kv_token}"},
        timeout=30,
    )
    stored.raise_for_status()
    return PlantedEntry(body=body, fingerprint=fp, key=key, envelope=envelope)


def wait_for_hit(url: str, body: str, headers: dict[str, str], timeout: float = 30.0) -> None:
    """Ask ``url`` (an origin) ``body`` until it answers, then until the answer is a Redis
    hit (the miss's entry stored): a benchmark of hits starts from there."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            answer = httpx.post(url + CHAT_PATH, content=body, headers=headers)
            if answer.headers.get("x-prism-edge-cache-layer") == "redis":
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"the origin did not serve a Redis hit within {timeout:.0f} s")
        time.sleep(0.1)
