"""The Workers adapter: ``Platform`` over the ``js`` FFI of Pyodide (Python Workers).

Imported only by the generated entry inside the Workers runtime. ``serve`` is
what every entry calls: it unwraps nothing itself; the entry hands it the JS
``Request``, the ``env`` bindings and the execution context.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine, Mapping
from typing import Any

import js
from pyodide.ffi import create_once_callable, to_js

from .build_info import KV_BINDING
from .handler import EdgeHandler
from .origins import NOWHERE, Location
from .platform import EdgeRequest, EdgeResponse
from .settings import EdgeSettings

__all__ = ["serve"]


# Looked up once per isolate: every ``js.X.y`` is a crossing into JS per use.
_from_entries = js.Object.fromEntries
_fetch = js.fetch
_Response = js.Response
_TextDecoder = js.TextDecoder
_caches = js.caches


def _js_object(value: Mapping[str, Any]) -> Any:
    return to_js(value, dict_converter=_from_entries)


class _OriginReply:
    __slots__ = ("body", "js_response", "status")

    def __init__(self, js_response: Any) -> None:
        self.js_response = js_response
        self.status = int(js_response.status)
        self.body: Any = None  # the JS ArrayBuffer, once settled (never copied into Python)

    def header(self, name: str) -> str | None:
        value = self.js_response.headers.get(name)
        return None if value is None else str(value)

    def headers(self) -> dict[str, str]:
        # One FFI crossing for all of them, not two per header.
        headers: dict[str, str] = _from_entries(self.js_response.headers).to_py()
        return headers

    async def text(self) -> str:
        if self.body is not None:  # settled: the body was read already
            return str(_TextDecoder.new().decode(self.body))
        return str(await self.js_response.text())

    async def settle(self) -> None:
        self.body = await self.js_response.arrayBuffer()


class WorkersPlatform:
    __slots__ = ("_body", "_body_js", "_ctx", "_kv", "_request")

    def __init__(self, request: Any, env: Any, ctx: Any) -> None:
        self._request = request
        self._kv = getattr(env, KV_BINDING, None)
        self._ctx = ctx
        self._body: bytes | None = None  # the body read whole, and its JS ArrayBuffer
        self._body_js: Any = None

    async def read_body(self, limit: int, length: int | None) -> bytes:
        """Bytes, never text: decoding here would turn invalid UTF-8 into U+FFFD (another
        body under the same fingerprint) and count characters, not bytes."""
        if length is not None:
            # Framed by its Content-Length (already checked against the limit): the
            # runtime delivers at most that many bytes, so one read is bounded.
            if length == 0:
                return b""
            buffer = await self._request.arrayBuffer()
            self._body, self._body_js = buffer.to_bytes(), buffer
            return self._body
        stream = self._request.body
        if stream is None:
            return b""
        # Chunked: read as it comes, and stop as soon as it is over the limit.
        reader = stream.getReader()
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            result = await reader.read()
            if result.done:
                break
            chunk = bytes(result.value.to_bytes())
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            reader.cancel()  # the rest is never read
        return b"".join(chunks)

    async def kv_get(self, key: str) -> str | None:
        if self._kv is None:
            return None
        value = await self._kv.get(key)
        return None if value is None else str(value)

    async def kv_put(self, key: str, value: str, ttl: int) -> None:
        if self._kv is not None:
            await self._kv.put(key, value, _js_object({"expirationTtl": ttl}))

    async def pop_cache_get(self, key: str) -> str | None:
        found = await _caches.default.match(key)
        return None if found is None else str(await found.text())

    async def pop_cache_put(self, key: str, value: str, ttl: int) -> None:
        headers = {"cache-control": f"max-age={ttl}", "content-type": "application/json"}
        await _caches.default.put(key, _Response.new(value, _js_object({"headers": headers})))

    async def fetch_origin(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes | None
    ) -> _OriginReply:
        # A fetch the handler stops waiting for (its time limit) ends with the request: the
        # runtime cancels what is still pending, and not in waitUntil, once it has answered.
        init: dict[str, Any] = {"method": method, "headers": dict(headers)}
        if body is not None:
            # The request's own buffer when it is that body: no copy back into JS.
            init["body"] = self._body_js if body is self._body else to_js(body)
        return _OriginReply(await _fetch(url, _js_object(init)))

    def wait_until(self, work: Coroutine[Any, Any, Any]) -> None:
        """Keep ``work`` alive after the response, the way that works in Pyodide.

        ``ctx.waitUntil(coroutine)`` (or a future, or a KV promise) hands JS a borrowed
        proxy that is destroyed at once, losing the work. So the work runs as a task and
        ``waitUntil`` gets a real JS Promise that the task settles when it is done.
        """
        task = asyncio.ensure_future(work)

        def executor(resolve: Any, reject: Any) -> None:
            def settle(done: asyncio.Future[Any]) -> None:
                if done.cancelled():
                    reject(js.Error.new("background work was cancelled"))
                elif done.exception() is not None:
                    reject(js.Error.new(f"background work failed: {done.exception()!r}"))
                else:
                    resolve(None)

            task.add_done_callback(settle)

        self._ctx.waitUntil(js.Promise.new(create_once_callable(executor)))

    def now(self) -> float:
        return time.time()

    def location(self) -> Location:
        # ``request.cf``: Cloudflare's own; the local runtime takes it from a header.
        cf = getattr(self._request, "cf", None)
        if cf is None:
            return NOWHERE
        return Location(
            str(getattr(cf, "continent", None) or ""),
            str(getattr(cf, "country", None) or ""),
            str(getattr(cf, "colo", None) or ""),
        )

    def log_error(self, message: str) -> None:
        js.console.error(message)


def _request(js_request: Any) -> EdgeRequest:
    # One FFI crossing for all headers (names come lower-cased from the Headers object),
    # and the URL split in Python: each JS object touched from Python costs a proxy.
    headers: dict[str, str] = _from_entries(js_request.headers).to_py()
    url = str(js_request.url)
    path_start = url.find("/", url.find("//") + 2)
    target = url[path_start:] if path_start >= 0 else "/"
    path, _, query = target.partition("?")
    return EdgeRequest(method=str(js_request.method), path=path, query=query, headers=headers)


def _response(response: EdgeResponse) -> Any:
    init = _js_object({"status": response.status, "headers": response.headers})
    if response.passthrough is not None:
        # The origin's body untouched, never in Python: as read (settled), or streamed.
        reply = response.passthrough
        assert isinstance(reply, _OriginReply)
        body = reply.js_response.body if reply.body is None else reply.body
        return _Response.new(body, init)
    body = response.body
    if isinstance(body, bytes):
        body = to_js(body)
    return _Response.new(body, init)


class _Isolate:
    """Per-isolate state, built on the first request (never at import)."""

    handler: EdgeHandler | None = None


def _setting(env: Any, name: str) -> str | None:
    value = getattr(env, name, None)
    return None if value is None else str(value)


async def serve(js_request: Any, env: Any, ctx: Any) -> Any:
    handler = _Isolate.handler
    if handler is None:
        handler = _Isolate.handler = EdgeHandler(
            EdgeSettings.from_env(lambda name: _setting(env, name))
        )
    platform = WorkersPlatform(js_request, env, ctx)
    response = await handler.handle(_request(js_request), platform)
    return _response(response)
