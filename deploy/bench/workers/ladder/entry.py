"""The edge's KV hit, one step at a time: where the time goes inside the Worker.

Nothing can sample Python inside workerd, and the Workers clock stands still
while code runs, so the benchmark measures from outside: ``?step=NAME`` runs
every step of a KV hit up to and including NAME and answers, and the
difference between two steps' latencies is what the later step costs. The
steps mirror ``edge.pipeline`` / ``edge.workers``; ``edge`` runs the real thing.

Staged next to the real ``prism`` and ``edge`` packages (``prism build edge``'s
layout) by ``prism bench --profile``, with ``ORIGIN_URL`` pointing at a constant
HTTP server (so ``edge_miss`` measures the edge alone); never deployed.
"""

import asyncio
from typing import Any

import js
from pyodide.ffi import to_js

from edge.workers import serve
from prism import (
    KeyRing,
    bearer_token,
    classify,
    decode_envelope,
    entry_key,
    fingerprint,
    parse_chat_request,
    parse_key_secrets,
)
from prism import headers as h
from prism.routes import CHAT_PATH

STEPS = (
    "const",  # a constant answer from this isolate (prism and edge imported)
    "request",  # + the request's URL and headers read into Python, as the adapter does
    "auth",  # + the API key's signature checked
    "body",  # + the body read (await request.text())
    "parse",  # + parse_chat_request and classify
    "fingerprint",  # + the fingerprint
    "kv",  # + one KV read (plain await)
    "kv_bounded",  # ... the KV read inside asyncio.timeout, as the handler bounds it
    "decode",  # + the envelope decoded and checked
    "respond",  # + the response built with headers, as the adapter builds it
    "fetch",  # apart: the body POSTed with fetch() to a constant server, its answer passed on
    "edge",  # apart: the real edge Worker (edge.workers.serve) on the same request
    "edge_miss",  # apart: the real edge on a miss, forwarded to a constant server
)
_CONST = '{"ok":true}'


class _LadderIsolate:
    ring: KeyRing | None = None


def _response(body: Any, headers: dict[str, str] | None = None) -> Any:
    init = to_js({"status": 200, "headers": headers or {}}, dict_converter=js.Object.fromEntries)
    return js.Response.new(body, init)


async def on_fetch(request: Any, env: Any, ctx: Any) -> Any:
    url = js.URL.new(request.url)
    step = str(url.searchParams.get("step") or "const")
    if step in ("edge", "edge_miss"):
        # This Worker's ORIGIN_URL is the constant server: a miss costs only the edge.
        return await serve(request, env, ctx)
    if step == "fetch":
        # What any forward to the origin pays: one outbound fetch, its body streamed on.
        init = {"method": "POST", "body": str(await request.text())}
        reply = await js.fetch(
            str(env.ORIGIN_URL), to_js(init, dict_converter=js.Object.fromEntries)
        )
        return js.Response.new(reply.body)
    last = STEPS.index(step) if step in STEPS else 0
    if last == 0:
        return js.Response.new(_CONST)
    headers = {str(k).lower(): str(v) for k, v in request.headers}
    _ = (str(request.method), str(url.pathname), str(url.search))
    if last == 1:
        return js.Response.new(_CONST)
    if _LadderIsolate.ring is None:
        _LadderIsolate.ring = parse_key_secrets(str(env.PRISM_KEY_SECRET))
    identity = _LadderIsolate.ring.verify(bearer_token(headers.get("authorization")))
    if last == 2:
        return js.Response.new(_CONST)
    body = str(await request.text())
    if last == 3:
        return js.Response.new(_CONST)
    chat = parse_chat_request(body)
    classify(chat, headers.get("cache-control"))
    if last == 4:
        return js.Response.new(_CONST)
    key = entry_key(fingerprint(identity.project, CHAT_PATH, chat))
    if last == 5:
        return js.Response.new(_CONST)
    if last == 6:
        await env.PRISM_KV.get(key)
        return js.Response.new(_CONST)
    async with asyncio.timeout(0.5):
        cached = await env.PRISM_KV.get(key)
    if last == 7:
        return js.Response.new(_CONST)
    envelope = decode_envelope(None if cached is None else str(cached))
    if last == 8 or envelope is None:
        return js.Response.new(_CONST)
    out = {"content-type": "application/json", h.CACHE_LAYER: "kv"}
    return _response(to_js(envelope.body), out)
